"""The non-normalization ops of PyTorch's forward-mode table (softmax family,
NLL losses, trace, log_sigmoid_forward, the batch-norm backward adapters):
against loop-level float64 references, against PyTorch where installed, and
their bad-input errors."""
import math

import ml_dtypes
import numpy as np
import pytest

import cynorm as cn

# ------------------------------------------------------------ references
def ref_softmax(x, dim):
    x = np.moveaxis(np.asarray(x, np.float64), dim, -1)
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        e = [math.exp(v - max(row)) for v in row]
        out[idx] = [v / sum(e) for v in e]
    return np.moveaxis(out, -1, dim)


def ref_log_softmax(x, dim):
    x = np.moveaxis(np.asarray(x, np.float64), dim, -1)
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        top = max(row)
        lse = top + math.log(math.fsum(math.exp(v - top) for v in row))
        out[idx] = [v - lse for v in row]
    return np.moveaxis(out, -1, dim)


def ref_nll(x, target, weight, reduction, ignore_index=-100):
    """(output, total_weight) by a loop over samples (classes on axis 1)."""
    x = np.asarray(x, np.float64)
    xs = x[None] if x.ndim == 1 else x
    ts = np.asarray(target).reshape(xs.shape[:1] + xs.shape[2:])
    C = xs.shape[1]
    w = np.ones(C) if weight is None else np.asarray(weight, np.float64)
    losses = np.zeros(ts.shape)
    total = 0.0
    for idx in np.ndindex(ts.shape):
        t = int(ts[idx])
        if t == ignore_index:
            continue
        losses[idx] = -w[t] * xs[(idx[0], t) + idx[1:]]
        total += w[t]
    if reduction == "none":
        return losses.reshape(np.shape(target)), 0.0
    s = losses.sum()
    return (s / total if total else math.nan) if reduction == "mean" else s, total


def test_softmax_and_log_softmax_match_the_loop_reference(rng):
    x = rng.standard_normal((3, 5, 4)) * 4
    for dim in (0, 1, 2, -1):
        np.testing.assert_allclose(cn.softmax(x, dim), ref_softmax(x, dim), rtol=1e-13)
        np.testing.assert_allclose(cn.log_softmax(x, dim), ref_log_softmax(x, dim), rtol=1e-13, atol=1e-13)
    big = np.array([1000.0, 1001.0, -1000.0])
    assert np.all(np.isfinite(cn.softmax(big, 0))) and np.all(np.isfinite(cn.log_softmax(big[:2], 0)))
    np.testing.assert_allclose(cn.softmax(np.array(3.0), 0), 1.0)


def test_softmax_backward_data_is_the_vjp_of_softmax(rng):
    x, g = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    y = cn.softmax(x, 1)
    # J^T g with J = diag(y) - y y^T per row
    want = np.stack([(np.diag(yr) - np.outer(yr, yr)) @ gr for yr, gr in zip(y, g)])
    np.testing.assert_allclose(cn.softmax_backward_data(g, y, 1, np.float64), want, rtol=1e-12)
    ly = cn.log_softmax(x, 1)
    want = np.stack([(np.eye(6) - np.exp(lr)[None, :]).T @ gr for lr, gr in zip(ly, g)])
    np.testing.assert_allclose(cn.log_softmax_backward_data(g, ly, 1, np.float64), want, rtol=1e-12)


def test_half_to_float(rng):
    x = rng.standard_normal((3, 8)).astype(ml_dtypes.bfloat16)
    y = cn.softmax(x, 1, half_to_float=True)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, ref_softmax(x, 1), rtol=1e-6)
    g = rng.standard_normal((3, 8)).astype(np.float32)
    assert cn.softmax_backward_data(g, y, 1, ml_dtypes.bfloat16).dtype == ml_dtypes.bfloat16
    assert cn.softmax(x, 1).dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss_matches_the_loop_reference(reduction, rng):
    x = cn.log_softmax(rng.standard_normal((7, 4)), 1)
    target = np.array([0, 3, -100, 1, 1, 2, 3])
    w = rng.random(4) + 0.5
    for weight in (None, w):
        out, total = cn.nll_loss_forward(x, target, weight, reduction)
        want, want_total = ref_nll(x, target, weight, reduction)
        np.testing.assert_allclose(out, want, rtol=1e-13)
        np.testing.assert_allclose(total, want_total if reduction != "none" else 0.0, rtol=1e-13)
        np.testing.assert_array_equal(cn.nll_loss(x, target, weight, reduction), out)
    x2 = cn.log_softmax(rng.standard_normal((2, 4, 3, 5)), 1)
    t2 = rng.integers(0, 4, (2, 3, 5))
    t2[1, 2, 0] = -100
    out, total = cn.nll_loss2d_forward(x2, t2, w, reduction)
    want, want_total = ref_nll(x2, t2, w, reduction)
    np.testing.assert_allclose(out, want, rtol=1e-13)
    np.testing.assert_allclose(cn.nll_loss(x[0], np.array(target[0]), w, reduction),
                               ref_nll(x[0], target[0], w, reduction)[0], rtol=1e-13)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_nll_loss_backward_is_the_gradient(reduction, rng):
    x = cn.log_softmax(rng.standard_normal((6, 5)), 1)
    target = np.array([0, 4, -100, 2, 2, 1])
    w = rng.random(5) + 0.5
    out, total = cn.nll_loss_forward(x, target, w, reduction)
    g = rng.standard_normal(np.shape(out))
    grad = cn.nll_loss_backward(g, x, target, w, reduction, -100, total)
    # finite differences of <g, loss(x)>: the loss is linear in x
    num = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = 1.0
        num[idx] = np.sum(g * (ref_nll(x + e, target, w, reduction)[0] - ref_nll(x, target, w, reduction)[0]))
    np.testing.assert_allclose(grad, num, atol=1e-12)


def test_trace_and_log_sigmoid_forward(rng):
    a = rng.standard_normal((4, 6))
    assert cn.trace(a) == pytest.approx(sum(a[i, i] for i in range(4)))
    assert cn.trace(np.arange(12).reshape(3, 4)).dtype == np.int64
    x = np.array([-800.0, -3.0, 0.0, 2.0, 800.0])
    out, buf = cn.log_sigmoid_forward(x)
    want = [-800.0, -math.log1p(math.exp(3.0)), -math.log(2.0), -math.log1p(math.exp(-2.0)), 0.0]
    np.testing.assert_allclose(out, want, rtol=1e-15, atol=1e-300)
    np.testing.assert_allclose(buf, np.exp(-np.abs(x)))


def test_batch_norm_backward_adapters_reorder_the_arguments(rng):
    x, dy = rng.standard_normal((5, 3, 4)), rng.standard_normal((5, 3, 4))
    w, rm, rv = rng.random(3) + 0.5, rng.standard_normal(3), rng.random(3) + 0.5
    _, sm, si = cn.batch_norm(x, w, None, training=True)
    want = cn.batch_norm_backward(dy, x, w, rm, rv, sm, si, True, 1e-5)
    for got in (cn.cudnn_batch_norm_backward(x, dy, w, rm, rv, sm, si, 1e-5, None),
                cn.miopen_batch_norm_backward(x, dy, w, rm, rv, sm, si, 1e-5),
                cn.aten.batch_norm_backward(dy, x, w, rm, rv, sm, si, True, 1e-5, (True,) * 3)):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    ev = cn.aten.batch_norm_backward(dy, x, w, rm, rv, None, None, False, 1e-5, (True, False, True))
    assert ev[1] is None
    np.testing.assert_array_equal(ev[0], cn.batch_norm_backward(dy, x, w, rm, rv, None, None, False)[0])


def test_bad_input_names_the_argument(rng):
    x = cn.log_softmax(rng.standard_normal((3, 4)), 1)
    with pytest.raises(ValueError, match="target: class index 7 is out of bounds for 4 classes"):
        cn.nll_loss(x, np.array([0, 7, 1]))
    with pytest.raises(ValueError, match="reduction must be 'none', 'mean' or 'sum'"):
        cn.nll_loss(x, np.array([0, 1, 1]), reduction="avg")
    with pytest.raises(TypeError, match="target must be an integer array"):
        cn.nll_loss(x, np.array([0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match=r"target must have shape \(3,\)"):
        cn.nll_loss(x, np.array([0, 1]))
    with pytest.raises(ValueError, match=r"grad_output must have shape \(\) for reduction mean"):
        cn.nll_loss_backward(np.ones(3), x, np.array([0, 1, 1]), None, "mean", -100, np.array(3.0))
    with pytest.raises(ValueError, match="x must be a 2-D array"):
        cn.trace(np.ones(3))
    with pytest.raises(ValueError, match="half_to_float=True needs a 16-bit x"):
        cn.softmax(x, 1, half_to_float=True)
    with pytest.raises(ValueError, match="input_dtype must be output's dtype"):
        cn.softmax_backward_data(x, x, 1, np.float32)
    with pytest.raises(TypeError, match="dim must be an int"):
        cn.softmax(x, None)


torch = pytest.importorskip("torch")


def _nll_every_reduction(two_d, x, target, w, rng, tol):
    """cynorm's nll forward and backward (the 2d ops when two_d) against
    ATen's, with weights, for each reduction."""
    aten, T = torch.ops.aten, torch.from_numpy
    forward, backward = ((cn.nll_loss2d_forward, cn.nll_loss2d_backward) if two_d
                         else (cn.nll_loss_forward, cn.nll_loss_backward))
    t_forward, t_backward = ((aten.nll_loss2d_forward, aten.nll_loss2d_backward) if two_d
                             else (aten.nll_loss_forward, aten.nll_loss_backward))
    for red, code in (("none", 0), ("mean", 1), ("sum", 2)):
        out, tw = forward(x, target, w, red)
        tout, ttw = t_forward(T(x), T(target), T(w), code, -100)
        np.testing.assert_allclose(out, tout, **tol)
        np.testing.assert_allclose(tw, ttw, **tol)
        go = np.asarray(rng.standard_normal(out.shape)).astype(x.dtype)
        np.testing.assert_allclose(backward(go, x, target, w, red, -100, tw),
                                   t_backward(T(go), T(x), T(target), T(w), code, -100, ttw),
                                   **tol)


@pytest.mark.torch
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=str)
def test_against_pytorch(dtype, rng):
    aten = torch.ops.aten
    T = torch.from_numpy
    x = rng.standard_normal((6, 5)).astype(dtype)
    g = rng.standard_normal((6, 5)).astype(dtype)
    tol = dict(rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-7 if dtype == np.float32 else 1e-14)
    np.testing.assert_allclose(cn.softmax(x, 1), aten._softmax(T(x), 1, False), **tol)
    np.testing.assert_allclose(cn.log_softmax(x, 0), aten._log_softmax(T(x), 0, False), **tol)
    y = cn.softmax(x, 1)
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    np.testing.assert_allclose(cn.softmax_backward_data(g, y, 1, dtype),
                               aten._softmax_backward_data(T(g), T(y), 1, tdt), **tol)
    ly = cn.log_softmax(x, 1)
    np.testing.assert_allclose(cn.log_softmax_backward_data(g, ly, 1, dtype),
                               aten._log_softmax_backward_data(T(g), T(ly), 1, tdt), **tol)
    target = np.array([0, 4, -100, 2, 2, 1])
    w = (rng.random(5) + 0.5).astype(dtype)
    _nll_every_reduction(False, ly, target, w, rng, tol)
    x2 = cn.log_softmax(rng.standard_normal((2, 3, 4, 5)).astype(dtype), 1)
    t2 = rng.integers(0, 3, (2, 4, 5))
    out, tw = cn.nll_loss2d_forward(x2, t2, None, "mean")
    tout, ttw = aten.nll_loss2d_forward(T(x2), T(t2), None, 1, -100)
    np.testing.assert_allclose(out, tout, **tol)
    np.testing.assert_allclose(cn.nll_loss2d_backward(np.array(1.5, dtype), x2, t2, None, "mean", -100, tw),
                               aten.nll_loss2d_backward(T(np.array(1.5, dtype)), T(x2), T(t2), None, 1, -100,
                                                        ttw), **tol)
    # weighted, with ignored pixels, every reduction; N not a multiple of 2 threads' split
    x3 = cn.log_softmax(rng.standard_normal((3, 4, 3, 5)).astype(dtype), 1)
    t3 = rng.integers(0, 4, (3, 3, 5))
    t3[:, 1] = -100
    w3 = (rng.random(4) + 0.5).astype(dtype)
    _nll_every_reduction(True, x3, t3, w3, rng, tol)
    np.testing.assert_allclose(cn.trace(x[:5]), aten.trace(T(x[:5])), **tol)
    out, buf = cn.log_sigmoid_forward(x * 5)
    tout, tbuf = aten.log_sigmoid_forward(T(x * 5))
    np.testing.assert_allclose(out, tout, **tol)
    np.testing.assert_allclose(buf, tbuf, **tol)


def test_edge_semantics_found_in_review(rng):
    w = np.array([1.0, 2.0, 3.0, 4.0])
    x = cn.log_softmax(rng.standard_normal(4), 0)
    out, total = cn.nll_loss_forward(x, np.array(1), w, "none")
    assert float(total) == 2.0                       # ATen: weight[target] for one 1-D sample
    out, _ = cn.nll_loss_forward(cn.log_softmax(rng.standard_normal((3, 4)), 1), np.array([0, -100, 1]),
                                 None, "none")
    assert out[1] == 0 and not np.signbit(out[1])    # ignored: +0
    out, total = cn.nll_loss_forward(np.zeros((2, 0)), np.array([-100, -100]))
    assert np.isnan(out) and total == 0
    for res in (cn.softmax(np.array(3.0), 0), cn.log_softmax(np.array(3.0), 0),
                *cn.log_sigmoid_forward(np.array(0.5))):
        assert isinstance(res, np.ndarray) and res.shape == ()
    with pytest.raises(TypeError, match="bool array"):
        cn.trace(np.ones((2, 2), bool))
    with pytest.raises(TypeError, match="input_dtype must be a dtype"):
        cn.softmax_backward_data(np.ones(3), np.ones(3) / 3, 0, None)


def test_batch_norm_jvps_of_an_empty_batch(rng):
    x, tx = np.zeros((0, 3)), np.zeros((0, 3))
    rm, rv = np.zeros(3), np.ones(3)
    (y, _, _), (ty, _, _) = cn.jvp(cn.batch_norm, (x, None, None, rm, rv, False), (tx,) + (None,) * 5)
    assert ty.shape == (0, 3)
    _, t = cn.jvp(cn.batch_norm_backward, (x, x, None, rm, rv, None, None, False),
                  (tx, tx, None, None, None, None, None, None))
    assert t[0].shape == (0, 3) and not np.any(t[1]) and not np.any(t[2])
