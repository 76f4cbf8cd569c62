# Shared by the def entry points of every kernel module: raw data pointers
# of (validated, contiguous) arrays, and the thread count a call of a given
# size gets.
cimport numpy as cnp

cdef enum:
    # below this many elements one thread beats waking a team
    SERIAL_BELOW = 65536


cdef inline void* data(cnp.ndarray a):
    return cnp.PyArray_DATA(a)


cdef inline void* data_or_null(object a):
    # an optional array argument: None means absent
    return NULL if a is None else cnp.PyArray_DATA(<cnp.ndarray>a)


cdef inline int threads_for(Py_ssize_t size, int n_threads) noexcept nogil:
    return 1 if size < SERIAL_BELOW else max(1, n_threads)
