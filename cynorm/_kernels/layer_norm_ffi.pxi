# Included by layer_norm.pyx.
# The row norms as XLA FFI handlers (cynorm.jax registers them for the CPU):
# XLA hands them its buffers, and they run rows_forward_params /
# rows_backward_params (layer_norm_native.pxi) on them in place, with no
# Python and no copy.  Under jax.vmap XLA calls them once for the whole
# batch (its arguments broadcast to it): the rows of every batch element,
# with a parameter set per element (identical sets: one set).  Each checks what it is given (cynorm.jax built the call, so a
# failure means a mismatch, and the message says which buffer) and reports
# errors through the runtime.

from cpython.pycapsule cimport PyCapsule_New
from libc.stdint cimport int64_t

from cynorm._kernels.xla_ffi cimport *


cdef Py_ssize_t param_sets(const cn_ffi_buffer* b, int storage, Py_ssize_t N,
                           Py_ssize_t M) noexcept nogil:
    """How many sets of N values b holds, of x's storage or of its math type:
    1, or under jax.vmap (cynorm.jax broadcasts every argument to the
    batch) one per batch element, each for an equal share of the M rows; 0
    if b holds no whole number of sets that divides the rows."""
    if b == NULL or not (ffi_storage(b) == storage or ffi_storage(b) == math_storage(storage)):
        return 0
    cdef int64_t count = cn_ffi_count(b)
    if count <= 0 or count % N != 0 or M % (count // N) != 0:
        return 0
    return count // N


cdef void* rows_forward_ffi(cn_ffi_frame* f, bint centered) noexcept nogil:
    # args: x [, residual] [, weight] [, bias]; rets: y [, h] [, mean], rstd
    # (the math type); attrs: eps, n (the row length), residual, weight and
    # bias (whether each is passed; with residual, h = x + residual is
    # written and normalized: the fused forms).  Weight and bias may hold a
    # set per equal share of the rows (param_sets: jax.vmap's batch)
    cdef const char* op = "layer_norm" if centered else "rms_norm"
    if cn_ffi_metadata_call(f):
        return NULL
    cdef double eps
    cdef int64_t N, has_r, has_w, has_b
    if not (cn_ffi_float_attr(f, "eps", &eps) and cn_ffi_int_attr(f, "n", &N)
            and cn_ffi_int_attr(f, "residual", &has_r)
            and cn_ffi_int_attr(f, "weight", &has_w) and cn_ffi_int_attr(f, "bias", &has_b)):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "the call lacks an attribute (eps, n, residual, weight, bias)")
    has_r = has_r != 0
    cdef cn_ffi_buffer* x = cn_ffi_arg(f, 0)
    cdef int storage = ffi_storage(x)
    if storage == NOT_PLAIN or N <= 0 or cn_ffi_count(x) % N != 0:
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "x: float64, float32, bfloat16 or float16 rows of n > 0 values expected")
    cdef int math = math_storage(storage)
    cdef Py_ssize_t M = cn_ffi_count(x) // N
    cdef cn_ffi_buffer* res = cn_ffi_arg(f, 1) if has_r else NULL
    cdef cn_ffi_buffer* y = cn_ffi_ret(f, 0)
    cdef cn_ffi_buffer* h = cn_ffi_ret(f, 1) if has_r else NULL
    cdef cn_ffi_buffer* mean = cn_ffi_ret(f, 1 + has_r) if centered else NULL
    cdef cn_ffi_buffer* rstd = cn_ffi_ret(f, 1 + has_r + centered)
    if has_r and not (ffi_array(res, storage, M * N) and ffi_array(h, storage, M * N)):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "residual and h of x's shape and dtype expected")
    if not (ffi_array(y, storage, M * N) and ffi_array(rstd, math, M)
            and (not centered or ffi_array(mean, math, M))):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "the results: y of x's shape and dtype, M statistics of the math type expected")
    if M == 0:
        return NULL
    cdef cn_ffi_buffer* w = cn_ffi_arg(f, 1 + has_r) if has_w else NULL
    cdef cn_ffi_buffer* b = cn_ffi_arg(f, 1 + has_r + (has_w != 0)) if has_b else NULL
    cdef Py_ssize_t k = param_sets(w, storage, N, M) if has_w else (
        param_sets(b, storage, N, M) if has_b else 1)
    if k == 0 or (has_b and param_sets(b, storage, N, M) != k) or (has_b and not centered):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "weight, bias: n values of x's dtype or of its math type expected "
                            "(a set per equal share of the rows)")
    if k > 1 and sets_equal(w, k, N) and sets_equal(b, k, N):
        k = 1       # a parameter the batch shares: one call over every row (the same bits)
    cdef Py_ssize_t R = M // k, g, r
    for g in range(k):
        r = g * R
        # (a buffer not passed, NULL, stays NULL)
        if rows_forward_params(storage, ffi_set(x, r, N), ffi_set(res, r, N), ffi_set(w, g, N),
                               ffi_storage(w), ffi_set(b, g, N), ffi_storage(b),
                               ffi_set(y, r, N), ffi_set(h, r, N), ffi_set(mean, r, 1),
                               ffi_set(rstd, r, 1), R, N, eps, centered) != 0:
            return cn_ffi_error(f, CN_FFI_RESOURCE_EXHAUSTED, op,
                                "could not allocate the parameters' float32 copy")
    return NULL


cdef void* rows_backward_ffi(cn_ffi_frame* f, bint centered) noexcept nogil:
    # args: dy, x [, mean], rstd [, weight]; rets: grad_x [, grad_weight]
    # [, grad_bias] (each in its parameter's dtype); attrs: n, weight (whether
    # it is passed), weight_grad, bias_grad (whether each is returned).  The
    # weight and the parameters' gradients may hold a set per equal share of
    # the rows (param_sets: jax.vmap's batch), each gradient set summed over
    # its own rows
    cdef const char* op = "layer_norm" if centered else "rms_norm"
    if cn_ffi_metadata_call(f):
        return NULL
    cdef int64_t N, has_w, want_gw, want_gb
    if not (cn_ffi_int_attr(f, "n", &N) and cn_ffi_int_attr(f, "weight", &has_w)
            and cn_ffi_int_attr(f, "weight_grad", &want_gw)
            and cn_ffi_int_attr(f, "bias_grad", &want_gb)):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "the backward call lacks an attribute (n, weight, weight_grad, bias_grad)")
    cdef cn_ffi_buffer* x = cn_ffi_arg(f, 1)
    cdef int storage = ffi_storage(x)
    if storage == NOT_PLAIN or N <= 0 or cn_ffi_count(x) % N != 0 or (want_gb and not centered):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "x: float64, float32, bfloat16 or float16 rows of n > 0 values expected")
    cdef int math = math_storage(storage)
    cdef Py_ssize_t M = cn_ffi_count(x) // N
    cdef cn_ffi_buffer* dy = cn_ffi_arg(f, 0)
    cdef cn_ffi_buffer* mean = cn_ffi_arg(f, 2) if centered else NULL
    cdef cn_ffi_buffer* rstd = cn_ffi_arg(f, 2 + centered)
    cdef cn_ffi_buffer* w = cn_ffi_arg(f, 3 + centered) if has_w else NULL
    cdef cn_ffi_buffer* gx = cn_ffi_ret(f, 0)
    cdef cn_ffi_buffer* gw = cn_ffi_ret(f, 1) if want_gw else NULL
    cdef cn_ffi_buffer* gb = cn_ffi_ret(f, 1 + (want_gw != 0)) if want_gb else NULL
    # the parameter sets: the weight's, else the gradients'
    cdef Py_ssize_t k = 1
    if has_w:
        k = param_sets(w, storage, N, M)
    elif want_gw or want_gb:
        k = max(<int64_t>1, cn_ffi_count(gw if want_gw else gb) // N)
    if not (ffi_array(dy, storage, M * N) and ffi_array(gx, storage, M * N)
            and ffi_array(rstd, math, M) and (not centered or ffi_array(mean, math, M))
            and k > 0 and M % k == 0
            and (not want_gw or (ffi_storage(gw) != NOT_PLAIN and cn_ffi_count(gw) == k * N))
            and (not want_gb or (ffi_storage(gb) != NOT_PLAIN and cn_ffi_count(gb) == k * N))):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "dy, grad_x of x's shape and dtype, M statistics of the math type, "
                            "n-value weight and parameter gradients (a set per equal share of "
                            "the rows) expected")
    # a shared weight whose gradient is not wanted: one call over every row
    # (the gradients' sets are each summed over their own rows)
    cdef Py_ssize_t sets = k
    if k > 1 and not (want_gw or want_gb) and sets_equal(w, k, N):
        sets = 1
    cdef int status = 0
    cdef Py_ssize_t R = M // sets, g, r
    for g in range(sets):
        r = g * R
        if R == 0:
            # no rows: zero sums (all-zero bits in every storage type)
            if want_gw:
                memset(ffi_set(gw, g, N), 0, N * itemsize(ffi_storage(gw)))
            if want_gb:
                memset(ffi_set(gb, g, N), 0, N * itemsize(ffi_storage(gb)))
            continue
        # each gradient set rounded into its parameter's dtype, as
        # layer_norm_backward rounds it
        status = rows_backward_params(storage, ffi_set(dy, r, N), NULL, NULL, ffi_set(x, r, N),
                                      ffi_set(mean, r, 1), ffi_set(rstd, r, 1), ffi_set(w, g, N),
                                      ffi_storage(w), ffi_set(gx, r, N), ffi_set(gw, g, N),
                                      ffi_storage(gw), ffi_set(gb, g, N), ffi_storage(gb), R, N)
        if status < 0:
            return cn_ffi_error(f, CN_FFI_RESOURCE_EXHAUSTED, op,
                                "could not allocate the reduction workspace")
    return NULL


cdef void* layer_norm_ffi(void* f) noexcept nogil:
    return rows_forward_ffi(<cn_ffi_frame*>f, True)


cdef void* layer_norm_backward_ffi(void* f) noexcept nogil:
    return rows_backward_ffi(<cn_ffi_frame*>f, True)


cdef void* rms_norm_ffi(void* f) noexcept nogil:
    return rows_forward_ffi(<cn_ffi_frame*>f, False)


cdef void* rms_norm_backward_ffi(void* f) noexcept nogil:
    return rows_backward_ffi(<cn_ffi_frame*>f, False)


def ffi_handlers(int major, int minor):
    """The row norms' XLA FFI handlers, {target name: PyCapsule of the
    handler's address}, reporting API version major.minor (the runtime
    registers only handlers of its own version)."""
    cn_ffi_claim(major, minor)
    return {
        "cynorm_layer_norm": PyCapsule_New(<void*>layer_norm_ffi, NULL, NULL),
        "cynorm_layer_norm_backward": PyCapsule_New(<void*>layer_norm_backward_ffi, NULL, NULL),
        "cynorm_rms_norm": PyCapsule_New(<void*>rms_norm_ffi, NULL, NULL),
        "cynorm_rms_norm_backward": PyCapsule_New(<void*>rms_norm_backward_ffi, NULL, NULL),
    }
