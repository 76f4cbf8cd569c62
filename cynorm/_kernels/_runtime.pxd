# The one setting every kernel module reads: the output size from which
# outputs are written with streaming stores (set_stream_min_bytes).

cdef Py_ssize_t stream_min_bytes() noexcept nogil
