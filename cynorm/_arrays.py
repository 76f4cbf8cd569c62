"""Array plumbing shared by every op: which memory order the kernels work
in, output allocation, aliasing between outputs and inputs, and the size
above which outputs are written with streaming stores."""
import glob
import math
import os

import numpy as np

from cynorm._kernels._alloc import empty as _empty
from cynorm._validation import check_out, split_shape


def last_level_cache_bytes():
    """Size of the largest CPU cache (Linux sysfs), or 0 when unknown."""
    sizes = []
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(os.path.join(index, "size")) as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=0)


def streaming_threshold():
    """Outputs above half the last-level cache go out with streaming stores:
    they would not stay cached anyway.  (Measured on a 105 MiB-L3 machine:
    64 MiB float32 outputs 1.3-1.9x faster streamed, 32 MiB bfloat16 ones
    slightly faster cached.)"""
    llc = last_level_cache_bytes()
    return max(16 << 20, llc // 2) if llc else 32 << 20


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


def unalias(inputs, outs):
    """inputs, with a private copy of any that overlaps a given output in
    another layout.  An output that is exactly an input (out=v) is safe:
    every kernel reads an element, or a whole slice, before writing it."""
    given = [o for o in outs if o is not None]
    if not given:
        return inputs
    result = []
    for a in inputs:
        for o in given if a is not None else ():
            if np.may_share_memory(a, o) and not (
                    a.__array_interface__["data"][0] == o.__array_interface__["data"][0]
                    and a.strides == o.strides and a.shape == o.shape and a.dtype == o.dtype):
                a = a.copy()
                break
        result.append(a)
    return result


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
