"""Slow float64 NumPy twins of the kernels.

Written from the formulas with plain NumPy, never from the kernels: the test
suite and `python -m cynorm` compare every kernel against these.
"""
import numpy as np


def _rows(v, dim):
    """v in float64 as (D, rest): the kept axis first."""
    v = np.asarray(v, dtype=np.float64)
    if dim is None:
        return v.reshape(1, -1)
    return np.moveaxis(v, dim, 0).reshape(v.shape[dim], -1)


def keep_shape(shape, dim):
    if dim is None:
        return (1,) * len(shape)
    return tuple(s if i == dim else 1 for i, s in enumerate(shape))


def norm_except_dim(v, p=2.0, dim=0):
    """float64 p-norm over every axis but dim, keepdims (dim=None: 0-d)."""
    rows = np.abs(_rows(v, dim))
    if np.isinf(p):
        n = rows.max(axis=1, initial=0.0)
    elif p == 2:
        n = np.sqrt(np.sum(rows * rows, axis=1))
    else:
        n = np.sum(rows ** p, axis=1) ** (1.0 / p)
    if dim is None:
        return n.reshape(())
    return n.reshape(keep_shape(np.shape(v), dim))


def weight_norm(v, g, dim=0):
    """(w, norm) in float64; norm in the keepdims layout."""
    v64 = np.asarray(v, dtype=np.float64)
    norm = norm_except_dim(v64, 2.0, dim)
    shape = keep_shape(v64.shape, dim) if v64.ndim else ()
    g64 = np.asarray(g, dtype=np.float64).reshape(shape)
    norm = norm.reshape(shape)
    return v64 * (g64 / norm), norm


def weight_norm_backward(grad_w, v, g, dim=0):
    """(grad_v, grad_g) in float64 from the chain rule of w = g v / ||v||."""
    v64 = np.asarray(v, dtype=np.float64)
    gw = np.asarray(grad_w, dtype=np.float64)
    shape = keep_shape(v64.shape, dim) if v64.ndim else ()
    g64 = np.asarray(g, dtype=np.float64).reshape(shape)
    norm = norm_except_dim(v64, 2.0, dim).reshape(shape)
    s = np.sum(_rows(gw * v64, dim), axis=1).reshape(shape)
    grad_g = s / norm
    grad_v = g64 / norm * gw - g64 * s / norm ** 3 * v64
    return grad_v, grad_g


# ---------------------------------------------------------------- layer norm

def _norm_shape(normalized_shape):
    if isinstance(normalized_shape, (int, np.integer)):
        return (int(normalized_shape),)
    return tuple(int(s) for s in normalized_shape)


def _ln_rows(x, normalized_shape):
    """x in float64 as (M, N) rows, and the keepdims stat shape."""
    x64 = np.asarray(x, dtype=np.float64)
    ns = _norm_shape(normalized_shape)
    k = len(ns)
    axis = x64.ndim - k
    if axis < 0 or x64.shape[axis:] != ns:
        raise ValueError(f"normalized_shape {ns} does not match the trailing axes of {x64.shape}")
    M = int(np.prod(x64.shape[:axis], dtype=np.int64))
    N = int(np.prod(ns, dtype=np.int64))
    return x64.reshape(M, N), x64.shape[:axis] + (1,) * k, ns


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(y, mean, rstd) in float64; mean/rstd keepdims over the normalized axes.

    var is the biased (two-pass) variance; an empty row has mean 0, rstd NaN."""
    rows, stat_shape, ns = _ln_rows(x, normalized_shape)
    M, N = rows.shape
    if N == 0:
        mean = np.zeros(M)
        rstd = np.full(M, np.nan)
        y = rows.copy()
    else:
        mean = np.sum(rows, axis=1) / N
        d = rows - mean[:, None]
        var = np.sum(d * d, axis=1) / N
        rstd = 1.0 / np.sqrt(var + eps)
        y = d * rstd[:, None]
    if weight is not None:
        y = y * np.asarray(weight, dtype=np.float64).reshape(1, N)
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64).reshape(1, N)
    return y.reshape(np.shape(x)), mean.reshape(stat_shape), rstd.reshape(stat_shape)


def layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight=None):
    """(grad_x, grad_weight, grad_bias) in float64 from the chain rule of
    y = (x - mean) * rstd * w + b with mean, rstd functions of the row:

        grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * w
        grad_weight = sum over rows of dy * xhat,  grad_bias = sum over rows of dy."""
    rows, _, ns = _ln_rows(x, normalized_shape)
    M, N = rows.shape
    dy = np.asarray(grad_out, dtype=np.float64).reshape(M, N)
    mu = np.asarray(mean, dtype=np.float64).reshape(M, 1)
    rs = np.asarray(rstd, dtype=np.float64).reshape(M, 1)
    xhat = (rows - mu) * rs
    w = np.ones((1, N)) if weight is None else np.asarray(weight, dtype=np.float64).reshape(1, N)
    g = dy * w
    if N == 0:
        grad_x = g.copy()
    else:
        grad_x = rs * (g - np.sum(g, axis=1, keepdims=True) / N
                       - xhat * (np.sum(g * xhat, axis=1, keepdims=True) / N))
    grad_weight = np.sum(dy * xhat, axis=0).reshape(ns)
    grad_bias = np.sum(dy, axis=0).reshape(ns)
    return grad_x.reshape(np.shape(x)), grad_weight, grad_bias


# ---------------------------------------------------------------- RMS norm

def rms_norm(x, normalized_shape, weight=None, eps=None):
    """(y, rstd) in float64; rstd keepdims over the normalized axes.

    rstd = 1 / sqrt(mean(x**2) + eps); eps None: float64's machine epsilon
    for float64 x, float32's otherwise.  An empty row has rstd NaN."""
    rows, stat_shape, ns = _ln_rows(x, normalized_shape)
    M, N = rows.shape
    if eps is None:
        eps = np.finfo(np.float64 if np.asarray(x).dtype == np.float64 else np.float32).eps
    with np.errstate(invalid="ignore", divide="ignore"):
        rstd = 1.0 / np.sqrt(np.sum(rows * rows, axis=1) / N + eps) if N else np.full(M, np.nan)
    y = rows * rstd[:, None]
    if weight is not None:
        y = y * np.asarray(weight, dtype=np.float64).reshape(1, N)
    return y.reshape(np.shape(x)), rstd.reshape(stat_shape)


def rms_norm_backward(grad_out, x, normalized_shape, rstd, weight=None):
    """(grad_x, grad_weight) in float64 from the chain rule of
    y = x * rstd * w with rstd = 1 / sqrt(mean(x**2) + eps):

        grad_x = rstd * (g - xhat * mean(g * xhat)),  g = dy * w, xhat = x * rstd
        grad_weight = sum over rows of dy * xhat."""
    rows, _, ns = _ln_rows(x, normalized_shape)
    M, N = rows.shape
    dy = np.asarray(grad_out, dtype=np.float64).reshape(M, N)
    rs = np.asarray(rstd, dtype=np.float64).reshape(M, 1)
    xhat = rows * rs
    w = np.ones((1, N)) if weight is None else np.asarray(weight, dtype=np.float64).reshape(1, N)
    g = dy * w
    if N == 0:
        grad_x = g.copy()
    else:
        grad_x = rs * (g - xhat * (np.sum(g * xhat, axis=1, keepdims=True) / N))
    return grad_x.reshape(np.shape(x)), np.sum(dy * xhat, axis=0).reshape(ns)


# ------------------------------------------------------ residual-fused norms

def add_layer_norm(x, residual, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(y, h, mean, rstd) in float64: h = x + residual exactly, then layer_norm(h)."""
    h = np.asarray(x, dtype=np.float64) + np.asarray(residual, dtype=np.float64)
    y, mean, rstd = layer_norm(h, normalized_shape, weight, bias, eps)
    return y, h, mean, rstd


def add_rms_norm(x, residual, normalized_shape, weight=None, eps=None):
    """(y, h, rstd) in float64: h = x + residual exactly, then rms_norm(h)
    (eps None: as rms_norm's for x's dtype)."""
    if eps is None:
        eps = np.finfo(np.float64 if np.asarray(x).dtype == np.float64 else np.float32).eps
    h = np.asarray(x, dtype=np.float64) + np.asarray(residual, dtype=np.float64)
    y, rstd = rms_norm(h, normalized_shape, weight, eps)
    return y, h, rstd


def add_layer_norm_backward(grad_out, grad_h, h, normalized_shape, mean, rstd, weight=None):
    """(grad_input, grad_weight, grad_bias) in float64: layer_norm_backward at
    h, with grad_h (None: zero) added to grad_x (h = x + residual passes it
    to both)."""
    gx, gw, gb = layer_norm_backward(grad_out, h, normalized_shape, mean, rstd, weight)
    return (gx if grad_h is None else gx + np.asarray(grad_h, dtype=np.float64)), gw, gb


def add_rms_norm_backward(grad_out, grad_h, h, normalized_shape, rstd, weight=None):
    """(grad_input, grad_weight) in float64, as add_layer_norm_backward."""
    gx, gw = rms_norm_backward(grad_out, h, normalized_shape, rstd, weight)
    return (gx if grad_h is None else gx + np.asarray(grad_h, dtype=np.float64)), gw


# ---------------------------------------------------------------- batch norm

def _channels(x, axis):
    """x in float64 as (C, n): the channel axis first, every other axis flattened."""
    x64 = np.asarray(x, dtype=np.float64)
    if x64.ndim < 2:
        raise ValueError("batch norm needs an input of rank >= 2")
    a = axis % x64.ndim
    return np.moveaxis(x64, a, 0).reshape(x64.shape[a], -1), a


def _from_channels(rows, shape, a):
    moved = (shape[a],) + tuple(s for i, s in enumerate(shape) if i != a)
    return np.moveaxis(rows.reshape(moved), 0, a)


def _vec(v, C, fill):
    return np.full(C, fill, dtype=np.float64) if v is None else np.asarray(v, dtype=np.float64).reshape(C)


def batch_norm_stats(x, eps=1e-5, axis=1):
    """(mean, invstd) per channel, invstd = 1/sqrt(biased var + eps); NaN for
    an empty channel."""
    rows, _ = _channels(x, axis)
    C, n = rows.shape
    if n == 0:
        return np.full(C, np.nan), np.full(C, np.nan)
    mean = np.sum(rows, axis=1) / n
    d = rows - mean[:, None]
    var = np.sum(d * d, axis=1) / n
    return mean, 1.0 / np.sqrt(var + eps)


def batch_norm_elemt(x, weight, bias, mean, invstd, axis=1):
    """y = (x - mean) * invstd * w + b, per channel, in float64."""
    rows, a = _channels(x, axis)
    C = rows.shape[0]
    w, b = _vec(weight, C, 1.0), _vec(bias, C, 0.0)
    mu, inv = _vec(mean, C, 0.0), _vec(invstd, C, 1.0)
    y = (rows - mu[:, None]) * (inv * w)[:, None] + b[:, None]
    return _from_channels(y, np.shape(x), a)


def batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps, axis=1):
    """(y, save_mean, save_invstd, new_running_mean, new_running_var) in float64.

    training: normalize with the batch mean and biased variance; running
    stats (when given) become (1 - m) * old + m * batch stat, with the
    unbiased variance (n / (n - 1)); an empty batch leaves them unchanged and
    saves NaN.  eval: normalize with the running stats; save_* are empty."""
    rows, a = _channels(x, axis)
    C, n = rows.shape
    rm = None if running_mean is None else np.asarray(running_mean, dtype=np.float64).reshape(C).copy()
    rv = None if running_var is None else np.asarray(running_var, dtype=np.float64).reshape(C).copy()
    if training:
        mean, invstd = batch_norm_stats(x, eps, axis)
        if n > 0:
            var = np.sum((rows - mean[:, None]) ** 2, axis=1) / n
            if rm is not None:
                rm = (1.0 - momentum) * rm + momentum * mean
            if rv is not None:
                unbiased = var * n / (n - 1) if n > 1 else np.full(C, np.nan)
                rv = (1.0 - momentum) * rv + momentum * unbiased
        y = batch_norm_elemt(x, weight, bias, mean, invstd, axis)
        return y, mean, invstd, rm, rv
    y = batch_norm_elemt(x, weight, bias, rm, 1.0 / np.sqrt(rv + eps), axis)
    return y, np.empty(0), np.empty(0), rm, rv


def batch_norm_gather_stats(mean, invstd, counts, running_mean=None, running_var=None,
                            momentum=0.1, eps=1e-5):
    """Combine per-shard (mean, invstd) rows (W, C) with element counts (W,)
    into the whole batch's (mean, invstd, new_running_mean, new_running_var).

    Written directly: total mean = sum c_i m_i / n, sum of squared deviations
    = sum c_i (var_i + (m_i - mean)^2) with var_i = 1/invstd_i^2 - eps; shards
    with count 0 are left out."""
    m = np.asarray(mean, dtype=np.float64)
    inv = np.asarray(invstd, dtype=np.float64)
    c = np.asarray(counts, dtype=np.float64).reshape(-1)
    keep = c > 0
    m, inv, c = m[keep], inv[keep], c[keep]
    n = np.sum(c)
    C = np.shape(mean)[1]
    if n == 0:
        nan = np.full(C, np.nan)
        rm = None if running_mean is None else np.asarray(running_mean, dtype=np.float64).copy()
        rv = None if running_var is None else np.asarray(running_var, dtype=np.float64).copy()
        return nan, nan.copy(), rm, rv
    total_mean = np.sum(c[:, None] * m, axis=0) / n
    var_i = 1.0 / inv ** 2 - eps
    m2 = np.sum(c[:, None] * (var_i + (m - total_mean) ** 2), axis=0)
    out_invstd = 1.0 / np.sqrt(m2 / n + eps)
    rm = rv = None
    if running_mean is not None:
        rm = (1.0 - momentum) * np.asarray(running_mean, dtype=np.float64) + momentum * total_mean
    if running_var is not None:
        unbiased = m2 / (n - 1) if n > 1 else np.full(C, np.nan)
        rv = (1.0 - momentum) * np.asarray(running_var, dtype=np.float64) + momentum * unbiased
    return total_mean, out_invstd, rm, rv


def batch_norm_backward_reduce(grad_out, x, mean, invstd, weight=None, axis=1):
    """(sum_dy, sum_dy_xmu, grad_weight, grad_bias) per channel in float64."""
    rows, _ = _channels(x, axis)
    C = rows.shape[0]
    dy, _ = _channels(grad_out, axis)
    mu, inv = _vec(mean, C, 0.0), _vec(invstd, C, 1.0)
    sum_dy = np.sum(dy, axis=1)
    sum_dy_xmu = np.sum(dy * (rows - mu[:, None]), axis=1)
    return sum_dy, sum_dy_xmu, sum_dy_xmu * inv, sum_dy.copy()


def batch_norm_backward_elemt(grad_out, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count, axis=1):
    """grad_x = (dy - sum_dy/n - (x - mean) invstd^2 sum_dy_xmu/n) invstd w, n = sum(count)."""
    rows, a = _channels(x, axis)
    C = rows.shape[0]
    dy, _ = _channels(grad_out, axis)
    n = float(np.sum(np.asarray(count, dtype=np.float64)))
    mu, inv, w = _vec(mean, C, 0.0), _vec(invstd, C, 1.0), _vec(weight, C, 1.0)
    sdy, sdx = _vec(sum_dy, C, 0.0), _vec(sum_dy_xmu, C, 0.0)
    gx = (dy - (sdy / n)[:, None] - (rows - mu[:, None]) * (inv ** 2 * sdx / n)[:, None]) * (inv * w)[:, None]
    return _from_channels(gx, np.shape(x), a)


def batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd,
                        training, eps=1e-5, axis=1):
    """(grad_x, grad_weight, grad_bias) in float64 from the chain rule.

    training: the batch stats (save_mean, save_invstd) depend on x:
        grad_x = invstd * w * (dy - mean(dy) - xhat * mean(dy * xhat))
    eval: the running stats are constants: grad_x = dy * w / sqrt(rv + eps).
    grad_weight = sum dy * xhat, grad_bias = sum dy (zeros for an empty batch)."""
    rows, a = _channels(x, axis)
    C, n = rows.shape
    dy, _ = _channels(grad_out, axis)
    w = _vec(weight, C, 1.0)
    if training:
        mu, inv = _vec(save_mean, C, 0.0), _vec(save_invstd, C, 1.0)
    else:
        mu = _vec(running_mean, C, 0.0)
        inv = 1.0 / np.sqrt(_vec(running_var, C, 1.0) + eps)
    if n == 0:
        return _from_channels(dy.copy(), np.shape(x), a), np.zeros(C), np.zeros(C)
    xhat = (rows - mu[:, None]) * inv[:, None]
    grad_bias = np.sum(dy, axis=1)
    grad_weight = np.sum(dy * xhat, axis=1)
    if training:
        gx = (dy - (grad_bias / n)[:, None] - xhat * (grad_weight / n)[:, None]) * (inv * w)[:, None]
    else:
        gx = dy * (inv * w)[:, None]
    return _from_channels(gx, np.shape(x), a), grad_weight, grad_bias


# ---------------------------------------------------------------- group norm

def _groups(x, G, axis):
    """x in float64 as (N, G, D, HW): each sample's groups of D channels."""
    x64 = np.asarray(x, dtype=np.float64)
    a = axis % x64.ndim
    first = np.moveaxis(x64, a, 1) if a != 1 else x64
    N, C = first.shape[:2]
    return first.reshape(N, G, C // G, -1), a


def _ungroup(g, shape, a):
    """_groups' inverse: (N, G, D, HW) back to the caller's shape and axes."""
    moved = (shape[0], shape[a]) + tuple(s for i, s in enumerate(shape) if i not in (0, a))
    first = g.reshape(moved)
    return np.moveaxis(first, 1, a) if a != 1 else first


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, axis=1):
    """(y, mean, rstd) in float64; mean and rstd (N, G), biased variance."""
    g, a = _groups(x, num_groups, axis)
    N, G, D, HW = g.shape
    mean = g.mean(axis=(2, 3))
    var = ((g - mean[:, :, None, None]) ** 2).mean(axis=(2, 3))
    rstd = 1.0 / np.sqrt(var + eps)
    w = _vec(weight, G * D, 1.0).reshape(G, D)
    b = _vec(bias, G * D, 0.0).reshape(G, D)
    y = ((g - mean[:, :, None, None]) * rstd[:, :, None, None] * w[None, :, :, None]
         + b[None, :, :, None])
    return _ungroup(y, np.shape(x), a), mean, rstd


def group_norm_backward(grad_out, x, mean, rstd, weight, num_groups, axis=1):
    """(grad_x, grad_weight, grad_bias) in float64 from the saved mean/rstd."""
    g, a = _groups(x, num_groups, axis)
    dy, _ = _groups(grad_out, num_groups, axis)
    N, G, D, HW = g.shape
    m = np.asarray(mean, np.float64).reshape(N, G)[:, :, None, None]
    r = np.asarray(rstd, np.float64).reshape(N, G)[:, :, None, None]
    w = _vec(weight, G * D, 1.0).reshape(1, G, D, 1)
    xhat = (g - m) * r
    gg = dy * w
    M = D * HW
    gx = r * (gg - gg.sum(axis=(2, 3), keepdims=True) / M
              - xhat * (gg * xhat).sum(axis=(2, 3), keepdims=True) / M)
    gw = (dy * xhat).sum(axis=(0, 3)).reshape(G * D)
    gb = dy.sum(axis=(0, 3)).reshape(G * D)
    return _ungroup(gx, np.shape(x), a), gw, gb


def instance_norm(x, weight=None, bias=None, running_mean=None, running_var=None,
                  use_input_stats=True, momentum=0.1, eps=1e-5, axis=1):
    """(y, mean, rstd, new_running_mean, new_running_var) in float64: each
    instance normalized with its own mean and biased variance, the running
    stats moved towards the batch average of the instances' mean and
    unbiased variance; or (use_input_stats False) normalized with the
    running stats (mean, rstd then those, per sample)."""
    g, a = _groups(x, np.shape(x)[axis % np.ndim(x)], axis)
    N, C, _, HW = g.shape
    rm = None if running_mean is None else np.asarray(running_mean, np.float64).copy()
    rv = None if running_var is None else np.asarray(running_var, np.float64).copy()
    if use_input_stats:
        y, mean, rstd = group_norm(x, C, weight, bias, eps, axis)
        var = ((g - mean[:, :, None, None]) ** 2).sum(axis=(2, 3))
        if rm is not None:
            rm = (1.0 - momentum) * rm + momentum * mean.mean(axis=0)
        if rv is not None:
            rv = (1.0 - momentum) * rv + momentum * (var / (HW - 1)).mean(axis=0)
        return y, mean, rstd, rm, rv
    mean = np.broadcast_to(rm, (N, C))
    rstd = np.broadcast_to(1.0 / np.sqrt(rv + eps), (N, C))
    w = _vec(weight, C, 1.0).reshape(1, C, 1, 1)
    b = _vec(bias, C, 0.0).reshape(1, C, 1, 1)
    y = (g - mean[:, :, None, None]) * rstd[:, :, None, None] * w + b
    return _ungroup(y, np.shape(x), a), mean, rstd, rm, rv


def instance_norm_backward(grad_out, x, mean, rstd, weight=None, use_input_stats=True, axis=1):
    """(grad_x, grad_weight, grad_bias) in float64; use_input_stats False:
    the statistics are constants, grad_x = grad_out * weight * rstd."""
    C = np.shape(x)[axis % np.ndim(x)]
    if use_input_stats:
        return group_norm_backward(grad_out, x, mean, rstd, weight, C, axis)
    g, a = _groups(x, C, axis)
    dy, _ = _groups(grad_out, C, axis)
    N = g.shape[0]
    m = np.asarray(mean, np.float64).reshape(N, C, 1, 1)
    r = np.asarray(rstd, np.float64).reshape(N, C, 1, 1)
    w = _vec(weight, C, 1.0).reshape(1, C, 1, 1)
    gx = dy * w * r
    gw = (dy * (g - m) * r).sum(axis=(0, 2, 3))
    gb = dy.sum(axis=(0, 2, 3))
    return _ungroup(gx, np.shape(x), a), gw, gb


def layer_norm_backward_jvp(grad_out, x, normalized_shape, rstd, weight, t_grad_out, t_x, t_weight):
    """Tangents of layer_norm_backward's (grad_x, grad_weight, grad_bias) in
    float64, differentiating grad_x = r (g - mean(g) - xhat mean(g xhat)),
    g = dy w, with the mean recomputed from x and d r = -r^2 mean(xhat tx)
    (eps fixed).  Tangents may be None (zero)."""
    x64, _, ns = _ln_rows(x, normalized_shape)
    M, N = x64.shape
    if M == 0 or N == 0:
        return np.zeros(np.shape(x)), np.zeros(ns), np.zeros(ns)
    dy = np.asarray(grad_out, np.float64).reshape(M, N)
    z = np.zeros((M, N))
    tdy = z if t_grad_out is None else np.asarray(t_grad_out, np.float64).reshape(M, N)
    tx = z if t_x is None else np.asarray(t_x, np.float64).reshape(M, N)
    w = np.ones(N) if weight is None else np.asarray(weight, np.float64).reshape(N)
    tw = np.zeros(N) if t_weight is None else np.asarray(t_weight, np.float64).reshape(N)
    r = np.asarray(rstd, np.float64).reshape(M, 1)
    mu = x64.mean(axis=1, keepdims=True)
    xhat = (x64 - mu) * r
    dr = -r * r * np.mean(xhat * tx, axis=1, keepdims=True)
    dxhat = (tx - tx.mean(axis=1, keepdims=True)) * r + (x64 - mu) * dr
    g, dg = dy * w, tdy * w + dy * tw
    core = g - g.mean(axis=1, keepdims=True) - xhat * np.mean(g * xhat, axis=1, keepdims=True)
    dcore = (dg - dg.mean(axis=1, keepdims=True) - dxhat * np.mean(g * xhat, axis=1, keepdims=True)
             - xhat * np.mean(dg * xhat + g * dxhat, axis=1, keepdims=True))
    t_gx = dr * core + r * dcore
    return (t_gx.reshape(np.shape(x)), np.sum(tdy * xhat + dy * dxhat, axis=0).reshape(ns),
            np.sum(tdy, axis=0).reshape(ns))
