"""RMS norm against the float64 reference (cynorm.reference.rms_norm): row
lengths from 1 to 200000, 1..3 normalized axes, every dtype and memory
layout, weight None or given (float32 for 16-bit inputs too), eps None or
given, out=, output_mask, zero sizes, finite differences, extreme
magnitudes, NaN rows and thread-count determinism; PyTorch parity where it
is installed."""
import itertools
import warnings

import numpy as np
import pytest

import cynorm
from cynorm import reference as ref
from conftest import DTYPES, DTYPE_IDS, requires_torch
from helpers import BF16, F16, F32, F64, RTOL, assert_close, bits, layout, stat_dtype
from norm_helpers import f64, ln_rows, make_x, param_dtypes, some, stat_rtol

CASES = [
    ((7,), 7), ((1, 1), 1), ((64, 1), 1), ((3, 7), 7), ((17, 5), (5,)), ((5000, 7), 7),
    ((8, 1024), 1024), ((4, 1023), (1023,)), ((40, 3000), 3000), ((2, 4096), 4096),
    ((1, 100003), 100003), ((2, 200000), 200000),
    ((3, 4, 5), (4, 5)), ((2, 3, 4, 5), (3, 4, 5)), ((2, 3, 4, 5), 5), ((6, 50, 3), (50, 3)),
]
CASE_IDS = [f"{s}-ns{n}" for s, n in CASES]
KINDS = ("C", "F", "strided")


def ns_tuple(ns):
    return (ns,) if isinstance(ns, int) else tuple(ns)


def make_weight(rng, ns, dtype):
    return None if dtype is None else (rng.standard_normal(ns) + 0.5).astype(dtype)


def default_eps(dtype):
    return float(np.finfo(F64 if np.dtype(dtype) == F64 else F32).eps)


def y_scale(x, k, rstd, w):
    """Per-row max of |xhat * w|: y's rounding is relative to the row's size."""
    rows = ln_rows(x, k)
    M, N = rows.shape
    a = np.abs(rows * f64(rstd).reshape(M, 1) * (1.0 if w is None else f64(w).reshape(N)))
    return np.broadcast_to(np.max(a, axis=1, keepdims=True, initial=0.0),
                           rows.shape).reshape(np.shape(x))


def gx_scale(dy, x, k, rstd, w):
    """Per-row size of the terms of grad_x = rstd (g - xhat mean(g xhat))."""
    rows = ln_rows(x, k)
    M, N = rows.shape
    g = ln_rows(dy, k) * (1.0 if w is None else f64(w).reshape(N))
    rs = f64(rstd).reshape(M, 1)
    xhat = rows * rs
    terms = (np.max(np.abs(g), axis=1, keepdims=True, initial=0.0)
             + np.max(np.abs(xhat), axis=1, keepdims=True, initial=0.0)
             * np.abs(np.sum(g * xhat, axis=1, keepdims=True)) / max(N, 1))
    return np.broadcast_to(rs * terms, rows.shape).reshape(np.shape(x))


def check_forward(x, ns, w, eps=None, what=""):
    k = len(ns_tuple(ns))
    before = [None if a is None else a.copy() for a in (x, w)]
    y, rstd = cynorm.rms_norm(x, ns, w, eps)
    for a, a0 in zip((x, w), before):
        if a is not None:
            np.testing.assert_array_equal(bits(a), bits(a0))
    y_ref, r_ref = ref.rms_norm(x, ns, w, eps)
    sshape = x.shape[:x.ndim - k] + (1,) * k
    assert y.shape == x.shape and y.dtype == x.dtype, what
    assert rstd.shape == sshape and rstd.dtype == stat_dtype(x.dtype), what
    assert_close(rstd, r_ref, stat_dtype(x.dtype), rtol=stat_rtol(x.dtype), what=f"rstd {what}")
    assert_close(y, y_ref, x.dtype, scale=y_scale(x, k, r_ref, w), what=f"y {what}")
    return y, rstd


def check_backward(dy, x, ns, rstd, w, what=""):
    k = len(ns_tuple(ns))
    inputs = [a for a in (dy, x, rstd, w) if a is not None]
    before = [a.copy() for a in inputs]
    gx, gw = cynorm.rms_norm_backward(dy, x, ns, rstd, w)
    for a, a0 in zip(inputs, before):
        np.testing.assert_array_equal(bits(a), bits(a0))
    gx_ref, gw_ref = ref.rms_norm_backward(dy, x, ns, rstd, w)
    nsh = ns_tuple(ns)
    assert gx.shape == x.shape and gx.dtype == x.dtype, what
    assert gw.shape == nsh and gw.dtype == (x.dtype if w is None else w.dtype), what
    assert_close(gx, gx_ref, x.dtype, scale=gx_scale(dy, x, k, rstd, w), what=f"grad_x {what}")
    rows, d = ln_rows(x, k), ln_rows(dy, k)
    xhat = rows * f64(rstd).reshape(rows.shape[0], 1)
    gw_scale = np.sum(np.abs(d * xhat), axis=0).reshape(nsh)
    assert_close(gw, gw_ref, gw.dtype, scale=gw_scale, rtol=2 * RTOL[gw.dtype],
                 what=f"grad_weight {what}")
    return gx, gw


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,ns", CASES, ids=CASE_IDS)
def test_forward_and_backward_match_reference(shape, ns, dtype, rng):
    for ki, kind in enumerate(KINDS):
        for wdt in some([None] + param_dtypes(dtype), shape, ki):
            x = make_x(rng, shape, dtype, kind, scale=2.0, offset=0.5)
            dy = make_x(rng, shape, dtype, kind)
            w = make_weight(rng, ns_tuple(ns), wdt)
            _, rstd = check_forward(x, ns, w, what=f"{kind} w={wdt}")
            check_backward(dy, x, ns, rstd, w, what=f"{kind} w={wdt}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_default_eps_is_the_math_types_epsilon(dtype):
    # a constant row c gives y = c / sqrt(c^2 + eps): tiny c shows which eps
    x = np.full((2, 4), 3e-4, dtype)
    eps = default_eps(dtype)
    y, rstd = cynorm.rms_norm(x, 4)
    c = float(np.asarray(x, np.float64)[0, 0])
    want = 1.0 / np.sqrt(c * c + eps)
    assert_close(rstd, np.full((2, 1), want), stat_dtype(dtype), rtol=stat_rtol(dtype))
    for e in (0.0, 1e-6, 1e-2):
        np.testing.assert_array_equal(bits(cynorm.rms_norm(x, 4, eps=e)[1]),
                                      bits(cynorm.rms_norm(x, 4, None, e)[1]))
        assert_close(cynorm.rms_norm(x, 4, eps=e)[1], np.full((2, 1), 1 / np.sqrt(c * c + e)),
                     stat_dtype(dtype), rtol=stat_rtol(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_output_mask(dtype, rng):
    shape, ns = (6, 4, 9), (4, 9)
    x, dy = make_x(rng, shape, dtype), make_x(rng, shape, dtype)
    w = make_weight(rng, ns, param_dtypes(dtype)[-1])
    rstd = cynorm.rms_norm(x, ns, w)[1]
    full = cynorm.rms_norm_backward(dy, x, ns, rstd, w)
    for mask in itertools.product((True, False), repeat=2):
        got = cynorm.rms_norm_backward(dy, x, ns, rstd, w, output_mask=mask)
        assert len(got) == 2
        for on, g, f in zip(mask, got, full):
            if on:
                np.testing.assert_array_equal(bits(g), bits(f))
            else:
                assert g is None
    # 1-D rstd is taken too
    got = cynorm.rms_norm_backward(dy, x, ns, rstd.reshape(-1), w)
    for g, f in zip(got, full):
        np.testing.assert_array_equal(bits(g), bits(f))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_out_argument(dtype, rng):
    shape, ns = (12, 5, 33), (5, 33)
    x = make_x(rng, shape, dtype)
    w = make_weight(rng, ns, dtype)
    y0, r0 = cynorm.rms_norm(x, ns, w)
    sd = stat_dtype(dtype)
    for keep in itertools.product((True, False), repeat=2):
        outs = tuple(np.full(s, 7, d) if k else None
                     for k, s, d in zip(keep, (shape, (12, 1, 1)), (dtype, sd)))
        got = cynorm.rms_norm(x, ns, w, out=outs)
        for g, o, want in zip(got, outs, (y0, r0)):
            if o is not None:
                assert g is o
            np.testing.assert_array_equal(bits(g), bits(want))
    yf = np.full(shape, 7, dtype, order="F")
    assert cynorm.rms_norm(x, ns, w, out=(yf, None))[0] is yf
    np.testing.assert_array_equal(bits(yf), bits(y0))
    # in place over x
    xc = x.copy()
    assert cynorm.rms_norm(xc, ns, w, out=(xc, None))[0] is xc
    np.testing.assert_array_equal(bits(xc), bits(y0))
    with pytest.raises(TypeError, match=r"out must be None or a tuple of 2"):
        cynorm.rms_norm(x, ns, w, out=(yf,))
    with pytest.raises(ValueError, match=r"out\[1\] \(rstd\)"):
        cynorm.rms_norm(x, ns, w, out=(None, np.empty((12,), sd)))


def test_bad_arguments_name_the_argument(rng):
    x = rng.standard_normal((3, 4))
    with pytest.raises(ValueError, match="normalized_shape"):
        cynorm.rms_norm(x, 5)
    with pytest.raises(ValueError, match="weight must have shape"):
        cynorm.rms_norm(x, 4, np.ones(3))
    with pytest.raises(TypeError, match="weight"):
        cynorm.rms_norm(x, 4, np.ones(4, np.float32))
    with pytest.raises(ValueError, match="eps must be >= 0"):
        cynorm.rms_norm(x, 4, eps=-1.0)
    with pytest.raises(TypeError, match="eps"):
        cynorm.rms_norm(x, 4, eps="1e-5")
    with pytest.raises(TypeError, match="x"):
        cynorm.rms_norm(x.astype(np.int32), 4)
    rstd = cynorm.rms_norm(x, 4)[1]
    with pytest.raises(ValueError, match=r"rstd must have shape \(3, 1\) \(as rms_norm returns it\)"):
        cynorm.rms_norm_backward(x, x, 4, rstd[:2])
    with pytest.raises(ValueError, match="output_mask must have 2 entries"):
        cynorm.rms_norm_backward(x, x, 4, rstd, output_mask=(True, True, True))
    with pytest.raises(TypeError, match="grad_out"):
        cynorm.rms_norm_backward(x.astype(np.float32), x, 4, rstd)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_zero_sizes(dtype):
    sd = stat_dtype(dtype)
    x = np.zeros((0, 5), dtype)
    y, rstd = cynorm.rms_norm(x, 5)
    assert y.shape == (0, 5) and rstd.shape == (0, 1) and rstd.dtype == sd
    gx, gw = cynorm.rms_norm_backward(x, x, 5, rstd)
    assert gx.shape == (0, 5)
    np.testing.assert_array_equal(gw.astype(np.float64), np.zeros(5))
    for shape, ns in [((3, 0), 0), ((2, 3, 0), (3, 0))]:       # empty rows: rstd NaN, as torch
        x = np.zeros(shape, dtype)
        y, rstd = cynorm.rms_norm(x, ns)
        assert y.shape == shape and rstd.dtype == sd and np.isnan(rstd).all()
        gx, gw = cynorm.rms_norm_backward(x, x, ns, rstd)
        assert gx.shape == shape and gw.shape == ns_tuple(ns)


def test_zero_rows_give_zero_y_and_a_finite_gradient():
    x = np.zeros((2, 6), np.float32)
    y, rstd = cynorm.rms_norm(x, 6)
    np.testing.assert_array_equal(y, 0)
    np.testing.assert_allclose(rstd, 1 / np.sqrt(np.finfo(np.float32).eps), rtol=1e-6)
    gx, gw = cynorm.rms_norm_backward(np.ones_like(x), x, 6, rstd)
    np.testing.assert_allclose(gx, rstd * np.ones_like(x), rtol=1e-6)
    np.testing.assert_array_equal(gw, 0)


@pytest.mark.parametrize("shape,ns", [((3, 4, 5), (4, 5)), ((3, 4, 5), 5), ((4, 6), 6)])
def test_backward_matches_central_differences(shape, ns, rng):
    nsh = ns_tuple(ns)
    x = rng.standard_normal(shape) * 1.5 + 0.3
    w = make_weight(rng, nsh, F64)
    R = rng.standard_normal(shape)
    h = 1e-6

    def numeric(f, base):
        num = np.zeros_like(base)
        for idx in np.ndindex(base.shape):
            e = np.zeros_like(base)
            e[idx] = h
            num[idx] = (f(base + e) - f(base - e)) / (2 * h)
        return num

    rstd = cynorm.rms_norm(x, ns, w, 1e-5)[1]
    gx, gw = cynorm.rms_norm_backward(R, x, ns, rstd, w)
    np.testing.assert_allclose(
        gx, numeric(lambda xx: np.sum(R * cynorm.rms_norm(xx, ns, w, 1e-5)[0]), x),
        rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(
        gw, numeric(lambda ww: np.sum(R * cynorm.rms_norm(x, ns, ww, 1e-5)[0]), w),
        rtol=1e-6, atol=1e-8)
    # the twin's chain rule, checked on its own
    rgx, rgw = ref.rms_norm_backward(R, x, ns, ref.rms_norm(x, ns, w, 1e-5)[1], w)
    np.testing.assert_allclose(
        rgx, numeric(lambda xx: np.sum(R * ref.rms_norm(xx, ns, w, 1e-5)[0]), x),
        rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(rgw, gw, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("scale", [1e-30, 1e-20, 1e20, 1e30])
def test_extreme_magnitudes_keep_float64_accuracy(dtype, scale, rng):
    # squares of such data leave float32's range: the row's mean square is
    # recomputed from float64 squares (eps 0, so that it does not hide them)
    x = (rng.standard_normal((5, 300)) * scale).astype(dtype)
    dy = rng.standard_normal((5, 300)).astype(dtype)
    w = make_weight(rng, (300,), F32)
    y, rstd = check_forward(x, 300, w, eps=0.0, what=f"scale {scale}")
    assert np.isfinite(y.astype(np.float32)).all()
    check_backward(dy, x, 300, rstd, w, what=f"scale {scale}")


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=str)
def test_zero_constant_and_tiny_gradient_rows(dtype, rng):
    # rows whose sum of g * x comes out 0: exactly (zeros, zero gradients) or
    # because every product of a tiny gradient with x rounded to 0 (those
    # take the float64 pass)
    x = make_x(rng, (6, 40), dtype)
    x[0] = 0
    x[1] = 2.0
    dy = make_x(rng, (6, 40), dtype)
    dy[2] = 0
    dy[3] = np.float32(1e-44).astype(dtype) if dtype != F16 else np.float16(6e-8)
    dy[3, ::2] *= -1
    w = make_weight(rng, (40,), F32)
    _, rstd = cynorm.rms_norm(x, 40, w)
    check_backward(dy, x, 40, rstd, w)
    _, mean, rstd_ln = cynorm.layer_norm(x, 40, w, w)
    gx, gw, gb = cynorm.layer_norm_backward(dy, x, 40, mean, rstd_ln, w, w)
    gx_ref = ref.layer_norm_backward(dy, x, 40, mean, rstd_ln, w)[0]
    assert np.isfinite(gx.astype(np.float32)).all()
    from norm_helpers import ln_gx_scale
    assert_close(gx, gx_ref, dtype, scale=ln_gx_scale(dy, x, 1, mean, rstd_ln, w))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_constant_gradient_rows(dtype, rng):
    # y.sum()'s gradient (a constant along each row) with weight 1: each
    # row's sum of g * (x - m) is the rounding of sum(x - m), often exactly
    # 0 though no product lost bits; such rows keep the float32 pass, and its
    # accuracy, in RMS norm and layer norm alike
    x = make_x(rng, (64, 384), dtype)
    dy = np.ones_like(x)
    dy[10:20] = 0.5
    dy[20:30] = 0
    dy[30:40] = -3.0
    w = np.ones(384, F64 if dtype == F64 else F32)
    _, rstd = cynorm.rms_norm(x, 384, w)
    check_backward(dy, x, 384, rstd, w)
    _, mean, rstd_ln = cynorm.layer_norm(x, 384, w, w)
    gx, _, _ = cynorm.layer_norm_backward(dy, x, 384, mean, rstd_ln, w, w)
    gx_ref = ref.layer_norm_backward(dy, x, 384, mean, rstd_ln, w)[0]
    from norm_helpers import ln_gx_scale
    assert_close(gx, gx_ref, dtype, scale=ln_gx_scale(dy, x, 1, mean, rstd_ln, w))


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_nan_poisons_only_its_row(dtype, rng):
    x, dy = make_x(rng, (16, 300), dtype), make_x(rng, (16, 300), dtype)
    w = make_weight(rng, (300,), F32)
    xn = x.copy()
    xn[5, 150] = np.nan
    clean, dirty = cynorm.rms_norm(x, 300, w), cynorm.rms_norm(xn, 300, w)
    others = np.arange(16) != 5
    for c, d in zip(clean, dirty):
        assert np.isnan(d[5].astype(np.float32)).all()
        np.testing.assert_array_equal(bits(d[others]), bits(c[others]))
    gc = cynorm.rms_norm_backward(dy, x, 300, clean[1], w)
    gd = cynorm.rms_norm_backward(dy, xn, 300, dirty[1], w)
    assert np.isnan(gd[0][5].astype(np.float32)).all()
    np.testing.assert_array_equal(bits(gd[0][others]), bits(gc[0][others]))


@pytest.mark.parametrize("dtype", [F64, F32, BF16, F16], ids=str)
def test_rows_holding_inf_as_the_reference(dtype):
    # mean(x^2) is inf: rstd = 0, y = x * 0 (NaN where x is inf, 0 elsewhere),
    # as the float64 reference and torch.  A float32 sum of squares that
    # overflows takes the row's float64 path, which must keep this too
    x = np.array([[np.inf, 1, 2, -3], [-np.inf, 1, 2, 0], [np.inf, np.inf, 1, -1],
                  [1, 2, 3, 4]], dtype)
    w = np.array([0.5, 1, 2, 3], F64 if dtype == F64 else F32)

    class Sub(np.ndarray):
        pass
    for wt in [None, w]:
        with np.errstate(invalid="ignore"):
            want_y, want_rstd = ref.rms_norm(x, 4, wt)
        got = [cynorm.rms_norm(x, 4, wt), cynorm.rms_norm(x.view(Sub), 4, wt),
               cynorm.add_rms_norm(x, np.zeros_like(x), 4, wt)[::2]]
        for y, rstd in got:
            np.testing.assert_array_equal(f64(rstd)[:3], want_rstd[:3])
            np.testing.assert_array_equal(f64(y)[:3], want_y[:3])      # NaN where x is inf
            assert_close(y[3:], want_y[3:], dtype, what="the ordinary row")
    try:
        import torch
    except ImportError:
        return
    torch_y = torch.nn.functional.rms_norm(torch.from_numpy(x.astype(F64)), (4,)).numpy()
    np.testing.assert_array_equal(f64(cynorm.rms_norm(x, 4)[0])[:3], torch_y[:3])


DET_CASES = [((8, 1024), 1024, "C"), ((2, 200000), 200000, "C"), ((5000, 7), 7, "C"),
             ((64, 3, 300), (3, 300), "strided"), ((300, 3), 3, "F"), ((512, 4096), 4096, "C")]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,ns,kind", DET_CASES, ids=[f"{s}-{n}-{k}" for s, n, k in DET_CASES])
def test_bitwise_identical_for_any_thread_count(shape, ns, kind, dtype, rng, restore_threads):
    x, dy = make_x(rng, shape, dtype, kind), make_x(rng, shape, dtype, kind)
    w = make_weight(rng, ns_tuple(ns), param_dtypes(dtype)[-1])
    results = []
    for t in (1, 2, 3):
        cynorm.set_num_threads(t)
        y, rstd = cynorm.rms_norm(x, ns, w)
        gx, gw = cynorm.rms_norm_backward(dy, x, ns, rstd, w)
        gx0, gw0 = cynorm.rms_norm_backward(dy, x, ns, rstd)
        results.append([bits(a).copy() for a in (y, rstd, gx, gw, gx0, gw0)])
    for other in results[1:]:
        for a, b_ in zip(results[0], other):
            np.testing.assert_array_equal(a, b_)


def test_16bit_weight_matches_its_float32_cast(rng):
    for dtype in (BF16, F16):
        x, dy = make_x(rng, (9, 40), dtype), make_x(rng, (9, 40), dtype)
        w = make_weight(rng, (40,), dtype)
        a, c = cynorm.rms_norm(x, 40, w), cynorm.rms_norm(x, 40, w.astype(F32))
        for u, v in zip(a, c):
            np.testing.assert_array_equal(bits(u), bits(v))
        ga = cynorm.rms_norm_backward(dy, x, 40, a[1], w)
        gc = cynorm.rms_norm_backward(dy, x, 40, a[1], w.astype(F32))
        np.testing.assert_array_equal(bits(ga[0]), bits(gc[0]))
        assert ga[1].dtype == dtype and gc[1].dtype == F32


@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=str)
def test_grad_out_and_x_in_different_layouts(dtype, rng):
    shape, ns = (6, 5, 40), (5, 40)
    x, dy = make_x(rng, shape, dtype), make_x(rng, shape, dtype)
    w = make_weight(rng, ns, param_dtypes(dtype)[-1])
    rstd = cynorm.rms_norm(x, ns, w)[1]
    for kx, kdy in (("C", "F"), ("F", "C"), ("F", "strided"), ("strided", "C")):
        check_backward(layout(dy, kdy), layout(x, kx), ns, rstd, w, what=f"x {kx} dy {kdy}")


# ---- PyTorch parity (F.rms_norm and its autograd gradients)

TORCH_TOL = {F64: 1e-11, F32: 1e-5, BF16: 1.6e-2, F16: 2e-3}


@pytest.mark.torch
@requires_torch
@pytest.mark.parametrize("dtype", [F64, F32, BF16, F16], ids=str)
@pytest.mark.parametrize("shape,ns", [((8, 1024), (1024,)), ((3, 4, 5), (4, 5)), ((64, 4096), (4096,)),
                                      ((5000, 7), (7,)), ((6, 1), (1,))])
def test_matches_torch(shape, ns, dtype, rng):
    import torch
    F = torch.nn.functional
    tdt = {F64: torch.float64, F32: torch.float32, BF16: torch.bfloat16, F16: torch.float16}[dtype]
    for wdt in [None] + param_dtypes(dtype):
        x, dy = make_x(rng, shape, dtype, offset=0.3), make_x(rng, shape, dtype)
        w = make_weight(rng, ns, wdt)

        def tt(a, grad=False):
            t = torch.from_numpy(np.ascontiguousarray(a.astype(F32) if a.dtype in (BF16, F16) else a))
            t = t.to(tdt if a.dtype in (BF16, F16) else t.dtype)
            return t.requires_grad_(grad)
        xt = tt(x, True)
        wt = None if w is None else tt(w, True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # torch warns once of a weight in another dtype
            yt = F.rms_norm(xt, list(ns), wt)
        yt.backward(tt(dy))
        y, rstd = cynorm.rms_norm(x, ns, w)
        gx, gw = cynorm.rms_norm_backward(dy, x, ns, rstd, w)
        k = len(ns)
        tol = TORCH_TOL[dtype]
        assert_close(y, yt.detach().double().numpy(), dtype, rtol=tol,
                     scale=y_scale(x, k, rstd, w), what=f"y w={wdt}")
        assert_close(gx, xt.grad.double().numpy(), dtype, rtol=tol,
                     scale=gx_scale(dy, x, k, rstd, w), what=f"grad_x w={wdt}")
        if w is not None:
            rows, d = ln_rows(x, k), ln_rows(dy, k)
            scale = np.sum(np.abs(d * rows * f64(rstd).reshape(-1, 1)), axis=0).reshape(ns)
            assert_close(gw, wt.grad.double().numpy(), gw.dtype, scale=scale,
                         rtol=TORCH_TOL[np.dtype(gw.dtype)], what=f"grad_weight w={wdt}")
