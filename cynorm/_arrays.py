"""Array plumbing shared by every op: which memory order the kernels work
in, output allocation, and aliasing between outputs and inputs."""
import math

import numpy as np

from cynorm._kernels._alloc import empty as _empty
from cynorm._kernels._views import kernel_flat  # noqa: F401 (the ops' import point)
from cynorm._validation import check_out, split_shape


def layout(arrays, outs):
    """Kernel views of `arrays` (all C-contiguous), and whether they are the
    transposes of F-ordered data.  A given output decides the order; without
    one, F order is used only when every input is F-contiguous (and not C).
    Inputs in the other order, or in neither, are copied once."""
    given = [o for o in outs if o is not None]
    if given:
        use_f = not given[0].flags.c_contiguous
    elif all(a.flags.c_contiguous and a.flags.aligned for a in arrays):
        return arrays, False
    else:
        use_f = all(a.flags.f_contiguous for a in arrays)
    if use_f:
        return [np.require(a, requirements="FA").T for a in arrays], True
    return [c_aligned(a) for a in arrays], False


def c_aligned(a):
    """a itself if C-contiguous and aligned (the kernels cast its data to
    typed pointers), else a C-contiguous aligned copy."""
    return np.require(a, requirements="CA")


def unalias(inputs, outs, keep=None):
    """inputs, with a private copy of each that shares memory with a given
    output, so that no output is written before the inputs it overlaps are
    read.  One sharing is kept: an input that is exactly `keep` (the
    input-shaped output, out=v): pass only inputs of which every kernel
    reads an element, or a whole slice, before writing that element."""
    given = [o for o in outs if o is not None]
    if not given:
        return inputs
    result = []
    for a in inputs:
        if a is not None and not (keep is not None and same_array(a, keep)) and any(
                np.may_share_memory(a, o) for o in given):
            a = a.copy()
        result.append(a)
    return result


def same_array(a, b):
    """a and b are the same elements in the same layout (out=v)."""
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.strides == b.strides and a.shape == b.shape and a.dtype == b.dtype)


def check_distinct(named):
    """The arrays an op writes ((name, array or None) pairs: its outputs and
    the statistics it updates in place) share no memory: one memory cannot
    hold two results."""
    given = [(n, a) for n, a in named if a is not None]
    for i, (name_a, a) in enumerate(given):
        for name_b, b in given[i + 1:]:
            if np.may_share_memory(a, b) and _shares_memory(a, b):
                raise ValueError(f"{name_a} and {name_b} share memory: each result needs "
                                 f"its own array")


def _shares_memory(a, b):
    try:
        return np.shares_memory(a, b, max_work=1 << 16)
    except np.exceptions.TooHardError:    # strides too tangled to tell: assume they do
        return True


def big_out(out, shape, dtype, transposed):
    """The kernel's C-contiguous buffer for an input-shaped output, and the array
    the caller gets back."""
    if out is None:
        kshape = shape[::-1] if transposed else shape
        buf = _empty(kshape, dtype, math.prod(kshape) * dtype.itemsize)
        return buf, (buf.T if transposed else buf)
    return (out.T if transposed else out), out


def check_big_out(out, name, shape, dtype):
    if out is None:
        return None
    return check_out(out, name, shape, dtype, order="CF")


def small_out(out, name, shape, dtype):
    """A per-channel output: (contiguous array the kernel writes, array returned).
    The kernels see only the data of per-channel arrays, so no reshape."""
    if out is None:
        arr = np.empty(shape, dtype)
        return arr, arr
    return check_out(out, name, shape, dtype), out


def kernel_dims(shape, dim, transposed):
    if transposed:
        shape = shape[::-1]
        dim = None if dim is None else len(shape) - 1 - dim
    return split_shape(shape, dim)
