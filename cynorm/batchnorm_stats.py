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
from __future__ import annotations

from typing import Optional

import numpy as np

from cynorm._arrays import big_out, check_big_out, check_distinct, unalias
from cynorm._channels import (
    backward_elemt_into, backward_reduce, channel_input, channel_stat, channel_vector, elemt_into,
    gather_stats, plain_backward_elemt, plain_backward_reduce, plain_elemt, plain_gather_stats,
    plain_stats, prepare, stats,
)
from cynorm._typing import Array, ArrayLike, Axis, OutArray, Real
from cynorm._validation import (
    as_array, as_float_array, check_bool, check_eps, check_real, check_same, check_updatable,
    single_out,
)


__all__ = ["batch_norm_stats", "batch_norm_gather_stats", "batch_norm_elemt",
           "batch_norm_backward_reduce", "batch_norm_backward_elemt"]


def batch_norm_stats(x: ArrayLike, eps: Real = 1e-5, axis: Axis = 1) -> tuple[Array, Array]:
    """Per-channel mean and invstd of one shard (torch.batch_norm_stats).

    invstd = 1 / sqrt(biased var + eps), the statistics batch_norm would
    compute over this shard alone.

    Parameters
    ----------
    x : array_like
        This shard of the batch, rank >= 2, float64, float32, bfloat16 or
        float16; any strides, never modified.
    eps : float, default 1e-5
        Added to the variance before the square root; >= 0.  Pass the same
        eps to batch_norm_gather_stats.
    axis : int, default 1
        The channel axis (-1 for channels-last layouts).

    Returns
    -------
    mean : numpy.ndarray
        Per-channel mean, shape (C,) with C = ``x.shape[axis]``: float64 for
        float64 x, float32 otherwise.
    invstd : numpy.ndarray
        Per-channel ``1 / sqrt(biased var + eps)``, shape and dtype as `mean`.

    Raises
    ------
    TypeError
        If x is not an array of a supported floating dtype, `eps` is not a
        real number or `axis` is not an int.
    ValueError
        If x has rank < 2, `axis` is out of range or `eps` is negative.

    Notes
    -----
    A shard with no values gives NaN (batch_norm_gather_stats skips shards
    whose count is 0).
    """
    result = plain_stats(x, eps, axis)
    if result is not None:
        return result
    x, policy, axis, C, n = channel_input(x, axis)
    eps = check_eps(eps)
    (kx,), _, dims = prepare([x], axis, ())
    return stats(kx, dims, eps)


def _counts(counts: ArrayLike, name: str, W: Optional[int] = None) -> Array:
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


def batch_norm_gather_stats(mean: ArrayLike, invstd: ArrayLike, counts: ArrayLike,
                            running_mean: Optional[Array] = None,
                            running_var: Optional[Array] = None, momentum: Real = 0.1,
                            eps: Real = 1e-5) -> tuple[Array, Array]:
    """Combine per-shard statistics into the whole batch's.

    torch.batch_norm_gather_stats_with_counts: the mean and invstd the whole
    batch would have, from batch_norm_stats' results of each shard and the
    shards' value counts.

    Parameters
    ----------
    mean : array_like
        batch_norm_stats' mean of each of W shards, one row per shard: shape
        (W, C), float64, float32, bfloat16 or float16.
    invstd : array_like
        batch_norm_stats' invstd of each shard, mean's shape (any supported
        floating dtype).
    counts : array_like
        Values per channel in each shard, shape (W,), numbers that are
        finite and >= 0 (shards with count 0 are skipped).
    running_mean : numpy.ndarray, optional
        Running mean, shape (C,), any supported floating dtype; **updated in
        place** when given: new = (1 - momentum) * old + momentum * batch.
        Given together with `running_var`; writeable, native byte order.
    running_var : numpy.ndarray, optional
        Running variance, as `running_mean`; **updated in place** with the
        whole batch's unbiased variance.
    momentum : float, default 0.1
        As in batch_norm: the weight of the batch in the running statistics'
        update; finite.
    eps : float, default 1e-5
        As in batch_norm (it must be the one the shards used); >= 0.

    Returns
    -------
    mean : numpy.ndarray
        The whole batch's per-channel mean, shape (C,), in mean's dtype
        (float32 if it is 16-bit).
    invstd : numpy.ndarray
        The whole batch's ``1 / sqrt(biased var + eps)``, as `mean`.  Both
        are NaN when the counts add up to 0 (the running statistics are then
        left unchanged).

    Raises
    ------
    TypeError
        If mean, invstd or a running statistic has an unsupported dtype,
        counts does not hold numbers, a running statistic is not a NumPy
        array, or `momentum` or `eps` is not a real number.
    ValueError
        If mean is not 2-D, invstd's shape is not mean's, counts does not
        have shape (W,) or holds a negative or non-finite count, only one
        running statistic is given, a running statistic has the wrong
        shape, is read-only or shares memory with the other, `momentum` is
        not finite, `eps` is negative, or the running statistics are given
        and the counts add up to no more than 1 (but more than 0).

    Notes
    -----
    The shards merge in order with Chan's pairwise update, in float64.
    """
    result = plain_gather_stats(mean, invstd, counts, running_mean, running_var, momentum, eps)
    if result is not None:
        return result
    m, _ = as_float_array(mean, "mean")
    s, _ = as_float_array(invstd, "invstd")
    if m.ndim != 2:
        raise ValueError(f"mean must have shape (shards, channels), got {m.shape}")
    W, C = m.shape
    check_same(s, "invstd", m.shape, s.dtype, ref="mean")
    counts = _counts(counts, "counts", W)
    momentum = check_real(momentum, "momentum")
    eps = check_eps(eps)
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
    total = 0.0
    for nk in counts.tolist():      # in shard order, as the merge adds them
        total += nk
    if rm is not None and 0 < total <= 1:
        raise ValueError("Expected more than 1 value per channel when training, got "
                         f"counts summing to {total:g} (the values the shards hold in all)")
    return gather_stats(m, s, counts, rm, rv, momentum, eps)


def batch_norm_elemt(x: ArrayLike, weight: Optional[ArrayLike], bias: Optional[ArrayLike],
                     mean: ArrayLike, invstd: ArrayLike, eps: Real = 1e-5, axis: Axis = 1, *,
                     out: OutArray = None) -> Array:
    """Normalize one shard with given statistics (torch.batch_norm_elemt).

    y = (x - mean) * invstd * weight + bias per channel.

    Parameters
    ----------
    x : array_like
        This shard, rank >= 2, float64, float32, bfloat16 or float16; any
        strides, never modified (unless it is `out`).
    weight : array_like or None
        Per-channel scale, shape (C,) with C = ``x.shape[axis]``: x's dtype,
        or float32 when x is 16-bit.  None scales by 1.
    bias : array_like or None
        Per-channel shift, as `weight`.  None shifts by 0.
    mean : array_like
        The whole batch's per-channel mean (batch_norm_gather_stats), shape
        (C,), any supported floating dtype.
    invstd : array_like
        The whole batch's per-channel invstd, as `mean`.
    eps : float, default 1e-5
        Unused (invstd already holds it) and kept for PyTorch's signature;
        it must still be a real number >= 0.
    axis : int, default 1
        The channel axis (-1 for channels-last layouts).
    out : numpy.ndarray or tuple of one, optional
        An array of x's shape and dtype to write y into, C- or
        F-contiguous; it may be x itself (in place).

    Returns
    -------
    numpy.ndarray
        y, x's shape and dtype (`out` when given).

    Raises
    ------
    TypeError
        If an array argument or `out` has an unsupported or mismatched
        dtype, `eps` is not a real number, `axis` is not an int, or `out` is
        a tuple of more than one entry.
    ValueError
        If x has rank < 2, `axis` is out of range, `eps` is negative, mean or
        invstd is None, a per-channel argument has the wrong shape, or `out`
        has the wrong shape, is read-only or not C- or F-contiguous.
    """
    result = plain_elemt(x, weight, bias, mean, invstd, eps, axis, out)
    if result is not None:
        return result
    return _elemt(x, weight, bias, mean, invstd, eps, axis, out)


def _elemt(x, weight, bias, mean, invstd, eps, axis, out):
    """batch_norm_elemt (unannotated: x and the others are rebound to the
    checked arrays)."""
    x, policy, axis, C, _ = channel_input(x, axis)
    check_eps(eps)
    weight = channel_vector(weight, "weight", C, policy)
    bias = channel_vector(bias, "bias", C, policy)
    m = channel_stat(mean, "mean", C)
    inv = channel_stat(invstd, "invstd", C)
    y_out = check_big_out(single_out(out), "out", x.shape, x.dtype)
    (x,) = unalias([x], (y_out,), keep=y_out)
    (kx,), order, dims = prepare([x], axis, (y_out,))
    ky, y = big_out(y_out, x.shape, x.dtype, order)
    elemt_into(kx, ky, weight, bias, m, inv, dims)
    return y


def batch_norm_backward_reduce(grad_out: ArrayLike, x: ArrayLike, mean: ArrayLike,
                               invstd: ArrayLike, weight: Optional[ArrayLike],
                               input_g: bool = True, weight_g: bool = True,
                               bias_g: bool = True, axis: Axis = 1,
                               ) -> tuple[Optional[Array], Optional[Array], Optional[Array],
                                          Optional[Array]]:
    """One shard's backward sums (torch.batch_norm_backward_reduce).

    sum_dy = sum(dy) and sum_dy_xmu = sum(dy * (x - mean)) per channel over
    this shard; summed over the shards (an all-reduce) they feed
    batch_norm_backward_elemt.

    Parameters
    ----------
    grad_out : array_like
        This shard's dy, x's shape and dtype.
    x : array_like
        This shard's input, rank >= 2, float64, float32, bfloat16 or
        float16.
    mean : array_like
        The whole batch's per-channel mean, shape (C,) with
        C = ``x.shape[axis]``, any supported floating dtype.
    invstd : array_like
        The whole batch's per-channel invstd, as `mean`.
    weight : array_like or None
        Per-channel scale, shape (C,): x's dtype, or float32 when x is
        16-bit.  It sets grad_weight's and grad_bias's dtype.
    input_g : bool, default True
        Compute sum_dy and sum_dy_xmu.
    weight_g : bool, default True
        Compute grad_weight.
    bias_g : bool, default True
        Compute grad_bias.
    axis : int, default 1
        The channel axis (-1 for channels-last layouts).

    Returns
    -------
    sum_dy : numpy.ndarray or None
        sum(dy) per channel, shape (C,), in the statistics' dtype (float64
        for float64 x, float32 otherwise); None unless `input_g`.
    sum_dy_xmu : numpy.ndarray or None
        sum(dy * (x - mean)) per channel, as `sum_dy`; None unless `input_g`.
    grad_weight : numpy.ndarray or None
        sum_dy_xmu * invstd, shape (C,), in weight's dtype (the statistics'
        dtype without weight); None unless `weight_g`.
    grad_bias : numpy.ndarray or None
        sum_dy, as `grad_weight`; None unless `bias_g`.

    Raises
    ------
    TypeError
        If an array argument has an unsupported or mismatched dtype, a flag
        is not a bool, or `axis` is not an int.
    ValueError
        If x has rank < 2, `axis` is out of range, grad_out's shape is not
        x's, mean or invstd is None, or a per-channel argument has the
        wrong shape.
    """
    result = plain_backward_reduce(grad_out, x, mean, invstd, weight, input_g, weight_g, bias_g,
                                   axis)
    if result is not None:
        return result
    return _backward_reduce(grad_out, x, mean, invstd, weight, input_g, weight_g, bias_g, axis)


def _backward_reduce(grad_out, x, mean, invstd, weight, input_g, weight_g, bias_g, axis):
    """batch_norm_backward_reduce (unannotated: x and the others are rebound
    to the checked arrays)."""
    x, policy, axis, C, n = channel_input(x, axis)
    grad_out, _ = as_float_array(grad_out, "grad_out")
    check_same(grad_out, "grad_out", x.shape, x.dtype, ref="x")
    flags = [check_bool(input_g, "input_g"), check_bool(weight_g, "weight_g"),
             check_bool(bias_g, "bias_g")]
    weight = channel_vector(weight, "weight", C, policy)
    m = channel_stat(mean, "mean", C)
    inv = channel_stat(invstd, "invstd", C)
    (kdy, kx), _, dims = prepare([grad_out, x], axis, ())
    return backward_reduce(kdy, kx, m, inv, weight, dims, flags)


def batch_norm_backward_elemt(grad_out: ArrayLike, x: ArrayLike, mean: ArrayLike,
                              invstd: ArrayLike, weight: Optional[ArrayLike], sum_dy: ArrayLike,
                              sum_dy_xmu: ArrayLike, count: ArrayLike, axis: Axis = 1, *,
                              out: OutArray = None) -> Array:
    """One shard's grad_x from the all-reduced sums (torch.batch_norm_backward_elemt).

    With N = sum(count)::

        grad_x = (dy - sum_dy / N - (x - mean) * invstd**2 * sum_dy_xmu / N) * invstd * weight

    Parameters
    ----------
    grad_out : array_like
        This shard's dy, x's shape and dtype.
    x : array_like
        This shard's input, rank >= 2, float64, float32, bfloat16 or
        float16.
    mean : array_like
        The whole batch's per-channel mean, shape (C,) with
        C = ``x.shape[axis]``, any supported floating dtype.
    invstd : array_like
        The whole batch's per-channel invstd, as `mean`.
    weight : array_like or None
        Per-channel scale, shape (C,): x's dtype, or float32 when x is
        16-bit.  None scales by 1.
    sum_dy : array_like
        sum(dy) per channel over the whole batch (batch_norm_backward_reduce's
        sum_dy summed over the shards), shape (C,), any supported floating
        dtype.
    sum_dy_xmu : array_like
        sum(dy * (x - mean)) per channel over the whole batch, as `sum_dy`.
    count : array_like
        The per-shard counts (as given to batch_norm_gather_stats) or their
        total: a number or a 1-D array of numbers, finite and >= 0, adding up
        to N > 0.
    axis : int, default 1
        The channel axis (-1 for channels-last layouts).
    out : numpy.ndarray or tuple of one, optional
        An array of x's shape and dtype to write grad_x into, C- or
        F-contiguous; it may be grad_out or x itself (in place).

    Returns
    -------
    numpy.ndarray
        grad_x, x's shape and dtype (`out` when given).

    Raises
    ------
    TypeError
        If an array argument or `out` has an unsupported or mismatched
        dtype, count does not hold numbers, `axis` is not an int, or `out`
        is a tuple of more than one entry.
    ValueError
        If x has rank < 2, `axis` is out of range, grad_out's shape is not
        x's, mean, invstd, sum_dy or sum_dy_xmu is None, a per-channel
        argument has the wrong shape, count is not a number or a 1-D array,
        holds a negative or non-finite value or does not add up to a
        positive number, or `out` has the wrong shape, is read-only or not
        C- or F-contiguous.
    """
    result = plain_backward_elemt(grad_out, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count,
                                  axis, out)
    if result is not None:
        return result
    return _backward_elemt(grad_out, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count, axis,
                           out)


def _backward_elemt(grad_out, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count, axis, out):
    """batch_norm_backward_elemt (unannotated: x and the others are rebound
    to the checked arrays)."""
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
    # no sharing kept: where a float32 term overflows, grad_x's elements are
    # recomputed from grad_out and x after the pass wrote them (exact_input_grad_)
    grad_out, x = unalias([grad_out, x], (gx_out,))
    (kdy, kx), order, dims = prepare([grad_out, x], axis, (gx_out,))
    kgx, gx = big_out(gx_out, x.shape, x.dtype, order)
    backward_elemt_into(kdy, kx, kgx, m, inv, weight, sdy, sdx, total, dims)
    return gx
