"""Softmax, sum and select over one component dim of a nested array, and
their backward (ATen's nested softmax / sum / select and the seed's
nested_softmax_backward, _nested_sum_backward_cpu,
_nested_select_backward).

Over the last dim they run segmented over the whole buffer: one row per
last-dim slice, of its component's length, in parallel Cython kernels
(_kernels/segments.pyx); over another dim each component is reduced on its
own (its slices are not contiguous runs of the buffer).  A sum over dim 0
(the components) adds the components up elementwise into a dense array, as
PyTorch's jagged sum over the batch and ragged dims does.
"""
from __future__ import annotations

from typing import Union, cast

import numpy as np

from cynorm import _kernels
from cynorm._kernels import float_kernel
from cynorm._kernels._runtime import get_num_threads
from cynorm.nested._common import (
    check_nested, check_same_structure, component_dim, math_buffer, nested_dim, row_lengths,
    stored,
)
from cynorm._dtypes import POLICY
from cynorm._typing import Array, ArrayLike, Axis, Dims
from cynorm._validation import as_array, as_float_array, check_bool, check_index
from cynorm.nested.container import NestedArray, nested_array, wrap_checked

_seg = _kernels.load("segments")  # the SIMD level chosen at import


def softmax(x: NestedArray, dim: Axis) -> NestedArray:
    """Softmax along a nested dim of every component: exp(x) / sum(exp(x)).

    Over the last dim it runs segmented over the whole buffer (one row per
    last-dim slice, in parallel kernels, in x's math dtype: float32 for
    16-bit data); over another dim each component is reduced on its own.

    Parameters
    ----------
    x : NestedArray
        The input.
    dim : int
        The nested dim to normalize along: dim d >= 1 is the components' dim
        d - 1, negative dims count from the end.  Not dim 0 (the
        components).

    Returns
    -------
    NestedArray
        A new array of x's structure and dtype.

    Raises
    ------
    TypeError
        If x is not a NestedArray, or dim is not an int.
    ValueError
        If dim is out of range or 0.
    """
    check_nested(x, "x")
    d = component_dim(x, dim)
    if d == x.ndim - 2:
        starts, lengths = row_lengths(x)
        xb = math_buffer(x)
        y = np.empty_like(xb)
        float_kernel(_seg, "softmax", xb)(xb, y, starts, lengths, get_num_threads())
        return x.like(stored(y, x.dtype))

    def one(c):
        c = c.astype(POLICY[c.dtype].math, copy=False)
        e = np.exp(c - c.max(axis=d, keepdims=True)) if c.size else c
        return e / e.sum(axis=d, keepdims=True)
    # another dim: component by component (its slices are strided)
    return x.like(_concat([one(c) for c in x.unbind()], x.dtype))


def _concat(parts, dtype):
    return stored(np.concatenate([p.reshape(-1) for p in parts]), dtype) if parts else np.empty(0, dtype)


def softmax_backward(grad: NestedArray, output: NestedArray, dim: Axis) -> NestedArray:
    """Backward of `softmax`, from its output.

    output * (grad - sum(grad * output)) along `dim` (the seed's
    nested_softmax_backward): segmented over the buffer for the last dim,
    component by component (in float64) for another.

    Parameters
    ----------
    grad : NestedArray
        The gradient of softmax's output: output's structure and dtype.
    output : NestedArray
        The forward's result, softmax(x, dim).
    dim : int
        The forward's dim (>= 1 or negative; not 0).

    Returns
    -------
    NestedArray
        The gradient of x: a new array of output's structure and dtype.

    Raises
    ------
    TypeError
        If grad or output is not a NestedArray, their dtypes differ, or dim
        is not an int.
    ValueError
        If grad and output have different structures (component shapes), or
        dim is out of range or 0.
    """
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


def _sum_dims(x, dims):
    """(over_batch, cd) for sum's `dims`: whether nested dim 0 (the
    components) is summed over, and the sorted component dims summed over.
    dims is an int, a non-empty sequence of ints, or None (every dim)."""
    if dims is None:
        return True, tuple(range(x.ndim - 1))
    if isinstance(dims, (int, np.integer)) and not isinstance(dims, (bool, np.bool_)):
        dims = (dims,)
    if not isinstance(dims, (tuple, list)) or not dims:
        raise TypeError(f"dims must be an int, a non-empty sequence of ints or None (every dim), "
                        f"got {dims!r}")
    nd = [nested_dim(x, d, "dims") for d in dims]
    if len(set(nd)) != len(nd):
        raise ValueError(f"dims has repeated entries: {dims!r}")
    return 0 in nd, tuple(sorted(d - 1 for d in nd if d != 0))


def _kept_shape(x, cd, dims, name):
    """The shape of the component dims that a sum over dim 0 and component
    dims cd keeps: every component of x (called `name`) must have the same
    one, as the components are added up elementwise."""
    keep = [j for j in range(x.ndim - 1) if j not in cd]
    if not keep:
        return ()
    if not len(x):
        raise ValueError(f"dims={dims!r} sums over dim 0 but keeps nested dims "
                         f"{[j + 1 for j in keep]}, and {name} has no components to give their "
                         f"sizes; sum over every dim (dims=None) instead")
    kept = np.asarray(x.sizes)[:, keep]
    differ = np.any(kept != kept[0], axis=1)
    if np.any(differ):
        i = int(np.argmax(differ))
        raise ValueError(f"dims={dims!r} sums over dim 0 (across the components), so {name}'s "
                         f"components must agree in the nested dims it keeps "
                         f"{[j + 1 for j in keep]}; component 0 has shape {x.component_shape(0)}, "
                         f"component {i} has {x.component_shape(i)}")
    return tuple(int(s) for s in kept[0])


def _batch_sum_shape(kept, cd, ndim, keepdim):
    """The dense shape of a sum over dim 0 and component dims cd."""
    if not keepdim:
        return kept
    it = iter(kept)
    return (1,) + tuple(1 if j in cd else next(it) for j in range(ndim - 1))


def sum(x: NestedArray, dims: Dims = None, keepdim: bool = False) -> Union[NestedArray, Array]:
    """Sum of a nested array over some of its nested dims.

    Over component dims only (every entry of `dims` >= 1) each component is
    summed on its own and the result is nested.  Over dim 0 (the
    components) the components are added up elementwise and the result is
    a dense array, as PyTorch's jagged sum over the batch and ragged dims.

    Parameters
    ----------
    x : NestedArray
        The array to sum.
    dims : int, sequence of int or None, optional
        The nested dims to sum over: dim 0 indexes the components, dim d >= 1
        is the components' dim d - 1, negative dims count from the end.
        None (the default) sums over every dim, dim 0 included, as
        ``torch.sum(x)`` does.
    keepdim : bool, optional
        Keep every summed dim with size 1 (dim 0 too: a dense result then
        has ``x.ndim`` dims).

    Returns
    -------
    NestedArray or numpy.ndarray
        Without dim 0 in `dims`: a NestedArray, component i the sum of
        component i.  With dim 0: a dense array of the kept component dims
        (0-d for ``dims=None``).  In x's dtype, accumulated in float64.

    Raises
    ------
    TypeError
        If x is not a NestedArray, dims is not an int, a non-empty sequence
        of ints or None, or keepdim is not a bool.
    ValueError
        If an entry of dims is out of range or repeated; with dim 0 in dims,
        if the components differ in a kept dim (they cannot be added up), or
        x has no components and a component dim is kept (its size is
        unknown).

    Notes
    -----
    PyTorch 2.13's jagged layout sums over dim 0 only together with the
    ragged dim (the result is the same as here); it refuses dim 0 alone, or
    with other dims, even for components of one shape.  cynorm allows it
    wherever the kept dims agree.
    """
    check_nested(x, "x")
    over_batch, cd = _sum_dims(x, dims)
    keepdim = check_bool(keepdim, "keepdim")
    if over_batch:
        return _sum_over_batch(x, cd, keepdim, dims)
    # over the last dim alone, segmented over the buffer; a zero-length last
    # dim has no rows but sums to zeros, so it goes component by component
    if cd == (x.ndim - 2,) and not _has_empty_last_dim(x):
        starts, lengths = row_lengths(x)
        sums = np.empty(lengths.size)
        xb = math_buffer(x)
        float_kernel(_seg, "row_sums", xb)(xb, sums, starts, lengths, get_num_threads())
        return wrap_checked(stored(sums, x.dtype), x._last_dim_as(1 if keepdim else None))
    return _sum_per_component(x, cd, keepdim)


def _has_empty_last_dim(x):
    """Whether a component of x has a last dim of size 0 (once per structure)."""
    return x._derived_value("empty last dim", lambda: bool(np.any(x.sizes[:, -1] == 0)))


def _sum_over_batch(x, cd, keepdim, dims):
    """The dense sum over dim 0 and component dims cd (float64 accumulation)."""
    kept = _kept_shape(x, cd, dims, "x")
    n_kept = int(np.prod(kept, dtype=np.int64))
    if n_kept == 0:          # a kept dim of size 0: every component is empty
        total = np.zeros(0)
    elif cd == tuple(range(len(cd))):
        # the summed dims lead every component: the buffer is rows of the
        # kept shape, summed in one pass
        total = x.buffer.reshape(-1, n_kept).sum(axis=0, dtype=np.float64)
    else:
        # a summed dim after a kept one: component by component
        total = np.zeros(n_kept)
        for c in x.unbind():
            total += c.sum(axis=cd, dtype=np.float64).reshape(-1)
    return stored(total.reshape(_batch_sum_shape(kept, cd, x.ndim, keepdim)), x.dtype)


def _sum_per_component(x, cd, keepdim):
    # dims other than the last alone: component by component
    if not len(x):
        nd = x.ndim - 1 - (0 if keepdim else len(cd))
        return NestedArray(np.empty(0, x.dtype), np.zeros((0, nd), np.int64))
    return nested_array([stored(c.sum(axis=cd, keepdims=keepdim, dtype=np.float64), x.dtype)
                         for c in x.unbind()], dtype=x.dtype)


def sum_backward(grad: Union[NestedArray, ArrayLike], self: NestedArray, dims: Dims = None,
                 keepdim: bool = False) -> NestedArray:
    """Backward of `sum`: grad broadcast back over the summed dims.

    As ATen's ``_nested_sum_backward``, extended to sums over dim 0: there
    every component receives the same dense grad.

    Parameters
    ----------
    grad : NestedArray or array_like
        The gradient of sum(self, dims, keepdim): a NestedArray of its
        structure when dims does not include dim 0, else a dense array of
        its shape.  In self's dtype.
    self : NestedArray
        The input of the sum.
    dims : int, sequence of int or None, optional
        The nested dims that were summed over, as for `sum` (None: every
        dim).
    keepdim : bool, optional
        The keepdim of the sum.

    Returns
    -------
    NestedArray
        The gradient of self: its structure and dtype, each component's
        grad broadcast over the summed dims.

    Raises
    ------
    TypeError
        If self is not a NestedArray, grad is not a NestedArray (dims
        without dim 0) or is one (dims with dim 0), grad's dtype is not
        self's, or dims or keepdim are of the wrong type.
    ValueError
        If dims is out of range or repeated, grad's shape or structure is
        not that of the sum, or (dims with dim 0) self's components differ
        in a kept dim.
    """
    check_nested(self, "self")
    over_batch, cd = _sum_dims(self, dims)
    keepdim = check_bool(keepdim, "keepdim")
    if over_batch:
        return _sum_backward_over_batch(grad, self, cd, keepdim, dims)
    grad = check_nested(grad, "grad")   # narrows grad's type
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


def _sum_backward_over_batch(grad, self, cd, keepdim, dims):
    """sum_backward for dims with dim 0: the dense grad, broadcast over each
    component's summed dims, is every component's gradient."""
    if isinstance(grad, NestedArray):
        raise TypeError(f"grad must be a dense array: dims={dims!r} sums over dim 0 and gives "
                        f"one, got a NestedArray")
    g, _ = as_float_array(grad, "grad")
    if g.dtype != self.dtype:
        raise TypeError(f"grad must have self's dtype {self.dtype}, got {g.dtype}")
    kept = _kept_shape(self, cd, dims, "self")
    want = _batch_sum_shape(kept, cd, self.ndim, keepdim)
    if g.shape != want:
        raise ValueError(f"grad must have shape {want} (that of sum(self, dims={dims!r}, "
                         f"keepdim={keepdim})), got {g.shape}")
    res = self.like(np.empty(self.buffer.size, self.dtype))
    for i, c in enumerate(res.unbind()):      # the same grad for every component
        g_i = g.reshape(tuple(1 if j in cd else s for j, s in enumerate(c.shape)))
        c[...] = np.broadcast_to(g_i, c.shape)
    return res


def _index(index, size, where):
    """index wrapped into [0, size); `where` names what is indexed."""
    return check_index(index, size, "index", where)


def select(x: NestedArray, dim: Axis, index: int) -> Union[NestedArray, Array]:
    """The slice `index` of nested dim `dim` of every component.

    Over a component dim the result is a nested array one dim smaller;
    dim 0 selects component `index` itself, as a view, as PyTorch's select
    does.

    Parameters
    ----------
    x : NestedArray
        The input.
    dim : int
        The nested dim to index: 0 for the components, d >= 1 for the
        components' dim d - 1; negative dims count from the end.
    index : int
        The index along dim, in every component (negative counts from the
        end).

    Returns
    -------
    NestedArray or numpy.ndarray
        For dim >= 1, a new NestedArray of x's dtype, each component without
        dim (the slice `index` of it).  For dim 0, component `index`, a view
        into x's buffer.

    Raises
    ------
    TypeError
        If x is not a NestedArray, or dim or index is not an int.
    ValueError
        If dim is out of range, or index is out of range for a component
        (or, for dim 0, for the components); that error is also an
        IndexError.
    """
    check_nested(x, "x")
    if nested_dim(x, dim) == 0:
        return x[_index(index, len(x), "the batch (dim 0)")]
    d = component_dim(x, dim)
    parts = []
    for i, c in enumerate(x.unbind()):       # a gather of strided slices: per component
        parts.append(np.take(c, _index(index, c.shape[d], f"component {i}"), axis=d))
    sizes = np.delete(np.asarray(x.sizes), d, axis=1)
    return NestedArray(_concat(parts, x.dtype) if parts else np.empty(0, x.dtype), sizes)


def select_backward(grad: Union[NestedArray, ArrayLike], self: NestedArray, dim: Axis,
                    index: int) -> NestedArray:
    """Backward of `select`: zeros of self's structure with grad written
    into the selected slices (the seed's _nested_select_backward).

    Parameters
    ----------
    grad : NestedArray or array_like
        The gradient of select(self, dim, index): for dim >= 1 a NestedArray
        of its structure; for dim 0 a dense array of component index's
        shape.  Written into self's dtype.
    self : NestedArray
        The input of the forward.
    dim : int
        The forward's dim (0 for the components; negative counts from the
        end).
    index : int
        The forward's index.

    Returns
    -------
    NestedArray
        The gradient of self: a new array of its structure and dtype, grad
        in the selected slices (or component) and zeros elsewhere.

    Raises
    ------
    TypeError
        If self is not a NestedArray, dim or index is not an int, or grad is
        not a NestedArray for dim >= 1.
    ValueError
        If dim is out of range, grad's shape (dim 0) or structure (dim >= 1)
        is not select's, or index is out of range (that error is also an
        IndexError).
    """
    check_nested(self, "self")
    out = np.zeros(self.buffer.size, self.dtype)
    res = self.like(out)
    if nested_dim(self, dim) == 0:
        i = _index(index, len(self), "the batch (dim 0)")
        g = as_array(cast(ArrayLike, grad), "grad")  # a NestedArray converts too (a sequence)
        if g.shape != self.component_shape(i):
            raise ValueError(f"grad must have component {i}'s shape {self.component_shape(i)}, got {g.shape}")
        res[i][...] = g
        return res
    grad = check_nested(grad, "grad")   # narrows grad's type
    d = component_dim(self, dim)
    want = np.delete(np.asarray(self.sizes), d, axis=1)
    if not np.array_equal(grad.sizes, want):
        raise ValueError(f"grad must have select(self, dim, index)'s structure, got {grad!r}")
    for i, (g, c) in enumerate(zip(grad.unbind(), res.unbind())):   # per component, as select
        idx = [slice(None)] * c.ndim
        idx[d] = _index(index, c.shape[d], f"component {i}")
        c[tuple(idx)] = g
    return res
