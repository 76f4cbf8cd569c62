"""Weight normalization (Salimans & Kingma, 2016) on NumPy arrays.

    w = g * v / ||v||

where the norm runs over every axis of v except `dim`, so each slice along
`dim` is rescaled to norm g.  The semantics are PyTorch's
(torch._weight_norm, torch._weight_norm_interface and its backward,
torch.norm_except_dim); the kernels are fused for every dim and dtype.

Conventions shared by the functions here:

* v may have any strides and is never modified.  C-contiguous and
  F-contiguous inputs are read in place; other layouts are copied once.
  Large outputs follow the input layout (F in, F out; otherwise C).
* dim wraps like a NumPy axis (-1 is the last axis).  ``dim=None`` means one
  norm over the whole array.  (ATen spells that dim=-1; here -1 is the last
  axis, as everywhere in NumPy.)
* g (and saved_norm) hold one value per index of v's dim: either the keepdims
  shape (size 1 on every other axis, PyTorch's layout) or 1-D of length
  v.shape[dim]; for dim=None a 0-d, (1,) or all-ones shape.  Outputs that
  match g keep g's shape.
* dtypes: float64, float32, bfloat16 (ml_dtypes), float16.  g has v's dtype,
  or float32 when v is 16-bit.  The returned norm is float32 for 16-bit v,
  v's dtype otherwise.  16-bit data is computed in float32.
* ``out=``: a function with one output takes an array (or a tuple of one);
  one with several outputs takes a tuple with one array (or None) per
  output. An output array
  must have exactly the expected shape and dtype and be C- or F-contiguous
  (a large output's order decides the order the kernel works in).
* A zero norm is not an error: as in PyTorch, the result is non-finite (0/0
  gives NaN, g/0 gives inf) wherever that slice is used.
* Results are bitwise identical at any thread count.
"""
from __future__ import annotations

import math

import numpy as np

from cynorm import _dtypes
from cynorm._arrays import (
    big_out as _big_out, check_big_out as _check_big_out, check_distinct as _check_distinct,
    kernel_dims as _kernel_dims, kernel_flat as _flat,
    layout as _layout, small_out as _small_out, unalias as _unalias,
)
from cynorm import _kernels
_k = _kernels.load("weight_norm")  # the SIMD level chosen at import
from cynorm._kernels._runtime import get_num_threads as _threads
from cynorm._typing import Array, ArrayLike, OutArray, OutArrays, Real
from cynorm._validation import (
    as_float_array, check_out, check_per_channel, check_same, kept_shape,
    normalize_dim, real_number, single_out, split_out,
)

__all__ = ["norm_except_dim", "weight_norm", "weight_norm_interface", "weight_norm_backward"]


# _kernel(name, policy): the entry point for policy's storage type
_kernel = _kernels.by_storage(_k, ("norm_except_dim", "weight_norm_forward",
                                   "weight_norm_backward"))


def _prepare_g(g, v, dim, policy, name="g"):
    """g checked, and its values as a contiguous math-type array for the kernel."""
    g, _ = as_float_array(g, name, untyped=policy.math)
    check_per_channel(g, name, v.shape, dim, policy.coefficients)
    return g, np.ascontiguousarray(g, dtype=policy.math)


def _norm_kind(pow):
    p = real_number(pow, "pow", "a positive real number or inf")
    if not p > 0:  # also rejects NaN
        raise ValueError(f"pow must be > 0 (or inf), got {pow!r}")
    if p == 2.0:
        return 0, p
    if p == 1.0:
        return 1, p
    if math.isinf(p):
        return 2, p
    return 3, p


def norm_except_dim(v: ArrayLike, pow: Real = 2, dim: int | None = 0, *,
                    out: OutArray = None) -> Array:
    """The p-norm of v over every axis except `dim`, with keepdims.

    Parameters
    ----------
    v : array_like
        float64, float32, bfloat16 or float16; any strides, never modified.
    pow : float, default 2
        Any p > 0, or ``np.inf`` for the largest absolute value.
    dim : int or None, default 0
        The axis that is kept.  ``None`` reduces over every axis and returns a
        0-d array (ATen's dim=-1; here -1 is the last axis).
    out : numpy.ndarray or tuple of one, optional
        Receives the result: the keepdims shape (or () for dim=None), v's dtype.

    Returns
    -------
    numpy.ndarray
        v's dtype (as torch.norm_except_dim), size 1 on every axis but `dim`
        (0-d for ``dim=None``); `out` when given.  Sums accumulate in float64;
        16-bit inputs round once at the end (a float16 norm above 65504
        becomes inf, as in PyTorch).

    Raises
    ------
    TypeError
        If v is not a floating array of a supported dtype, pow is not a real
        number, or out is not an array of the result's dtype.
    ValueError
        If pow is not > 0, dim is out of range, or out has the wrong shape or
        is read-only.
    """
    out = single_out(out)
    result = _k.norm_plain(v, pow, dim, out)
    if result is not None:
        return result
    v, policy = as_float_array(v, "v")
    dim = normalize_dim(dim, v.ndim)
    kind, p = _norm_kind(pow)
    shape = () if dim is None else kept_shape(v.shape, dim)
    if out is not None:
        out = check_out(out, "out", shape, v.dtype)
    (kv,), order = _layout([v], ())
    A, D, B = _kernel_dims(v.shape, dim, order)
    norms = np.empty(D, np.float64)
    _kernel("norm_except_dim", policy)(_flat(kv), norms, kind, p, A, D, B, _threads())
    with np.errstate(over="ignore"):      # a float16 norm above 65504 is inf, as in torch
        if _dtypes.is_16bit(v.dtype):
            norms = norms.astype(np.float32)  # float64 -> float32 -> 16 bits, as ml_dtypes rounds
        if out is None:
            return norms.astype(v.dtype, copy=False).reshape(shape)
        out[...] = norms.reshape(shape)
    return out


def _forward(v, g, dim, w_out, w_name, norm_out):
    """The shared body of weight_norm and weight_norm_interface: (w, norm)."""
    v, policy = as_float_array(v, "v")
    dim = normalize_dim(dim, v.ndim)
    g, g_vec = _prepare_g(g, v, dim, policy)
    w_out = _check_big_out(w_out, w_name, v.shape, v.dtype)
    knorm, norm = _small_out(norm_out, "out[1] (norm)", g.shape, policy.stat)
    _check_distinct([(w_name, w_out), ("out[1] (norm)", norm_out)])
    (v,) = _unalias([v], (w_out, norm_out), keep=w_out)
    (g_vec,) = _unalias([g_vec], (w_out, norm_out))
    (kv,), order = _layout([v], (w_out,))
    A, D, B = _kernel_dims(v.shape, dim, order)
    kw, w = _big_out(w_out, v.shape, v.dtype, order)
    _kernel("weight_norm_forward", policy)(_flat(kv), _flat(g_vec), _flat(kw), _flat(knorm), A, D, B,
                                           _threads())
    return w, norm


def weight_norm_interface(v: ArrayLike, g: ArrayLike, dim: int | None = 0, *,
                          out: OutArrays = None) -> tuple[Array, Array]:
    """Fused weight norm that also returns the norm (torch._weight_norm_interface).

    Parameters
    ----------
    v : array_like
        The direction: float64, float32, bfloat16 or float16.  Any strides;
        never modified.
    g : array_like
        The magnitude, one value per index of v's `dim` (keepdims shape or
        1-D; for ``dim=None`` 0-d, (1,) or all ones): v's dtype, or float32
        when v is 16-bit.
    dim : int or None, default 0
        The axis whose slices are normalized; None normalizes the whole array.
    out : tuple of two (numpy.ndarray or None), optional
        ``(w, norm)`` arrays to write into (None entries are allocated).  w
        may be v itself (in place).

    Returns
    -------
    w : numpy.ndarray
        v * g / ||v||, v's shape and dtype.
    norm : numpy.ndarray
        ||v|| over every axis but `dim`, g's shape; float32 for 16-bit v,
        else v's dtype.

    Raises
    ------
    TypeError
        If v or g has an unsupported dtype, or out is not None or a tuple of
        two arrays/None of the outputs' dtypes.
    ValueError
        If dim is out of range, g does not hold one value per index of v's
        `dim`, or an output has the wrong shape, is read-only, or overlaps
        the other output.
    """
    result = _k.forward_plain(v, g, dim, out)
    if result is not None:
        return result
    w_out, norm_out = split_out(out, ("w", "norm"))
    return _forward(v, g, dim, w_out, "out[0] (w)", norm_out)


def weight_norm(v: ArrayLike, g: ArrayLike, dim: int | None = 0, *,
                out: OutArray = None) -> Array:
    """Weight normalization w = v * g / ||v|| (torch._weight_norm).

    weight_norm_interface without the norm.

    Parameters
    ----------
    v : array_like
        The direction: float64, float32, bfloat16 or float16.  Any strides;
        never modified (unless it is `out`).
    g : array_like
        The magnitude, one value per index of v's `dim` (keepdims shape or
        1-D): v's dtype, or float32 when v is 16-bit.
    dim : int or None, default 0
        The axis whose slices are normalized; None normalizes the whole array.
    out : numpy.ndarray or tuple of one, optional
        An array of v's shape and dtype to write w into; it may be v itself
        (in place).

    Returns
    -------
    numpy.ndarray
        w, v's shape and dtype (`out` when given).

    Raises
    ------
    TypeError
        If v or g has an unsupported dtype, or out is not an array of v's dtype.
    ValueError
        If dim is out of range, g does not hold one value per index of v's
        `dim`, or out has the wrong shape or is read-only.
    """
    out = single_out(out)
    result = _k.forward_plain(v, g, dim, None if out is None else (out, None))
    if result is not None:
        return result[0]
    return _forward(v, g, dim, out, "out", None)[0]


def weight_norm_backward(grad_w: ArrayLike, saved_v: ArrayLike, saved_g: ArrayLike,
                         saved_norm: ArrayLike, dim: int | None = 0, *,
                         out: OutArrays = None) -> tuple[Array, Array]:
    """Gradients of weight_norm_interface (torch._weight_norm_interface_backward).

    With s = sum(grad_w * v) over every axis but `dim`::

        grad_g = s / norm
        grad_v = (g / norm) * grad_w - (g * grad_g / norm**2) * v

    Parameters
    ----------
    grad_w : array_like
        The gradient of w: v's shape and dtype.
    saved_v : array_like
        The forward's v.
    saved_g : array_like
        The forward's g.
    saved_norm : array_like
        The norm weight_norm_interface returned (g's shape; float32 for
        16-bit v, else v's dtype).
    dim : int or None, default 0
        As in the forward.
    out : tuple of two (numpy.ndarray or None), optional
        ``(grad_v, grad_g)`` arrays to write into (None entries are
        allocated).

    Returns
    -------
    grad_v : numpy.ndarray
        v's shape and dtype.
    grad_g : numpy.ndarray
        g's shape and dtype.

    Raises
    ------
    TypeError
        If an argument has an unsupported dtype or out is not None or a
        tuple of two arrays/None of the outputs' dtypes.
    ValueError
        If grad_w's shape differs from v's, dim is out of range, saved_g or
        saved_norm does not hold one value per index of v's `dim`, or an
        output has the wrong shape, is read-only or overlaps the other.
    """
    result = _k.backward_plain(grad_w, saved_v, saved_g, saved_norm, dim, out)
    if result is not None:
        return result
    v, policy = as_float_array(saved_v, "saved_v")
    grad_w, _ = as_float_array(grad_w, "grad_w")
    check_same(grad_w, "grad_w", v.shape, v.dtype, ref="saved_v")
    dim = normalize_dim(dim, v.ndim)
    g, g_vec = _prepare_g(saved_g, v, dim, policy, name="saved_g")
    norm, _ = as_float_array(saved_norm, "saved_norm")
    check_per_channel(norm, "saved_norm", v.shape, dim, (policy.stat,))
    norm_vec = np.ascontiguousarray(norm)
    gv_out, gg_out = split_out(out, ("grad_v", "grad_g"))
    gv_out = _check_big_out(gv_out, "out[0] (grad_v)", v.shape, v.dtype)
    kgg, grad_g = _small_out(gg_out, "out[1] (grad_g)", g.shape, g.dtype)
    _check_distinct([("out[0] (grad_v)", gv_out), ("out[1] (grad_g)", gg_out)])
    grad_w, v = _unalias([grad_w, v], (gv_out, gg_out), keep=gv_out)
    g_vec, norm_vec = _unalias([g_vec, norm_vec], (gv_out, gg_out))
    (kgw, kv), order = _layout([grad_w, v], (gv_out,))
    A, D, B = _kernel_dims(v.shape, dim, order)
    kgv, grad_v = _big_out(gv_out, v.shape, v.dtype, order)
    if g.dtype != policy.stat:
        kgg = np.empty(D, policy.stat)     # 16-bit g: the kernel writes float32
    _kernel("weight_norm_backward", policy)(_flat(kgw), _flat(kv), _flat(g_vec), _flat(norm_vec),
                                            _flat(kgv), _flat(kgg), A, D, B, _threads())
    if kgg is not grad_g:
        grad_g[...] = kgg.reshape(g.shape)  # rounds to nearest even, as ml_dtypes casts
    return grad_v, grad_g
