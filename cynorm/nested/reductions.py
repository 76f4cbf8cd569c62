"""Softmax, sum and select over one component dim of a nested array, and
their backward (ATen's nested softmax / sum / select and the seed's
nested_softmax_backward, _nested_sum_backward_cpu,
_nested_select_backward).

Over the last dim they run segmented over the whole buffer: one row per
last-dim slice, of its component's length, in parallel Cython kernels
(_kernels/segments.pyx); over another dim each component is reduced on its
own (its slices are not contiguous runs of the buffer).
"""
import numpy as np

from cynorm import _kernels
from cynorm._kernels import float_kernel
from cynorm._kernels._runtime import get_num_threads
from cynorm.nested._common import (
    check_nested, check_same_structure, component_dim, math_buffer, row_lengths,
    stored,
)
from cynorm._validation import as_array, check_bool, check_index, check_int
from cynorm.nested.container import NestedArray, nested_array

_seg = _kernels.load("segments")  # the SIMD level chosen at import


def softmax(x, dim):
    """exp(x) / sum(exp(x)) along nested dim `dim` (>= 1) of every component."""
    check_nested(x, "x")
    d = component_dim(x, dim)
    if d == x.ndim - 2:
        starts, lengths = row_lengths(x)
        xb = math_buffer(x)
        y = np.empty_like(xb)
        float_kernel(_seg, "softmax", xb)(xb, y, starts, lengths, get_num_threads())
        return x.like(stored(y, x.dtype))

    def one(c):
        c = c.astype(np.float32) if c.dtype.itemsize == 2 else c
        e = np.exp(c - c.max(axis=d, keepdims=True)) if c.size else c
        return e / e.sum(axis=d, keepdims=True)
    # another dim: component by component (its slices are strided)
    return x.like(_concat([one(c) for c in x.unbind()], x.dtype))


def _concat(parts, dtype):
    return stored(np.concatenate([p.reshape(-1) for p in parts]), dtype) if parts else np.empty(0, dtype)


def softmax_backward(grad, output, dim):
    """output * (grad - sum(grad * output)) along `dim`: softmax's backward
    from its output (the seed's nested_softmax_backward)."""
    check_nested(grad, "grad")
    check_nested(output, "output")
    check_same_structure(grad, "grad", output, "output")
    d = component_dim(output, dim)
    if d == output.ndim - 2:
        starts, lengths = row_lengths(output)
        g, y = math_buffer(grad), math_buffer(output)
        out = np.empty_like(y)
        float_kernel(_seg, "softmax_backward", y)(g, y, out, starts, lengths, get_num_threads())
        return output.like(stored(out, output.dtype))
    parts = []
    for g, y in zip(grad.unbind(), output.unbind()):   # another dim: per component
        g, y = g.astype(np.float64), y.astype(np.float64)
        parts.append(y * (g - (g * y).sum(axis=d, keepdims=True)))
    return output.like(_concat(parts, output.dtype))


def _dims(x, dims):
    if isinstance(dims, (int, np.integer)) and not isinstance(dims, (bool, np.bool_)):
        dims = (dims,)
    if not isinstance(dims, (tuple, list)) or not dims:
        raise TypeError(f"dims must be an int or a non-empty sequence of ints, got {dims!r}")
    cd = sorted({component_dim(x, d, "dims") for d in dims})
    if len(cd) != len(dims):
        raise ValueError(f"dims has repeated entries: {dims!r}")
    return tuple(cd)


def sum(x, dims, keepdim=False):
    """Sums over nested dims `dims` (all >= 1) of every component; float64
    accumulation, x's dtype."""
    check_nested(x, "x")
    cd = _dims(x, dims)
    keepdim = check_bool(keepdim, "keepdim")
    # over the last dim alone, segmented over the buffer; a zero-length last
    # dim has no rows but sums to zeros, so it goes component by component
    if cd == (x.ndim - 2,) and not np.any(x.sizes[:, -1] == 0):
        starts, lengths = row_lengths(x)
        sums = np.empty(lengths.size)
        xb = math_buffer(x)
        float_kernel(_seg, "row_sums", xb)(xb, sums, starts, lengths, get_num_threads())
        sizes = np.array(x.sizes, copy=True)
        sizes[:, -1] = 1
        return NestedArray(stored(sums, x.dtype), sizes if keepdim else sizes[:, :-1])
    return _sum_per_component(x, cd, keepdim)


def _sum_per_component(x, cd, keepdim):
    # dims other than the last alone: component by component
    if not len(x):
        nd = x.ndim - 1 - (0 if keepdim else len(cd))
        return NestedArray(np.empty(0, x.dtype), np.zeros((0, nd), np.int64))
    return nested_array([stored(c.sum(axis=cd, keepdims=keepdim, dtype=np.float64), x.dtype)
                         for c in x.unbind()], dtype=x.dtype)


def sum_backward(grad, self, dims, keepdim=False):
    """grad broadcast back over the summed dims: self's structure."""
    check_nested(grad, "grad")
    check_nested(self, "self")
    cd = _dims(self, dims)
    keepdim = check_bool(keepdim, "keepdim")
    if grad.dtype != self.dtype:
        raise TypeError(f"grad must have self's dtype {self.dtype}, got {grad.dtype}")
    if len(grad) != len(self):
        raise ValueError(f"grad must have self's {len(self)} components, got {len(grad)}")
    parts = []
    for i, g in enumerate(grad.unbind()):     # per component: a broadcast, no reduction
        shape = self.component_shape(i)
        kept = tuple(1 if j in cd else s for j, s in enumerate(shape))
        want = kept if keepdim else tuple(s for j, s in enumerate(shape) if j not in cd)
        if g.shape != want:
            raise ValueError(f"grad component {i} must have shape {want} (sum of a {shape} "
                             f"component over component dims {cd}), got {g.shape}")
        parts.append(np.broadcast_to(g.reshape(kept), shape))
    if not self.buffer.size:
        return self.like(np.zeros(0, self.dtype))
    return self.like(np.ascontiguousarray(np.concatenate([p.reshape(-1) for p in parts])
                                          .astype(self.dtype, copy=False)))


def _index(index, size, where):
    """index wrapped into [0, size); `where` names what is indexed."""
    return check_index(index, size, "index", where)


def select(x, dim, index):
    """The slice `index` of nested dim `dim` of every component (a nested
    array one dim smaller).  dim 0 selects component `index` itself, as a
    view, as PyTorch's select does."""
    check_nested(x, "x")
    if _is_dim0(x, dim):
        return x[_index(index, len(x), "the batch (dim 0)")]
    d = component_dim(x, dim)
    parts = []
    for i, c in enumerate(x.unbind()):       # a gather of strided slices: per component
        parts.append(np.take(c, _index(index, c.shape[d], f"component {i}"), axis=d))
    sizes = np.delete(np.asarray(x.sizes), d, axis=1)
    return NestedArray(_concat(parts, x.dtype) if parts else np.empty(0, x.dtype), sizes)


def _is_dim0(x, dim):
    """Whether nested dim `dim` is 0 (the component index); an invalid dim
    raises as component_dim does."""
    d = check_int(dim, "dim")
    if not -x.ndim <= d < x.ndim:
        component_dim(x, d)     # raises: out of range
    return d % x.ndim == 0


def select_backward(grad, self, dim, index):
    """Zeros of self's structure with grad written into the selected slices
    (the seed's _nested_select_backward)."""
    check_nested(self, "self")
    out = np.zeros(self.buffer.size, self.dtype)
    res = self.like(out)
    if _is_dim0(self, dim):
        i = _index(index, len(self), "the batch (dim 0)")
        g = as_array(grad, "grad")
        if g.shape != self.component_shape(i):
            raise ValueError(f"grad must have component {i}'s shape {self.component_shape(i)}, got {g.shape}")
        res[i][...] = g
        return res
    check_nested(grad, "grad")
    d = component_dim(self, dim)
    want = np.delete(np.asarray(self.sizes), d, axis=1)
    if not np.array_equal(grad.sizes, want):
        raise ValueError(f"grad must have select(self, dim, index)'s structure, got {grad!r}")
    for i, (g, c) in enumerate(zip(grad.unbind(), res.unbind())):   # per component, as select
        idx = [slice(None)] * c.ndim
        idx[d] = _index(index, c.shape[d], f"component {i}")
        c[tuple(idx)] = g
    return res
