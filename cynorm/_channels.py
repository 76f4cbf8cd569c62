"""The per-channel pieces that batch_norm, the split-statistics ops
(cynorm.batchnorm_stats) and sync batch norm (cynorm.distributed) share:
the checks of per-channel arguments, the calls into the batch-norm kernels
over (A, C, B) views, and the float64 arithmetic of the per-channel
coefficients.  Only this module calls the batch_norm kernel module's
batch-norm entries (groupnorm.py calls its group-norm ones)."""
import collections
import math

import numpy as np

from cynorm._arrays import check_distinct, kernel_dims, kernel_flat as _flat, layout
from cynorm._dtypes import from_float64
from cynorm import _kernels
_k = _kernels.load("batch_norm")  # the SIMD level chosen at import
from cynorm._kernels._runtime import get_num_threads as _threads
from cynorm._validation import (
    as_float_array, check_bool, check_eps, check_int, check_real, check_updatable, check_vector,
    normalize_dim,
)

# batch_norm and batch_norm_backward for plain arguments
# (cynorm/_kernels/_plain.pyx), or None
plain_batch_norm = _k.forward_plain
plain_batch_norm_backward = _k.backward_plain
# and the split-statistics ops (cynorm.batchnorm_stats)
plain_stats = _k.stats_plain
plain_gather_stats = _k.gather_stats_plain
plain_elemt = _k.elemt_plain
plain_backward_reduce = _k.backward_reduce_plain
plain_backward_elemt = _k.backward_elemt_plain

# _kernel(name, policy): the entry point for policy's storage type
_kernel = _kernels.by_storage(_k, ("channel_moments", "channel_grad_sums",
                                   "channel_normalize", "channel_grad_input"))


def native_abi() -> int:
    """The address of batch norm's raw-buffer table (cn_native_abi.h) in the
    kernel module of the SIMD level in use: what cynorm.torch's compiled
    operators call."""
    return _k.native_abi()


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
    """Kernel views of the x-shaped inputs, the order of their axes in
    memory (_arrays.layout), and (A, C, B)."""
    views, order = layout(list(arrays), outs)
    return views, order, kernel_dims(arrays[0].shape, axis, order)


def moments(kx, dims, policy, eps, passes=1):
    """Per-channel (mean, biased var) in float64 from the kernels' shifted
    sums; eps (what the variance will be added to) tells which channels
    need float64 squares.  passes: the calling op's passes over x (3 for a
    training forward, which normalizes next), for the kernel's thread count."""
    A, C, B = dims
    if A * B == 0:
        nan = np.full(C, np.nan)
        return nan, nan.copy()
    mean, var = np.empty(C), np.empty(C)
    _kernel("channel_moments", policy)(_flat(kx), mean, var, A, C, B, eps, _threads(), passes)
    return mean, var


def grad_sums(kdy, kx, mean, dims, policy):
    """Per-channel (sum dy, sum dy * (x - mean)) in float64; mean is float64."""
    A, C, B = dims
    s1, s2 = np.empty(C), np.empty(C)
    _kernel("channel_grad_sums", policy)(_flat(kdy), _flat(kx), as_math(mean, policy), s1, s2,
                                         A, C, B, _threads())
    return s1, s2


def normalize_into(kx, ky, m, s, t, dims, policy):
    """ky = (kx - m) * s + t per channel: s and t rounded once to the math
    type, m in full (the kernel keeps what rounding m drops, so y keeps the
    precision of a float64 mean of data far from zero)."""
    A, C, B = dims
    _kernel("channel_normalize", policy)(_flat(kx), _flat(ky), np.ascontiguousarray(m, np.float64),
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


def update_running(rm, rv, mean, var, n, momentum):
    """PyTorch's running-statistics rule, in float64, stored in place (each
    of rm, rv may be None): new = momentum * batch + (1 - momentum) * old,
    with the unbiased variance; a NaN stored as np.nan's bits, as the
    kernels store it (docs/guarantees.rst, Determinism)."""
    if rm is not None:
        rm[...] = from_float64(_np_nans(momentum * mean + (1.0 - momentum)
                                        * rm.astype(np.float64)), rm.dtype)
    if rv is not None:
        unbiased = var * (n / (n - 1))
        rv[...] = from_float64(_np_nans(momentum * unbiased + (1.0 - momentum)
                                        * rv.astype(np.float64)), rv.dtype)


def _np_nans(a):
    """a (a fresh float64 array) with every NaN as np.nan."""
    a[np.isnan(a)] = np.nan
    return a


def _running(a, name, C, policy, training):
    if a is not None and training:
        a = check_updatable(a, name)        # a DLPack tensor: read through DLPack once
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


def _kernel_vector(a):
    """A per-channel vector as the kernels take it: C-contiguous, its dtype
    kept (None stays None)."""
    return None if a is None else np.ascontiguousarray(a)


def batch_norm_into(kx, ky, weight, bias, rm, rv, kmean, kinv, dims, training, momentum, eps):
    """batch_norm's forward, the kernels' one composition (the plain case runs
    it too): ky, and in training kmean, kinv and the running statistics rm,
    rv (updated in place, each may be None)."""
    A, C, B = dims
    krm, krv = _kernel_vector(rm), _kernel_vector(rv)
    _k.batch_norm_forward(kx, ky, _kernel_vector(weight), _kernel_vector(bias), krm, krv,
                          kmean if training else None, kinv if training else None,
                          A, C, B, training, momentum, eps)
    if training:
        _written_back(rm, krm)
        _written_back(rv, krv)


def batch_norm_backward_into(kdy, kx, kgx, weight, first, second, dims, training, eps, mask):
    """batch_norm_backward, the kernels' one composition (the plain case runs
    it too): kgx (None: not wanted) and returns (grad_weight, grad_bias) as
    mask asks.  first, second: save_mean and save_invstd (training) or the
    running mean and variance, any float dtype (the kernels read them as
    float64: every supported dtype widens to it exactly)."""
    A, C, B = dims
    return _k.batch_norm_backward(kdy, kx, kgx, _kernel_vector(weight), _float64_vector(first),
                                  _float64_vector(second), A, C, B, training, eps, mask)


def _float64_vector(a):
    """A vector of statistics or counts as the kernels read it: float64,
    C-contiguous, aligned (every supported dtype widens to float64 exactly)."""
    return np.require(a, np.float64, ["C", "A", "E"])


def _written_back(given, updated):
    """An array updated in place through a C-contiguous copy (a strided view):
    the update written back."""
    if given is not None and updated is not given:
        given[...] = updated


def stats(kx, dims, eps):
    """batch_norm_stats, the kernels' one composition: (mean, invstd) in the
    math type (NaN where a channel has no values)."""
    A, C, B = dims
    return _k.batch_norm_stats(kx, A, C, B, eps)


def gather_stats(mean, invstd, counts, rm, rv, momentum, eps):
    """batch_norm_gather_stats, the kernels' one composition: (mean, invstd)
    of the merged shards, rm and rv (each may be None) updated in place."""
    krm, krv = _kernel_vector(rm), _kernel_vector(rv)
    native = [np.ascontiguousarray(a, a.dtype.newbyteorder("=")) for a in (mean, invstd)]
    result = _k.batch_norm_gather_stats(*native,
                                        _float64_vector(counts),
                                        krm, krv, momentum, eps)
    _written_back(rm, krm)
    _written_back(rv, krv)
    return result


def elemt_into(kx, ky, weight, bias, mean, invstd, dims):
    """batch_norm_elemt, the kernels' one composition: ky."""
    A, C, B = dims
    _k.batch_norm_elemt(kx, ky, _kernel_vector(weight), _kernel_vector(bias),
                        _float64_vector(mean), _float64_vector(invstd), A, C, B)


def backward_reduce(kdy, kx, mean, invstd, weight, dims, flags):
    """batch_norm_backward_reduce, the kernels' one composition: (sum_dy,
    sum_dy_xmu, grad_weight, grad_bias) as flags (input_g, weight_g, bias_g)
    ask."""
    A, C, B = dims
    return _k.batch_norm_backward_reduce(kdy, kx, _float64_vector(mean), _float64_vector(invstd),
                                         _kernel_vector(weight), A, C, B, *flags)


def backward_elemt_into(kdy, kx, kgx, mean, invstd, weight, sum_dy, sum_dy_xmu, total, dims):
    """batch_norm_backward_elemt, the kernels' one composition: kgx."""
    A, C, B = dims
    _k.batch_norm_backward_elemt(kdy, kx, kgx, _float64_vector(mean), _float64_vector(invstd),
                                 _kernel_vector(weight), _float64_vector(sum_dy),
                                 _float64_vector(sum_dy_xmu), total, A, C, B)
