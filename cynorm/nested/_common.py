"""Checks and conversions shared by the nested ops."""
from __future__ import annotations

import numpy as np

from cynorm._dtypes import is_16bit
from cynorm._validation import check_int
from cynorm.nested.container import NestedArray


def check_nested(x: object, name: str) -> NestedArray:
    if not isinstance(x, NestedArray):
        raise TypeError(f"{name} must be a cynorm.nested.NestedArray, got {type(x).__name__}")
    return x


def nested_dim(x, dim, name="dim"):
    """Nested dim `dim` wrapped into [0, x.ndim); 0 is the component index."""
    d = check_int(dim, name)
    if not -x.ndim <= d < x.ndim:
        raise ValueError(f"{name}={d} is out of range for a nested array of {x.ndim} dims "
                         f"(expected {-x.ndim} <= {name} < {x.ndim})")
    return d % x.ndim


def component_dim(x, dim, name="dim"):
    """Nested dim `dim` (dim 0 = the component index) as a component axis;
    dim 0 is refused, as PyTorch's nested ops refuse it."""
    d = nested_dim(x, dim, name)
    if d == 0:
        raise ValueError(f"{name}=0 indexes the components: this op does not work over dim 0")
    return d - 1


def check_same_structure(a, a_name, b, b_name):
    if not a.same_structure(b):
        raise ValueError(f"{a_name} and {b_name} must have the same nested structure (component "
                         f"shapes), got {a!r} and {b!r}")
    if a.dtype != b.dtype:
        raise TypeError(f"{a_name} and {b_name} must have the same dtype, got {a.dtype} and {b.dtype}")


def math_buffer(x):
    """x's buffer in its math dtype (float32 for 16-bit storage)."""
    b = x.buffer
    return b.astype(np.float32) if is_16bit(b.dtype) else b


def stored(values, dtype):
    """Math-dtype values as storage dtype (16-bit: rounded from float32)."""
    if is_16bit(dtype):
        return np.asarray(values, np.float32).astype(dtype)
    # np.asarray, not np.ascontiguousarray: that one makes a 0-d value 1-d
    return np.asarray(values, dtype=dtype, order="C")


def row_lengths(x):
    """(starts, lengths), int64, of the buffer's last-dim rows: every
    component of shape (..., L) contributes numel / L rows of length L (none
    when L = 0)."""
    if x.ndim == 1:
        raise ValueError("the components are 0-d: there is no last dim to reduce over")
    def table():
        last = x.sizes[:, -1]
        rows = np.where(last > 0, x.numels // np.maximum(last, 1), 0)
        lengths = np.repeat(last, rows).astype(np.int64)
        starts = np.zeros(lengths.size, np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        starts.setflags(write=False)
        lengths.setflags(write=False)
        return starts, lengths
    return x._derived_value("rows", table)      # the structure's, computed once (read-only)
