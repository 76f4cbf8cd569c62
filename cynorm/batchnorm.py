"""Batch normalization (Ioffe & Szegedy, 2015) on NumPy arrays, with
PyTorch's semantics (native_batch_norm and native_batch_norm_backward).

Each channel (index along ``axis``) is normalized with statistics over every
other axis — the batch and the spatial axes:

    y = (x - mean) * invstd * weight + bias,   invstd = 1 / sqrt(var + eps)

Conventions:

* ``axis`` is the channel axis: 1 for N,C,... layouts, -1 for channels-last
  (N,...,C); any rank >= 2.  x may have any strides and is never modified:
  an input stored contiguously in any order of its axes (C, F, or channels
  last seen as (N, C, H, W), as a channels_last torch tensor's view is) is
  read in place, other layouts are copied once.  Large outputs follow the
  input's order.
* Training normalizes with the batch's mean and biased variance, returns
  them as save_mean and save_invstd, and updates running_mean/running_var
  *in place* when given: new = (1 - momentum) * old + momentum * batch, with
  the batch's unbiased variance.  Inference normalizes with the running
  statistics and returns empty (shape (0,)) save_mean/save_invstd.
* dtypes: float64, float32, bfloat16 (ml_dtypes), float16.  weight, bias and
  the running statistics each have x's dtype, or float32 when x is 16-bit
  (PyTorch's mixed-type batch norm).  Statistics are computed in float64 from
  sums of shifted values (exact enough for data with a mean 1e4 times its
  spread) and returned in float32 (float64 for float64 x); training's y
  keeps the float64 mean's precision (what rounding it to save_mean drops
  goes into each channel's shift).
* A zero-size batch gives an empty y, NaN statistics, unchanged running
  statistics and zero grad_weight/grad_bias.  A NaN or inf makes only its own
  channel non-finite.  Results are bitwise identical at any thread count.
"""
from __future__ import annotations

from typing import Optional

from cynorm._arrays import big_out, check_big_out, check_distinct, small_out, unalias
from cynorm._channels import (
    batch_norm_args, batch_norm_backward_into, batch_norm_into, channel_input, channel_stat,
    channel_vector, plain_batch_norm, plain_batch_norm_backward, prepare,
)
from cynorm._typing import Array, ArrayLike, Axis, OutArrays, OutputMask, Real
from cynorm._validation import as_float_array, check_bool, check_eps, check_mask, check_same, split_out

__all__ = ["batch_norm", "batch_norm_backward"]


def batch_norm(x: ArrayLike, weight: Optional[ArrayLike] = None,
               bias: Optional[ArrayLike] = None, running_mean: Optional[ArrayLike] = None,
               running_var: Optional[ArrayLike] = None, training: bool = True,
               momentum: Real = 0.1, eps: Real = 1e-5, axis: Axis = 1, *,
               out: OutArrays = None) -> tuple[Array, Array, Array]:
    """Batch normalization (torch.native_batch_norm).

    Normalizes each channel (index along `axis`) of `x` over every other
    axis, ``y = (x - mean) * invstd * weight + bias`` with
    ``invstd = 1 / sqrt(var + eps)``.  Training uses the batch's mean and
    biased variance, returns them as `save_mean` and `save_invstd` and
    updates `running_mean` and `running_var` in place when they are given;
    inference uses the running statistics.

    Parameters
    ----------
    x : array_like
        The input, rank >= 2, float64, float32, bfloat16 or float16.  It may
        have any strides and is never modified (unless it is ``out[0]``:
        then y is computed in place).
    weight : array_like, optional
        Per-channel scale, shape (C,), with C = ``x.shape[axis]``: x's dtype,
        or float32 when x is 16-bit.  None (the default) scales by 1.
    bias : array_like, optional
        Per-channel shift, shape (C,), dtype as `weight`.  None (the
        default) shifts by 0.
    running_mean : numpy.ndarray, optional
        Running mean, shape (C,), dtype as `weight`.  Required in inference
        (it is then the mean normalized with, and any array-like is
        accepted).  In training it is optional and, when given, **updated in
        place**: ``new = (1 - momentum) * old + momentum * batch_mean``; it
        must then be a writeable NumPy array of native byte order sharing no
        memory with another output.
    running_var : numpy.ndarray, optional
        Running variance, shape (C,), dtype as `weight`; required in
        inference.  In training it is optional and, when given, **updated in
        place** as `running_mean` is, with the batch's unbiased variance.
    training : bool, default True
        Normalize with the batch's statistics (True) or with the running
        statistics (False).
    momentum : float, default 0.1
        Weight of the batch's statistics in the running statistics' update;
        finite.  Unused in inference.
    eps : float, default 1e-5
        Added to the variance before the square root; >= 0, and > 0 in
        training.
    axis : int, default 1
        The channel axis (-1 for channels-last layouts); negative values
        count from the end.
    out : tuple of 3 numpy.ndarray or None, optional
        Arrays to write (y, save_mean, save_invstd) into, each entry an
        array or None (then a new array is returned for it).  y must have
        x's shape and dtype and be C- or F-contiguous; save_mean and
        save_invstd must have the shape and dtype they are returned with and
        be C-contiguous.  No two of them may share memory, nor (in training)
        share memory with the running statistics; an input overlapping one
        is read from a private copy.

    Returns
    -------
    y : numpy.ndarray
        The normalized input, x's shape and dtype: ``out[0]`` when given,
        otherwise a new array in the order of x's axes in memory (F, or
        channels last seen as (N, C, H, W)) when x is contiguous in one
        other than C order, C-contiguous otherwise.
    save_mean : numpy.ndarray
        The batch's per-channel mean, shape (C,) in training; shape (0,) in
        inference.  float64 for float64 x, float32 otherwise (``out[1]``
        when given).
    save_invstd : numpy.ndarray
        The batch's ``1 / sqrt(biased var + eps)``, shape (C,) in training;
        shape (0,) in inference.  Dtype as `save_mean` (``out[2]`` when
        given).

    Raises
    ------
    TypeError
        If an array argument is not an array (or has a dtype that is not
        supported or does not match), `training` is not a bool, `momentum`
        or `eps` is not a real number, `axis` is not an int, `out` is not a
        tuple of three, or a running statistic updated in training is not a
        NumPy array.
    ValueError
        If x has rank < 2, `axis` is out of range (numpy.exceptions.AxisError),
        a per-channel argument or an ``out`` entry has the wrong shape,
        `momentum` is not finite, `eps` is negative or NaN, training has only
        one value per channel or ``eps == 0``, a running statistic is missing
        in inference, one updated in place is read-only, or two outputs share
        memory.

    See Also
    --------
    batch_norm_backward : The gradients.

    Notes
    -----
    The statistics are computed in float64 from sums of shifted values and
    returned rounded to `save_mean` / `save_invstd`'s dtype; training's y
    keeps the float64 mean's precision.  A zero-size batch gives an empty y,
    NaN statistics and unchanged running statistics.
    """
    result = plain_batch_norm(x, weight, bias, running_mean, running_var, training, momentum,
                              eps, axis, out)
    if result is not None:
        return result
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps, axis,
                       out)


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps, axis, out):
    """batch_norm, past the plain case (unannotated: x and the others are
    rebound to the checked arrays)."""
    (x, policy, axis, C, n, training, momentum, eps, weight, bias, rm, rv) = batch_norm_args(
        x, weight, bias, running_mean, running_var, training, momentum, eps, axis)
    if training and n == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got x of "
                         f"shape {x.shape} with channel axis {axis}")
    if training and not eps > 0:     # torch.nn.functional.batch_norm refuses it too
        raise ValueError(f"eps must be positive during training, got {eps!r}")
    y_out, mean_out, invstd_out = split_out(out, ("y", "save_mean", "save_invstd"))
    y_out = check_big_out(y_out, "out[0] (y)", x.shape, x.dtype)
    stat_shape = (C,) if training else (0,)
    kmean, save_mean = small_out(mean_out, "out[1] (save_mean)", stat_shape, policy.stat)
    kinv, save_invstd = small_out(invstd_out, "out[2] (save_invstd)", stat_shape, policy.stat)
    # the kernels write y, then the statistics, then the running stats: an
    # input overlapping any of them is read from a private copy
    written = (y_out, mean_out, invstd_out) + ((rm, rv) if training else ())
    check_distinct(zip(("out[0] (y)", "out[1] (save_mean)", "out[2] (save_invstd)",
                        "running_mean", "running_var"), written))
    (x,) = unalias([x], written, keep=y_out)
    weight, bias = unalias([weight, bias], written)
    (kx,), order, dims = prepare([x], axis, (y_out,))
    ky, y = big_out(y_out, x.shape, x.dtype, order)
    batch_norm_into(kx, ky, weight, bias, rm, rv, kmean, kinv, dims, training, momentum, eps)
    return y, save_mean, save_invstd


def batch_norm_backward(grad_out: ArrayLike, x: ArrayLike, weight: Optional[ArrayLike],
                        running_mean: Optional[ArrayLike], running_var: Optional[ArrayLike],
                        save_mean: Optional[ArrayLike], save_invstd: Optional[ArrayLike],
                        training: bool, eps: Real = 1e-5,
                        output_mask: OutputMask = (True, True, True), axis: Axis = 1,
                        ) -> tuple[Optional[Array], Optional[Array], Optional[Array]]:
    """Gradients of batch_norm (torch.native_batch_norm_backward).

    Training uses save_mean and save_invstd; inference uses the running
    statistics (invstd = 1 / sqrt(running_var + eps)), as PyTorch does.  With
    n values per channel, sum_dy = sum(dy) and dotp = sum(dy * (x - mean))::

        grad_x = (dy - sum_dy / n - (x - mean) * invstd**2 * dotp / n) * invstd * w
                 (training; inference: dy * invstd * w)
        grad_weight = dotp * invstd,   grad_bias = sum_dy

    output_mask selects which of (grad_x, grad_weight, grad_bias) to compute;
    the others are None.  grad_weight and grad_bias have weight's dtype (the
    statistics' dtype when weight is None).

    Parameters
    ----------
    grad_out : array_like
        The gradient of the loss with respect to batch_norm's y (dy): x's
        shape and dtype.
    x : array_like
        batch_norm's input, rank >= 2, float64, float32, bfloat16 or
        float16.
    weight : array_like or None
        batch_norm's weight, shape (C,) with C = ``x.shape[axis]``: x's
        dtype, or float32 when x is 16-bit.  None stands for ones.
    running_mean : array_like or None
        The running mean batch_norm normalized with in inference, shape (C,),
        dtype as `weight`.  Required when `training` is False, not read
        otherwise.
    running_var : array_like or None
        The running variance, as `running_mean`.
    save_mean : array_like or None
        batch_norm's save_mean, shape (C,), any supported floating dtype.
        Required when `training` is True, not read otherwise.
    save_invstd : array_like or None
        batch_norm's save_invstd, as `save_mean`.
    training : bool
        Differentiate the training formula (batch statistics) or the
        inference one (running statistics).
    eps : float, default 1e-5
        >= 0.  Read in inference only (the training formula uses
        save_invstd, which holds it).
    output_mask : sequence of 3 bool, default (True, True, True)
        Which of (grad_x, grad_weight, grad_bias) to compute.
    axis : int, default 1
        The channel axis (-1 for channels-last layouts).

    Returns
    -------
    grad_x : numpy.ndarray or None
        x's shape and dtype; None when ``output_mask[0]`` is False.
    grad_weight : numpy.ndarray or None
        Shape (C,), weight's dtype (float64 for float64 x, float32 otherwise
        when weight is None); None when ``output_mask[1]`` is False.
    grad_bias : numpy.ndarray or None
        As `grad_weight`; None when ``output_mask[2]`` is False.

    Raises
    ------
    TypeError
        If an array argument is not an array or has a dtype that is not
        supported or does not match, `training` is not a bool, `eps` is not
        a real number, `axis` is not an int, or `output_mask` is not a
        sequence of bools.
    ValueError
        If x has rank < 2, `axis` is out of range, grad_out's shape is not
        x's, a per-channel argument has the wrong shape, `eps` is negative,
        `output_mask` does not have 3 entries, or a statistic the mode reads
        is None.

    See Also
    --------
    batch_norm : The forward.
    cynorm.aten.batch_norm_backward : The same, in ATen's generic argument order.
    """
    return backward(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd,
                    training, eps, output_mask, axis, BACKWARD_NAMES)


# How batch_norm_backward's errors spell the arguments that ATen's other
# backward ops (cynorm.aten's adapters over `backward`) spell differently.
BACKWARD_NAMES = {k: k for k in ("grad_out", "x", "save_invstd", "training", "eps")}


def backward(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, training,
             eps, output_mask, axis, names):
    """batch_norm_backward, its errors naming the arguments as `names` spells them."""
    result = plain_batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean,
                                       save_invstd, training, eps, output_mask, axis)
    if result is not None:
        return result
    x, policy, axis, C, n = channel_input(x, axis, names["x"])
    grad_out, _ = as_float_array(grad_out, names["grad_out"])
    check_same(grad_out, names["grad_out"], x.shape, x.dtype, ref=names["x"])
    training = check_bool(training, names["training"])
    eps = check_eps(eps, names["eps"])
    mask = check_mask(output_mask)
    weight = channel_vector(weight, "weight", C, policy)
    if training:
        first = channel_stat(save_mean, "save_mean", C)
        second = channel_stat(save_invstd, names["save_invstd"], C)
    else:
        if running_mean is None or running_var is None:
            raise ValueError(f"running_mean and running_var are required when "
                             f"{names['training']}=False")
        first = channel_vector(running_mean, "running_mean", C, policy)
        second = channel_vector(running_var, "running_var", C, policy)
    (kdy, kx), order, dims = prepare([grad_out, x], axis, ())
    kgx = grad_x = None
    if mask[0]:
        kgx, grad_x = big_out(None, x.shape, x.dtype, order)
    grad_weight, grad_bias = batch_norm_backward_into(kdy, kx, kgx, weight, first, second, dims,
                                                      training, eps, mask)
    return grad_x, grad_weight, grad_bias
