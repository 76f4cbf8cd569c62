"""Matrix products of nested arrays and their backward (ATen's nested
matmul / linear and the seed's matmul_backward_nested,
nested_linear_backward).

Against a dense matrix the whole buffer is one (total_rows, features) GEMM;
against a dense batch of matrices (B, D, E), and nested @ nested, each
component is multiplied on its own (its matrix, or its shape, differs, so
no single GEMM covers them).  16-bit data multiplies in float32.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np

from cynorm._dtypes import POLICY
from cynorm._typing import Array, ArrayLike, OutputMask
from cynorm._validation import as_float_array, check_mask
from cynorm.nested._common import check_nested, math_buffer, stored
from cynorm.nested.container import NestedArray, nested_array, wrap_checked


def _uniform_last(x, name):
    """The components' common last dim (they must all have it)."""
    if x.ndim < 2:
        raise ValueError(f"{name}'s components are 0-d: they have no feature dim")
    k = x._derived_value("uniform last dim", lambda: x.uniform_size(x.ndim - 2))
    if k is None:
        raise ValueError(f"{name}'s components must share their last dim (the features), "
                         f"got sizes {sorted(set(int(s) for s in x.sizes[:, -1]))}")
    return k


def _rows(x, k):
    """x's buffer as (total_rows, k), k its components' last dim."""
    rows = x._derived_value("rows above the last dim",
                            lambda: int(np.prod(np.asarray(x.sizes)[:, :-1], axis=1).sum()))
    return math_buffer(x).reshape(rows, k)


def _with_last(x, buffer2d, n_out):
    """A NestedArray of x's component shapes with the last dim n_out."""
    return wrap_checked(stored(buffer2d.reshape(-1), x.dtype), x._last_dim_as(n_out))


def _has_last_dim_as(g, x, n):
    """Whether g's component shapes are x's with the last dim n (g made by
    an op on x, or like() of one, shares that structure: no compare)."""
    sizes = x._last_dim_as(n)[0]
    return g.sizes is sizes or np.array_equal(g.sizes, sizes)


def _dense(a: ArrayLike, name: str, x: NestedArray,
           shape_hint: tuple[str, ...]) -> tuple[Array, np.dtype[Any]]:
    """Dense operand `a` checked against nested x: (a in x's math dtype, a's
    own dtype), both native (as_float_array converts non-native byte order),
    so a gradient returned in a's dtype is native too."""
    a, _ = as_float_array(a, name)
    accepted = POLICY[x.dtype].coefficients      # x's dtype, or float32 for 16-bit x
    if a.dtype not in accepted:
        raise TypeError(f"{name} must have {' or '.join(str(d) for d in accepted)} dtype, "
                        f"got {a.dtype}")
    if a.ndim != len(shape_hint):
        raise ValueError(f"{name} must be {len(shape_hint)}-D {shape_hint}, got shape {a.shape}")
    return a.astype(math_buffer(x).dtype, copy=False), a.dtype


def _mm(x, y):
    """x @ y in the math dtype (16-bit storage multiplies in float32)."""
    up = (lambda v: v.astype(POLICY[v.dtype].math, copy=False))
    return np.matmul(up(x), up(y))


def _per_component(fn, a, b, like):
    """fn(a_i, b_i) for every component pair, as a NestedArray of like's dtype
    (with like's component ndim when there are no components)."""
    if not len(a):
        return NestedArray(np.empty(0, like.dtype), np.zeros((0, like.ndim - 1), np.int64))
    return nested_array([stored(fn(x, y), like.dtype) for x, y in zip(a.unbind(), b.unbind())],
                        dtype=like.dtype)


def matmul(a: NestedArray, b: Union[NestedArray, ArrayLike]) -> NestedArray:
    """Matrix product of a nested array with a dense or nested operand.

    Three forms, as PyTorch's matmul of a nested tensor:

    - b a dense (D, E) matrix: every component of a, of shape (..., n_i, D),
      is multiplied by b; one GEMM over the buffer's rows.
    - b a dense (B, D, E) batch of matrices: component i of a, of shape
      (n_i, D), is multiplied by b[i]; B must be len(a), or 1 (b[0] then
      multiplies every component, as broadcasting does).
    - b a NestedArray with as many components: component i of a is
      multiplied by component i of b (their shapes must multiply).

    Parameters
    ----------
    a : NestedArray
        The left operand.
    b : array_like or NestedArray
        The right operand: a dense (D, E) or (B, D, E) array in a's dtype
        (float32 also for 16-bit a), or a NestedArray of a's dtype.

    Returns
    -------
    NestedArray
        Component i is a[i] @ b (or b[i], or b's component i), in a's dtype;
        16-bit data is multiplied in float32.

    Raises
    ------
    TypeError
        If a is not a NestedArray, or b's dtype does not fit a's.
    ValueError
        If the shapes do not multiply: a dense b that is not 2-D or 3-D, a's
        components differing in their last dim or not matching b's rows
        (D), a's components not 2-D for a 3-D b, a 3-D b whose B is neither
        len(a) nor 1, or a nested b with another number of components or
        component shapes that do not multiply.
    """
    check_nested(a, "a")
    if isinstance(b, NestedArray):
        if len(a) != len(b):
            raise ValueError(f"a and b must have as many components, got {len(a)} and {len(b)}")
        if a.dtype != b.dtype:
            raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
        for i, (x, y) in enumerate(zip(a.unbind(), b.unbind())):
            if x.ndim < 1 or y.ndim < 1 or x.shape[-1] != y.shape[-2 if y.ndim > 1 else 0]:
                raise ValueError(f"component {i}: shapes {x.shape} and {y.shape} do not multiply")
        # component by component: their shapes differ
        return _per_component(_mm, a, b, a)
    b, _ = as_float_array(b, "b")
    if b.ndim == 3:
        return _matmul_batch(a, b)
    if b.ndim != 2:
        raise ValueError(f"b must be a 2-D (D, E) matrix, a 3-D (B, D, E) batch of matrices or a "
                         f"NestedArray, got shape {b.shape}")
    k = _uniform_last(a, "a")
    b, _ = _dense(b, "b", a, ("k", "m"))
    if len(a) and b.shape[0] != k:
        raise ValueError(f"b must have {k} rows (a's last dim), got shape {b.shape}")
    if a.ndim < 3:
        raise ValueError("a's components must be at least 2-D (..., n, k) for a @ b; "
                         "use linear for 1-D feature vectors")
    return _with_last(a, _rows(a, b.shape[0]) @ b, b.shape[1])


def _check_matrix_batch(x, x_name, m, m_name):
    """Nested x, of 2-D (n_i, D) components, against a dense (B, D, E) batch
    m of matrices, one per component or one for all (B = 1); returns D."""
    if x.ndim != 3:
        raise ValueError(f"{x_name}'s components must be 2-D (n_i, D) to be multiplied by a 3-D "
                         f"(B, D, E) {m_name}, got {x.ndim - 1}-D components")
    if m.shape[0] not in (len(x), 1):
        raise ValueError(f"{m_name} must hold one (D, E) matrix per component of {x_name} "
                         f"(B = {len(x)}), or one for all (B = 1), along its dim 0; got shape "
                         f"{m.shape}")
    if not len(x):
        return m.shape[1]
    d = _uniform_last(x, x_name)
    if m.shape[1] != d:
        raise ValueError(f"{m_name} must have {d} rows per matrix ({x_name}'s last dim), got "
                         f"shape {m.shape}")
    return d


def _row_ranges(x):
    """(start, stop) of each component's rows in x's buffer viewed as
    (total rows, last dim); x's components are 2-D."""
    stops = np.cumsum(np.asarray(x.sizes)[:, 0])
    starts = stops - np.asarray(x.sizes)[:, 0]
    return [(int(lo), int(hi)) for lo, hi in zip(starts, stops)]


def _matrix(m, i):
    """Component i's matrix of the dense batch m: m[i], or m[0] shared by all."""
    return m[0] if m.shape[0] == 1 else m[i]


def _matmul_batch(a, b):
    """a[i] @ b[i] for every component: a nested (n_i, D), b dense (B, D, E).
    One GEMM per component (each has its own matrix), written into one
    buffer."""
    b, _ = _dense(b, "b", a, ("B", "D", "E"))
    d = _check_matrix_batch(a, "a", b, "b")
    rows = _rows(a, d)
    out = np.empty((rows.shape[0], b.shape[2]), rows.dtype)
    for i, (lo, hi) in enumerate(_row_ranges(a)):
        out[lo:hi] = _mm(rows[lo:hi], _matrix(b, i))
    return _with_last(a, out, b.shape[2])


def matmul_backward(grad: NestedArray, self: NestedArray, other: Union[NestedArray, ArrayLike],
                    output_mask: OutputMask = (True, True),
                    ) -> tuple[Optional[NestedArray], Union[NestedArray, Array, None]]:
    """Backward of `matmul`: the gradients of self @ other.

    grad_self is grad @ other^T and grad_other is self^T @ grad, per form:
    against a dense (D, E) matrix grad_other sums over every row of every
    component; against a dense (B, D, E) batch, grad_other[i] is component
    i's own (B = 1: the sum over all components, as broadcasting's
    backward); against a NestedArray it is one per component.

    Parameters
    ----------
    grad : NestedArray
        The gradient of self @ other: its structure, in self's dtype.
    self : NestedArray
        The left operand of the product.
    other : array_like or NestedArray
        The right operand: a dense (D, E) or (B, D, E) array, or a
        NestedArray, as in `matmul`.
    output_mask : sequence of 2 bools, optional
        Which of (grad_self, grad_other) to compute; a masked-off one is
        None.

    Returns
    -------
    grad_self : NestedArray or None
        self's structure and dtype.
    grad_other : numpy.ndarray, NestedArray or None
        other's shape (or structure) and dtype; a dense one is native byte
        order.

    Raises
    ------
    TypeError
        If grad or self is not a NestedArray, grad's dtype is not self's,
        other's dtype does not fit self's, or output_mask is not 2 bools.
    ValueError
        If the shapes do not fit a product self @ other with grad its
        result (as `matmul` checks them), or output_mask has not 2 entries.
    """
    check_nested(grad, "grad")
    check_nested(self, "self")
    mask = check_mask(output_mask, n=2)
    if grad.dtype != self.dtype:
        raise TypeError(f"grad must have self's dtype {self.dtype}, got {grad.dtype}")
    if isinstance(other, NestedArray):
        if not (len(grad) == len(self) == len(other)):
            raise ValueError(f"grad, self and other must have as many components, got {len(grad)}, "
                             f"{len(self)} and {len(other)}")
        for i, (g, s_, o) in enumerate(zip(grad.unbind(), self.unbind(), other.unbind())):
            if o.ndim < 2 or s_.ndim < 2:
                raise ValueError(f"component {i}: matmul_backward needs matrices (at least 2-D), got "
                                 f"{s_.shape} @ {o.shape}")
            if g.shape != np.broadcast_shapes(s_.shape[:-2], o.shape[:-2]) + (s_.shape[-2], o.shape[-1]):
                raise ValueError(f"grad component {i} has shape {g.shape}, not that of "
                                 f"{s_.shape} @ {o.shape}")
        # component by component, as in the forward
        gs = _per_component(lambda g, o: _mm(g, np.swapaxes(o, -1, -2)), grad, other, self) \
            if mask[0] else None
        go = _per_component(lambda s, g: _mm(np.swapaxes(s, -1, -2), g), self, grad, other) \
            if mask[1] else None
        return gs, go
    other, _ = as_float_array(other, "other")
    if other.ndim == 3:
        return _matmul_batch_backward(grad, self, other, mask)
    if other.ndim != 2:
        raise ValueError(f"other must be a 2-D (D, E) matrix, a 3-D (B, D, E) batch of matrices "
                         f"or a NestedArray, got shape {other.shape}")
    other_m, other_dtype = _dense(other, "other", self, ("k", "m"))
    k = _uniform_last(self, "self") if len(self) else other_m.shape[0]
    m = other_m.shape[1]
    if len(grad) != len(self) or not _has_last_dim_as(grad, self, m):
        raise ValueError(f"grad must have self's structure with last dim {m} (other's columns), "
                         f"got {grad!r} for self {self!r}")
    g2 = _rows(grad, m)
    gs = _with_last(self, g2 @ other_m.T, k) if mask[0] else None
    go = None
    if mask[1]:
        go = _rows(self, k).T @ g2
        go = go.astype(other_dtype, copy=False)
    return gs, go


def _matmul_batch_backward(grad, self, other, mask):
    """matmul_backward against a dense (B, D, E) batch of matrices: one GEMM
    per component for each gradient (B = 1: grad_other over every row)."""
    other_m, other_dtype = _dense(other, "other", self, ("B", "D", "E"))
    d = _check_matrix_batch(self, "self", other_m, "other")
    e = other_m.shape[2]
    if (grad.ndim != 3 or len(grad) != len(self)
            or not np.array_equal(grad.sizes[:, 0], self.sizes[:, 0])
            or (len(grad) and grad.uniform_size(1) != e)):
        raise ValueError(f"grad must have self's structure with last dim {e} (other's columns), "
                         f"got {grad!r} for self {self!r}")
    g2, s2 = _rows(grad, e), _rows(self, d)
    ranges = _row_ranges(self)
    gs = None
    if mask[0]:
        out = np.empty((s2.shape[0], d), s2.dtype)
        for i, (lo, hi) in enumerate(ranges):
            out[lo:hi] = _mm(g2[lo:hi], _matrix(other_m, i).T)
        gs = _with_last(self, out, d)
    go = None
    if mask[1]:
        if other_m.shape[0] == 1 and len(self) != 1:
            # one matrix for every component: its gradient sums over every row
            go = (s2.T @ g2).reshape(other_m.shape)
        else:
            go = np.empty(other_m.shape, s2.dtype)
            for i, (lo, hi) in enumerate(ranges):
                go[i] = _mm(s2[lo:hi].T, g2[lo:hi])
        go = go.astype(other_dtype, copy=False)
    return gs, go


def linear(x: NestedArray, weight: ArrayLike, bias: Optional[ArrayLike] = None) -> NestedArray:
    """Linear map of the components' last dim: x @ weight^T + bias.

    One GEMM on the buffer viewed as (total_rows, in_features), as ATen's
    nested linear.  16-bit data multiplies in float32.

    Parameters
    ----------
    x : NestedArray
        The input: components of shape (..., in_features), all with the same
        last dim.
    weight : array_like
        The (out_features, in_features) matrix, in x's dtype (float32 also
        for 16-bit x).
    bias : array_like, optional
        The (out_features,) shift, in x's dtype (float32 also for 16-bit
        x).  None (the default): no shift.

    Returns
    -------
    NestedArray
        Component i has component i's shape with the last dim out_features,
        in x's dtype.

    Raises
    ------
    TypeError
        If x is not a NestedArray, or weight or bias is not of x's dtype
        (or float32 for 16-bit x).
    ValueError
        If x's components are 0-d or differ in their last dim, weight is not
        2-D with in_features columns, or bias does not have shape
        (out_features,).
    """
    check_nested(x, "x")
    k = _uniform_last(x, "x")
    w, _ = _dense(weight, "weight", x, ("out", "in"))
    if len(x) and w.shape[1] != k:
        raise ValueError(f"weight must have shape (out_features, {k}), got {w.shape}")
    y = _rows(x, w.shape[1]) @ w.T
    if bias is not None:
        b, _ = _dense(bias, "bias", x, ("out",))
        if b.shape != (w.shape[0],):
            raise ValueError(f"bias must have shape ({w.shape[0]},), got {b.shape}")
        y += b
    return _with_last(x, y, w.shape[0])


def linear_backward(input: NestedArray, grad_output: NestedArray, weight: ArrayLike,
                    output_mask: OutputMask = (True, True, True),
                    ) -> tuple[Optional[NestedArray], Optional[Array], Optional[Array]]:
    """Backward of `linear`: (grad_input, grad_weight, grad_bias).

    As the seed computes them: grad_output's buffer as (rows, out) times
    weight, its transpose times input's rows, and its column sums (in
    float64).  Masked-off: None.

    Parameters
    ----------
    input : NestedArray
        The input of the forward.
    grad_output : NestedArray
        The gradient of the output: input's structure with the last dim
        out_features, in input's dtype.
    weight : array_like
        The forward's (out_features, in_features) weight, in input's dtype
        (float32 also for 16-bit input).
    output_mask : sequence of 3 bools, optional
        Which of (grad_input, grad_weight, grad_bias) to compute (default
        all three).

    Returns
    -------
    grad_input : NestedArray or None
        Of input's structure and dtype.
    grad_weight : numpy.ndarray or None
        Of weight's shape and dtype (native byte order).
    grad_bias : numpy.ndarray or None
        Shape (out_features,), weight's dtype (native byte order).

    Raises
    ------
    TypeError
        If input or grad_output is not a NestedArray, their dtypes differ,
        weight's dtype does not fit input's, or output_mask is not 3 bools.
    ValueError
        If input's components are 0-d or differ in their last dim, weight
        is not 2-D, grad_output's structure is not input's with the last dim
        out_features (or weight has not in_features columns), or
        output_mask has not 3 entries.
    """
    check_nested(input, "input")
    check_nested(grad_output, "grad_output")
    mask = check_mask(output_mask)
    if grad_output.dtype != input.dtype:
        raise TypeError(f"grad_output must have input's dtype {input.dtype}, got {grad_output.dtype}")
    w, wdtype = _dense(weight, "weight", input, ("out", "in"))
    k = _uniform_last(input, "input") if len(input) else w.shape[1]
    n_out = w.shape[0]
    if len(input) and (w.shape[1] != k or not _has_last_dim_as(grad_output, input, n_out)):
        raise ValueError(f"grad_output must have input's structure with last dim {n_out} "
                         f"(weight's rows), got {grad_output!r} for input {input!r}")
    g2 = _rows(grad_output, n_out)
    gi = _with_last(input, g2 @ w, w.shape[1]) if mask[0] else None
    gw = (g2.T @ _rows(input, k)).astype(wdtype, copy=False) if mask[1] else None
    # the float64 sum rounded to the math type, then stored (16-bit: through
    # float32, as every 16-bit output)
    gb = g2.sum(axis=0, dtype=np.float64).astype(g2.dtype).astype(wdtype, copy=False) \
        if mask[2] else None
    return gi, gw, gb
