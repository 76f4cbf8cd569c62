"""Layer norm against the float64 reference: row lengths from 1 to 200000,
few long rows and many short rows, 1..3 normalized axes, every dtype and
memory layout, weight/bias None or given (float32 for 16-bit inputs too),
out=, output_mask, zero sizes, finite differences, stability, NaN rows and
thread-count determinism."""
import itertools

import numpy as np
import pytest

import cynorm
from cynorm import reference as ref
from conftest import DTYPES, DTYPE_IDS
from helpers import BF16, F16, F32, F64, RTOL, assert_close, bits, layout, stat_dtype
from norm_helpers import (some, f64, ln_gx_scale, ln_rows, ln_y_scale, make_affine, make_x, param_dtypes,
                          stat_rtol)

# (shape, normalized_shape): one long row, two very long rows, many short
# rows, rows of 1 element, several normalized axes, ranks 1..5.
CASES = [
    ((7,), 7), ((1, 1), 1), ((64, 1), 1), ((3, 7), 7), ((17, 5), (5,)), ((5000, 7), 7),
    ((10000, 3), 3), ((8, 1024), 1024), ((4, 1023), (1023,)), ((40, 3000), 3000),
    ((1, 100003), 100003), ((2, 200000), 200000),
    ((3, 4, 5), (4, 5)), ((3, 1, 16), (1, 16)), ((2, 3, 4, 5), (3, 4, 5)), ((2, 3, 4, 5), 5),
    ((2, 3, 4, 5, 6), (5, 6)), ((2, 3, 1, 4, 16), (1, 4, 16)), ((6, 50, 3), (50, 3)),
]
CASE_IDS = [f"{s}-ns{n}" for s, n in CASES]
KINDS = ("C", "F", "strided")


def ns_tuple(ns):
    return (ns,) if isinstance(ns, int) else tuple(ns)


def variants(dtype):
    """(weight dtype or None, bias dtype or None) combinations to try."""
    out = [(None, None)]
    for p in param_dtypes(dtype):
        out += [(p, None), (p, p)]
    out.append((None, np.dtype(dtype)))
    return out


def make_params(rng, ns, wdt, bdt):
    w = None if wdt is None else make_affine(rng, ns, wdt)[0]
    b = None if bdt is None else make_affine(rng, ns, bdt)[1]
    return w, b


def check_forward(x, ns, w, b, eps=1e-5, what=""):
    dtype = x.dtype
    k = len(ns_tuple(ns))
    before = [None if a is None else a.copy() for a in (x, w, b)]
    y, mean, rstd = cynorm.layer_norm(x, ns, w, b, eps)
    for a, a0 in zip((x, w, b), before):
        if a is not None:
            np.testing.assert_array_equal(bits(a), bits(a0))
    y_ref, m_ref, r_ref = ref.layer_norm(x, ns, w, b, eps)
    sshape = x.shape[:x.ndim - k] + (1,) * k
    assert y.shape == x.shape and y.dtype == dtype, what
    assert mean.shape == sshape and rstd.shape == sshape, (what, mean.shape, sshape)
    assert mean.dtype == stat_dtype(dtype) and rstd.dtype == stat_dtype(dtype), what
    sd = stat_dtype(dtype)
    assert_close(mean, m_ref, sd, scale=np.abs(m_ref) + 1 / r_ref, rtol=stat_rtol(dtype),
                 what=f"mean {what}")
    assert_close(rstd, r_ref, sd, rtol=stat_rtol(dtype), what=f"rstd {what}")
    assert_close(y, y_ref, dtype, scale=ln_y_scale(x, k, m_ref, r_ref, w, b), what=f"y {what}")
    return y, mean, rstd


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,ns", CASES, ids=CASE_IDS)
def test_forward_matches_reference(shape, ns, dtype, rng):
    for ki, kind in enumerate(KINDS):
        for wdt, bdt in some(variants(dtype), shape, ki):
            x = make_x(rng, shape, dtype, kind, scale=2.0, offset=0.5)
            w, b = make_params(rng, ns_tuple(ns), wdt, bdt)
            check_forward(x, ns, w, b, what=f"{kind} w={wdt} b={bdt}")


def check_backward(dy, x, ns, mean, rstd, w, b, what=""):
    dtype = x.dtype
    k = len(ns_tuple(ns))
    inputs = [a for a in (dy, x, mean, rstd, w, b) if a is not None]
    before = [a.copy() for a in inputs]
    gx, gw, gb = cynorm.layer_norm_backward(dy, x, ns, mean, rstd, w, b)
    for a, a0 in zip(inputs, before):
        np.testing.assert_array_equal(bits(a), bits(a0))
    # the twin gets the same saved statistics the kernel gets
    gx_ref, gw_ref, gb_ref = ref.layer_norm_backward(dy, x, ns, mean, rstd, w)
    nsh = ns_tuple(ns)
    assert gx.shape == x.shape and gx.dtype == dtype, what
    assert gw.shape == nsh and gb.shape == nsh, what
    assert gw.dtype == (dtype if w is None else w.dtype), what
    assert gb.dtype == (dtype if b is None else b.dtype), what
    assert_close(gx, gx_ref, dtype, scale=ln_gx_scale(dy, x, k, mean, rstd, w), what=f"grad_x {what}")
    rows, d = ln_rows(x, k), ln_rows(dy, k)
    M = rows.shape[0]
    xhat = (rows - f64(mean).reshape(M, 1)) * f64(rstd).reshape(M, 1)
    gw_scale = np.sum(np.abs(d * xhat), axis=0).reshape(nsh)
    gb_scale = np.sum(np.abs(d), axis=0).reshape(nsh)
    assert_close(gw, gw_ref, gw.dtype, scale=gw_scale, rtol=2 * RTOL[gw.dtype], what=f"grad_weight {what}")
    assert_close(gb, gb_ref, gb.dtype, scale=gb_scale, rtol=2 * RTOL[gb.dtype], what=f"grad_bias {what}")
    return gx, gw, gb


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,ns", CASES, ids=CASE_IDS)
def test_backward_matches_reference(shape, ns, dtype, rng):
    for ki, kind in enumerate(KINDS):
        for wdt, bdt in some(variants(dtype), shape, ki):
            x = make_x(rng, shape, dtype, kind, scale=2.0, offset=0.5)
            dy = make_x(rng, shape, dtype, kind)
            w, b = make_params(rng, ns_tuple(ns), wdt, bdt)
            _, mean, rstd = cynorm.layer_norm(x, ns, w, b)
            check_backward(dy, x, ns, mean, rstd, w, b, what=f"{kind} w={wdt} b={bdt}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_output_mask(dtype, rng):
    shape, ns = (6, 4, 9), (4, 9)
    x = make_x(rng, shape, dtype)
    dy = make_x(rng, shape, dtype)
    w, b = make_affine(rng, ns, param_dtypes(dtype)[-1])
    _, mean, rstd = cynorm.layer_norm(x, ns, w, b)
    full = cynorm.layer_norm_backward(dy, x, ns, mean, rstd, w, b)
    for mask in itertools.product((True, False), repeat=3):
        got = cynorm.layer_norm_backward(dy, x, ns, mean, rstd, w, b, output_mask=mask)
        assert len(got) == 3
        for on, g, f in zip(mask, got, full):
            if on:
                np.testing.assert_array_equal(bits(g), bits(f))
            else:
                assert g is None
    # grad_weight / grad_bias are computed without weight / bias too
    gx, gw, gb = cynorm.layer_norm_backward(dy, x, ns, mean, rstd, None, None, output_mask=[True, True, True])
    assert gw.shape == ns and gw.dtype == dtype and gb.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_out_argument(dtype, rng):
    shape, ns = (12, 5, 33), (5, 33)
    x = make_x(rng, shape, dtype)
    w, b = make_affine(rng, ns, dtype)
    y0, m0, r0 = cynorm.layer_norm(x, ns, w, b)
    sd = stat_dtype(dtype)
    outs = (np.empty(shape, dtype), np.empty((12, 1, 1), sd), np.empty((12, 1, 1), sd))
    got = cynorm.layer_norm(x, ns, w, b, out=outs)
    for g, o, want in zip(got, outs, (y0, m0, r0)):
        assert g is o
        np.testing.assert_array_equal(bits(g), bits(want))
    for keep in itertools.product((True, False), repeat=3):
        outs = tuple(np.full(s, 7, d) if k else None
                     for k, s, d in zip(keep, (shape, (12, 1, 1), (12, 1, 1)), (dtype, sd, sd)))
        got = cynorm.layer_norm(x, ns, w, b, out=outs)
        for g, o, want in zip(got, outs, (y0, m0, r0)):
            if o is not None:
                assert g is o
            np.testing.assert_array_equal(bits(g), bits(want))
    # an F-ordered input into a C output (and into no output) agree
    xf = np.asfortranarray(x)
    yc = np.empty(shape, dtype)
    y1, _, _ = cynorm.layer_norm(xf, ns, w, b, out=(yc, None, None))
    y2, _, _ = cynorm.layer_norm(xf, ns, w, b)
    assert y1 is yc
    np.testing.assert_array_equal(bits(y1), bits(y2))
    # an F-ordered y output (as weight norm and batch norm take one), from
    # either order of x, and in place over an F-ordered x
    for xin in (x, xf):
        yf = np.full(shape, 7, dtype, order="F")
        got = cynorm.layer_norm(xin, ns, w, b, out=(yf, None, None))
        assert got[0] is yf and not yf.flags.c_contiguous
        for g, want in zip(got, (y0, m0, r0)):
            np.testing.assert_array_equal(bits(g), bits(want))
    xf2 = xf.copy(order="F")
    assert cynorm.layer_norm(xf2, ns, w, b, out=(xf2, None, None))[0] is xf2
    np.testing.assert_array_equal(bits(xf2), bits(y0))
    with pytest.raises(ValueError, match=r"out\[0\] \(y\) must be C-contiguous or F-contiguous"):
        cynorm.layer_norm(x, ns, w, b, out=(np.empty(shape + (2,), dtype)[..., 0], None, None))


def test_int_and_tuple_normalized_shape_agree(rng):
    x = rng.standard_normal((5, 6))
    a = cynorm.layer_norm(x, 6)
    b = cynorm.layer_norm(x, (6,))
    c = cynorm.layer_norm(x, [6])
    for u, v, t in zip(a, b, c):
        np.testing.assert_array_equal(u, v)
        np.testing.assert_array_equal(u, t)


def test_default_eps_and_custom_eps(rng):
    x = rng.standard_normal((4, 8)) * 1e-3
    for eps in (1e-5, 0.0, 1e-2):
        y, mean, rstd = cynorm.layer_norm(x, 8, eps=eps)
        _, _, r_ref = ref.layer_norm(x, 8, eps=eps)
        assert_close(rstd, r_ref, F64, rtol=1e-12)
    y, mean, rstd = cynorm.layer_norm(x, 8)
    assert_close(rstd, ref.layer_norm(x, 8, eps=1e-5)[2], F64, rtol=1e-12)


def test_constant_rows(rng):
    """var = 0: rstd = 1/sqrt(eps), y = b (no NaN)."""
    x = np.full((3, 10), 2.5, np.float32)
    w, b = make_affine(rng, (10,), F32)
    y, mean, rstd = cynorm.layer_norm(x, 10, w, b)
    np.testing.assert_allclose(mean, 2.5)
    np.testing.assert_allclose(rstd, 1 / np.sqrt(np.float32(1e-5)), rtol=1e-6)
    assert_close(y, np.broadcast_to(b, (3, 10)), F32, scale=2.5 * rstd * np.abs(w) + np.abs(b))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_zero_sizes(dtype):
    sd = stat_dtype(dtype)
    # no rows
    x = np.zeros((0, 5), dtype)
    y, mean, rstd = cynorm.layer_norm(x, 5)
    assert y.shape == (0, 5) and mean.shape == (0, 1) and rstd.shape == (0, 1) and mean.dtype == sd
    gx, gw, gb = cynorm.layer_norm_backward(x, x, 5, mean, rstd)
    assert gx.shape == (0, 5)
    np.testing.assert_array_equal(gw.astype(np.float64), np.zeros(5))
    np.testing.assert_array_equal(gb.astype(np.float64), np.zeros(5))
    x = np.zeros((0, 3, 4), dtype)
    y, mean, rstd = cynorm.layer_norm(x, (3, 4))
    assert y.shape == (0, 3, 4) and mean.shape == (0, 1, 1)
    # empty rows (N == 0): mean 0 and rstd NaN, as torch
    for shape, ns in [((3, 0), 0), ((2, 3, 0), (3, 0)), ((4, 0, 2), (0, 2))]:
        x = np.zeros(shape, dtype)
        y, mean, rstd = cynorm.layer_norm(x, ns)
        k = len(ns_tuple(ns))
        assert y.shape == shape and mean.shape == shape[:len(shape) - k] + (1,) * k
        assert mean.dtype == sd and rstd.dtype == sd
        np.testing.assert_array_equal(mean, np.zeros(mean.shape, sd))
        assert np.isnan(rstd).all()
        gx, gw, gb = cynorm.layer_norm_backward(x, x, ns, mean, rstd)
        assert gx.shape == shape and gw.shape == ns_tuple(ns) and gb.shape == ns_tuple(ns)


@pytest.mark.parametrize("shape,ns", [((3, 4, 5), (4, 5)), ((3, 4, 5), 5), ((2, 3, 2, 2), (3, 2, 2)), ((4, 6), 6)])
def test_backward_matches_central_differences(shape, ns, rng):
    nsh = ns_tuple(ns)
    x = rng.standard_normal(shape) * 1.5 + 0.3
    w, b = make_affine(rng, nsh, F64)
    R = rng.standard_normal(shape)          # L(x, w, b) = sum(R * y)

    def loss(xx, ww, bb):
        return float(np.sum(R * cynorm.layer_norm(xx, ns, ww, bb)[0]))

    def numeric(which):
        args = [x, w, b]
        base = args[which]
        num = np.zeros_like(base)
        h = 1e-6
        for idx in np.ndindex(base.shape):
            e = np.zeros_like(base)
            e[idx] = h
            plus = list(args)
            minus = list(args)
            plus[which] = base + e
            minus[which] = base - e
            num[idx] = (loss(*plus) - loss(*minus)) / (2 * h)
        return num

    _, mean, rstd = cynorm.layer_norm(x, ns, w, b)
    gx, gw, gb = cynorm.layer_norm_backward(R, x, ns, mean, rstd, w, b)
    np.testing.assert_allclose(gx, numeric(0), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gw, numeric(1), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gb, numeric(2), rtol=1e-6, atol=1e-8)
    # without weight: the same as weight = 1
    gx1, _, _ = cynorm.layer_norm_backward(R, x, ns, mean, rstd, None, None)
    gx2, _, _ = cynorm.layer_norm_backward(R, x, ns, mean, rstd, np.ones(nsh), None)
    np.testing.assert_allclose(gx1, gx2, rtol=1e-13, atol=1e-15)


def test_reference_backward_matches_central_differences(rng):
    """The twin itself, so that its chain rule is checked independently."""
    shape, ns = (3, 4, 5), (4, 5)
    x = rng.standard_normal(shape)
    w, b = make_affine(rng, ns, F64)
    R = rng.standard_normal(shape)
    y, mean, rstd = ref.layer_norm(x, ns, w, b)
    gx, gw, gb = ref.layer_norm_backward(R, x, ns, mean, rstd, w)
    h = 1e-6
    num = np.zeros_like(x)
    for idx in np.ndindex(shape):
        e = np.zeros_like(x)
        e[idx] = h
        num[idx] = (np.sum(R * ref.layer_norm(x + e, ns, w, b)[0])
                    - np.sum(R * ref.layer_norm(x - e, ns, w, b)[0])) / (2 * h)
    np.testing.assert_allclose(gx, num, rtol=1e-6, atol=1e-8)
    numw = np.zeros_like(w)
    for idx in np.ndindex(ns):
        e = np.zeros_like(w)
        e[idx] = h
        numw[idx] = (np.sum(R * ref.layer_norm(x, ns, w + e, b)[0])
                     - np.sum(R * ref.layer_norm(x, ns, w - e, b)[0])) / (2 * h)
    np.testing.assert_allclose(gw, numw, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gb, np.sum(R, axis=0), rtol=1e-12)


@pytest.mark.parametrize("shape,ns", [((64, 4096), 4096), ((4, 100003), 100003), ((3000, 8), 8),
                                      ((16, 8, 64), (8, 64))])
def test_variance_is_stable_with_a_large_offset(shape, ns, rng):
    """float32 data 1e4 + N(0, 1): the variance implied by rstd within 1e-4
    of the float64 variance of the same float32 values."""
    x = (1e4 + rng.standard_normal(shape)).astype(np.float32)
    eps = 1e-5
    _, mean, rstd = cynorm.layer_norm(x, ns, eps=eps)
    _, m_ref, r_ref = ref.layer_norm(x, ns, eps=eps)
    var = 1.0 / rstd.astype(np.float64) ** 2 - eps
    var_ref = 1.0 / r_ref ** 2 - eps
    assert np.max(np.abs(var - var_ref) / var_ref) <= 1e-4
    assert np.max(np.abs(mean - m_ref)) <= 1e-6 * 1e4


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("shape,ns,row", [((16, 300), 300, 5), ((2, 200000), 200000, 0),
                                          ((2, 200000), 200000, 1), ((40, 3, 7), (3, 7), 39),
                                          ((5000, 7), 7, 2500)])
def test_nan_poisons_only_its_row(shape, ns, row, dtype, rng):
    k = len(ns_tuple(ns))
    x = make_x(rng, shape, dtype)
    dy = make_x(rng, shape, dtype)
    w, b = make_affine(rng, ns_tuple(ns), param_dtypes(dtype)[-1])
    xn = x.copy()
    idx = np.unravel_index(row, shape[:len(shape) - k]) + tuple(s // 2 for s in shape[len(shape) - k:])
    xn[idx] = np.nan
    clean = cynorm.layer_norm(x, ns, w, b)
    dirty = cynorm.layer_norm(xn, ns, w, b)
    others = np.arange(int(np.prod(shape[:len(shape) - k]))) != row
    for c, d in zip(clean, dirty):
        c2, d2 = c.reshape(others.size, -1), d.reshape(others.size, -1)
        assert np.isnan(d2[row].astype(np.float32)).all()
        np.testing.assert_array_equal(bits(d2[others]), bits(c2[others]))
    gc = cynorm.layer_norm_backward(dy, x, ns, clean[1], clean[2], w, b)
    gd = cynorm.layer_norm_backward(dy, xn, ns, dirty[1], dirty[2], w, b)
    c2, d2 = gc[0].reshape(others.size, -1), gd[0].reshape(others.size, -1)
    assert np.isnan(d2[row].astype(np.float32)).all()
    np.testing.assert_array_equal(bits(d2[others]), bits(c2[others]))
    np.testing.assert_array_equal(bits(gd[2]), bits(gc[2]))      # grad_bias ignores x


DET_CASES = [((8, 1024), 1024, "C"), ((2, 200000), 200000, "C"), ((5000, 7), 7, "C"),
             ((3, 4, 5), (4, 5), "F"), ((64, 3, 300), (3, 300), "strided"), ((1, 100003), 100003, "C"),
             ((300, 3), 3, "F")]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,ns,kind", DET_CASES, ids=[f"{s}-{n}-{k}" for s, n, k in DET_CASES])
def test_bitwise_identical_for_any_thread_count(shape, ns, kind, dtype, rng, restore_threads):
    x = make_x(rng, shape, dtype, kind)
    dy = make_x(rng, shape, dtype, kind)
    w, b = make_affine(rng, ns_tuple(ns), param_dtypes(dtype)[-1])
    results = []
    for t in (1, 2, 3):
        cynorm.set_num_threads(t)
        y, mean, rstd = cynorm.layer_norm(x, ns, w, b)
        gx, gw, gb = cynorm.layer_norm_backward(dy, x, ns, mean, rstd, w, b)
        _, gw0, gb0 = cynorm.layer_norm_backward(dy, x, ns, mean, rstd, None, None)
        results.append([bits(a).copy() for a in (y, mean, rstd, gx, gw, gb, gw0, gb0)])
    for other in results[1:]:
        for a, b_ in zip(results[0], other):
            np.testing.assert_array_equal(a, b_)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_many_row_lengths(dtype, rng):
    """Every row length 1..130 and a few around powers of two and SIMD widths."""
    lengths = list(range(1, 131)) + [255, 256, 257, 511, 512, 513, 1025, 4095, 4097, 65537]
    for n in lengths:
        for m in (1, 3, 37):
            x = make_x(rng, (m, n), dtype, offset=1.0)
            w, b = make_affine(rng, (n,), param_dtypes(dtype)[-1])
            check_forward(x, n, w, b, what=f"({m}, {n})")
            dy = make_x(rng, (m, n), dtype)
            _, mean, rstd = cynorm.layer_norm(x, n, w, b)
            check_backward(dy, x, n, mean, rstd, w, b, what=f"({m}, {n})")


def test_float16_and_bfloat16_params_match_their_float32_casts(rng):
    """A 16-bit weight/bias holds the same values as its float32 cast."""
    for dtype in (BF16, F16):
        x = make_x(rng, (9, 40), dtype)
        dy = make_x(rng, (9, 40), dtype)
        w, b = make_affine(rng, (40,), dtype)
        a = cynorm.layer_norm(x, 40, w, b)
        c = cynorm.layer_norm(x, 40, w.astype(F32), b.astype(F32))
        for u, v in zip(a, c):
            np.testing.assert_array_equal(bits(u), bits(v))
        ga = cynorm.layer_norm_backward(dy, x, 40, a[1], a[2], w, b)
        gc = cynorm.layer_norm_backward(dy, x, 40, a[1], a[2], w.astype(F32), b.astype(F32))
        np.testing.assert_array_equal(bits(ga[0]), bits(gc[0]))
        assert ga[1].dtype == dtype and gc[1].dtype == F32
        np.testing.assert_array_equal(bits(ga[1]), bits(gc[1].astype(dtype)))
        np.testing.assert_array_equal(bits(ga[2]), bits(gc[2].astype(dtype)))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape, ns, perm", [
    ((4, 7, 40), (40,), (1, 0, 2)),             # batch_first attention's transpose
    ((3, 4, 5, 24), (24,), (2, 0, 1, 3)),
    ((3, 4, 5, 24), (5, 24), (1, 0, 2, 3)),
    ((6, 130, 33), (33,), (1, 0, 2)),           # odd rows, more than one row block
], ids=["3d", "4d", "4d-ns2", "blocks"])
def test_grad_out_rows_in_another_order_read_in_place(shape, ns, perm, dtype, rng):
    # each row contiguous, the rows in another order than x's: read where
    # they lie (the plain entry's row offsets), the bits of the C-contiguous
    # copy
    from cynorm import layernorm
    x = make_x(rng, shape, dtype)
    stored = make_x(rng, tuple(shape[i] for i in perm), dtype)
    dy = stored.transpose(np.argsort(perm))
    assert dy.shape == x.shape and not dy.flags.c_contiguous
    w, b = make_affine(rng, ns, param_dtypes(dtype)[-1])
    _, mean, rstd = cynorm.layer_norm(x, ns, w, b)
    assert layernorm._k.backward_plain(dy, x, ns, mean, rstd, w, b, (True,) * 3) is not None
    got = check_backward(dy, x, ns, mean, rstd, w, b, what=f"perm {perm}")
    want = cynorm.layer_norm_backward(np.ascontiguousarray(dy), x, ns, mean, rstd, w, b)
    for g, h in zip(got, want):
        np.testing.assert_array_equal(bits(g), bits(h))
    _, r = cynorm.rms_norm(x, ns, w)
    for g, h in zip(cynorm.rms_norm_backward(dy, x, ns, r, w),
                    cynorm.rms_norm_backward(np.ascontiguousarray(dy), x, ns, r, w)):
        np.testing.assert_array_equal(bits(g), bits(h))


@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=str)
def test_grad_out_and_x_in_different_layouts(dtype, rng):
    shape, ns = (6, 5, 40), (5, 40)
    x = make_x(rng, shape, dtype)
    dy = make_x(rng, shape, dtype)
    w, b = make_affine(rng, ns, param_dtypes(dtype)[-1])
    _, mean, rstd = cynorm.layer_norm(x, ns, w, b)
    for kx, kdy in (("C", "F"), ("F", "C"), ("F", "strided"), ("strided", "C")):
        check_backward(layout(dy, kdy), layout(x, kx), ns, mean, rstd, w, b, what=f"x {kx} dy {kdy}")
