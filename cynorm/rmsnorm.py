"""RMS normalization (Zhang and Sennrich, 2019) on NumPy arrays, with
PyTorch's semantics (torch.nn.functional.rms_norm; the saved rstd as
torch._fused_rms_norm returns it).

Every slice over the trailing axes named by ``normalized_shape`` is divided
by its root mean square, then scaled by ``weight``:

    y = x * rstd * weight,   rstd = 1 / sqrt(mean(x**2) + eps)

It is layer normalization without the centering, and runs layer norm's
kernels (cynorm/_kernels/layer_norm.pyx.tp) with no mean.  Conventions as in
cynorm.layernorm:

* x may have any strides and is never modified; outputs are C-contiguous (an
  F-contiguous ``out=`` y is filled by one copy).
* dtypes: float64, float32, bfloat16 (ml_dtypes), float16.  weight has x's
  dtype, or float32 when x is 16-bit; 16-bit data is computed in float32 and
  y rounded once.  rstd is float32 for float32 and 16-bit x, float64 for
  float64 x.
* eps=None uses the machine epsilon of the math type, as PyTorch does:
  float32's (1.19e-07) for float32 and 16-bit x, float64's for float64 x.
* The mean square is a float64 sum (float32 squares four at a time, float64
  squares where float32's would overflow or underflow); results are bitwise
  identical at any thread count.
* A normalized size of 0 gives an empty y and rstd NaN, as in PyTorch.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from cynorm._arrays import (
    c_aligned, check_big_out, check_distinct, kernel_flat as _flat, small_out, unalias,
)
from cynorm._dtypes import from_float64
from cynorm._kernels._alloc import empty as _empty
from cynorm._kernels._runtime import get_num_threads as _threads
from cynorm._typing import Array, ArrayLike, OutArrays, Real
from cynorm._validation import as_float_array, check_eps, check_mask, check_same, split_out
from cynorm.layernorm import _rows, _stat
from cynorm import _kernels
_k = _kernels.load("layer_norm")  # layer norm's kernels: with no mean they are RMS norm's

__all__ = ["rms_norm", "rms_norm_backward"]

# _kernel(name, policy): the entry point for policy's storage type
_kernel = _kernels.by_storage(_k, ("layer_norm_forward", "layer_norm_backward"))


def _eps(eps, policy):
    """eps as a float >= 0; None: the math type's machine epsilon."""
    if eps is None:
        return float(np.finfo(policy.math).eps)
    return check_eps(eps)


def rms_norm(x: ArrayLike, normalized_shape: int | Sequence[int],
             weight: ArrayLike | None = None, eps: Real | None = None, *,
             out: OutArrays = None) -> tuple[Array, Array]:
    """RMS normalization over the trailing axes (torch.nn.functional.rms_norm).

    y = x * rstd * weight, with rstd = 1 / sqrt(mean(x**2) + eps) over the
    trailing axes.

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
    eps : float, optional
        Added to the mean square; >= 0.  None (the default): the machine
        epsilon of the math type (float32's for float32 and 16-bit x,
        float64's for float64 x), as PyTorch.
    out : tuple of two (numpy.ndarray or None), optional
        ``(y, rstd)`` arrays (or None entries) to write into, of exact shape
        and dtype: y C- or F-contiguous (an F-contiguous y is filled from
        the C-ordered result, one extra copy), rstd C-contiguous.  y may be
        x itself.

    Returns
    -------
    y : numpy.ndarray
        x's shape and dtype.
    rstd : numpy.ndarray
        1 / sqrt(mean(x**2) + eps), shape ``x.shape[:axis] + (1,) * k``
        (axis = x.ndim - k); float64 for float64 x, float32 otherwise.

    Raises
    ------
    TypeError
        If an array has an unsupported dtype, normalized_shape is not an int
        or a tuple of ints, eps is not None or a real number, or out is not
        None or a tuple of two arrays/None of the outputs' dtypes.
    ValueError
        If normalized_shape does not match x's trailing axes, weight has
        another shape, eps < 0, or an output has the wrong shape, is not
        contiguous as described under out, is read-only, or overlaps another
        output.

    Examples
    --------
    >>> import numpy as np, cynorm
    >>> x = np.array([[3.0, 4.0], [1.0, -1.0]], np.float32)
    >>> y, rstd = cynorm.rms_norm(x, 2, eps=0.0)
    >>> y
    array([[ 0.8485281,  1.1313709],
           [ 1.       , -1.       ]], dtype=float32)
    """
    x, policy = as_float_array(x, "x")
    ns, (_, wvec), _, M, N, stat_shape = _rows(x, normalized_shape, weight, None, policy)
    eps = _eps(eps, policy)
    y_out, rstd_out = split_out(out, ("y", "rstd"))
    y_out = check_big_out(y_out, "out[0] (y)", x.shape, x.dtype)
    krstd, rstd = small_out(rstd_out, "out[1] (rstd)", stat_shape, policy.stat)
    outs = (y_out, rstd_out)
    check_distinct(zip(("out[0] (y)", "out[1] (rstd)"), outs))
    (x,) = unalias([x], outs, keep=y_out)
    (wvec,) = unalias([wvec], outs)
    kx = c_aligned(x)
    if y_out is not None and y_out.flags.c_contiguous:
        y = y_out
    else:   # the kernel writes C-ordered rows; an F-ordered out= takes a copy of them
        y = _empty(x.shape, x.dtype, x.size * x.dtype.itemsize)
    if N == 0:
        krstd[...] = np.nan
    elif M:
        _kernel("layer_norm_forward", policy)(_flat(kx), wvec, None, _flat(y), None,
                                              _flat(krstd), M, N, eps, _threads())
    if y_out is not None and y_out is not y:
        y_out[...] = y
        y = y_out
    return y, rstd


def rms_norm_backward(grad_out: ArrayLike, x: ArrayLike, normalized_shape: int | Sequence[int],
                      rstd: ArrayLike, weight: ArrayLike | None = None,
                      output_mask: Sequence[bool] = (True, True),
                      ) -> tuple[Array | None, Array | None]:
    """Gradients of rms_norm (torch._fused_rms_norm_backward's outputs).

    With xhat = x * rstd and g = grad_out * weight, per row::

        grad_x = rstd * (g - xhat * mean(g * xhat))
        grad_weight = sum over rows of grad_out * xhat

    Parameters
    ----------
    grad_out : array_like
        The gradient of y: x's shape and dtype.
    x : array_like
        The forward's input.
    normalized_shape : int or tuple of int
        As in the forward.
    rstd : array_like
        The rstd rms_norm returned (its shape, or 1-D).
    weight : array_like, optional
        The forward's weight (None: no scale).
    output_mask : sequence of two bool, default (True, True)
        Which of (grad_x, grad_weight) to compute; the other is returned as
        None.

    Returns
    -------
    grad_x : numpy.ndarray or None
        x's shape and dtype.
    grad_weight : numpy.ndarray or None
        Shape normalized_shape, weight's dtype (x's when weight is None).

    Raises
    ------
    TypeError
        If an array has an unsupported dtype, grad_out's dtype differs from
        x's, or output_mask does not hold booleans.
    ValueError
        If grad_out's shape differs from x's, normalized_shape does not
        match x, rstd or weight has the wrong shape, or output_mask has not
        two entries.
    """
    x, policy = as_float_array(x, "x")
    grad_out, _ = as_float_array(grad_out, "grad_out")
    check_same(grad_out, "grad_out", x.shape, x.dtype, ref="x")
    ns, (w, wvec), _, M, N, stat_shape = _rows(x, normalized_shape, weight, None, policy)
    mask = check_mask(output_mask, n=2)
    rvec = _stat(rstd, "rstd", stat_shape, M, policy, "rms_norm")
    kdy, kx = c_aligned(grad_out), c_aligned(x)
    gx = _empty(x.shape, x.dtype, x.size * x.dtype.itemsize) if mask[0] else None
    gw = np.zeros(N, np.float64) if mask[1] else None
    if M and N and any(mask):
        _kernel("layer_norm_backward", policy)(_flat(kdy), _flat(kx), None, rvec, wvec,
                                               _flat(gx), gw, None, M, N, _threads())
    grad_weight = None
    if gw is not None:
        with np.errstate(over="ignore"):      # float16 sums above 65504 become inf, as in torch
            grad_weight = from_float64(gw, w.dtype if w is not None else x.dtype).reshape(ns)
    return gx, grad_weight
