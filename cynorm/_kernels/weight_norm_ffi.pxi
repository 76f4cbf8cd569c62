# Included by weight_norm.pyx.
# Weight norm as XLA FFI handlers (cynorm.jax registers them for the CPU):
# forward_any / backward_any on XLA's buffers, with no Python and no copy.
# v is seen as A x D x B (D: the kept axis); g, the norm and g's gradient
# are D values of v's math type (cynorm.jax converts a 16-bit g first).
# Under jax.vmap every buffer holds a set per batch element (ffi_sets), each
# normalized by its own norms: a call per set.
# Each handler checks what it is given (cynorm.jax built the call, so a
# failure means a mismatch) and reports errors through the runtime.

from cpython.pycapsule cimport PyCapsule_New
from libc.stdint cimport int64_t

from cynorm._kernels.xla_ffi cimport *


cdef bint wn_attrs(cn_ffi_frame* f, int64_t* A, int64_t* D, int64_t* B) noexcept nogil:
    # v's A, D, B; False if one is missing or negative
    return (cn_ffi_int_attr(f, "a", A) and cn_ffi_int_attr(f, "d", D)
            and cn_ffi_int_attr(f, "b", B) and A[0] >= 0 and D[0] >= 0 and B[0] >= 0)


cdef void* weight_norm_ffi(void* frame) noexcept nogil:
    # args: v, g; rets: w (v's shape and dtype), norm; attrs: a, d, b
    cdef cn_ffi_frame* f = <cn_ffi_frame*>frame
    if cn_ffi_metadata_call(f):
        return NULL
    cdef const char* op = "weight_norm"
    cdef int64_t A, D, B
    if not wn_attrs(f, &A, &D, &B):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op, "the call lacks an attribute (a, d, b)")
    cdef cn_ffi_buffer* v = cn_ffi_arg(f, 0)
    cdef int storage = ffi_storage(v)
    cdef int math = math_storage(storage)
    cdef int64_t k = ffi_sets(v, A * D * B)
    if storage == NOT_PLAIN or k < 0:
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "v: a * d * b float64, float32, bfloat16 or float16 values "
                            "(a set per batch element) expected")
    cdef cn_ffi_buffer* g = cn_ffi_arg(f, 1)
    cdef cn_ffi_buffer* w = cn_ffi_ret(f, 0)
    cdef cn_ffi_buffer* norm = cn_ffi_ret(f, 1)
    if not (ffi_array(g, math, k * D) and ffi_array(w, storage, k * A * D * B)
            and ffi_array(norm, math, k * D)):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "g and norm: d values of v's math type, w of v's shape and dtype "
                            "expected")
    cdef Py_ssize_t s
    for s in range(k if A * D * B > 0 else 0):
        if forward_any(storage, ffi_set(v, s, A * D * B), ffi_set(g, s, D),
                       ffi_set(w, s, A * D * B), ffi_set(norm, s, D), A, D, B) != 0:
            return cn_ffi_error(f, CN_FFI_RESOURCE_EXHAUSTED, op,
                                "could not allocate the reduction workspace")
    return NULL


cdef void* weight_norm_backward_ffi(void* frame) noexcept nogil:
    # args: grad_w, v, g, norm; rets: grad_v, grad_g; attrs: a, d, b
    cdef cn_ffi_frame* f = <cn_ffi_frame*>frame
    if cn_ffi_metadata_call(f):
        return NULL
    cdef const char* op = "weight_norm"
    cdef int64_t A, D, B
    if not wn_attrs(f, &A, &D, &B):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "the backward call lacks an attribute (a, d, b)")
    cdef cn_ffi_buffer* v = cn_ffi_arg(f, 1)
    cdef int storage = ffi_storage(v)
    cdef int math = math_storage(storage)
    cdef int64_t k = ffi_sets(v, A * D * B)
    if storage == NOT_PLAIN or k < 0:
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "v: a * d * b float64, float32, bfloat16 or float16 values "
                            "(a set per batch element) expected")
    cdef cn_ffi_buffer* gw = cn_ffi_arg(f, 0)
    cdef cn_ffi_buffer* g = cn_ffi_arg(f, 2)
    cdef cn_ffi_buffer* norm = cn_ffi_arg(f, 3)
    cdef cn_ffi_buffer* gv = cn_ffi_ret(f, 0)
    cdef cn_ffi_buffer* gg = cn_ffi_ret(f, 1)
    if not (ffi_array(gw, storage, k * A * D * B) and ffi_array(gv, storage, k * A * D * B)
            and ffi_array(g, math, k * D) and ffi_array(norm, math, k * D)
            and ffi_array(gg, math, k * D)):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "grad_w, grad_v of v's shape and dtype, g, norm and grad_g of d "
                            "values of its math type expected")
    cdef Py_ssize_t s
    for s in range(k if A * D * B > 0 else 0):
        if backward_any(storage, ffi_set(gw, s, A * D * B), ffi_set(v, s, A * D * B),
                        ffi_set(g, s, D), ffi_set(norm, s, D), ffi_set(gv, s, A * D * B),
                        ffi_set(gg, s, D), A, D, B) != 0:
            return cn_ffi_error(f, CN_FFI_RESOURCE_EXHAUSTED, op,
                                "could not allocate the reduction workspace")
    return NULL


def ffi_handlers(int major, int minor):
    """Weight norm's XLA FFI handlers, {target name: PyCapsule of the
    handler's address}, reporting API version major.minor (the runtime
    registers only handlers of its own version)."""
    cn_ffi_claim(major, minor)
    return {
        "cynorm_weight_norm": PyCapsule_New(<void*>weight_norm_ffi, NULL, NULL),
        "cynorm_weight_norm_backward": PyCapsule_New(<void*>weight_norm_backward_ffi, NULL, NULL),
    }
