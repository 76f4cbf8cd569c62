"""Negative log-likelihood loss and its backward (ATen's nll_loss_forward,
nll_loss_backward, nll_loss2d_forward, nll_loss2d_backward, nll_loss,
nll_loss2d).

x holds log-probabilities with the classes on axis 1 ((N, C), or (C,) for a
single sample; (N, C, H, W) for the 2d ops); target holds class indices.
reduction is "none", "mean" or "sum" (or ATen's 0, 1, 2).  Entries whose
target equals ignore_index count for nothing.  Both directions run Cython
kernels (_kernels/nll_loss.pyx.tp) over x's own (N, C, H * W) layout: the
forward each loss in float64, the reduced loss and the total weight as
compensated float64 sums; the backward each gradient element in float64,
rounded once.  A plain call goes straight to the kernel module's plain
entry; any other is validated and converted here, then runs the same kernel.
"""
from __future__ import annotations

import functools
import math
import operator
from typing import Union

import numpy as np

from cynorm._dtypes import from_float64
from cynorm._kernels import float_kernel
from cynorm._kernels._alloc import empty as _empty
from cynorm._kernels._runtime import get_num_threads
from cynorm import _kernels
from cynorm._typing import Array, ArrayLike
from cynorm._validation import as_array, as_float_array, check_int, check_same

_k = _kernels.load("nll_loss")

#: "none", "mean", "sum", or ATen's 0, 1, 2
Reduction = Union[str, int]

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _reduction(reduction):
    if isinstance(reduction, str):
        if reduction in REDUCTIONS:
            return REDUCTIONS[reduction]
    elif not isinstance(reduction, (bool, np.bool_)):
        try:
            r = operator.index(reduction)
        except TypeError:
            r = None
        if r in (0, 1, 2):
            return r
    raise ValueError(f"reduction must be 'none', 'mean' or 'sum' (or 0, 1, 2), got {reduction!r}")


class _Problem:
    """x, target and weight checked; x's layout as (N, C, S) (S = H * W for
    the 2d forms, 1 otherwise) and its K = N * S targets, flat."""

    def __init__(self, x, target, weight, ignore_index, two_d, x_name="x"):
        x, _ = as_float_array(x, x_name)
        if two_d:
            if x.ndim != 4:
                raise ValueError(f"{x_name} must be 4-D (N, C, H, W) for nll_loss2d, got shape {x.shape}")
            t_shape = (x.shape[0],) + x.shape[2:]
        else:
            if x.ndim not in (1, 2):
                raise ValueError(f"{x_name} must be 1-D (C,) or 2-D (N, C), got shape {x.shape}")
            t_shape = x.shape[:1] if x.ndim == 2 else ()
        target = as_array(target, "target")
        if target.dtype.kind not in "iu":
            raise TypeError(f"target must be an integer array, got dtype {target.dtype}")
        if target.shape != t_shape:
            raise ValueError(f"target must have shape {t_shape} for {x_name} of shape {x.shape}, "
                             f"got {target.shape}")
        C = x.shape[1] if x.ndim > 1 else x.shape[0]
        self.ignore = check_int(ignore_index, "ignore_index")
        self.x, self.C, self.t_shape = x, C, t_shape
        self.N = x.shape[0] if x.ndim > 1 else 1
        self.S = math.prod(x.shape[2:])
        t = target.reshape(-1).astype(np.int64)
        self.targets = np.ascontiguousarray(t)
        self.valid = t != self.ignore
        bad = self.valid & ((t < 0) | (t >= C))
        if bad.any():
            raise ValueError(f"target: class index {int(t[bad][0])} is out of bounds for "
                             f"{C} classes (and is not ignore_index={self.ignore})")
        self.t = np.where(self.valid, t, 0)
        if weight is not None:
            weight, _ = as_float_array(weight, "weight")
            check_same(weight, "weight", (C,), x.dtype, ref="x's classes")
        self.weight = weight

    @functools.cached_property
    def rows(self):
        """x as (K, C) rows, classes last (a copy for 4-D x)."""
        return self.as_rows(self.x)

    def as_rows(self, a):
        """An array of x's shape as (K, C) rows, classes last."""
        a = np.asarray(a)
        return (np.moveaxis(a, 1, -1) if a.ndim > 1 else a).reshape(int(np.prod(self.t_shape)), self.C)

    def from_rows(self, rows):
        """(K, C) rows back to x's shape (the inverse of as_rows)."""
        if self.x.ndim == 1:
            return rows.reshape(self.x.shape)
        return np.moveaxis(rows.reshape(np.moveaxis(self.x, 1, -1).shape), -1, 1)

    def picked(self, rows=None):
        """float64 rows[k, target[k]] (0 where ignored)."""
        rows = self.rows if rows is None else rows
        if self.C == 0:                 # every target is ignored (others were refused)
            return np.zeros(self.t.size)
        v = rows[np.arange(self.t.size), self.t].astype(np.float64)
        return np.where(self.valid, v, 0.0)

    def weights(self, weight=None):
        """float64 weight[target[k]] (0 where ignored)."""
        weight = self.weight if weight is None else weight
        if self.C == 0:
            return np.zeros(self.t.size)
        w = np.ones(self.t.size) if weight is None else weight.astype(np.float64)[self.t]
        return np.where(self.valid, w, 0.0)


def _math_dtype(dtype):
    # the kernels' dtype: 16-bit data is computed from float32 (exact)
    return np.float64 if dtype == np.float64 else np.float32


def _kernel_ignore(p):
    # every target is in [0, C) or ignored (checked): an ignore_index beyond
    # int64 equals none of them, and neither does -1
    return p.ignore if -2**63 <= p.ignore < 2**63 else -1


def _forward(x, target, weight, reduction, ignore_index, two_d):
    p = _Problem(x, target, weight, ignore_index, two_d)
    r = _reduction(reduction)
    mdt = _math_dtype(p.x.dtype)
    x = np.ascontiguousarray(p.x, mdt)
    w = None if p.weight is None else np.ascontiguousarray(p.weight, mdt)
    t = p.targets
    losses = np.empty(t.size) if r == 0 else None
    total_loss, total = float_kernel(_k, "nll_forward", x)(
        x.reshape(-1), t, w, p.N, p.C, p.S, _kernel_ignore(p), losses)
    dtype = p.x.dtype
    if r == 0:
        out = losses.reshape(p.t_shape)
    elif r == 2:
        out = np.float64(total_loss)
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.float64(total_loss) / np.float64(total)
    # ATen reports total_weight for "none" only for a single sample (1-D x)
    total = total if r or p.x.ndim == 1 else 0.0
    return np.asarray(from_float64(out, dtype)), np.asarray(from_float64(np.float64(total), dtype))


def nll_loss_forward(x: ArrayLike, target: ArrayLike, weight: ArrayLike | None = None,
                     reduction: Reduction = "mean", ignore_index: int = -100,
                     ) -> tuple[Array, Array]:
    """The NLL loss and its total weight (torch.ops.aten.nll_loss_forward).

    Parameters
    ----------
    x : array_like
        Log-probabilities, shape (N, C), or (C,) for one sample: float64, float32, bfloat16 or float16.
    target : array_like of int
        Class indices, shape (N,), or () for one sample: each in [0, C) or equal to ignore_index.
    weight : array_like, optional
        One weight per class, shape (C,), x's dtype.  None: all ones.
    reduction : {"mean", "sum", "none"} or int, default "mean"
        Also ATen's 0 (none), 1 (mean), 2 (sum).
    ignore_index : int, default -100
        A target value that counts for nothing.

    Returns
    -------
    output : numpy.ndarray
        -weight[t] * x[t] per sample ("none": the target's shape), their
        sum ("sum", 0-d), or that sum divided by total_weight ("mean", 0-d;
        nan when every target is ignored).  x's dtype.
    total_weight : numpy.ndarray
        0-d, x's dtype: the sum of weight[t] over non-ignored samples (for
        "none" 0, except weight[t] for a single 1-D sample, as ATen reports
        it).

    Raises
    ------
    TypeError
        If x or weight has an unsupported dtype, weight's dtype differs from
        x's, target is not an integer array, or ignore_index is not an int.
    ValueError
        If x, target or weight has the wrong shape, a target is out of
        bounds (and not ignore_index), or reduction is not one of the above.
    """
    result = _k.nll_forward_plain(x, target, weight, reduction, ignore_index)
    return result if result is not None else _forward(x, target, weight, reduction, ignore_index,
                                                      False)


def nll_loss2d_forward(x: ArrayLike, target: ArrayLike, weight: ArrayLike | None = None,
                       reduction: Reduction = "mean", ignore_index: int = -100,
                       ) -> tuple[Array, Array]:
    """nll_loss_forward for x of shape (N, C, H, W) and target (N, H, W).

    Parameters
    ----------
    x : array_like
        Log-probabilities, shape (N, C, H, W): float64, float32, bfloat16 or float16.
    target : array_like of int
        Class indices, shape (N, H, W): each in [0, C) or equal to ignore_index.
    weight : array_like, optional
        One weight per class, shape (C,), x's dtype.  None: all ones.
    reduction : {"mean", "sum", "none"} or int, default "mean"
        Also ATen's 0 (none), 1 (mean), 2 (sum).
    ignore_index : int, default -100
        A target value that counts for nothing.

    Returns
    -------
    output : numpy.ndarray
        The loss per pixel ("none": shape (N, H, W)), or reduced (0-d), as
        in nll_loss_forward.  x's dtype.
    total_weight : numpy.ndarray
        0-d, x's dtype, as in nll_loss_forward.

    Raises
    ------
    TypeError
        If x or weight has an unsupported dtype, weight's dtype differs from
        x's, target is not an integer array, or ignore_index is not an int.
    ValueError
        If x, target or weight has the wrong shape, a target is out of
        bounds (and not ignore_index), or reduction is not one of the above.
    """
    result = _k.nll_forward_plain(x, target, weight, reduction, ignore_index, True)
    return result if result is not None else _forward(x, target, weight, reduction, ignore_index,
                                                      True)


def nll_loss(x: ArrayLike, target: ArrayLike, weight: ArrayLike | None = None,
             reduction: Reduction = "mean", ignore_index: int = -100) -> Array:
    """The NLL loss (torch.nn.functional.nll_loss on (N, C) or (C,) x).

    Parameters
    ----------
    x : array_like
        Log-probabilities, shape (N, C), or (C,) for one sample: float64, float32, bfloat16 or float16.
    target : array_like of int
        Class indices, shape (N,), or () for one sample: each in [0, C) or equal to ignore_index.
    weight : array_like, optional
        One weight per class, shape (C,), x's dtype.  None: all ones.
    reduction : {"mean", "sum", "none"} or int, default "mean"
        Also ATen's 0 (none), 1 (mean), 2 (sum).
    ignore_index : int, default -100
        A target value that counts for nothing.

    Returns
    -------
    numpy.ndarray
        nll_loss_forward's output: per sample for "none", else 0-d; x's dtype.

    Raises
    ------
    TypeError
        If x or weight has an unsupported dtype, weight's dtype differs from
        x's, target is not an integer array, or ignore_index is not an int.
    ValueError
        If x, target or weight has the wrong shape, a target is out of
        bounds (and not ignore_index), or reduction is not one of the above.
    """
    return nll_loss_forward(x, target, weight, reduction, ignore_index)[0]


def nll_loss2d(x: ArrayLike, target: ArrayLike, weight: ArrayLike | None = None,
               reduction: Reduction = "mean", ignore_index: int = -100) -> Array:
    """The NLL loss over (N, C, H, W) log-probabilities.

    Parameters
    ----------
    x : array_like
        Log-probabilities, shape (N, C, H, W): float64, float32, bfloat16 or float16.
    target : array_like of int
        Class indices, shape (N, H, W): each in [0, C) or equal to ignore_index.
    weight : array_like, optional
        One weight per class, shape (C,), x's dtype.  None: all ones.
    reduction : {"mean", "sum", "none"} or int, default "mean"
        Also ATen's 0 (none), 1 (mean), 2 (sum).
    ignore_index : int, default -100
        A target value that counts for nothing.

    Returns
    -------
    numpy.ndarray
        nll_loss2d_forward's output: per pixel for "none", else 0-d; x's dtype.

    Raises
    ------
    TypeError
        If x or weight has an unsupported dtype, weight's dtype differs from
        x's, target is not an integer array, or ignore_index is not an int.
    ValueError
        If x, target or weight has the wrong shape, a target is out of
        bounds (and not ignore_index), or reduction is not one of the above.
    """
    return nll_loss2d_forward(x, target, weight, reduction, ignore_index)[0]


def _backward(grad_output, x, target, weight, reduction, ignore_index, total_weight, two_d):
    p = _Problem(x, target, weight, ignore_index, two_d)
    r = _reduction(reduction)
    g, _ = as_float_array(grad_output, "grad_output")
    g_shape = p.t_shape if r == 0 else ()
    if g.shape != g_shape:
        raise ValueError(f"grad_output must have shape {g_shape} for reduction "
                         f"{['none', 'mean', 'sum'][r]}, got {g.shape}")
    tw, _ = as_float_array(total_weight, "total_weight")
    if tw.shape != ():
        raise ValueError(f"total_weight must be 0-d (as nll_loss_forward returns it), got {tw.shape}")
    mdt = _math_dtype(p.x.dtype)
    w = None if p.weight is None else np.ascontiguousarray(p.weight, mdt)
    out = _empty(p.x.shape, mdt, p.x.size * np.dtype(mdt).itemsize)
    float_kernel(_k, "nll_backward", out)(
        p.targets, w, np.ascontiguousarray(g, np.float64).reshape(-1),
        float(tw) if r == 1 else 1.0, r == 1, p.N, p.C, p.S, _kernel_ignore(p), out.reshape(-1),
        get_num_threads())
    return from_float64(out, p.x.dtype)


def nll_loss_backward(grad_output: ArrayLike, x: ArrayLike, target: ArrayLike,
                      weight: ArrayLike | None, reduction: Reduction, ignore_index: int,
                      total_weight: ArrayLike) -> Array:
    """Gradient of nll_loss_forward's output with respect to x.

    torch.ops.aten.nll_loss_backward: zero except
    ``grad[k, target[k]] = -weight[target[k]] * grad_output[k]`` (divided by
    total_weight for "mean"; ignored targets get nothing).

    Parameters
    ----------
    grad_output : array_like
        The gradient of the loss: the target's shape for reduction "none",
        0-d otherwise.
    x : array_like
        The forward's log-probabilities, shape (N, C) or (C,).
    target : array_like of int
        The forward's class indices, shape (N,) or ().
    weight : array_like or None
        The forward's class weights (shape (C,), x's dtype) or None.
    reduction : {"mean", "sum", "none"} or int
        The forward's reduction (or ATen's 0, 1, 2).
    ignore_index : int
        The forward's ignore_index.
    total_weight : array_like
        The 0-d total weight the forward returned.

    Returns
    -------
    numpy.ndarray
        The gradient of x: x's shape and dtype, C-contiguous.

    Raises
    ------
    TypeError
        If an array has an unsupported dtype or target is not an integer array.
    ValueError
        If an argument has the wrong shape (grad_output: the target's shape
        for "none", 0-d otherwise; total_weight: 0-d), a target is out of
        bounds, or reduction is not one of the above.
    """
    result = _k.nll_backward_plain(grad_output, x, target, weight, reduction, ignore_index,
                                   total_weight, False)
    return result if result is not None else _backward(grad_output, x, target, weight, reduction,
                                                       ignore_index, total_weight, False)


def nll_loss2d_backward(grad_output: ArrayLike, x: ArrayLike, target: ArrayLike,
                        weight: ArrayLike | None, reduction: Reduction, ignore_index: int,
                        total_weight: ArrayLike) -> Array:
    """nll_loss_backward for x of shape (N, C, H, W).

    Parameters
    ----------
    grad_output : array_like
        The gradient of the loss: the target's shape for reduction "none",
        0-d otherwise.
    x : array_like
        The forward's log-probabilities, shape (N, C, H, W).
    target : array_like of int
        The forward's class indices, shape (N, H, W).
    weight : array_like or None
        The forward's class weights (shape (C,), x's dtype) or None.
    reduction : {"mean", "sum", "none"} or int
        The forward's reduction (or ATen's 0, 1, 2).
    ignore_index : int
        The forward's ignore_index.
    total_weight : array_like
        The 0-d total weight the forward returned.

    Returns
    -------
    numpy.ndarray
        The gradient of x: x's shape and dtype, C-contiguous.

    Raises
    ------
    TypeError
        If an array has an unsupported dtype or target is not an integer array.
    ValueError
        If an argument has the wrong shape (grad_output: the target's shape
        for "none", 0-d otherwise; total_weight: 0-d), a target is out of
        bounds, or reduction is not one of the above.
    """
    result = _k.nll_backward_plain(grad_output, x, target, weight, reduction, ignore_index,
                                   total_weight, True)
    return result if result is not None else _backward(grad_output, x, target, weight, reduction,
                                                       ignore_index, total_weight, True)
