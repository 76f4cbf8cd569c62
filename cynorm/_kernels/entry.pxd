# Shared by the def entry points of every kernel module: the thread count a
# call of a given size gets, whether its output goes out with streaming
# stores, and the size check of an array argument.

from cynorm._kernels._runtime cimport stream_min_bytes

cdef enum:
    # below this many elements one thread beats waking a team
    SERIAL_BELOW = 65536


cdef inline int threads_for(Py_ssize_t size, int n_threads) noexcept nogil:
    return 1 if size < SERIAL_BELOW else max(1, n_threads)


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
