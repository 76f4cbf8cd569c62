"""Argument checks shared by every op: one place says "expected X, got Y"."""
from __future__ import annotations

import math
import operator
from typing import Any, Collection, Optional, Sequence

import numpy as np
from numpy.exceptions import AxisError

from cynorm._dtypes import POLICY, SUPPORTED_NAMES, Policy, bfloat16, policy_of
from cynorm._kernels._dlpack import from_dlpack
from cynorm._typing import Array, ArrayLike, OutArray, OutArrays


def is_dlpack(x: Any) -> bool:
    """Whether x is read through DLPack: a tensor of another library (torch,
    JAX, ...) that exports ``__dlpack__``; never an ndarray."""
    return not isinstance(x, np.ndarray) and hasattr(type(x), "__dlpack__")


def dlpack_array(x: Any, name: str, writable: bool = False) -> Array:
    """x (is_dlpack) as an ndarray over its memory, zero-copy, bfloat16
    included; writable: the op writes into it (out=, running statistics),
    so memory its producer marks read-only, or a JAX array's (immutable),
    is refused."""
    a, ok = from_dlpack(x, name)
    if writable and (not ok or type(x).__module__.split(".")[0] in ("jax", "jaxlib")):
        raise ValueError(f"{name} is read-only ({type(x).__name__} exports its memory "
                         f"read-only through DLPack): pass a writable array")
    return a


def as_float_array(x: ArrayLike, name: str, untyped: Any = None) -> tuple[Array, Policy]:
    """x as an ndarray of a supported floating dtype; returns (array, policy).

    Tensors of other libraries that export ``__dlpack__`` (torch, JAX) are
    read in place (is_dlpack); other array-likes (lists, objects with
    __array__) are converted as np.asarray does; non-native byte order is
    converted to native (a copy).  untyped: the dtype that a list, tuple or
    Python number, which has no dtype of its own, is converted to (a
    parameter's: x's math type); None: NumPy's choice.  Masked arrays are
    refused: their mask would be silently ignored."""
    if type(x) is not np.ndarray:
        if is_dlpack(x):
            x = dlpack_array(x, name)
        elif untyped is not None and isinstance(x, (list, tuple, float, int)):
            x = as_array(x, name)
            if x.dtype.kind in "iuf":       # numbers (not bools, strings, objects, ...)
                x = x.astype(untyped)
        elif isinstance(x, np.ndarray) or hasattr(x, "__array__") or isinstance(
                x, (list, tuple, float, int, np.generic)):
            x = as_array(x, name)
        else:
            raise TypeError(f"{name} must be a NumPy array, got {type(x).__name__}")
    policy = policy_of(x.dtype)
    if policy is None:
        native = x.dtype.newbyteorder("=") if x.dtype.byteorder not in ("=", "|") else None
        if native is not None and native in POLICY:
            return as_float_array(x.astype(native), name)
        raise TypeError(
            f"{name} must have a floating dtype ({SUPPORTED_NAMES}), got {x.dtype}")
    return x, policy


def as_array(x: ArrayLike, name: str) -> Array:
    """np.asarray(x), its errors (ragged nested lists, ...) naming the
    argument; a DLPack tensor read in place (is_dlpack).  Masked arrays are
    refused: their mask would be silently ignored."""
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array: pass its data and handle the mask yourself")
    if is_dlpack(x):
        return dlpack_array(x, name)
    try:
        return np.asarray(x)
    except (TypeError, ValueError, OverflowError) as e:
        kind = TypeError if isinstance(e, TypeError) else ValueError
        raise kind(f"{name} could not be converted to an array: {e}") from None


def in_memory(a: Array) -> Array:
    """a, or a C-contiguous copy of it when it claims more elements than the
    memory it spans holds (a broadcast or self-overlapping view).

    The Cython kernels copy such an input before reading it (np.require in
    cynorm._arrays), so one claiming more elements than memory can hold is
    refused at once, with NumPy's MemoryError from that copy.  The NumPy-level
    ops call this before reducing, to refuse it the same way instead of
    reducing over every claimed element first (2**41 of them for
    np.broadcast_to(np.float32(1), (2**20, 2**21)))."""
    if a.size <= 1:
        return a
    span = a.itemsize + sum((n - 1) * abs(s) for n, s in zip(a.shape, a.strides))
    return np.ascontiguousarray(a) if a.nbytes > span else a


def as_dtype(value: Any, name: str) -> np.dtype[Any]:
    """value as a np.dtype (a dtype, a type or a name), or a TypeError naming `name`."""
    if value is None:
        raise TypeError(f"{name} must be a dtype, got None")
    try:
        return np.dtype(value)
    except (TypeError, ValueError):
        if isinstance(value, str) and value == "bfloat16":
            return bfloat16()       # the name, before ml_dtypes is imported
        raise TypeError(f"{name} must be a dtype, got {value!r}") from None


def real_number(value: Any, name: str, what: str = "a real number") -> float:
    """value (an int or a float, NumPy's too; never a bool) as a Python float.
    An int beyond float's range raises ValueError naming `name` (not
    float()'s OverflowError)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must be {what}, got an int too large for a float "
                         f"({int(value).bit_length()} bits)") from None


class IndexOutOfRange(ValueError, IndexError):
    """An index argument out of range: a ValueError, as every bad argument,
    and an IndexError, as NumPy's AxisError is, for code that catches that."""


def check_index(index: Any, size: int, name: str, where: str) -> int:
    """index (an int) wrapped into [0, size); `where` names what is indexed."""
    i = check_int(index, name)
    if not -size <= i < size:
        raise IndexOutOfRange(f"{name} {i} is out of range for {where} of size {size} "
                              f"(expected {-size} <= {name} < {size})")
    return i % size


def int_tuple(value: Any, name: str, what: str = "an int or a tuple of ints") -> tuple[int, ...]:
    """value (an int, or a sequence of ints) as a tuple of Python ints."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    try:
        return (operator.index(value),)
    except TypeError:
        pass
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        items = tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be {what}, got {value!r}") from None
    return tuple(check_int(v, name, what) for v in items)


def check_int(value: Any, name: str, what: str = "an int") -> int:
    """value as a Python int: integers and 0-d integer arrays, never bools."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}") from None


def normalize_dim(dim: Any, ndim: int, name: str = "dim") -> Optional[int]:
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


def split_shape(shape: Sequence[int], dim: Optional[int]) -> tuple[int, int, int]:
    """(A, D, B): the product of the axes before dim, dim's size, the product after."""
    if dim is None:
        return 1, 1, math.prod(shape)
    return math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])


def kept_shape(shape: Sequence[int], dim: Optional[int]) -> tuple[int, ...]:
    """The keepdims shape of a reduction over every axis but dim."""
    if dim is None:
        return (1,) * len(shape)
    return tuple(s if i == dim else 1 for i, s in enumerate(shape))


def check_per_channel(x: Array, name: str, v_shape: tuple[int, ...], dim: Optional[int],
                      dtypes: Collection[Any]) -> Array:
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


def check_dtype(a: Array, name: str, dtypes: Collection[Any]) -> Array:
    """a's dtype is one of dtypes; returns a."""
    if a.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype "
                        f"{' or '.join(str(d) for d in dtypes)}, got {a.dtype}")
    return a


def check_same(x: Array, name: str, shape: tuple[int, ...], dtype: Any, ref: str = "v") -> None:
    if x.shape != shape:
        raise ValueError(f"{name} must have the shape of {ref} {shape}, got {x.shape}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have the dtype of {ref} ({dtype}), got {x.dtype}")


def check_out(out: Any, name: str, shape: tuple[int, ...], dtype: Any, order: str = "C") -> Array:
    """A caller-provided output: an ndarray of exactly shape/dtype, writeable,
    and contiguous in `order`: "C", or "CF" for either order.  A writable
    DLPack tensor (a torch tensor) is written in place through an ndarray
    view of its memory, which the op returns."""
    if is_dlpack(out):
        out = dlpack_array(out, name, writable=True)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array, a writable DLPack tensor or None, "
                        f"got {type(out).__name__}")
    if isinstance(out, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array: its mask would be ignored (pass a plain "
                        f"array, e.g. its .data)")
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


def single_out(out: OutArray) -> Optional[Array]:
    """out= of a single-output function: an array or None, or a tuple of
    one (array or None), the form the multi-output functions take."""
    if isinstance(out, tuple):
        if len(out) != 1:
            raise TypeError(f"out must be an array, None or a tuple of one array/None, "
                            f"got a tuple of length {len(out)}")
        return out[0]
    return out


def split_out(out: OutArrays, names: Sequence[str]) -> tuple[Optional[Array], ...]:
    """out=None or a tuple with one entry (array or None) per output."""
    n = len(names)
    if out is None:
        return (None,) * n
    if not isinstance(out, tuple) or len(out) != n:
        raise TypeError(f"out must be None or a tuple of {n} arrays/None "
                        f"({', '.join(names)}), got {type(out).__name__}"
                        + (f" of length {len(out)}" if isinstance(out, tuple) else ""))
    return out


MAX_THREADS = 2**31 - 1      # omp_set_num_threads takes a C int


def check_threads(n: Any, name: str = "n") -> int:
    n = check_int(n, name, "a positive int")
    if n < 1:
        raise ValueError(f"{name} must be >= 1, got {n}")
    if n > MAX_THREADS:
        raise ValueError(f"{name} must be at most {MAX_THREADS}, got {n}")
    return n


def check_byte_count(limit: Any, name: str = "limit") -> int:
    """A byte count: an int, 0 <= limit < 2**64 (a C size_t)."""
    limit = check_int(limit, name, "an int (a number of bytes)")
    if limit < 0:
        raise ValueError(f"{name} must be >= 0 bytes, got {limit}")
    if limit >= 2**64:
        raise ValueError(f"{name} must be below 2**64 bytes, got {limit}")
    return limit


def check_eps(eps: Any, name: str = "eps") -> float:
    """eps as a float >= 0."""
    e = real_number(eps, name, "a real number >= 0")
    if not e >= 0.0:        # also rejects NaN
        raise ValueError(f"{name} must be >= 0, got {eps!r}")
    return e


def check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def check_real(value: Any, name: str) -> float:
    """A finite real number (momentum and the like)."""
    v = real_number(value, name)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


def check_mask(mask: Any, name: str = "output_mask", n: int = 3) -> tuple[bool, ...]:
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


def check_vector(a: ArrayLike, name: str, length: int, dtypes: Sequence[Any], what: str) -> Array:
    """A 1-D array of `length` values (one per channel) with a dtype in
    dtypes (a Policy's coefficients: the math type last, which a list is
    converted to); returns the array."""
    a, _ = as_float_array(a, name, untyped=dtypes[-1])
    if a.shape != (length,):
        raise ValueError(f"{name} must have shape ({length},) (one value per {what}), "
                         f"got {a.shape}")
    return check_dtype(a, name, dtypes)


def check_updatable(a: Any, name: str) -> Array:
    """An array the op updates in place (running statistics): it must be an
    ndarray the result can be written back to, never a converted copy, or a
    writable DLPack tensor (a torch tensor), updated through a view of its
    memory."""
    if is_dlpack(a):
        a = dlpack_array(a, name, writable=True)
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array: it is updated in place, and its mask "
                        f"would be ignored (pass a plain array, e.g. its .data)")
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array or a writable DLPack tensor (it is "
                        f"updated in place), got {type(a).__name__}")
    if a.dtype.byteorder not in ("=", "|") and a.dtype.newbyteorder("=") != a.dtype:
        raise ValueError(f"{name} must have native byte order (it is updated in place), "
                         f"got {a.dtype}")
    if not a.flags.writeable:
        raise ValueError(f"{name} is read-only: it is updated in place")
    return a
