"""Array plumbing shared by every op: which memory order the kernels work
in, output allocation, and aliasing between outputs and inputs."""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Sequence, TypeVar

import numpy as np

from cynorm._kernels._alloc import empty as _empty
from cynorm._kernels._views import kernel_flat  # noqa: F401 (the ops' import point)
from cynorm._typing import Array
from cynorm._validation import check_out, split_shape

MaybeArray = TypeVar("MaybeArray", bound=Optional[Array])


def layout(arrays: Sequence[Array],
           outs: Sequence[Optional[Array]]) -> tuple[list[Array], Optional[tuple[int, ...]]]:
    """Kernel views of `arrays` (each C-contiguous), and the order of their
    axes in memory: None for C order, else the permutation p with which the
    kernels see a.transpose(p).  So data stored in any order of its axes is
    read in place: F order, or a channels-last array seen as (N, C, H, W)
    (what a channels_last torch tensor's .numpy() or DLPack view is).  A
    given output decides the order (C or F: check_big_out); without one, the
    inputs' common order, C order when they have none.  Inputs in another
    order, or in none, are copied once."""
    given = [o for o in outs if o is not None]
    if given:
        order = None if given[0].flags.c_contiguous else tuple(range(given[0].ndim))[::-1]
    elif all(a.flags.c_contiguous and a.flags.aligned for a in arrays):
        return list(arrays), None
    else:
        order = memory_order(arrays[0])
        if order is not None and not all(memory_order(a) == order for a in arrays[1:]):
            order = None
    if order is None:
        return [c_aligned(a) for a in arrays], None
    return [c_aligned(a.transpose(order)) for a in arrays], order


def memory_order(a: Array) -> Optional[tuple[int, ...]]:
    """The permutation p of a's axes with a.transpose(p) C-contiguous (the
    axes by falling stride); None where a is C-contiguous or in no order."""
    if a.flags.c_contiguous:
        return None
    order = tuple(sorted(range(a.ndim), key=lambda i: -abs(a.strides[i])))
    return order if a.transpose(order).flags.c_contiguous else None


def c_aligned(a: Array) -> Array:
    """a itself if C-contiguous and aligned (the kernels cast its data to
    typed pointers), else a C-contiguous aligned copy."""
    if a.flags.c_contiguous and a.flags.aligned:
        return a
    return np.require(a, requirements=["C", "A"])


def unalias(inputs: Sequence[MaybeArray], outs: Sequence[Optional[Array]],
            keep: Optional[Array] = None) -> list[MaybeArray]:
    """inputs, with a private copy of each that shares memory with a given
    output, so that no output is written before the inputs it overlaps are
    read.  One sharing is kept: an input that is exactly `keep` (the
    input-shaped output, out=v): pass only inputs of which every kernel
    reads an element, or a whole slice, before writing that element."""
    given = [o for o in outs if o is not None]
    if not given:
        return list(inputs)
    result = []
    for a in inputs:
        if a is not None and not (keep is not None and same_array(a, keep)) and any(
                np.may_share_memory(a, o) for o in given):
            a = a.copy()
        result.append(a)
    return result


def same_array(a: Array, b: Array) -> bool:
    """a and b are the same elements in the same layout (out=v)."""
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.strides == b.strides and a.shape == b.shape and a.dtype == b.dtype)


def check_distinct(named: Iterable[tuple[str, Optional[Array]]]) -> None:
    """The arrays an op writes ((name, array or None) pairs: its outputs and
    the statistics it updates in place) share no memory: one memory cannot
    hold two results."""
    given = [(n, a) for n, a in named if a is not None]
    for i, (name_a, a) in enumerate(given):
        for name_b, b in given[i + 1:]:
            if np.may_share_memory(a, b) and _shares_memory(a, b):
                raise ValueError(f"{name_a} and {name_b} share memory: each result needs "
                                 f"its own array")


def _shares_memory(a: Array, b: Array) -> bool:
    try:
        return np.shares_memory(a, b, max_work=1 << 16)  # type: ignore[arg-type]  # numpy's stub allows only -1 and 0
    except np.exceptions.TooHardError:    # strides too tangled to tell: assume they do
        return True


def big_out(out: Optional[Array], shape: tuple[int, ...], dtype: np.dtype[Any],
            order: Optional[tuple[int, ...]]) -> tuple[Array, Array]:
    """The kernel's C-contiguous buffer for an input-shaped output, and the
    array the caller gets back: in `order` (layout), as the inputs."""
    if out is None:
        kshape = shape if order is None else tuple(shape[i] for i in order)
        buf = _empty(kshape, dtype, math.prod(kshape) * dtype.itemsize)
        return buf, (buf if order is None else buf.transpose(_inverse(order)))
    return (out if order is None else out.transpose(order)), out


def _inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(order)
    for i, o in enumerate(order):
        inv[o] = i
    return tuple(inv)


def check_big_out(out: Any, name: str, shape: tuple[int, ...], dtype: Any) -> Optional[Array]:
    if out is None:
        return None
    return check_out(out, name, shape, dtype, order="CF")


def small_out(out: Any, name: str, shape: tuple[int, ...], dtype: Any) -> tuple[Array, Array]:
    """A per-channel output: (contiguous array the kernel writes, array returned).
    The kernels see only the data of per-channel arrays, so no reshape."""
    arr = np.empty(shape, dtype) if out is None else check_out(out, name, shape, dtype)
    return arr, arr


def kernel_dims(shape: tuple[int, ...], dim: Optional[int],
                order: Optional[tuple[int, ...]]) -> tuple[int, int, int]:
    """(A, D, B) of the kernels' view (layout's order) around dim."""
    if order is not None:
        shape = tuple(shape[i] for i in order)
        dim = None if dim is None else order.index(dim)
    return split_shape(shape, dim)
