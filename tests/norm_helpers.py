"""Builders and tolerance scales shared by the layer norm / batch norm tests."""
import numpy as np

from helpers import F32, F64, RTOL, is16, layout, stat_dtype


def param_dtypes(dtype):
    """The dtypes a weight/bias/running stat may have for input `dtype`."""
    dtype = np.dtype(dtype)
    return [dtype, F32] if is16(dtype) else [dtype]


def make_x(rng, shape, dtype, kind="C", scale=1.0, offset=0.0):
    x = (rng.standard_normal(shape) * scale + offset).astype(dtype)
    return layout(x, kind)


def make_affine(rng, shape, pdtype):
    w = (rng.random(shape) + 0.5).astype(pdtype)
    b = rng.standard_normal(shape).astype(pdtype)
    return w, b


def stat_rtol(dtype):
    """Tolerance of a float32/float64 statistic (mean, rstd, invstd, sums)."""
    return RTOL[F64] if np.dtype(dtype) == F64 else RTOL[F32]


def f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


# ---- layer norm: per-row scales (rows = leading axes, N = normalized size)

def ln_rows(a, k):
    a = np.asarray(a, dtype=np.float64)
    lead = a.shape[:a.ndim - k]
    return a.reshape(int(np.prod(lead, dtype=np.int64)), -1)


def ln_y_scale(x, k, mean, rstd, weight, bias):
    """Per-row max of |xhat * w| + |b|, broadcast to x's shape: y is
    normalized, so its rounding is relative to the row's magnitude."""
    rows = ln_rows(x, k)
    M, N = rows.shape
    xhat = (rows - f64(mean).reshape(M, 1)) * f64(rstd).reshape(M, 1)
    w = np.ones(N) if weight is None else f64(weight).reshape(N)
    b = np.zeros(N) if bias is None else f64(bias).reshape(N)
    # + max|w| |mean| rstd: kernels may expand y = x * (rstd w) + (b - mean rstd w)
    s = (np.max(np.abs(xhat * w) + np.abs(b), axis=1, initial=0.0)
         + np.max(np.abs(w), initial=0.0) * np.abs(f64(mean).reshape(M)) * f64(rstd).reshape(M))
    return np.broadcast_to(s[:, None], rows.shape).reshape(np.shape(x))


def ln_gx_scale(dy, x, k, mean, rstd, weight):
    """Per-row size of the terms of grad_x = rstd (g - mean(g) - xhat mean(g xhat)),
    widened by (1 + |mean| rstd) for kernels that expand xhat into a x + c."""
    rows = ln_rows(x, k)
    M, N = rows.shape
    g = ln_rows(dy, k) * (np.ones(N) if weight is None else f64(weight).reshape(N))
    mu, rs = f64(mean).reshape(M, 1), f64(rstd).reshape(M, 1)
    xhat = (rows - mu) * rs
    n = max(N, 1)
    terms = (np.max(np.abs(g), axis=1, keepdims=True, initial=0.0)
             + np.abs(np.sum(g, axis=1, keepdims=True)) / n
             + np.max(np.abs(xhat), axis=1, keepdims=True, initial=0.0)
             * np.abs(np.sum(g * xhat, axis=1, keepdims=True)) / n)
    s = rs * terms * (1 + np.abs(mu) * rs)
    return np.broadcast_to(s, rows.shape).reshape(np.shape(x))


# ---- batch norm: per-channel scales

def bn_chan(a, axis):
    a = np.asarray(a, dtype=np.float64)
    ax = axis % a.ndim
    return np.moveaxis(a, ax, 0).reshape(a.shape[ax], -1), ax


def bn_unchan(s_per_chan, shape, axis):
    ax = axis % len(shape)
    bshape = tuple(shape[ax] if i == ax else 1 for i in range(len(shape)))
    return np.broadcast_to(np.asarray(s_per_chan).reshape(bshape), shape)


def bn_y_scale(x, axis, mean, invstd, weight, bias):
    rows, ax = bn_chan(x, axis)
    C = rows.shape[0]
    w = np.ones(C) if weight is None else f64(weight).reshape(C)
    b = np.zeros(C) if bias is None else f64(bias).reshape(C)
    xhat = (rows - f64(mean).reshape(C, 1)) * f64(invstd).reshape(C, 1)
    s = (np.max(np.abs(xhat * w[:, None]) + np.abs(b[:, None]), axis=1, initial=0.0)
         + np.abs(w) * np.abs(f64(mean).reshape(C)) * f64(invstd).reshape(C))
    return bn_unchan(s, np.shape(x), axis)


def bn_gx_scale(dy, x, axis, mean, invstd, weight):
    rows, ax = bn_chan(x, axis)
    C, n = rows.shape
    d, _ = bn_chan(dy, axis)
    w = np.ones(C) if weight is None else f64(weight).reshape(C)
    mu, inv = f64(mean).reshape(C, 1), f64(invstd).reshape(C, 1)
    xhat = (rows - mu) * inv
    n = max(n, 1)
    terms = (np.max(np.abs(d), axis=1, keepdims=True, initial=0.0)
             + np.abs(np.sum(d, axis=1, keepdims=True)) / n
             + np.max(np.abs(xhat), axis=1, keepdims=True, initial=0.0)
             * np.abs(np.sum(d * xhat, axis=1, keepdims=True)) / n)
    s = (inv * np.abs(w[:, None]) * terms * (1 + np.abs(mu) * inv)).reshape(C)
    return bn_unchan(s, np.shape(x), axis)


def bn_sum_scale(dy, x, axis, mean, invstd):
    """Per channel sum |dy xhat| and sum |dy|: the scales of grad_weight, grad_bias."""
    rows, _ = bn_chan(x, axis)
    C = rows.shape[0]
    d, _ = bn_chan(dy, axis)
    xhat = (rows - f64(mean).reshape(C, 1)) * f64(invstd).reshape(C, 1)
    return np.sum(np.abs(d * xhat), axis=1), np.sum(np.abs(d), axis=1)


__all__ = ["param_dtypes", "make_x", "make_affine", "stat_rtol", "stat_dtype", "f64", "ln_rows",
           "ln_y_scale", "ln_gx_scale", "bn_chan", "bn_unchan", "bn_y_scale", "bn_gx_scale",
           "bn_sum_scale"]


def some(vs, shape, i):
    """Every parameter variant for small inputs; for large ones (slow in the
    float64 twin) two per layout, rotating."""
    if np.prod(shape) <= 50000:
        return vs
    return [vs[(2 * i) % len(vs)], vs[(2 * i + 1) % len(vs)]]
