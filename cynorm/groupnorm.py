"""Group normalization and instance normalization (torch.native_group_norm,
torch.instance_norm), channels first or channels last.

x is (N, C, *spatial) with axis=1 or (N, *spatial, C) with axis=-1.  Each
layout is read where it lies: channels-first data (axis=1) whose memory is
channels last, as a torch channels_last tensor's, runs the channels-last
kernels and gets its results in the same memory layout, and the other way
round; data in neither order is copied once.  Instance norm is group norm
with a group per channel, plus PyTorch's running statistics.
"""
from __future__ import annotations

import math

import numpy as np

from cynorm._arrays import check_distinct, kernel_flat as _flat, small_out, unalias
from cynorm._channels import as_math, channel_vector, update_running
from cynorm._dtypes import from_float64
from cynorm import _kernels
_k = _kernels.load("batch_norm")  # the SIMD level chosen at import
from cynorm._kernels._alloc import empty as _empty
from cynorm._kernels._runtime import get_num_threads as _threads
from cynorm._typing import Array, ArrayLike, OutArrays, OutputMask, Real
from cynorm._validation import (
    as_float_array, check_bool, check_eps, check_int, check_mask, check_out, check_real,
    check_same, check_updatable, normalize_dim, split_out,
)

__all__ = ["group_norm", "group_norm_backward", "instance_norm", "instance_norm_backward"]

# _kernel(name, policy): the entry point for policy's storage type
_kernel = _kernels.by_storage(_k, ("group_norm_forward", "group_norm_backward"))

_NONE = np.empty(0)     # an absent weight or bias, as the kernels take it


class _Layout:
    """How the kernels see an (N, C, *spatial) or (N, *spatial, C) array:
    `last` (channels last in memory), the sizes N, C, HW, and the move from
    the kernels' C-ordered array back to the caller's axes."""

    def __init__(self, x, axis, name="x"):
        if x.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (a batch axis and a "
                             f"channel axis), got shape {x.shape}")
        axis = normalize_dim(check_int(axis, "axis", "an int (the channel axis)"), x.ndim,
                             "axis")
        if axis not in (1, x.ndim - 1):
            raise ValueError(f"axis must be 1 (channels first) or -1 (channels last), got "
                             f"{axis} for {x.ndim} dimensions")
        self.axis = axis
        self.N, self.C = x.shape[0], x.shape[axis]
        spatial = tuple(s for i, s in enumerate(x.shape) if i not in (0, axis))
        self.HW = math.prod(spatial)
        # the layout the memory already has, where it is one of the two
        first_view, last_view = self.first(x), self.last(x)
        if x.ndim == 2:
            self.channels_last = True     # (N, C): both; a column pass per sample
        elif first_view.flags.c_contiguous and first_view.flags.aligned:
            self.channels_last = False
        elif last_view.flags.c_contiguous and last_view.flags.aligned:
            self.channels_last = True
        else:
            self.channels_last = axis != 1
        self.kernel_shape = ((self.N,) + spatial + (self.C,) if self.channels_last
                             else (self.N, self.C) + spatial)

    def first(self, a):
        # the caller's array as (N, C, *spatial)
        return a if self.axis == 1 else np.moveaxis(a, -1, 1)

    def last(self, a):
        # the caller's array as (N, *spatial, C)
        return a if self.axis == a.ndim - 1 else np.moveaxis(a, 1, -1)

    def kernel_view(self, a):
        """a (the caller's axes) as the kernels read it: C-contiguous in
        the chosen layout (a copy where it is not)."""
        v = self.last(a) if self.channels_last else self.first(a)
        return np.require(v, requirements=["C", "A"])

    def caller_view(self, k):
        """The kernels' C-ordered array k with the caller's axes."""
        if self.channels_last:
            return k if self.axis == k.ndim - 1 else np.moveaxis(k, -1, 1)
        return k if self.axis == 1 else np.moveaxis(k, 1, -1)

    def kernel_out(self, out, dtype):
        """The kernels' array for an x-shaped output: out's own memory where
        it is in the chosen layout, else a new array (copied into out after)."""
        if out is not None:
            v = self.last(out) if self.channels_last else self.first(out)
            if v.flags.c_contiguous:
                return v
        shape = self.kernel_shape
        return _empty(shape, dtype, math.prod(shape) * np.dtype(dtype).itemsize)


def _groups(num_groups, C):
    G = check_int(num_groups, "num_groups", "a positive int")
    if G < 1:
        raise ValueError(f"num_groups must be >= 1, got {G}")
    if C % G:
        raise ValueError(f"the channel count {C} must be divisible by num_groups ({G})")
    return G


def _vec(a):
    # a checked weight or bias as the kernels take it: float64 holding
    # math-type values, or empty
    return _NONE if a is None else a


def _stat(a, name, N, G, policy, op):
    """A saved mean/rstd: (N, G) or (N * G,), any float dtype; returns float64
    holding the values the forward's kernels computed with."""
    if a is None:
        raise ValueError(f"{name} is required, got None")
    a, _ = as_float_array(a, name)
    if a.shape != (N, G) and a.shape != (N * G,):
        raise ValueError(f"{name} must have shape {(N, G)} (as {op} returns it), got {a.shape}")
    return as_math(np.ascontiguousarray(a, dtype=policy.stat).reshape(-1), policy)


def _forward(x, G, weight, bias, eps, lay, policy, given, out):
    """The one Python path of group_norm and instance_norm: y and the
    float64 (mean, var, rstd) per (n, g); given: (mean, rstd) float64 to
    normalize with instead of x's own."""
    N, C, HW = lay.N, lay.C, lay.HW
    y_out, mean_out, rstd_out = split_out(out, ("y", "mean", "rstd"))
    if y_out is not None:
        y_out = check_out(y_out, "out[0] (y)", x.shape, x.dtype, order="any")
    kmean, mean = small_out(mean_out, "out[1] (mean)", (N, G), policy.stat)
    krstd, rstd = small_out(rstd_out, "out[2] (rstd)", (N, G), policy.stat)
    check_distinct(zip(("out[0] (y)", "out[1] (mean)", "out[2] (rstd)"), (y_out, mean, rstd)))
    outs = (y_out, mean, rstd)
    (x,) = unalias([x], outs, keep=y_out)      # y may be x: each element is read, then written
    w = _vec(None if weight is None else as_math(weight, policy))
    b = _vec(None if bias is None else as_math(bias, policy))
    kx = lay.kernel_view(x)
    ky = lay.kernel_out(y_out, x.dtype)
    m64, v64, r64 = (np.empty(N * G) for _ in range(3))
    if given is not None:
        m64[...], r64[...] = given
    if N * C and HW:
        _kernel("group_norm_forward", policy)(_flat(kx), _flat(ky), w, b, m64, v64, r64, N, C,
                                              HW, G, eps, lay.channels_last, given is not None,
                                              _threads())
    elif given is None:         # no element per group: mean 0 and rstd NaN, as torch
        m64[...], v64[...], r64[...] = 0.0, np.nan, np.nan
    kmean[...] = from_float64(m64, policy.stat).reshape(N, G)
    krstd[...] = from_float64(r64, policy.stat).reshape(N, G)
    y = lay.caller_view(ky)
    if y_out is not None:
        if not np.shares_memory(y, y_out):      # computed into a buffer of the kernels' layout
            y_out[...] = y
        y = y_out
    return (y, mean, rstd), (m64, v64)


def group_norm(x: ArrayLike, num_groups: int, weight: ArrayLike | None = None,
               bias: ArrayLike | None = None, eps: Real = 1e-5, axis: int = 1, *,
               out: OutArrays = None) -> tuple[Array, Array, Array]:
    """Group normalization (torch.native_group_norm).

    The C channels are split into num_groups groups of C // num_groups
    consecutive channels; per sample n and group g, over the group's
    channels and every spatial position::

        y = (x - mean[n, g]) * rstd[n, g] * weight[c] + bias[c]

    with rstd = 1 / sqrt(var + eps) (biased variance).  Statistics are
    float64 sums of each channel's shifted moments, merged per group;
    bitwise the same at any thread count and in either layout (axis=-1
    data gives the bits of the same values channels first).

    Parameters
    ----------
    x : array_like
        ``(N, C, *spatial)`` with axis=1, or ``(N, *spatial, C)`` with
        axis=-1; float64, float32, bfloat16 or float16; never modified (unless it is
        ``out[0]``).  Either layout is read in place when its memory is
        C-ordered in either channel order (a torch channels_last tensor
        included); other strides are copied once.
    num_groups : int
        The number of groups; must divide C.
    weight : array_like, optional
        Shape (C,); x's dtype, or float32 for 16-bit x.  None: no scale.
    bias : array_like, optional
        Shape (C,); as weight.  None: no shift.
    eps : float, default 1e-5
        Added to the variance; >= 0.
    axis : int, default 1
        The channel axis: 1 (channels first) or -1 (channels last).
    out : tuple of three (numpy.ndarray or None), optional
        ``(y, mean, rstd)`` arrays (or None entries) to write into, of
        exact shape and dtype: y of any strides (written in place where it
        is laid out as x is read, C-ordered with the channels where x has
        them in memory, else computed into a new array and copied in),
        mean and rstd C-contiguous.  y may be x itself.

    Returns
    -------
    y : numpy.ndarray
        x's shape and dtype, in x's memory layout (channels last stays
        channels last).
    mean : numpy.ndarray
        Shape (N, num_groups); float64 for float64 x, float32 otherwise.
    rstd : numpy.ndarray
        1 / sqrt(var + eps), mean's shape and dtype.

    Raises
    ------
    TypeError
        If an array has an unsupported dtype, num_groups or axis is not an
        int, eps is not a real number, or out is not None or a tuple of
        three arrays/None of the outputs' dtypes.
    ValueError
        If x has fewer than 2 dimensions, axis is not the second or the
        last, num_groups does not divide C, weight or bias is not (C,),
        eps < 0, or an output has the wrong shape, is read-only, or
        overlaps another output, or mean or rstd is not C-contiguous.
    """
    result = _k.group_forward_plain(x, num_groups, weight, bias, eps, axis, out)
    if result is not None:
        return result
    x, policy = as_float_array(x, "x")
    lay = _Layout(x, axis)
    G = _groups(num_groups, lay.C)
    weight = channel_vector(weight, "weight", lay.C, policy)
    bias = channel_vector(bias, "bias", lay.C, policy)
    outs, _ = _forward(x, G, weight, bias, check_eps(eps), lay, policy, None, out)
    return outs


def _backward(grad_out, x, mean, rstd, weight, G, mask, lay, policy, fixed, op):
    """The one Python path of group_norm_backward and instance_norm_backward."""
    N, C, HW = lay.N, lay.C, lay.HW
    m64 = _stat(mean, "mean", N, G, policy, op)
    r64 = _stat(rstd, "rstd", N, G, policy, op)
    w = _vec(None if weight is None else as_math(weight, policy))
    kx = lay.kernel_view(x)
    kdy = lay.kernel_view(grad_out)
    kgx = lay.kernel_out(None, x.dtype) if mask[0] else None
    gw, gb = np.zeros(C), np.zeros(C)
    if N * C and HW and any(mask):
        _kernel("group_norm_backward", policy)(_flat(kdy), _flat(kx),
                                               _flat(np.empty(0, x.dtype) if kgx is None else kgx),
                                               m64, r64,
                                               w, gw, gb, N, C, HW, G, lay.channels_last, fixed,
                                               _threads())
    dt = x.dtype if weight is None else weight.dtype
    with np.errstate(over="ignore"):      # float16 sums above 65504 become inf, as in torch
        grad_weight = from_float64(gw, dt) if mask[1] else None
        grad_bias = from_float64(gb, dt) if mask[2] else None
    return (None if kgx is None else lay.caller_view(kgx)), grad_weight, grad_bias


def _grad_args(grad_out, x, axis):
    x, policy = as_float_array(x, "x")
    grad_out, _ = as_float_array(grad_out, "grad_out")
    check_same(grad_out, "grad_out", x.shape, x.dtype, ref="x")
    return grad_out, x, policy, _Layout(x, axis)


def group_norm_backward(grad_out: ArrayLike, x: ArrayLike, mean: ArrayLike, rstd: ArrayLike,
                        weight: ArrayLike | None, num_groups: int,
                        output_mask: OutputMask = (True, True, True), axis: int = 1,
                        ) -> tuple[Array | None, Array | None, Array | None]:
    """Gradients of group_norm (torch.native_group_norm_backward).

    With xhat = (x - mean) * rstd and g = grad_out * weight[c], per sample
    and group (means over the group's channels and positions)::

        grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat))
        grad_weight[c] = sum over samples and positions of grad_out * xhat
        grad_bias[c] = sum over samples and positions of grad_out

    Parameters
    ----------
    grad_out : array_like
        The gradient of y: x's shape and dtype (any layout).
    x : array_like
        The forward's input.
    mean : array_like
        The mean group_norm returned, (N, num_groups) or flat.
    rstd : array_like
        The rstd group_norm returned, (N, num_groups) or flat.
    weight : array_like or None
        The forward's weight (None: no scale).
    num_groups : int
        As in the forward.
    output_mask : sequence of three bool, default (True, True, True)
        Which of (grad_x, grad_weight, grad_bias) to compute; the others
        are returned as None.
    axis : int, default 1
        As in the forward.

    Returns
    -------
    grad_x : numpy.ndarray or None
        x's shape and dtype, in the memory layout x is read in.
    grad_weight : numpy.ndarray or None
        Shape (C,), weight's dtype (x's when weight is None).
    grad_bias : numpy.ndarray or None
        Shape (C,), grad_weight's dtype.

    Raises
    ------
    TypeError
        If an array has an unsupported dtype, grad_out's dtype differs from
        x's, num_groups or axis is not an int, or output_mask does not hold
        booleans.
    ValueError
        If grad_out's shape differs from x's, axis is not the second or the
        last, num_groups does not divide C, a statistic or weight has the
        wrong shape, or output_mask has not three entries.
    """
    result = _k.group_backward_plain(grad_out, x, mean, rstd, weight, num_groups, output_mask,
                                     axis)
    if result is not None:
        return result
    grad_out, x, policy, lay = _grad_args(grad_out, x, axis)
    G = _groups(num_groups, lay.C)
    weight = channel_vector(weight, "weight", lay.C, policy)
    mask = check_mask(output_mask)
    return _backward(grad_out, x, mean, rstd, weight, G, mask, lay, policy, False, "group_norm")


def instance_norm(x: ArrayLike, weight: ArrayLike | None = None, bias: ArrayLike | None = None,
                  running_mean: ArrayLike | None = None, running_var: ArrayLike | None = None,
                  use_input_stats: bool = True, momentum: Real = 0.1, eps: Real = 1e-5,
                  axis: int = 1, *, out: OutArrays = None) -> tuple[Array, Array, Array]:
    """Instance normalization (torch.instance_norm): each sample's channel
    normalized over its spatial positions.

    use_input_stats=True: y = (x - mean[n, c]) * rstd[n, c] * weight[c] +
    bias[c] with each instance's mean and biased variance; running_mean and
    running_var (when given) are updated in place with the batch's average
    of the instances' mean and unbiased variance::

        running_mean = (1 - momentum) * running_mean + momentum * mean over n of mean[n, c]
        running_var = (1 - momentum) * running_var + momentum * mean over n of var_unbiased[n, c]

    use_input_stats=False: the running statistics normalize instead (and
    are left as they are).  Unlike torch, a channels-last input gives a
    channels-last y.

    Parameters
    ----------
    x : array_like
        ``(N, C, *spatial)`` with axis=1, or ``(N, *spatial, C)`` with
        axis=-1; as group_norm's x.
    weight : array_like, optional
        Shape (C,); x's dtype, or float32 for 16-bit x.  None: no scale.
    bias : array_like, optional
        Shape (C,); as weight.  None: no shift.
    running_mean : numpy.ndarray, optional
        Shape (C,), as weight; updated in place when use_input_stats.
    running_var : numpy.ndarray, optional
        As running_mean.
    use_input_stats : bool, default True
        Normalize with each instance's statistics (True) or with the
        running ones (False: both required).
    momentum : float, default 0.1
        The running statistics' update weight.
    eps : float, default 1e-5
        Added to the variance; >= 0.
    axis : int, default 1
        The channel axis: 1 (channels first) or -1 (channels last).
    out : tuple of three (numpy.ndarray or None), optional
        ``(y, mean, rstd)`` as in group_norm.

    Returns
    -------
    y : numpy.ndarray
        x's shape and dtype, in x's memory layout.
    mean : numpy.ndarray
        Shape (N, C): each instance's mean, or with use_input_stats=False
        running_mean repeated per sample; float64 for float64 x, float32
        otherwise.  What instance_norm_backward takes.
    rstd : numpy.ndarray
        1 / sqrt(var + eps) of the same statistics, mean's shape and dtype.

    Raises
    ------
    TypeError
        If an array has an unsupported dtype, use_input_stats is not a
        bool, momentum or eps is not a real number, axis is not an int, or
        out is not as described.
    ValueError
        If x has fewer than 2 dimensions, axis is not the second or the
        last, a parameter or running statistic is not (C,), a running
        statistic to update is read-only, use_input_stats is False without
        both running statistics, use_input_stats is True with one spatial
        position and running statistics (their unbiased variance is
        undefined), eps < 0, momentum is not finite, or an output is not as
        described.
    """
    if (running_mean is None and running_var is None and use_input_stats is True
            and type(momentum) is float and math.isfinite(momentum)):
        result = _k.instance_forward_plain(x, weight, bias, eps, axis, out)
        if result is not None:
            return result
    x, policy = as_float_array(x, "x")
    lay = _Layout(x, axis)
    C = lay.C
    use_input_stats = check_bool(use_input_stats, "use_input_stats")
    momentum = check_real(momentum, "momentum")
    eps = check_eps(eps)
    weight = channel_vector(weight, "weight", C, policy)
    bias = channel_vector(bias, "bias", C, policy)
    if use_input_stats:     # updated in place: never a converted copy
        if running_mean is not None:
            running_mean = check_updatable(running_mean, "running_mean")
        if running_var is not None:
            running_var = check_updatable(running_var, "running_var")
    rm = channel_vector(running_mean, "running_mean", C, policy)
    rv = channel_vector(running_var, "running_var", C, policy)
    if use_input_stats:
        if lay.HW < 2 and lay.N * C and (rm is not None or rv is not None):
            raise ValueError(f"x must have more than 1 spatial position per instance for "
                             f"instance_norm to update running_mean / running_var (their "
                             f"unbiased variance), got shape {x.shape}")
        check_distinct([("running_mean", rm), ("running_var", rv)]
                       + [(f"out[{i}]", o) for i, o in enumerate(split_out(
                           out, ("y", "mean", "rstd")))])
        outs, (m64, v64) = _forward(x, C, weight, bias, eps, lay, policy, None, out)
        if lay.N * C:
            # the batch's averages summed in order over n (cumsum: never
            # pairwise, as NumPy's mean would be for one channel), as the
            # XLA handler sums them (batch_norm_ffi.pxi)
            update_running(rm, rv, np.cumsum(m64.reshape(lay.N, C), axis=0)[-1] / lay.N,
                           np.cumsum(v64.reshape(lay.N, C), axis=0)[-1] / lay.N, lay.HW,
                           momentum)
        return outs
    if rm is None or rv is None:
        raise ValueError("instance_norm: running_mean and running_var are required when "
                         "use_input_stats is False")
    m = np.tile(rm.astype(np.float64), lay.N)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.tile(1.0 / np.sqrt(rv.astype(np.float64) + eps), lay.N)
    outs, _ = _forward(x, C, weight, bias, eps, lay, policy, (m, r), out)
    return outs


def instance_norm_backward(grad_out: ArrayLike, x: ArrayLike, mean: ArrayLike, rstd: ArrayLike,
                           weight: ArrayLike | None = None, use_input_stats: bool = True,
                           output_mask: OutputMask = (True, True, True), axis: int = 1,
                           ) -> tuple[Array | None, Array | None, Array | None]:
    """Gradients of instance_norm (torch's autograd of torch.instance_norm).

    use_input_stats=True: group_norm_backward with a group per channel;
    False (statistics that do not depend on x): grad_x = grad_out *
    weight[c] * rstd.  grad_weight and grad_bias as in group_norm_backward.

    Parameters
    ----------
    grad_out : array_like
        The gradient of y: x's shape and dtype (any layout).
    x : array_like
        The forward's input.
    mean : array_like
        The mean instance_norm returned, (N, C) or flat.
    rstd : array_like
        The rstd instance_norm returned, (N, C) or flat.
    weight : array_like, optional
        The forward's weight (None: no scale).
    use_input_stats : bool, default True
        As in the forward.
    output_mask : sequence of three bool, default (True, True, True)
        Which of (grad_x, grad_weight, grad_bias) to compute; the others
        are returned as None.
    axis : int, default 1
        As in the forward.

    Returns
    -------
    grad_x : numpy.ndarray or None
        x's shape and dtype, in the memory layout x is read in.
    grad_weight : numpy.ndarray or None
        Shape (C,), weight's dtype (x's when weight is None).
    grad_bias : numpy.ndarray or None
        Shape (C,), grad_weight's dtype.

    Raises
    ------
    TypeError
        If an array has an unsupported dtype, grad_out's dtype differs from
        x's, use_input_stats is not a bool, axis is not an int, or
        output_mask does not hold booleans.
    ValueError
        If grad_out's shape differs from x's, axis is not the second or the
        last, a statistic or weight has the wrong shape, or output_mask has
        not three entries.
    """
    result = _k.instance_backward_plain(grad_out, x, mean, rstd, weight, use_input_stats,
                                        output_mask, axis)
    if result is not None:
        return result
    grad_out, x, policy, lay = _grad_args(grad_out, x, axis)
    fixed = not check_bool(use_input_stats, "use_input_stats")
    weight = channel_vector(weight, "weight", lay.C, policy)
    mask = check_mask(output_mask)
    return _backward(grad_out, x, mean, rstd, weight, lay.C, mask, lay, policy, fixed,
                     "instance_norm")
