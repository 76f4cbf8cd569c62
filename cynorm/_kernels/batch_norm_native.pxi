# Included by batch_norm.pyx.
# Batch norm's and group norm's raw-buffer entries as the table
# cn_native_abi.h describes hands them to callers outside Python (cynorm's
# compiled PyTorch operators, cynorm/_torch_ops.cpp): forward_any and
# backward_params (batch_norm_ops.pxi.tp), groups_forward and
# groups_backward (group_norm.pxi.tp), the compositions the plain-case
# entries, the Python layer and the XLA handlers run.

cdef extern from "cn_native_abi.h":
    enum: CN_NATIVE_ABI_VERSION
    ctypedef struct cn_native_channels_abi:
        int version
        int (*channels_forward)(int, const void*, void*, const void*, int, const void*, int,
                                void*, int, void*, int, void*, void*, Py_ssize_t, Py_ssize_t,
                                Py_ssize_t, int, double, double) noexcept nogil
        int (*channels_backward)(int, const void*, const void*, void*, const void*, int,
                                 const void*, int, const void*, int, void*, int, void*, int,
                                 Py_ssize_t, Py_ssize_t, Py_ssize_t, int, double) noexcept nogil
        int (*groups_forward)(int, const void*, void*, const void*, int, const void*, int, void*,
                              void*, Py_ssize_t, Py_ssize_t, Py_ssize_t, Py_ssize_t, double,
                              int) noexcept nogil
        int (*groups_backward)(int, const void*, const void*, void*, const void*, const void*,
                               const void*, int, void*, int, void*, int, Py_ssize_t, Py_ssize_t,
                               Py_ssize_t, Py_ssize_t, int, int) noexcept nogil


cdef int native_channels_forward(int storage, const void* x, void* y, const void* w, int w_st,
                                 const void* b, int b_st, void* rm, int rm_st, void* rv,
                                 int rv_st, void* save_mean, void* save_invstd, Py_ssize_t A,
                                 Py_ssize_t C, Py_ssize_t B, int train, double mom,
                                 double e) noexcept nogil:
    # forward_any at the process's thread count
    return forward_any(storage, x, y, w, w_st, b, b_st, rm, rm_st, rv, rv_st, save_mean,
                       save_invstd, A, C, B, train != 0, mom, e, max_threads())


cdef int native_channels_backward(int storage, const void* dy, const void* x, void* gx,
                                  const void* w, int w_st, const void* first, int first_st,
                                  const void* second, int second_st, void* gw, int gw_st,
                                  void* gb, int gb_st, Py_ssize_t A, Py_ssize_t C, Py_ssize_t B,
                                  int train, double e) noexcept nogil:
    return backward_params(storage, dy, x, gx, w, w_st, first, first_st, second, second_st,
                           gw, gw_st, gb, gb_st, A, C, B, train != 0, e)


cdef int native_groups_forward(int storage, const void* x, void* y, const void* w, int w_st,
                               const void* b, int b_st, void* mean, void* rstd, Py_ssize_t N,
                               Py_ssize_t C, Py_ssize_t HW, Py_ssize_t G, double eps,
                               int last) noexcept nogil:
    return groups_forward(storage, x, y, w, w_st, b, b_st, mean, rstd, N, C, HW, G, eps,
                          last != 0)


cdef int native_groups_backward(int storage, const void* dy, const void* x, void* gx,
                                const void* mean, const void* rstd, const void* w, int w_st,
                                void* gw, int gw_st, void* gb, int gb_st, Py_ssize_t N,
                                Py_ssize_t C, Py_ssize_t HW, Py_ssize_t G, int last,
                                int fixed) noexcept nogil:
    return groups_backward(storage, dy, x, gx, mean, rstd, w, w_st, gw, gw_st, gb, gb_st, N, C,
                           HW, G, last != 0, fixed != 0)


cdef cn_native_channels_abi NATIVE_ABI
NATIVE_ABI.version = CN_NATIVE_ABI_VERSION
NATIVE_ABI.channels_forward = native_channels_forward
NATIVE_ABI.channels_backward = native_channels_backward
NATIVE_ABI.groups_forward = native_groups_forward
NATIVE_ABI.groups_backward = native_groups_backward


def native_abi():
    """The address of this module's cn_native_channels_abi table
    (cn_native_abi.h), as an int: what cynorm's compiled PyTorch operators
    call."""
    return <size_t>&NATIVE_ABI
