"""JVP rules of cynorm's normalization ops: weight norm, layer norm, batch norm,
forward and backward.

Notation: per normalized group (a layer-norm row, a batch-norm channel, a
weight-norm slice) xhat = (x - mean) * r with r = rstd / invstd, and for a
tangent tx of x

    a      = mean(xhat * tx)
    t_mean = mean(tx)
    t_r    = -r**2 * a                       (eps held fixed)
    t_xhat = r * (tx - t_mean - xhat * a)

The backward rules recompute mean from x (and use the saved r, which equals
the recomputed one), as PyTorch's decompositions for forward-mode AD do.
"""
import math

import numpy as np

from cynorm import batchnorm as _bn
from cynorm import layernorm as _ln
from cynorm import weightnorm as _wn
from cynorm.forward_ad._registry import register_jvp
from cynorm.forward_ad._common import (
    bind, cast_like, check_running_tangents, cube, m, math_dtype, tangent_sum, zeros_like,
)
from cynorm._validation import check_bool, normalize_dim


def _axes(axes):
    return (axes,) if np.ndim(axes) == 0 else tuple(axes)


def _group_size(shape, axes):
    """The number of elements in one group reduced over `axes` (an int or a tuple)."""
    return math.prod(shape[i] for i in _axes(axes))


def _group_mean(a, axes):
    """The mean over `axes`; 0 for empty groups: the mean of no values is the
    constant 0 the primal ops return (np.mean's 0/0 would make it NaN)."""
    n = _group_size(a.shape, axes)
    if n == 0:
        axes = _axes(axes)
        return np.zeros(tuple(1 if i in axes else n for i, n in enumerate(a.shape)), a.dtype)
    # np.mean's arithmetic (a float sum, then one division by n) without its
    # Python wrapper
    return a.sum(axis=axes, keepdims=True) / n


def _xhat_tangent(X, mean, r, TX, axes):
    """(t_xhat, t_mean, a) of a group normalization; X, TX in math dtype."""
    xhat = (X - mean) * r
    t_mean = _group_mean(TX, axes)
    a = _group_mean(xhat * TX, axes)
    return xhat, r * (TX - t_mean - xhat * a), t_mean, a


# ------------------------------------------------------------------ layer norm
def _ln_rows(x, normalized_shape):
    k = 1 if np.ndim(normalized_shape) == 0 else len(normalized_shape)
    return math.prod(x.shape[:x.ndim - k]), math.prod(x.shape[x.ndim - k:])


@register_jvp(_ln.layer_norm, nondiff=("normalized_shape", "eps"))
def _layer_norm_jvp(primals, tangents, kwargs):
    args, t = bind(_ln.layer_norm, primals, tangents, kwargs)
    x = np.array(args["x"]) if kwargs.get("out") is not None else args["x"]  # out may be x's memory
    outs = _ln.layer_norm(*primals, **kwargs)
    y, mean, rstd = outs
    x, w = np.asarray(x), args["weight"]     # the op took an array-like x too
    if all(v is None for v in tangents):
        return outs, zeros_like(outs)
    M, N = _ln_rows(np.asarray(x), args["normalized_shape"])
    dt = math_dtype(x.dtype)
    X = m(x, dt).reshape(M, N)
    mu, r = m(mean, dt).reshape(M, 1), m(rstd, dt).reshape(M, 1)
    wv = None if w is None else m(w, dt).reshape(N)
    ty = np.zeros((M, N), dt)
    t_mean = t_rstd = np.zeros((M, 1), dt)
    with np.errstate(invalid="ignore", divide="ignore"):
        if t["x"] is not None:
            xhat, t_xhat, t_mean, a = _xhat_tangent(X, mu, r, m(t["x"], dt).reshape(M, N), 1)
            ty = t_xhat * wv if wv is not None else t_xhat
            t_rstd = -r * r * a
        else:
            xhat = (X - mu) * r
        if t["weight"] is not None:
            ty = ty + xhat * m(t["weight"], dt).reshape(N)
        if t["bias"] is not None:
            ty = ty + m(t["bias"], dt).reshape(N)
    return outs, (cast_like(ty.reshape(y.shape), y), cast_like(t_mean.reshape(mean.shape), mean),
                  cast_like(t_rstd.reshape(rstd.shape), rstd))


def _layer_norm_backward_tangents(dy, x, rstd, w, t_dy, t_x, t_w, mask, M, N, dt):
    """Tangents of (grad_x, grad_weight, grad_bias) of layer_norm_backward:
    x's shape in dt, (N,) and (N,) in float64; None where masked off.  One fused
    kernel pass per row (layer_norm.pyx); cynorm.reference has the NumPy twin."""
    def c(a, shape):
        return None if a is None else np.ascontiguousarray(a, dtype=dt).reshape(shape)
    t_gx = np.empty(np.shape(x), dt) if mask[0] else None     # x's shape: no reshape (copy) later
    t_gw = np.zeros(N) if mask[1] else None
    t_gb = np.zeros(N) if mask[2] else None
    _ln.backward_jvp_kernel(c(dy, (M, N)), c(x, (M, N)), c(rstd, (M,)), c(w, (N,)),
                            c(t_dy, (M, N)), c(t_x, (M, N)), c(t_w, (N,)), t_gx, t_gw, t_gb, M, N)
    return t_gx, t_gw, t_gb


@register_jvp(_ln.layer_norm_backward, nondiff=("normalized_shape", "output_mask"),
              ignored=("mean", "rstd", "bias"))
def _layer_norm_backward_jvp(primals, tangents, kwargs):
    args, t = bind(_ln.layer_norm_backward, primals, tangents, kwargs)
    outs = _ln.layer_norm_backward(*primals, **kwargs)
    if all(t[k] is None for k in ("grad_out", "x", "weight")):
        return outs, zeros_like(outs)
    x = np.asarray(args["x"])     # the op took an array-like x too
    M, N = _ln_rows(x, args["normalized_shape"])
    mask = [o is not None for o in outs]
    with np.errstate(invalid="ignore", divide="ignore"):
        tg = _layer_norm_backward_tangents(args["grad_out"], x, args["rstd"], args["weight"],
                                          t["grad_out"], t["x"], t["weight"], mask, M, N,
                                          math_dtype(x.dtype))
    return outs, tuple(None if o is None else cast_like(tt, o, fresh=True)
                       for o, tt in zip(outs, tg))


@register_jvp(_ln.add_layer_norm, nondiff=("normalized_shape", "eps"))
def _add_layer_norm_jvp(primals, tangents, kwargs):
    # h = x + residual, then layer_norm(h): its rule with t_h = t_x + t_residual
    args, t = bind(_ln.add_layer_norm, primals, tangents, kwargs)
    outs = _ln.add_layer_norm(*primals, **kwargs)
    y, h, mean, rstd = outs
    if all(v is None for v in tangents):
        return outs, zeros_like(outs)
    t_h = tangent_sum(t["x"], t["residual"], math_dtype(h.dtype))
    _, (ty, tmean, trstd) = _layer_norm_jvp(
        (h, args["normalized_shape"], args["weight"], args["bias"]),
        (t_h, None, t["weight"], t["bias"]), {"eps": args["eps"]})
    return outs, (ty, cast_like(np.zeros(h.shape) if t_h is None else t_h, h), tmean, trstd)


@register_jvp(_ln.add_layer_norm_backward, nondiff=("normalized_shape", "output_mask"),
              ignored=("mean", "rstd", "bias"))
def _add_layer_norm_backward_jvp(primals, tangents, kwargs):
    # layer_norm_backward's rule at h, plus t_grad_h in grad_input's tangent
    args, t = bind(_ln.add_layer_norm_backward, primals, tangents, kwargs)
    outs = _ln.add_layer_norm_backward(*primals, **kwargs)
    if all(t[k] is None for k in ("grad_out", "grad_h", "h", "weight")):
        return outs, zeros_like(outs)
    h = np.asarray(args["h"])
    M, N = _ln_rows(h, args["normalized_shape"])
    mask = [o is not None for o in outs]
    dt = math_dtype(h.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        tg = list(_layer_norm_backward_tangents(args["grad_out"], h, args["rstd"], args["weight"],
                                                t["grad_out"], t["h"], t["weight"], mask, M, N,
                                                dt))
    if tg[0] is not None and t["grad_h"] is not None:
        tg[0] = tg[0] + m(t["grad_h"], dt).reshape(tg[0].shape)
    return outs, tuple(None if o is None else cast_like(tt, o, fresh=True)
                       for o, tt in zip(outs, tg))


# ------------------------------------------------------------------ batch norm
def _channels(a, axis, dt):
    """a in dtype dt viewed as (A, C, B) around the channel axis."""
    a = m(a, dt)
    A = int(np.prod(a.shape[:axis], dtype=np.int64))
    return a.reshape(A, a.shape[axis], int(np.prod(a.shape[axis + 1:], dtype=np.int64)))


def _vec(a, dt, C, fill=None):
    if a is None:
        return None if fill is None else np.full((1, C, 1), fill, dt)
    return m(a, dt).reshape(1, C, 1)


@register_jvp(_bn.batch_norm, nondiff=("training", "momentum", "eps", "axis"))
def _batch_norm_jvp(primals, tangents, kwargs):
    args, t = bind(_bn.batch_norm, primals, tangents, kwargs)
    training = check_bool(args["training"], "training")
    check_running_tangents(t, training)      # updated in place below, as the statistics
    outs = _bn.batch_norm(*primals, **kwargs)    # checks the arguments
    x = np.asarray(args["x"])     # the op took an array-like x too
    axis = normalize_dim(args["axis"], x.ndim, "axis")
    rm, rv = args["running_mean"], args["running_var"]
    dt = math_dtype(x.dtype)
    y, save_mean, save_invstd = outs
    C = x.shape[axis]
    X = _channels(x, axis, dt)
    n = X.shape[0] * X.shape[2]
    w = _vec(args["weight"], dt, C, 1.0)
    tw, tb = _vec(t["weight"], dt, C), _vec(t["bias"], dt, C)
    TX = None if t["x"] is None else _channels(t["x"], axis, dt)
    t_mean = np.zeros(save_mean.shape, dt)
    t_inv = np.zeros(save_invstd.shape, dt)
    with np.errstate(invalid="ignore", divide="ignore"):
        if training:
            mu, inv = _vec(save_mean, dt, C), _vec(save_invstd, dt, C)
            xhat = (X - mu) * inv
            ty = np.zeros_like(X)
            if TX is not None:
                xhat, t_xhat, tm, a = _xhat_tangent(X, mu, inv, TX, (0, 2))
                ty = w * t_xhat
                t_mean = tm.reshape(C)
                t_inv = (-inv * inv * a).reshape(C)
                # the update rm = (1 - momentum) rm + momentum mean, and
                # rv likewise with the unbiased variance var * n / (n - 1)
                mom = float(args["momentum"])
                t_var = (2.0 * a / inv).reshape(C)
                _update_in_place(t["running_mean"], rm, mom, t_mean)
                _update_in_place(t["running_var"], rv, mom, t_var * (n / (n - 1)))
            else:
                for name, arr in (("running_mean", rm), ("running_var", rv)):
                    _update_in_place(t[name], arr, float(args["momentum"]), 0.0)
        else:
            # eval leaves the running statistics as they were
            mu = m(rm, dt).reshape(1, C, 1)
            inv = m(1.0 / np.sqrt(m(rv, np.float64) + float(args["eps"])), dt).reshape(1, C, 1)
            xhat = (X - mu) * inv
            ty = np.zeros_like(X)
            if TX is not None:
                ty = ty + w * inv * TX
            if t["running_mean"] is not None:
                ty = ty - w * inv * m(t["running_mean"], dt).reshape(1, C, 1)
            if t["running_var"] is not None:
                ty = ty - 0.5 * w * xhat * inv * inv * m(t["running_var"], dt).reshape(1, C, 1)
        if tw is not None:
            ty = ty + tw * xhat
        if tb is not None:
            ty = ty + tb
    return outs, (cast_like(ty.reshape(y.shape), y), cast_like(t_mean, save_mean),
                  cast_like(t_inv, save_invstd))


def _update_in_place(t_run, run, momentum, t_stat):
    """The tangent of a running statistic updated as run = (1 - m) run + m stat."""
    if t_run is None or run is None:
        return
    new = (1.0 - momentum) * t_run.astype(np.float64) + momentum * np.asarray(t_stat, np.float64)
    t_run[...] = new.astype(np.float32).astype(t_run.dtype) if t_run.dtype != np.float64 else new


def batch_norm_backward_tangents(dy, x, weight, mean, inv, training, t, axis, mask, dt):
    """Tangents of (grad_x, grad_weight, grad_bias) of batch_norm_backward as
    math-dtype arrays ((A, C, B), (C,), (C,); None where masked off).
    `mean`/`inv`: the running mean and 1/sqrt(running_var + eps) in eval,
    the saved invstd in training (the mean is then recomputed from x)."""
    X, DY = _channels(x, axis, dt), _channels(dy, axis, dt)
    C = X.shape[1]
    w = _vec(weight, dt, C, 1.0)
    TDY = None if t["grad_out"] is None else _channels(t["grad_out"], axis, dt)
    TX = None if t["x"] is None else _channels(t["x"], axis, dt)
    tw = _vec(t["weight"], dt, C)
    inv = m(inv, dt).reshape(1, C, 1)
    t_gx = np.zeros_like(X) if mask[0] else None
    t_gw = np.zeros(C, dt) if mask[1] else None
    t_gb = np.zeros(C, dt) if mask[2] else None
    if TDY is not None and mask[2]:
        t_gb += TDY.sum(axis=(0, 2))
    if training:
        mu = X.mean(axis=(0, 2), keepdims=True)           # recomputed, as the seed does
        xhat = (X - mu) * inv
        c = (DY * xhat).mean(axis=(0, 2), keepdims=True)
        core = DY - DY.mean(axis=(0, 2), keepdims=True) - xhat * c
        if TX is not None:
            _, t_xhat, _, a = _xhat_tangent(X, mu, inv, TX, (0, 2))
            if mask[0]:
                dc = (DY * t_xhat).mean(axis=(0, 2), keepdims=True)
                t_gx += w * inv * (-inv * a * core - t_xhat * c - xhat * dc)
            if mask[1]:
                t_gw += (DY * t_xhat).sum(axis=(0, 2))
        if TDY is not None:
            if mask[0]:
                t_gx += w * inv * (TDY - TDY.mean(axis=(0, 2), keepdims=True)
                                   - xhat * (TDY * xhat).mean(axis=(0, 2), keepdims=True))
            if mask[1]:
                t_gw += (TDY * xhat).sum(axis=(0, 2))
        if tw is not None and mask[0]:
            t_gx += tw * inv * core
        return t_gx, t_gw, t_gb
    # eval: grad_x = dy * inv * w, grad_weight = sum(dy * (x - running_mean)) * inv
    mu = m(mean, dt).reshape(1, C, 1)
    t_inv = 0.0
    if t["running_var"] is not None:
        t_inv = -0.5 * cube(inv) * m(t["running_var"], dt).reshape(1, C, 1)
    if mask[0]:
        if TDY is not None:
            t_gx += TDY * inv * w
        if tw is not None:
            t_gx += DY * inv * tw
        if t["running_var"] is not None:
            t_gx += DY * t_inv * w
    if mask[1]:
        if TDY is not None:
            t_gw += (TDY * (X - mu)).sum(axis=(0, 2)) * inv.reshape(C)
        if TX is not None:
            t_gw += (DY * TX).sum(axis=(0, 2)) * inv.reshape(C)
        if t["running_mean"] is not None:
            t_gw -= DY.sum(axis=(0, 2)) * m(t["running_mean"], dt) * inv.reshape(C)
        if t["running_var"] is not None:
            t_gw += (DY * (X - mu)).sum(axis=(0, 2)) * np.reshape(t_inv, C)
    return t_gx, t_gw, t_gb


@register_jvp(_bn.batch_norm_backward, nondiff=("training", "eps", "output_mask", "axis"),
              ignored=("save_mean", "save_invstd"))
def _batch_norm_backward_jvp(primals, tangents, kwargs):
    args, t = bind(_bn.batch_norm_backward, primals, tangents, kwargs)
    outs = _bn.batch_norm_backward(*primals, **kwargs)
    return outs, batch_norm_backward_output_tangents(args, t, outs)


def batch_norm_backward_output_tangents(args, t, outs):
    """The tangents of batch_norm_backward's outputs `outs`; `args` and `t`
    map its argument names to the (checked) arguments and their tangents.
    ATen's adapters (cynorm.aten) share it."""
    training = bool(args["training"])
    used = ("grad_out", "x", "weight") + (() if training else ("running_mean", "running_var"))
    if all(t[k] is None for k in used):
        return zeros_like(outs)
    x = np.asarray(args["x"])     # the op took an array-like x too
    axis = normalize_dim(args["axis"], x.ndim, "axis")
    dt = math_dtype(x.dtype)
    if training:
        mean, inv = None, m(args["save_invstd"], np.float64)
    else:
        mean = m(args["running_mean"], np.float64)
        inv = 1.0 / np.sqrt(m(args["running_var"], np.float64) + float(args["eps"]))
    mask = [o is not None for o in outs]
    with np.errstate(invalid="ignore", divide="ignore"):
        tg = batch_norm_backward_tangents(args["grad_out"], x, args["weight"], mean, inv, training,
                                          t, axis, mask, dt)
    return tuple(None if o is None else cast_like(tt, o, fresh=True) for o, tt in zip(outs, tg))


# ----------------------------------------------------------------- weight norm
def _wn_axes(v, dim):
    dim = normalize_dim(dim, v.ndim)
    axes = tuple(range(v.ndim)) if dim is None else tuple(i for i in range(v.ndim) if i != dim)
    return dim, axes


def _wn_tangents(v, g, dim, tv, tg, dt):
    """(t_w, t_norm) of w = g v / ||v|| in math dtype; norm in keepdims shape."""
    _, axes = _wn_axes(v, dim)
    V = m(v, dt)
    n = np.sqrt((V * V).sum(axis=axes, keepdims=True))
    G = m(g, dt).reshape(n.shape)
    t_w = np.zeros_like(V)
    t_n = np.zeros_like(n)
    if tv is not None:
        TV = m(tv, dt)
        if _group_size(V.shape, axes):      # an empty slice's norm is the constant 0
            t_n = (V * TV).sum(axis=axes, keepdims=True) / n
        t_w = G * (TV / n - V * (t_n / (n * n)))
    if tg is not None:
        t_w = t_w + m(tg, dt).reshape(n.shape) * V / n
    return t_w, t_n


@register_jvp(_wn.norm_except_dim, nondiff=("pow", "dim"))
def _norm_except_dim_jvp(primals, tangents, kwargs):
    """d||v||_p = sum(sign(v) (|v| / n)**(p - 1) tv) for 0 < p < inf (terms
    with v == 0 and slices with n == 0 add nothing); for p = inf the mean of
    sign(v) tv over the entries where |v| reaches the norm (ties share it,
    as in PyTorch's norm_jvp)."""
    args, t = bind(_wn.norm_except_dim, primals, tangents, kwargs)
    out = kwargs.get("out")
    v = np.array(args["v"]) if out is not None else args["v"]    # out may be v's memory
    n = _wn.norm_except_dim(*primals, **kwargs)
    if t["v"] is None:
        return n, zeros_like(n)
    v = np.asarray(v)
    dt = math_dtype(v.dtype)
    p = float(args["pow"])
    _, axes = _wn_axes(v, args["dim"])
    V, TV = m(v, dt), m(t["v"], dt)
    # the norm again in the math dtype (a 16-bit result rounds too coarsely)
    N = m(_wn.norm_except_dim(V, p, args["dim"]), dt).reshape(
        tuple(1 if i in axes else s for i, s in enumerate(V.shape)))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if np.isinf(p):
            at_max = (np.abs(V) == N).astype(dt)
            t_n = (np.sign(V) * TV * at_max).sum(axis=axes, keepdims=True) / at_max.sum(
                axis=axes, keepdims=True)
        elif p == 1.0:
            t_n = (np.sign(V) * TV).sum(axis=axes, keepdims=True)
        else:
            weight = np.where(V == 0, 0.0, np.sign(V) * (np.abs(V) / N) ** (p - 1.0))
            t_n = (weight.astype(dt, copy=False) * TV).sum(axis=axes, keepdims=True)
        t_n = np.where(N == 0, 0.0, t_n)
    return n, cast_like(t_n.reshape(n.shape), n)


@register_jvp(_wn.weight_norm, nondiff=("dim",))
def _weight_norm_jvp(primals, tangents, kwargs):
    args, t = bind(_wn.weight_norm, primals, tangents, kwargs)
    w = _wn.weight_norm(*primals, **kwargs)
    v = np.asarray(args["v"])     # the op took an array-like v too
    with np.errstate(invalid="ignore", divide="ignore"):
        t_w, _ = _wn_tangents(v, args["g"], args["dim"], t["v"], t["g"], math_dtype(v.dtype))
    return w, cast_like(t_w, w)


@register_jvp(_wn.weight_norm_interface, nondiff=("dim",))
def _weight_norm_interface_jvp(primals, tangents, kwargs):
    args, t = bind(_wn.weight_norm_interface, primals, tangents, kwargs)
    w, norm = _wn.weight_norm_interface(*primals, **kwargs)
    v = np.asarray(args["v"])     # the op took an array-like v too
    with np.errstate(invalid="ignore", divide="ignore"):
        t_w, t_n = _wn_tangents(v, args["g"], args["dim"], t["v"], t["g"], math_dtype(v.dtype))
    return (w, norm), (cast_like(t_w, w), cast_like(t_n.reshape(norm.shape), norm))


@register_jvp(_wn.weight_norm_backward, nondiff=("dim",), ignored=("saved_norm",))
def _weight_norm_backward_jvp(primals, tangents, kwargs):
    """PyTorch's _weight_norm_differentiable_backward: the saved norm is ||v||."""
    args, t = bind(_wn.weight_norm_backward, primals, tangents, kwargs)
    outs = _wn.weight_norm_backward(*primals, **kwargs)
    grad_v, grad_g = outs
    v = np.asarray(args["saved_v"])     # the op took an array-like saved_v too
    dt = math_dtype(v.dtype)
    _, axes = _wn_axes(v, args["dim"])
    V, GW = m(v, dt), m(args["grad_w"], dt)
    n = np.sqrt((V * V).sum(axis=axes, keepdims=True))
    G = m(args["saved_g"], dt).reshape(n.shape)
    s = (GW * V).sum(axis=axes, keepdims=True)
    tv, tgw, tg = t["saved_v"], t["grad_w"], t["saved_g"]
    t_n = np.zeros_like(n) if tv is None else (V * m(tv, dt)).sum(axis=axes, keepdims=True) / n
    t_s = np.zeros_like(n)
    if tgw is not None:
        t_s = t_s + (m(tgw, dt) * V).sum(axis=axes, keepdims=True)
    if tv is not None:
        t_s = t_s + (GW * m(tv, dt)).sum(axis=axes, keepdims=True)
    TG = np.zeros_like(n) if tg is None else m(tg, dt).reshape(n.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        n3 = cube(n)
        # grad_g = s / n;  grad_v = (g / n) grad_w - (g s / n**3) v
        t_gg = t_s / n - s * t_n / (n * n)
        coef_gw = TG / n - G * t_n / (n * n)
        coef_v = TG * s / n3 + G * t_s / n3 - 3.0 * G * s * t_n / (n3 * n)
        t_gv = coef_gw * GW - coef_v * V
        if tgw is not None:
            t_gv = t_gv + (G / n) * m(tgw, dt)
        if tv is not None:
            t_gv = t_gv - (G * s / n3) * m(tv, dt)
    return outs, (cast_like(t_gv, grad_v), cast_like(t_gg.reshape(grad_g.shape), grad_g))
