"""Weight norm against the float64 reference: every shape class, dim, dtype
and memory layout; out=; bit-exact 16-bit stores; finite differences."""
import itertools

import numpy as np
import pytest

import cynorm
from cynorm import reference as ref
from conftest import DTYPES, DTYPE_IDS
from helpers import (BF16, F16, F32, F64, as_stored, assert_close, bits, g_dtype, is16, layout,
                     make_g, make_v, stat_dtype)

# Shapes that reach every kernel path: fused rows (A == 1, many rows), chunked
# rows (long rows, few rows), rows with A > 1 (middle dims, B >= 128), and the
# column path (small B) with one or many row blocks and column chunks.
SHAPES = [
    (1,), (7,), (17,), (1023,), (100003,),
    (1, 1), (3, 7), (17, 5), (1023, 3), (7, 1023), (2, 100003), (100003, 2),
    (8, 40000), (5000, 7), (40, 3000),
    (4, 5, 6), (3, 4, 200), (2, 3, 4, 5), (2, 3, 1, 4, 5),
]


def dims_of(shape):
    return list(range(len(shape))) + [-1, None]


CASES = [(s, d) for s in SHAPES for d in dims_of(s)]


def _wrap(dim, ndim):
    return None if dim is None else dim % ndim


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,dim", CASES, ids=[f"{s}-dim{d}" for s, d in CASES])
def test_forward_matches_reference(shape, dim, dtype, rng):
    for kind in ("C", "F", "strided"):
        v = make_v(rng, shape, dtype, kind)
        g = make_g(rng, shape, _wrap(dim, len(shape)), dtype)
        v_before = v.copy()
        w, norm = cynorm.weight_norm_interface(v, g, dim)
        w_ref, norm_ref = ref.weight_norm(v, g, _wrap(dim, len(shape)))
        assert w.shape == v.shape and w.dtype == v.dtype
        assert norm.shape == g.shape and norm.dtype == stat_dtype(dtype)
        assert_close(norm, norm_ref.reshape(g.shape), F64 if dtype == F64 else F32,
                     rtol=1e-12 if dtype == F64 else 1e-6, what=f"norm {kind}")
        assert_close(w, w_ref, dtype, what=f"w {kind}")
        np.testing.assert_array_equal(v, v_before)
        if kind == "F" and v.ndim > 1:
            assert w.flags.f_contiguous
        else:
            assert w.flags.c_contiguous
        # weight_norm is the same computation without the norm
        w2 = cynorm.weight_norm(v, g, dim)
        np.testing.assert_array_equal(bits(w2), bits(w))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,dim", CASES, ids=[f"{s}-dim{d}" for s, d in CASES])
def test_backward_matches_reference(shape, dim, dtype, rng):
    d = _wrap(dim, len(shape))
    for kind in ("C", "F", "strided"):
        v = make_v(rng, shape, dtype, kind)
        gw = make_v(rng, shape, dtype, kind)
        g = make_g(rng, shape, d, dtype)
        _, norm = cynorm.weight_norm_interface(v, g, dim)
        inputs = [a.copy() for a in (gw, v, g, norm)]
        grad_v, grad_g = cynorm.weight_norm_backward(gw, v, g, norm, dim)
        for before, after in zip(inputs, (gw, v, g, norm)):
            np.testing.assert_array_equal(before, after)
        gv_ref, gg_ref = ref.weight_norm_backward(gw, v, g, d)
        assert grad_v.shape == v.shape and grad_v.dtype == v.dtype
        assert grad_g.shape == g.shape and grad_g.dtype == g.dtype
        # scale for cancellation in a*gw - b*v: the sum of the two terms' sizes
        v64, gw64 = v.astype(np.float64), gw.astype(np.float64)
        n64 = ref.norm_except_dim(v64, 2, d).reshape(g.shape if g.ndim == v.ndim else ref.keep_shape(shape, d))
        g64 = g.astype(np.float64).reshape(n64.shape)
        term_scale = np.abs(g64 / n64 * gw64) + np.abs(g64 / n64 ** 3 * v64) * np.sqrt(
            np.sum(ref._rows(gw64 ** 2, d), axis=1).reshape(n64.shape)
            * np.sum(ref._rows(v64 ** 2, d), axis=1).reshape(n64.shape))
        assert_close(grad_v, gv_ref, dtype, scale=term_scale, what=f"grad_v {kind}")
        gg_scale = np.sqrt(np.sum(ref._rows(gw64 ** 2, d), axis=1)).reshape(gg_ref.shape)
        assert_close(grad_g, gg_ref.reshape(grad_g.shape), F64 if dtype == F64 else F32,
                     scale=gg_scale.reshape(grad_g.shape), rtol=1e-12 if dtype == F64 else 2e-6,
                     what=f"grad_g {kind}")


@pytest.mark.parametrize("p", [1, 2, 3, 0.5, 2.5, np.inf])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_norm_except_dim(p, dtype, rng):
    for shape in [(7,), (17, 5), (5000, 7), (3, 4, 200), (2, 3, 4, 5), (2, 100003)]:
        for dim in dims_of(shape):
            v = make_v(rng, shape, dtype, "C")
            got = cynorm.norm_except_dim(v, p, dim)
            want = ref.norm_except_dim(v, p, _wrap(dim, len(shape)))
            want = as_stored(want, dtype)    # large float16 norms overflow to inf
            assert got.shape == want.shape and got.dtype == v.dtype
            tol = {F64: 1e-12, F32: 1e-6, BF16: 8e-3, F16: 1e-3}[np.dtype(dtype)]
            assert_close(got, want, dtype, rtol=tol, what=f"{shape} dim={dim} p={p}")


@pytest.mark.parametrize("p", [2, np.inf])
def test_norm_except_dim_nan_in_a_later_row_block(p, rng):
    # the column shape reduces blocks of rows and merges them in block order:
    # a NaN in any block (first, middle, last) reaches its column's norm, at
    # p = inf too (max comparisons, as torch.linalg.norm(ord=inf))
    v = rng.standard_normal((300, 37)).astype(F32)
    for row, col in [(0, 3), (150, 5), (299, 36)]:
        v[row, col] = np.nan
    got = cynorm.norm_except_dim(v, p, 1).ravel()
    want = ref.norm_except_dim(v.astype(F64), p, 1).ravel()
    assert np.isnan(got[[3, 5, 36]]).all()
    keep = np.setdiff1d(np.arange(37), [3, 5, 36])
    assert_close(got[keep], want[keep], F32, rtol=1e-6, what=f"p={p}")


def test_norm_except_dim_integer_pow_and_layouts(rng):
    v = rng.standard_normal((6, 5, 4))
    want = ref.norm_except_dim(v, 2, 1)
    for kind in ("C", "F", "strided"):
        assert_close(cynorm.norm_except_dim(layout(v, kind), 2, 1), want, F64)
    assert cynorm.norm_except_dim(v, 2, None).shape == ()
    out = np.empty((1, 5, 1))
    assert cynorm.norm_except_dim(v, 2, 1, out=out) is out
    assert_close(out, want, F64)


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=str)
def test_stores_are_bit_identical_to_numpy_casts(dtype, rng):
    """16-bit (and float32) outputs are the float32 result rounded exactly as
    ml_dtypes / NumPy round it; the norm and grad_g come from the kernel, the
    elementwise math is redone here in float32."""
    for shape, dim in [((64, 300), 0), ((300, 64), 1), ((5, 6, 200), 1), ((4000, 5), 1), ((3, 50000), None)]:
        v = make_v(rng, shape, dtype)
        gw = make_v(rng, shape, dtype)
        g = make_g(rng, shape, dim, dtype)
        w, norm = cynorm.weight_norm_interface(v, g, dim)
        n32 = norm.astype(np.float32)
        a = g.astype(np.float32) / n32
        want = (v.astype(np.float32) * a).astype(dtype)
        np.testing.assert_array_equal(bits(w), bits(want))
        grad_v, grad_g = cynorm.weight_norm_backward(gw, v, g, norm, dim)
        b = a * grad_g.astype(np.float32) / n32
        want = (a * gw.astype(np.float32) - b * v.astype(np.float32)).astype(dtype)
        np.testing.assert_array_equal(bits(grad_v), bits(want))


@pytest.mark.parametrize("dim", [0, 1, 2, -1, None])
def test_backward_matches_central_differences(dim, rng):
    shape = (3, 4, 5)
    v = rng.standard_normal(shape)
    g = make_g(rng, shape, None if dim is None else dim % 3, F64)
    R = rng.standard_normal(shape)          # L(v, g) = sum(R * w(v, g))
    _, norm = cynorm.weight_norm_interface(v, g, dim)
    grad_v, grad_g = cynorm.weight_norm_backward(R, v, g, norm, dim)

    def loss(vv, gg):
        return float(np.sum(R * cynorm.weight_norm(vv, gg, dim)))

    eps = 1e-6
    num_v = np.zeros_like(v)
    for idx in np.ndindex(shape):
        e = np.zeros_like(v)
        e[idx] = eps
        num_v[idx] = (loss(v + e, g) - loss(v - e, g)) / (2 * eps)
    num_g = np.zeros_like(g)
    for idx in np.ndindex(g.shape):
        e = np.zeros_like(g)
        e[idx] = eps
        num_g[idx] = (loss(v, g + e) - loss(v, g - e)) / (2 * eps)
    np.testing.assert_allclose(grad_v, num_v, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(grad_g, num_g, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_out_arguments(dtype, rng):
    shape, dim = (30, 40), 0
    v = make_v(rng, shape, dtype)
    g = make_g(rng, shape, dim, dtype)
    gw = make_v(rng, shape, dtype)
    w_ref, n_ref = cynorm.weight_norm_interface(v, g, dim)
    w_out = np.empty(shape, dtype)
    n_out = np.empty(g.shape, stat_dtype(dtype))
    w, n = cynorm.weight_norm_interface(v, g, dim, out=(w_out, n_out))
    assert w is w_out and n is n_out
    np.testing.assert_array_equal(bits(w), bits(w_ref))
    np.testing.assert_array_equal(n, n_ref)
    w, n = cynorm.weight_norm_interface(v, g, dim, out=(None, n_out))
    assert n is n_out
    w_single = np.empty(shape, dtype)
    assert cynorm.weight_norm(v, g, dim, out=w_single) is w_single
    np.testing.assert_array_equal(bits(w_single), bits(w_ref))
    # F-ordered output with F-ordered input (read in place: the reduction
    # order differs from the C layout's, so compare with a tolerance)
    vf = np.asfortranarray(v)
    wf = np.empty(shape, dtype, order="F")
    assert cynorm.weight_norm(vf, g, dim, out=wf) is wf
    assert_close(wf, w_ref.astype(np.float64), dtype)
    # F input into a C output: the input is copied, the output honoured
    wc = np.empty(shape, dtype)
    cynorm.weight_norm(vf, g, dim, out=wc)
    np.testing.assert_array_equal(bits(wc), bits(w_ref))
    # C input into an F output: the same as F input into F output
    wf2 = np.empty(shape, dtype, order="F")
    cynorm.weight_norm(v, g, dim, out=wf2)
    np.testing.assert_array_equal(bits(wf2), bits(wf))
    gv_ref, gg_ref = cynorm.weight_norm_backward(gw, v, g, n_ref, dim)
    gv_out = np.empty(shape, dtype)
    gg_out = np.empty(g.shape, g.dtype)
    gv, gg = cynorm.weight_norm_backward(gw, v, g, n_ref, dim, out=(gv_out, gg_out))
    assert gv is gv_out and gg is gg_out
    np.testing.assert_array_equal(bits(gv), bits(gv_ref))
    np.testing.assert_array_equal(gg, gg_ref)


def test_one_dimensional_g_and_16bit_g(rng):
    v = rng.standard_normal((6, 7)).astype(BF16)
    g = (rng.random(7) + 0.5).astype(np.float32)
    w1, n1 = cynorm.weight_norm_interface(v, g, 1)
    w2, n2 = cynorm.weight_norm_interface(v, g.reshape(1, 7), 1)
    assert n1.shape == (7,) and n2.shape == (1, 7)
    np.testing.assert_array_equal(bits(w1), bits(w2))
    # a bfloat16 g holds the same values as its float32 cast
    gb = g.astype(BF16)
    w3, n3 = cynorm.weight_norm_interface(v, gb, 1)
    w4, _ = cynorm.weight_norm_interface(v, gb.astype(np.float32), 1)
    np.testing.assert_array_equal(bits(w3), bits(w4))
    assert n3.dtype == np.float32
    gv, gg = cynorm.weight_norm_backward(v, v, gb, n3, 1)
    assert gg.dtype == BF16 and gg.shape == (7,)
    gv32, gg32 = cynorm.weight_norm_backward(v, v, gb.astype(np.float32), n3, 1)
    np.testing.assert_array_equal(bits(gg), bits(gg32.astype(BF16)))


def test_dim_none_accepts_scalar_shapes(rng):
    v = rng.standard_normal((4, 5))
    want = v * 2.0 / np.sqrt(np.sum(v * v))
    for g in (np.array(2.0), np.array([2.0]), np.full((1, 1), 2.0)):
        w, n = cynorm.weight_norm_interface(v, g, None)
        assert n.shape == g.shape
        assert_close(w, want, F64)


def test_zero_size_arrays():
    # (8, 0) and (64, 0, 3): enough empty rows for the fused row path
    for shape, dim in [((0, 5), 0), ((0, 5), 1), ((5, 0), 0), ((3, 0, 4), 1), ((0,), None),
                       ((8, 0), 0), ((64, 0, 3), 0)]:
        v = np.zeros(shape, np.float32)
        D = 1 if dim is None else shape[dim]
        g = np.ones(D, np.float32)
        w, n = cynorm.weight_norm_interface(v, g, dim)
        assert w.shape == shape and n.shape == (D,)
        np.testing.assert_array_equal(n, np.zeros(D, np.float32))
        gv, gg = cynorm.weight_norm_backward(v, v, g, n, dim)
        assert gv.shape == shape and gg.shape == (D,)
        assert cynorm.norm_except_dim(v, 2, dim).shape == (() if dim is None else
                                                           tuple(s if i == dim else 1 for i, s in enumerate(shape)))


def test_zero_norm_gives_nan_like_pytorch():
    # w = v * (g / 0): 0 * inf = NaN, the same non-finite result torch gives
    v = np.zeros((3, 4), np.float32)
    v[1] = 1.0
    g = np.ones((3, 1), np.float32)
    w, n = cynorm.weight_norm_interface(v, g, 0)
    assert np.isnan(w[0]).all() and np.isnan(w[2]).all()
    np.testing.assert_allclose(w[1], 0.5)
    assert n[0, 0] == 0
    gv, gg = cynorm.weight_norm_backward(np.ones_like(v), v, g, n, 0)
    assert np.isnan(gg[0, 0]) and np.isnan(gv[0]).all()
    assert np.isfinite(gv[1]).all()


def test_float32_norm_does_not_drift_with_length(rng):
    # rows of 1M float32: relative error of the norm <= 2e-7 against float64
    v = (rng.standard_normal((3, 1 << 20)) + 0.3).astype(np.float32)
    n = cynorm.norm_except_dim(v, 2, 0)
    exact = np.sqrt(np.sum(v.astype(np.float64) ** 2, axis=1, keepdims=True))
    assert (np.abs(n - exact) / exact).max() <= 2e-7
    n_all = cynorm.norm_except_dim(v, 2, None)
    exact_all = np.sqrt(np.sum(v.astype(np.float64) ** 2))
    assert abs(float(n_all) - exact_all) / exact_all <= 2e-7
    _, n2 = cynorm.weight_norm_interface(v, np.ones((3, 1), np.float32), 0)
    assert (np.abs(n2 - exact) / exact).max() <= 2e-7


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_results_do_not_depend_on_thread_count(dtype, rng, restore_threads):
    cases = [((64, 4096), 0), ((4096, 64), 1), ((3, 50000), None), ((8, 3, 5000), 1),
             ((2, 200000), 0), ((300, 300), 1), ((20, 5000, 3), 1)]
    for shape, dim in cases:
        v = make_v(rng, shape, dtype)
        gw = make_v(rng, shape, dtype)
        g = make_g(rng, shape, dim, dtype)
        results = []
        for n in (1, 2, 3, 4):
            cynorm.set_num_threads(n)
            w, norm = cynorm.weight_norm_interface(v, g, dim)
            gv, gg = cynorm.weight_norm_backward(gw, v, g, norm, dim)
            ne = cynorm.norm_except_dim(v, 3, dim)
            results.append([a.tobytes() for a in (w, norm, gv, gg, ne)])
        for other in results[1:]:
            assert other == results[0], f"{shape} dim={dim}: results differ between thread counts"


def test_many_threads_calling_at_once(rng):
    # the kernels release the GIL; concurrent calls must not interfere
    from concurrent.futures import ThreadPoolExecutor
    v = rng.standard_normal((256, 1024)).astype(np.float32)
    g = make_g(rng, v.shape, 0, F32)
    want = cynorm.weight_norm(v, g, 0)
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda _: cynorm.weight_norm(v, g, 0), range(16)))
    for w in outs:
        np.testing.assert_array_equal(w, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_streaming_stores_give_the_same_bits(dtype, rng):
    """Large outputs are written with streaming stores; force them on small
    shapes (every path, odd lengths, unaligned heads) and compare."""
    from cynorm._kernels import _runtime
    cases = [((64, 1000), 0), ((1000, 37), 1), ((3, 50001), None), ((5, 7, 300), 1), ((4000, 5), 1)]
    for shape, dim in cases:
        v = make_v(rng, shape, dtype)
        gw = make_v(rng, shape, dtype)
        g = make_g(rng, shape, dim, dtype)
        old = _runtime.set_stream_min_bytes(1 << 62)
        try:
            w1, n1 = cynorm.weight_norm_interface(v, g, dim)
            gv1, gg1 = cynorm.weight_norm_backward(gw, v, g, n1, dim)
            _runtime.set_stream_min_bytes(0)
            w2, n2 = cynorm.weight_norm_interface(v, g, dim)
            gv2, gg2 = cynorm.weight_norm_backward(gw, v, g, n2, dim)
            # an output that starts off a 64-byte boundary
            buf = np.empty(v.size + 3, v.dtype)[3:].reshape(shape)
            cynorm.weight_norm(v, g, dim, out=buf)
        finally:
            _runtime.set_stream_min_bytes(old)
        for a, b in ((w1, w2), (n1, n2), (gv1, gv2), (gg1, gg2), (w1, buf)):
            np.testing.assert_array_equal(bits(a), bits(b))


@pytest.mark.parametrize("shape,dim", [((64, 300), 0), ((3000, 5), 1), ((4, 5, 600), 1), ((2, 50000), None)])
def test_outputs_may_alias_inputs(shape, dim, rng):
    """out=v works in place; an output overlapping an input in another layout
    gets a private copy of the input; norm/grad_g may be g's own memory."""
    v = make_v(rng, shape, F32)
    gw = make_v(rng, shape, F32)
    g = make_g(rng, shape, dim, F32)
    w_ref, n_ref = cynorm.weight_norm_interface(v, g, dim)
    gv_ref, gg_ref = cynorm.weight_norm_backward(gw, v, g, n_ref, dim)

    inplace = v.copy()
    cynorm.weight_norm(inplace, g, dim, out=inplace)
    np.testing.assert_array_equal(inplace, w_ref)

    g_as_norm = g.copy()
    w, n = cynorm.weight_norm_interface(v, g_as_norm, dim, out=(None, g_as_norm))
    assert n is g_as_norm
    np.testing.assert_array_equal(w, w_ref)
    np.testing.assert_array_equal(n, n_ref)

    # grad_v written over grad_w, grad_g over g
    gw2, g2 = gw.copy(), g.copy()
    gv, gg = cynorm.weight_norm_backward(gw2, v, g2, n_ref, dim, out=(gw2, g2))
    np.testing.assert_array_equal(gv, gv_ref)
    np.testing.assert_array_equal(gg, gg_ref)

    # an output overlapping the input shifted by one element
    flat = np.concatenate([v.ravel(), np.zeros(1, np.float32)])
    src = flat[:v.size].reshape(shape)
    dst = flat[1:].reshape(shape)
    w = cynorm.weight_norm(src, g, dim, out=dst)
    np.testing.assert_array_equal(w, w_ref)


@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=str)
@pytest.mark.parametrize("dim", [0, 1, None])
def test_a_channels_last_conv_weight_is_read_in_place(dtype, dim, rng):
    """A conv weight (O, I, kh, kw) in a channels_last torch tensor's memory
    ((O, kh, kw, I) in C order): read in place, as that memory seen as
    (O, kh, kw, I) is (the same bits), w and grad_v in the same memory order."""
    mem = (rng.standard_normal((8, 3, 3, 5)) * 2).astype(dtype)
    v = np.moveaxis(mem, -1, 1)                     # (8, 5, 3, 3)
    gmem = rng.standard_normal(mem.shape).astype(dtype)
    gw = np.moveaxis(gmem, -1, 1)
    mdim = {0: 0, 1: 3, None: None}[dim]            # dim in mem's axes
    gshape = [1] * 4
    if dim is not None:
        gshape[dim] = v.shape[dim]
    g = (rng.random(gshape) + 0.5).astype(stat_dtype(dtype))
    gm = g if dim is None else np.moveaxis(g, 1, -1)
    w, n = cynorm.weight_norm_interface(v, g, dim)
    wm, nm = cynorm.weight_norm_interface(mem, gm, mdim)
    assert np.moveaxis(w, 1, -1).flags.c_contiguous
    np.testing.assert_array_equal(bits(np.moveaxis(w, 1, -1)), bits(wm))
    np.testing.assert_array_equal(bits(n.reshape(-1)), bits(nm.reshape(-1)))
    gv, gg = cynorm.weight_norm_backward(gw, v, g, n, dim)
    gvm, ggm = cynorm.weight_norm_backward(gmem, mem, gm, nm, mdim)
    assert np.moveaxis(gv, 1, -1).flags.c_contiguous
    np.testing.assert_array_equal(bits(np.moveaxis(gv, 1, -1)), bits(gvm))
    np.testing.assert_array_equal(bits(gg.reshape(-1)), bits(ggm.reshape(-1)))
