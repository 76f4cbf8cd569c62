"""The residual-fused norms, add_layer_norm and add_rms_norm, and their
backward ops: bit for bit the unfused composition (h = x + residual stored in
x's dtype, then the norm of h; the norm's grad_x at h plus grad_h, added in
the math type), every dtype, layouts, out= forms (y or h into x or residual),
masks, thread counts, extreme gradients, bad input, and PyTorch parity."""
import itertools
import warnings

import numpy as np
import pytest

import cynorm
from conftest import DTYPES, DTYPE_IDS, requires_torch
from helpers import BF16, F16, F32, F64, bits, layout, stat_dtype
from norm_helpers import make_affine, make_x, param_dtypes

SHAPES = [((3, 7), (7,)), ((64, 300), (300,)), ((5, 4, 33), (4, 33)), ((2, 4096), (4096,)),
          ((1, 100003), (100003,)), ((5000, 7), (7,)), ((513, 64), (64,))]
SHAPE_IDS = [f"{s}-ns{n}" for s, n in SHAPES]


def norms(kind):
    """(fused forward, fused backward, unfused forward, unfused backward, has mean)."""
    if kind == "layer":
        return (cynorm.add_layer_norm, cynorm.add_layer_norm_backward, cynorm.layer_norm,
                cynorm.layer_norm_backward, True)
    return (cynorm.add_rms_norm, cynorm.add_rms_norm_backward, cynorm.rms_norm,
            cynorm.rms_norm_backward, False)


def params(rng, kind, ns, pdt):
    w, b = make_affine(rng, ns, pdt)
    return (w, b) if kind == "layer" else (w,)


def add_stored(x, r):
    """x + residual as an unfused add stores it (16-bit: a float32 sum rounded once)."""
    if x.dtype in (BF16, F16):
        return (x.astype(F32) + r.astype(F32)).astype(x.dtype)
    return x + r


def assert_bits(got, want, what=""):
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        if w is None:
            assert g is None, what
        else:
            assert g.dtype == w.dtype and g.shape == w.shape, what
            np.testing.assert_array_equal(bits(g), bits(w), err_msg=what)


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,ns", SHAPES, ids=SHAPE_IDS)
def test_forward_and_backward_are_the_unfused_composition(kind, shape, ns, dtype, rng):
    fwd, bwd, norm, norm_bwd, centered = norms(kind)
    for ki, xk in enumerate(("C", "F", "strided")):
        x = make_x(rng, shape, dtype, xk, scale=2.0, offset=0.5)
        res = make_x(rng, shape, dtype, ("C", "strided", "F")[ki])
        p = params(rng, kind, ns, param_dtypes(dtype)[-1])
        before = [a.copy() for a in (x, res) + p]
        y, h, *stats = fwd(x, res, ns, *p)
        for a, a0 in zip((x, res) + p, before):
            np.testing.assert_array_equal(bits(a), bits(a0))
        h_want = add_stored(x, res)
        assert_bits((h,), (h_want,), f"h {xk}")
        assert_bits((y, *stats), norm(h_want, ns, *p), f"y {xk}")
        dy, dh = make_x(rng, shape, dtype, xk), make_x(rng, shape, dtype)
        got = bwd(dy, dh, h, ns, *stats, *p)
        want = list(norm_bwd(dy, h, ns, *stats, *p))
        want[0] = add_stored(want[0], dh)
        assert_bits(got, want, f"backward {xk}")
        # no grad_h: the norm's backward itself
        assert_bits(bwd(dy, None, h, ns, *stats, *p), norm_bwd(dy, h, ns, *stats, *p),
                    f"backward without grad_h {xk}")


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_without_params_and_masks(kind, dtype, rng):
    fwd, bwd, norm, norm_bwd, centered = norms(kind)
    shape, ns = (6, 4, 9), (4, 9)
    x, res, dy, dh = (make_x(rng, shape, dtype) for _ in range(4))
    y, h, *stats = fwd(x, res, ns)
    assert_bits((y, *stats), norm(h, ns))
    p = params(rng, kind, ns, param_dtypes(dtype)[-1])
    y, h, *stats = fwd(x, res, ns, *p)
    full = bwd(dy, dh, h, ns, *stats, *p)
    for mask in itertools.product((True, False), repeat=len(full)):
        got = bwd(dy, dh, h, ns, *stats, *p, output_mask=mask)
        assert_bits(got, tuple(f if on else None for on, f in zip(mask, full)), f"mask {mask}")


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_out_forms_and_in_place(kind, dtype, rng):
    fwd, *_ = norms(kind)
    shape, ns = (12, 5, 33), (5, 33)
    x, res = make_x(rng, shape, dtype), make_x(rng, shape, dtype)
    p = params(rng, kind, ns, param_dtypes(dtype)[-1])
    want = fwd(x, res, ns, *p)
    sd = stat_dtype(dtype)
    nstat = len(want) - 2
    # every out= entry given or None
    for keep in itertools.product((True, False), repeat=len(want)):
        outs = tuple(np.full(w.shape, 7, w.dtype) if k else None for k, w in zip(keep, want))
        got = fwd(x, res, ns, *p, out=outs)
        for g, o in zip(got, outs):
            if o is not None:
                assert g is o
        assert_bits(got, want, f"keep {keep}")
    # y / h into x / residual: each row is read before it is written
    for yi, hi in ((0, 1), (1, 0), (0, None), (None, 1), (1, None), (None, 0)):
        xc, rc = x.copy(), res.copy()
        ins = (xc, rc)
        outs = (None if yi is None else ins[yi], None if hi is None else ins[hi]) + (None,) * nstat
        got = fwd(xc, rc, ns, *p, out=outs)
        for g, o in zip(got, outs):
            if o is not None:
                assert g is o
        assert_bits(got, want, f"y into {yi}, h into {hi}")
    # F-ordered y and h
    yf, hf = np.full(shape, 7, dtype, order="F"), np.full(shape, 7, dtype, order="F")
    got = fwd(x, res, ns, *p, out=(yf, hf) + (None,) * nstat)
    assert got[0] is yf and got[1] is hf
    assert_bits(got, want, "F-ordered outs")
    with pytest.raises(ValueError, match=r"out\[1\] \(h\)"):
        fwd(x, res, ns, *p, out=(None, np.empty(shape + (1,), dtype)) + (None,) * nstat)
    with pytest.raises(ValueError, match="share memory|overlap"):
        buf = np.empty(shape, dtype)
        fwd(x, res, ns, *p, out=(buf, buf) + (None,) * nstat)
    with pytest.raises(TypeError, match=f"out must be None or a tuple of {len(want)}"):
        fwd(x, res, ns, *p, out=(None,))
    assert sd == want[-1].dtype


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_bad_input_names_the_argument(kind, rng):
    fwd, bwd, *_ = norms(kind)
    x = rng.standard_normal((3, 4))
    with pytest.raises(ValueError, match=r"residual must have the shape of x \(3, 4\)"):
        fwd(x, x[:2], 4)
    with pytest.raises(TypeError, match=r"residual must have the dtype of x"):
        fwd(x, x.astype(np.float32), 4)
    with pytest.raises(TypeError, match="residual"):
        fwd(x, "abc", 4)
    y, h, *stats = fwd(x, x, 4)
    with pytest.raises(ValueError, match=r"grad_h must have the shape of h \(3, 4\)"):
        bwd(x, x[:, :2], h, 4, *stats)
    with pytest.raises(TypeError, match=r"grad_h must have the dtype of h"):
        bwd(x, x.astype(np.float32), h, 4, *stats)
    with pytest.raises(ValueError, match=r"rstd must have shape \(3, 1\) \(as add_"):
        bwd(x, x, h, 4, *stats[:-1], stats[-1][:2])


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_zero_sizes(kind, dtype):
    fwd, bwd, *_ = norms(kind)
    for shape, ns in [((0, 5), 5), ((3, 0), 0)]:
        x = np.zeros(shape, dtype)
        y, h, *stats = fwd(x, x, ns)
        assert y.shape == h.shape == shape
        gx, *_ = bwd(x, x, h, ns, *stats)
        assert gx.shape == shape


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bitwise_identical_for_any_thread_count(kind, dtype, rng, restore_threads):
    fwd, bwd, *_ = norms(kind)
    for shape, ns in [((5000, 7), 7), ((64, 4096), 4096), ((2, 200000), 200000)]:
        x, res, dy, dh = (make_x(rng, shape, dtype) for _ in range(4))
        p = params(rng, kind, (ns,), param_dtypes(dtype)[-1])
        runs = []
        for t in (1, 2, 3):
            cynorm.set_num_threads(t)
            outs = fwd(x, res, ns, *p)
            grads = bwd(dy, dh, outs[1], ns, *outs[2:], *p)
            runs.append([bits(a).copy() for a in outs + grads])
        for other in runs[1:]:
            for a, b in zip(runs[0], other):
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_grad_h_added_to_a_grad_x_beyond_float32(kind, dtype, rng):
    # |grad_out| near float32's top: grad_x's float32 terms overflow and the
    # elements are recomputed in float64 (extreme magnitudes); grad_h is
    # added to that as to every element
    fwd, bwd, norm, norm_bwd, _ = norms(kind)
    shape, ns = (16, 300), (300,)
    x, res = make_x(rng, shape, dtype), make_x(rng, shape, dtype)
    dy = (rng.standard_normal(shape) * 3e38).clip(-3.3e38, 3.3e38).astype(dtype)
    dh = make_x(rng, shape, dtype)
    p = params(rng, kind, ns, F32)
    y, h, *stats = fwd(x, res, ns, *p)
    got = bwd(dy, dh, h, ns, *stats, *p)
    want = list(norm_bwd(dy, h, ns, *stats, *p))
    with np.errstate(over="ignore"):
        want[0] = add_stored(want[0], dh)
    assert_bits(got, want)


# ---- PyTorch parity: the unfused composition in torch

@pytest.mark.torch
@requires_torch
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=str)
def test_matches_torch_composition(kind, dtype, rng):
    import torch
    F = torch.nn.functional
    tdt = {F64: torch.float64, F32: torch.float32, BF16: torch.bfloat16}[dtype]
    shape, ns = (64, 512), (512,)
    x, res, dy, dh = (make_x(rng, shape, dtype) for _ in range(4))
    p = params(rng, kind, ns, param_dtypes(dtype)[-1])

    def tt(a, grad=False):
        t = torch.from_numpy(np.ascontiguousarray(a.astype(F32) if a.dtype == BF16 else a))
        return t.to(tdt if a.dtype == BF16 else t.dtype).requires_grad_(grad)
    tx, tr = tt(x, True), tt(res, True)
    tp = [tt(a, True) for a in p]
    th = tx + tr
    th.retain_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ty = (F.layer_norm(th, list(ns), *tp) if kind == "layer"
              else F.rms_norm(th, list(ns), *tp, 1e-5 if dtype != F64 else None))
    torch.autograd.backward([ty, th], [tt(dy), tt(dh)])
    fwd, bwd, *_ = norms(kind)
    eps = {} if kind == "layer" else {"eps": 1e-5 if dtype != F64 else None}
    y, h, *stats = fwd(x, res, ns, *p, **eps)
    gin, gw, *rest = bwd(dy, dh, h, ns, *stats, *p)
    tol = {F64: 1e-12, F32: 2e-5, BF16: 2e-2}[dtype]

    def close(a, t, what):
        want = t.detach().double().numpy()
        scale = np.max(np.abs(want)) + 1e-30
        assert np.max(np.abs(a.astype(np.float64) - want)) <= tol * scale, what
    np.testing.assert_array_equal(h.astype(np.float64), th.detach().double().numpy())
    close(y, ty, "y")
    close(gin, tx.grad, "grad_input")
    close(gin, tr.grad, "grad_input (residual)")
    close(gw, tp[0].grad, "grad_weight")
    if rest:
        close(rest[0], tp[1].grad, "grad_bias")


def test_layouts_of_grad_h(rng):
    shape, ns = (6, 5, 40), (5, 40)
    x, res, dy, dh = (make_x(rng, shape, F32) for _ in range(4))
    y, h, rstd = cynorm.add_rms_norm(x, res, ns)
    want = cynorm.add_rms_norm_backward(dy, dh, h, ns, rstd)
    for k in ("F", "strided"):
        assert_bits(cynorm.add_rms_norm_backward(layout(dy, k), layout(dh, k), layout(h, k), ns,
                                                 rstd), want, k)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_float64_matches_the_reference_twin(kind, rng):
    # the twin composes the float64 norm with an exact add: float64 data
    # agrees to float64 rounding
    from cynorm import reference as ref
    shape, ns = (7, 5, 33), (5, 33)
    x, res, dy, dh = (rng.standard_normal(shape) for _ in range(4))
    p = params(rng, kind, ns, F64)
    fwd, bwd, *_ = norms(kind)
    got = fwd(x, res, ns, *p, eps=1e-5)
    want = (ref.add_layer_norm if kind == "layer" else ref.add_rms_norm)(x, res, ns, *p, eps=1e-5)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    gg = bwd(dy, dh, got[1], ns, *got[2:], *p)
    wg = (ref.add_layer_norm_backward if kind == "layer" else ref.add_rms_norm_backward)(
        dy, dh, want[1], ns, *want[2:], p[0])
    for g, w in zip(gg, wg):
        np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("big_grad", [False, True], ids=["normal", "grad_out near 3e38"])
def test_streamed_calls_give_the_same_bits(kind, dtype, big_grad, rng):
    # streamed (as past the cache: forced here, whatever this machine's cache)
    # the kernels form h and grad_input in a cached row and stream them out:
    # the same bits as the composition, NaN, inf and -0 included; with
    # grad_out near float32's top, rows also take the float64 mend with grad_h
    from cynorm._kernels import _runtime
    fwd, bwd, norm, norm_bwd, _ = norms(kind)
    shape, ns = (33, 4096), (4096,)       # an odd row count: a block's last row alone
    x, res, dy, dh = (rng.standard_normal(shape, dtype=np.float32).astype(dtype) for _ in range(4))
    x[0, :3] = [np.nan, np.inf, -0.0]
    res[0, :3] = [1.0, 1.0, -0.0]
    if big_grad:
        dy = (rng.standard_normal(shape) * 3e38).clip(-3.3e38, 3.3e38).astype(dtype)
    p = params(rng, kind, ns, F32)
    old = _runtime.set_stream_min_bytes(0)
    try:
        y, h, *stats = fwd(x, res, ns, *p)
        got = bwd(dy, dh, h, ns, *stats, *p)
        mask = (True,) + (False,) * (len(got) - 1)
        got_x = bwd(dy, dh, h, ns, *stats, *p, output_mask=mask)
    finally:
        _runtime.set_stream_min_bytes(old)
    h_want = add_stored(x, res)
    assert_bits((h,), (h_want,))
    assert_bits((y, *stats), norm(h_want, ns, *p))
    want = list(norm_bwd(dy, h, ns, *stats, *p))
    with np.errstate(invalid="ignore", over="ignore"):
        want[0] = add_stored(want[0], dh)
    assert_bits(got, want)
    assert_bits(got_x[:1], want[:1])
