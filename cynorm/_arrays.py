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


def layout(arrays: Sequence[Array], outs: Sequence[Optional[Array]]) -> tuple[list[Array], bool]:
    """Kernel views of `arrays` (all C-contiguous), and whether they are the
    transposes of F-ordered data.  A given output decides the order; without
    one, F order is used only when every input is F-contiguous (and not C).
    Inputs in the other order, or in neither, are copied once."""
    given = [o for o in outs if o is not None]
    if given:
        use_f = not given[0].flags.c_contiguous
    elif all(a.flags.c_contiguous and a.flags.aligned for a in arrays):
        return list(arrays), False
    else:
        use_f = all(a.flags.f_contiguous for a in arrays)
    if use_f:
        return [np.require(a, requirements=["F", "A"]).T for a in arrays], True
    return [c_aligned(a) for a in arrays], False


def c_aligned(a: Array) -> Array:
    """a itself if C-contiguous and aligned (the kernels cast its data to
    typed pointers), else a C-contiguous aligned copy."""
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
            transposed: bool) -> tuple[Array, Array]:
    """The kernel's C-contiguous buffer for an input-shaped output, and the array
    the caller gets back."""
    if out is None:
        kshape = shape[::-1] if transposed else shape
        buf = _empty(kshape, dtype, math.prod(kshape) * dtype.itemsize)
        return buf, (buf.T if transposed else buf)
    return (out.T if transposed else out), out


def check_big_out(out: Any, name: str, shape: tuple[int, ...], dtype: Any) -> Optional[Array]:
    if out is None:
        return None
    return check_out(out, name, shape, dtype, order="CF")


def small_out(out: Any, name: str, shape: tuple[int, ...], dtype: Any) -> tuple[Array, Array]:
    """A per-channel output: (contiguous array the kernel writes, array returned).
    The kernels see only the data of per-channel arrays, so no reshape."""
    arr = np.empty(shape, dtype) if out is None else check_out(out, name, shape, dtype)
    return arr, arr


def kernel_dims(shape: tuple[int, ...], dim: Optional[int], transposed: bool) -> tuple[int, int, int]:
    if transposed:
        shape = shape[::-1]
        dim = None if dim is None else len(shape) - 1 - dim
    return split_shape(shape, dim)
