"""JVP rules of RMS normalization, forward and backward.

Per row, with r = rstd = 1 / sqrt(mean(x**2) + eps), xhat = x * r and a
tangent tx of x (eps held fixed):

    a      = mean(xhat * tx)
    t_r    = -r**2 * a
    t_xhat = r * (tx - xhat * a)

The backward rule recomputes r from x's use in xhat and takes the saved
rstd for r itself (they are equal), as the layer-norm rule does.  The
tangent math runs in NumPy in the math dtype (float32 for float32 and 16-bit
x, float64 for float64 x).
"""
import math

import numpy as np

from cynorm import rmsnorm as _rms
from cynorm.forward_ad._registry import register_jvp
from cynorm.forward_ad._common import bind, cast_like, m, math_dtype, zeros_like


def _rows(x, normalized_shape):
    k = 1 if np.ndim(normalized_shape) == 0 else len(normalized_shape)
    return math.prod(x.shape[:x.ndim - k]), math.prod(x.shape[x.ndim - k:])


def _row_mean(a, N):
    # the mean over each row; 0 for empty rows (the constant the ops return)
    return a.sum(axis=1, keepdims=True) / N if N else np.zeros((a.shape[0], 1), a.dtype)


@register_jvp(_rms.rms_norm, nondiff=("normalized_shape", "eps"))
def _rms_norm_jvp(primals, tangents, kwargs):
    args, t = bind(_rms.rms_norm, primals, tangents, kwargs)
    outs = _rms.rms_norm(*primals, **kwargs)
    y, rstd = outs
    if all(v is None for v in tangents):
        return outs, zeros_like(outs)
    x, w = np.asarray(args["x"]), args["weight"]
    M, N = _rows(x, args["normalized_shape"])
    dt = math_dtype(x.dtype)
    r = m(rstd, dt).reshape(M, 1)
    xhat = m(x, dt).reshape(M, N) * r
    wv = None if w is None else m(w, dt).reshape(N)
    ty = np.zeros((M, N), dt)
    t_rstd = np.zeros((M, 1), dt)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if t["x"] is not None:
            tx = m(t["x"], dt).reshape(M, N)
            a = _row_mean(xhat * tx, N)
            t_xhat = r * (tx - xhat * a)
            ty = t_xhat * wv if wv is not None else t_xhat
            t_rstd = -r * r * a
        if t["weight"] is not None:
            ty = ty + xhat * m(t["weight"], dt).reshape(N)
    return outs, (cast_like(ty.reshape(y.shape), y), cast_like(t_rstd.reshape(rstd.shape), rstd))


@register_jvp(_rms.rms_norm_backward, nondiff=("normalized_shape", "output_mask"),
              ignored=("rstd",))
def _rms_norm_backward_jvp(primals, tangents, kwargs):
    args, t = bind(_rms.rms_norm_backward, primals, tangents, kwargs)
    outs = _rms.rms_norm_backward(*primals, **kwargs)
    if all(t[k] is None for k in ("grad_out", "x", "weight")):
        return outs, zeros_like(outs)
    x, w = np.asarray(args["x"]), args["weight"]
    M, N = _rows(x, args["normalized_shape"])
    dt = math_dtype(x.dtype)
    X = m(x, dt).reshape(M, N)
    dy = m(args["grad_out"], dt).reshape(M, N)
    r = m(args["rstd"], dt).reshape(M, 1)
    wv = np.ones(N, dt) if w is None else m(w, dt).reshape(N)
    zero = np.zeros((M, N), dt)
    tdy = zero if t["grad_out"] is None else m(t["grad_out"], dt).reshape(M, N)
    tx = zero if t["x"] is None else m(t["x"], dt).reshape(M, N)
    tw = np.zeros(N, dt) if t["weight"] is None else m(t["weight"], dt).reshape(N)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        xhat = X * r
        dr = -r * r * _row_mean(xhat * tx, N)
        dxhat = tx * r + X * dr
        g, dg = dy * wv, tdy * wv + dy * tw
        c = _row_mean(g * xhat, N)
        dc = _row_mean(dg * xhat + g * dxhat, N)
        t_gx = dr * (g - xhat * c) + r * (dg - dxhat * c - xhat * dc)
        t_gw = np.sum(tdy * xhat + dy * dxhat, axis=0)
    tg = (t_gx, t_gw)
    return outs, tuple(None if o is None else cast_like(tt, o, fresh=True)
                       for o, tt in zip(outs, tg))
