"""The kernels of softmax, log_softmax and their backward ops, trace,
log_sigmoid_forward and nll_loss_forward (cynorm/_kernels/softmax.pyx.tp,
pointwise.pyx.tp, nll_loss.pyx.tp): accuracy against float64 NumPy
references, the edge values, the same bits through the plain entry and
through the Python layer, and at any thread count."""
import math

import ml_dtypes
import numpy as np
import pytest

import cynorm as cn
from cynorm import nll_losses, pointwise, softmax_ops

EPS32 = np.finfo(np.float32).eps


class NotPlain(np.ndarray):
    """Same data, not an exact ndarray: the plain entries leave it to Python."""


def same_bits(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert type(g) is np.ndarray and g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.reshape(-1).view(np.uint8), w.reshape(-1).view(np.uint8))


def ref_softmax(x, d, log):
    x = x.astype(np.float64)
    s = x - x.max(axis=d, keepdims=True)
    lse = np.log(np.exp(s).sum(axis=d, keepdims=True))
    return s - lse if log else np.exp(s - lse)


# the last axis (row loops, tails of the 16 lanes), other axes (column blocks
# of 256, one block and a tail), a 1-D array and a long softmax axis
SHAPES_DIMS = [((3, 37), 1), ((2, 5, 16), -1), ((4, 300), 0), ((2, 70, 3), 1), ((2, 3, 600), 1),
               ((5000,), 0), ((1, 1), 0), ((7, 1), 1)]


@pytest.mark.parametrize("shape,d", SHAPES_DIMS)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_float32_softmax_is_within_a_few_ulps_of_float64(shape, d, log, threads):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 6).astype(np.float32)
    y = (cn.log_softmax if log else cn.softmax)(x, d)
    ref = ref_softmax(x, d, log)
    assert y.dtype == np.float32 and y.shape == x.shape
    # softmax: relative, plus the rounding of x - max in float32 (as torch's
    # kernel) that exp carries; log-softmax: one rounding of y plus the log-sum's
    spread = np.abs(x - x.max(axis=d, keepdims=True))
    bound = (4 * EPS32 * np.abs(ref) + 2 * EPS32 if log
             else (4 + spread) * EPS32 * np.abs(ref) + 1e-37)
    assert np.all(np.abs(y - ref) <= bound)
    y64 = (cn.log_softmax if log else cn.softmax)(x.astype(np.float64), d)
    np.testing.assert_allclose(y64, ref, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("shape,d", SHAPES_DIMS)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_backward_matches_the_float64_formula(shape, d, log, threads):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape) * 3
    g = rng.standard_normal(shape)
    y64 = ref_softmax(x, d, log)
    if log:
        want = g - np.exp(y64) * g.sum(axis=d, keepdims=True)
        op = cn.log_softmax_backward_data
    else:
        want = y64 * (g - (g * y64).sum(axis=d, keepdims=True))
        op = cn.softmax_backward_data
    np.testing.assert_allclose(op(g, y64, d, np.float64), want, rtol=1e-12, atol=1e-14)
    got = op(g.astype(np.float32), y64.astype(np.float32), d, np.float32)
    scale = np.abs(g).max() * (1 + (np.abs(np.exp(y64)).max() if log else 1))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=8 * EPS32 * scale)


@pytest.mark.parametrize("shape,d", SHAPES_DIMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_plain_entry_and_python_layer_give_the_same_bits(shape, d, dtype, threads):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)
    for log in (False, True):
        assert softmax_ops._k.softmax_plain(x, d, False, log) is not None
        fwd = cn.log_softmax if log else cn.softmax
        y = fwd(x, d)
        same_bits(y, fwd(x.view(NotPlain), d))
        same_bits(y, fwd(np.asfortranarray(x), d))          # another layout, same values
        bwd = cn.log_softmax_backward_data if log else cn.softmax_backward_data
        assert softmax_ops._k.softmax_backward_plain(g, y, d, dtype, log) is not None
        same_bits(bwd(g, y, d, dtype), bwd(g.view(NotPlain), y, d, np.dtype(dtype)))


@pytest.mark.parametrize("shape,d", [((64, 2048), 1), ((64, 2048), 0), ((8, 4096, 4), 1)])
def test_bits_do_not_depend_on_the_thread_count(shape, d):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    old = cn.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            cn.set_num_threads(n)
            y = cn.softmax(x, d)
            results.append((y, cn.log_softmax(x, d), cn.softmax_backward_data(x, y, d, np.float32),
                            cn.log_sigmoid_forward(x)))
    finally:
        cn.set_num_threads(old)
    for r in results[1:]:
        for a, b in zip(results[0], r):
            same_bits(a, b)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_16bit_rounds_the_float32_result_once(dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 50)).astype(dtype)
    for op in (cn.softmax, cn.log_softmax):
        y32 = op(x.astype(np.float32), 1)
        same_bits(op(x, 1), y32.astype(dtype))
        same_bits(op(x, 1, True), y32)                   # half_to_float: float32 out
    g = rng.standard_normal((6, 50)).astype(np.float32)
    y = cn.softmax(x, 1, True)
    same_bits(cn.softmax_backward_data(g, y, 1, dtype),
              cn.softmax_backward_data(g, y, 1, np.float32).astype(dtype))


def test_edge_values_follow_numpys_formula():
    inf, nan = np.inf, np.nan
    x = np.array([[-inf, -inf, -inf], [1.0, inf, 2.0], [1.0, nan, 2.0], [-inf, 0.0, 1.0],
                  [1e30, -1e30, 0.0], [3.0, 3.0, 3.0]])
    with np.errstate(invalid="ignore", over="ignore"):
        for dtype in (np.float32, np.float64):
            xs = x.astype(dtype)
            for d, xv in ((1, xs), (0, np.ascontiguousarray(xs.T))):
                for log in (False, True):
                    got = (cn.log_softmax if log else cn.softmax)(xv, d)
                    want = ref_softmax(xv, d, log).astype(dtype)
                    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
                    ok = ~np.isnan(want)
                    np.testing.assert_allclose(got[ok], want[ok], rtol=4e-7, atol=1e-30)


def test_log_softmax_backward_takes_outputs_beyond_exps_fast_range():
    # y is not a log-softmax output here (> 88): libm's exp takes over, no inf
    y = np.array([[88.71, 88.6, 1.0], [0.0, -1.0, -2.0]], np.float32)
    g = np.full_like(y, 1e-3)
    for d, yy, gg in ((1, y, g), (0, np.ascontiguousarray(y.T), g.T.copy())):
        got = cn.log_softmax_backward_data(gg, yy, d, np.float32)
        want = gg.astype(np.float64) - np.exp(yy.astype(np.float64)) * gg.sum(axis=d, keepdims=True)
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, rtol=2e-7)


# ---- trace ---------------------------------------------------------------------------

def test_trace_sums_in_float64_over_any_layout():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3000, 3000)).astype(np.float32) + np.float32(1000)
    exact = math.fsum(np.diagonal(x).astype(np.float64))
    t = cn.trace(x)
    assert t.dtype == np.float32 and t.shape == () and float(t) == np.float32(exact)
    assert pointwise._k.trace_plain(x.T) is not None             # strided: still the plain entry
    same_bits(cn.trace(x.T), t)
    same_bits(cn.trace(x[::2, 1::3]), np.float32(math.fsum(np.diagonal(x[::2, 1::3]).astype(float))))
    same_bits(cn.trace(x.view(NotPlain)), t)
    same_bits(cn.trace(x.astype(">f4")), t)                      # byte-swapped: converted
    buf = np.zeros(4 * 9 + 1, np.uint8)[1:].view(np.float32).reshape(3, 3)   # unaligned
    buf[...] = np.arange(9).reshape(3, 3)
    assert not buf.flags.aligned
    same_bits(cn.trace(buf), np.float32(12))
    same_bits(cn.trace(np.zeros((0, 4), np.float64)), np.float64(0))
    for dtype in (ml_dtypes.bfloat16, np.float16):
        xs = x[:50, :60].astype(dtype)
        s = math.fsum(np.diagonal(xs).astype(np.float64))
        same_bits(cn.trace(xs), np.asarray(np.float32(s)).astype(dtype))
    assert cn.trace(np.arange(9).reshape(3, 3)).dtype == np.int64


# ---- log_sigmoid_forward -------------------------------------------------------------------

def test_log_sigmoid_forward_against_float64():
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.standard_normal(5000) * 30, [0.0, -0.0, 88.0, -88.0, -100.0, -120.0]])
    for dtype, rtol in ((np.float32, 2 * EPS32), (np.float64, 4e-16)):
        xs = x.astype(dtype)
        out, buffer = cn.log_sigmoid_forward(xs)
        x64 = xs.astype(np.float64)
        z = np.exp(-np.abs(x64))
        tiny = np.finfo(dtype).smallest_subnormal
        np.testing.assert_allclose(buffer, z, rtol=rtol, atol=tiny)   # subnormals kept, not flushed
        assert buffer[-2] > 0
        np.testing.assert_allclose(out, np.minimum(x64, 0) - np.log1p(z), rtol=rtol, atol=tiny)
        same_bits((out, buffer), cn.log_sigmoid_forward(xs.view(NotPlain)))
    with np.errstate(invalid="ignore"):
        out, buffer = cn.log_sigmoid_forward(np.array([np.nan, np.inf, -np.inf], np.float32))
    assert np.isnan(out[0]) and np.isnan(buffer[0])
    assert out[1] == 0 and buffer[1] == 0
    assert out[2] == -np.inf and buffer[2] == 0


# ---- nll_loss_forward ----------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["none", "mean", "sum", 0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_forward_plain_and_python_agree(reduction, weighted):
    rng = np.random.default_rng(7)
    for dtype in (np.float32, np.float64):
        x = cn.log_softmax(rng.standard_normal((40, 7)).astype(dtype), 1)
        t = rng.integers(0, 7, 40)
        t[::5] = -100
        w = rng.random(7).astype(dtype) if weighted else None
        assert nll_losses._k.nll_forward_plain(x, t, w, reduction, -100) is not None
        got = cn.nll_loss_forward(x, t, w, reduction)
        same_bits(got, cn.nll_loss_forward(x.view(NotPlain), t, w, reduction))
        same_bits(got, cn.nll_loss_forward(x, t.astype(np.int32), w, reduction))
        one = cn.nll_loss_forward(x[3], np.array(t[3]), w, reduction)
        same_bits(one, cn.nll_loss_forward(x[3].view(NotPlain), np.array(t[3]), w, reduction))


def test_nll_loss_sums_are_compensated():
    # float64 losses whose plain running sum loses digits: 1e16 then many 1.0
    n = 100001
    x = np.zeros((n, 2))
    x[0, 0] = -1e16
    x[1:, 1] = -1.0
    t = np.array([0] + [1] * (n - 1))
    out, total = cn.nll_loss_forward(x, t, None, "sum")
    assert float(out) == 1e16 + (n - 1) and float(total) == n
    w = np.array([1.0, 1e-17])
    _, total = cn.nll_loss_forward(x, t, w, "sum")
    assert float(total) == math.fsum([1.0] + [1e-17] * (n - 1))


def test_nll_loss_edge_cases():
    x = cn.log_softmax(np.random.default_rng(8).standard_normal((3, 4)), 1)
    t = np.array([0, 1, 2])
    # an ignore_index beyond int64 ignores nothing
    same_bits(cn.nll_loss_forward(x, t, None, "mean", 2**70), cn.nll_loss_forward(x, t, None, "mean"))
    with np.errstate(invalid="ignore"):
        out, total = cn.nll_loss_forward(x, np.array([-100, -100, -100]))
    assert np.isnan(out) and total == 0
    with pytest.raises(ValueError, match="class index 9 is out of bounds for 4 classes"):
        cn.nll_loss_forward(x, np.array([0, 9, 1]))
    with pytest.raises(ValueError, match="class index -3 is out of bounds"):
        cn.nll_loss_forward(x, np.array([0, -3, 1]))
