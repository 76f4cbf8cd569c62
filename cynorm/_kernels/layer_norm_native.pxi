# Included by layer_norm.pyx.
# The row norms on raw buffers with their parameters as given (16-bit ones
# widened here, layer norm's missing weight or bias filled): what the
# plain-case entries (layer_norm_plain.pxi) run once they have checked the
# arrays, what the XLA handlers (layer_norm_ffi.pxi) run on XLA's buffers,
# and what the table cn_native_abi.h describes hands to callers outside
# Python (cynorm's compiled PyTorch operators, cynorm/_torch_ops.cpp).

cdef extern from "cn_native_abi.h":
    enum: CN_NATIVE_ABI_VERSION
    enum:
        CN_NATIVE_F32
        CN_NATIVE_F64
        CN_NATIVE_BF16
        CN_NATIVE_F16
    ctypedef struct cn_native_abi:
        int version
        int (*rows_forward)(int, const void*, const void*, const void*, int, const void*, int,
                            void*, void*, void*, void*, Py_ssize_t, Py_ssize_t, double,
                            int) noexcept nogil
        int (*rows_backward)(int, const void*, const Py_ssize_t*, const void*, const void*,
                             const void*, const void*, const void*, int, void*, void*, int,
                             void*, int, Py_ssize_t, Py_ssize_t) noexcept nogil


cdef void* math_fill(void* dst, int storage, Py_ssize_t N, double fill) noexcept nogil:
    # dst[:N] = fill in the math type of `storage` data (layer norm's missing
    # weight or bias, as layernorm.py makes it); returns dst
    cdef Py_ssize_t j
    for j in range(N):
        if math_storage(storage) == STORAGE_F64:
            (<double*>dst)[j] = fill
        else:
            (<float*>dst)[j] = <float>fill
    return dst


cdef int rows_forward_params(int storage, const void* x, const void* res, const void* w,
                             int w_st, const void* b, int b_st, void* y, void* h, void* mean,
                             void* rstd, Py_ssize_t M, Py_ssize_t N, double eps,
                             int centered) noexcept nogil:
    """rows_forward with the parameters of storage w_st, b_st (the math
    type, or x's 16-bit one): 0, or -1 if their math-type copies could not
    be allocated."""
    # 16-bit weight and bias are widened to float32 (2 * N floats); layer
    # norm's kernel takes weight and bias both or neither, so one given alone
    # gets the other as ones or zeros of the math type (the last N values)
    cdef bint alone = centered and (w == NULL) != (b == NULL)
    cdef Py_ssize_t msz = 8 if math_storage(storage) == STORAGE_F64 else 4
    cdef char* scratch = NULL
    if (w != NULL or b != NULL) and (itemsize(storage) == 2 or alone):
        scratch = <char*>malloc(3 * N * msz)
        if scratch == NULL:
            return -1
    cdef const void* pw = param_values(w, w_st, N, <float*>scratch)
    cdef const void* pb = param_values(b, b_st, N,
                                       <float*>(scratch + N * msz) if scratch != NULL else NULL)
    if alone and w == NULL:
        pw = math_fill(scratch + 2 * N * msz, storage, N, 1.0)
    elif alone:
        pb = math_fill(scratch + 2 * N * msz, storage, N, 0.0)
    rows_forward(storage, x, pw, pb, y, mean, rstd, M, N, eps, max_threads(), res, h)
    free(scratch)
    return 0


cdef int rows_backward_params(int storage, const void* dy, const Py_ssize_t* dyr,
                              const void* dh, const void* x, const void* mean, const void* rstd,
                              const void* w, int w_st, void* gx, void* gw, int gw_st, void* gb,
                              int gb_st, Py_ssize_t M, Py_ssize_t N) noexcept nogil:
    """rows_backward with the weight of storage w_st, and grad_weight and
    grad_bias (gw, gb; NULL: not computed) written in theirs, rounded from
    the float64 column sums: 0, or -1 if a workspace could not be
    allocated."""
    cdef bint sums_wanted = gw != NULL or gb != NULL
    cdef bint widen = w != NULL and itemsize(w_st) == 2
    cdef double* sums = <double*>malloc(2 * N * sizeof(double)) if sums_wanted else NULL
    cdef float* scratch = <float*>malloc(N * sizeof(float)) if widen else NULL
    cdef int status = -1
    if (sums != NULL or not sums_wanted) and (scratch != NULL or not widen):
        status = rows_backward(storage, dy, dyr, x, mean, rstd,
                               param_values(w, w_st, N, scratch), gx,
                               sums if gw != NULL else NULL, sums + N if gb != NULL else NULL,
                               M, N, max_threads(), dh)
    free(scratch)
    if status >= 0:
        if gw != NULL:
            store_doubles(gw, gw_st, N, sums)
        if gb != NULL:
            store_doubles(gb, gb_st, N, sums + N)
    free(sums)
    return -1 if status < 0 else 0


cdef cn_native_abi NATIVE_ABI
NATIVE_ABI.version = CN_NATIVE_ABI_VERSION
NATIVE_ABI.rows_forward = rows_forward_params
NATIVE_ABI.rows_backward = rows_backward_params
if (CN_NATIVE_F32, CN_NATIVE_F64, CN_NATIVE_BF16, CN_NATIVE_F16) != (
        STORAGE_F32, STORAGE_F64, STORAGE_BF16, STORAGE_F16):
    raise ImportError("cn_native_abi.h's storage codes differ from _plain.pxd's")


def native_abi():
    """The address of this module's cn_native_abi table (cn_native_abi.h),
    as an int: what cynorm's compiled PyTorch operators call."""
    return <size_t>&NATIVE_ABI
