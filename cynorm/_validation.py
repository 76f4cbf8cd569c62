"""Argument checks shared by every op: one place says "expected X, got Y"."""
import math
import operator

import numpy as np
from numpy.exceptions import AxisError

from cynorm._dtypes import POLICY, SUPPORTED_NAMES


def as_float_array(x, name):
    """x as an ndarray of a supported floating dtype; returns (array, policy).

    Array-likes (lists, objects with __array__) are converted as np.asarray
    does; non-native byte order is converted to native (a copy).  Masked
    arrays are refused: their mask would be silently ignored."""
    if type(x) is not np.ndarray:
        if isinstance(x, np.ma.MaskedArray):
            raise TypeError(f"{name} is a masked array: pass its data and handle the mask yourself")
        if isinstance(x, np.ndarray) or hasattr(x, "__array__") or isinstance(
                x, (list, tuple, float, int, np.generic)):
            x = np.asarray(x)
        else:
            raise TypeError(f"{name} must be a NumPy array, got {type(x).__name__}")
    policy = POLICY.get(x.dtype)
    if policy is None:
        native = x.dtype.newbyteorder("=") if x.dtype.byteorder not in ("=", "|") else None
        if native is not None and native in POLICY:
            return as_float_array(x.astype(native), name)
        raise TypeError(
            f"{name} must have a floating dtype ({SUPPORTED_NAMES}), got {x.dtype}")
    return x, policy


def check_int(value, name, what="an int"):
    """value as a Python int: integers and 0-d integer arrays, never bools."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}") from None


def normalize_dim(dim, ndim, name="dim"):
    """dim wrapped into [0, ndim), or None (meaning: every axis)."""
    if dim is None:
        return None
    d = check_int(dim, name, "an int or None")
    if not -ndim <= d < ndim:
        raise AxisError(
            f"{name}={d} is out of range for an array of {ndim} dimension"
            f"{'' if ndim == 1 else 's'} (expected -{ndim} <= {name} < {ndim})"
            if ndim else f"{name}={d} is invalid for a 0-d array (use {name}=None)")
    return d + ndim if d < 0 else d


def split_shape(shape, dim):
    """(A, D, B): the product of the axes before dim, dim's size, the product after."""
    if dim is None:
        return 1, 1, math.prod(shape)
    return math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])


def kept_shape(shape, dim):
    """The keepdims shape of a reduction over every axis but dim."""
    if dim is None:
        return (1,) * len(shape)
    return tuple(s if i == dim else 1 for i, s in enumerate(shape))


def check_per_channel(x, name, v_shape, dim, dtypes):
    """x holds one value per index of v's dim: keepdims layout or 1-D; returns x."""
    shape = x.shape
    if dim is None:
        ok = shape == () or shape == (1,) or shape == (1,) * len(v_shape)
    else:
        D = v_shape[dim]
        ok = shape == (D,) or shape == (1,) * dim + (D,) + (1,) * (len(v_shape) - dim - 1)
    if not ok:
        D = 1 if dim is None else v_shape[dim]
        want = kept_shape(v_shape, dim)
        alts = f"{want} or {(D,)}" + (" or ()" if dim is None else "")
        raise ValueError(f"{name} must have shape {alts} for v of shape {v_shape} "
                         f"and dim={dim}, got {shape}")
    return check_dtype(x, name, dtypes)


def check_dtype(a, name, dtypes):
    """a's dtype is one of dtypes; returns a."""
    if a.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype "
                        f"{' or '.join(str(d) for d in dtypes)}, got {a.dtype}")
    return a


def check_same(x, name, shape, dtype, ref="v"):
    if x.shape != shape:
        raise ValueError(f"{name} must have the shape of {ref} {shape}, got {x.shape}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have the dtype of {ref} ({dtype}), got {x.dtype}")


def check_out(out, name, shape, dtype, order="C"):
    """A caller-provided output: an ndarray of exactly shape/dtype, writeable,
    and contiguous in `order`: "C", or "CF" for either order."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array or None, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {out.shape}")
    if out.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {out.dtype}")
    if not out.flags.writeable:
        raise ValueError(f"{name} is read-only")
    if order == "C" and not out.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if order == "CF" and not (out.flags.c_contiguous or out.flags.f_contiguous):
        raise ValueError(f"{name} must be C-contiguous or F-contiguous")
    return out


def split_out(out, names):
    """out=None or a tuple with one entry (array or None) per output."""
    n = len(names)
    if out is None:
        return (None,) * n
    if not isinstance(out, tuple) or len(out) != n:
        raise TypeError(f"out must be None or a tuple of {n} arrays/None "
                        f"({', '.join(names)}), got {type(out).__name__}"
                        + (f" of length {len(out)}" if isinstance(out, tuple) else ""))
    return out


def check_threads(n):
    if isinstance(n, (bool, np.bool_)):
        raise TypeError(f"n must be a positive int, got {n!r}")
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"n must be a positive int, got {type(n).__name__}") from None
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return n


def check_eps(eps, name="eps"):
    """eps as a float >= 0."""
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number >= 0, got {eps!r}")
    e = float(eps)
    if not e >= 0.0:        # also rejects NaN
        raise ValueError(f"{name} must be >= 0, got {eps!r}")
    return e


def check_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def check_real(value, name):
    """A finite real number (momentum and the like)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


def check_mask(mask, name="output_mask", n=3):
    """A sequence of n booleans."""
    try:
        items = tuple(mask)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of {n} booleans, got {mask!r}") from None
    if len(items) != n:
        raise ValueError(f"{name} must have {n} entries, got {len(items)}")
    if not all(isinstance(m, (bool, np.bool_)) for m in items):
        raise TypeError(f"{name} must hold booleans, got {items!r}")
    return tuple(bool(m) for m in items)


def check_vector(a, name, length, dtypes, what):
    """A 1-D array of `length` values (one per channel) with a dtype in dtypes;
    returns the array."""
    a, _ = as_float_array(a, name)
    if a.shape != (length,):
        raise ValueError(f"{name} must have shape ({length},) (one value per {what}), "
                         f"got {a.shape}")
    return check_dtype(a, name, dtypes)


def check_updatable(a, name):
    """An array the op updates in place (running statistics): it must be an
    ndarray the result can be written back to, never a converted copy."""
    if not isinstance(a, np.ndarray) or isinstance(a, np.ma.MaskedArray):
        raise TypeError(f"{name} must be a NumPy array (it is updated in place), "
                        f"got {type(a).__name__}")
    if a.dtype.byteorder not in ("=", "|") and a.dtype.newbyteorder("=") != a.dtype:
        raise ValueError(f"{name} must have native byte order (it is updated in place), "
                         f"got {a.dtype}")
    if not a.flags.writeable:
        raise ValueError(f"{name} is read-only: it is updated in place")
    return a
