# Included by batch_norm.pyx.
# Group norm's and instance norm's plain-case entries: arguments _plain.pyx
# recognizes as already in the kernels' form (x C-ordered in either channel
# order, or a torch channels_last tensor's NumPy view; parameters of the
# policy's dtypes; no out=, no running statistics) go straight to
# group_forward_any / group_backward_any (group_norm.pxi.tp); anything else returns None, and
# the Python layer (cynorm/groupnorm.py) takes the call.

cdef bint gn_layout(object x, object axis, Py_ssize_t* sizes, bint* last, bint* moved,
                    int* axis_of) noexcept:
    # x (an aligned ndarray) as the kernels read it: sizes = (N, C, HW),
    # last (channels last in memory), moved (the memory's channel order is
    # not the axis's: the result is a transposed view), axis_of (the axis,
    # wrapped); False when x is in neither order, or axis is not an int
    # naming the second or the last
    cdef cnp.ndarray a = <cnp.ndarray>x
    cdef int nd = cnp.PyArray_NDIM(a), i, ax
    cdef cnp.npy_intp* dims = cnp.PyArray_DIMS(a)
    cdef cnp.npy_intp* st = cnp.PyArray_STRIDES(a)
    cdef Py_ssize_t isz = cnp.PyArray_ITEMSIZE(a), step
    if nd < 2 or type(axis) is not int or not -nd <= axis < nd:
        return False
    ax = <int>(<long>axis)
    if ax < 0:
        ax += nd
    axis_of[0] = ax
    if ax != 1 and ax != nd - 1:
        return False
    sizes[0] = dims[0]
    sizes[1] = dims[ax]
    sizes[2] = 1
    for i in range(1, nd):
        if i != ax:
            sizes[2] *= dims[i]
    if sizes[0] * sizes[1] * sizes[2] == 0:
        return False
    moved[0] = False
    if cnp.PyArray_IS_C_CONTIGUOUS(a):
        last[0] = ax == nd - 1
        return True
    if nd == 2:
        return False
    # the other channel order in C order: (N, *spatial, C) memory with the
    # channels on axis 1 (a torch channels_last tensor), or (N, C, *spatial)
    # memory with the channels last
    step = isz
    if ax == 1:
        if st[1] != step:
            return False
        step *= dims[1]
        for i in range(nd - 1, 1, -1):
            if dims[i] != 1 and st[i] != step:
                return False
            step *= dims[i]
    else:
        for i in range(nd - 2, 0, -1):
            if dims[i] != 1 and st[i] != step:
                return False
            step *= dims[i]
        if dims[nd - 1] != 1 and st[nd - 1] != step:
            return False
        step *= dims[nd - 1]
    if dims[0] != 1 and st[0] != step:
        return False
    last[0] = ax == 1
    moved[0] = True
    return True


cdef object gn_out_like(object x, bint moved, int ax):
    # a new array for y or grad_x: x's shape (channels on axis ax), in the
    # memory order x is read in
    cdef cnp.ndarray a = <cnp.ndarray>x
    cdef int nd = cnp.PyArray_NDIM(a), i
    cdef cnp.npy_intp* dims = cnp.PyArray_DIMS(a)
    cdef cnp.npy_intp mdims[cnp.NPY_MAXDIMS]
    cdef cnp.npy_intp perm[cnp.NPY_MAXDIMS]
    cdef cnp.PyArray_Dims order
    cdef int storage = storage_of_any_layout(x)
    if not moved:
        return new_array(nd, dims, typenum(storage), cnp.PyArray_NBYTES(a))
    # the memory's shape, then the view with x's axes: channels on axis 1
    # stored last, or the other way round
    mdims[0] = dims[0]
    perm[0] = 0
    if ax == 1:         # memory (N, *spatial, C)
        for i in range(2, nd):
            mdims[i - 1] = dims[i]
        mdims[nd - 1] = dims[1]
        perm[1] = nd - 1
        for i in range(2, nd):
            perm[i] = i - 1
    else:               # memory (N, C, *spatial)
        mdims[1] = dims[nd - 1]
        for i in range(1, nd - 1):
            mdims[i + 1] = dims[i]
        for i in range(1, nd - 1):
            perm[i] = i + 1
        perm[nd - 1] = 1
    mem = new_array(nd, mdims, typenum(storage), cnp.PyArray_NBYTES(a))
    order.ptr = perm
    order.len = nd
    return cnp.PyArray_Transpose(<cnp.ndarray>mem, &order)


cdef object plain_group_forward(object x, Py_ssize_t G, object weight, object bias, double eps,
                                object axis, object out, str op):
    # group_norm / instance_norm (G = C) in the plain case: (y, mean, rstd) or None
    cdef int storage = storage_of_any_layout(x)
    cdef Py_ssize_t sizes[3]
    cdef bint last, moved
    cdef int ax
    if (storage == NOT_PLAIN or not plain_out_form(out, 3)
            or not gn_layout(x, axis, sizes, &last, &moved, &ax)):
        return None
    cdef Py_ssize_t N = sizes[0], C = sizes[1], HW = sizes[2]
    if G == 0:
        G = C
    if G < 1 or C % G:
        return None
    cdef int nd = cnp.PyArray_NDIM(<cnp.ndarray>x)
    cdef cnp.npy_intp s_dims[2]
    s_dims[0] = N
    s_dims[1] = G
    cdef int stat = math_storage(storage)
    cdef cnp.npy_intp c_dims[1]
    c_dims[0] = C
    if not (plain_param(weight, storage, 1, c_dims) and plain_param(bias, storage, 1, c_dims)):
        return None         # (before written_apart, which takes plain arrays only)
    # out= entries: y C-ordered as x is (x itself is left to the Python
    # layer), mean and rstd (N, G) of the statistics' dtype, apart from the inputs
    y, mean, rstd = (out_entry(out, 0), out_entry(out, 1), out_entry(out, 2))
    if out is not None and not (
            (y is None or not moved) and plain_out(y, storage, nd, cnp.PyArray_DIMS(<cnp.ndarray>x))
            and plain_out(mean, stat, 2, s_dims) and plain_out(rstd, stat, 2, s_dims)
            and written_apart((y, mean, rstd), (x, weight, bias))):
        return None
    if y is None:
        y = gn_out_like(x, moved, ax)
    if mean is None:
        mean = new_array(2, s_dims, typenum(stat), 0)
    if rstd is None:
        rstd = new_array(2, s_dims, typenum(stat), 0)
    cdef void* px = data(x)
    cdef void* py = data(y)
    cdef void* pw = data(weight)
    cdef void* pb = data(bias)
    cdef void* pm = data(mean)
    cdef void* pr = data(rstd)
    cdef int w_st = param_storage(weight, storage), b_st = param_storage(bias, storage), rc
    with nogil:
        rc = groups_forward(storage, px, py, pw, w_st, pb, b_st, pm, pr, N, C, HW, G, eps, last)
    if rc != 0:
        raise MemoryError(op + ": could not allocate its workspace")
    return y, mean, rstd


def group_forward_plain(x, num_groups, weight, bias, eps, axis, out=None):
    """group_norm(x, num_groups, weight, bias, eps, axis, out=out) when the
    arguments are plain: (y, mean, rstd); otherwise None, and the Python
    layer takes the call."""
    if type(num_groups) is not int or not plain_eps(eps) or not 1 <= num_groups < (1 << 62):
        return None
    return plain_group_forward(x, num_groups, weight, bias, eps, axis, out, "group_norm")


def instance_forward_plain(x, weight, bias, eps, axis, out=None):
    """instance_norm(x, weight, bias, eps=eps, axis=axis, out=out) with its
    own statistics and no running ones, when the arguments are plain: (y,
    mean, rstd); otherwise None."""
    if not plain_eps(eps):
        return None
    return plain_group_forward(x, 0, weight, bias, eps, axis, out, "instance_norm")


cdef object plain_group_backward(object grad_out, object x, object mean, object rstd,
                                 object weight, Py_ssize_t G, object output_mask, object axis,
                                 bint fixed, str op):
    # group_norm_backward / instance_norm_backward (G = 0: C) in the plain
    # case: (grad_x, grad_weight, grad_bias) or None
    cdef int storage = storage_of_any_layout(x)
    cdef Py_ssize_t sizes[3]
    cdef Py_ssize_t sizes_dy[3]
    cdef bint last, moved, last_dy, moved_dy
    cdef int ax
    if (storage == NOT_PLAIN or storage_of_any_layout(grad_out) != storage
            or not gn_layout(x, axis, sizes, &last, &moved, &ax)
            or not gn_layout(grad_out, axis, sizes_dy, &last_dy, &moved_dy, &ax)
            or last_dy != last or moved_dy != moved
            or cnp.PyArray_NDIM(<cnp.ndarray>grad_out) != cnp.PyArray_NDIM(<cnp.ndarray>x)):
        return None
    cdef int nd = cnp.PyArray_NDIM(<cnp.ndarray>x), i
    for i in range(nd):
        if cnp.PyArray_DIMS(<cnp.ndarray>grad_out)[i] != cnp.PyArray_DIMS(<cnp.ndarray>x)[i]:
            return None
    cdef Py_ssize_t N = sizes[0], C = sizes[1], HW = sizes[2]
    if G == 0:
        G = C
    if G < 1 or C % G:
        return None
    cdef int stat = math_storage(storage)
    cdef cnp.npy_intp s_dims[2]
    cdef cnp.npy_intp f_dims[1]
    s_dims[0] = N
    s_dims[1] = G
    f_dims[0] = N * G
    for a in (mean, rstd):
        if not (plain_with_shape(a, stat, 2, s_dims) or plain_with_shape(a, stat, 1, f_dims)):
            return None
    mask = plain_mask(output_mask, 3)
    if mask is None:
        return None
    cdef cnp.npy_intp c_dims[1]
    c_dims[0] = C
    if not plain_param(weight, storage, 1, c_dims):
        return None
    gx = gn_out_like(x, moved, ax) if mask[0] else None
    # each in the weight's dtype (x's for a missing one)
    cdef int pdt = storage if weight is None else kernel_storage(weight)
    grad_weight = new_array(1, c_dims, typenum(pdt), 0) if mask[1] else None
    grad_bias = new_array(1, c_dims, typenum(pdt), 0) if mask[2] else None
    cdef void* pdy = data(grad_out)
    cdef void* px = data(x)
    cdef void* pgx = data(gx)
    cdef void* pm = data(mean)
    cdef void* pr = data(rstd)
    cdef void* pw = data(weight)
    cdef void* pgw = data(grad_weight)
    cdef void* pgb = data(grad_bias)
    cdef int w_st = param_storage(weight, storage), rc
    with nogil:
        rc = groups_backward(storage, pdy, px, pgx, pm, pr, pw, w_st, pgw, pdt, pgb, pdt, N, C,
                             HW, G, last, fixed)
    if rc != 0:
        raise MemoryError(op + ": could not allocate its workspace")
    return gx, grad_weight, grad_bias


def group_backward_plain(grad_out, x, mean, rstd, weight, num_groups, output_mask, axis):
    """group_norm_backward(...) when the arguments are plain: its results,
    or None and the Python layer takes the call."""
    if type(num_groups) is not int or not 1 <= num_groups < (1 << 62):
        return None
    return plain_group_backward(grad_out, x, mean, rstd, weight, num_groups, output_mask, axis,
                                False, "group_norm_backward")


def instance_backward_plain(grad_out, x, mean, rstd, weight, use_input_stats, output_mask, axis):
    """instance_norm_backward(...) when the arguments are plain: its
    results, or None."""
    if type(use_input_stats) is not bool:
        return None
    return plain_group_backward(grad_out, x, mean, rstd, weight, 0, output_mask, axis,
                                not use_input_stats, "instance_norm_backward")
