"""cynorm.nested ops across the batch: sum over dim 0 (and over every dim)
and nested @ a dense (B, D, E) batch of matrices, with their backward.

Forward results against a per-component float64 NumPy reference, backward
ops against central finite differences in float64 and against the same
reference for 16-bit and float32 data; bad input raises naming the argument.
(PyTorch parity: tests/test_nested_torch_parity.py.)"""
import ml_dtypes
import numpy as np
import pytest

import cynorm.nested as nt
from cynorm.nested import NestedArray

FD = 1e-6
DTYPES = [(np.float64, 1e-12), (np.float32, 1e-5), (ml_dtypes.bfloat16, 2e-2)]
DTYPE_IDS = ["float64", "float32", "bfloat16"]


def make(rng, shapes, dtype=np.float64):
    return nt.nested_array([rng.standard_normal(s) for s in shapes], dtype=dtype)


def comps64(x):
    return [np.asarray(c, np.float64) for c in x.unbind()]


def assert_nested_close(got, want_list, rtol, atol):
    assert isinstance(got, NestedArray) and len(got) == len(want_list)
    for g, w in zip(got.unbind(), want_list):
        assert g.shape == np.shape(w)
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=rtol, atol=atol)


# ------------------------------------------------------------- references
def ref_batch_sum(comps, dims, ndim, keepdim):
    """sum over nested dims `dims` (0 among them; None: every dim) of
    float64 components: each component summed over its dims, then the
    components added up."""
    nd = list(range(ndim)) if dims is None else [d % ndim for d in np.atleast_1d(dims)]
    axes = tuple(d - 1 for d in nd if d != 0)
    total = 0.0
    for c in comps:
        total = total + c.sum(axis=axes, keepdims=keepdim)
    total = np.asarray(total, np.float64)
    return total[None] if keepdim else total


def ref_batch_matmul(comps, b):
    b = np.asarray(b, np.float64)
    return [c @ (b[0] if len(b) == 1 else b[i]) for i, c in enumerate(comps)]


# ---------------------------------------------------- finite differences
def _perturbed(x, v, e):
    return x.like(x.buffer + e * v.buffer) if isinstance(x, NestedArray) else x + e * v


def _inner(a, b):
    if isinstance(a, NestedArray):
        return float(np.sum(a.buffer * b.buffer))
    return float(np.sum(np.asarray(a) * np.asarray(b)))


def _random_like(rng, x):
    if isinstance(x, NestedArray):
        return x.like(rng.standard_normal(x.buffer.size))
    return rng.standard_normal(np.shape(x))


def check_vjp(rng, f, x, grad_x, out_like):
    """<grad_x(g), v> equals d/de <g, f(x + e v)> by central differences
    (float64), for a random direction v and cotangent g."""
    v, g = _random_like(rng, x), _random_like(rng, out_like)
    want = (_inner(f(_perturbed(x, v, FD)), g) - _inner(f(_perturbed(x, v, -FD)), g)) / (2 * FD)
    got = _inner(grad_x(g), v)
    assert abs(got - want) <= 1e-6 * max(1.0, abs(want)), (got, want)


# ----------------------------------------------------------- sum over dim 0
RAGGED = [(3, 4), (0, 4), (5, 4), (1, 4)]
SUM_CASES = [
    (RAGGED, (0, 1), False),                   # torch's jagged (batch, ragged): dense (4,)
    (RAGGED, [0, 1], True),
    (RAGGED, None, False),                     # every dim: 0-d
    (RAGGED, None, True),
    (RAGGED, (0, 1, -1), True),
    ([(2, 3, 4), (2, 5, 4)], (0, 2), False),   # a summed dim after a kept one
    ([(2, 3, 4), (5, 3, 4)], [0, -3], False),  # -3 is nested dim 1
    ([(2, 3), (2, 3), (2, 3)], 0, False),      # dim 0 alone: torch refuses it
    ([(2, 3), (2, 3), (2, 3)], 0, True),
    ([(3, 4)], 0, False),                      # a single component
    ([(0, 4), (0, 4)], (0, 1), False),         # empty components sum to zeros
    ([(3, 0), (2, 0)], (0, 1), False),         # a kept dim of size 0
]


@pytest.mark.parametrize("dtype,rtol", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shapes,dims,keepdim", SUM_CASES)
def test_sum_over_dim_0(shapes, dims, keepdim, dtype, rtol, rng):
    x = make(rng, shapes, dtype)
    before = x.buffer.copy()
    got = nt.sum(x, dims, keepdim)
    want = ref_batch_sum(comps64(x), dims, x.ndim, keepdim)
    assert isinstance(got, np.ndarray) and got.dtype == x.dtype and got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=rtol * 10)
    np.testing.assert_array_equal(x.buffer, before)        # the input is not modified


def test_sum_defaults_to_every_dim(rng):
    x = make(rng, RAGGED)
    got = nt.sum(x)
    assert got.shape == () and got.dtype == np.float64
    np.testing.assert_allclose(got, sum(c.sum() for c in comps64(x)), rtol=1e-12)
    # a batch without components sums to 0 over every dim
    empty = NestedArray(np.zeros(0, np.float32), np.zeros((0, 2), np.int64))
    assert nt.sum(empty).shape == () and nt.sum(empty) == 0 and nt.sum(empty).dtype == np.float32
    assert nt.sum(empty, None, keepdim=True).shape == (1, 1, 1)
    flat = nt.nested_array([np.arange(3.0), np.arange(5.0)])
    assert nt.sum(flat, (0, 1)) == 13.0 and nt.sum(flat, (0, -1), keepdim=True).shape == (1, 1)
    # 0-d components: dim 0 is every dim
    scalars = nt.nested_array([np.array(2.0), np.array(3.5)])
    assert scalars.ndim == 1 and nt.sum(scalars, 0) == 5.5


@pytest.mark.parametrize("shapes,dims,keepdim", SUM_CASES)
def test_sum_over_dim_0_backward(shapes, dims, keepdim, rng):
    x = make(rng, shapes)
    y = nt.sum(x, dims, keepdim)
    check_vjp(rng, lambda z: nt.sum(z, dims, keepdim), x,
              lambda g: nt.sum_backward(g, x, dims, keepdim), y)


@pytest.mark.parametrize("dtype,rtol", DTYPES, ids=DTYPE_IDS)
def test_sum_over_dim_0_backward_values(dtype, rtol, rng):
    x = make(rng, [(2, 3, 4), (2, 5, 4), (2, 0, 4)], dtype)
    g = rng.standard_normal((1, 2, 1, 4)).astype(dtype)
    before = g.copy()
    got = nt.sum_backward(g, x, (0, 2), True)
    g64 = np.asarray(g, np.float64)[0]
    want = [np.broadcast_to(g64, c.shape) for c in comps64(x)]
    assert got.same_structure(x) and got.dtype == x.dtype
    assert_nested_close(got, want, rtol=rtol, atol=0)
    np.testing.assert_array_equal(g, before)
    # over every dim: the 0-d grad everywhere
    got = nt.sum_backward(np.asarray(2.5, dtype), x, None)
    assert_nested_close(got, [np.full(c.shape, 2.5) for c in comps64(x)], rtol=0, atol=0)


def test_sum_over_component_dims_is_unchanged(rng):
    # dims without 0 still sum each component on its own (a nested result)
    x = make(rng, RAGGED)
    got = nt.sum(x, 2)
    assert isinstance(got, NestedArray)
    assert_nested_close(got, [c.sum(axis=1) for c in comps64(x)], rtol=1e-12, atol=1e-12)


# ------------------------------------------------ nested @ (B, D, E) batch
MATMUL_CASES = [
    ([(3, 4), (0, 4), (5, 4), (1, 4)], 4),   # one matrix per component
    ([(3, 4), (0, 4), (5, 4), (1, 4)], 1),   # one for all, broadcast as torch does
    ([(2, 4)], 1),                           # a single component
    ([(0, 4), (0, 4)], 2),                   # only empty components
]


@pytest.mark.parametrize("dtype,rtol", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shapes,B", MATMUL_CASES)
def test_matmul_batch(shapes, B, dtype, rtol, rng):
    a = make(rng, shapes, dtype)
    b = rng.standard_normal((B, 4, 6)).astype(dtype)
    a_before, b_before = a.buffer.copy(), b.copy()
    got = nt.matmul(a, b)
    assert got.dtype == a.dtype
    assert_nested_close(got, ref_batch_matmul(comps64(a), b), rtol=rtol, atol=rtol * 10)
    np.testing.assert_array_equal(a.buffer, a_before)
    np.testing.assert_array_equal(b, b_before)
    if a.dtype.itemsize == 2:      # a float32 batch multiplies 16-bit components too
        got = nt.matmul(a, b.astype(np.float32))
        assert got.dtype == a.dtype
        assert_nested_close(got, ref_batch_matmul(comps64(a), b), rtol=rtol, atol=rtol * 10)


def test_matmul_batch_without_components():
    a = NestedArray(np.zeros(0), np.zeros((0, 2), np.int64))
    for B in (0, 1):
        y = nt.matmul(a, np.zeros((B, 4, 6)))
        assert len(y) == 0 and y.ndim == 3
        gs, go = nt.matmul_backward(y, a, np.zeros((B, 4, 6)))
        assert len(gs) == 0 and go.shape == (B, 4, 6) and not np.any(go)


@pytest.mark.parametrize("shapes,B", MATMUL_CASES)
def test_matmul_batch_backward(shapes, B, rng):
    a = make(rng, shapes)
    b = rng.standard_normal((B, 4, 6))
    y = nt.matmul(a, b)
    check_vjp(rng, lambda z: nt.matmul(z, b), a, lambda g: nt.matmul_backward(g, a, b)[0], y)
    check_vjp(rng, lambda m: nt.matmul(a, m), b, lambda g: nt.matmul_backward(g, a, b)[1], y)


@pytest.mark.parametrize("dtype,rtol", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("B", [3, 1])
def test_matmul_batch_backward_values(B, dtype, rtol, rng):
    a = make(rng, [(3, 4), (0, 4), (5, 4)], dtype)
    b = rng.standard_normal((B, 4, 6)).astype(dtype)
    g = make(rng, [(3, 6), (0, 6), (5, 6)], dtype)
    g_before = g.buffer.copy()
    gs, go = nt.matmul_backward(g, a, b)
    a64, g64, b64 = comps64(a), comps64(g), np.asarray(b, np.float64)
    assert gs.same_structure(a) and gs.dtype == a.dtype
    assert go.shape == b.shape and go.dtype == b.dtype
    assert_nested_close(gs, [gi @ (b64[0] if B == 1 else b64[i]).T for i, gi in enumerate(g64)],
                        rtol=rtol, atol=rtol * 10)
    per_component = [ai.T @ gi for ai, gi in zip(a64, g64)]
    want = np.sum(per_component, axis=0)[None] if B == 1 else np.stack(per_component)
    np.testing.assert_allclose(np.asarray(go, np.float64), want, rtol=rtol, atol=rtol * 10)
    np.testing.assert_array_equal(g.buffer, g_before)
    assert nt.matmul_backward(g, a, b, (True, False))[1] is None
    assert nt.matmul_backward(g, a, b, (False, True))[0] is None


# --------------------------------------------------------------- bad input
def test_sum_over_dim_0_bad_input(rng):
    x = make(rng, RAGGED)
    with pytest.raises(ValueError, match=r"dims=0 sums over dim 0 .* x's components must agree"):
        nt.sum(x, 0)                              # the components differ in the kept dim 1
    with pytest.raises(ValueError, match=r"dims=\(0, 2\) .* component 1 has \(0, 4\)"):
        nt.sum(x, (0, 2))
    with pytest.raises(ValueError, match="dims has repeated entries"):
        nt.sum(x, (0, -3))
    with pytest.raises(ValueError, match="dims=3 is out of range"):
        nt.sum(x, (0, 3))
    with pytest.raises(TypeError, match="dims must be an int, a non-empty sequence"):
        nt.sum(x, ())
    with pytest.raises(TypeError, match="keepdim must be a bool"):
        nt.sum(x, None, 1)
    with pytest.raises(TypeError, match="x must be a cynorm.nested.NestedArray"):
        nt.sum(np.ones((2, 3)), 0)
    empty = NestedArray(np.zeros(0), np.zeros((0, 2), np.int64))
    with pytest.raises(ValueError, match="x has no components"):
        nt.sum(empty, (0, 1))


def test_sum_backward_over_dim_0_bad_input(rng):
    x = make(rng, RAGGED)
    with pytest.raises(TypeError, match="grad must be a dense array"):
        nt.sum_backward(nt.sum(x, 2), x, (0, 1))
    with pytest.raises(ValueError, match=r"grad must have shape \(4,\)"):
        nt.sum_backward(np.ones(5), x, (0, 1))
    with pytest.raises(ValueError, match=r"grad must have shape \(1, 1, 4\)"):
        nt.sum_backward(np.ones(4), x, (0, 1), True)
    with pytest.raises(TypeError, match="grad must have self's dtype float64"):
        nt.sum_backward(np.ones(4, np.float32), x, (0, 1))
    with pytest.raises(TypeError, match="grad"):
        nt.sum_backward("x", x, (0, 1))
    with pytest.raises(ValueError, match="self's components must agree"):
        nt.sum_backward(np.ones((4,)), x, 0)
    with pytest.raises(TypeError, match="self must be a cynorm.nested.NestedArray"):
        nt.sum_backward(np.ones(4), np.ones((2, 4)), (0, 1))
    with pytest.raises(TypeError, match="grad must be a cynorm.nested.NestedArray"):
        nt.sum_backward(np.ones(4), x, 1)        # over component dims the grad is nested


def test_matmul_batch_bad_input(rng):
    a = make(rng, [(3, 4), (5, 4)])
    with pytest.raises(ValueError, match=r"b must hold one \(D, E\) matrix per component of a "
                                         r"\(B = 2\)"):
        nt.matmul(a, np.ones((3, 4, 6)))
    with pytest.raises(ValueError, match="b must have 4 rows per matrix"):
        nt.matmul(a, np.ones((2, 5, 6)))
    for bad in (np.ones((2, 1, 4, 6)), np.ones(4), np.float64(1.0)):
        with pytest.raises(ValueError, match=r"b must be a 2-D \(D, E\) matrix, a 3-D"):
            nt.matmul(a, bad)
    with pytest.raises(ValueError, match=r"a's components must be 2-D \(n_i, D\)"):
        nt.matmul(make(rng, [(2, 3, 4)]), np.ones((1, 4, 6)))
    with pytest.raises(ValueError, match="a's components must share their last dim"):
        nt.matmul(make(rng, [(3, 4), (5, 3)]), np.ones((2, 4, 6)))
    with pytest.raises(TypeError, match="a must be a cynorm.nested.NestedArray"):
        nt.matmul(np.ones((2, 3, 4)), np.ones((2, 4, 6)))
    with pytest.raises(TypeError, match="b must have float64 dtype"):
        nt.matmul(a, np.ones((2, 4, 6), np.float32))
    with pytest.raises(TypeError, match="b must have a floating dtype"):
        nt.matmul(a, np.ones((2, 4, 6), np.int64))


def test_matmul_batch_backward_bad_input(rng):
    a = make(rng, [(3, 4), (5, 4)])
    b = rng.standard_normal((2, 4, 6))
    g = nt.matmul(a, b)
    with pytest.raises(ValueError, match=r"other must hold one \(D, E\) matrix per component of "
                                         r"self \(B = 2\)"):
        nt.matmul_backward(g, a, np.ones((3, 4, 6)))
    with pytest.raises(ValueError, match="other must have 4 rows per matrix"):
        nt.matmul_backward(g, a, np.ones((2, 5, 6)))
    with pytest.raises(ValueError, match=r"other must be a 2-D \(D, E\) matrix, a 3-D"):
        nt.matmul_backward(g, a, np.ones((2, 1, 4, 6)))
    with pytest.raises(ValueError, match="grad must have self's structure with last dim 7"):
        nt.matmul_backward(g, a, np.ones((2, 4, 7)))
    with pytest.raises(ValueError, match="grad must have self's structure"):
        nt.matmul_backward(make(rng, [(3, 6), (4, 6)]), a, b)
    with pytest.raises(ValueError, match=r"self's components must be 2-D \(n_i, D\)"):
        nt.matmul_backward(make(rng, [(2, 3, 6)]), make(rng, [(2, 3, 4)]), np.ones((1, 4, 6)))
    with pytest.raises(TypeError, match="self must be a cynorm.nested.NestedArray"):
        nt.matmul_backward(g, np.ones((2, 3, 4)), b)
    with pytest.raises(TypeError, match="grad must be a cynorm.nested.NestedArray"):
        nt.matmul_backward(np.ones((2, 3, 6)), a, b)
    with pytest.raises(TypeError, match="other must have float64 dtype"):
        nt.matmul_backward(g, a, b.astype(np.float32))
    with pytest.raises(ValueError, match="output_mask must have 2 entries"):
        nt.matmul_backward(g, a, b, (True, True, True))
