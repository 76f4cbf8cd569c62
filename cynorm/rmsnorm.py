"""RMS normalization (Zhang and Sennrich, 2019) on NumPy arrays, with
PyTorch's semantics (torch.nn.functional.rms_norm; the saved rstd as
torch._fused_rms_norm returns it), and the residual add fused into it.

Every slice over the trailing axes named by ``normalized_shape`` is divided
by its root mean square, then scaled by ``weight``:

    y = x * rstd * weight,   rstd = 1 / sqrt(mean(x**2) + eps)

It is layer normalization without the centering: the ops here are
cynorm.layernorm's row norms with no mean, on the same kernels
(cynorm/_kernels/layer_norm.pyx.tp).  Conventions as in cynorm.layernorm:

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

from cynorm._typing import Array, ArrayLike, OutArrays, Real
from cynorm.layernorm import residual_array, row_norm, row_norm_backward
from cynorm import _kernels
_k = _kernels.load("layer_norm")  # the plain case's entries (rows_plain, row_grads_plain)

__all__ = ["add_rms_norm", "add_rms_norm_backward", "rms_norm", "rms_norm_backward"]


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
    array([[ 0.84852815,  1.1313709 ],
           [ 1.        , -1.        ]], dtype=float32)
    """
    result = _k.rows_plain(x, None, normalized_shape, weight, None, eps, out, False)
    if result is not None:
        return result
    return row_norm(x, None, normalized_shape, weight, None, eps, out, False)


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
    result = _k.row_grads_plain(grad_out, None, x, normalized_shape, None, rstd, weight, None,
                                output_mask, False)
    if result is not None:
        return result
    return row_norm_backward(grad_out, None, x, normalized_shape, None, rstd, weight, None,
                             output_mask, "rms_norm", centered=False)


def add_rms_norm(x: ArrayLike, residual: ArrayLike, normalized_shape: int | Sequence[int],
                 weight: ArrayLike | None = None, eps: Real | None = None, *,
                 out: OutArrays = None) -> tuple[Array, Array, Array]:
    """The residual add fused into RMS norm: h = x + residual, then
    rms_norm(h) (ONNX Runtime's SkipSimplifiedLayerNormalization,
    FlashInfer's and vLLM's fused_add_rmsnorm).

    One pass over x and residual: each row's h is written and normalized
    while it is in cache.  h is rounded to x's dtype first, as an unfused
    ``x + residual`` stores it, so y and rstd are bit for bit rms_norm(h).

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
    eps : float, optional
        Added to the mean square; >= 0.  None (the default): the machine
        epsilon of the math type, as in rms_norm.
    out : tuple of three (numpy.ndarray or None), optional
        ``(y, h, rstd)`` arrays (or None entries) to write into, as in
        rms_norm (C- or F-contiguous); y and h may be x or residual itself
        where that is contiguous (h into residual is FlashInfer's in-place
        form).

    Returns
    -------
    y : numpy.ndarray
        rms_norm(h): x's shape and dtype.
    h : numpy.ndarray
        x + residual, x's shape and dtype.
    rstd : numpy.ndarray
        As rms_norm returns it for h.

    Raises
    ------
    TypeError, ValueError
        As rms_norm; also if residual's shape or dtype differs from x's.

    Examples
    --------
    >>> import numpy as np, cynorm
    >>> x, r = np.array([[1., 2.]], np.float32), np.array([[2., 2.]], np.float32)
    >>> y, h, rstd = cynorm.add_rms_norm(x, r, 2, eps=0.0)
    >>> h
    array([[3., 4.]], dtype=float32)
    """
    if residual is not None:
        result = _k.rows_plain(x, residual, normalized_shape, weight, None, eps, out, False)
        if result is not None:
            return result
    return row_norm(x, residual_array(residual), normalized_shape, weight, None, eps, out, False)


def add_rms_norm_backward(grad_out: ArrayLike, grad_h: ArrayLike | None, h: ArrayLike,
                          normalized_shape: int | Sequence[int], rstd: ArrayLike,
                          weight: ArrayLike | None = None,
                          output_mask: Sequence[bool] = (True, True),
                          ) -> tuple[Array | None, Array | None]:
    """Gradients of add_rms_norm, from the gradients of both its y and h.

    grad_input = rms_norm_backward's grad_x at h, plus grad_h: the gradient
    of x and of residual alike (h = x + residual), added while the row is in
    cache.

    Parameters
    ----------
    grad_out : array_like
        The gradient of y: h's shape and dtype.
    grad_h : array_like or None
        The gradient of h (h's shape and dtype), or None where h is not used
        further.
    h : array_like
        The h add_rms_norm returned.
    normalized_shape : int or tuple of int
        As in the forward.
    rstd : array_like
        The rstd add_rms_norm returned (its shape, or 1-D).
    weight : array_like, optional
        The forward's weight (None: no scale).
    output_mask : sequence of two bool, default (True, True)
        Which of (grad_input, grad_weight) to compute; the other is returned
        as None.

    Returns
    -------
    grad_input : numpy.ndarray or None
        The gradient of x and of residual: h's shape and dtype.
    grad_weight : numpy.ndarray or None
        As rms_norm_backward returns it.

    Raises
    ------
    TypeError, ValueError
        As rms_norm_backward; also if grad_h's shape or dtype differs from
        h's.
    """
    result = _k.row_grads_plain(grad_out, grad_h, h, normalized_shape, None, rstd, weight, None,
                                output_mask, False)
    if result is not None:
        return result
    return row_norm_backward(grad_out, grad_h, h, normalized_shape, None, rstd, weight, None,
                             output_mask, "add_rms_norm", centered=False, x_name="h")
