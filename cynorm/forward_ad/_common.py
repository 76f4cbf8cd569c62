"""Pieces the JVP rules share: argument binding, dtype handling, zeros."""
import inspect

import numpy as np

from cynorm._dtypes import is_16bit
from cynorm._validation import check_updatable


_POSITIONAL, _KEYWORD = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
_NO_DEFAULT = inspect.Parameter.empty

# op -> (signature, parameter names, count of positional ones, defaults,
# whether every parameter is positional-or-keyword or keyword-only), for
# the ops rules are registered for (a signature is ~10 us to build)
_signatures: dict = {}


def _signature(op):
    entry = _signatures.get(op)
    if entry is None:
        sig = inspect.signature(op)
        params = list(sig.parameters.values())
        plain = all(p.kind in (_POSITIONAL, _KEYWORD) for p in params)
        entry = _signatures[op] = (
            sig, [p.name for p in params], sum(p.kind == _POSITIONAL for p in params),
            {p.name: p.default for p in params if p.default is not _NO_DEFAULT}, plain)
    return entry


def _bind_plain(names, npos, defaults, primals, kwargs):
    """sig.bind(*primals, **kwargs) + apply_defaults for a signature without
    *args, **kwargs or positional-only parameters; None where binding fails
    (sig.bind then says why)."""
    if len(primals) > npos:
        return None
    args = dict(zip(names, primals))
    used = 0
    for n in names[len(primals):]:
        if n in kwargs:
            args[n] = kwargs[n]
            used += 1
        elif n in defaults:
            args[n] = defaults[n]
        else:
            return None
    return args if used == len(kwargs) else None


def bind(op, primals, tangents, kwargs):
    """(args, tans): op's arguments by name with defaults applied, and the
    tangents by name (None for keyword arguments and absent tangents)."""
    sig, names, npos, defaults, plain = _signature(op)
    args = _bind_plain(names, npos, defaults, primals, kwargs) if plain else None
    if args is None:
        try:
            bound = sig.bind(*primals, **kwargs)
        except TypeError as e:
            raise TypeError(f"jvp: {op.__name__}{sig}: {e}") from None
        bound.apply_defaults()
        args = bound.arguments
    tans = dict.fromkeys(names)
    tans.update(zip(names, tangents))
    return args, tans


def math_dtype(dtype):
    """The dtype tangent math runs in: float64 for float64, else float32."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def m(a, dtype):
    """a (an array or None) in the math dtype `dtype`; None stays None."""
    return None if a is None else np.asarray(a).astype(dtype, copy=False)


def cube(a):
    """a**3 as two multiplies: the same bits on every platform (NumPy's
    power is a SIMD routine of its own on x86-64 with AVX-512, libm's pow on
    aarch64, and their last bits differ)."""
    return a * a * a


def tangent_sum(a, b, dtype):
    """a + b for tangents (None: zero) in the math dtype `dtype`; None when
    both are None (h = x + residual's tangent)."""
    if a is None and b is None:
        return None
    if a is None or b is None:
        return m(a if b is None else b, dtype)
    return m(a, dtype) + m(b, dtype)


def cast_like(t, out, fresh=False):
    """Tangent t as out's dtype and shape (16-bit outputs round from float32
    as the kernels do); None where the output is None.  The result is a new
    array, except that `fresh=True` (t is the rule's own new array, never a
    caller's) lets a t of the right dtype be returned reshaped, uncopied."""
    if out is None:
        return None
    t = np.asarray(t)
    if t.size == out.size and t.shape != out.shape:
        t = t.reshape(out.shape)
    if fresh and t.dtype == out.dtype and t.flags.c_contiguous:
        return t
    if t.shape != out.shape:
        t = np.broadcast_to(t, out.shape)
    if is_16bit(out.dtype):
        t = t.astype(np.float32, copy=False)
    return np.array(t, dtype=out.dtype)      # a fresh writable array, never a view


def zeros_like(outputs):
    """Zero tangents mirroring `outputs` (a tuple, or one array)."""
    if isinstance(outputs, tuple):
        return tuple(None if o is None else np.zeros_like(o) for o in outputs)
    return None if outputs is None else np.zeros_like(outputs)


def check_running_tangents(t, updating):
    """The tangents of running_mean / running_var (positional arguments 3
    and 4) must be updatable arrays where the op updates the statistics (the
    rule updates the tangents in place, as the op does the statistics)."""
    for i, name in ((3, "running_mean"), (4, "running_var")):
        if updating and t[name] is not None:
            check_updatable(t[name], f"tangents[{i}] (for {name})")
