# Included by layer_norm.pyx.
# The row norms' plain-case entries (forward_plain, backward_plain for layer
# norm; rows_plain, row_grads_plain for RMS norm and the residual-fused
# forms): arguments _plain.pyx recognizes as already in the kernels' form go
# straight to rows_forward / rows_backward (layer_norm.pyx.tp); anything else returns
# None, and the Python layer (cynorm/layernorm.py: row_norm, row_norm_backward)
# takes the call.

cdef void rows_of(cnp.ndarray x, int k, Py_ssize_t* M, Py_ssize_t* N,
                  cnp.npy_intp* stat_dims) noexcept:
    # x as M rows of N (its last k axes), and the shape of mean/rstd
    cdef int nd = cnp.PyArray_NDIM(x), i
    cdef cnp.npy_intp* dims = cnp.PyArray_DIMS(x)
    M[0] = N[0] = 1
    for i in range(nd):
        if i < nd - k:
            M[0] *= dims[i]
            stat_dims[i] = dims[i]
        else:
            N[0] *= dims[i]
            stat_dims[i] = 1


def forward_plain(x, normalized_shape, weight, bias, eps, out=None):
    """layer_norm(x, normalized_shape, weight, bias, eps, out=out) when the
    arguments are plain (_plain.pyx; out= arrays overlapping nothing) and no
    row is empty: (y, mean, rstd); otherwise None, and the Python layer takes
    the call."""
    if not plain_eps(eps):
        return None
    return plain_rows(x, None, normalized_shape, weight, bias, eps, out, True)


def rows_plain(x, residual, normalized_shape, weight, bias, eps, out, bint centered):
    """rms_norm (not centered, residual and bias None), add_layer_norm
    (centered) or add_rms_norm in the plain case, as forward_plain: their
    results, or None.  eps None (RMS norm): the math type's epsilon."""
    cdef int storage = storage_of(x)
    if eps is None and not centered and storage != NOT_PLAIN:
        eps = DBL_EPSILON if math_storage(storage) == STORAGE_F64 else <double>FLT_EPSILON
    if not plain_eps(eps):
        return None
    return plain_rows(x, residual, normalized_shape, weight, bias, eps, out, centered)


cdef object plain_rows(object x, object residual, object normalized_shape, object weight,
                       object bias, double eps, object out, bint centered):
    # the plain case of the row norms: layer norm (centered) or RMS norm, of
    # x or (residual not None) of h = x + residual
    cdef int storage = storage_of(x)
    cdef bint fused = residual is not None
    if storage == NOT_PLAIN or not plain_out_form(out, 2 + centered + fused):
        return None
    cdef cnp.ndarray ax = <cnp.ndarray>x
    cdef int k = trailing_axes(ax, normalized_shape)
    if k == 0:
        return None
    cdef int nd = cnp.PyArray_NDIM(ax)
    cdef cnp.npy_intp* dims = cnp.PyArray_DIMS(ax)
    cdef int stat = math_storage(storage)
    if not (plain_param(weight, storage, k, dims + nd - k)
            and plain_param(bias, storage, k, dims + nd - k)):
        return None
    cdef Py_ssize_t M, N
    cdef cnp.npy_intp stat_dims[cnp.NPY_MAXDIMS]
    rows_of(ax, k, &M, &N, stat_dims)
    if M == 0 or N == 0 or (fused and not plain_with_shape(residual, storage, nd, dims)):
        return None
    y = out_entry(out, 0)
    h = out_entry(out, 1) if fused else None
    mean = out_entry(out, 1 + fused) if centered else None
    rstd = out_entry(out, 1 + fused + centered)
    if out is not None and not (plain_out(y, storage, nd, dims) and plain_out(h, storage, nd, dims)
                                and plain_out(mean, stat, nd, stat_dims)
                                and plain_out(rstd, stat, nd, stat_dims)
                                and written_apart((y, h, mean, rstd), (x, residual, weight, bias))):
        return None
    if y is None:
        y = new_array(nd, dims, typenum(storage), M * N * itemsize(storage))
    if h is None and fused:
        h = new_array(nd, dims, typenum(storage), M * N * itemsize(storage))
    if mean is None and centered:
        mean = new_array(nd, stat_dims, typenum(stat), 0)
    if rstd is None:
        rstd = new_array(nd, stat_dims, typenum(stat), 0)
    cdef void* pres = data(residual)
    cdef void* ph = data(h)
    cdef void* px = data(x)
    cdef void* pw = data(weight)
    cdef void* pb = data(bias)
    cdef int w_st = param_storage(weight, storage), b_st = param_storage(bias, storage)
    cdef void* py = data(y)
    cdef void* pm = data(mean) if centered else NULL
    cdef void* pr = data(rstd)
    cdef int rc
    with nogil:
        rc = rows_forward_params(storage, px, pres, pw, w_st, pb, b_st, py, ph, pm, pr, M, N,
                                 eps, centered)
    if rc != 0:
        raise MemoryError(("layer_norm" if centered else "rms_norm")
                          + ": could not allocate the parameters' math-type copies")
    if fused:
        return (y, h, mean, rstd) if centered else (y, h, rstd)
    return (y, mean, rstd) if centered else (y, rstd)


def backward_plain(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    """layer_norm_backward(...) when the arguments are plain (_plain.pyx;
    grad_out's rows may also lie in another order, each contiguous: read in
    place) and no row is empty: (grad_x, grad_weight, grad_bias); otherwise
    None, and the Python layer takes the call."""
    mask = plain_mask(output_mask, 3)
    if mask is None:
        return None
    return plain_row_grads(grad_out, None, x, normalized_shape, mean, rstd, weight, bias, mask,
                           True)


def row_grads_plain(grad_out, grad_h, x, normalized_shape, mean, rstd, weight, bias, output_mask,
                    bint centered):
    """rms_norm_backward (not centered; grad_h, mean and bias None),
    add_layer_norm_backward (centered) or add_rms_norm_backward in the plain
    case, as backward_plain: their results, or None."""
    mask = plain_mask(output_mask, 3 if centered else 2)
    if mask is None:
        return None
    if not centered:
        mask = <tuple>mask + (False,)
    return plain_row_grads(grad_out, grad_h, x, normalized_shape, mean, rstd, weight, bias, mask,
                           centered)


cdef object plain_row_grads(object grad_out, object grad_h, object x, object normalized_shape,
                            object mean, object rstd, object weight, object bias, tuple mask,
                            bint centered):
    # the plain case of the row norms' backward: layer norm's (centered) or
    # RMS norm's (mean None, mask[2] False), grad_h (None: none) added to grad_x
    cdef int storage = storage_of(x)
    if storage == NOT_PLAIN:
        return None
    cdef cnp.ndarray ax = <cnp.ndarray>x
    cdef int nd = cnp.PyArray_NDIM(ax)
    cdef cnp.npy_intp* dims = cnp.PyArray_DIMS(ax)
    cdef int k = trailing_axes(ax, normalized_shape)
    cdef int stat = math_storage(storage)
    # grad_out's rows read where they lie: in C order, or in another (a
    # batch_first attention's transposed gradient: dyr)
    if k == 0 or not plain_rows_with_shape(grad_out, storage, nd, dims, k):
        return None
    cdef bint dy_in_order = cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>grad_out)
    if grad_h is not None and not plain_with_shape(grad_h, storage, nd, dims):
        return None
    cdef cnp.npy_intp* ns = dims + nd - k
    if not (plain_param(weight, storage, k, ns) and plain_param(bias, storage, k, ns)):
        return None
    cdef Py_ssize_t M, N
    cdef cnp.npy_intp stat_dims[cnp.NPY_MAXDIMS]
    rows_of(ax, k, &M, &N, stat_dims)
    if M == 0 or N == 0:
        return None
    cdef cnp.npy_intp m_dims[1]
    m_dims[0] = M
    for a in ((mean, rstd) if centered else (rstd,)):
        if not (plain_with_shape(a, stat, nd, stat_dims) or plain_with_shape(a, stat, 1, m_dims)):
            return None
    gx = new_array(nd, dims, typenum(storage), M * N * itemsize(storage)) if mask[0] else None
    # each parameter gradient in its parameter's dtype (x's for a missing one)
    cdef int gw_st = storage if weight is None else storage_of(weight)
    cdef int gb_st = storage if bias is None else storage_of(bias)
    grad_weight = cnp.PyArray_EMPTY(k, ns, typenum(gw_st), 0) if mask[1] else None
    grad_bias = cnp.PyArray_EMPTY(k, ns, typenum(gb_st), 0) if mask[2] else None
    op = "layer_norm_backward" if centered else "rms_norm_backward"
    # dy's row offsets
    cdef Py_ssize_t* dyr = NULL if dy_in_order else <Py_ssize_t*>malloc(M * sizeof(Py_ssize_t))
    if not dy_in_order and dyr == NULL:
        raise MemoryError(op + ": could not allocate its workspace")
    if dyr != NULL:
        row_offsets(grad_out, k, dyr)
    cdef void* pdy = data(grad_out)
    cdef void* px = data(x)
    cdef void* pm = data(mean)
    cdef void* pr = data(rstd)
    cdef void* pw = data(weight)
    cdef int w_st = param_storage(weight, storage)
    cdef void* pgx = data(gx)
    cdef void* pgw = data(grad_weight)
    cdef void* pgb = data(grad_bias)
    cdef void* pdh = data(grad_h)
    cdef int status
    with nogil:
        status = rows_backward_params(storage, pdy, dyr, pdh, px, pm, pr, pw, w_st, pgx, pgw,
                                      gw_st, pgb, gb_st, M, N)
    free(dyr)
    if status < 0:
        raise MemoryError(op + ": could not allocate its workspace")
    return (gx, grad_weight, grad_bias) if centered else (gx, grad_weight)
