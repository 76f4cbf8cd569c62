# Included by batch_norm.pyx.
# Batch norm, group norm and instance norm as XLA FFI handlers (cynorm.jax
# registers them for the CPU): forward_any / backward_any and
# group_forward_any / group_backward_any on XLA's buffers, with no Python and
# no copy.  Batch norm sees x as A x C x B (channels in the middle, as its
# kernels take it), group norm as N x C x HW, or N x HW x C (last); instance
# norm is group norm with a group per channel.
# Each handler checks what it is given (cynorm.jax built the call, so a
# failure means a mismatch) and reports errors through the runtime.

from cpython.pycapsule cimport PyCapsule_New
from libc.stdint cimport int64_t

from cynorm._kernels.xla_ffi cimport *


cdef void* batch_norm_ffi(void* frame) noexcept nogil:
    # args: x [, weight] [, bias] [, running_mean, running_var];
    # rets: y, then in training save_mean, save_invstd (the math type) and,
    # with running statistics, their updated values;
    # attrs: a, c, b (x's A x C x B), eps, momentum, training, and weight,
    # bias, running (whether each is passed).  Under vmap every buffer holds
    # a set per batch element (ffi_sets), each normalized by its own
    # statistics: a call per set
    cdef cn_ffi_frame* f = <cn_ffi_frame*>frame
    if cn_ffi_metadata_call(f):
        return NULL
    cdef const char* op = "batch_norm"
    cdef int64_t A, C, B, train, has_w, has_b, has_r
    cdef double eps, momentum
    if not (cn_ffi_int_attr(f, "a", &A) and cn_ffi_int_attr(f, "c", &C)
            and cn_ffi_int_attr(f, "b", &B) and cn_ffi_float_attr(f, "eps", &eps)
            and cn_ffi_float_attr(f, "momentum", &momentum)
            and cn_ffi_int_attr(f, "training", &train) and cn_ffi_int_attr(f, "weight", &has_w)
            and cn_ffi_int_attr(f, "bias", &has_b) and cn_ffi_int_attr(f, "running", &has_r)):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "the call lacks an attribute (a, c, b, eps, momentum, training, "
                            "weight, bias, running)")
    cdef cn_ffi_buffer* x = cn_ffi_arg(f, 0)
    cdef int storage = ffi_storage(x)
    cdef int64_t k = ffi_sets(x, A * C * B) if A >= 0 and C >= 0 and B >= 0 else -1
    if storage == NOT_PLAIN or k < 0:
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "x: a * c * b float64, float32, bfloat16 or float16 values "
                            "(a set per batch element) expected")
    cdef int math = math_storage(storage)
    cdef int64_t i = 1
    cdef cn_ffi_buffer* w = NULL
    cdef cn_ffi_buffer* b = NULL
    cdef cn_ffi_buffer* rm = NULL
    cdef cn_ffi_buffer* rv = NULL
    if has_w:
        w = cn_ffi_arg(f, i)
        i += 1
    if has_b:
        b = cn_ffi_arg(f, i)
        i += 1
    if has_r:
        rm = cn_ffi_arg(f, i)
        rv = cn_ffi_arg(f, i + 1)
    if ((has_w and not ffi_param(w, storage, k * C))
            or (has_b and not ffi_param(b, storage, k * C))
            or (has_r and not (ffi_param(rm, storage, k * C) and ffi_param(rv, storage, k * C)))
            or (not train and not has_r)):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "weight, bias, running_mean, running_var: c values of x's dtype "
                            "or of its math type expected (inference needs the running ones)")
    cdef cn_ffi_buffer* y = cn_ffi_ret(f, 0)
    cdef cn_ffi_buffer* save_mean = cn_ffi_ret(f, 1) if train else NULL
    cdef cn_ffi_buffer* save_invstd = cn_ffi_ret(f, 2) if train else NULL
    cdef cn_ffi_buffer* new_rm = cn_ffi_ret(f, 3) if train and has_r else NULL
    cdef cn_ffi_buffer* new_rv = cn_ffi_ret(f, 4) if train and has_r else NULL
    if not (ffi_array(y, storage, k * A * C * B)
            and (not train or (ffi_array(save_mean, math, k * C)
                               and ffi_array(save_invstd, math, k * C)))
            and (new_rm == NULL or ffi_array(new_rm, ffi_storage(rm), k * C))
            and (new_rv == NULL or ffi_array(new_rv, ffi_storage(rv), k * C))):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "the results: y of x's shape and dtype, c statistics of the math "
                            "type, running statistics of their own dtype expected")
    # training updates copies of the running statistics: XLA's inputs stay as they are
    if has_r and train:
        memcpy(new_rm.data, rm.data, k * C * itemsize(ffi_storage(rm)))
        memcpy(new_rv.data, rv.data, k * C * itemsize(ffi_storage(rv)))
    cdef const cn_ffi_buffer* prm = new_rm if has_r and train else rm
    cdef const cn_ffi_buffer* prv = new_rv if has_r and train else rv
    cdef Py_ssize_t s
    for s in range(k):
        if forward_any(storage, ffi_set(x, s, A * C * B), ffi_set(y, s, A * C * B),
                       ffi_set(w, s, C), ffi_storage(w), ffi_set(b, s, C), ffi_storage(b),
                       ffi_set(prm, s, C), ffi_storage(rm), ffi_set(prv, s, C), ffi_storage(rv),
                       ffi_set(save_mean, s, C), ffi_set(save_invstd, s, C), A, C, B, train,
                       momentum, eps, max_threads()) != 0:
            return cn_ffi_error(f, CN_FFI_RESOURCE_EXHAUSTED, op,
                                "could not allocate its workspace")
    return NULL


cdef void* batch_norm_backward_ffi(void* frame) noexcept nogil:
    # args: dy, x [, weight], first, second (training: save_mean and
    # save_invstd; inference: the running mean and variance, any dtype);
    # rets: grad_x [, grad_weight] [, grad_bias] (each in its parameter's
    # dtype); attrs: a, c, b, eps, training, weight (whether it is passed),
    # weight_grad, bias_grad (whether each is returned).  Under vmap every
    # buffer holds a set per batch element (ffi_sets): a call per set
    cdef cn_ffi_frame* f = <cn_ffi_frame*>frame
    if cn_ffi_metadata_call(f):
        return NULL
    cdef const char* op = "batch_norm"
    cdef int64_t A, C, B, train, has_w, want_gw, want_gb
    cdef double eps
    if not (cn_ffi_int_attr(f, "a", &A) and cn_ffi_int_attr(f, "c", &C)
            and cn_ffi_int_attr(f, "b", &B) and cn_ffi_float_attr(f, "eps", &eps)
            and cn_ffi_int_attr(f, "training", &train) and cn_ffi_int_attr(f, "weight", &has_w)
            and cn_ffi_int_attr(f, "weight_grad", &want_gw)
            and cn_ffi_int_attr(f, "bias_grad", &want_gb)):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "the backward call lacks an attribute (a, c, b, eps, training, "
                            "weight, weight_grad, bias_grad)")
    cdef cn_ffi_buffer* x = cn_ffi_arg(f, 1)
    cdef int storage = ffi_storage(x)
    cdef int64_t k = ffi_sets(x, A * C * B) if A >= 0 and C >= 0 and B >= 0 else -1
    if storage == NOT_PLAIN or k < 0:
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "x: a * c * b float64, float32, bfloat16 or float16 values "
                            "(a set per batch element) expected")
    cdef cn_ffi_buffer* dy = cn_ffi_arg(f, 0)
    cdef cn_ffi_buffer* w = cn_ffi_arg(f, 2) if has_w else NULL
    cdef cn_ffi_buffer* first = cn_ffi_arg(f, 2 + (has_w != 0))
    cdef cn_ffi_buffer* second = cn_ffi_arg(f, 3 + (has_w != 0))
    cdef cn_ffi_buffer* gx = cn_ffi_ret(f, 0)
    cdef cn_ffi_buffer* gw = cn_ffi_ret(f, 1) if want_gw else NULL
    cdef cn_ffi_buffer* gb = cn_ffi_ret(f, 1 + (want_gw != 0)) if want_gb else NULL
    if not (ffi_array(dy, storage, k * A * C * B) and ffi_array(gx, storage, k * A * C * B)
            and (not has_w or ffi_param(w, storage, k * C))
            and ffi_storage(first) != NOT_PLAIN and cn_ffi_count(first) == k * C
            and ffi_storage(second) != NOT_PLAIN and cn_ffi_count(second) == k * C
            and (not want_gw or (ffi_storage(gw) != NOT_PLAIN and cn_ffi_count(gw) == k * C))
            and (not want_gb or (ffi_storage(gb) != NOT_PLAIN and cn_ffi_count(gb) == k * C))):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "dy, grad_x of x's shape and dtype, c-value weight, statistics and "
                            "parameter gradients expected")
    cdef Py_ssize_t s
    for s in range(k):
        if backward_params(storage, ffi_set(dy, s, A * C * B), ffi_set(x, s, A * C * B),
                           ffi_set(gx, s, A * C * B), ffi_set(w, s, C), ffi_storage(w),
                           ffi_set(first, s, C), ffi_storage(first), ffi_set(second, s, C),
                           ffi_storage(second), ffi_set(gw, s, C), ffi_storage(gw),
                           ffi_set(gb, s, C), ffi_storage(gb), A, C, B, train, eps) != 0:
            return cn_ffi_error(f, CN_FFI_RESOURCE_EXHAUSTED, op,
                                "could not allocate its workspace")
    return NULL


cdef bint group_attrs(cn_ffi_frame* f, int64_t* N, int64_t* C, int64_t* HW, int64_t* G,
                      int64_t* last) noexcept nogil:
    # x's N, C, HW, its number of groups and layout; False if one is missing
    # or they do not describe whole groups
    return (cn_ffi_int_attr(f, "n", N) and cn_ffi_int_attr(f, "c", C)
            and cn_ffi_int_attr(f, "hw", HW) and cn_ffi_int_attr(f, "groups", G)
            and cn_ffi_int_attr(f, "last", last) and N[0] >= 0 and HW[0] > 0
            and G[0] > 0 and C[0] > 0 and C[0] % G[0] == 0)


cdef void update_instance_running(void* rm, int rs, void* rv, int vs, const double* m64,
                                  const double* v64, Py_ssize_t N, Py_ssize_t C, Py_ssize_t HW,
                                  double momentum) noexcept nogil:
    # instance_norm's running-statistics rule (_channels.update_running on
    # the batch's average of the instances' mean and unbiased variance, each
    # summed in order over n), in float64 and the same order, into rm and rv
    # (already holding the old values; N > 0); NaN stored as the canonical NaN
    cdef Py_ssize_t n, c
    cdef double ms, vs_
    for c in range(C):
        ms = m64[c]
        vs_ = v64[c]
        for n in range(1, N):
            ms = ms + m64[n * C + c]
            vs_ = vs_ + v64[n * C + c]
        store_value(rm, rs, c, canonical(momentum * (ms / N)
                                         + (1.0 - momentum) * value_at(rm, rs, c)))
        store_value(rv, vs, c, canonical(momentum * ((vs_ / N) * (<double>HW / (HW - 1)))
                                         + (1.0 - momentum) * value_at(rv, vs, c)))


cdef void* groups_forward_ffi(cn_ffi_frame* f, bint instance) noexcept nogil:
    # group norm -- args: x [, weight] [, bias]; rets: y, mean, rstd (N * G,
    # the math type); attrs: n, c, hw, groups, last, eps, weight, bias
    # (whether each is passed).
    # instance norm (groups == c) also takes attrs use_input_stats, running,
    # momentum, and args running_mean, running_var after bias when running:
    # with use_input_stats, their updated values are rets after rstd;
    # without, they normalize (mean and rstd returned per instance).
    # Under vmap every buffer holds a set per batch element (ffi_sets); sets
    # whose parameters are the same bits, with no running statistics to
    # update, run as one call over all their samples (the same bits)
    if cn_ffi_metadata_call(f):
        return NULL
    cdef const char* op = "instance_norm" if instance else "group_norm"
    cdef int64_t N, C, HW, G, last, has_w, has_b, use_stats = 1, has_r = 0
    cdef double eps, momentum = 0.0
    if not (group_attrs(f, &N, &C, &HW, &G, &last) and cn_ffi_float_attr(f, "eps", &eps)
            and cn_ffi_int_attr(f, "weight", &has_w) and cn_ffi_int_attr(f, "bias", &has_b)):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "the call lacks an attribute (n, c, hw, groups, last, eps, weight, "
                            "bias), or its groups do not divide c")
    if instance and not (G == C and cn_ffi_int_attr(f, "use_input_stats", &use_stats)
                         and cn_ffi_int_attr(f, "running", &has_r)
                         and cn_ffi_float_attr(f, "momentum", &momentum)
                         and (use_stats or has_r) and (not use_stats or not has_r or HW > 1)):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "the call lacks an attribute (use_input_stats, running, momentum), "
                            "its groups are not its channels, or its running statistics are "
                            "missing (or cannot be updated from one position)")
    cdef cn_ffi_buffer* x = cn_ffi_arg(f, 0)
    cdef int storage = ffi_storage(x)
    cdef int64_t k = ffi_sets(x, N * C * HW)
    if storage == NOT_PLAIN or k < 0:
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "x: n * c * hw float64, float32, bfloat16 or float16 values "
                            "(a set per batch element) expected")
    cdef int math = math_storage(storage)
    cdef cn_ffi_buffer* w = cn_ffi_arg(f, 1) if has_w else NULL
    cdef cn_ffi_buffer* b = cn_ffi_arg(f, 1 + (has_w != 0)) if has_b else NULL
    cdef int64_t next_arg = 1 + (has_w != 0) + (has_b != 0)
    cdef cn_ffi_buffer* rm = cn_ffi_arg(f, next_arg) if has_r else NULL
    cdef cn_ffi_buffer* rv = cn_ffi_arg(f, next_arg + 1) if has_r else NULL
    cdef cn_ffi_buffer* y = cn_ffi_ret(f, 0)
    cdef cn_ffi_buffer* mean = cn_ffi_ret(f, 1)
    cdef cn_ffi_buffer* rstd = cn_ffi_ret(f, 2)
    cdef bint update = has_r and use_stats
    cdef cn_ffi_buffer* new_rm = cn_ffi_ret(f, 3) if update else NULL
    cdef cn_ffi_buffer* new_rv = cn_ffi_ret(f, 4) if update else NULL
    if not (ffi_array(y, storage, k * N * C * HW) and ffi_array(mean, math, k * N * G)
            and ffi_array(rstd, math, k * N * G)
            and (not has_w or ffi_param(w, storage, k * C))
            and (not has_b or ffi_param(b, storage, k * C))
            and (not has_r or (ffi_param(rm, storage, k * C) and ffi_param(rv, storage, k * C)))
            and (not update or (ffi_array(new_rm, ffi_storage(rm), k * C)
                                and ffi_array(new_rv, ffi_storage(rv), k * C)))):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "y of x's shape and dtype, n * groups statistics of the math type, "
                            "c-value weight, bias and running statistics of x's dtype or its "
                            "math type expected")
    cdef int64_t sets = k, n = N
    if (k > 1 and not update and sets_equal(w, k, C) and sets_equal(b, k, C)
            and sets_equal(rm, k, C) and sets_equal(rv, k, C)):
        sets, n = 1, k * N
    # the parameters as float64, then the statistics in float64 (mean, var, rstd)
    cdef double* buf = <double*>malloc((2 * C + 3 * n * G + 1) * sizeof(double))
    if buf == NULL:
        return cn_ffi_error(f, CN_FFI_RESOURCE_EXHAUSTED, op, "could not allocate the coefficients")
    cdef double* m64 = buf + 2 * C
    cdef double* v64 = m64 + n * G
    cdef double* r64 = m64 + 2 * n * G
    cdef bint affine = has_w or has_b
    cdef int rc = 0
    cdef Py_ssize_t i, s
    for s in range(sets):
        channel_params(ffi_set(w, s, C), ffi_storage(w), ffi_set(b, s, C), ffi_storage(b), C,
                       buf)
        if not use_stats:
            # each instance normalized with the running statistics, as instance_norm
            for i in range(n * C):
                m64[i] = value_at(rm.data, ffi_storage(rm), s * C + i % C)
                r64[i] = 1.0 / sqrt(value_at(rv.data, ffi_storage(rv), s * C + i % C) + eps)
        if n > 0:
            rc = group_forward_any(storage, ffi_set(x, s, n * C * HW), ffi_set(y, s, n * C * HW),
                                   buf if affine else NULL, buf + C if affine else NULL, m64,
                                   v64, r64, n, C, HW, G, eps, last, not use_stats,
                                   max_threads())
        for i in range(n * G):
            store_value(mean.data, math, s * n * G + i, m64[i])
            store_value(rstd.data, math, s * n * G + i, r64[i])
        if update:      # updated copies: XLA's inputs stay as they are
            memcpy(ffi_set(new_rm, s, C), ffi_set(rm, s, C), C * itemsize(ffi_storage(rm)))
            memcpy(ffi_set(new_rv, s, C), ffi_set(rv, s, C), C * itemsize(ffi_storage(rv)))
            if n > 0 and rc == 0:
                update_instance_running(ffi_set(new_rm, s, C), ffi_storage(rm),
                                        ffi_set(new_rv, s, C), ffi_storage(rv), m64, v64, n, C,
                                        HW, momentum)
        if rc != 0:
            break
    free(buf)
    if rc != 0:
        return cn_ffi_error(f, CN_FFI_RESOURCE_EXHAUSTED, op,
                            "could not allocate the reduction workspace")
    return NULL


cdef void* group_norm_ffi(void* frame) noexcept nogil:
    return groups_forward_ffi(<cn_ffi_frame*>frame, False)


cdef void* instance_norm_ffi(void* frame) noexcept nogil:
    return groups_forward_ffi(<cn_ffi_frame*>frame, True)


cdef void* groups_backward_ffi(cn_ffi_frame* f, bint instance) noexcept nogil:
    # args: dy, x, mean, rstd [, weight]; rets: grad_x [, grad_weight]
    # [, grad_bias] (each in its parameter's dtype); attrs: n, c, hw, groups,
    # last, weight (whether it is passed), weight_grad, bias_grad; instance
    # norm (groups == c) also use_input_stats (without: statistics that do
    # not depend on x, grad_x = dy * weight * rstd).  Under vmap every buffer
    # holds a set per batch element (ffi_sets), each parameter gradient set
    # summed over its own samples; sets with the same weight and no
    # parameter gradient wanted run as one call
    if cn_ffi_metadata_call(f):
        return NULL
    cdef const char* op = "instance_norm" if instance else "group_norm"
    cdef int64_t N, C, HW, G, last, has_w, want_gw, want_gb, use_stats = 1
    if not (group_attrs(f, &N, &C, &HW, &G, &last) and cn_ffi_int_attr(f, "weight", &has_w)
            and cn_ffi_int_attr(f, "weight_grad", &want_gw)
            and cn_ffi_int_attr(f, "bias_grad", &want_gb)
            and (not instance or (G == C and cn_ffi_int_attr(f, "use_input_stats", &use_stats)))):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "the backward call lacks an attribute (n, c, hw, groups, last, "
                            "weight, weight_grad, bias_grad, and for instance norm "
                            "use_input_stats), or its groups do not divide c")
    cdef cn_ffi_buffer* x = cn_ffi_arg(f, 1)
    cdef int storage = ffi_storage(x)
    cdef int64_t k = ffi_sets(x, N * C * HW)
    if storage == NOT_PLAIN or k < 0:
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "x: n * c * hw float64, float32, bfloat16 or float16 values "
                            "(a set per batch element) expected")
    cdef int math = math_storage(storage)
    cdef cn_ffi_buffer* dy = cn_ffi_arg(f, 0)
    cdef cn_ffi_buffer* mean = cn_ffi_arg(f, 2)
    cdef cn_ffi_buffer* rstd = cn_ffi_arg(f, 3)
    cdef cn_ffi_buffer* w = cn_ffi_arg(f, 4) if has_w else NULL
    cdef cn_ffi_buffer* gx = cn_ffi_ret(f, 0)
    cdef cn_ffi_buffer* gw = cn_ffi_ret(f, 1) if want_gw else NULL
    cdef cn_ffi_buffer* gb = cn_ffi_ret(f, 1 + (want_gw != 0)) if want_gb else NULL
    if not (ffi_array(dy, storage, k * N * C * HW) and ffi_array(gx, storage, k * N * C * HW)
            and ffi_array(mean, math, k * N * G) and ffi_array(rstd, math, k * N * G)
            and (not has_w or ffi_param(w, storage, k * C))
            and (not want_gw or (ffi_storage(gw) != NOT_PLAIN and cn_ffi_count(gw) == k * C))
            and (not want_gb or (ffi_storage(gb) != NOT_PLAIN and cn_ffi_count(gb) == k * C))):
        return cn_ffi_error(f, CN_FFI_INVALID_ARGUMENT, op,
                            "dy, grad_x of x's shape and dtype, n * groups statistics of the "
                            "math type, c-value weight and parameter gradients expected")
    cdef int64_t sets = k, n = N
    if k > 1 and not (want_gw or want_gb) and sets_equal(w, k, C):
        sets, n = 1, k * N
    cdef Py_ssize_t s
    for s in range(sets):
        if groups_backward(storage, ffi_set(dy, s, n * C * HW), ffi_set(x, s, n * C * HW),
                           ffi_set(gx, s, n * C * HW), ffi_set(mean, s, n * G),
                           ffi_set(rstd, s, n * G), ffi_set(w, s, C), ffi_storage(w),
                           ffi_set(gw, s, C), ffi_storage(gw), ffi_set(gb, s, C),
                           ffi_storage(gb), n, C, HW, G, last, not use_stats) != 0:
            return cn_ffi_error(f, CN_FFI_RESOURCE_EXHAUSTED, op,
                                "could not allocate its workspace")
    return NULL


cdef void* group_norm_backward_ffi(void* frame) noexcept nogil:
    return groups_backward_ffi(<cn_ffi_frame*>frame, False)


cdef void* instance_norm_backward_ffi(void* frame) noexcept nogil:
    return groups_backward_ffi(<cn_ffi_frame*>frame, True)


def ffi_handlers(int major, int minor):
    """Batch norm's, group norm's and instance norm's XLA FFI handlers, {target name: PyCapsule of the
    handler's address}, reporting API version major.minor (the runtime
    registers only handlers of its own version)."""
    cn_ffi_claim(major, minor)
    return {
        "cynorm_batch_norm": PyCapsule_New(<void*>batch_norm_ffi, NULL, NULL),
        "cynorm_batch_norm_backward": PyCapsule_New(<void*>batch_norm_backward_ffi, NULL, NULL),
        "cynorm_group_norm": PyCapsule_New(<void*>group_norm_ffi, NULL, NULL),
        "cynorm_group_norm_backward": PyCapsule_New(<void*>group_norm_backward_ffi, NULL, NULL),
        "cynorm_instance_norm": PyCapsule_New(<void*>instance_norm_ffi, NULL, NULL),
        "cynorm_instance_norm_backward": PyCapsule_New(<void*>instance_norm_backward_ffi, NULL,
                                                       NULL),
    }
