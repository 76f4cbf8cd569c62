# Shared by the def entry points of every kernel module: the thread count a
# call of a given amount of work gets, whether its output goes out with streaming
# stores, and the size check of an array argument.

from cynorm._kernels._runtime cimport parallel_min_bytes, stream_min_bytes


cdef enum:
    # The memory traffic (bytes read and written over all of a call's passes)
    # from which a second thread pays, per kernel family, measured with
    # benchmarks/bench_threads.py (benchmarks/README.md, "Where the second
    # thread pays"); below it waking the team costs more than it saves.
    ROWS_MIN_BYTES = 512 << 10          # row reductions + a pass: layer norm, weight norm rows
    ELEMENTWISE_MIN_BYTES = 768 << 10   # one elementwise pass: batch norm's normalize, grad input
    CHANNELS_MIN_BYTES = 1 << 20        # batch norm's channel statistics (+ the pass)
    ROW_GRADS_MIN_BYTES = 3 << 19       # layer norm's backward: rows, then column sums
    COLUMNS_MIN_BYTES = 3 << 20         # weight norm's column norms: blocks, merge, pass
    EXP_MIN_BYTES = 96 << 10            # exp-bound: softmax, log_sigmoid, gelu/silu


cdef inline int threads_for(Py_ssize_t size, Py_ssize_t passes, Py_ssize_t itemsize,
                            Py_ssize_t min_bytes, int n_threads) noexcept nogil:
    # passes: how many times the call reads or writes each element over all
    # its passes; one thread below its family's min_bytes of that traffic
    # (or below set_parallel_min_bytes's value, when one is set).  16-bit
    # storage counts at float32's width: each element is widened to float32
    # and back, so it costs what a float32 element costs, and the crossover
    # falls at the same element count (benchmarks/README.md).  The kernels'
    # blocks do not depend on the thread count, so neither do the bits.
    cdef Py_ssize_t forced = parallel_min_bytes()
    if forced >= 0:
        min_bytes = forced
    if itemsize < 4:
        itemsize = 4
    return 1 if size * passes * itemsize < min_bytes else max(1, n_threads)


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
