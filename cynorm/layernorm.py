"""Layer normalization (Ba et al., 2016) on NumPy arrays, with PyTorch's
semantics (native_layer_norm and native_layer_norm_backward).

Every slice over the trailing axes named by ``normalized_shape`` is
normalized to zero mean and unit variance (biased variance, as in PyTorch),
then scaled by ``weight`` and shifted by ``bias``:

    y = (x - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps)

Conventions:

* x may have any strides and is never modified; the kernels work on
  C-contiguous rows, so other layouts are copied once.  Outputs are
  C-contiguous; an F-contiguous ``out=`` y is filled by one copy.
* dtypes: float64, float32, bfloat16 (ml_dtypes), float16.  weight and bias
  have x's dtype, or float32 when x is 16-bit.  16-bit data is computed in
  float32.  mean and rstd are float32 for float32 and 16-bit x, float64 for
  float64 x.  (PyTorch's CPU kernel returns them in bfloat16 for bfloat16
  input; cynorm keeps statistics in float32 or wider.)
* Statistics are exact sums of shifted values accumulated in float64 (a row
  with mean 1e4 and unit spread keeps its variance), and y keeps the float64
  mean's precision (the stored mean, then the part its rounding dropped:
  float32 y within ~1e-6 of float64 for such a row).  Results are bitwise
  identical at any thread count.
* A normalized size of 0 gives an empty y, mean 0 and rstd NaN, as in PyTorch.
  A NaN or inf makes only its own row non-finite.
"""
from __future__ import annotations

import math
import operator
from typing import Sequence

import numpy as np

from cynorm._dtypes import POLICY, from_float64
from cynorm._arrays import (
    c_aligned, check_big_out, check_distinct, kernel_flat as _flat, same_array,
    small_out, unalias,
)
from cynorm import _kernels
_k = _kernels.load("layer_norm")  # the SIMD level chosen at import
from cynorm._kernels._alloc import empty as _empty
from cynorm._kernels._runtime import get_num_threads as _threads
from cynorm._typing import Array, ArrayLike, OutArrays, OutputMask, Real
from cynorm._validation import (
    as_float_array, check_dtype, check_eps, check_mask, check_same, split_out,
)

__all__ = ["add_layer_norm", "add_layer_norm_backward", "layer_norm", "layer_norm_backward"]

# _kernel(name, policy): the entry point for policy's storage type
_kernel = _kernels.by_storage(_k, ("layer_norm_forward", "layer_norm_backward",
                                   "layer_norm_backward_jvp"))


def _normalized_shape(normalized_shape, x, x_name="x"):
    """normalized_shape as a tuple matching x's trailing axes; returns (shape, axis)."""
    if isinstance(normalized_shape, (bool, np.bool_)):
        raise TypeError(f"normalized_shape must be an int or a tuple of ints, "
                        f"got {normalized_shape!r}")
    try:
        ns = (operator.index(normalized_shape),)
    except TypeError:
        try:
            if any(isinstance(s, (bool, np.bool_)) for s in normalized_shape):
                raise TypeError     # a bool is not a size, inside a tuple either
            ns = tuple(operator.index(s) for s in normalized_shape)
        except TypeError:
            raise TypeError(f"normalized_shape must be an int or a tuple of ints, "
                            f"got {normalized_shape!r}") from None
    k = len(ns)
    if k == 0:
        raise ValueError("normalized_shape must name at least one axis, got ()")
    if k > x.ndim or tuple(x.shape[x.ndim - k:]) != ns:
        raise ValueError(f"normalized_shape {ns} must match the trailing axes of {x_name}, "
                         f"whose shape is {x.shape}")
    return ns, x.ndim - k


def _affine(a, name, ns, policy):
    """weight or bias: None, or an array of shape normalized_shape; returns
    (array, flat contiguous math-type copy)."""
    if a is None:
        return None, None
    a, _ = as_float_array(a, name, untyped=policy.math)
    if a.shape != ns:
        raise ValueError(f"{name} must have shape {ns} (normalized_shape), got {a.shape}")
    check_dtype(a, name, policy.coefficients)
    return a, np.ascontiguousarray(a, dtype=policy.math).reshape(-1)


def _rows(x, normalized_shape, weight, bias, policy, x_name="x"):
    """What forward and backward both derive from their arguments:
    (normalized_shape, checked weight and bias with their math-type copies,
    M rows, N per row, the shape of mean/rstd)."""
    ns, axis = _normalized_shape(normalized_shape, x, x_name)
    w, wvec = _affine(weight, "weight", ns, policy)
    b, bvec = _affine(bias, "bias", ns, policy)
    M, N = math.prod(x.shape[:axis]), math.prod(ns)
    return ns, (w, wvec), (b, bvec), M, N, x.shape[:axis] + (1,) * len(ns)


def _stat(a, name, stat_shape, M, policy, op="layer_norm"):
    """A saved mean/rstd: stat_shape or (M,), any float dtype; returns the
    flat contiguous math-type vector."""
    a, _ = as_float_array(a, name)
    if a.shape != stat_shape and a.shape != (M,):
        raise ValueError(f"{name} must have shape {stat_shape} (as {op} returns it), "
                         f"got {a.shape}")
    return np.ascontiguousarray(a, dtype=policy.stat).reshape(-1)


def layer_norm(x: ArrayLike, normalized_shape: int | Sequence[int],
               weight: ArrayLike | None = None, bias: ArrayLike | None = None,
               eps: Real = 1e-5, *, out: OutArrays = None) -> tuple[Array, Array, Array]:
    """Layer normalization over the trailing axes (torch.native_layer_norm).

    y = (x - mean) * rstd * weight + bias, with mean and rstd =
    1 / sqrt(var + eps) over the trailing axes (biased variance).

    Parameters
    ----------
    x : array_like
        float64, float32, bfloat16 or float16; any strides, never modified
        (unless it is ``out[0]``).
    normalized_shape : int or tuple of int
        The trailing axes to normalize over; must equal ``x.shape[-k:]``.
    weight : array_like, optional
        Shape normalized_shape; x's dtype, or float32 for 16-bit x.
        None: no scale.
    bias : array_like, optional
        Shape normalized_shape; x's dtype, or float32 for 16-bit x.
        None: no shift.
    eps : float, default 1e-5
        Added to the variance; >= 0.
    out : tuple of three (numpy.ndarray or None), optional
        ``(y, mean, rstd)`` arrays (or None entries) to write into, of
        exact shape and dtype: y C- or F-contiguous (an F-contiguous y is
        filled from the C-ordered result, one extra copy), mean and rstd
        C-contiguous.  y may be x itself.

    Returns
    -------
    y : numpy.ndarray
        x's shape and dtype.
    mean : numpy.ndarray
        Shape ``x.shape[:axis] + (1,) * k``, where axis = x.ndim - k;
        float64 for float64 x, float32 otherwise.
    rstd : numpy.ndarray
        1 / sqrt(var + eps), mean's shape and dtype.

    Raises
    ------
    TypeError
        If an array has an unsupported dtype, normalized_shape is not an int
        or a tuple of ints, eps is not a real number, or out is not None or
        a tuple of three arrays/None of the outputs' dtypes.
    ValueError
        If normalized_shape does not match x's trailing axes, weight or bias
        has another shape, eps < 0, or an output has the wrong shape, is not
        contiguous as described under out, is read-only, or overlaps another
        output.
    """
    result = _k.forward_plain(x, normalized_shape, weight, bias, eps, out)
    if result is not None:
        return result
    return row_norm(x, None, normalized_shape, weight, bias, eps, out, True)


def residual_array(residual):
    """The fused norms' residual as an array (None is refused: it is required)."""
    return as_float_array(residual, "residual")[0]


# the outputs of each row norm, by (fused with a residual, centered): their
# names (split_out's) and the labels their errors give
_OUTPUTS = {(fused, centered): (("y",) + ("h",) * fused + ("mean",) * centered + ("rstd",))
            for fused in (False, True) for centered in (False, True)}
_LABELS = {k: tuple(f"out[{i}] ({n})" for i, n in enumerate(names)) for k, names in _OUTPUTS.items()}


def _big_out(out, x):
    # where the kernel writes an x-shaped output: out itself when C-ordered; an
    # F-ordered out= takes a copy of the C-ordered rows
    if out is not None and out.flags.c_contiguous:
        return out
    return _empty(x.shape, x.dtype, x.size * x.dtype.itemsize)


def _copied_back(out, written):
    if out is not None and out is not written:
        out[...] = written
        return out
    return written


def row_norm(x, residual, normalized_shape, weight, bias, eps, out, centered):
    """The Python path of every row norm: layer norm (centered) or RMS norm
    (not; bias None), of x or, with a residual (residual_array's), of
    h = x + residual.  Returns (y, [h,] [mean,] rstd); eps None (RMS norm
    only) is the math type's machine epsilon."""
    x, policy = as_float_array(x, "x")
    fused = residual is not None
    if fused:
        check_same(residual, "residual", x.shape, x.dtype, ref="x")
    ns, (_, wvec), (_, bvec), M, N, stat_shape = _rows(x, normalized_shape, weight, bias, policy)
    eps = float(np.finfo(policy.math).eps) if eps is None and not centered else check_eps(eps)
    labels = _LABELS[fused, centered]
    outs = split_out(out, _OUTPUTS[fused, centered])
    y_out = check_big_out(outs[0], labels[0], x.shape, x.dtype)
    h_out = check_big_out(outs[1], labels[1], x.shape, x.dtype) if fused else None
    if centered and (wvec is not None or bvec is not None):   # the kernel takes both or neither
        wvec = np.ones(N, policy.math) if wvec is None else wvec
        bvec = np.zeros(N, policy.math) if bvec is None else bvec
    kmean = mean = None
    if centered:
        kmean, mean = small_out(outs[-2], labels[-2], stat_shape, policy.stat)
    krstd, rstd = small_out(outs[-1], labels[-1], stat_shape, policy.stat)
    outs = (y_out,) + ((h_out,) if fused else ()) + tuple(outs[1 + fused:])
    check_distinct(zip(labels, outs))
    # y or h may be x or residual itself: each row is read before it is written
    (x,) = unalias([x], outs, keep=h_out if h_out is not None and same_array(x, h_out) else y_out)
    if fused:
        (residual,) = unalias([residual], outs, keep=h_out if h_out is not None
                              and same_array(residual, h_out) else y_out)
    wvec, bvec = unalias([wvec, bvec], outs)
    y = _big_out(y_out, x)
    h = _big_out(h_out, x) if fused else None
    if N == 0:
        if centered:
            kmean[...] = 0.0
        krstd[...] = np.nan
    elif M:
        extra = (_flat(c_aligned(residual)), _flat(h)) if fused else ()
        _kernel("layer_norm_forward", policy)(_flat(c_aligned(x)), wvec, bvec, _flat(y),
                                              None if kmean is None else _flat(kmean),
                                              _flat(krstd), M, N, eps, _threads(), *extra)
    y = _copied_back(y_out, y)
    stats = (mean, rstd) if centered else (rstd,)
    return (y, _copied_back(h_out, h)) + stats if fused else (y,) + stats


def layer_norm_backward(grad_out: ArrayLike, x: ArrayLike, normalized_shape: int | Sequence[int],
                        mean: ArrayLike, rstd: ArrayLike, weight: ArrayLike | None = None,
                        bias: ArrayLike | None = None, output_mask: OutputMask = (True, True, True),
                        ) -> tuple[Array | None, Array | None, Array | None]:
    """Gradients of layer_norm (torch.native_layer_norm_backward).

    With xhat = (x - mean) * rstd and g = grad_out * weight, per row::

        grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat))
        grad_weight = sum over rows of grad_out * xhat
        grad_bias = sum over rows of grad_out

    Parameters
    ----------
    grad_out : array_like
        The gradient of y: x's shape and dtype.
    x : array_like
        The forward's input.
    normalized_shape : int or tuple of int
        As in the forward.
    mean : array_like
        The mean layer_norm returned (its shape, or 1-D).
    rstd : array_like
        The rstd layer_norm returned (its shape, or 1-D).
    weight : array_like, optional
        The forward's weight (None: no scale).
    bias : array_like, optional
        The forward's bias; it only sets grad_bias's dtype.
    output_mask : sequence of three bool, default (True, True, True)
        Which of (grad_x, grad_weight, grad_bias) to compute; the others
        are returned as None.

    Returns
    -------
    grad_x : numpy.ndarray or None
        x's shape and dtype.
    grad_weight : numpy.ndarray or None
        Shape normalized_shape, weight's dtype (x's when weight is None).
    grad_bias : numpy.ndarray or None
        Shape normalized_shape, bias's dtype (x's when bias is None).

    Raises
    ------
    TypeError
        If an array has an unsupported dtype, grad_out's dtype differs from
        x's, or output_mask does not hold booleans.
    ValueError
        If grad_out's shape differs from x's, normalized_shape does not
        match x, a statistic or parameter has the wrong shape, or
        output_mask has not three entries.
    """
    result = _k.backward_plain(grad_out, x, normalized_shape, mean, rstd, weight, bias,
                               output_mask)
    if result is not None:
        return result
    return row_norm_backward(grad_out, None, x, normalized_shape, mean, rstd, weight, bias,
                             output_mask, "layer_norm")



def native_abi() -> int:
    """The address of the row norms' raw-buffer table (cn_native_abi.h) in
    the kernel module of the SIMD level in use: what cynorm.torch's
    compiled operators call."""
    return _k.native_abi()


def row_norm_backward(grad_out, grad_h, x, normalized_shape, mean, rstd, weight, bias,
                      output_mask, op, centered=True, x_name="x"):
    """The Python path of every row norm's backward: layer norm's (centered)
    or RMS norm's (not: mean and bias None, two mask entries), with grad_h
    (None: none) added to grad_x; op names the forward and x_name the input
    (the fused norms' h) in messages.  Returns (grad_x, grad_weight[, grad_bias])."""
    x, policy = as_float_array(x, x_name)
    grad_out, _ = as_float_array(grad_out, "grad_out")
    check_same(grad_out, "grad_out", x.shape, x.dtype, ref=x_name)
    if grad_h is not None:
        grad_h, _ = as_float_array(grad_h, "grad_h")
        check_same(grad_h, "grad_h", x.shape, x.dtype, ref="h")
    ns, (w, wvec), (b, _), M, N, stat_shape = _rows(x, normalized_shape, weight, bias, policy,
                                                    x_name)
    mask = check_mask(output_mask, n=3 if centered else 2)
    mvec = _stat(mean, "mean", stat_shape, M, policy, op) if centered else None
    rvec = _stat(rstd, "rstd", stat_shape, M, policy, op)
    kdy, kx = c_aligned(grad_out), c_aligned(x)
    gx = _empty(x.shape, x.dtype, x.size * x.dtype.itemsize) if mask[0] else None
    gw = np.zeros(N, np.float64) if mask[1] else None
    gb = np.zeros(N, np.float64) if centered and mask[2] else None
    if M and N and any(mask):
        extra = () if grad_h is None or gx is None else (_flat(c_aligned(grad_h)),)
        _kernel("layer_norm_backward", policy)(_flat(kdy), _flat(kx), mvec, rvec, wvec,
                                               _flat(gx), gw, gb, M, N, _threads(), *extra)
    elif gx is not None and grad_h is not None:     # an empty row: grad_x is grad_h alone
        gx[...] = grad_h
    grad_weight = grad_bias = None
    with np.errstate(over="ignore"):      # float16 sums above 65504 become inf, as in torch
        if gw is not None:
            dt = w.dtype if w is not None else x.dtype
            grad_weight = from_float64(gw, dt).reshape(ns)
        if gb is not None:
            dt = b.dtype if b is not None else x.dtype
            grad_bias = from_float64(gb, dt).reshape(ns)
    return (gx, grad_weight, grad_bias) if centered else (gx, grad_weight)


def add_layer_norm(x: ArrayLike, residual: ArrayLike, normalized_shape: int | Sequence[int],
                   weight: ArrayLike | None = None, bias: ArrayLike | None = None,
                   eps: Real = 1e-5, *, out: OutArrays = None
                   ) -> tuple[Array, Array, Array, Array]:
    """The residual add fused into layer norm: h = x + residual, then
    layer_norm(h) (ONNX Runtime's SkipLayerNormalization, flash-attn's fused
    add + LayerNorm).

    One pass over x and residual: each row's h is written and normalized
    while it is in cache.  h is rounded to x's dtype first, as an unfused
    ``x + residual`` stores it, so y and the statistics are bit for bit
    layer_norm(h).

    Parameters
    ----------
    x, residual : array_like
        The same shape and dtype (float64, float32, bfloat16 or float16);
        any strides, never modified (unless one is an output).
    normalized_shape : int or tuple of int
        The trailing axes to normalize over; must equal ``x.shape[-k:]``.
    weight : array_like, optional
        Shape normalized_shape; x's dtype, or float32 for 16-bit x.
        None: no scale.
    bias : array_like, optional
        Shape normalized_shape; x's dtype, or float32 for 16-bit x.
        None: no shift.
    eps : float, default 1e-5
        Added to the variance; >= 0.
    out : tuple of four (numpy.ndarray or None), optional
        ``(y, h, mean, rstd)`` arrays (or None entries) to write into, as in
        layer_norm (C- or F-contiguous); y and h may be x or residual itself
        where that is contiguous (h into residual is the in-place form of
        fused add + norm).

    Returns
    -------
    y : numpy.ndarray
        layer_norm(h): x's shape and dtype.
    h : numpy.ndarray
        x + residual, x's shape and dtype.
    mean, rstd : numpy.ndarray
        As layer_norm returns them for h.

    Raises
    ------
    TypeError, ValueError
        As layer_norm; also if residual's shape or dtype differs from x's.

    Examples
    --------
    >>> import numpy as np, cynorm
    >>> x, r = np.array([[1., 2., 3.]], np.float32), np.array([[1., 1., 1.]], np.float32)
    >>> y, h, mean, rstd = cynorm.add_layer_norm(x, r, 3)
    >>> y.round(3), h
    (array([[-1.225,  0.   ,  1.225]], dtype=float32), array([[2., 3., 4.]], dtype=float32))
    """
    if residual is not None:
        result = _k.rows_plain(x, residual, normalized_shape, weight, bias, eps, out, True)
        if result is not None:
            return result
    return row_norm(x, residual_array(residual), normalized_shape, weight, bias, eps, out, True)


def add_layer_norm_backward(grad_out: ArrayLike, grad_h: ArrayLike | None, h: ArrayLike,
                            normalized_shape: int | Sequence[int], mean: ArrayLike,
                            rstd: ArrayLike, weight: ArrayLike | None = None,
                            bias: ArrayLike | None = None,
                            output_mask: OutputMask = (True, True, True),
                            ) -> tuple[Array | None, Array | None, Array | None]:
    """Gradients of add_layer_norm, from the gradients of both its y and h.

    grad_input = layer_norm_backward's grad_x at h, plus grad_h: the
    gradient of x and of residual alike (h = x + residual), added while the
    row is in cache.

    Parameters
    ----------
    grad_out : array_like
        The gradient of y: h's shape and dtype.
    grad_h : array_like or None
        The gradient of h (h's shape and dtype), or None where h is not used
        further.
    h : array_like
        The h add_layer_norm returned.
    normalized_shape : int or tuple of int
        As in the forward.
    mean : array_like
        The mean add_layer_norm returned (its shape, or 1-D).
    rstd : array_like
        The rstd add_layer_norm returned (its shape, or 1-D).
    weight : array_like, optional
        The forward's weight (None: no scale).
    bias : array_like, optional
        The forward's bias; it only sets grad_bias's dtype.
    output_mask : sequence of three bool, default (True, True, True)
        Which of (grad_input, grad_weight, grad_bias) to compute; the others
        are returned as None.

    Returns
    -------
    grad_input : numpy.ndarray or None
        The gradient of x and of residual: h's shape and dtype.
    grad_weight, grad_bias : numpy.ndarray or None
        As layer_norm_backward returns them.

    Raises
    ------
    TypeError, ValueError
        As layer_norm_backward; also if grad_h's shape or dtype differs from
        h's.
    """
    result = _k.row_grads_plain(grad_out, grad_h, h, normalized_shape, mean, rstd, weight, bias,
                                output_mask, True)
    if result is not None:
        return result
    return row_norm_backward(grad_out, grad_h, h, normalized_shape, mean, rstd, weight, bias,
                             output_mask, "add_layer_norm", x_name="h")


def backward_jvp_kernel(dy, x, rstd, w, t_dy, t_x, t_w, t_gx, t_gw, t_gb, M, N):
    """The fused kernel of layer_norm_backward's JVP (forward_ad's rule):
    writes the tangents t_gx (x's dtype), t_gw and t_gb (float64, length N),
    each skipped when None.  Every array is C-contiguous float32 or float64,
    of x's dtype: dy, x, t_dy, t_x and t_gx M * N elements, rstd M, w and
    t_w N; optional ones may be None."""
    policy = POLICY[x.dtype]
    _kernel("layer_norm_backward_jvp", policy)(
        _flat(dy), _flat(x), _flat(rstd), _flat(w), _flat(t_dy), _flat(t_x), _flat(t_w),
        _flat(t_gx), t_gw, t_gb, M, N, _threads())
