# The settings every kernel module reads: the output size from which
# outputs are written with streaming stores (set_stream_min_bytes), the
# memory traffic from which a call runs on more than one thread
# (set_parallel_min_bytes, or each family's own: set_family_min_bytes), and the thread count of the calling thread
# (set_num_threads).

cdef Py_ssize_t stream_min_bytes() noexcept nogil
cdef Py_ssize_t parallel_min_bytes() noexcept nogil
cdef Py_ssize_t family_min_bytes(int family) noexcept nogil
cdef int max_threads() noexcept nogil
