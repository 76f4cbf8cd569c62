"""JVP rules of the split-statistics batch-norm ops (cynorm.batchnorm_stats):
batch_norm_stats, batch_norm_gather_stats, batch_norm_elemt,
batch_norm_backward_reduce and batch_norm_backward_elemt.

PyTorch has no forward-mode formulas for these ops.  Unlike batch_norm's
rules, the statistics passed *into* an op here (mean, invstd, the all-reduced
sums) are independent arguments with tangents of their own: in a
synchronized step they come from other processes, so nothing recomputes
them from this shard's x.

Per channel, with xmu = x - mean, N the total count and, for a tangent t_a
of an argument a::

    batch_norm_stats:           t_mean = mean(t_x), t_invstd = -invstd**3 mean(xmu t_x)
    batch_norm_gather_stats:    the count-weighted mean and variance of the
                                shards' (mean, 1/invstd**2 - eps), differentiated
    batch_norm_elemt:           y = xmu invstd w + b
    batch_norm_backward_reduce: sum_dy = sum(dy), sum_dy_xmu = sum(dy xmu)
    batch_norm_backward_elemt:  grad_x = (dy - sum_dy/N - xmu invstd**2 sum_dy_xmu/N) invstd w
"""
import numpy as np

from cynorm import batchnorm_stats as _st
from cynorm.forward_ad._common import bind, cast_like, cube, m, math_dtype, zeros_like
from cynorm.forward_ad._registry import register_jvp
from cynorm.forward_ad.norm_rules import _channels, _update_in_place, _vec, _xhat_tangent
from cynorm._validation import check_updatable, normalize_dim


def _channel_view(args, dt):
    """(x as (A, C, B) in dt, axis, C) of a split op's x argument."""
    x = np.asarray(args["x"])      # the op took an array-like x too
    axis = normalize_dim(args["axis"], x.ndim, "axis")
    return _channels(x, axis, dt), axis, x.shape[axis]


def _kept(args, names):
    """Copies of the arguments an `out=` may share memory with (the op
    overwrites them in place); the arguments themselves otherwise."""
    aliased = args.get("out") is not None
    return {k: (np.array(args[k]) if aliased else args[k]) for k in names}


def _sum(a):
    """The per-channel sum of an (A, C, B) array, as (1, C, 1)."""
    return a.sum(axis=(0, 2), keepdims=True)


@register_jvp(_st.batch_norm_stats, nondiff=("eps", "axis"))
def _batch_norm_stats_jvp(primals, tangents, kwargs):
    args, t = bind(_st.batch_norm_stats, primals, tangents, kwargs)
    outs = mean, invstd = _st.batch_norm_stats(*primals, **kwargs)
    if t["x"] is None:
        return outs, zeros_like(outs)
    dt = math_dtype(np.asarray(args["x"]).dtype)
    X, axis, C = _channel_view(args, dt)
    if X.shape[0] * X.shape[2] == 0:     # an empty shard's statistics are NaN, and so are their tangents
        return outs, (np.full_like(mean, np.nan), np.full_like(invstd, np.nan))
    TX = _channels(t["x"], axis, dt)
    inv = _vec(invstd, dt, C)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        _, _, t_mean, a = _xhat_tangent(X, _vec(mean, dt, C), inv, TX, (0, 2))
        t_inv = -inv * inv * a
    return outs, (cast_like(t_mean.reshape(C), mean), cast_like(t_inv.reshape(C), invstd))


@register_jvp(_st.batch_norm_gather_stats, nondiff=("counts", "momentum", "eps"))
def _batch_norm_gather_stats_jvp(primals, tangents, kwargs):
    args, t = bind(_st.batch_norm_gather_stats, primals, tangents, kwargs)
    for i, name in ((3, "running_mean"), (4, "running_var")):
        if t[name] is not None:     # updated in place below, as the statistic
            check_updatable(t[name], f"tangents[{i}] (for {name})")
    outs = mean, invstd = _st.batch_norm_gather_stats(*primals, **kwargs)    # checks the arguments
    # (W, C) and (W,) arrays: float64 throughout costs nothing
    counts = np.asarray(args["counts"], np.float64).reshape(-1)
    used = counts > 0          # the op skips shards that hold no values
    n = counts[used][:, None]
    total = float(n.sum())
    M = m(args["mean"], np.float64)[used]
    S = m(args["invstd"], np.float64)[used]
    C = M.shape[1]
    TM = np.zeros_like(M) if t["mean"] is None else m(t["mean"], np.float64)[used]
    TS = np.zeros_like(S) if t["invstd"] is None else m(t["invstd"], np.float64)[used]
    inv = m(invstd, np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        mu = (n * M).sum(axis=0) / total
        t_mu = (n * TM).sum(axis=0) / total
        # var = sum(n_k (var_k + (mean_k - mu)**2)) / N with var_k = 1/invstd_k**2 - eps;
        # the t_mu term drops out (the deviations' weighted sum is 0)
        t_var = (n * (-2.0 * TS / cube(S) + 2.0 * (M - mu) * TM)).sum(axis=0) / total
        t_inv = -0.5 * cube(inv) * t_var
    if args["running_mean"] is not None and total > 0:
        mom = float(args["momentum"])
        _update_in_place(t["running_mean"], args["running_mean"], mom, t_mu)
        _update_in_place(t["running_var"], args["running_var"], mom, t_var * (total / (total - 1)))
    return outs, (cast_like(t_mu.reshape(C), mean), cast_like(t_inv.reshape(C), invstd))


@register_jvp(_st.batch_norm_elemt, nondiff=("eps", "axis"))
def _batch_norm_elemt_jvp(primals, tangents, kwargs):
    args, t = bind(_st.batch_norm_elemt, primals, tangents, kwargs)
    kept = _kept(args, ("x",))
    y = _st.batch_norm_elemt(*primals, **kwargs)
    if all(v is None for v in tangents):
        return y, zeros_like(y)
    dt = math_dtype(np.asarray(kept["x"]).dtype)
    X, axis, C = _channel_view(dict(args, x=kept["x"]), dt)
    mu, inv = _vec(args["mean"], dt, C), _vec(args["invstd"], dt, C)
    w = _vec(args["weight"], dt, C, 1.0)
    ty = np.zeros_like(X)
    with np.errstate(invalid="ignore", over="ignore"):
        if t["x"] is not None:
            ty += inv * w * _channels(t["x"], axis, dt)
        if t["mean"] is not None:
            ty -= inv * w * _vec(t["mean"], dt, C)
        if t["invstd"] is not None:
            ty += (X - mu) * w * _vec(t["invstd"], dt, C)
        if t["weight"] is not None:
            ty += (X - mu) * inv * _vec(t["weight"], dt, C)
        if t["bias"] is not None:
            ty += _vec(t["bias"], dt, C)
    return y, cast_like(ty.reshape(y.shape), y, fresh=True)


@register_jvp(_st.batch_norm_backward_reduce, nondiff=("input_g", "weight_g", "bias_g", "axis"),
              ignored=("weight",))
def _batch_norm_backward_reduce_jvp(primals, tangents, kwargs):
    """weight only picks grad_weight's and grad_bias's dtype: its tangent is
    accepted and dropped."""
    args, t = bind(_st.batch_norm_backward_reduce, primals, tangents, kwargs)
    outs = sum_dy, sum_dy_xmu, grad_weight, grad_bias = _st.batch_norm_backward_reduce(
        *primals, **kwargs)
    if all(t[k] is None for k in ("grad_out", "x", "mean", "invstd")):
        return outs, zeros_like(outs)
    dt = math_dtype(np.asarray(args["x"]).dtype)
    X, axis, C = _channel_view(args, dt)
    DY = _channels(args["grad_out"], axis, dt)
    mu, inv = _vec(args["mean"], dt, C), _vec(args["invstd"], dt, C)
    t_sdy = np.zeros((1, C, 1), dt)
    t_sdx = np.zeros((1, C, 1), dt)
    with np.errstate(invalid="ignore", over="ignore"):
        if t["grad_out"] is not None:
            TDY = _channels(t["grad_out"], axis, dt)
            t_sdy = _sum(TDY)
            t_sdx = _sum(TDY * (X - mu))
        if t["x"] is not None:
            t_sdx = t_sdx + _sum(DY * _channels(t["x"], axis, dt))
        if t["mean"] is not None:
            t_sdx = t_sdx - _sum(DY) * _vec(t["mean"], dt, C)
        t_gw = t_sdx * inv
        if t["invstd"] is not None:
            t_gw = t_gw + _sum(DY * (X - mu)) * _vec(t["invstd"], dt, C)
    tangents_out = (t_sdy, t_sdx, t_gw, t_sdy)
    return outs, tuple(None if o is None else cast_like(tt.reshape(C), o)
                       for o, tt in zip(outs, tangents_out))


@register_jvp(_st.batch_norm_backward_elemt, nondiff=("count", "axis"))
def _batch_norm_backward_elemt_jvp(primals, tangents, kwargs):
    args, t = bind(_st.batch_norm_backward_elemt, primals, tangents, kwargs)
    kept = _kept(args, ("x", "grad_out"))
    gx = _st.batch_norm_backward_elemt(*primals, **kwargs)
    if all(v is None for v in tangents):
        return gx, zeros_like(gx)
    dt = math_dtype(np.asarray(kept["x"]).dtype)
    X, axis, C = _channel_view(dict(args, x=kept["x"]), dt)
    DY = _channels(kept["grad_out"], axis, dt)
    total = float(np.sum(np.asarray(args["count"], np.float64)))
    mu, inv = _vec(args["mean"], dt, C), _vec(args["invstd"], dt, C)
    w = _vec(args["weight"], dt, C, 1.0)
    sdy, sdx = _vec(args["sum_dy"], dt, C), _vec(args["sum_dy_xmu"], dt, C)

    def tan(name):
        return None if t[name] is None else _vec(t[name], dt, C)
    t_inv, t_sdy, t_sdx, t_mu, t_w = (tan(k) for k in ("invstd", "sum_dy", "sum_dy_xmu", "mean",
                                                       "weight"))
    with np.errstate(invalid="ignore", over="ignore"):
        xmu = X - mu
        q = inv * inv * sdx / total          # grad_x = (dy - sum_dy/N - xmu q) a, a = invstd w
        a = inv * w
        t_inner = np.zeros_like(X)           # the tangent of (dy - sum_dy/N - xmu q)
        if t["grad_out"] is not None:
            t_inner += _channels(t["grad_out"], axis, dt)
        if t_sdy is not None:
            t_inner -= t_sdy / total
        if t["x"] is not None:
            t_inner -= _channels(t["x"], axis, dt) * q
        if t_mu is not None:
            t_inner += t_mu * q
        t_q = 0.0
        if t_inv is not None:
            t_q = t_q + 2.0 * inv * t_inv * sdx / total
        if t_sdx is not None:
            t_q = t_q + inv * inv * t_sdx / total
        t_inner -= xmu * t_q
        t_gx = t_inner * a
        t_a = 0.0
        if t_inv is not None:
            t_a = t_a + t_inv * w
        if t_w is not None:
            t_a = t_a + inv * t_w
        if t_inv is not None or t_w is not None:
            t_gx += (DY - sdy / total - xmu * q) * t_a
    return gx, cast_like(t_gx.reshape(gx.shape), gx, fresh=True)
