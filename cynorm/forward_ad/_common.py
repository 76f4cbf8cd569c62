"""Pieces the JVP rules share: argument binding, dtype handling, zeros."""
import inspect

import numpy as np

from cynorm._dtypes import is_16bit


def bind(op, primals, tangents, kwargs):
    """(args, tans): op's arguments by name with defaults applied, and the
    tangents by name (None for keyword arguments and absent tangents)."""
    sig = inspect.signature(op)
    try:
        bound = sig.bind(*primals, **kwargs)
    except TypeError as e:
        raise TypeError(f"jvp: {op.__name__}{sig}: {e}") from None
    bound.apply_defaults()
    names = list(sig.parameters)
    tans = dict.fromkeys(names)
    tans.update(zip(names, tangents))
    return bound.arguments, tans


def math_dtype(dtype):
    """The dtype tangent math runs in: float64 for float64, else float32."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def m(a, dtype):
    """a (an array or None) in the math dtype `dtype`; None stays None."""
    return None if a is None else np.asarray(a).astype(dtype, copy=False)


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
    t = np.broadcast_to(t, out.shape)
    if is_16bit(out.dtype):
        t = t.astype(np.float32, copy=False)
    return np.array(t, dtype=out.dtype)      # a fresh writable array, never a view


def zeros_like(outputs):
    """Zero tangents mirroring `outputs` (a tuple, or one array)."""
    if isinstance(outputs, tuple):
        return tuple(None if o is None else np.zeros_like(o) for o in outputs)
    return None if outputs is None else np.zeros_like(outputs)
