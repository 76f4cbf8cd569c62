"""cynorm.nested: the container, every op and backward against the same op
applied per component on dense float64 arrays, backward ops against finite
differences, ragged shapes by hypothesis (empty batches and zero-length
components included), and bad input."""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import cynorm.nested as nt
from cynorm.nested import NestedArray

FD = 1e-6


def make(rng, shapes, dtype=np.float64):
    return nt.nested_array([rng.standard_normal(s) for s in shapes], dtype=dtype)


def comps64(x):
    return [np.asarray(c, np.float64) for c in x.unbind()]


def assert_nested_close(got, want_list, rtol=1e-12, atol=1e-12):
    assert isinstance(got, NestedArray) and len(got) == len(want_list)
    for g, w in zip(got.unbind(), want_list):
        assert g.shape == np.shape(w)
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=rtol, atol=atol)


# ----------------------------------------------------------- references
erf = np.vectorize(math.erf, otypes=[np.float64])


def ref_gelu(c, approximate):
    if approximate == "tanh":
        return 0.5 * c * (1 + np.tanh(math.sqrt(2 / math.pi) * (c + 0.044715 * c ** 3)))
    return 0.5 * c * (1 + erf(c / math.sqrt(2)))


def ref_softmax(c, d):
    e = np.exp(c - c.max(axis=d, keepdims=True)) if c.size else c
    return e / e.sum(axis=d, keepdims=True) if c.size else c


def ref_layer_norm(c, k, w, b, eps=1e-5):
    axes = tuple(range(c.ndim - k, c.ndim))
    if not c.size:
        return c
    mu = c.mean(axis=axes, keepdims=True)
    var = ((c - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (c - mu) / np.sqrt(var + eps)
    return y * w + b if w is not None else y


SHAPES = [(3, 8), (0, 8), (5, 8), (1, 8)]


# ------------------------------------------------------------- container
def test_container_round_trips_and_views(rng):
    arrays = [rng.standard_normal(s) for s in [(2, 3), (4, 3), (0, 3)]]
    x = nt.nested_array(arrays)
    assert len(x) == 3 and x.ndim == 3 and x.dtype == np.float64
    assert x.sizes.tolist() == [[2, 3], [4, 3], [0, 3]] and x.offsets.tolist() == [0, 6, 18]
    for a, c in zip(arrays, x.unbind()):
        np.testing.assert_array_equal(a, c)
        assert np.shares_memory(c, x.buffer) or c.size == 0
    x[1][0, 0] = 42.0
    assert x.buffer[6] == 42.0 and arrays[1][0, 0] != 42.0      # copies in, views out
    p = x.to_padded(fill=-1.0)
    assert p.shape == (3, 4, 3) and p[0, 3, 0] == -1.0
    y = nt.from_padded(p, x.sizes)
    for a, b in zip(x.unbind(), y.unbind()):
        np.testing.assert_array_equal(a, b)
    assert x.to_padded(output_size=(3, 6, 5)).shape == (3, 6, 5)
    assert "NestedArray(ntensors=3, dtype=float64, shapes=[(2, 3), (4, 3), (0, 3)])" == repr(x)
    assert x[-1].shape == (0, 3)
    empty = nt.nested_array([], dtype=np.float32)
    assert len(empty) == 0 and empty.buffer.size == 0 and empty.to_padded().shape == (0,)
    assert nt.nested_array([[1, 2], [3]]).dtype == np.float64


def test_container_bad_input():
    with pytest.raises(ValueError, match="same ndim"):
        nt.nested_array([np.ones((2, 3)), np.ones(3)])
    with pytest.raises(TypeError, match="different dtypes"):
        nt.nested_array([np.ones(2, np.float32), np.ones(2)])
    with pytest.raises(ValueError, match="sizes describe 6 elements but buffer holds 5"):
        NestedArray(np.ones(5), [[2, 3]])
    with pytest.raises(ValueError, match="contiguous 1-D"):
        NestedArray(np.ones((2, 3)), [[2, 3]])
    with pytest.raises(TypeError, match="floating dtype"):
        NestedArray(np.ones(6, np.int32), [[2, 3]])
    with pytest.raises(IndexError, match="component index 3 out of range"):
        nt.nested_array([np.ones(2)] * 3)[3]
    with pytest.raises(ValueError, match="output_size"):
        nt.nested_array([np.ones((2, 2))]).to_padded(output_size=(1, 1, 2))
    with pytest.raises(ValueError, match="sizes exceed"):
        nt.from_padded(np.ones((2, 3)), [[4], [1]])


# ------------------------------------------------------------ forward ops
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_pointwise_ops(approximate, rng):
    x = make(rng, SHAPES)
    assert_nested_close(nt.gelu(x, approximate), [ref_gelu(c, approximate) for c in comps64(x)])
    assert_nested_close(nt.silu(x), [c / (1 + np.exp(-c)) for c in comps64(x)])
    assert_nested_close(nt.relu(x), [np.maximum(c, 0) for c in comps64(x)])
    assert_nested_close(nt.threshold(x, 0.3, -2.0), [np.where(c > 0.3, c, -2.0) for c in comps64(x)])


@pytest.mark.parametrize("shapes,dim", [(SHAPES, -1), (SHAPES, 1), ([(2, 3, 4), (1, 5, 4), (3, 0, 4)], 2),
                                        ([(2, 3), (4, 5), (1, 1)], -1)])
def test_softmax_and_sum(shapes, dim, rng):
    x = make(rng, shapes)
    d = dim % x.ndim - 1
    assert_nested_close(nt.softmax(x, dim), [ref_softmax(c, d) for c in comps64(x)])
    assert_nested_close(nt.sum(x, dim), [c.sum(axis=d) for c in comps64(x)])
    assert_nested_close(nt.sum(x, [dim], keepdim=True), [c.sum(axis=d, keepdims=True) for c in comps64(x)])


def test_select(rng):
    x = make(rng, [(2, 3, 4), (1, 5, 4)])
    assert_nested_close(nt.select(x, 3, -1), [c[..., -1] for c in comps64(x)])
    assert_nested_close(nt.select(x, 1, 0), [c[0] for c in comps64(x)])
    np.testing.assert_array_equal(nt.select(x, 0, 1), x[1])


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 1e-5),
                                        (ml_dtypes.bfloat16, 2e-2)], ids=str)
def test_linear_matmul_and_layer_norm(dtype, rtol, rng):
    x = make(rng, SHAPES, dtype)
    pdt = np.float32 if np.dtype(dtype).itemsize == 2 else dtype
    W, b = rng.standard_normal((5, 8)).astype(pdt), rng.standard_normal(5).astype(pdt)
    c64 = comps64(x)
    assert_nested_close(nt.linear(x, W, b), [c @ W.T.astype(np.float64) + b for c in c64],
                        rtol=rtol, atol=rtol * 10)
    B = rng.standard_normal((8, 6)).astype(pdt)
    assert_nested_close(nt.matmul(x, B), [c @ B.astype(np.float64) for c in c64], rtol=rtol, atol=rtol * 10)
    w, bb = (rng.random(8) + 0.5).astype(pdt), rng.standard_normal(8).astype(pdt)
    y, mean, rstd = nt.layer_norm(x, (8,), w, bb)
    assert_nested_close(y, [ref_layer_norm(c, 1, w, bb) for c in c64], rtol=rtol, atol=rtol * 10)
    assert mean.shape == rstd.shape == (9,)
    np.testing.assert_allclose(mean, np.concatenate([c.mean(axis=1) for c in c64]), rtol=rtol, atol=rtol)


def test_nested_matmul_nested(rng):
    a = make(rng, [(2, 3), (4, 5), (0, 2)])
    b = make(rng, [(3, 6), (5, 1), (2, 2)])
    assert_nested_close(nt.matmul(a, b), [p @ q for p, q in zip(comps64(a), comps64(b))])


def test_layer_norm_over_two_trailing_dims(rng):
    x = make(rng, [(2, 3, 4), (5, 3, 4), (0, 3, 4)])
    w, b = rng.random((3, 4)) + 0.5, rng.standard_normal((3, 4))
    y, _, _ = nt.layer_norm(x, (3, 4), w, b)
    assert_nested_close(y, [ref_layer_norm(c, 2, w, b) for c in comps64(x)])


# ------------------------------------------------- backward ops: finite differences
def directional(f, x, v, grad):
    """d/de <grad, f(x + e v)> by central differences (x, v nested or dense)."""
    def at(e):
        xe = x.like(x.buffer + e * v.buffer) if isinstance(x, NestedArray) else x + e * v
        out = f(xe)
        return np.sum(out.buffer * grad.buffer) if isinstance(out, NestedArray) else np.sum(out * grad)
    return (at(FD) - at(-FD)) / (2 * FD)


def inner(a, b):
    return float(np.sum(a.buffer * b.buffer)) if isinstance(a, NestedArray) else float(np.sum(a * b))


def rand_like(rng, x):
    return x.like(rng.standard_normal(x.buffer.size)) if isinstance(x, NestedArray) \
        else rng.standard_normal(np.shape(x))


def check_vjp(rng, f, x, grad_x, out_like):
    v = rand_like(rng, x)
    g = rand_like(rng, out_like)
    want = directional(f, x, v, g)
    got = inner(grad_x(g), v)
    assert abs(got - want) <= 1e-6 * max(1.0, abs(want)), (got, want)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_pointwise_backward(approximate, rng):
    x = make(rng, SHAPES)
    check_vjp(rng, lambda z: nt.gelu(z, approximate), x,
              lambda g: nt.gelu_backward(g, x, approximate), x)
    check_vjp(rng, nt.silu, x, lambda g: nt.silu_backward(g, x), x)
    check_vjp(rng, nt.relu, x, lambda g: nt.threshold_backward(g, x, 0.0), x)


@pytest.mark.parametrize("shapes,dim", [(SHAPES, -1), ([(2, 3, 4), (1, 5, 4)], 2), ([(2, 3), (4, 5)], 2)])
def test_softmax_sum_select_backward(shapes, dim, rng):
    x = make(rng, shapes)
    y = nt.softmax(x, dim)
    check_vjp(rng, lambda z: nt.softmax(z, dim), x, lambda g: nt.softmax_backward(g, y, dim), y)
    for keep in (False, True):
        s = nt.sum(x, dim, keep)
        check_vjp(rng, lambda z: nt.sum(z, dim, keep), x, lambda g: nt.sum_backward(g, x, dim, keep), s)
    sel = nt.select(x, dim, 0)
    check_vjp(rng, lambda z: nt.select(z, dim, 0), x, lambda g: nt.select_backward(g, x, dim, 0), sel)


def test_linear_and_matmul_backward(rng):
    x = make(rng, SHAPES)
    W, b = rng.standard_normal((5, 8)), rng.standard_normal(5)
    y = nt.linear(x, W, b)
    gi, gw, gb = (lambda g: nt.linear_backward(x, g, W)), None, None
    check_vjp(rng, lambda z: nt.linear(z, W, b), x, lambda g: nt.linear_backward(x, g, W)[0], y)
    check_vjp(rng, lambda w: nt.linear(x, w, b), W, lambda g: nt.linear_backward(x, g, W)[1], y)
    check_vjp(rng, lambda bb: nt.linear(x, W, bb), b, lambda g: nt.linear_backward(x, g, W)[2], y)
    assert nt.linear_backward(x, y, W, (False, True, False))[0] is None
    B = rng.standard_normal((8, 6))
    m = nt.matmul(x, B)
    check_vjp(rng, lambda z: nt.matmul(z, B), x, lambda g: nt.matmul_backward(g, x, B)[0], m)
    check_vjp(rng, lambda bm: nt.matmul(x, bm), B, lambda g: nt.matmul_backward(g, x, B)[1], m)
    a2 = make(rng, [(2, 3), (4, 5)])
    b2 = make(rng, [(3, 6), (5, 1)])
    m2 = nt.matmul(a2, b2)
    check_vjp(rng, lambda z: nt.matmul(z, b2), a2, lambda g: nt.matmul_backward(g, a2, b2)[0], m2)
    check_vjp(rng, lambda z: nt.matmul(a2, z), b2, lambda g: nt.matmul_backward(g, a2, b2)[1], m2)
    del gi, gw, gb


def test_layer_norm_backward(rng):
    x = make(rng, SHAPES)
    w, b = rng.random(8) + 0.5, rng.standard_normal(8)
    y, mean, rstd = nt.layer_norm(x, (8,), w, b)
    check_vjp(rng, lambda z: nt.layer_norm(z, (8,), w, b)[0], x,
              lambda g: nt.layer_norm_backward(g, x, (8,), mean, rstd, w, b)[0], y)
    check_vjp(rng, lambda ww: nt.layer_norm(x, (8,), ww, b)[0], w,
              lambda g: nt.layer_norm_backward(g, x, (8,), mean, rstd, w, b)[1], y)
    check_vjp(rng, lambda bb: nt.layer_norm(x, (8,), w, bb)[0], b,
              lambda g: nt.layer_norm_backward(g, x, (8,), mean, rstd, w, b)[2], y)
    gi, gw, gb = nt.layer_norm_backward(y, x, (8,), mean, rstd, w, b, (False, True, False))
    assert not np.any(gi.buffer) and gi.same_structure(x) and gw is not None and gb is None


# ------------------------------------------------------------- hypothesis
ragged = st.lists(st.integers(0, 6), min_size=0, max_size=6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_of_nan_and_inf(dtype):
    # a NaN, or +inf (inf - inf), makes its row NaN, -inf gives 0, the other
    # rows keep their values; float32's exp (cn_vecmath.h) must take NaN
    # without undefined behaviour (converting it to int), which UBSan checks
    # in .ci/sanitize
    rows = [[np.nan, 1.0, 2.0], [np.inf, 1.0], [-np.inf, 0.0, 1.0], [1.0, 2.0, 3.0]]
    x = nt.nested_array([np.array(r, dtype) for r in rows])
    with np.errstate(invalid="ignore"):
        want = [ref_softmax(np.array(r), 0) for r in rows]
    assert_nested_close(nt.softmax(x, -1), want, rtol=1e-6, atol=0)


@settings(max_examples=40, deadline=None)
@given(lengths=ragged, width=st.integers(1, 5), seed=st.integers(0, 2 ** 32 - 1))
def test_ops_over_ragged_batches(lengths, width, seed):
    rng = np.random.default_rng(seed)
    x = nt.nested_array([rng.standard_normal((n, width)) for n in lengths]) if lengths else \
        NestedArray(np.zeros(0), np.zeros((0, 2), np.int64))
    c64 = comps64(x)
    assert_nested_close(nt.softmax(x, -1), [ref_softmax(c, 1) for c in c64])
    assert_nested_close(nt.sum(x, 2), [c.sum(axis=1) for c in c64])
    assert_nested_close(nt.sum(x, 1), [c.sum(axis=0) for c in c64])
    assert_nested_close(nt.gelu(x), [ref_gelu(c, "none") for c in c64])
    W = rng.standard_normal((3, width))
    assert_nested_close(nt.linear(x, W), [c @ W.T for c in c64])
    w = rng.random(width) + 0.5
    y, mean, rstd = nt.layer_norm(x, (width,), w, None)
    assert_nested_close(y, [ref_layer_norm(c, 1, w, 0.0) for c in c64], atol=1e-10)
    g = x.like(rng.standard_normal(x.buffer.size))
    gi, gw, gb = nt.layer_norm_backward(g, x, (width,), mean, rstd, w, None)
    assert gi.same_structure(x) and gw.shape == (width,) and gb.shape == (width,)
    gi, gw, gb = nt.linear_backward(x, nt.linear(x, W), W)
    assert gi.same_structure(x) and gw.shape == W.shape and gb.shape == (3,)
    rows = np.concatenate([c @ W.T for c in c64]) if c64 else np.zeros((0, 3))
    np.testing.assert_allclose(gb, rows.sum(axis=0), rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 4)), min_size=1, max_size=5),
       seed=st.integers(0, 2 ** 32 - 1))
def test_ragged_two_dims_softmax_and_select(lengths, seed):
    rng = np.random.default_rng(seed)
    x = nt.nested_array([rng.standard_normal((a, b, 3)) for a, b in lengths])
    for dim in (1, 2, 3):
        assert_nested_close(nt.softmax(x, dim), [ref_softmax(c, dim - 1) for c in comps64(x)])
    assert_nested_close(nt.select(x, 1, 0), [c[0] for c in comps64(x)])


# --------------------------------------------------------------- bad input
def test_bad_input(rng):
    x = make(rng, SHAPES)
    other = make(rng, [(3, 8), (1, 8), (5, 8), (1, 8)])
    with pytest.raises(ValueError, match="dim=0 indexes the components"):
        nt.softmax(x, 0)
    with pytest.raises(ValueError, match="dim=3 is out of range"):
        nt.softmax(x, 3)
    with pytest.raises(ValueError, match="dims=0 sums over dim 0 .* x's components must agree"):
        nt.sum(x, 0)         # over dim 0 the components must agree in the kept dims
    with pytest.raises(ValueError, match="dim=0 indexes the components"):
        nt.softmax_backward(x, x, 0)
    with pytest.raises(ValueError, match="same nested structure"):
        nt.gelu_backward(other, x)
    with pytest.raises(ValueError, match="same nested structure"):
        nt.softmax_backward(other, x, -1)
    with pytest.raises(ValueError, match="weight must have shape"):
        nt.linear(x, np.ones((5, 7)))
    with pytest.raises(ValueError, match="must end in normalized_shape"):
        nt.layer_norm(nt.nested_array([np.ones((2, 8)), np.ones((2, 7))]), (8,))
    with pytest.raises(ValueError, match="share their last dim"):
        nt.linear(nt.nested_array([np.ones((2, 8)), np.ones((2, 7))]), np.ones((3, 8)))
    with pytest.raises(ValueError, match=r"weight must have shape normalized_shape \(8,\)"):
        nt.layer_norm(x, (8,), np.ones(7))
    with pytest.raises(TypeError, match="must be a cynorm.nested.NestedArray"):
        nt.relu(np.ones(3))
    with pytest.raises(ValueError, match="approximate must be"):
        nt.gelu(x, "fast")
    with pytest.raises(IndexError, match="index 3 is out of range for component 0"):
        nt.select(x, 1, 3)
    with pytest.raises(ValueError, match="mean must have 9 entries"):
        nt.layer_norm_backward(x, x, (8,), np.zeros(3), np.ones(9))


def test_edge_semantics_found_in_review(rng):
    # NaN passes threshold / its backward, as ATen's `x <= threshold ? value : x`
    x = nt.nested_array([np.array([np.nan, -1.0, 2.0])])
    np.testing.assert_array_equal(nt.threshold(x, 0.0, 5.0).buffer, [np.nan, 5.0, 2.0])
    np.testing.assert_array_equal(nt.relu(x).buffer, [np.nan, 0.0, 2.0])
    np.testing.assert_array_equal(nt.threshold_backward(x.like(np.ones(3)), x, 0.0).buffer, [1, 0, 1])
    a = make(rng, [(2, 3), (4, 3)])
    b = make(rng, [(3, 5), (3, 5)])
    with pytest.raises(ValueError, match="as many components"):
        nt.matmul_backward(make(rng, [(2, 5)]), a, b)
    with pytest.raises(ValueError, match="grad component 1 has shape"):
        nt.matmul_backward(make(rng, [(2, 5), (3, 5)]), a, b)
    with pytest.raises(ValueError, match="grad must have self's structure"):
        nt.matmul_backward(make(rng, [(3, 5), (3, 5)]), make(rng, [(2, 3), (4, 3)]).like(
            rng.standard_normal(18)), rng.standard_normal((3, 5)))
    with pytest.raises(ValueError, match=r"grad component 0 must have shape \(2, 3\)"):
        nt.sum_backward(make(rng, [(3, 2)]), make(rng, [(2, 3, 4)]), 3)
    with pytest.raises(ValueError, match="non-negative"):
        nt.from_padded(np.arange(3.0)[None], [[-1]])
    with pytest.raises(TypeError, match="integers"):
        nt.from_padded(np.arange(3.0)[None], [[1.7]])
    with pytest.raises(IndexError, match=r"index 7 is out of range for the batch \(dim 0\) of size 2"):
        nt.select(a, 0, 7)


# ------------------------------------------- bugs a seeded fuzzer found (regressions)

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
def test_sum_over_every_component_dim_gives_0d_components(dtype):
    """cynorm.nested.sum:20261124:5: summing (8, 1), (4, 0), (1, 2) components
    over dims [1, 2] gave components of shape (1,) (sizes (3, 1)) for
    float32/float64: stored() went through np.ascontiguousarray, which makes a
    0-d value 1-d.  As np.sum / torch.sum over every dim: 0-d components."""
    rng = np.random.default_rng(5)
    comps = [rng.standard_normal(s) for s in [(8, 1), (4, 0), (1, 2)]]
    x = nt.nested_array(comps, dtype=dtype)
    y = nt.sum(x, [1, 2], keepdim=False)
    assert y.sizes.shape == (3, 0) and y.ndim == 1 and y.dtype == np.dtype(dtype)
    for got, c in zip(y.unbind(), x.unbind()):
        assert got.shape == ()
        want = np.asarray(c, np.float64).sum()
        np.testing.assert_allclose(np.float64(got), want, rtol=1e-2 if x.dtype.itemsize == 2 else 1e-6)
    kept = nt.sum(x, [1, 2], keepdim=True)
    assert kept.sizes.tolist() == [[1, 1]] * 3


def test_from_padded_of_an_empty_batch_keeps_the_component_ndim():
    """cynorm.nested.from_padded:20261124:0: padded (0, 6, 3) with sizes (0, 2)
    gave sizes of shape (0, 0) (a nested array of 0-d components)."""
    x = nt.from_padded(np.zeros((0, 6, 3), np.float16), np.zeros((0, 2), np.int64))
    assert x.sizes.shape == (0, 2) and x.ndim == 3 and len(x) == 0
    assert x.dtype == np.float16 and x.buffer.shape == (0,)
    assert x.to_padded().shape == (0, 0, 0)


def test_dense_operand_gradients_are_native_byte_order(rng):
    """cynorm.nested.linear_backward:20261124:9 and matmul_backward:20261124:25:
    a big-endian weight / other gave a '>f4' grad_weight / grad_other (the
    result took the raw argument's dtype); every op returns native arrays."""
    x = make(rng, [(3, 4), (6, 4)], np.float32)
    g = make(rng, [(3, 5), (6, 5)], np.float32)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    want = nt.linear_backward(x, g, w)
    got = nt.linear_backward(x, g, w.astype(">f4"))
    for a, b in zip(got, want):
        a = a.buffer if isinstance(a, NestedArray) else a
        b = b.buffer if isinstance(b, NestedArray) else b
        assert a.dtype == np.float32 and a.dtype.isnative
        np.testing.assert_array_equal(a, b)
    s = make(rng, [(4, 5), (3, 5)], ml_dtypes.bfloat16)
    gm = make(rng, [(4, 3), (3, 3)], ml_dtypes.bfloat16)
    other = rng.standard_normal((5, 3)).astype(np.float32)
    want = nt.matmul_backward(gm, s, other)
    got = nt.matmul_backward(gm, s, other.astype(">f4"))
    assert got[1].dtype == np.float32 and got[1].dtype.isnative
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0].buffer, want[0].buffer)
    y = nt.linear(x, w.astype(">f4"), rng.standard_normal(5).astype(">f4"))
    assert y.dtype == np.float32


def test_nested_array_converts_non_native_byte_order():
    """cynorm.nested.nested_array:11:101: a '>f8' component raised TypeError
    ("the arrays' dtype must be floating"); as every op, it converts."""
    a = np.arange(6.0).reshape(3, 2).astype(">f8")
    x = nt.nested_array([a, np.ones((1, 2))])        # '>f8' and native float64 agree
    assert x.dtype == np.float64 and x.dtype.isnative
    np.testing.assert_array_equal(x[0], np.arange(6.0).reshape(3, 2))
    e = nt.nested_array([np.zeros((0, 1), ">f8")])
    assert e.dtype == np.float64 and e.sizes.tolist() == [[0, 1]]
    y = nt.nested_array([a], dtype=">f4")
    assert y.dtype == np.float32 and y.dtype.isnative
    np.testing.assert_array_equal(y[0], np.arange(6.0).reshape(3, 2))


def test_structure_is_shared_and_read_only_and_its_checks_still_run(rng):
    """like() shares the structure (sizes, offsets, numels, and the values
    derived from it once: the row table, layer_norm's row count); none of it
    can be written, and an op that does not fit the structure still fails
    after one that did."""
    x = nt.nested_array([rng.standard_normal((3, 4)), rng.standard_normal((2, 4))])
    y = nt.softmax(x, -1)
    assert y.sizes is x.sizes and y.offsets is x.offsets and y.numels is x.numels
    for a in (x.sizes, x.offsets, x.numels):
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 7
    nt.layer_norm(x, 4)
    with pytest.raises(ValueError, match="must end in normalized_shape"):
        nt.layer_norm(y, (3,))
    with pytest.raises(ValueError, match="must name 1 to 2"):
        nt.layer_norm(y, (1, 3, 4))
    # the cached values give what a fresh structure computes
    fresh = NestedArray(x.buffer.copy(), x.sizes.copy())
    for a, b in ((nt.softmax(y, -1), nt.softmax(nt.softmax(fresh, -1), -1)),
                 (nt.layer_norm(y, 4)[0], nt.layer_norm(nt.softmax(fresh, -1), 4)[0])):
        np.testing.assert_array_equal(a.buffer, b.buffer)
    with pytest.raises(ValueError, match="sizes describe 20 elements but buffer holds 13"):
        x.like(np.zeros(13))


def test_derived_structures_are_made_once_and_match_fresh_ones(rng):
    """sum over the last dim, linear and matmul change only the last dim of
    the structure: the new structure is made once per (structure, last dim)
    and shared by every result, read-only; it equals what NestedArray
    computes from the result's shapes, and a gradient that shares it gives
    the same bits as one with a structure of its own (whose shapes are
    compared instead)."""
    shapes = [(3, 4), (0, 4), (1, 4), (5, 4)]
    x = make(rng, shapes, np.float32)
    W = rng.standard_normal((6, 4)).astype(np.float32)
    for keep in (False, True):
        a, b = nt.sum(x, -1, keep), nt.sum(x, -1, keep)
        assert a.sizes is b.sizes and a.offsets is b.offsets and a.numels is b.numels
        want = [np.asarray(c, np.float64).sum(-1, keepdims=keep) for c in x.unbind()]
        assert_nested_close(a, want, rtol=1e-6, atol=1e-6)
    y1, y2, m = nt.linear(x, W), nt.linear(x, W), nt.matmul(x, W.T)
    assert y1.sizes is y2.sizes is m.sizes
    assert y1.sizes.tolist() == [[3, 6], [0, 6], [1, 6], [5, 6]]
    fresh = NestedArray(y1.buffer.copy(), y1.sizes.copy())
    for s in (y1, fresh):
        for arr in (s.sizes, s.offsets, s.numels):
            assert not arr.flags.writeable
        np.testing.assert_array_equal(s.offsets, fresh.offsets)
        np.testing.assert_array_equal(s.numels, fresh.numels)
    shared, own = nt.linear_backward(x, y1, W), nt.linear_backward(x, fresh, W)
    for s, o in zip(shared, own):
        np.testing.assert_array_equal(getattr(s, "buffer", s), getattr(o, "buffer", o))
    assert nt.matmul_backward(y1, x, W.T)[0].sizes is x.sizes   # the input's own structure
    wrong = nt.nested_array([np.zeros((3, 6), np.float32), np.zeros((0, 6), np.float32),
                             np.zeros((2, 6), np.float32), np.zeros((5, 6), np.float32)])
    with pytest.raises(ValueError, match="grad_output must have input's structure"):
        nt.linear_backward(x, wrong, W)
    with pytest.raises(ValueError, match="grad must have self's structure"):
        nt.matmul_backward(wrong, x, W.T)
