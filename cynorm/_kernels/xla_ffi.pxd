# XLA's FFI call frame as cynorm's JAX handlers read it (cn_xla_ffi.h), and
# the checks the handlers share.
from libc.stdint cimport int64_t
from libc.string cimport memcmp

from cynorm._kernels._plain cimport (
    NOT_PLAIN, STORAGE_BF16, STORAGE_F16, STORAGE_F32, STORAGE_F64, itemsize, math_storage,
)

cdef extern from "cn_xla_ffi.h" nogil:
    enum:
        CN_FFI_INVALID_ARGUMENT
        CN_FFI_RESOURCE_EXHAUSTED
        CN_FFI_F16
        CN_FFI_F32
        CN_FFI_F64
        CN_FFI_BF16
    ctypedef struct cn_ffi_frame:
        pass
    ctypedef struct cn_ffi_buffer:
        int dtype
        void* data
        int64_t rank
        int64_t* dims
    void cn_ffi_claim(int major, int minor)
    bint cn_ffi_metadata_call(cn_ffi_frame* f)
    void* cn_ffi_error(const cn_ffi_frame* f, int code, const char* op, const char* message)
    cn_ffi_buffer* cn_ffi_arg(const cn_ffi_frame* f, int64_t i)
    cn_ffi_buffer* cn_ffi_ret(const cn_ffi_frame* f, int64_t i)
    int64_t cn_ffi_count(const cn_ffi_buffer* b)
    bint cn_ffi_float_attr(const cn_ffi_frame* f, const char* name, double* v)
    bint cn_ffi_int_attr(const cn_ffi_frame* f, const char* name, int64_t* v)


cdef inline int ffi_storage(const cn_ffi_buffer* b) noexcept nogil:
    # a buffer's storage code, or NOT_PLAIN for a type the kernels lack
    if b == NULL:
        return NOT_PLAIN
    if b.dtype == CN_FFI_F32:
        return STORAGE_F32
    if b.dtype == CN_FFI_F64:
        return STORAGE_F64
    if b.dtype == CN_FFI_BF16:
        return STORAGE_BF16
    if b.dtype == CN_FFI_F16:
        return STORAGE_F16
    return NOT_PLAIN


cdef inline bint ffi_array(const cn_ffi_buffer* b, int storage, int64_t count) noexcept nogil:
    # b holds `count` values of `storage`
    return b != NULL and ffi_storage(b) == storage and cn_ffi_count(b) == count


cdef inline bint ffi_param(const cn_ffi_buffer* b, int storage, int64_t count) noexcept nogil:
    # b holds `count` values of x's storage or of its math type
    return b != NULL and cn_ffi_count(b) == count and (
        ffi_storage(b) == storage or ffi_storage(b) == math_storage(storage))


# Under jax.vmap, cynorm.jax broadcasts every argument of a call to the batch
# (vmap_method="broadcast_all"), so a handler is given the whole batch at
# once: each buffer holds one set of its values per batch element, the sets
# one after another.

cdef inline int64_t ffi_sets(const cn_ffi_buffer* x, int64_t unit) noexcept nogil:
    # how many sets of `unit` values x holds (1 outside vmap); -1 if not a
    # whole number (unit 0: x must be empty, one set)
    cdef int64_t count = cn_ffi_count(x)
    if unit <= 0:
        return 1 if count == 0 else -1
    return count // unit if count % unit == 0 else -1


cdef inline void* ffi_set(const cn_ffi_buffer* b, int64_t s, int64_t n) noexcept nogil:
    # the start of set s of b's n-value sets (NULL: no buffer)
    return NULL if b == NULL else <char*>b.data + s * n * itemsize(ffi_storage(b))


cdef inline bint sets_equal(const cn_ffi_buffer* b, int64_t k, int64_t n) noexcept nogil:
    # whether b's k sets of n values are all the same bits: vmap's broadcast
    # of a parameter the batch shares (NULL: True)
    if b == NULL:
        return True
    cdef size_t size = n * itemsize(ffi_storage(b))
    cdef int64_t s
    for s in range(1, k):
        if memcmp(b.data, <const char*>b.data + s * size, size) != 0:
            return False
    return True
