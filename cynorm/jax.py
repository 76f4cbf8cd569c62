"""cynorm's norms inside JAX: callable under ``jax.jit``, with gradients.

``import cynorm.jax`` (JAX must be installed: ``pip install "jax[cpu]"``)
gives :func:`layer_norm`, :func:`rms_norm`, :func:`batch_norm`,
:func:`group_norm`, and the residual add fused into the row norms,
:func:`add_layer_norm` and :func:`add_rms_norm`, as JAX functions.  Each is
a ``jax.custom_jvp``: its forward kernels, and a tangent
(cynorm._jax_forward) that ``jax.jvp`` evaluates with the op's backward
kernel and XLA's arithmetic (cynorm's JVP rule on the host, without the
FFI) and ``jax.grad`` transposes into the op's backward kernels.

On JAX with ``jax.ffi`` the kernels run as XLA FFI custom calls (handlers in
cynorm/_kernels/layer_norm_ffi.pxi and batch_norm_ffi.pxi, registered for
the CPU at import): XLA
hands them its buffers, with no Python and no copy.  Elsewhere (older JAX,
or a runtime whose FFI version the handlers cannot speak) they run through
``jax.pure_callback``; :data:`route` says which, and why.  Under
``jax.vmap`` each custom call runs once for the whole batch, its handler
given a set of every argument per element (cynorm._jax_forward batches the
derivative rules the same way); the callback route runs each callback once
per batch element.
"""
from __future__ import annotations

import os
import re
from functools import partial
from typing import Any, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

import cynorm as _cn
from cynorm import _kernels, _validation as _v
from cynorm._jax_forward import first_order as _first_order, register as _register_jvp, \
    tangent as _tangent

# this CPU's builds of the row-norm, batch-norm and weight-norm kernels
_rows = _kernels.load("layer_norm")
_channels = _kernels.load("batch_norm")
_weights = _kernels.load("weight_norm")

__all__ = ["add_layer_norm", "add_rms_norm", "batch_norm", "group_norm", "instance_norm",
           "layer_norm", "rms_norm", "route", "weight_norm"]

Shape = Union[int, Sequence[int]]

_FLOATS = (jnp.float64, jnp.float32, jnp.bfloat16, jnp.float16)


def _math_dtype(dtype: Any) -> Any:
    """The kernels' math type of a storage dtype: float32 for 16-bit ones,
    else the dtype itself (also the saved statistics' dtype)."""
    return jnp.float32 if dtype in (jnp.bfloat16, jnp.float16) else dtype


def _ffi_version() -> Optional[tuple[int, int]]:
    """The XLA FFI API version of the installed jaxlib, from the C header it
    ships (the runtime registers handlers of its own version only)."""
    try:
        with open(os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")) as f:
            text = f.read()
    except (AttributeError, OSError, TypeError):     # TypeError: no path (the docs' stand-in)
        return None
    major = re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text)
    minor = re.search(r"#define XLA_FFI_API_MINOR (\d+)", text)
    return None if major is None or minor is None else (int(major.group(1)), int(minor.group(1)))


def _register() -> str:
    """Registers the handlers with XLA; the route the calls take, and why."""
    if not hasattr(jax, "ffi"):
        return f"pure_callback: JAX {jax.__version__} has no jax.ffi"
    version = _ffi_version()
    if version is None:
        return "pure_callback: jaxlib ships no readable xla/ffi/api/c_api.h"
    if version[0] != 0:
        # the handlers are written against the ABI of major version 0
        return f"pure_callback: XLA FFI API {version[0]}.{version[1]} (cynorm speaks 0.x)"
    try:
        for module in (_rows, _channels, _weights):
            for name, handler in module.ffi_handlers(*version).items():
                jax.ffi.register_ffi_target(name, handler, platform="cpu")
    except Exception as e:     # the runtime refused them: keep the callback
        return f"pure_callback: XLA refused the handlers ({e})"
    return f"xla_ffi: XLA FFI API {version[0]}.{version[1]}, handlers registered for the CPU"


#: How the kernels run under JAX: "xla_ffi: ..." (custom calls on XLA's
#: buffers) or "pure_callback: <why not the FFI>".
route: str = _register()
_FFI = route.startswith("xla_ffi")


def _static(op: str, check: Any, value: Any, name: str, *what: str) -> Any:
    """A static argument checked as cynorm's NumPy API checks it (check
    from cynorm._validation), its error naming the op."""
    try:
        return check(value, name, *what)
    except (TypeError, ValueError) as e:
        hint = ""
        if isinstance(value, jax.core.Tracer):
            hint = (f" ({name} is static: under jax.jit pass it as a Python value, through "
                    f"static_argnames=({name!r},) or functools.partial)")
        raise type(e)(f"cynorm.jax.{op}: {e}{hint}") from None


def _eps(op: str, eps: Any) -> float:
    return _static(op, _v.check_eps, eps, "eps")


def _shape(op: str, normalized_shape: Shape) -> tuple[int, ...]:
    """normalized_shape as a tuple of ints (an int: one axis)."""
    what = "an int or a sequence of ints"
    if isinstance(normalized_shape, (int, np.integer)):      # a bool is refused here
        return (_static(op, _v.check_int, normalized_shape, "normalized_shape", what),)
    try:
        items = tuple(normalized_shape)
    except TypeError:
        raise TypeError(f"cynorm.jax.{op}: normalized_shape must be {what}, got "
                        f"{type(normalized_shape).__name__}") from None
    if not items:       # as cynorm's NumPy ops and torch (each value alone would be 0)
        raise ValueError(f"cynorm.jax.{op}: normalized_shape must name at least one axis, "
                         f"got ()")
    return tuple(_static(op, _v.check_int, d, "normalized_shape", what) for d in items)


def _check(op: str, x: Any, shape: tuple[int, ...], **params: Any) -> int:
    """Trace-time checks of a row norm's x, normalized shape and parameters
    (errors naming the argument); the row length N."""
    if len(shape) > x.ndim or tuple(x.shape[x.ndim - len(shape):]) != shape:
        _check_params(op, x, (), {})
        raise ValueError(f"cynorm.jax.{op}: normalized_shape {shape} is not the trailing shape "
                         f"of x {tuple(x.shape)}")
    _check_params(op, x, shape, params)
    return int(np.prod(shape, dtype=np.int64))


def _check_params(op: str, x: Any, shape: tuple[int, ...], params: dict) -> None:
    """x is of a kernel dtype; each parameter not None has `shape` and x's
    dtype or its math type's."""
    if x.dtype not in _FLOATS:
        raise TypeError(f"cynorm.jax.{op}: x: float64, float32, bfloat16 or float16 expected, "
                        f"got {x.dtype}")
    math = _math_dtype(x.dtype)
    for name, p in params.items():
        if p is None:
            continue
        if tuple(p.shape) != shape:
            raise ValueError(f"cynorm.jax.{op}: {name}: shape {shape} expected, got {tuple(p.shape)}")
        if p.dtype not in (x.dtype, math):
            allowed = " or ".join(sorted({np.dtype(x.dtype).name, np.dtype(math).name}))
            raise TypeError(f"cynorm.jax.{op}: {name} must have dtype {allowed}, got {p.dtype}")


def _array(a: Any) -> Any:
    return None if a is None else jnp.asarray(a)


def _stat(x: Any, k: int) -> jax.ShapeDtypeStruct:
    """The saved statistics' shape and dtype: x's leading axes, then ones;
    float32 for 16-bit x."""
    dt = _math_dtype(x.dtype)
    return jax.ShapeDtypeStruct(tuple(x.shape[:x.ndim - k]) + (1,) * k, dt)


def _like(a: Any) -> Optional[jax.ShapeDtypeStruct]:
    return None if a is None else jax.ShapeDtypeStruct(a.shape, a.dtype)


def _ffi(target: str, shapes, *args, **attrs):
    """The FFI custom call `target` on the arrays in args (None skipped),
    attrs as float64 / int64 scalars.  Under vmap, once for the whole batch,
    every argument broadcast to it (the handlers take a set of each buffer
    per element)."""
    attrs = {k: np.float64(v) if isinstance(v, float) else np.int64(v) for k, v in attrs.items()}
    call = jax.ffi.ffi_call(target, shapes, vmap_method="broadcast_all")
    return call(*[a for a in args if a is not None], **attrs)


def _call(fn, shapes, *args):
    """fn(*args) on the host, args and results NumPy arrays (None passes
    through); once per batch element under vmap."""
    return jax.pure_callback(fn, shapes, *args, vmap_method="sequential")


def _arrays(*args):
    # the callback's arguments as cynorm takes them (NumPy arrays, or None)
    return [None if a is None else np.asarray(a) for a in args]


def _grad_shapes(x, weight, bias=None):
    """What a backward call returns: grad_x, then the gradient of each
    parameter given."""
    return tuple(s for s in (_like(x), _like(weight), _like(bias)) if s is not None)


def _given(*grads):
    # a host backward's results as _grad_shapes lists them
    return tuple(g for g in grads if g is not None)


def _spread(grads, weight, bias=None):
    """(grad_x, grad_weight, grad_bias) from a backward's results, None for
    a parameter not given."""
    grads = list(grads)
    gx = grads.pop(0)
    gw = grads.pop(0) if weight is not None else None
    return gx, gw, grads.pop(0) if bias is not None else None


def _sum(a: Any, b: Any) -> Any:
    """a + b rounded to their dtype, under jit as eagerly (XLA may otherwise
    keep a 16-bit sum in float32 where it feeds float32 arithmetic)."""
    s = a + b
    if s.dtype in (jnp.bfloat16, jnp.float16):
        info = jnp.finfo(s.dtype)
        s = jax.lax.reduce_precision(s, exponent_bits=info.nexp, mantissa_bits=info.nmant)
    return s


def _math(a: Any) -> Any:
    """a in its math type (_math_dtype)."""
    return a.astype(_math_dtype(a.dtype))


def _channel_shape(x: Any, axis: int) -> list[int]:
    """The shape that broadcasts a per-channel (C,) vector along x's axis."""
    shape = [1] * x.ndim
    shape[axis % x.ndim] = x.shape[axis]
    return shape


def _materialized(tangents):
    """Tangents as the rules take them: a symbolic zero (an input not being
    differentiated; the rules that tell those apart ask for them) as zeros."""
    return tuple(jnp.zeros(t.shape, t.dtype) if type(t) is SymbolicZero else t
                 for t in tangents)


def _by_running_stats(ty, x, weight, running_mean, running_var, t_mean, t_var, eps, axis):
    """ty plus y's tangent in the running statistics that normalized x (batch
    norm in eval, instance norm without use_input_stats): y = (x - m) * s * w
    + b with s = 1 / sqrt(v + eps), so dy = -w * s * (dm + (x - m) * s^2 *
    dv / 2), in the math type.  Symbolic-zero tangents (the statistics not
    differentiated) add nothing and cost nothing."""
    given = [t is not None and type(t) is not SymbolicZero for t in (t_mean, t_var)]
    if not any(given) or x.size == 0:
        return ty
    pshape = _channel_shape(x, axis)
    m = _math(running_mean).reshape(pshape)
    s = jax.lax.rsqrt(_math(running_var).reshape(pshape) + eps)
    scale = s if weight is None else s * _math(weight).reshape(pshape)
    d = 0.0
    if given[0]:
        d = d + _math(t_mean).reshape(pshape)
    if given[1]:
        d = d + (_math(x) - m) * (s * s * 0.5) * _math(t_var).reshape(pshape)
    return (_math(ty) - scale * d).astype(ty.dtype)


def _y_tangent(t_xhat, weight, scaled, tb, pshape, x):
    """y's tangent t_xhat * w + scaled + tb, scaled being xhat * tw (each
    term where its inputs are given), in the math type, then in x's dtype;
    weight and tb seen in pshape."""
    terms = []
    if t_xhat is not None:
        terms.append(t_xhat if weight is None else t_xhat * _math(weight).reshape(pshape))
    if scaled is not None:
        terms.append(scaled)
    if tb is not None:
        terms.append(_math(tb).reshape(pshape))
    if not terms:
        return jnp.zeros_like(x)
    ty = terms[0]
    for term in terms[1:]:
        ty = ty + term
    return jnp.broadcast_to(ty, x.shape).astype(x.dtype)


def _input_tangent(target, x, tx, *args, **attrs):
    """The normalized input's tangent, in x's math type: the op's backward
    kernel (target) on x's tangent with no weight (grad_x's formula with
    g = tx is r * (tx - mean(tx) - xhat * mean(tx * xhat)); args: the saved
    statistics) as an XLA custom call; None where tx is None."""
    if tx is None:
        return None
    xm = _math(x)
    return _ffi(target, (_like(xm),), _math(tx), xm, *args, weight=False, weight_grad=False,
                bias_grad=False, **attrs)[0]


# ---- layer norm --------------------------------------------------------------

def _ln_forward(x, residual, weight, bias, shape, eps):
    """(y, mean, rstd); with a residual, the fused form's (y, h, mean, rstd)."""
    op = "layer_norm" if residual is None else "add_layer_norm"
    n = _check(op, x, shape, weight=weight, bias=bias)
    st = _stat(x, len(shape))
    shapes = tuple(s for s in (_like(x), _like(residual), st, st) if s is not None)
    if _FFI and n > 0:
        return _ffi("cynorm_layer_norm", shapes, x, residual, weight, bias, eps=eps, n=n,
                    residual=residual is not None, weight=weight is not None,
                    bias=bias is not None)

    def host(x, residual, weight, bias):
        if residual is None:
            return _cn.layer_norm(*_arrays(x), shape, *_arrays(weight, bias), eps)
        return _cn.add_layer_norm(*_arrays(x, residual), shape, *_arrays(weight, bias), eps)
    return _call(host, shapes, x, residual, weight, bias)


_ln_forward_once = _first_order("layer_norm", _ln_forward, (4, 5))


@partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _layer_norm(x, weight, bias, shape, eps):
    return _ln_forward(x, None, weight, bias, shape, eps)[0]


@_layer_norm.defjvp
def _layer_norm_jvp(shape, eps, primals, tangents):
    x, weight, bias = primals
    y, mean, rstd = _ln_forward_once(x, None, weight, bias, shape, eps)
    return y, _tangent("layer_norm", (shape, eps), (x, weight, bias, mean, rstd), tangents)


def _layer_norm_host(primals, tangents, static):
    x, weight, bias, _, _ = primals
    tx, tw, tb = tangents
    shape, eps = static
    return _cn.jvp(_cn.layer_norm, (x, shape, weight, bias, eps), (tx, None, tw, tb, None))[1][0]


def _layer_norm_bwd(saved, gy, static):
    shape, _ = static
    x, weight, bias, mean, rstd = saved
    shapes = _grad_shapes(x, weight, bias)
    n = int(np.prod(shape, dtype=np.int64))
    if _FFI and n > 0:
        grads = list(_ffi("cynorm_layer_norm_backward", shapes, gy, x, mean, rstd, weight,
                          n=n, weight=weight is not None,
                          weight_grad=weight is not None, bias_grad=bias is not None))
    else:
        mask = (True, weight is not None, bias is not None)

        def host(gy, x, mean, rstd, weight, bias):
            gx, gw, gb = _cn.layer_norm_backward(*_arrays(gy, x), shape,
                                                 *_arrays(mean, rstd, weight, bias), mask)
            return _given(gx, gw, gb)
        grads = list(_call(host, shapes, gy, x, mean, rstd, weight, bias))
    return _spread(grads, weight, bias)


def _layer_norm_traced(primals, tangents, static):
    x, weight, bias, mean, rstd = primals
    tx, tw, tb = tangents
    shape, _ = static
    if x.size == 0:
        return jnp.zeros_like(x)
    t_xhat = _input_tangent("cynorm_layer_norm_backward", x, tx, mean, rstd,
                            n=int(np.prod(shape, dtype=np.int64)))
    scaled = None if tw is None else (_math(x) - mean) * rstd * _math(tw)
    return _y_tangent(t_xhat, weight, scaled, tb, shape, x)


# rows: x, mean, rstd, tx (weight, bias and their tangents the parameters)
_register_jvp("layer_norm", _layer_norm_host, _layer_norm_bwd,
              _layer_norm_traced if _FFI else None, rows=(0, 3, 4, 5))


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
    return _layer_norm(jnp.asarray(x), _array(weight), _array(bias),
                       _shape("layer_norm", normalized_shape),
                       _eps("layer_norm", eps))


# ---- RMS norm ----------------------------------------------------------------

def _rms_forward(x, residual, weight, shape, eps):
    """(y, rstd); with a residual, the fused form's (y, h, rstd)."""
    n = _check("rms_norm" if residual is None else "add_rms_norm", x, shape, weight=weight)
    shapes = tuple(s for s in (_like(x), _like(residual), _stat(x, len(shape)))
                   if s is not None)
    if _FFI and n > 0:
        if eps is None:     # the math type's epsilon, as torch
            eps = float(np.finfo(np.float64 if x.dtype == jnp.float64 else np.float32).eps)
        return _ffi("cynorm_rms_norm", shapes, x, residual, weight, eps=eps, n=n,
                    residual=residual is not None, weight=weight is not None, bias=False)

    def host(x, residual, weight):
        if residual is None:
            return _cn.rms_norm(*_arrays(x), shape, *_arrays(weight), eps)
        return _cn.add_rms_norm(*_arrays(x, residual), shape, *_arrays(weight), eps)
    return _call(host, shapes, x, residual, weight)


_rms_forward_once = _first_order("rms_norm", _rms_forward, (3, 4))


@partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _rms_norm(x, weight, shape, eps):
    return _rms_forward(x, None, weight, shape, eps)[0]


@_rms_norm.defjvp
def _rms_norm_jvp(shape, eps, primals, tangents):
    x, weight = primals
    y, rstd = _rms_forward_once(x, None, weight, shape, eps)
    return y, _tangent("rms_norm", (shape, eps), (x, weight, rstd), tangents)


def _rms_norm_host(primals, tangents, static):
    x, weight, _ = primals
    tx, tw = tangents
    shape, eps = static
    return _cn.jvp(_cn.rms_norm, (x, shape, weight, eps), (tx, None, tw, None))[1][0]


def _rms_norm_bwd(saved, gy, static):
    shape, _ = static
    x, weight, rstd = saved
    shapes = _grad_shapes(x, weight)
    n = int(np.prod(shape, dtype=np.int64))
    if _FFI and n > 0:
        grads = _ffi("cynorm_rms_norm_backward", shapes, gy, x, rstd, weight, n=n,
                     weight=weight is not None, weight_grad=weight is not None, bias_grad=False)
    else:
        mask = (True, weight is not None)

        def host(gy, x, rstd, weight):
            return _given(*_cn.rms_norm_backward(*_arrays(gy, x), shape, *_arrays(rstd, weight),
                                                 mask))
        grads = _call(host, shapes, gy, x, rstd, weight)
    return _spread(grads, weight)[:2]


def _rms_norm_traced(primals, tangents, static):
    x, weight, rstd = primals
    tx, tw = tangents
    shape, _ = static
    if x.size == 0:
        return jnp.zeros_like(x)
    t_xhat = _input_tangent("cynorm_rms_norm_backward", x, tx, rstd,
                            n=int(np.prod(shape, dtype=np.int64)))
    scaled = None if tw is None else _math(x) * rstd * _math(tw)
    return _y_tangent(t_xhat, weight, scaled, None, shape, x)


# rows: x, rstd, tx
_register_jvp("rms_norm", _rms_norm_host, _rms_norm_bwd, _rms_norm_traced if _FFI else None,
              rows=(0, 2, 3))


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
    return _rms_norm(jnp.asarray(x), _array(weight), _shape("rms_norm", normalized_shape),
                     None if eps is None else _eps("rms_norm", eps))


# ---- the residual add fused into layer norm and RMS norm ---------------------
# The forward is the row norm's kernel with the residual (h = x + residual
# written and normalized in one pass); y's tangent is the norm's at h, with
# h's tangent tx + tr, so jax.grad runs the norm's backward kernel and XLA
# adds h's own gradient.

def _fused(x: Any, residual: Any) -> bool:
    """Whether the fused kernel takes x and residual: the same shape and
    dtype (it adds without broadcasting or type promotion; the callers run
    jax.numpy's add and the norm otherwise)."""
    return tuple(residual.shape) == tuple(x.shape) and residual.dtype == x.dtype


def _unfused_add(op: str, x: Any, residual: Any) -> Any:
    """x + residual by jax.numpy (broadcasting, type promotion), for the
    pairs the fused kernel does not take; shapes that do not broadcast
    raise naming residual."""
    try:
        np.broadcast_shapes(tuple(x.shape), tuple(residual.shape))
    except ValueError:
        raise ValueError(f"cynorm.jax.{op}: residual of shape {tuple(residual.shape)} does not "
                         f"broadcast with x of shape {tuple(x.shape)}") from None
    return x + residual


# the norms' rules at h, under the fused forms' names (in their errors)
_add_ln_forward_once = _first_order("add_layer_norm", _ln_forward, (4, 5))
_add_rms_forward_once = _first_order("add_rms_norm", _rms_forward, (3, 4))
_register_jvp("add_layer_norm", _layer_norm_host, _layer_norm_bwd,
              _layer_norm_traced if _FFI else None, rows=(0, 3, 4, 5))
_register_jvp("add_rms_norm", _rms_norm_host, _rms_norm_bwd,
              _rms_norm_traced if _FFI else None, rows=(0, 2, 3))


@partial(jax.custom_jvp, nondiff_argnums=(4, 5))
def _add_layer_norm(x, residual, weight, bias, shape, eps):
    return tuple(_ln_forward(x, residual, weight, bias, shape, eps)[:2])


@_add_layer_norm.defjvp
def _add_layer_norm_jvp(shape, eps, primals, tangents):
    x, residual, weight, bias = primals
    tx, tr, tw, tb = tangents
    y, h, mean, rstd = _add_ln_forward_once(x, residual, weight, bias, shape, eps)
    th = _sum(tx, tr)
    ty = _tangent("add_layer_norm", (shape, eps), (h, weight, bias, mean, rstd), (th, tw, tb))
    return (y, h), (ty, th)


def add_layer_norm(x: Any, residual: Any, normalized_shape: Shape, weight: Any = None,
                   bias: Any = None, eps: float = 1e-5) -> tuple[jax.Array, jax.Array]:
    """The residual add fused into layer norm: ``h = x + residual``, then
    layer norm of h over its trailing axes, in one pass over the rows
    (cynorm's kernel with the residual), differentiable with ``jax.grad``.

    The values of ``h = x + residual`` followed by :func:`layer_norm` (h
    rounded to x's dtype first) and their derivatives; the backward is layer
    norm's kernel at h, to which XLA adds h's own gradient.

    Parameters
    ----------
    x, residual : jax.Array
        float64, float32, bfloat16 or float16; fused where they have the
        same shape and dtype, otherwise jax.numpy's add (broadcasting, type
        promotion) then :func:`layer_norm`.
    normalized_shape : int or sequence of int
        The trailing shape normalized over (static under jit).
    weight, bias : jax.Array, optional
        Shape ``normalized_shape``: x's dtype, or float32 for 16-bit x.
    eps : float, default 1e-5
        Added to the variance (static under jit).

    Returns
    -------
    y : jax.Array
        layer_norm(h): h's shape and dtype.
    h : jax.Array
        x + residual: x's shape and dtype where the two match (the fused
        kernel), else jax.numpy's broadcast shape and promoted dtype.

    Raises
    ------
    TypeError, ValueError
        As layer_norm.
    """
    x, residual = jnp.asarray(x), jnp.asarray(residual)
    if not _fused(x, residual):
        h = _unfused_add("add_layer_norm", x, residual)
        return layer_norm(h, normalized_shape, weight, bias, eps), h
    return _add_layer_norm(x, residual, _array(weight), _array(bias),
                           _shape("add_layer_norm", normalized_shape),
                           _eps("add_layer_norm", eps))


@partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _add_rms_norm(x, residual, weight, shape, eps):
    return tuple(_rms_forward(x, residual, weight, shape, eps)[:2])


@_add_rms_norm.defjvp
def _add_rms_norm_jvp(shape, eps, primals, tangents):
    x, residual, weight = primals
    tx, tr, tw = tangents
    y, h, rstd = _add_rms_forward_once(x, residual, weight, shape, eps)
    th = _sum(tx, tr)
    return (y, h), (_tangent("add_rms_norm", (shape, eps), (h, weight, rstd), (th, tw)), th)


def add_rms_norm(x: Any, residual: Any, normalized_shape: Shape, weight: Any = None,
                 eps: Optional[float] = None) -> tuple[jax.Array, jax.Array]:
    """The residual add fused into RMS norm: ``h = x + residual``, then RMS
    norm of h over its trailing axes, in one pass over the rows (cynorm's
    kernel with the residual), differentiable with ``jax.grad``.

    The values of ``h = x + residual`` followed by :func:`rms_norm` (h
    rounded to x's dtype first) and their derivatives; the backward is RMS
    norm's kernel at h, to which XLA adds h's own gradient.

    Parameters
    ----------
    x, residual : jax.Array
        float64, float32, bfloat16 or float16; fused where they have the
        same shape and dtype, otherwise jax.numpy's add (broadcasting, type
        promotion) then :func:`rms_norm`.
    normalized_shape : int or sequence of int
        The trailing shape normalized over (static under jit).
    weight : jax.Array, optional
        Shape ``normalized_shape``: x's dtype, or float32 for 16-bit x.
    eps : float, optional
        Added to the mean square (static under jit); None: the machine
        epsilon of the math type, as torch.

    Returns
    -------
    y : jax.Array
        rms_norm(h): h's shape and dtype.
    h : jax.Array
        x + residual: x's shape and dtype where the two match (the fused
        kernel), else jax.numpy's broadcast shape and promoted dtype.

    Raises
    ------
    TypeError, ValueError
        As rms_norm.

    Examples
    --------
    >>> import jax.numpy as jnp, cynorm.jax
    >>> y, h = cynorm.jax.add_rms_norm(jnp.ones((2, 4)), jnp.ones((2, 4)), 4)
    >>> h.tolist()
    [[2.0, 2.0, 2.0, 2.0], [2.0, 2.0, 2.0, 2.0]]
    """
    x, residual = jnp.asarray(x), jnp.asarray(residual)
    if not _fused(x, residual):
        h = _unfused_add("add_rms_norm", x, residual)
        return rms_norm(h, normalized_shape, weight, eps), h
    return _add_rms_norm(x, residual, _array(weight), _shape("add_rms_norm", normalized_shape),
                         None if eps is None else _eps("add_rms_norm", eps))


# ---- batch norm --------------------------------------------------------------

def _around(x, axis):
    """x as (A, C, B): the sizes before, at and after the channel axis."""
    ax = axis % x.ndim
    return (int(np.prod(x.shape[:ax], dtype=np.int64)), int(x.shape[ax]),
            int(np.prod(x.shape[ax + 1:], dtype=np.int64)))


def _bn_check(x, axis, training, weight, bias, running_mean, running_var):
    """Trace-time checks of batch_norm's arguments; x as (A, C, B) around
    the channel axis."""
    if x.ndim < 2:
        raise ValueError(f"cynorm.jax.batch_norm: x must have at least 2 dimensions, "
                         f"got shape {tuple(x.shape)}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"cynorm.jax.batch_norm: axis {axis} is out of range for x of "
                         f"{x.ndim} dimensions")
    A, C, B = _around(x, axis)
    _check_params("batch_norm", x, (C,), dict(weight=weight, bias=bias,
                                              running_mean=running_mean, running_var=running_var))
    if (running_mean is None) != (running_var is None):
        raise ValueError("cynorm.jax.batch_norm: pass running_mean and running_var together")
    if not training and running_mean is None:
        raise ValueError("cynorm.jax.batch_norm: running_mean and running_var are required "
                         "when training=False")
    if training and A * B == 1:
        raise ValueError(f"cynorm.jax.batch_norm: expected more than 1 value per channel when "
                         f"training, got x of shape {tuple(x.shape)} with channel axis {axis}")
    return A, C, B


def _bn_forward(x, weight, bias, running_mean, running_var, training, momentum, eps, axis):
    """(y, new running mean, new running var, save_mean, save_invstd): the
    running statistics updated in training (None where not given), the saved
    statistics in training only (None otherwise)."""
    A, C, B = _bn_check(x, axis, training, weight, bias, running_mean, running_var)
    running = running_mean is not None
    stat = jax.ShapeDtypeStruct((C,), _math_dtype(x.dtype))
    shapes = [_like(x)]
    if training:
        shapes += [stat, stat] + ([_like(running_mean), _like(running_var)] if running else [])
    if _FFI and x.size > 0:
        out = list(_ffi("cynorm_batch_norm", tuple(shapes), x, weight, bias, running_mean,
                        running_var, a=A, c=C, b=B, eps=eps, momentum=momentum,
                        training=training, weight=weight is not None, bias=bias is not None,
                        running=running))
    else:
        def host(x, weight, bias, running_mean, running_var):
            rm, rv = (None, None) if not running else (np.array(running_mean),
                                                        np.array(running_var))
            y, sm, si = _cn.batch_norm(*_arrays(x, weight, bias), rm, rv, training, momentum,
                                       eps, axis)
            return (y, sm, si) + ((rm, rv) if running else ()) if training else (y,)
        out = list(_call(host, tuple(shapes), x, weight, bias, running_mean, running_var))
    y = out[0]
    save_mean, save_invstd = (out[1], out[2]) if training else (None, None)
    if training and running:
        running_mean, running_var = out[3], out[4]
    return y, running_mean, running_var, save_mean, save_invstd


_bn_forward_once = _first_order("batch_norm", _bn_forward, (5, 6, 7, 8))


@partial(jax.custom_jvp, nondiff_argnums=(5, 6, 7, 8))
def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps, axis):
    return _bn_forward(x, weight, bias, running_mean, running_var, training, momentum, eps,
                       axis)[:3]


def _batch_norm_jvp(training, momentum, eps, axis, primals, tangents):
    x, weight, bias, running_mean, running_var = primals
    y, rm, rv, sm, si = _bn_forward_once(x, weight, bias, running_mean, running_var, training,
                                         momentum, eps, axis)
    first, second = (sm, si) if training else (running_mean, running_var)
    ty = _tangent("batch_norm", (training, momentum, eps, axis),
                  (x, weight, bias, first, second), _materialized(tangents[:3]))
    if not training:        # y normalized by the running statistics
        ty = _by_running_stats(ty, x, weight, running_mean, running_var, *tangents[3:], eps,
                               axis)
    # the returned running statistics carry no derivative, as torch's buffers
    zero = [None if r is None else jnp.zeros_like(r) for r in (rm, rv)]
    return (y, rm, rv), (ty, zero[0], zero[1])


_batch_norm.defjvp(_batch_norm_jvp, symbolic_zeros=True)


def _batch_norm_host(primals, tangents, static):
    x, weight, bias, first, second = primals
    tx, tw, tb = tangents
    training, momentum, eps, axis = static
    # eval: first, second are the running statistics; training: copies
    # would be updated, and the output's tangent does not depend on them
    rm, rv = (None, None) if training else (np.array(first), np.array(second))
    return _cn.jvp(_cn.batch_norm, (x, weight, bias, rm, rv, training, momentum, eps, axis),
                   (tx, tw, tb, None, None, None, None, None, None))[1][0]


def _batch_norm_bwd(saved, gy, static):
    training, _, eps, axis = static
    x, weight, bias, first, second = saved
    A, C, B = _around(x, axis)
    shapes = _grad_shapes(x, weight, bias)
    if _FFI and x.size > 0:
        grads = list(_ffi("cynorm_batch_norm_backward", shapes, gy, x, weight, first, second,
                          a=A, c=C, b=B, eps=eps, training=training, weight=weight is not None,
                          weight_grad=weight is not None, bias_grad=bias is not None))
    else:
        mask = (True, weight is not None, bias is not None)

        def host(gy, x, weight, first, second):
            sm, si, rm, rv = (first, second, None, None) if training else (None, None, first,
                                                                           second)
            gx, gw, gb = _cn.batch_norm_backward(*_arrays(gy, x, weight, rm, rv, sm, si),
                                                 training, eps, mask, axis)
            return _given(gx, gw, gb)
        grads = list(_call(host, shapes, gy, x, weight, first, second))
    return _spread(grads, weight, bias)


def _batch_norm_traced(primals, tangents, static):
    x, weight, bias, first, second = primals
    tx, tw, tb = tangents
    training, _, eps, axis = static
    if x.size == 0:
        return jnp.zeros_like(x)
    A, C, B = _around(x, axis)
    pshape = _channel_shape(x, axis)
    xm = _math(x)
    if training:        # first, second: save_mean, save_invstd
        t_xhat = _input_tangent("cynorm_batch_norm_backward", x, tx, first, second, a=A, c=C,
                                b=B, eps=eps, training=True)
        scaled = (None if tw is None else (xm - first.reshape(pshape)) * second.reshape(pshape)
                  * _math(tw).reshape(pshape))
    else:
        # first, second: the running statistics; the kernels' invstd from
        # them (not XLA's rsqrt, which a jit may fold into a constant)
        first, second = _math(first), _math(second)
        t_xhat = _input_tangent("cynorm_batch_norm_backward", x, tx, first, second, a=A, c=C,
                                b=B, eps=eps, training=False)
        scaled = None if tw is None else _ffi(
            "cynorm_batch_norm", (_like(xm),), xm, _math(tw), first, second, a=A, c=C, b=B,
            eps=eps, momentum=0.0, training=False, weight=True, bias=False, running=True)[0]
    return _y_tangent(t_xhat, weight, scaled, tb, pshape, x)


_register_jvp("batch_norm", _batch_norm_host, _batch_norm_bwd,
              _batch_norm_traced if _FFI else None)


def batch_norm(x: Any, weight: Any = None, bias: Any = None, running_mean: Any = None,
               running_var: Any = None, training: bool = True, momentum: float = 0.1,
               eps: float = 1e-5, axis: int = 1) -> tuple[jax.Array, Any, Any]:
    """Batch norm over every axis of x but the channel axis
    (``torch.nn.functional.batch_norm``) on cynorm's kernels, differentiable
    with ``jax.grad`` (in x, weight and bias, and with training=False in the
    running statistics).

    JAX arrays are immutable, so where cynorm.batch_norm updates the running
    statistics in place this returns their new values.

    Parameters
    ----------
    x : jax.Array
        float64, float32, bfloat16 or float16, at least 2-D.
    weight, bias : jax.Array, optional
        Shape ``(C,)`` (C = x.shape[axis]): x's dtype, or float32 for 16-bit x.
    running_mean, running_var : jax.Array, optional
        Shape ``(C,)``, as weight; both or neither; required when
        ``training`` is False.
    training : bool, default True
        Normalize with the batch's statistics (and update the running ones),
        or with the running ones (static under jit).
    momentum : float, default 0.1
        The running statistics' update factor, as torch's (static).
    eps : float, default 1e-5
        Added to the variance (static).
    axis : int, default 1
        The channel axis: 1 for (N, C, ...), -1 for channels-last data (static).

    Returns
    -------
    y : jax.Array
        x's shape and dtype.
    running_mean, running_var : jax.Array or None
        In training, the updated running statistics; otherwise the ones
        given (None where none were given).
    """
    op = "batch_norm"
    return _batch_norm(jnp.asarray(x), _array(weight), _array(bias), _array(running_mean),
                       _array(running_var), _static(op, _v.check_bool, training, "training"),
                       _static(op, _v.check_real, momentum, "momentum"), _eps(op, eps),
                       _static(op, _v.check_int, axis, "axis"))


# ---- group norm --------------------------------------------------------------

def _gn_dims(x, num_groups, axis, weight, bias, op="group_norm"):
    """Trace-time checks of group_norm's arguments; (N, C, HW, channels last)."""
    if x.ndim < 2:
        raise ValueError(f"cynorm.jax.{op}: x must have at least 2 dimensions, "
                         f"got shape {tuple(x.shape)}")
    if not -x.ndim <= axis < x.ndim or axis % x.ndim not in (1, x.ndim - 1):
        raise ValueError(f"cynorm.jax.{op}: axis must be 1 (channels first) or -1 "
                         f"(channels last), got {axis} for {x.ndim} dimensions")
    last = axis % x.ndim != 1 and x.ndim > 2
    C = int(x.shape[-1] if last else x.shape[1])
    _check_params(op, x, (C,), dict(weight=weight, bias=bias))
    if num_groups < 1:
        raise ValueError(f"cynorm.jax.group_norm: num_groups must be >= 1, got {num_groups}")
    if C % num_groups:
        raise ValueError(f"cynorm.jax.group_norm: the channel count {C} must be divisible by "
                         f"num_groups ({num_groups})")
    N = int(x.shape[0])
    return N, C, int(np.prod(x.shape, dtype=np.int64)) // max(1, N * C), last


def _gn_forward(x, weight, bias, num_groups, eps, axis):
    N, C, HW, last = _gn_dims(x, num_groups, axis, weight, bias)
    stat = jax.ShapeDtypeStruct((N, num_groups), _math_dtype(x.dtype))
    shapes = (_like(x), stat, stat)
    if _FFI and x.size > 0:
        return _ffi("cynorm_group_norm", shapes, x, weight, bias, n=N, c=C, hw=HW,
                    groups=num_groups, last=last, eps=eps, weight=weight is not None,
                    bias=bias is not None)

    def host(x, weight, bias):
        return _cn.group_norm(*_arrays(x), num_groups, *_arrays(weight, bias), eps, axis)
    return _call(host, shapes, x, weight, bias)


_gn_forward_once = _first_order("group_norm", _gn_forward, (3, 4, 5))


@partial(jax.custom_jvp, nondiff_argnums=(3, 4, 5))
def _group_norm(x, weight, bias, num_groups, eps, axis):
    return _gn_forward(x, weight, bias, num_groups, eps, axis)[0]


@_group_norm.defjvp
def _group_norm_jvp(num_groups, eps, axis, primals, tangents):
    x, weight, bias = primals
    y, mean, rstd = _gn_forward_once(x, weight, bias, num_groups, eps, axis)
    return y, _tangent("group_norm", (num_groups, eps, axis), (x, weight, bias, mean, rstd),
                       tangents)


def _group_norm_host(primals, tangents, static):
    x, weight, bias, _, _ = primals
    tx, tw, tb = tangents
    num_groups, eps, axis = static
    return _cn.jvp(_cn.group_norm, (x, num_groups, weight, bias, eps, axis),
                   (tx, None, tw, tb, None, None))[1][0]


def _groups_backward(target, saved, gy, groups, axis, host, **attrs):
    """Group norm's and instance norm's backward: the FFI target on x as
    (N, C, HW) in `groups` groups (0: a group per channel), or on the host
    host(gy, x, mean, rstd, weight, output_mask); saved: x, weight, bias,
    mean, rstd first."""
    x, weight, bias, mean, rstd = saved[:5]
    N, C, HW, last = _gn_dims(x, groups or 1, axis, weight, bias)
    shapes = _grad_shapes(x, weight, bias)
    if _FFI and x.size > 0:
        grads = list(_ffi(target, shapes, gy, x, mean, rstd, weight, n=N, c=C, hw=HW,
                          groups=groups or C, last=last, weight=weight is not None,
                          weight_grad=weight is not None, bias_grad=bias is not None, **attrs))
    else:
        mask = (True, weight is not None, bias is not None)

        def run(gy, x, mean, rstd, weight):
            return _given(*host(*_arrays(gy, x, mean, rstd, weight), mask))
        grads = list(_call(run, shapes, gy, x, mean, rstd, weight))
    return _spread(grads, weight, bias)


def _group_norm_bwd(saved, gy, static):
    num_groups, _, axis = static
    return _groups_backward(
        "cynorm_group_norm_backward", saved, gy, num_groups, axis,
        lambda gy, x, mean, rstd, w, mask: _cn.group_norm_backward(gy, x, mean, rstd, w,
                                                                   num_groups, mask, axis))


def _groups_traced(target, primals, tangents, groups, axis, **attrs):
    """Group norm's and instance norm's traced tangent: the backward FFI
    target on x's tangent, in `groups` groups (0: a group per channel), then
    XLA's arithmetic for the parameters' terms; primals: x, weight, bias,
    mean, rstd first."""
    x, weight, bias, mean, rstd = primals[:5]
    tx, tw, tb = tangents
    if x.size == 0:
        return jnp.zeros_like(x)
    N, C, HW, last = _gn_dims(x, groups or 1, axis, weight, bias)
    G = groups or C
    t_xhat = _input_tangent(target, x, tx, mean, rstd, n=N, c=C, hw=HW, groups=G, last=last,
                            **attrs)
    pshape = (C,) if last else (1, C) + (1,) * (x.ndim - 2)
    scaled = None
    if tw is not None:
        # each group's (x - mean) * rstd, the statistics seen along its channels
        if last:
            g = _math(x).reshape(N, HW, G, C // G)
            xhat = (g - mean[:, None, :, None]) * rstd[:, None, :, None]
        else:
            g = _math(x).reshape(N, G, -1)
            xhat = (g - mean[..., None]) * rstd[..., None]
        scaled = xhat.reshape(x.shape) * _math(tw).reshape(pshape)
    return _y_tangent(t_xhat, weight, scaled, tb, pshape, x)


def _group_norm_traced(primals, tangents, static):
    num_groups, _, axis = static
    return _groups_traced("cynorm_group_norm_backward", primals, tangents, num_groups, axis)


_register_jvp("group_norm", _group_norm_host, _group_norm_bwd,
              _group_norm_traced if _FFI else None, rows=(0, 3, 4, 5), merge=True)


def group_norm(x: Any, num_groups: int, weight: Any = None, bias: Any = None,
               eps: float = 1e-5, axis: int = 1) -> jax.Array:
    """Group norm (``torch.nn.functional.group_norm``) on cynorm's kernels,
    differentiable with ``jax.grad``; channels-last data is read in place.

    Parameters
    ----------
    x : jax.Array
        float64, float32, bfloat16 or float16, (N, C, ...) or, with
        ``axis=-1``, (N, ..., C).
    num_groups : int
        Divides C (static under jit).
    weight, bias : jax.Array, optional
        Shape ``(C,)``: x's dtype, or float32 for 16-bit x.
    eps : float, default 1e-5
        Added to each group's variance (static).
    axis : int, default 1
        The channel axis: 1, or -1 for channels-last data (static).

    Returns
    -------
    jax.Array
        x's shape and dtype.
    """
    op = "group_norm"
    return _group_norm(jnp.asarray(x), _array(weight), _array(bias),
                       _static(op, _v.check_int, num_groups, "num_groups"), _eps(op, eps),
                       _static(op, _v.check_int, axis, "axis"))


# ---- instance norm -----------------------------------------------------------

def _in_check(x, axis, use_input_stats, weight, bias, running_mean, running_var):
    """Trace-time checks of instance_norm's arguments; (N, C, HW, channels
    last)."""
    N, C, HW, last = _gn_dims(x, 1, axis, None, None, op="instance_norm")
    _check_params("instance_norm", x, (C,), dict(weight=weight, bias=bias,
                                                 running_mean=running_mean,
                                                 running_var=running_var))
    if (running_mean is None) != (running_var is None):
        raise ValueError("cynorm.jax.instance_norm: pass running_mean and running_var together")
    if not use_input_stats and running_mean is None:
        raise ValueError("cynorm.jax.instance_norm: running_mean and running_var are required "
                         "when use_input_stats=False")
    if use_input_stats and HW < 2 and N * C:
        # as torch.nn.functional.instance_norm: (N, C) features passed for
        # (N, C, L) would normalize to zeros (cynorm.instance_norm refuses
        # it only where the running statistics' unbiased variance needs two)
        raise ValueError(f"cynorm.jax.instance_norm: x must have more than 1 spatial position "
                         f"per instance with use_input_stats=True (one normalizes to 0, and "
                         f"gives no unbiased variance for running statistics), got shape "
                         f"{tuple(x.shape)}")
    return N, C, HW, last


def _in_forward(x, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
                axis):
    """(y, new running mean, new running var, mean, rstd): the running
    statistics updated with use_input_stats (None where not given), the
    per-instance statistics (N, C) as the backward takes them."""
    N, C, HW, last = _in_check(x, axis, use_input_stats, weight, bias, running_mean,
                               running_var)
    running = running_mean is not None
    update = running and use_input_stats
    stat = jax.ShapeDtypeStruct((N, C), _math_dtype(x.dtype))
    shapes = (_like(x), stat, stat) + ((_like(running_mean), _like(running_var)) if update
                                       else ())
    if _FFI and x.size > 0:
        out = list(_ffi("cynorm_instance_norm", shapes, x, weight, bias, running_mean,
                        running_var, n=N, c=C, hw=HW, groups=C, last=last, eps=eps,
                        momentum=momentum, use_input_stats=use_input_stats, running=running,
                        weight=weight is not None, bias=bias is not None))
    else:
        def host(x, weight, bias, running_mean, running_var):
            rm, rv = (None, None) if not running else (np.array(running_mean),
                                                        np.array(running_var))
            y, mean, rstd = _cn.instance_norm(*_arrays(x, weight, bias), rm, rv,
                                              use_input_stats, momentum, eps, axis)
            return (y, mean, rstd) + ((rm, rv) if update else ())
        out = list(_call(host, shapes, x, weight, bias, running_mean, running_var))
    if update:
        running_mean, running_var = out[3], out[4]
    return out[0], running_mean, running_var, out[1], out[2]


_in_forward_once = _first_order("instance_norm", _in_forward, (5, 6, 7, 8))


@partial(jax.custom_jvp, nondiff_argnums=(5, 6, 7, 8))
def _instance_norm(x, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
                   axis):
    return _in_forward(x, weight, bias, running_mean, running_var, use_input_stats, momentum,
                       eps, axis)[:3]


def _instance_norm_jvp(use_input_stats, momentum, eps, axis, primals, tangents):
    x, weight, bias, running_mean, running_var = primals
    y, rm, rv, mean, rstd = _in_forward_once(x, weight, bias, running_mean, running_var,
                                             use_input_stats, momentum, eps, axis)
    # without use_input_stats the host rule needs the running statistics
    # that normalized (with it, none)
    fixed = (None, None) if use_input_stats else (running_mean, running_var)
    ty = _tangent("instance_norm", (use_input_stats, eps, axis),
                  (x, weight, bias, mean, rstd) + fixed, _materialized(tangents[:3]))
    if not use_input_stats:     # y normalized by the running statistics
        ty = _by_running_stats(ty, x, weight, running_mean, running_var, *tangents[3:], eps,
                               axis)
    # the returned running statistics carry no derivative, as torch's buffers
    zero = [None if r is None else jnp.zeros_like(r) for r in (rm, rv)]
    return (y, rm, rv), (ty, zero[0], zero[1])


_instance_norm.defjvp(_instance_norm_jvp, symbolic_zeros=True)


def _instance_norm_host(primals, tangents, static):
    x, weight, bias, _, _, rm, rv = primals
    tx, tw, tb = tangents
    use_input_stats, eps, axis = static
    rm, rv = (None, None) if rm is None else (np.array(rm), np.array(rv))
    return _cn.jvp(_cn.instance_norm, (x, weight, bias, rm, rv, use_input_stats, 0.0, eps,
                                       axis),
                   (tx, tw, tb, None, None, None, None, None, None))[1][0]


def _instance_norm_bwd(saved, gy, static):
    use_input_stats, _, axis = static
    return _groups_backward(
        "cynorm_instance_norm_backward", saved, gy, 0, axis,
        lambda gy, x, mean, rstd, w, mask: _cn.instance_norm_backward(
            gy, x, mean, rstd, w, use_input_stats, mask, axis),
        use_input_stats=use_input_stats)


def _instance_norm_traced(primals, tangents, static):
    use_input_stats, _, axis = static
    return _groups_traced("cynorm_instance_norm_backward", primals, tangents, 0, axis,
                          use_input_stats=use_input_stats)


_register_jvp("instance_norm", _instance_norm_host, _instance_norm_bwd,
              _instance_norm_traced if _FFI else None, rows=(0, 3, 4, 7), merge=True)


def instance_norm(x: Any, weight: Any = None, bias: Any = None, running_mean: Any = None,
                  running_var: Any = None, use_input_stats: bool = True, momentum: float = 0.1,
                  eps: float = 1e-5, axis: int = 1) -> tuple[jax.Array, Any, Any]:
    """Instance norm (``torch.nn.functional.instance_norm``) on cynorm's
    kernels, differentiable with ``jax.grad`` (in x, weight and bias, and
    with use_input_stats=False in the running statistics): each sample's
    channel normalized over its spatial positions; channels-last data is
    read in place.

    JAX arrays are immutable, so where cynorm.instance_norm updates the
    running statistics in place this returns their new values.

    Parameters
    ----------
    x : jax.Array
        float64, float32, bfloat16 or float16, (N, C, ...) or, with
        ``axis=-1``, (N, ..., C).
    weight, bias : jax.Array, optional
        Shape ``(C,)``: x's dtype, or float32 for 16-bit x.
    running_mean, running_var : jax.Array, optional
        Shape ``(C,)``, as weight; both or neither; required when
        ``use_input_stats`` is False.
    use_input_stats : bool, default True
        Normalize with each instance's statistics (and update the running
        ones with their batch average, the variance unbiased, as torch), or
        with the running ones (static under jit).
    momentum : float, default 0.1
        The running statistics' update factor, as torch's (static).
    eps : float, default 1e-5
        Added to the variance (static).
    axis : int, default 1
        The channel axis: 1, or -1 for channels-last data (static).

    Returns
    -------
    y : jax.Array
        x's shape and dtype.
    running_mean, running_var : jax.Array or None
        With use_input_stats, the updated running statistics; otherwise the
        ones given (None where none were given).
    """
    op = "instance_norm"
    return _instance_norm(jnp.asarray(x), _array(weight), _array(bias), _array(running_mean),
                          _array(running_var),
                          _static(op, _v.check_bool, use_input_stats, "use_input_stats"),
                          _static(op, _v.check_real, momentum, "momentum"), _eps(op, eps),
                          _static(op, _v.check_int, axis, "axis"))


# ---- weight norm -------------------------------------------------------------

def _wn_dims(v, g, dim):
    """Trace-time checks of weight_norm's arguments; (A, D, B) around dim
    (None: the whole array as one slice) and dim as an axis or None."""
    if v.dtype not in _FLOATS:
        raise TypeError(f"cynorm.jax.weight_norm: v: float64, float32, bfloat16 or float16 "
                        f"expected, got {v.dtype}")
    if dim is None:
        A, D, B = 1, 1, int(np.prod(v.shape, dtype=np.int64))
        kept = ((), (1,), (1,) * v.ndim)
    else:
        if not -v.ndim <= dim < max(v.ndim, 1) or v.ndim == 0:
            raise ValueError(f"cynorm.jax.weight_norm: dim {dim} is out of range for v of "
                             f"{v.ndim} dimensions")
        dim %= v.ndim
        A, D, B = _around(v, dim)
        kept = ((D,), tuple(D if i == dim else 1 for i in range(v.ndim)))
    if tuple(g.shape) not in kept:
        raise ValueError(f"cynorm.jax.weight_norm: g: one value per index of v's dim expected "
                         f"(shape {' or '.join(str(k) for k in dict.fromkeys(kept))}), got "
                         f"{tuple(g.shape)}")
    math = _math_dtype(v.dtype)
    if g.dtype not in (v.dtype, math):
        allowed = " or ".join(sorted({np.dtype(v.dtype).name, np.dtype(math).name}))
        raise TypeError(f"cynorm.jax.weight_norm: g must have dtype {allowed}, got {g.dtype}")
    return A, D, B, dim


def _wn_forward(v, g, dim):
    """(w, norm) for g as D values of v's math type."""
    A, D, B = _around(v, dim) if dim is not None else (1, 1, v.size)
    shapes = (_like(v), _like(g))
    if _FFI and v.size > 0:
        return _ffi("cynorm_weight_norm", shapes, v, g, a=A, d=D, b=B)

    def host(v, g):
        return _cn.weight_norm_interface(*_arrays(v, g), dim)
    return _call(host, shapes, v, g)


_wn_forward_once = _first_order("weight_norm", _wn_forward, (2,))


@partial(jax.custom_jvp, nondiff_argnums=(2,))
def _weight_norm(v, g, dim):
    return _wn_forward(v, g, dim)[0]


@_weight_norm.defjvp
def _weight_norm_jvp(dim, primals, tangents):
    v, g = primals
    w, norm = _wn_forward_once(v, g, dim)
    return w, _tangent("weight_norm", (dim,), (v, g, norm), tangents)


def _weight_norm_host(primals, tangents, static):
    v, g, _ = primals
    tv, tg = tangents
    (dim,) = static
    return _cn.jvp(_cn.weight_norm, (v, g, dim), (tv, tg, None))[1]


def _weight_norm_bwd(saved, gw, static):
    (dim,) = static
    v, g, norm = saved
    A, D, B = _around(v, dim) if dim is not None else (1, 1, v.size)
    if _FFI and v.size > 0:
        return tuple(_ffi("cynorm_weight_norm_backward", (_like(v), _like(g)), gw, v, g, norm,
                          a=A, d=D, b=B))

    def host(gw, v, g, norm):
        return _cn.weight_norm_backward(*_arrays(gw, v, g, norm), dim)
    return tuple(_call(host, (_like(v), _like(g)), gw, v, g, norm))


def _weight_norm_traced(primals, tangents, static):
    v, g, norm = primals
    tv, tg = tangents
    (dim,) = static
    if v.size == 0:
        return jnp.zeros_like(v)
    A, D, B = _around(v, dim) if dim is not None else (1, 1, v.size)
    vm = _math(v)
    terms = []
    if tv is not None:
        # w is linear in g and its Jacobian in v, (g / n) (I - v v^T / n^2)
        # per slice, is symmetric: the backward kernel applied to tv gives tv's term
        terms.append(_ffi("cynorm_weight_norm_backward", (_like(vm), _like(g)), _math(tv), vm,
                          g, norm, a=A, d=D, b=B)[0])
    if tg is not None:
        pshape = () if dim is None else tuple(D if i == dim else 1 for i in range(v.ndim))
        terms.append(vm * (tg / norm).reshape(pshape))
    if not terms:
        return jnp.zeros_like(v)
    tw = terms[0] if len(terms) == 1 else terms[0] + terms[1]
    return tw.astype(v.dtype)


_register_jvp("weight_norm", _weight_norm_host, _weight_norm_bwd,
              _weight_norm_traced if _FFI else None)


def weight_norm(v: Any, g: Any, dim: Optional[int] = 0) -> jax.Array:
    """Weight normalization w = g * v / ||v|| (``torch._weight_norm``, what
    ``torch.nn.utils.parametrizations.weight_norm`` computes) on cynorm's
    kernels, differentiable with ``jax.grad`` in v and g.

    Parameters
    ----------
    v : jax.Array
        The direction: float64, float32, bfloat16 or float16.
    g : jax.Array
        The magnitude, one value per index of v's `dim`: shape
        ``(v.shape[dim],)`` or v's keepdims shape (for ``dim=None``: ``()``,
        ``(1,)`` or all ones); v's dtype, or float32 for 16-bit v.
    dim : int or None, default 0
        The axis whose slices are normalized; -1 is the last axis, and None
        normalizes the whole array as one slice (torch spells that -1) (static).

    Returns
    -------
    jax.Array
        v's shape and dtype.  Norms accumulate in float64, as
        cynorm.weight_norm's.
    """
    v, g = jnp.asarray(v), jnp.asarray(g)
    if dim is not None:
        dim = _static("weight_norm", _v.check_int, dim, "dim", "an int or None")
    _, D, _, dim = _wn_dims(v, g, dim)
    # the kernels take g as D values of v's math type; JAX differentiates
    # the reshape and the conversion, so g's gradient comes back in g's form
    return _weight_norm(v, g.reshape(D).astype(_math_dtype(v.dtype)), dim)
