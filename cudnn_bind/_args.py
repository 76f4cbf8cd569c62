"""Checks of public arguments before they reach ctypes.

ctypes raises ArgumentError for a wrong type and silently wraps an int too
big for a C int or a pointer; float() raises OverflowError for a huge int.
These raise TypeError (wrong type) or ValueError (out of range) naming the
argument instead.  They take any object (``Any``): checking it is their job.
"""
from __future__ import annotations

import ctypes
import math
import operator
from typing import Any, Optional

import numpy as np

C_INT_MAX = 2 ** 31 - 1
UINT64_MAX = 2 ** 64 - 1  # size_t and pointers (64-bit platforms only)


def show(value: object) -> str:
    """repr(value), short: a huge int as its bit length (str() of an int of
    over 4300 digits raises ValueError)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    try:
        text = repr(value)
    except ValueError:  # a huge int inside
        return f"a {type(value).__name__} too large to show"
    return text if len(text) <= 80 else text[:77] + "..."


def integer(value: Any, name: str, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    """value as a Python int in [lo, hi]: Python and NumPy integers, not bools."""
    if not isinstance(value, (bool, np.bool_)):
        try:
            value = operator.index(value)
        except TypeError:
            pass
        else:
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                bounds = (f"between {lo} and {hi}" if lo is not None and hi is not None
                          else f">= {lo}" if lo is not None else f"<= {hi}")
                raise ValueError(f"{name} must be {bounds}, got {show(value)}")
            return value
    raise TypeError(f"{name} must be an int, got {type(value).__name__} {show(value)}")


def integers(values: Any, name: str, lo: Optional[int] = None,
             hi: Optional[int] = None) -> tuple[int, ...]:
    """A sequence of ints (tuple, list, NumPy array) as a tuple, each checked by integer()."""
    try:
        if isinstance(values, (str, bytes, dict)):
            raise TypeError
        items = list(values)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__} "
                        f"{show(values)}") from None
    return tuple(integer(v, f"{name}[{i}]", lo, hi) for i, v in enumerate(items))


def real(value: Any, name: str) -> float:
    """value as a finite Python float (not a bool or a string)."""
    if type(value) is float and value - value == 0.0:  # finite: the common case
        return value
    if not isinstance(value, (bool, np.bool_, str, bytes)):
        try:
            value = float(value)
        except OverflowError:
            raise ValueError(f"{name} is too large for a C double: {show(value)}") from None
        except (TypeError, ValueError):
            pass
        else:
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value}")
            return value
    raise TypeError(f"{name} must be a real number, got {type(value).__name__} {show(value)}")


def stream_value(stream: Any, name: str = "stream") -> int:
    """A cudaStream_t as an int: None (the legacy default stream, 0), an int,
    or a stream object of PyTorch (.cuda_stream), CuPy (.ptr) or Numba
    (.handle)."""
    if stream is None:
        return 0
    try:
        return integer(stream, name, 0, UINT64_MAX)
    except TypeError:  # not an int: a stream object
        pass
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if isinstance(value, ctypes.c_void_p):  # Numba's stream.handle
            value = value.value or 0
        if isinstance(value, int) and not isinstance(value, bool):
            return integer(value, f"{name}.{attr}", 0, UINT64_MAX)
    raise TypeError(f"{name} must be None, an int cudaStream_t or an object with .ptr / "
                    f".cuda_stream, got {type(stream).__name__}")
