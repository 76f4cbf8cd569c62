"""Matrix products of nested arrays and their backward (ATen's nested
matmul / linear and the seed's matmul_backward_nested,
nested_linear_backward).

Against a dense matrix the whole buffer is one (total_rows, features) GEMM;
nested @ nested multiplies component by component (their shapes differ, so
no single GEMM covers them).  16-bit data multiplies in float32.
"""
import numpy as np

from cynorm._validation import as_float_array, check_mask
from cynorm.nested._common import check_nested, math_buffer, stored
from cynorm.nested.container import NestedArray, nested_array


def _uniform_last(x, name):
    """The components' common last dim (they must all have it)."""
    if x.ndim < 2:
        raise ValueError(f"{name}'s components are 0-d: they have no feature dim")
    k = x.uniform_size(x.ndim - 2)
    if k is None:
        raise ValueError(f"{name}'s components must share their last dim (the features), "
                         f"got sizes {sorted(set(int(s) for s in x.sizes[:, -1]))}")
    return k


def _rows(x, k):
    """x's buffer as (total_rows, k), k its components' last dim."""
    rows = int(np.prod(np.asarray(x.sizes)[:, :-1], axis=1).sum())
    return math_buffer(x).reshape(rows, k)


def _with_last(x, buffer2d, n_out):
    """A NestedArray of x's component shapes with the last dim n_out."""
    sizes = np.array(x.sizes, copy=True)
    if len(sizes):
        sizes[:, -1] = n_out
    return NestedArray(stored(buffer2d.reshape(-1), x.dtype), sizes)


def _dense(a, name, x, shape_hint):
    """Dense operand `a` checked against nested x: (a in x's math dtype, a's
    own dtype), both native (as_float_array converts non-native byte order),
    so a gradient returned in a's dtype is native too."""
    a, _ = as_float_array(a, name)
    ok = a.dtype == x.dtype or (x.dtype.itemsize == 2 and a.dtype == np.float32)
    if not ok:
        raise TypeError(f"{name} must have {x.dtype}" + (" or float32" if x.dtype.itemsize == 2 else "")
                        + f" dtype, got {a.dtype}")
    if a.ndim != len(shape_hint):
        raise ValueError(f"{name} must be {len(shape_hint)}-D {shape_hint}, got shape {a.shape}")
    return a.astype(math_buffer(x).dtype, copy=False), a.dtype


def _mm(x, y):
    """x @ y in the math dtype (16-bit storage multiplies in float32)."""
    up = (lambda v: v.astype(np.float32) if v.dtype.itemsize == 2 else v)
    return np.matmul(up(x), up(y))


def _per_component(fn, a, b, like):
    """fn(a_i, b_i) for every component pair, as a NestedArray of like's dtype
    (with like's component ndim when there are no components)."""
    if not len(a):
        return NestedArray(np.empty(0, like.dtype), np.zeros((0, like.ndim - 1), np.int64))
    return nested_array([stored(fn(x, y), like.dtype) for x, y in zip(a.unbind(), b.unbind())],
                        dtype=like.dtype)


def matmul(a, b):
    """a @ b per component: a nested with components (..., n, k) and b a dense
    (k, m) matrix (one GEMM over the buffer), or b nested with as many
    components, each multiplied with a's."""
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
    k = _uniform_last(a, "a")
    b, _ = _dense(b, "b", a, ("k", "m"))
    if len(a) and b.shape[0] != k:
        raise ValueError(f"b must have {k} rows (a's last dim), got shape {b.shape}")
    if a.ndim < 3:
        raise ValueError("a's components must be at least 2-D (..., n, k) for a @ b; "
                         "use linear for 1-D feature vectors")
    return _with_last(a, _rows(a, b.shape[0]) @ b, b.shape[1])


def matmul_backward(grad, self, other, output_mask=(True, True)):
    """(grad_self, grad_other) of self @ other: grad @ other^T and self^T @ grad.
    A dense `other` gets a dense gradient (summed over every row of every
    component); a nested one gets one per component.  Masked-off: None."""
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
    other_m, other_dtype = _dense(other, "other", self, ("k", "m"))
    k = _uniform_last(self, "self") if len(self) else other_m.shape[0]
    m = other_m.shape[1]
    if (len(grad) != len(self) or (len(self) and grad.uniform_size(grad.ndim - 2) != m)
            or not np.array_equal(grad.sizes[:, :-1], self.sizes[:, :-1])):
        raise ValueError(f"grad must have self's structure with last dim {m} (other's columns), "
                         f"got {grad!r} for self {self!r}")
    g2 = _rows(grad, m)
    gs = _with_last(self, g2 @ other_m.T, k) if mask[0] else None
    go = None
    if mask[1]:
        go = _rows(self, k).T @ g2
        go = go.astype(other_dtype, copy=False)
    return gs, go


def linear(x, weight, bias=None):
    """x @ weight^T + bias over the components' last dim: one GEMM on the
    buffer viewed as (total_rows, in_features)."""
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


def linear_backward(input, grad_output, weight, output_mask=(True, True, True)):
    """(grad_input, grad_weight, grad_bias) of linear, as the seed computes
    them: grad_output's buffer as (rows, out) times weight, its transpose
    times input's rows, and its column sums.  Masked-off: None."""
    check_nested(input, "input")
    check_nested(grad_output, "grad_output")
    mask = check_mask(output_mask)
    if grad_output.dtype != input.dtype:
        raise TypeError(f"grad_output must have input's dtype {input.dtype}, got {grad_output.dtype}")
    w, wdtype = _dense(weight, "weight", input, ("out", "in"))
    k = _uniform_last(input, "input") if len(input) else w.shape[1]
    n_out = w.shape[0]
    if len(input) and (w.shape[1] != k or grad_output.uniform_size(grad_output.ndim - 2) != n_out
                       or len(grad_output) != len(input)
                       or not np.array_equal(grad_output.sizes[:, :-1], input.sizes[:, :-1])):
        raise ValueError(f"grad_output must have input's structure with last dim {n_out} "
                         f"(weight's rows), got {grad_output!r} for input {input!r}")
    g2 = _rows(grad_output, n_out)
    gi = _with_last(input, g2 @ w, w.shape[1]) if mask[0] else None
    gw = (g2.T @ _rows(input, k)).astype(wdtype, copy=False) if mask[1] else None
    gb = g2.sum(axis=0, dtype=np.float64).astype(wdtype) if mask[2] else None
    return gi, gw, gb
