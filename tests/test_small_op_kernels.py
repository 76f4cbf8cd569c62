"""The kernels of softmax, log_softmax and their backward ops, trace,
log_sigmoid_forward and the NLL losses and their backward
(cynorm/_kernels/softmax.pyx.tp, pointwise.pyx.tp, nll_loss.pyx.tp):
accuracy against float64 NumPy references, the edge values, the same bits
through the plain entry and through the Python layer, at any thread count,
and what the plain entries leave to the Python layer."""
import math

import ml_dtypes
import numpy as np
import pytest

import cynorm as cn
from cynorm import nll_losses, pointwise, softmax_ops

EPS32 = np.finfo(np.float32).eps
ALL_DTYPES = (np.float32, np.float64, ml_dtypes.bfloat16, np.float16)


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
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_plain_entry_and_python_layer_give_the_same_bits(shape, d, dtype, threads):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)
    if x.size > 3:                      # the edges too: an infinite and a NaN value
        x.reshape(-1)[[1, 3]] = [np.inf, np.nan]
    half = np.dtype(dtype).itemsize == 2
    with np.errstate(invalid="ignore", over="ignore"):
        for log in (False, True):
            fwd = cn.log_softmax if log else cn.softmax
            bwd = cn.log_softmax_backward_data if log else cn.softmax_backward_data
            for to_float in ((False, True) if half else (False,)):
                assert softmax_ops._k.softmax_plain(x, d, to_float, log) is not None
                y = fwd(x, d, to_float)
                same_bits(y, fwd(x.view(NotPlain), d, to_float))
                same_bits(y, fwd(np.asfortranarray(x), d, to_float))   # another layout
                gy = g.astype(y.dtype)
                assert softmax_ops._k.softmax_backward_plain(gy, y, d, dtype, log) is not None
                same_bits(bwd(gy, y, d, dtype), bwd(gy.view(NotPlain), y, d, np.dtype(dtype)))


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
    for dtype in (ml_dtypes.bfloat16, np.float16):      # computed in float32, rounded once
        xs = x.astype(dtype)
        assert pointwise._k.log_sigmoid_forward_plain(xs) is not None
        out, buffer = cn.log_sigmoid_forward(xs)
        out32, buffer32 = cn.log_sigmoid_forward(xs.astype(np.float32))
        same_bits((out, buffer), (out32.astype(dtype), buffer32.astype(dtype)))
        same_bits((out, buffer), cn.log_sigmoid_forward(xs.view(NotPlain)))
    with np.errstate(invalid="ignore"):
        out, buffer = cn.log_sigmoid_forward(np.array([np.nan, np.inf, -np.inf], np.float32))
    assert np.isnan(out[0]) and np.isnan(buffer[0])
    assert out[1] == 0 and buffer[1] == 0
    assert out[2] == -np.inf and buffer[2] == 0


# ---- nll losses ----------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["none", "mean", "sum", 0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_forward_plain_and_python_agree(reduction, weighted):
    rng = np.random.default_rng(7)
    for dtype in ALL_DTYPES:
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


def test_nll_loss2d_forward_walks_the_pixel_axis():
    # the 2d forward over (N, C, H, W) is the forward over its (N*H*W, C)
    # rows, in the same sample order: the same bits
    rng = np.random.default_rng(9)
    for dtype in (np.float32, np.float64):
        x = cn.log_softmax(rng.standard_normal((3, 6, 5, 7)).astype(dtype), 1)
        t = rng.integers(0, 6, (3, 5, 7))
        t[1, ::2] = -100
        w = rng.random(6).astype(dtype)
        rows, flat = np.ascontiguousarray(np.moveaxis(x, 1, -1).reshape(-1, 6)), t.reshape(-1)
        for reduction in ("none", "mean", "sum"):
            assert nll_losses._k.nll_forward_plain(x, t, w, reduction, -100, True) is not None
            out, total = cn.nll_loss2d_forward(x, t, w, reduction)
            want, want_total = cn.nll_loss_forward(rows, flat, w, reduction)
            same_bits((out.reshape(-1), total), (want.reshape(-1), want_total))
            assert out.shape == (t.shape if reduction == "none" else ())
            same_bits(cn.nll_loss2d(x, t, w, reduction), out)


NLL_SHAPES = [(7,), (1,), (9, 6), (0, 4), (5, 1), (3, 5, 4, 6), (5, 3, 2, 1), (0, 3, 2, 2),
              (2, 4, 0, 3), (1, 1, 3, 3)]


def nll_problem(shape, dtype, weighted, reduction, seed):
    # log-probabilities, targets with ignore_index hits, weight, grad_output
    # and the forward's total_weight
    rng = np.random.default_rng(seed)
    C = shape[1] if len(shape) > 1 else shape[0]
    x = cn.log_softmax(rng.standard_normal(shape).astype(dtype), 1 if len(shape) > 1 else 0)
    t = rng.integers(0, C, (shape[0],) + shape[2:] if len(shape) > 1 else ())
    if t.ndim:
        t.reshape(-1)[1::4] = -100
    w = rng.random(C).astype(dtype) + dtype(0.25) if weighted else None
    fwd = cn.nll_loss2d_forward if len(shape) == 4 else cn.nll_loss_forward
    with np.errstate(invalid="ignore"):
        out, total = fwd(x, t, w, reduction)
    g = np.asarray(rng.standard_normal(out.shape) * 3).astype(dtype)
    return x, t, w, g, total


def ref_nll_backward(g, x, t, w, reduction, ignore_index, total):
    """The gradient by a loop over samples, in float64: -(w[t] * g) (/ total
    for "mean") at [n, t, pixel], rounded once to x's dtype."""
    xs = x.reshape((1,) + x.shape) if x.ndim == 1 else x
    grad = np.zeros(xs.shape)
    ts = t.reshape(xs.shape[:1] + xs.shape[2:])
    gs = np.asarray(g, np.float64).reshape(ts.shape) if reduction in ("none", 0) else None
    for idx in np.ndindex(ts.shape):
        c = int(ts[idx])
        if c == ignore_index:
            continue
        v = (1.0 if w is None else float(w[c])) * (float(g) if gs is None else float(gs[idx]))
        if reduction in ("mean", 1):
            with np.errstate(divide="ignore", invalid="ignore"):
                v = np.float64(v) / np.float64(total)
        grad[(idx[0], c) + idx[1:]] = -v
    grad = grad.reshape(x.shape)
    return grad.astype(np.float32).astype(x.dtype) if x.dtype.itemsize == 2 else grad.astype(x.dtype)


def nll_backward(shape):
    return cn.nll_loss2d_backward if len(shape) == 4 else cn.nll_loss_backward


@pytest.mark.parametrize("shape", NLL_SHAPES, ids=str)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum", 0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_backward_matches_the_float64_reference(shape, reduction, weighted, threads):
    # each gradient element is one float64 expression rounded once: the
    # reference gives the same bits
    for dtype in (np.float32, np.float64, ml_dtypes.bfloat16, np.float16):
        x, t, w, g, total = nll_problem(shape, dtype, weighted, reduction, 11)
        grad = nll_backward(shape)(g, x, t, w, reduction, -100, total)
        assert grad.flags.c_contiguous
        same_bits(grad, ref_nll_backward(g, x, t, w, reduction, -100, total))
        # ignore_index a class: that class's entries get nothing
        t0 = np.where(t == -100, 0, t)
        got = nll_backward(shape)(g, x, t0, w, reduction, 0, total)
        same_bits(got, ref_nll_backward(g, x, t0, w, reduction, 0, total))


@pytest.mark.parametrize("total", [0.0, -0.0, -2.5, np.inf])
def test_nll_loss_backward_mean_divides_by_any_total_weight(total):
    # total_weight 0 (every target ignored in the forward) gives inf/nan, as
    # ATen's division does
    for dtype in (np.float32, np.float64):
        for shape in ((4, 3), (2, 3, 2, 2)):
            x, t, w, _, _ = nll_problem(shape, dtype, True, "mean", 12)
            tw = np.array(total, dtype)
            for gv in (1.5, 0.0, -np.inf, np.nan):
                g = np.array(gv, dtype)
                with np.errstate(divide="ignore", invalid="ignore"):
                    grad = nll_backward(shape)(g, x, t, w, "mean", -100, tw)
                    same_bits(grad, ref_nll_backward(g, x, t, w, "mean", -100, tw))


def nll_backward_args(shape, dtype, weighted, reduction):
    x, t, w, g, total = nll_problem(shape, dtype, weighted, reduction, 13)
    return g, x, t, w, reduction, -100, total


@pytest.mark.parametrize("shape", NLL_SHAPES, ids=str)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum", 0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_backward_plain_and_python_agree(shape, reduction, weighted, threads):
    two_d = len(shape) == 4
    for dtype in ALL_DTYPES:
        args = nll_backward_args(shape, dtype, weighted, reduction)
        g, x, t, w = args[:4]
        before = [a.copy() for a in (g, x, t, w) if a is not None]
        assert nll_losses._k.nll_backward_plain(*args, two_d) is not None
        got = nll_backward(shape)(*args)
        assert type(got) is np.ndarray and got.flags.c_contiguous
        for a, b in zip(before, [a for a in (g, x, t, w) if a is not None]):
            same_bits(b, a)                                  # inputs are not written
        # the same data through the Python layer: a subclass, int32 targets,
        # F order, a float64 grad_output (float32 widens exactly)
        same_bits(got, nll_backward(shape)(g, x.view(NotPlain), *args[2:]))
        same_bits(got, nll_backward(shape)(g, x, t.astype(np.int32), *args[3:]))
        same_bits(got, nll_backward(shape)(g, np.asfortranarray(x), *args[2:]))
        same_bits(got, nll_backward(shape)(g.astype(np.float64), *args[1:]))
        same_bits(got, nll_backward(shape)(*args[:6], np.asarray(args[6], np.float64)))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum", 0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss2d_forward_plain_and_python_agree(reduction, weighted):
    rng = np.random.default_rng(14)
    for dtype in ALL_DTYPES:
        for shape in ((3, 5, 4, 6), (1, 2, 1, 1), (0, 3, 2, 2), (2, 3, 0, 5)):
            x = cn.log_softmax(rng.standard_normal(shape).astype(dtype), 1)
            t = rng.integers(0, shape[1], (shape[0],) + shape[2:])
            if t.size:
                t.reshape(-1)[::5] = -100
            w = rng.random(shape[1]).astype(dtype) if weighted else None
            assert nll_losses._k.nll_forward_plain(x, t, w, reduction, -100, True) is not None
            with np.errstate(invalid="ignore"):
                got = cn.nll_loss2d_forward(x, t, w, reduction)
                same_bits(got, cn.nll_loss2d_forward(x.view(NotPlain), t, w, reduction))
                same_bits(got, cn.nll_loss2d_forward(x, t.astype(np.int32), w, reduction))
                same_bits(got, cn.nll_loss2d_forward(np.asfortranarray(x), t, w, reduction))
                same_bits(got[0], cn.nll_loss2d(x, t, w, reduction))


def nll_not_plain_cases():
    # (name, the changed argument, the public call's error or None): each is
    # left to Python, which gives the bits or raises
    x = nll_backward_args((3, 4), np.float32, True, "mean")
    return [
        ("F-order x", dict(x=np.asfortranarray(x[1])), None),
        ("x a transposed view", dict(x=np.ascontiguousarray(x[1].T).T), None),
        ("int32 target", dict(t=np.array([0, 1, 3], np.int32)), None),
        ("int64 target, non-native order", dict(t=np.array([0, 1, 3], ">i8")), None),
        ("a list target", dict(t=[0, 1, 3]), None),
        ("weight of another dtype", dict(w=np.ones(4)), (TypeError, "weight")),
        ("weight of another length", dict(w=np.ones(5, np.float32)), (ValueError, "weight")),
        ("target out of bounds", dict(t=np.array([0, 4, 1])),
         (ValueError, "target: class index 4 is out of bounds for 4 classes")),
        ("negative target", dict(t=np.array([0, -3, 1])),
         (ValueError, "target: class index -3 is out of bounds for 4 classes")),
        ("target of another shape", dict(t=np.array([0, 1])), (ValueError, r"target must have shape \(3,\)")),
        ("reduction unknown", dict(reduction="avg"), (ValueError, "reduction must be")),
        ("reduction a bool", dict(reduction=True), (ValueError, "reduction must be")),
        ("ignore_index a float", dict(ignore=-100.0), (TypeError, "ignore_index")),
        ("ignore_index beyond int64", dict(ignore=2**70, t=np.array([0, 1, 3])), None),
        ("x float16, weight float32", dict(x=x[1].astype(np.float16)), (TypeError, "weight")),
        ("x 3-D", dict(x=np.zeros((3, 4, 2), np.float32)), (ValueError, "x must be 1-D")),
        ("C = 0", dict(x=np.zeros((3, 0), np.float32), t=np.full(3, -100), w=None), None),
    ], x


@pytest.mark.parametrize("case", [c[0] for c in nll_not_plain_cases()[0]])
def test_nll_loss_not_plain_goes_to_python(case):
    cases, (g, x, t, w, reduction, ignore, total) = nll_not_plain_cases()
    change, error = {c[0]: c[1:] for c in cases}[case]
    a = dict(g=g, x=x, t=t, w=w, reduction=reduction, ignore=ignore, total=total)
    a.update(change)
    fwd = (a["x"], a["t"], a["w"], a["reduction"], a["ignore"])
    bwd = (a["g"], a["x"], a["t"], a["w"], a["reduction"], a["ignore"], a["total"])
    assert nll_losses._k.nll_forward_plain(*fwd, False) is None
    assert nll_losses._k.nll_backward_plain(*bwd, False) is None
    if error is None:
        # the same data as C-contiguous arrays and int64 targets
        xc, tc = np.ascontiguousarray(a["x"]), np.asarray(a["t"], np.int64)
        with np.errstate(invalid="ignore"):
            same_bits(cn.nll_loss_forward(*fwd), cn.nll_loss_forward(xc, tc, *fwd[2:]))
        same_bits(cn.nll_loss_backward(*bwd),
                  ref_nll_backward(a["g"], xc, tc, a["w"], reduction, a["ignore"], a["total"]))
    else:
        kind, message = error
        with pytest.raises(kind, match=message):
            cn.nll_loss_forward(*fwd)
        with pytest.raises(kind, match=message):
            cn.nll_loss_backward(*bwd)


@pytest.mark.parametrize("change,error", [
    (dict(g=np.ones(3, np.float32)), (ValueError, r"grad_output must have shape \(\) for reduction mean")),
    (dict(g=np.ones((), np.float64)), None),
    (dict(g=np.ones((1,), np.float32)), (ValueError, "grad_output must have shape")),
    (dict(total=np.ones(1, np.float32)), (ValueError, "total_weight must be 0-d")),
    (dict(total=np.array(3.0)), None),
    (dict(total=3.0), None),
    (dict(g=1.0), None),
    (dict(g=np.ones((), np.int64)), (TypeError, "grad_output must have a floating dtype")),
    (dict(g=np.ones((), np.float32).view(NotPlain)), None),
])
def test_nll_loss_backward_leaves_other_grad_and_total_to_python(change, error):
    g, x, t, w, reduction, ignore, total = nll_backward_args((3, 4), np.float32, True, "mean")
    a = dict(g=g, total=total)
    a.update(change)
    args = (a["g"], x, t, w, reduction, ignore, a["total"])
    assert nll_losses._k.nll_backward_plain(*args, False) is None
    if error is None:
        want = ref_nll_backward(np.float64(np.asarray(a["g"], np.float64)), x, t, w, reduction, ignore,
                                np.float64(np.asarray(a["total"], np.float64)))
        same_bits(cn.nll_loss_backward(*args), want)
    else:
        with pytest.raises(error[0], match=error[1]):
            cn.nll_loss_backward(*args)


@pytest.mark.parametrize("call,error", [
    (lambda x, t: cn.nll_loss2d_forward(np.asfortranarray(x), t), None),
    (lambda x, t: cn.nll_loss2d_forward(x, t.astype(np.int32)), None),
    (lambda x, t: cn.nll_loss2d_forward(x, t.reshape(2, -1)),
     (ValueError, r"target must have shape \(2, 3, 4\)")),
    (lambda x, t: cn.nll_loss2d_forward(x[0], t[0]), (ValueError, "x must be 4-D")),
    (lambda x, t: cn.nll_loss2d_forward(x, np.where(t == 1, 7, t)),
     (ValueError, "target: class index 7 is out of bounds for 5 classes")),
    (lambda x, t: cn.nll_loss2d_backward(np.ones((), np.float32), x, np.where(t == 1, 7, t), None, "sum",
                                         -100, np.ones((), np.float32)),
     (ValueError, "target: class index 7 is out of bounds for 5 classes")),
    (lambda x, t: cn.nll_loss2d_backward(np.ones((2, 4, 3), np.float32), x, t, None, "none", -100,
                                         np.ones((), np.float32)),
     (ValueError, r"grad_output must have shape \(2, 3, 4\) for reduction none")),
    (lambda x, t: cn.nll_loss2d_backward(np.ones((2, 3, 4), np.float32), x, t, np.ones(5), "none", -100,
                                         np.ones((), np.float32)), (TypeError, "weight")),
])
def test_nll_loss2d_not_plain_goes_to_python(call, error, monkeypatch):
    rng = np.random.default_rng(15)
    x = cn.log_softmax(rng.standard_normal((2, 5, 3, 4)).astype(np.float32), 1)
    t = rng.integers(0, 5, (2, 3, 4))
    taken = []
    for name in ("_forward", "_backward"):
        def spy(*args, _f=getattr(nll_losses, name)):
            taken.append(1)
            return _f(*args)
        monkeypatch.setattr(nll_losses, name, spy)
    if error is None:
        out = call(x, t)
        assert taken
        same_bits(out, cn.nll_loss2d_forward(x, t))
    else:
        with pytest.raises(error[0], match=error[1]):
            call(x, t)
        assert taken
