"""JVP rules of group normalization and instance normalization, forward and
backward.

Per sample and group (means over the group's channels and positions), with
r = rstd, xhat = (x - mean) * r and a tangent tx (eps held fixed):

    t_mean = mean(tx)
    a      = mean(xhat * tx)
    t_r    = -r**2 * a
    t_xhat = r * (tx - t_mean - xhat * a)

Instance norm is group norm with a group per channel; with
use_input_stats=False its statistics are the running ones, whose tangents
flow through.  The backward rules recompute mean and r's dependence on x
from x itself (the saved statistics are taken for their values), as the
layer-norm rules do.  The tangent math runs in NumPy in the math dtype.
"""
import numpy as np

from cynorm import groupnorm as _gn
from cynorm.forward_ad._registry import register_jvp
from cynorm.forward_ad._common import (
    bind, cast_like, check_running_tangents, cube, m, math_dtype, zeros_like,
)
from cynorm.forward_ad.norm_rules import _update_in_place
from cynorm._validation import check_bool, normalize_dim


def _axis(x, axis):
    return normalize_dim(axis, x.ndim, "axis")


def _grouped(a, G, axis, dt):
    """a (x's shape) in dt as (N, G, D, HW)."""
    a = np.asarray(a)
    first = np.moveaxis(a, axis, 1) if axis != 1 else a
    N, C = first.shape[:2]
    return m(first, dt).reshape(N, G, C // G, -1)


def _ungrouped(v, like, axis):
    """_grouped's inverse, cast to like's dtype."""
    moved = (like.shape[0], like.shape[axis]) + tuple(
        s for i, s in enumerate(like.shape) if i not in (0, axis))
    first = v.reshape(moved)
    return cast_like(np.moveaxis(first, 1, axis) if axis != 1 else first, like, fresh=True)


def _param(a, G, dt):
    return None if a is None else m(a, dt).reshape(1, G, -1, 1)


def _gmean(v):
    n = v.shape[2] * v.shape[3]
    return v.sum(axis=(2, 3), keepdims=True) / n if n else np.zeros(v.shape[:2] + (1, 1), v.dtype)


def _stats(s, N, G, dt):
    return m(s, dt).reshape(N, G, 1, 1)


def _forward_tangents(x, G, axis, w, mean, rstd, t_x, t_w, t_b, dt):
    """(t_y, t_mean, t_rstd) as (N, G, D, HW) and (N, G, 1, 1) arrays."""
    X = _grouped(x, G, axis, dt)
    N = X.shape[0]
    mu, r = _stats(mean, N, G, dt), _stats(rstd, N, G, dt)
    xhat = (X - mu) * r
    wv = _param(w, G, dt)
    ty = np.zeros_like(X)
    t_mean = np.zeros_like(mu)
    t_rstd = np.zeros_like(r)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if t_x is not None:
            tx = _grouped(t_x, G, axis, dt)
            t_mean = _gmean(tx)
            a = _gmean(xhat * tx)
            t_rstd = -r * r * a
            t_xhat = r * (tx - t_mean - xhat * a)
            ty = t_xhat if wv is None else t_xhat * wv
        if t_w is not None:
            ty = ty + xhat * _param(t_w, G, dt)
        if t_b is not None:
            ty = ty + _param(t_b, G, dt)
    return ty, t_mean, t_rstd


@register_jvp(_gn.group_norm, nondiff=("num_groups", "eps", "axis"))
def _group_norm_jvp(primals, tangents, kwargs):
    args, t = bind(_gn.group_norm, primals, tangents, kwargs)
    x = np.array(args["x"]) if kwargs.get("out") is not None else np.asarray(args["x"])
    outs = _gn.group_norm(*primals, **kwargs)
    if all(v is None for v in tangents):
        return outs, zeros_like(outs)
    y, mean, rstd = outs
    G, axis = int(args["num_groups"]), _axis(x, args["axis"])
    ty, tm, tr = _forward_tangents(x, G, axis, args["weight"], mean, rstd, t["x"], t["weight"],
                                   t["bias"], math_dtype(x.dtype))
    return outs, (_ungrouped(ty, y, axis), cast_like(tm.reshape(mean.shape), mean),
                  cast_like(tr.reshape(rstd.shape), rstd))


def _backward_tangents(outs, dy, x, mean, rstd, w, G, axis, t_dy, t_x, t_w, fixed, t_mean,
                       t_rstd):
    """Tangents of (grad_x, grad_weight, grad_bias) = outs (None where masked
    off).  fixed: statistics that do not depend on x (t_mean, t_rstd their
    tangents), grad_x = dy * w * rstd."""
    dt = math_dtype(x.dtype)
    X, DY = _grouped(x, G, axis, dt), _grouped(dy, G, axis, dt)
    N, _, D, _ = X.shape
    mu, r = _stats(mean, N, G, dt), _stats(rstd, N, G, dt)
    wv = np.ones((1, G, D, 1), dt) if w is None else _param(w, G, dt)
    zero = np.zeros_like(X)
    TDY = zero if t_dy is None else _grouped(t_dy, G, axis, dt)
    TX = zero if t_x is None else _grouped(t_x, G, axis, dt)
    TW = np.zeros((1, G, D, 1), dt) if t_w is None else _param(t_w, G, dt)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        xhat = (X - mu) * r
        g, dg = DY * wv, TDY * wv + DY * TW
        if fixed:
            tm = zero[:, :, :1, :1] if t_mean is None else _stats(t_mean, N, G, dt)
            tr = zero[:, :, :1, :1] if t_rstd is None else _stats(t_rstd, N, G, dt)
            dxhat = (TX - tm) * r + (X - mu) * tr
            t_gx = dg * r + g * tr
        else:
            tm = _gmean(TX)
            a = _gmean(xhat * TX)
            tr = -r * r * a
            dxhat = r * (TX - tm - xhat * a)
            c = _gmean(g * xhat)
            dc = _gmean(dg * xhat + g * dxhat)
            t_gx = (tr * (g - _gmean(g) - xhat * c)
                    + r * (dg - _gmean(dg) - dxhat * c - xhat * dc))
        t_gw = (TDY * xhat + DY * dxhat).sum(axis=(0, 3)).reshape(-1)
        t_gb = TDY.sum(axis=(0, 3)).reshape(-1)
    tans = (None if outs[0] is None else _ungrouped(t_gx, outs[0], axis),
            None if outs[1] is None else cast_like(t_gw, outs[1], fresh=True),
            None if outs[2] is None else cast_like(t_gb, outs[2], fresh=True))
    return tans


@register_jvp(_gn.group_norm_backward, nondiff=("num_groups", "output_mask", "axis"),
              ignored=("mean", "rstd"))
def _group_norm_backward_jvp(primals, tangents, kwargs):
    args, t = bind(_gn.group_norm_backward, primals, tangents, kwargs)
    outs = _gn.group_norm_backward(*primals, **kwargs)
    if all(t[k] is None for k in ("grad_out", "x", "weight")):
        return outs, zeros_like(outs)
    x = np.asarray(args["x"])
    return outs, _backward_tangents(outs, args["grad_out"], x, args["mean"], args["rstd"],
                                    args["weight"], int(args["num_groups"]),
                                    _axis(x, args["axis"]), t["grad_out"], t["x"], t["weight"],
                                    False, None, None)


@register_jvp(_gn.instance_norm, nondiff=("use_input_stats", "momentum", "eps", "axis"))
def _instance_norm_jvp(primals, tangents, kwargs):
    args, t = bind(_gn.instance_norm, primals, tangents, kwargs)
    use_input_stats = check_bool(args["use_input_stats"], "use_input_stats")
    check_running_tangents(t, use_input_stats)      # updated in place below, as the statistics
    x = np.array(args["x"]) if kwargs.get("out") is not None else np.asarray(args["x"])
    outs = _gn.instance_norm(*primals, **kwargs)
    y, mean, rstd = outs
    axis = _axis(x, args["axis"])
    C = x.shape[axis]
    dt = math_dtype(x.dtype)
    if use_input_stats:
        ty, tm, tr = _forward_tangents(x, C, axis, args["weight"], mean, rstd, t["x"],
                                       t["weight"], t["bias"], dt)
        # rm = (1 - momentum) rm + momentum * mean over n of the instances'
        # means; rv likewise with their unbiased variances var * HW / (HW - 1)
        mom = float(args["momentum"])
        HW = y.size // max(y.shape[0] * C, 1)
        r = m(rstd, dt).reshape(tm.shape)
        t_var = -2.0 * tr / (r * r * r) if HW else tr
        _update_in_place(t["running_mean"], args["running_mean"], mom, tm.mean(axis=0).reshape(C))
        _update_in_place(t["running_var"], args["running_var"], mom,
                         (t_var.mean(axis=0) * (HW / max(HW - 1, 1))).reshape(C))
    else:
        X = _grouped(x, C, axis, dt)
        N = X.shape[0]
        mu, r = _stats(mean, N, C, dt), _stats(rstd, N, C, dt)
        wv = _param(args["weight"], C, dt)
        zero = np.zeros_like(mu)
        tm = zero if t["running_mean"] is None else np.broadcast_to(
            m(t["running_mean"], dt).reshape(1, C, 1, 1), mu.shape)
        tr = zero if t["running_var"] is None else np.broadcast_to(
            -0.5 * cube(r) * m(t["running_var"], dt).reshape(1, C, 1, 1), r.shape)
        TX = 0.0 if t["x"] is None else _grouped(t["x"], C, axis, dt)
        t_xhat = (TX - tm) * r + (X - mu) * tr
        ty = t_xhat if wv is None else t_xhat * wv
        if t["weight"] is not None:
            ty = ty + (X - mu) * r * _param(t["weight"], C, dt)
        if t["bias"] is not None:
            ty = ty + _param(t["bias"], C, dt)
        ty = np.broadcast_to(ty, X.shape)
    return outs, (_ungrouped(ty, y, axis), cast_like(tm.reshape(mean.shape), mean),
                  cast_like(tr.reshape(rstd.shape), rstd))


@register_jvp(_gn.instance_norm_backward, nondiff=("use_input_stats", "output_mask", "axis"))
def _instance_norm_backward_jvp(primals, tangents, kwargs):
    # use_input_stats: mean and rstd are x's (their tangents are dropped, the
    # rule differentiates them through x); False: they are constants of
    # their own, whose tangents count
    args, t = bind(_gn.instance_norm_backward, primals, tangents, kwargs)
    outs = _gn.instance_norm_backward(*primals, **kwargs)
    fixed = not check_bool(args["use_input_stats"], "use_input_stats")
    keys = ("grad_out", "x", "weight") + (("mean", "rstd") if fixed else ())
    if all(t[k] is None for k in keys):
        return outs, zeros_like(outs)
    x = np.asarray(args["x"])
    axis = _axis(x, args["axis"])
    return outs, _backward_tangents(outs, args["grad_out"], x, args["mean"], args["rstd"],
                                    args["weight"], x.shape[axis], axis, t["grad_out"], t["x"],
                                    t["weight"], fixed, t["mean"] if fixed else None,
                                    t["rstd"] if fixed else None)
