# Shared by the def entry points of every kernel module: the thread count a
# call of a given size gets.

cdef enum:
    # below this many elements one thread beats waking a team
    SERIAL_BELOW = 65536


cdef inline int threads_for(Py_ssize_t size, int n_threads) noexcept nogil:
    return 1 if size < SERIAL_BELOW else max(1, n_threads)
