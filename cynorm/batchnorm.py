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
  spread) and returned in float32 (float64 for float64 x).
* A zero-size batch gives an empty y, NaN statistics, unchanged running
  statistics and zero grad_weight/grad_bias.  A NaN or inf makes only its own
  channel non-finite.  Results are bitwise identical at any thread count.
"""
import collections
import math

import numpy as np

from cynorm._arrays import (
    big_out, check_big_out, check_distinct, kernel_dims, kernel_flat as _flat, layout, small_out,
    streaming_threshold, unalias,
)
from cynorm._dtypes import from_float64
from cynorm import _kernels
_k = _kernels.load("batch_norm")  # the SIMD level chosen at import
from cynorm._kernels._runtime import get_num_threads as _threads
from cynorm._validation import (
    as_float_array, check_bool, check_eps, check_int, check_mask, check_real, check_same,
    check_updatable, check_vector,
    normalize_dim, split_out,
)

__all__ = ["batch_norm", "batch_norm_backward"]

_k.set_stream_min_bytes(streaming_threshold())

# _kernel(name, policy): the entry point for policy's storage type
_kernel = _kernels.by_storage(_k, ("training_forward", "training_backward",
                                   "channel_moments", "channel_grad_sums",
                                   "channel_normalize", "channel_grad_input"))


# ---- shared by batch_norm* here and the split-statistics ops -------------

def channel_input(x, axis, name="x"):
    """x checked (floating, rank >= 2); returns (x, policy, axis wrapped, C, n)
    where n is the number of values per channel."""
    x, policy = as_float_array(x, name)
    if x.ndim < 2:
        raise ValueError(f"{name} must have at least 2 dimensions (a batch axis and a "
                         f"channel axis), got shape {x.shape}")
    axis = normalize_dim(check_int(axis, "axis", "an int (the channel axis)"), x.ndim, "axis")
    C = x.shape[axis]
    n = math.prod(x.shape) // C if C else math.prod(x.shape[:axis] + x.shape[axis + 1:])
    return x, policy, axis, C, n


def channel_vector(a, name, C, policy):
    """A per-channel parameter (weight, bias, running stats): None or (C,)
    of x's dtype or float32 for 16-bit x."""
    if a is None:
        return None
    return check_vector(a, name, C, policy.coefficients, "channel")


def channel_stat(a, name, C):
    """A per-channel statistic (mean, invstd, sums) of any float dtype, as float64."""
    if a is None:
        raise ValueError(f"{name} is required, got None")
    a, _ = as_float_array(a, name)
    if a.shape != (C,):
        raise ValueError(f"{name} must have shape ({C},) (one value per channel), got {a.shape}")
    return a.astype(np.float64)


def as_math(a, policy):
    """float64 values rounded to the math type (what the kernels compute with)."""
    return np.asarray(a, np.float64).astype(policy.math).astype(np.float64)


def prepare(arrays, axis, outs):
    """Kernel views of the x-shaped inputs, whether they are transposed
    (F order), and (A, C, B)."""
    views, transposed = layout(list(arrays), outs)
    return views, transposed, kernel_dims(arrays[0].shape, axis, transposed)


def moments(kx, dims, policy, eps):
    """Per-channel (mean, biased var) in float64 from the kernels' shifted
    sums; eps (what the variance will be added to) tells which channels
    need float64 squares."""
    A, C, B = dims
    if A * B == 0:
        nan = np.full(C, np.nan)
        return nan, nan.copy()
    mean, var = np.empty(C), np.empty(C)
    _kernel("channel_moments", policy)(_flat(kx), mean, var, A, C, B, eps, _threads())
    return mean, var


def grad_sums(kdy, kx, mean, dims, policy):
    """Per-channel (sum dy, sum dy * (x - mean)) in float64; mean is float64."""
    A, C, B = dims
    s1, s2 = np.empty(C), np.empty(C)
    _kernel("channel_grad_sums", policy)(_flat(kdy), _flat(kx), as_math(mean, policy), s1, s2,
                                         A, C, B, _threads())
    return s1, s2


def normalize_into(kx, ky, m, s, t, dims, policy):
    """ky = (kx - m) * s + t per channel (float64 coefficients, rounded once)."""
    A, C, B = dims
    _kernel("channel_normalize", policy)(_flat(kx), _flat(ky), as_math(m, policy),
                                         as_math(s, policy), as_math(t, policy), A, C, B,
                                         _threads())


def grad_input_into(kdy, kx, kgx, p, m, q, a, dims, policy):
    """kgx = (kdy - p - (kx - m) * q) * a per channel."""
    A, C, B = dims
    _kernel("channel_grad_input", policy)(_flat(kdy), _flat(kx), _flat(kgx), as_math(p, policy),
                                          as_math(m, policy), as_math(q, policy),
                                          as_math(a, policy), A, C, B, _threads())


def invstd_of(var, eps):
    """1 / sqrt(var + eps) in float64 (inf for a zero variance and eps = 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 / np.sqrt(var + eps)


def affine(inv, weight, bias, C):
    """Per-channel (scale, shift) of y = (x - mean) * scale + shift."""
    scale = inv if weight is None else inv * weight.astype(np.float64)
    shift = np.zeros(C) if bias is None else bias.astype(np.float64)
    return scale, shift


def math_vector(a, policy):
    """A per-channel parameter as a contiguous math-type vector, or None."""
    return None if a is None else np.ascontiguousarray(a, dtype=policy.math).reshape(-1)


def update_running(rm, rv, mean, var, n, momentum):
    """PyTorch's running-statistics rule, in float64, stored in place (each
    of rm, rv may be None): new = momentum * batch + (1 - momentum) * old,
    with the unbiased variance."""
    if rm is not None:
        rm[...] = from_float64(momentum * mean + (1.0 - momentum) * rm.astype(np.float64),
                               rm.dtype)
    if rv is not None:
        unbiased = var * (n / (n - 1))
        rv[...] = from_float64(momentum * unbiased + (1.0 - momentum) * rv.astype(np.float64),
                               rv.dtype)


# ---- the public ops ---------------------------------------------------------

def _running(a, name, C, policy, training):
    if a is not None and training:
        check_updatable(a, name)
    return channel_vector(a, name, C, policy)


BatchNormArgs = collections.namedtuple(
    "BatchNormArgs", "x policy axis C n training momentum eps weight bias rm rv")


def batch_norm_args(x, weight, bias, running_mean, running_var, training, momentum, eps, axis):
    """The argument checks batch_norm and cynorm.distributed's sync_batch_norm share."""
    x, policy, axis, C, n = channel_input(x, axis)
    training = check_bool(training, "training")
    momentum = check_real(momentum, "momentum")
    eps = check_eps(eps)
    weight = channel_vector(weight, "weight", C, policy)
    bias = channel_vector(bias, "bias", C, policy)
    rm = _running(running_mean, "running_mean", C, policy, training)
    rv = _running(running_var, "running_var", C, policy, training)
    if not training and (rm is None or rv is None):
        raise ValueError("running_mean and running_var are required when training=False")
    if training:
        check_distinct([("running_mean", rm), ("running_var", rv)])   # both updated in place
    return BatchNormArgs(x, policy, axis, C, n, training, momentum, eps, weight, bias, rm, rv)


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
    A, _, B = dims
    if training and n > 0 and _k.fused_training(A, C, B, x.dtype.itemsize):
        # one pass per channel: statistics, then y while the channel is in cache
        mean, var = np.empty(C), np.empty(C)
        _kernel("training_forward", policy)(_flat(kx), _flat(ky), math_vector(weight, policy),
                                            math_vector(bias, policy), _flat(kmean),
                                            _flat(kinv), mean, var, A, C, B, eps, _threads())
        update_running(rm, rv, mean, var, n, momentum)
        return y, save_mean, save_invstd
    if training:
        mean, var = moments(kx, dims, policy, eps)
        kmean[...] = from_float64(mean, policy.stat)
        kinv[...] = from_float64(invstd_of(var, eps), policy.stat)
        m, inv = kmean.astype(np.float64), kinv.astype(np.float64)
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
    n values per channel, sum_dy = sum(dy) and dotp = sum(dy * (x - mean)):

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
    A, _, B = dims
    grad_x = None
    fused = training and n > 0 and _k.fused_training(A, C, B, x.dtype.itemsize)
    if fused:
        # one pass per channel: the sums, then grad_x while the channel is in cache
        sum_dy, dotp = np.empty(C), np.empty(C)
        kgx = None
        if mask[0]:
            kgx, grad_x = big_out(None, x.shape, x.dtype, transposed)
        _kernel("training_backward", policy)(_flat(kdy), _flat(kx), _flat(kgx),
                                             math_vector(weight, policy),
                                             mean.astype(policy.math), inv.astype(policy.math),
                                             sum_dy, dotp, A, C, B, _threads())
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
