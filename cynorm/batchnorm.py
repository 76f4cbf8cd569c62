"""Batch normalization (Ioffe & Szegedy, 2015) on NumPy arrays, with
PyTorch's semantics (native_batch_norm and native_batch_norm_backward).

Each channel (index along ``axis``) is normalized with statistics over every
other axis — the batch and the spatial axes:

    y = (x - mean) * invstd * weight + bias,   invstd = 1 / sqrt(var + eps)

Conventions:

* ``axis`` is the channel axis: 1 for N,C,... layouts, -1 for channels-last
  (N,...,C); any rank >= 2.  x may have any strides and is never modified:
  C- and F-contiguous inputs are read in place, other layouts are copied once.
  Large outputs follow the input's order.
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
import numpy as np

from cynorm._arrays import big_out, check_big_out, check_distinct, small_out, unalias
from cynorm._channels import (
    affine, batch_norm_args, channel_input, channel_stat, channel_vector, fused_training,
    grad_input_into, grad_sums, invstd_of, moments, normalize_into, plain_batch_norm,
    plain_batch_norm_backward, prepare,
    training_backward_into, training_forward_into, update_running,
)
from cynorm._dtypes import from_float64
from cynorm._validation import as_float_array, check_bool, check_eps, check_mask, check_same, split_out

__all__ = ["batch_norm", "batch_norm_backward"]


def batch_norm(x, weight=None, bias=None, running_mean=None, running_var=None, training=True,
               momentum=0.1, eps=1e-5, axis=1, *, out=None):
    """Batch normalization (torch.native_batch_norm).

    Parameters
    ----------
    x : ndarray, rank >= 2 (float64, float32, bfloat16 or float16)
    weight, bias : ndarray (C,), optional
    running_mean, running_var : ndarray (C,), optional in training (updated
        in place when given), required in inference.
    training : bool, default True
    momentum : float, default 0.1
    eps : float >= 0, default 1e-5
    axis : int, default 1
        The channel axis (-1 for channels-last).
    out : tuple (y, save_mean, save_invstd), optional
        Arrays (or None entries) to write into.  y must be C- or F-contiguous.

    Returns
    -------
    y : ndarray, x's shape and dtype.
    save_mean, save_invstd : ndarray (C,) in training, (0,) in inference;
        float64 for float64 x, float32 otherwise.
    """
    if out is None:
        result = plain_batch_norm(x, weight, bias, running_mean, running_var, training, momentum,
                                  eps, axis)
        if result is not None:
            return result
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
    (kx,), transposed, dims = prepare([x], axis, (y_out,))
    ky, y = big_out(y_out, x.shape, x.dtype, transposed)
    if training and n > 0 and fused_training(dims, x.dtype.itemsize):
        mean, var = training_forward_into(kx, ky, weight, bias, kmean, kinv, dims, eps, policy)
        update_running(rm, rv, mean, var, n, momentum)
        return y, save_mean, save_invstd
    if training:
        mean, var = moments(kx, dims, policy, eps)
        kmean[...] = from_float64(mean, policy.stat)
        kinv[...] = from_float64(invstd_of(var, eps), policy.stat)
        # y: the float64 mean (save_mean is its rounding), the saved invstd
        m, inv = mean, kinv.astype(np.float64)
    else:
        m = rm.astype(np.float64)
        inv = invstd_of(rv.astype(np.float64), eps)
    normalize_into(kx, ky, m, *affine(inv, weight, bias, C), dims, policy)
    if training and n > 0:
        update_running(rm, rv, mean, var, n, momentum)
    return y, save_mean, save_invstd


def batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd,
                        training, eps=1e-5, output_mask=(True, True, True), axis=1):
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
        mean = channel_stat(save_mean, "save_mean", C)
        inv = channel_stat(save_invstd, names["save_invstd"], C)
    else:
        if running_mean is None or running_var is None:
            raise ValueError(f"running_mean and running_var are required when "
                             f"{names['training']}=False")
        mean = channel_vector(running_mean, "running_mean", C, policy).astype(np.float64)
        rv = channel_vector(running_var, "running_var", C, policy).astype(np.float64)
        inv = invstd_of(rv, eps)
    gdtype = weight.dtype if weight is not None else policy.stat
    (kdy, kx), transposed, dims = prepare([grad_out, x], axis, ())
    need_sums = mask[1] or mask[2] or (training and mask[0])
    grad_x = None
    fused = training and n > 0 and fused_training(dims, x.dtype.itemsize)
    if fused:
        kgx = None
        if mask[0]:
            kgx, grad_x = big_out(None, x.shape, x.dtype, transposed)
        sum_dy, dotp = training_backward_into(kdy, kx, kgx, weight, mean, inv, dims, policy)
    elif need_sums and n > 0:
        sum_dy, dotp = grad_sums(kdy, kx, mean, dims, policy)
    else:
        sum_dy = dotp = np.zeros(C)
    if mask[0] and not fused:
        kgx, grad_x = big_out(None, x.shape, x.dtype, transposed)
        a, zero = affine(inv, weight, None, C)
        if training:
            with np.errstate(divide="ignore", invalid="ignore"):
                grad_input_into(kdy, kx, kgx, sum_dy / n, mean, dotp / n * inv * inv, a, dims,
                                policy)
        else:
            normalize_into(kdy, kgx, zero, a, zero, dims, policy)
    with np.errstate(over="ignore", invalid="ignore"):   # float16 sums above 65504: inf
        grad_weight = from_float64(dotp * inv if n else np.zeros(C), gdtype) if mask[1] else None
        grad_bias = from_float64(sum_dy, gdtype) if mask[2] else None
    return grad_x, grad_weight, grad_bias
