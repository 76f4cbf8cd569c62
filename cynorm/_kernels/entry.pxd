# Shared by the def entry points of every kernel module: the thread count a
# call of a given amount of work gets, whether its output goes out with streaming
# stores, and the size check of an array argument.

from cynorm._kernels._runtime cimport (
    FAMILY_CHANNELS, FAMILY_COLUMNS, FAMILY_ELEMENTWISE, FAMILY_EXP, FAMILY_ROW_GRADS,
    FAMILY_ROWS, N_FAMILIES, cn_team_bind, cn_team_threads, stream_min_bytes, team_min_bytes,
    team_state)
from cynorm._kernels.storage cimport STREAM_OFF


cdef inline int threads_for(Py_ssize_t size, Py_ssize_t passes, Py_ssize_t itemsize,
                            int family, int n_threads) noexcept nogil:
    # passes: how many times the call reads or writes each element over all
    # its passes; one thread below its family's threshold of that traffic
    # (or below set_parallel_min_bytes's value, when one is set).  16-bit
    # storage counts at float32's width: each element is widened to float32
    # and back, so it costs what a float32 element costs, and the crossover
    # falls at the same element count (benchmarks/README.md).  The kernels'
    # blocks do not depend on the thread count, so neither do the bits.
    # Above it, the team is what cn_team.h allows now: capped while other
    # work holds the cores.
    cdef Py_ssize_t min_bytes = team_min_bytes(family)
    if itemsize < 4:
        itemsize = 4
    return 1 if size * passes * itemsize < min_bytes else cn_team_threads(max(1, n_threads))


cdef inline void bind_team() noexcept:
    # at a kernel module's import: its parallel regions report to, and its
    # threads_for reads, the process's team state (cn_team.h)
    cn_team_bind(team_state())


cdef inline int check_size(Py_ssize_t size, Py_ssize_t expected, str name) except -1:
    # the kernels index exactly this many elements: say so here rather than
    # read past an array
    if size != expected:
        raise ValueError(f"{name}: expected {expected} elements, got {size}")
    return 0


cdef inline bint streamed(Py_ssize_t output_bytes) noexcept nogil:
    # an output this large would not stay in cache: streaming stores save
    # reading every line before writing it
    return output_bytes >= stream_min_bytes()


cdef inline int stream_mode(Py_ssize_t output_bytes, int mode) noexcept nogil:
    # a row pass's `stream` for an output of output_bytes: mode (STREAM_ROW
    # or STREAM_RUN, storage.pxd) where it is streamed, else STREAM_OFF
    return mode if streamed(output_bytes) else STREAM_OFF
