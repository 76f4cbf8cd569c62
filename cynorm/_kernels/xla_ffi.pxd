# XLA's FFI call frame as cynorm's JAX handlers read it (cn_xla_ffi.h).
from libc.stdint cimport int64_t

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
