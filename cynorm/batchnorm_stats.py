"""The split-statistics pieces of batch norm, from which synchronized batch
norm is built (PyTorch: batch_norm_stats, batch_norm_gather_stats_with_counts,
batch_norm_elemt, batch_norm_backward_reduce, batch_norm_backward_elemt).

One training step over a batch split into shards (one per process)::

    mean_k, invstd_k = batch_norm_stats(x_k)                      # each shard
    mean, invstd = batch_norm_gather_stats(stack(mean_k), stack(invstd_k), counts)
    y_k = batch_norm_elemt(x_k, weight, bias, mean, invstd)
    # backward
    sum_dy_k, sum_dy_xmu_k, _, _ = batch_norm_backward_reduce(dy_k, x_k, mean, invstd, weight)
    sum_dy, sum_dy_xmu = sum over k                               # an all-reduce
    grad_x_k = batch_norm_backward_elemt(dy_k, x_k, mean, invstd, weight,
                                         sum_dy, sum_dy_xmu, counts)

gives the whole batch's batch_norm results.  Conventions (axis, dtypes,
strides) are those of cynorm.batch_norm.
"""
import numpy as np

from cynorm._arrays import big_out, check_big_out, check_distinct, unalias
from cynorm._channels import (
    affine, channel_input, channel_stat, channel_vector, grad_input_into, grad_sums, invstd_of,
    moments, normalize_into, prepare, update_running,
)
from cynorm._dtypes import from_float64
from cynorm._validation import (
    as_array, as_float_array, check_bool, check_eps, check_real, check_same, check_updatable,
    single_out,
)


__all__ = ["batch_norm_stats", "batch_norm_gather_stats", "batch_norm_elemt",
           "batch_norm_backward_reduce", "batch_norm_backward_elemt"]


def batch_norm_stats(x, eps=1e-5, axis=1):
    """Per-channel mean and invstd = 1 / sqrt(biased var + eps) of one shard.

    Returns (mean, invstd), each (C,): float64 for float64 x, float32 otherwise.
    A shard with no values gives NaN (batch_norm_gather_stats skips shards
    whose count is 0)."""
    x, policy, axis, C, n = channel_input(x, axis)
    eps = check_eps(eps)
    (kx,), _, dims = prepare([x], axis, ())
    mean, var = moments(kx, dims, policy, eps)
    return from_float64(mean, policy.stat), from_float64(invstd_of(var, eps), policy.stat)


def _counts(counts, name, W=None):
    """Per-shard value counts as float64: a 1-D array (of length W when
    given) or, with W None, also a single number; finite and >= 0."""
    c = as_array(counts, name)
    if c.dtype.kind not in "iuf":
        raise TypeError(f"{name} must hold numbers (one count per shard), got dtype {c.dtype}")
    if W is not None and c.shape != (W,):
        raise ValueError(f"{name} must have shape ({W},) (one count per shard), got {c.shape}")
    if c.ndim > 1:
        raise ValueError(f"{name} must be a number or a 1-D array of counts, got shape {c.shape}")
    c = c.astype(np.float64).reshape(-1)
    if not (np.all(np.isfinite(c)) and np.all(c >= 0)):
        raise ValueError(f"{name} must be finite and >= 0")
    return c


def chan_merge(na, ma, m2a, nb, mb, m2b):
    """Chan et al.'s merge of two groups' (count, mean, sum of squared
    deviations), counts > 0 or one of them 0, in float64: (n, mean, M2).

    Written symmetrically in a and b, so merging either way round gives the
    same bits (cynorm.distributed relies on it: every rank of an MPI
    reduction must end with the same statistics)."""
    n = na + nb
    d = mb - ma
    return n, ma * (na / n) + mb * (nb / n), (m2a + m2b) + d * d * (na * nb / n)


def batch_norm_gather_stats(mean, invstd, counts, running_mean=None, running_var=None,
                            momentum=0.1, eps=1e-5):
    """Combine per-shard statistics into the whole batch's
    (torch.batch_norm_gather_stats_with_counts).

    Parameters
    ----------
    mean, invstd : ndarray (W, C)
        batch_norm_stats of each of W shards, one row per shard.
    counts : array-like (W,)
        Values per channel in each shard (shards with count 0 are skipped).
    running_mean, running_var : ndarray (C,), optional
        Updated in place: new = (1 - momentum) * old + momentum * batch, with
        the whole batch's unbiased variance.
    momentum, eps : as in batch_norm (eps must be the one the shards used).

    Returns
    -------
    mean, invstd : (C,) in mean's dtype (float32 if it is 16-bit).

    The shards merge in order with Chan's pairwise update, in float64.
    """
    m, _ = as_float_array(mean, "mean")
    s, _ = as_float_array(invstd, "invstd")
    if m.ndim != 2:
        raise ValueError(f"mean must have shape (shards, channels), got {m.shape}")
    W, C = m.shape
    check_same(s, "invstd", m.shape, s.dtype, ref="mean")
    counts = _counts(counts, "counts", W)
    momentum = check_real(momentum, "momentum")
    eps = check_eps(eps)
    out_dtype = m.dtype if m.dtype.itemsize >= 4 else np.dtype(np.float32)
    rm = rv = None
    if running_mean is not None or running_var is not None:
        if running_mean is None or running_var is None:
            raise ValueError("running_mean and running_var must be given together")
        rm = check_updatable(running_mean, "running_mean")
        rv = check_updatable(running_var, "running_var")
        for a, name in ((rm, "running_mean"), (rv, "running_var")):
            as_float_array(a, name)
            if a.shape != (C,):
                raise ValueError(f"{name} must have shape ({C},), got {a.shape}")
        check_distinct([("running_mean", rm), ("running_var", rv)])
    m64, s64 = m.astype(np.float64), s.astype(np.float64)
    total = 0.0
    mu = np.zeros(C)
    m2 = np.zeros(C)          # sum of squared deviations
    for k in range(W):
        nk = counts[k]
        if nk == 0:
            continue
        var_k = 1.0 / (s64[k] * s64[k]) - eps
        total, mu, m2 = chan_merge(total, mu, m2, nk, m64[k], var_k * nk)
    if total == 0:
        nan = np.full(C, np.nan)
        return nan.astype(out_dtype), nan.astype(out_dtype)
    var = m2 / total
    if rm is not None:
        if total <= 1:
            raise ValueError("Expected more than 1 value per channel when training, got "
                             f"counts summing to {total:g} (the values the shards hold in all)")
        update_running(rm, rv, mu, var, total, momentum)
    return from_float64(mu, out_dtype), from_float64(invstd_of(var, eps), out_dtype)


def batch_norm_elemt(x, weight, bias, mean, invstd, eps=1e-5, axis=1, *, out=None):
    """y = (x - mean) * invstd * weight + bias per channel (torch.batch_norm_elemt).

    weight and bias may be None; eps is unused (invstd already holds it) and
    kept for PyTorch's signature.  ``out`` is an array of x's shape and dtype
    (or a tuple of one), C- or F-contiguous; it may be x itself (in place)."""
    x, policy, axis, C, _ = channel_input(x, axis)
    check_eps(eps)
    weight = channel_vector(weight, "weight", C, policy)
    bias = channel_vector(bias, "bias", C, policy)
    m = channel_stat(mean, "mean", C)
    inv = channel_stat(invstd, "invstd", C)
    y_out = check_big_out(single_out(out), "out", x.shape, x.dtype)
    (x,) = unalias([x], (y_out,), keep=y_out)
    (kx,), transposed, dims = prepare([x], axis, (y_out,))
    ky, y = big_out(y_out, x.shape, x.dtype, transposed)
    normalize_into(kx, ky, m, *affine(inv, weight, bias, C), dims, policy)
    return y


def batch_norm_backward_reduce(grad_out, x, mean, invstd, weight, input_g=True, weight_g=True,
                               bias_g=True, axis=1):
    """One shard's backward sums (torch.batch_norm_backward_reduce).

    Returns (sum_dy, sum_dy_xmu, grad_weight, grad_bias), each (C,):
    sum_dy = sum(dy) and sum_dy_xmu = sum(dy * (x - mean)) when input_g
    (statistics' dtype: float64 for float64 x, float32 otherwise);
    grad_weight = sum_dy_xmu * invstd when weight_g and grad_bias = sum_dy
    when bias_g (weight's dtype, or the statistics' dtype without weight).
    Entries not asked for are None."""
    x, policy, axis, C, n = channel_input(x, axis)
    grad_out, _ = as_float_array(grad_out, "grad_out")
    check_same(grad_out, "grad_out", x.shape, x.dtype, ref="x")
    flags = [check_bool(input_g, "input_g"), check_bool(weight_g, "weight_g"),
             check_bool(bias_g, "bias_g")]
    weight = channel_vector(weight, "weight", C, policy)
    m = channel_stat(mean, "mean", C)
    inv = channel_stat(invstd, "invstd", C)
    gdtype = weight.dtype if weight is not None else policy.stat
    if n > 0 and any(flags):
        (kdy, kx), _, dims = prepare([grad_out, x], axis, ())
        sum_dy, sum_dy_xmu = grad_sums(kdy, kx, m, dims, policy)
    else:
        sum_dy = sum_dy_xmu = np.zeros(C)
    return (from_float64(sum_dy, policy.stat) if flags[0] else None,
            from_float64(sum_dy_xmu, policy.stat) if flags[0] else None,
            from_float64(sum_dy_xmu * inv, gdtype) if flags[1] else None,
            from_float64(sum_dy, gdtype) if flags[2] else None)


def batch_norm_backward_elemt(grad_out, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count,
                              axis=1, *, out=None):
    """One shard's grad_x from the all-reduced sums (torch.batch_norm_backward_elemt).

        grad_x = (dy - sum_dy / N - (x - mean) * invstd**2 * sum_dy_xmu / N) * invstd * weight

    N = sum(count): count is the per-shard counts (as given to
    batch_norm_gather_stats) or their total.  ``out``: an array of x's shape
    and dtype (or a tuple of one), C- or F-contiguous; it may be grad_out or
    x itself (in place)."""
    x, policy, axis, C, _ = channel_input(x, axis)
    grad_out, _ = as_float_array(grad_out, "grad_out")
    check_same(grad_out, "grad_out", x.shape, x.dtype, ref="x")
    weight = channel_vector(weight, "weight", C, policy)
    m = channel_stat(mean, "mean", C)
    inv = channel_stat(invstd, "invstd", C)
    sdy = channel_stat(sum_dy, "sum_dy", C)
    sdx = channel_stat(sum_dy_xmu, "sum_dy_xmu", C)
    total = float(np.sum(_counts(count, "count")))
    if not total > 0:
        raise ValueError(f"count must add up to a positive number, got {total:g}")
    gx_out = check_big_out(single_out(out), "out", x.shape, x.dtype)
    grad_out, x = unalias([grad_out, x], (gx_out,), keep=gx_out)
    (kdy, kx), transposed, dims = prepare([grad_out, x], axis, (gx_out,))
    kgx, gx = big_out(gx_out, x.shape, x.dtype, transposed)
    a, _ = affine(inv, weight, None, C)
    grad_input_into(kdy, kx, kgx, sdy / total, m, sdx / total * inv * inv, a, dims, policy)
    return gx
