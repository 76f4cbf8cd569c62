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
