# The plain case of an op's arguments, recognized at C cost by the kernel
# modules' *_plain entries (see _plain.pyx).
cimport numpy as cnp

cdef enum:
    # storage types, in setup.py's DTYPES order (the templates' suffixes)
    STORAGE_F32 = 0
    STORAGE_F64 = 1
    STORAGE_BF16 = 2
    STORAGE_F16 = 3
    NOT_PLAIN = -1

cdef int storage_of(object a) noexcept
cdef int storage_of_any_layout(object a) noexcept
cdef int kernel_storage(object a) noexcept
cdef int storage_of_dtype(object d) noexcept
cdef int math_storage(int storage) noexcept nogil
cdef int typenum(int storage) noexcept
cdef Py_ssize_t itemsize(int storage) noexcept nogil
cdef bint plain_eps(object eps) noexcept
cdef bint disjoint(object a, object b) noexcept
cdef bint plain_out_form(object out, Py_ssize_t n) noexcept
cdef object out_entry(object out, Py_ssize_t i)
cdef bint plain_out(object a, int storage, int nd, const cnp.npy_intp* dims) noexcept
cdef bint written_apart(tuple written, tuple read) noexcept
cdef bint plain_with_shape(object a, int storage, int nd, const cnp.npy_intp* dims) noexcept
cdef bint plain_param(object a, int storage, int nd, const cnp.npy_intp* dims) noexcept
cdef int param_storage(object a, int storage) noexcept
cdef void* math_values(object a, float* scratch) noexcept
cdef int trailing_axes(cnp.ndarray x, object shape) noexcept
cdef void* data(object a) noexcept
cdef object doubles_as(const double* s, int storage, int nd, const cnp.npy_intp* dims)
cdef object doubles_into(const double* s, int storage, object out)
cdef bint doubles_from(object a, Py_ssize_t n, double* dst) noexcept
cdef double value_at(const void* p, int storage, Py_ssize_t i) noexcept nogil
cdef void store_value(void* p, int storage, Py_ssize_t i, double v) noexcept nogil
cdef float* floats_from(const void* p, int storage, Py_ssize_t n, float* dst) noexcept nogil
cdef void floats_into(void* p, int storage, Py_ssize_t n, const float* src) noexcept nogil
cdef bint plain_mask(object mask) noexcept
cdef bint split_at(cnp.ndarray a, object axis, Py_ssize_t* dims3) noexcept
