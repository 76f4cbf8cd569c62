"""cynorm's row norms inside JAX: callable under ``jax.jit``, with gradients.

``import cynorm.jax`` (JAX must be installed: ``pip install "jax[cpu]"``)
gives :func:`layer_norm` and :func:`rms_norm` as JAX functions: each runs
cynorm's kernel through ``jax.pure_callback`` (on the CPU, the host calls
back into Python with the arrays, zero-copy where XLA's buffers allow), and
``jax.custom_vjp`` wires ``jax.grad`` to cynorm's backward kernels.  Under
``jax.vmap`` the callback runs once per batch element.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

import cynorm as _cn

__all__ = ["layer_norm", "rms_norm"]

Shape = Union[int, Sequence[int]]


def _shape(normalized_shape: Shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, (int, np.integer)):
        return (int(normalized_shape),)
    return tuple(int(d) for d in normalized_shape)


def _stat(x: Any, k: int) -> jax.ShapeDtypeStruct:
    """The saved statistics' shape and dtype: x's leading axes, then ones;
    float32 for 16-bit x."""
    dt = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else x.dtype
    return jax.ShapeDtypeStruct(tuple(x.shape[:x.ndim - k]) + (1,) * k, dt)


def _like(a: Any) -> Optional[jax.ShapeDtypeStruct]:
    return None if a is None else jax.ShapeDtypeStruct(a.shape, a.dtype)


def _call(fn, shapes, *args):
    """fn(*args) on the host, args and results NumPy arrays (None passes
    through); once per batch element under vmap."""
    return jax.pure_callback(fn, shapes, *args, vmap_method="sequential")


def _arrays(*args):
    # the callback's arguments as cynorm takes them (NumPy arrays, or None)
    return [None if a is None else np.asarray(a) for a in args]


# ---- layer norm --------------------------------------------------------------

def _ln_forward(x, weight, bias, shape, eps):
    def host(x, weight, bias):
        return _cn.layer_norm(*_arrays(x), shape, *_arrays(weight, bias), eps)
    st = _stat(x, len(shape))
    return _call(host, (_like(x), st, st), x, weight, bias)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _layer_norm(x, weight, bias, shape, eps):
    return _ln_forward(x, weight, bias, shape, eps)[0]


def _layer_norm_fwd(x, weight, bias, shape, eps):
    y, mean, rstd = _ln_forward(x, weight, bias, shape, eps)
    return y, (x, weight, bias, mean, rstd)


def _layer_norm_bwd(shape, eps, saved, gy):
    x, weight, bias, mean, rstd = saved
    mask = (True, weight is not None, bias is not None)

    def host(gy, x, mean, rstd, weight, bias):
        gx, gw, gb = _cn.layer_norm_backward(*_arrays(gy, x), shape,
                                             *_arrays(mean, rstd, weight, bias), mask)
        return tuple(g for g in (gx, gw, gb) if g is not None)
    shapes = tuple(s for s in (_like(x), _like(weight), _like(bias)) if s is not None)
    grads = list(_call(host, shapes, gy, x, mean, rstd, weight, bias))
    gx = grads.pop(0)
    gw = grads.pop(0) if weight is not None else None
    gb = grads.pop(0) if bias is not None else None
    return gx, gw, gb


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


def layer_norm(x: Any, normalized_shape: Shape, weight: Any = None, bias: Any = None,
               eps: float = 1e-5) -> jax.Array:
    """Layer norm over x's trailing axes (``torch.nn.functional.layer_norm``)
    on cynorm's kernel, differentiable with ``jax.grad``.

    Parameters
    ----------
    x : jax.Array
        float64, float32, bfloat16 or float16.
    normalized_shape : int or sequence of int
        The trailing shape normalized over (static under jit).
    weight : jax.Array, optional
        Shape ``normalized_shape``: x's dtype, or float32 for 16-bit x.
    bias : jax.Array, optional
        As weight.
    eps : float, default 1e-5
        Added to the variance (static under jit).

    Returns
    -------
    jax.Array
        x's shape and dtype.
    """
    return _layer_norm(jnp.asarray(x), weight, bias, _shape(normalized_shape), float(eps))


# ---- RMS norm ----------------------------------------------------------------

def _rms_forward(x, weight, shape, eps):
    def host(x, weight):
        return _cn.rms_norm(*_arrays(x), shape, *_arrays(weight), eps)
    return _call(host, (_like(x), _stat(x, len(shape))), x, weight)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _rms_norm(x, weight, shape, eps):
    return _rms_forward(x, weight, shape, eps)[0]


def _rms_norm_fwd(x, weight, shape, eps):
    y, rstd = _rms_forward(x, weight, shape, eps)
    return y, (x, weight, rstd)


def _rms_norm_bwd(shape, eps, saved, gy):
    x, weight, rstd = saved
    mask = (True, weight is not None)

    def host(gy, x, rstd, weight):
        gx, gw = _cn.rms_norm_backward(*_arrays(gy, x), shape, *_arrays(rstd, weight), mask)
        return (gx,) if gw is None else (gx, gw)
    shapes = (_like(x),) if weight is None else (_like(x), _like(weight))
    grads = _call(host, shapes, gy, x, rstd, weight)
    return grads[0], (grads[1] if weight is not None else None)


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


def rms_norm(x: Any, normalized_shape: Shape, weight: Any = None,
             eps: Optional[float] = None) -> jax.Array:
    """RMS norm over x's trailing axes (``torch.nn.functional.rms_norm``) on
    cynorm's kernel, differentiable with ``jax.grad``.

    Parameters
    ----------
    x : jax.Array
        float64, float32, bfloat16 or float16.
    normalized_shape : int or sequence of int
        The trailing shape normalized over (static under jit).
    weight : jax.Array, optional
        Shape ``normalized_shape``: x's dtype, or float32 for 16-bit x.
    eps : float, optional
        Added to the mean square (static under jit); None: the machine
        epsilon of the math type, as torch.

    Returns
    -------
    jax.Array
        x's shape and dtype.
    """
    return _rms_norm(jnp.asarray(x), weight, _shape(normalized_shape),
                     None if eps is None else float(eps))
