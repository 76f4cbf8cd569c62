"""JVP rules of RMS normalization and its residual-fused form, forward and
backward.

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
from cynorm.forward_ad._common import bind, cast_like, m, math_dtype, tangent_sum, zeros_like


def _rows(x, normalized_shape):
    k = 1 if np.ndim(normalized_shape) == 0 else len(normalized_shape)
    return math.prod(x.shape[:x.ndim - k]), math.prod(x.shape[x.ndim - k:])


def _row_mean(a, N):
    # the mean over each row; 0 for empty rows (the constant the ops return)
    return a.sum(axis=1, keepdims=True) / N if N else np.zeros((a.shape[0], 1), a.dtype)


@register_jvp(_rms.rms_norm, nondiff=("normalized_shape", "eps"))
def _rms_norm_jvp(primals, tangents, kwargs):
    args, t = bind(_rms.rms_norm, primals, tangents, kwargs)
    x = np.array(args["x"]) if kwargs.get("out") is not None else args["x"]  # out may be x's memory
    outs = _rms.rms_norm(*primals, **kwargs)
    if all(v is None for v in tangents):
        return outs, zeros_like(outs)
    return outs, _rms_norm_tangents(outs, np.asarray(x), args["normalized_shape"],
                                    args["weight"], t["x"], t["weight"])


def _rms_norm_tangents(outs, x, normalized_shape, w, t_x, t_w):
    """Tangents of rms_norm's (y, rstd) = outs at x, for tangents t_x, t_w (None: zero)."""
    y, rstd = outs
    M, N = _rows(x, normalized_shape)
    dt = math_dtype(x.dtype)
    r = m(rstd, dt).reshape(M, 1)
    xhat = m(x, dt).reshape(M, N) * r
    wv = None if w is None else m(w, dt).reshape(N)
    ty = np.zeros((M, N), dt)
    t_rstd = np.zeros((M, 1), dt)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if t_x is not None:
            tx = m(t_x, dt).reshape(M, N)
            a = _row_mean(xhat * tx, N)
            t_xhat = r * (tx - xhat * a)
            ty = t_xhat * wv if wv is not None else t_xhat
            t_rstd = -r * r * a
        if t_w is not None:
            ty = ty + xhat * m(t_w, dt).reshape(N)
    return cast_like(ty.reshape(y.shape), y), cast_like(t_rstd.reshape(rstd.shape), rstd)


@register_jvp(_rms.rms_norm_backward, nondiff=("normalized_shape", "output_mask"),
              ignored=("rstd",))
def _rms_norm_backward_jvp(primals, tangents, kwargs):
    args, t = bind(_rms.rms_norm_backward, primals, tangents, kwargs)
    outs = _rms.rms_norm_backward(*primals, **kwargs)
    if all(t[k] is None for k in ("grad_out", "x", "weight")):
        return outs, zeros_like(outs)
    return outs, _rms_norm_backward_tangents(outs, args["grad_out"], np.asarray(args["x"]),
                                             args["normalized_shape"], args["rstd"],
                                             args["weight"], t["grad_out"], t["x"], t["weight"])


def _rms_norm_backward_tangents(outs, grad_out, x, normalized_shape, rstd, w, t_dy, t_x, t_w,
                                t_extra=None):
    """Tangents of rms_norm_backward's (grad_x, grad_weight) = outs; t_extra
    (None: none) is added to grad_x's (add_rms_norm_backward's t_grad_h)."""
    M, N = _rows(x, normalized_shape)
    dt = math_dtype(x.dtype)
    X = m(x, dt).reshape(M, N)
    dy = m(grad_out, dt).reshape(M, N)
    r = m(rstd, dt).reshape(M, 1)
    wv = np.ones(N, dt) if w is None else m(w, dt).reshape(N)
    zero = np.zeros((M, N), dt)
    tdy = zero if t_dy is None else m(t_dy, dt).reshape(M, N)
    tx = zero if t_x is None else m(t_x, dt).reshape(M, N)
    tw = np.zeros(N, dt) if t_w is None else m(t_w, dt).reshape(N)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        xhat = X * r
        dr = -r * r * _row_mean(xhat * tx, N)
        dxhat = tx * r + X * dr
        g, dg = dy * wv, tdy * wv + dy * tw
        c = _row_mean(g * xhat, N)
        dc = _row_mean(dg * xhat + g * dxhat, N)
        t_gx = dr * (g - xhat * c) + r * (dg - dxhat * c - xhat * dc)
        if t_extra is not None:
            t_gx = t_gx + m(t_extra, dt).reshape(M, N)
        t_gw = np.sum(tdy * xhat + dy * dxhat, axis=0)
    return tuple(None if o is None else cast_like(tt, o, fresh=True)
                 for o, tt in zip(outs, (t_gx, t_gw)))


@register_jvp(_rms.add_rms_norm, nondiff=("normalized_shape", "eps"))
def _add_rms_norm_jvp(primals, tangents, kwargs):
    # h = x + residual, then rms_norm(h): its rule with t_h = t_x + t_residual
    args, t = bind(_rms.add_rms_norm, primals, tangents, kwargs)
    outs = _rms.add_rms_norm(*primals, **kwargs)
    y, h, rstd = outs
    if all(v is None for v in tangents):
        return outs, zeros_like(outs)
    t_h = tangent_sum(t["x"], t["residual"], math_dtype(h.dtype))
    ty, trstd = _rms_norm_tangents((y, rstd), h, args["normalized_shape"], args["weight"], t_h,
                                   t["weight"])
    return outs, (ty, cast_like(np.zeros(h.shape) if t_h is None else t_h, h), trstd)


@register_jvp(_rms.add_rms_norm_backward, nondiff=("normalized_shape", "output_mask"),
              ignored=("rstd",))
def _add_rms_norm_backward_jvp(primals, tangents, kwargs):
    args, t = bind(_rms.add_rms_norm_backward, primals, tangents, kwargs)
    outs = _rms.add_rms_norm_backward(*primals, **kwargs)
    if all(t[k] is None for k in ("grad_out", "grad_h", "h", "weight")):
        return outs, zeros_like(outs)
    return outs, _rms_norm_backward_tangents(outs, args["grad_out"], np.asarray(args["h"]),
                                             args["normalized_shape"], args["rstd"],
                                             args["weight"], t["grad_out"], t["h"], t["weight"],
                                             t["grad_h"])
