"""Batch norm and its split-statistics ops against the float64 reference:
channel axis first, last and in the middle; C = 1, 3, large; HW = 1, small,
large; every dtype and memory layout; float32 params and running stats for
16-bit inputs; training and eval; running-stat updates; shard-and-gather;
finite differences; stability; NaN channels; thread-count determinism."""
import itertools

import numpy as np
import pytest

import cynorm
from cynorm import reference as ref
from conftest import DTYPES, DTYPE_IDS
from helpers import BF16, F16, F32, F64, RTOL, as_stored, assert_close, bits, is16, layout, stat_dtype
from norm_helpers import (some, bn_gx_scale, bn_sum_scale, bn_unchan, bn_y_scale, f64, make_affine, make_x,
                          param_dtypes, stat_rtol)

# (shape, channel axis)
CASES = [
    ((4, 3), 1), ((64, 1), 1), ((5, 1, 3), 1), ((2, 3, 7, 7), 1), ((2, 7, 7, 3), -1), ((2, 7, 7, 3), 3),
    ((8, 5, 1000), 1), ((16, 2048), 1), ((4, 512, 2, 2), 1), ((4, 2, 2, 512), -1), ((4, 6, 5, 3), 2),
    ((2, 4, 6, 5, 3), 2), ((2, 4, 6, 5, 3), -1), ((3, 10000), 0), ((2, 1, 100003), 1),
    ((100003, 3), 1), ((3, 3, 50000), 1), ((2, 3, 4, 5), -3), ((700, 37), -1),
    # channel by channel ("fused" training passes): C >= 16, rows >= 128 elements and 1 KiB,
    # a channel <= 1 MiB (float32; (1, 20, 40000) for every dtype); rows of 128 elements
    # under 1 KiB in an input of at most 4 MiB (12x12 planes)
    ((4, 32, 300), 1), ((1, 20, 40000), 1), ((3, 16, 12, 12), 1),
    # short rows of 64 or more elements (below 128 or 1 KiB) reduced as segments: one block of
    # the batch, channels split over tasks; several blocks; a tail after the lanes
    ((2, 40, 70), 1), ((40, 5, 100), 1), ((5, 6, 14, 14), 1), ((3, 4, 64), 1), ((3, 4, 63), 1),
    # columns: bfloat16 reads word pairs over groups of 32 columns and eight rows at a time; two
    # groups and a tail of 6 columns, and a last row block of 8 + 3 rows; a second column chunk
    # (past 8192) of full groups and a tail; channels of 15 columns straddling the groups
    ((203, 70), 1), ((27, 8262), 1), ((203, 16, 3, 5), 1),
]
CASE_IDS = [f"{s}-axis{a}" for s, a in CASES]
KINDS = ("C", "F", "strided")


def nchan(shape, axis):
    return shape[axis % len(shape)]


def variants(dtype):
    """(param dtype or None, running-stat dtype or None)."""
    out = [(None, None)]
    for p in param_dtypes(dtype):
        for r in param_dtypes(dtype):
            out.append((p, r))
    out.append((None, param_dtypes(dtype)[-1]))
    return out


def make_running(rng, C, rdt):
    if rdt is None:
        return None, None
    rm = (rng.standard_normal(C) * 0.5).astype(rdt)
    rv = (rng.random(C) + 0.5).astype(rdt)
    return rm, rv


def running_tol(rdt):
    return RTOL[np.dtype(rdt)] if is16(rdt) else stat_rtol(rdt)


def check_train(x, w, b, rm, rv, momentum=0.1, eps=1e-5, axis=1, what=""):
    dtype = x.dtype
    C = nchan(x.shape, axis)
    rm0 = None if rm is None else rm.copy()
    rv0 = None if rv is None else rv.copy()
    before = [None if a is None else a.copy() for a in (x, w, b)]
    y, sm, si = cynorm.batch_norm(x, w, b, rm, rv, True, momentum, eps, axis)
    for a, a0 in zip((x, w, b), before):
        if a is not None:
            np.testing.assert_array_equal(bits(a), bits(a0))
    y_ref, m_ref, i_ref, rm_ref, rv_ref = ref.batch_norm(x, w, b, rm0, rv0, True, momentum, eps, axis)
    sd = stat_dtype(dtype)
    assert y.shape == x.shape and y.dtype == dtype, what
    assert sm.shape == (C,) and si.shape == (C,) and sm.dtype == sd and si.dtype == sd, what
    assert_close(sm, m_ref, sd, scale=np.abs(m_ref) + 1 / i_ref, rtol=stat_rtol(dtype), what=f"save_mean {what}")
    assert_close(si, i_ref, sd, rtol=stat_rtol(dtype), what=f"save_invstd {what}")
    assert_close(y, y_ref, dtype, scale=bn_y_scale(x, axis, m_ref, i_ref, w, b), what=f"y {what}")
    if rm is not None:
        assert rm.dtype == rm0.dtype and rv.dtype == rv0.dtype
        tol = running_tol(rm.dtype)
        sc_m = (1 - momentum) * np.abs(f64(rm0)) + momentum * (np.abs(m_ref) + 1 / i_ref)
        assert_close(rm, rm_ref, rm.dtype, scale=sc_m, rtol=tol, what=f"running_mean {what}")
        assert_close(rv, rv_ref, rv.dtype, scale=np.abs(rv_ref), rtol=tol, what=f"running_var {what}")
    return y, sm, si


def check_eval(x, w, b, rm, rv, eps=1e-5, axis=1, what=""):
    dtype = x.dtype
    rm0, rv0 = rm.copy(), rv.copy()
    y, sm, si = cynorm.batch_norm(x, w, b, rm, rv, False, 0.1, eps, axis)
    np.testing.assert_array_equal(bits(rm), bits(rm0))
    np.testing.assert_array_equal(bits(rv), bits(rv0))
    y_ref = ref.batch_norm(x, w, b, rm, rv, False, 0.1, eps, axis)[0]
    sd = stat_dtype(dtype)
    assert sm.shape == (0,) and si.shape == (0,) and sm.dtype == sd and si.dtype == sd, what
    assert y.shape == x.shape and y.dtype == dtype
    inv = 1 / np.sqrt(f64(rv) + eps)
    assert_close(y, y_ref, dtype, scale=bn_y_scale(x, axis, rm, inv, w, b), what=f"eval y {what}")
    return y


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis", CASES, ids=CASE_IDS)
def test_forward_matches_reference(shape, axis, dtype, rng):
    C = nchan(shape, axis)
    for ki, kind in enumerate(KINDS):
        for pdt, rdt in some(variants(dtype), shape, ki):
            x = make_x(rng, shape, dtype, kind, scale=2.0, offset=0.5)
            w, b = (None, None) if pdt is None else make_affine(rng, C, pdt)
            rm, rv = make_running(rng, C, rdt)
            what = f"{kind} p={pdt} r={rdt}"
            check_train(x, w, b, rm, rv, axis=axis, what=what)
            if rm is not None:
                check_eval(x, w, b, rm, rv, axis=axis, what=what)


def check_backward(dy, x, w, rm, rv, sm, si, training, eps=1e-5, axis=1, what=""):
    dtype = x.dtype
    C = nchan(x.shape, axis)
    inputs = [a for a in (dy, x, w, rm, rv, sm, si) if a is not None]
    before = [a.copy() for a in inputs]
    gx, gw, gb = cynorm.batch_norm_backward(dy, x, w, rm, rv, sm, si, training, eps, axis=axis)
    for a, a0 in zip(inputs, before):
        np.testing.assert_array_equal(bits(a), bits(a0))
    gx_ref, gw_ref, gb_ref = ref.batch_norm_backward(dy, x, w, rm, rv, sm, si, training, eps, axis)
    gdt = stat_dtype(dtype) if w is None else w.dtype
    assert gx.shape == x.shape and gx.dtype == dtype, what
    assert gw.shape == (C,) and gb.shape == (C,) and gw.dtype == gdt and gb.dtype == gdt, what
    if training:
        mean, invstd = sm, si
    else:
        mean, invstd = rm, 1 / np.sqrt(f64(rv) + eps)
    if training:
        sc = bn_gx_scale(dy, x, axis, mean, invstd, w)
    else:       # grad_x = dy * (w * invstd): no cancellation
        wc = np.ones(C) if w is None else f64(w)
        sc = np.abs(f64(dy)) * bn_unchan(np.abs(wc) * invstd, x.shape, axis)
    assert_close(gx, gx_ref, dtype, scale=sc, what=f"grad_x {what}")
    sw, sb = bn_sum_scale(dy, x, axis, mean, invstd)
    assert_close(gw, gw_ref, gdt, scale=sw, rtol=2 * RTOL[np.dtype(gdt)], what=f"grad_weight {what}")
    assert_close(gb, gb_ref, gdt, scale=sb, rtol=2 * RTOL[np.dtype(gdt)], what=f"grad_bias {what}")
    return gx, gw, gb


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis", CASES, ids=CASE_IDS)
def test_backward_matches_reference(shape, axis, dtype, rng):
    C = nchan(shape, axis)
    for ki, kind in enumerate(KINDS):
        for pdt, rdt in some(variants(dtype), shape, ki):
            x = make_x(rng, shape, dtype, kind, scale=2.0, offset=0.5)
            dy = make_x(rng, shape, dtype, kind)
            w, b = (None, None) if pdt is None else make_affine(rng, C, pdt)
            rm, rv = make_running(rng, C, rdt)
            rm_c = None if rm is None else rm.copy()
            rv_c = None if rv is None else rv.copy()
            _, sm, si = cynorm.batch_norm(x, w, b, rm_c, rv_c, True, 0.1, 1e-5, axis)
            what = f"{kind} p={pdt} r={rdt}"
            check_backward(dy, x, w, rm, rv, sm, si, True, axis=axis, what="train " + what)
            if rm is not None:
                e_sm = np.empty(0, stat_dtype(dtype))
                check_backward(dy, x, w, rm, rv, e_sm, e_sm, False, axis=axis, what="eval " + what)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis", [((8, 4, 30), 1), ((8, 30, 4), -1), ((40, 3), 1)])
def test_running_stats_over_several_steps(shape, axis, dtype, rng):
    C = nchan(shape, axis)
    for rdt in param_dtypes(dtype):
        rm, rv = make_running(rng, C, rdt)
        rm_ref, rv_ref = np.array(rm, np.float64), np.array(rv, np.float64)
        w, b = make_affine(rng, C, param_dtypes(dtype)[-1])
        for step in range(5):
            x = make_x(rng, shape, dtype, scale=1.0 + step, offset=step - 2.0)
            rm_prev = np.array(rm, np.float64)
            y, sm, si = cynorm.batch_norm(x, w, b, rm, rv, True, 0.2, 1e-5, axis)
            _, m_ref, i_ref, rm_ref, rv_ref = ref.batch_norm(x, w, b, rm_ref, rv_ref, True, 0.2, 1e-5, axis)
            tol = running_tol(rdt) * 4
            assert_close(rm, rm_ref, rdt, scale=np.abs(rm_ref) + np.abs(rm_prev) + 1 / i_ref, rtol=tol,
                         what=f"running_mean step {step}")
            assert_close(rv, rv_ref, rdt, rtol=tol, what=f"running_var step {step}")
        # eval mode uses exactly the running stats as they now are
        x = make_x(rng, shape, dtype)
        check_eval(x, w, b, rm, rv, axis=axis, what=f"after steps r={rdt}")


def test_momentum_zero_and_one(rng):
    x = rng.standard_normal((6, 3, 5))
    for m in (0.0, 1.0):
        rm, rv = np.full(3, 0.25), np.full(3, 2.0)
        _, sm, si = cynorm.batch_norm(x, None, None, rm, rv, True, m, 1e-5)
        _, m_ref, _, rm_ref, rv_ref = ref.batch_norm(x, None, None, np.full(3, 0.25), np.full(3, 2.0),
                                                     True, m, 1e-5)
        assert_close(rm, rm_ref, F64, scale=1.0)
        assert_close(rv, rv_ref, F64)
    # only the running mean, only the running var (each is updated on its own)
    rm = np.zeros(3)
    cynorm.batch_norm(x, None, None, rm, None, True, 0.5, 1e-5)
    assert_close(rm, 0.5 * ref.batch_norm_stats(x)[0], F64, scale=1.0)
    rv = np.ones(3)
    cynorm.batch_norm(x, None, None, None, rv, True, 0.5, 1e-5)
    assert_close(rv, ref.batch_norm(x, None, None, None, np.ones(3), True, 0.5, 1e-5)[4], F64)


def _swapped(a):
    return a.astype(a.dtype.newbyteorder("S"))


@pytest.mark.parametrize("kind", ["byteswapped", "list", "read-only"])
def test_running_stats_are_updated_in_place_or_refused(kind, rng):
    """Training must update the caller's running stats: a running stat that
    can only be read through a converted copy (non-native byte order, a list)
    or not written at all is updated in place or refused, never left stale."""
    x = rng.standard_normal((6, 3, 5))
    _, _, _, rm_ref, rv_ref = ref.batch_norm(x, None, None, np.zeros(3), np.ones(3), True, 0.1, 1e-5)
    m, i = ref.batch_norm_stats(x)
    g_rm, g_rv = ref.batch_norm_gather_stats(m[None], i[None], [30], np.zeros(3), np.ones(3), 0.1, 1e-5)[2:]

    def make():
        if kind == "byteswapped":
            return _swapped(np.zeros(3)), _swapped(np.ones(3))
        if kind == "list":
            return [0.0] * 3, [1.0] * 3
        rm, rv = np.zeros(3), np.ones(3)
        rm.flags.writeable = rv.flags.writeable = False
        return rm, rv

    for call, want_m, want_v in (
            (lambda rm, rv: cynorm.batch_norm(x, None, None, rm, rv, True, 0.1, 1e-5), rm_ref, rv_ref),
            (lambda rm, rv: cynorm.batch_norm_gather_stats(m[None], i[None], np.array([30]), rm, rv, 0.1, 1e-5),
             g_rm, g_rv)):
        rm, rv = make()
        try:
            call(rm, rv)
        except (TypeError, ValueError):
            continue
        assert_close(np.asarray(rm, np.float64), want_m, F64, scale=1.0, what=f"{kind} running_mean")
        assert_close(np.asarray(rv, np.float64), want_v, F64, what=f"{kind} running_var")
    # eval only reads them
    rm, rv = make()
    y = cynorm.batch_norm(x, None, None, rm, rv, False, 0.1, 1e-5)[0]
    assert_close(y, x / np.sqrt(1 + 1e-5), F64)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_output_mask(dtype, rng):
    shape = (6, 4, 9)
    x = make_x(rng, shape, dtype)
    dy = make_x(rng, shape, dtype)
    w, b = make_affine(rng, 4, param_dtypes(dtype)[-1])
    rm, rv = make_running(rng, 4, param_dtypes(dtype)[-1])
    _, sm, si = cynorm.batch_norm(x, w, b, rm.copy(), rv.copy(), True, 0.1, 1e-5)
    for training in (True, False):
        full = cynorm.batch_norm_backward(dy, x, w, rm, rv, sm, si, training, 1e-5)
        for mask in itertools.product((True, False), repeat=3):
            got = cynorm.batch_norm_backward(dy, x, w, rm, rv, sm, si, training, 1e-5, output_mask=mask)
            assert len(got) == 3
            for on, g, f in zip(mask, got, full):
                if on:
                    np.testing.assert_array_equal(bits(g), bits(f))
                else:
                    assert g is None


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_out_argument(dtype, rng):
    shape = (5, 6, 7)
    x = make_x(rng, shape, dtype)
    w, b = make_affine(rng, 6, dtype)
    sd = stat_dtype(dtype)
    y0, m0, i0 = cynorm.batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
    for keep in itertools.product((True, False), repeat=3):
        outs = tuple(np.full(s, 3, d) if k else None for k, s, d in zip(keep, (shape, (6,), (6,)), (dtype, sd, sd)))
        got = cynorm.batch_norm(x, w, b, None, None, True, 0.1, 1e-5, out=outs)
        for g, o, want in zip(got, outs, (y0, m0, i0)):
            if o is not None:
                assert g is o
            np.testing.assert_array_equal(bits(g), bits(want))
    # eval: the y output
    rm, rv = make_running(rng, 6, param_dtypes(dtype)[-1])
    ye = cynorm.batch_norm(x, w, b, rm, rv, False)[0]
    yo = np.empty(shape, dtype)
    assert cynorm.batch_norm(x, w, b, rm, rv, False, out=(yo, None, None))[0] is yo
    np.testing.assert_array_equal(bits(yo), bits(ye))
    # elemt / backward_elemt
    yo = np.empty(shape, dtype)
    assert cynorm.batch_norm_elemt(x, w, b, m0, i0, out=yo) is yo
    np.testing.assert_array_equal(bits(yo), bits(cynorm.batch_norm_elemt(x, w, b, m0, i0)))
    dy = make_x(rng, shape, dtype)
    sdy, sdx, _, _ = cynorm.batch_norm_backward_reduce(dy, x, m0, i0, w)
    count = np.array([35], np.int32)
    go = np.empty(shape, dtype)
    assert cynorm.batch_norm_backward_elemt(dy, x, m0, i0, w, sdy, sdx, count, out=go) is go
    np.testing.assert_array_equal(bits(go), bits(cynorm.batch_norm_backward_elemt(dy, x, m0, i0, w, sdy, sdx, count)))


def test_defaults(rng):
    x = rng.standard_normal((6, 3, 4))
    y, sm, si = cynorm.batch_norm(x)
    y_ref, m_ref, i_ref, _, _ = ref.batch_norm(x, None, None, None, None, True, 0.1, 1e-5)
    assert_close(y, y_ref, F64, scale=4.0)
    assert_close(si, i_ref, F64)
    gx, gw, gb = cynorm.batch_norm_backward(x, x, None, None, None, sm, si, True)
    assert gw.dtype == F64 and gw.shape == (3,)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis", [((0, 3, 4), 1), ((0, 3), 1), ((2, 3, 0), 1), ((0, 4, 3), -1)])
def test_zero_size_batch(shape, axis, dtype, rng):
    C = nchan(shape, axis)
    sd = stat_dtype(dtype)
    x = np.zeros(shape, dtype)
    w, b = make_affine(rng, C, param_dtypes(dtype)[-1])
    rm, rv = make_running(rng, C, param_dtypes(dtype)[-1])
    rm0, rv0 = rm.copy(), rv.copy()
    y, sm, si = cynorm.batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5, axis)
    assert y.shape == shape and y.dtype == dtype
    assert sm.shape == (C,) and sm.dtype == sd and np.isnan(sm).all() and np.isnan(si).all()
    np.testing.assert_array_equal(bits(rm), bits(rm0))
    np.testing.assert_array_equal(bits(rv), bits(rv0))
    for training in (True, False):
        gx, gw, gb = cynorm.batch_norm_backward(x, x, w, rm, rv, sm, si, training, 1e-5, axis=axis)
        assert gx.shape == shape and gw.shape == (C,) and gb.shape == (C,)
        np.testing.assert_array_equal(gw.astype(np.float64), np.zeros(C))
        np.testing.assert_array_equal(gb.astype(np.float64), np.zeros(C))
    y = cynorm.batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5, axis)[0]
    assert y.shape == shape


# ------------------------------------------------------------ finite differences

def _numeric(loss, args, which, h=1e-6):
    base = args[which]
    num = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        e = np.zeros_like(base)
        e[idx] = h
        plus, minus = list(args), list(args)
        plus[which] = base + e
        minus[which] = base - e
        num[idx] = (loss(*plus) - loss(*minus)) / (2 * h)
    return num


@pytest.mark.parametrize("shape,axis", [((4, 3, 2), 1), ((3, 2, 4), -1), ((5, 2), 1), ((2, 3, 2, 2), 2)])
def test_training_backward_matches_central_differences(shape, axis, rng):
    C = nchan(shape, axis)
    x = rng.standard_normal(shape) * 1.5 + 0.3
    w, b = make_affine(rng, C, F64)
    R = rng.standard_normal(shape)

    def loss(xx, ww, bb):
        return float(np.sum(R * cynorm.batch_norm(xx, ww, bb, None, None, True, 0.1, 1e-5, axis)[0]))

    _, sm, si = cynorm.batch_norm(x, w, b, None, None, True, 0.1, 1e-5, axis)
    gx, gw, gb = cynorm.batch_norm_backward(R, x, w, None, None, sm, si, True, 1e-5, axis=axis)
    args = [x, w, b]
    np.testing.assert_allclose(gx, _numeric(loss, args, 0), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gw, _numeric(loss, args, 1), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gb, _numeric(loss, args, 2), rtol=1e-6, atol=1e-8)
    # the split path computes the same gradient
    sdy, sdx, gw2, gb2 = cynorm.batch_norm_backward_reduce(R, x, sm, si, w, axis=axis)
    count = np.array([x.size // C])
    gx2 = cynorm.batch_norm_backward_elemt(R, x, sm, si, w, sdy, sdx, count, axis=axis)
    np.testing.assert_allclose(gx2, _numeric(loss, args, 0), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gw2, _numeric(loss, args, 1), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gb2, _numeric(loss, args, 2), rtol=1e-6, atol=1e-8)
    # and the twin
    gx3, gw3, gb3 = ref.batch_norm_backward(R, x, w, None, None, sm, si, True, 1e-5, axis)
    np.testing.assert_allclose(gx3, _numeric(loss, args, 0), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("shape,axis", [((4, 3, 2), 1), ((3, 2, 4), -1)])
def test_eval_backward_matches_central_differences(shape, axis, rng):
    C = nchan(shape, axis)
    x = rng.standard_normal(shape)
    w, b = make_affine(rng, C, F64)
    rm, rv = make_running(rng, C, F64)
    R = rng.standard_normal(shape)

    def loss(xx, ww, bb):
        return float(np.sum(R * cynorm.batch_norm(xx, ww, bb, rm, rv, False, 0.1, 1e-5, axis)[0]))

    e = np.empty(0)
    gx, gw, gb = cynorm.batch_norm_backward(R, x, w, rm, rv, e, e, False, 1e-5, axis=axis)
    args = [x, w, b]
    np.testing.assert_allclose(gx, _numeric(loss, args, 0), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gw, _numeric(loss, args, 1), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gb, _numeric(loss, args, 2), rtol=1e-6, atol=1e-8)


# ------------------------------------------------------------ split-statistics ops

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis", [((4, 3), 1), ((2, 3, 7, 7), 1), ((2, 7, 7, 3), -1), ((8, 5, 1000), 1),
                                        ((16, 2048), 1), ((4, 6, 5, 3), 2), ((2, 1, 100003), 1)])
def test_split_ops_match_reference(shape, axis, dtype, rng):
    C = nchan(shape, axis)
    sd = stat_dtype(dtype)
    for kind in KINDS:
        x = make_x(rng, shape, dtype, kind, scale=2.0, offset=0.5)
        dy = make_x(rng, shape, dtype, kind)
        w, b = make_affine(rng, C, param_dtypes(dtype)[-1])
        x0, dy0 = x.copy(), dy.copy()
        mean, invstd = cynorm.batch_norm_stats(x, 1e-5, axis)
        m_ref, i_ref = ref.batch_norm_stats(x, 1e-5, axis)
        assert mean.shape == (C,) and mean.dtype == sd and invstd.dtype == sd
        assert_close(mean, m_ref, sd, scale=np.abs(m_ref) + 1 / i_ref, rtol=stat_rtol(dtype), what="stats mean")
        assert_close(invstd, i_ref, sd, rtol=stat_rtol(dtype), what="stats invstd")
        # the same statistics batch_norm saves
        _, sm, si = cynorm.batch_norm(x, None, None, None, None, True, 0.1, 1e-5, axis)
        assert_close(mean, sm, sd, scale=np.abs(m_ref) + 1 / i_ref, rtol=stat_rtol(dtype))
        assert_close(invstd, si, sd, rtol=stat_rtol(dtype))

        y = cynorm.batch_norm_elemt(x, w, b, mean, invstd, 1e-5, axis)
        y_ref = ref.batch_norm_elemt(x, w, b, mean, invstd, axis)
        assert y.shape == x.shape and y.dtype == dtype
        assert_close(y, y_ref, dtype, scale=bn_y_scale(x, axis, mean, invstd, w, b), what="elemt")

        sdy, sdx, gw, gb = cynorm.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, True, True, axis)
        r = ref.batch_norm_backward_reduce(dy, x, mean, invstd, w, axis)
        sw, sb = bn_sum_scale(dy, x, axis, mean, invstd)
        assert sdy.shape == (C,) and sdx.shape == (C,) and gw.shape == (C,) and gb.shape == (C,)
        assert sdy.dtype == sd and sdx.dtype == sd and gw.dtype == w.dtype and gb.dtype == w.dtype
        assert_close(sdy, r[0], sd, scale=sb, rtol=2 * stat_rtol(dtype), what="sum_dy")
        assert_close(sdx, r[1], sd, scale=sw / f64(invstd), rtol=2 * stat_rtol(dtype), what="sum_dy_xmu")
        assert_close(gw, r[2], gw.dtype, scale=sw, rtol=2 * RTOL[gw.dtype], what="reduce grad_weight")
        assert_close(gb, r[3], gb.dtype, scale=sb, rtol=2 * RTOL[gb.dtype], what="reduce grad_bias")
        for mask in itertools.product((True, False), repeat=3):
            got = cynorm.batch_norm_backward_reduce(dy, x, mean, invstd, w, *mask, axis=axis)
            assert len(got) == 4
            assert (got[0] is None) == (got[1] is None) == (not mask[0])
            assert (got[2] is None) == (not mask[1]) and (got[3] is None) == (not mask[2])

        n = x.size // C
        for count in (np.array([n], np.int64), np.array([n], np.int32), np.array([float(n)]),
                      np.array([n // 2, n - n // 2], np.int64)):
            gx = cynorm.batch_norm_backward_elemt(dy, x, mean, invstd, w, sdy, sdx, count, axis)
            gx_ref = ref.batch_norm_backward_elemt(dy, x, mean, invstd, w, sdy, sdx, count, axis)
            assert gx.shape == x.shape and gx.dtype == dtype
            assert_close(gx, gx_ref, dtype, scale=bn_gx_scale(dy, x, axis, mean, invstd, w), what="backward_elemt")
        np.testing.assert_array_equal(bits(x), bits(x0))
        np.testing.assert_array_equal(bits(dy), bits(dy0))


@pytest.mark.parametrize("dtype", [F64, F32], ids=str)
def test_gather_stats_matches_reference(dtype, rng):
    W, C = 5, 7
    means = (rng.standard_normal((W, C)) * 3).astype(dtype)
    invstd = (rng.random((W, C)) + 0.2).astype(dtype)
    for counts in (np.array([3, 10, 1, 100, 7]), np.array([3.0, 10.0, 1.0, 100.0, 7.0]),
                   np.array([3, 0, 1, 100, 0], np.int32)):
        ms = means.copy()
        if (counts == 0).any():
            ms[np.asarray(counts) == 0] = np.nan     # an empty shard's stats are NaN
        rm, rv = make_running(rng, C, dtype)
        rm_ref, rv_ref = np.array(rm, np.float64), np.array(rv, np.float64)
        m, i = cynorm.batch_norm_gather_stats(ms, invstd, counts, rm, rv, 0.1, 1e-5)
        m_ref, i_ref, rm_ref, rv_ref = ref.batch_norm_gather_stats(ms, invstd, counts, rm_ref, rv_ref, 0.1, 1e-5)
        assert m.shape == (C,) and i.shape == (C,) and m.dtype == dtype and i.dtype == dtype
        tol = 1e-12 if dtype == F64 else 1e-5
        assert_close(m, m_ref, dtype, scale=np.abs(m_ref) + 1 / i_ref, rtol=tol, what="gather mean")
        assert_close(i, i_ref, dtype, rtol=tol, what="gather invstd")
        assert_close(rm, rm_ref, dtype, scale=np.abs(rm_ref) + 1 / i_ref, rtol=tol, what="gather running_mean")
        assert_close(rv, rv_ref, dtype, rtol=tol, what="gather running_var")
        # without running stats
        m2, i2 = cynorm.batch_norm_gather_stats(ms, invstd, counts)
        np.testing.assert_array_equal(m2, m)
        np.testing.assert_array_equal(i2, i)


SHARDS = [3, 0, 1, 6]       # uneven shards along the batch axis, one empty


@pytest.mark.parametrize("axis", [1, -1])
@pytest.mark.parametrize("counts_dtype", [np.int64, np.float64])
def test_shard_and_gather_equals_whole_batch(axis, counts_dtype, rng):
    shape = (sum(SHARDS), 4, 6) if axis == 1 else (sum(SHARDS), 6, 4)
    C = 4
    eps, momentum = 1e-5, 0.1
    x = rng.standard_normal(shape) * 2 + 1.5
    dy = rng.standard_normal(shape)
    w, b = make_affine(rng, C, F64)
    rm0, rv0 = make_running(rng, C, F64)
    edges = np.cumsum([0] + SHARDS)
    parts = [slice(edges[k], edges[k + 1]) for k in range(len(SHARDS))]

    # whole batch
    rm_w, rv_w = rm0.copy(), rv0.copy()
    y_w, sm_w, si_w = cynorm.batch_norm(x, w, b, rm_w, rv_w, True, momentum, eps, axis)
    gx_w, gw_w, gb_w = cynorm.batch_norm_backward(dy, x, w, None, None, sm_w, si_w, True, eps, axis=axis)

    # shards
    stats = [cynorm.batch_norm_stats(x[p], eps, axis) for p in parts]
    means = np.stack([s[0] for s in stats])
    invstds = np.stack([s[1] for s in stats])
    counts = np.array([x[p].size // C for p in parts], counts_dtype)
    assert counts[1] == 0
    rm_s, rv_s = rm0.copy(), rv0.copy()
    mean, invstd = cynorm.batch_norm_gather_stats(means, invstds, counts, rm_s, rv_s, momentum, eps)
    assert_close(mean, sm_w, F64, scale=np.abs(sm_w) + 1 / si_w, rtol=1e-12, what="mean")
    assert_close(invstd, si_w, F64, rtol=1e-12, what="invstd")
    assert_close(rm_s, rm_w, F64, scale=np.abs(rm_w) + 1 / si_w, rtol=1e-12, what="running_mean")
    assert_close(rv_s, rv_w, F64, rtol=1e-12, what="running_var")

    y_s = np.concatenate([cynorm.batch_norm_elemt(x[p], w, b, mean, invstd, eps, axis) for p in parts])
    assert_close(y_s, y_w, F64, scale=bn_y_scale(x, axis, sm_w, si_w, w, b), rtol=1e-12, what="y")

    reds = [cynorm.batch_norm_backward_reduce(dy[p], x[p], mean, invstd, w, True, True, True, axis)
            for p in parts]
    np.testing.assert_array_equal(reds[1][0], np.zeros(C))     # the empty shard adds nothing
    np.testing.assert_array_equal(reds[1][1], np.zeros(C))
    sum_dy = sum(r[0] for r in reds)
    sum_dy_xmu = sum(r[1] for r in reds)
    gw_s = sum(r[2] for r in reds)
    gb_s = sum(r[3] for r in reds)
    sw, sb = bn_sum_scale(dy, x, axis, sm_w, si_w)
    assert_close(gw_s, gw_w, F64, scale=sw, rtol=1e-12, what="grad_weight")
    assert_close(gb_s, gb_w, F64, scale=sb, rtol=1e-12, what="grad_bias")
    gxs = [cynorm.batch_norm_backward_elemt(dy[p], x[p], mean, invstd, w, sum_dy, sum_dy_xmu, counts, axis)
           for p in parts]
    assert gxs[1].shape == x[parts[1]].shape
    gx_s = np.concatenate(gxs)
    assert_close(gx_s, gx_w, F64, scale=bn_gx_scale(dy, x, axis, sm_w, si_w, w), rtol=1e-12, what="grad_x")


# ------------------------------------------------------------ stability, NaN, threads

@pytest.mark.parametrize("shape,axis", [((64, 8, 512), 1), ((64, 512, 8), -1), ((100003, 3), 1),
                                        ((2, 3, 100003), 1)])
def test_variance_is_stable_with_a_large_offset(shape, axis, rng):
    x = (1e4 + rng.standard_normal(shape)).astype(np.float32)
    C = nchan(shape, axis)
    eps = 1e-5
    rm, rv = np.zeros(C, np.float32), np.ones(C, np.float32)
    _, sm, si = cynorm.batch_norm(x, None, None, rm, rv, True, 1.0, eps, axis)
    _, m_ref, i_ref, rm_ref, rv_ref = ref.batch_norm(x, None, None, np.zeros(C), np.ones(C), True, 1.0, eps, axis)
    var = 1.0 / si.astype(np.float64) ** 2 - eps
    var_ref = 1.0 / i_ref ** 2 - eps
    assert np.max(np.abs(var - var_ref) / var_ref) <= 1e-4
    assert np.max(np.abs(rv - rv_ref) / rv_ref) <= 1e-4
    assert np.max(np.abs(sm - m_ref)) <= 1e-6 * 1e4
    m2, i2 = cynorm.batch_norm_stats(x, eps, axis)
    var2 = 1.0 / i2.astype(np.float64) ** 2 - eps
    assert np.max(np.abs(var2 - var_ref) / var_ref) <= 1e-4


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("shape,axis,chan", [((8, 4, 50), 1, 2), ((8, 50, 4), -1, 1), ((3, 3, 50000), 1, 0),
                                             ((4, 2, 2, 512), -1, 300)])
def test_nan_poisons_only_its_channel(shape, axis, chan, dtype, rng):
    C = nchan(shape, axis)
    ax = axis % len(shape)
    x = make_x(rng, shape, dtype)
    dy = make_x(rng, shape, dtype)
    w, b = make_affine(rng, C, param_dtypes(dtype)[-1])
    xn = x.copy()
    idx = tuple(chan if i == ax else s // 2 for i, s in enumerate(shape))
    xn[idx] = np.nan
    rm_c, rv_c = make_running(rng, C, F32)
    rm_d, rv_d = rm_c.copy(), rv_c.copy()
    yc, smc, sic = cynorm.batch_norm(x, w, b, rm_c, rv_c, True, 0.1, 1e-5, axis)
    yd, smd, sid = cynorm.batch_norm(xn, w, b, rm_d, rv_d, True, 0.1, 1e-5, axis)
    others = np.arange(C) != chan
    for c, d in ((smc, smd), (sic, sid), (rm_c, rm_d), (rv_c, rv_d)):
        assert np.isnan(d[chan])
        np.testing.assert_array_equal(bits(d[others]), bits(c[others]))
    yc2, yd2 = np.moveaxis(yc, ax, 0), np.moveaxis(yd, ax, 0)
    assert np.isnan(yd2[chan].astype(np.float32)).all()
    np.testing.assert_array_equal(bits(yd2[others]), bits(yc2[others]))
    gc = cynorm.batch_norm_backward(dy, x, w, None, None, smc, sic, True, 1e-5, axis=axis)
    gd = cynorm.batch_norm_backward(dy, xn, w, None, None, smd, sid, True, 1e-5, axis=axis)
    gc0, gd0 = np.moveaxis(gc[0], ax, 0), np.moveaxis(gd[0], ax, 0)
    assert np.isnan(gd0[chan].astype(np.float32)).all()
    np.testing.assert_array_equal(bits(gd0[others]), bits(gc0[others]))
    np.testing.assert_array_equal(bits(gd[1][others]), bits(gc[1][others]))
    np.testing.assert_array_equal(bits(gd[2]), bits(gc[2]))     # grad_bias ignores x


DET_CASES = [((2, 3, 7, 7), 1, "C"), ((2, 7, 7, 3), -1, "C"), ((8, 5, 1000), 1, "C"), ((16, 2048), 1, "C"),
             ((3, 3, 50000), 1, "C"), ((4, 6, 5, 3), 2, "F"), ((100003, 3), 1, "C"), ((300, 3), 1, "F"),
             ((6, 3, 40), 1, "strided"), ((2, 1, 100003), 1, "C"), ((4, 32, 300), 1, "C"),
             ((1, 20, 40000), 1, "C"), ((2, 40, 70), 1, "C"), ((40, 5, 100), 1, "strided"),
             ((5, 6, 14, 14), 1, "F"),
             # column layouts: two column chunks per row (8192 + 1), B > 1 short rows
             ((37, 8193), 1, "C"), ((203, 16, 3, 5), 1, "C"),
             # a small batch of short rows: fewer column tasks than threads,
             # so narrower ones (whole bfloat16 pair groups, a partial last)
             ((16, 512, 4, 4), 1, "C"), ((4, 37, 5, 5), 1, "C"), ((3, 7, 11), 1, "C")]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis,kind", DET_CASES, ids=[f"{s}-{a}-{k}" for s, a, k in DET_CASES])
def test_bitwise_identical_for_any_thread_count(shape, axis, kind, dtype, rng, restore_threads,
                                                team_always):
    C = nchan(shape, axis)
    x = make_x(rng, shape, dtype, kind)
    dy = make_x(rng, shape, dtype, kind)
    w, b = make_affine(rng, C, param_dtypes(dtype)[-1])
    rm0, rv0 = make_running(rng, C, param_dtypes(dtype)[-1])
    results = []
    for t in (1, 2, 3):
        cynorm.set_num_threads(t)
        rm, rv = rm0.copy(), rv0.copy()
        y, sm, si = cynorm.batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5, axis)
        ye = cynorm.batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5, axis)[0]
        g = cynorm.batch_norm_backward(dy, x, w, rm, rv, sm, si, True, 1e-5, axis=axis)
        ge = cynorm.batch_norm_backward(dy, x, w, rm, rv, sm[:0], si[:0], False, 1e-5, axis=axis)
        ms, ist = cynorm.batch_norm_stats(x, 1e-5, axis)
        red = cynorm.batch_norm_backward_reduce(dy, x, ms, ist, w, True, True, True, axis)
        gxe = cynorm.batch_norm_backward_elemt(dy, x, ms, ist, w, red[0], red[1], np.array([x.size // C]), axis)
        results.append([bits(a).copy() for a in (y, sm, si, rm, rv, ye, *g, *ge, ms, ist, *red, gxe)])
    for other in results[1:]:
        for a, b_ in zip(results[0], other):
            np.testing.assert_array_equal(a, b_)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_many_channel_and_spatial_sizes(dtype, rng):
    for C in (1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 65, 129):
        for hw in (1, 2, 3, 5, 8, 16, 17, 49, 64, 255, 1031):
            for axis in (1, -1):
                shape = (3, C, hw) if axis == 1 else (3, hw, C)
                x = make_x(rng, shape, dtype, offset=1.0)
                w, b = make_affine(rng, C, param_dtypes(dtype)[-1])
                rm, rv = make_running(rng, C, param_dtypes(dtype)[-1])
                _, sm, si = check_train(x, w, b, rm, rv, axis=axis, what=f"{shape} axis={axis}")
                dy = make_x(rng, shape, dtype)
                check_backward(dy, x, w, None, None, sm, si, True, axis=axis, what=f"{shape} axis={axis}")


def test_16bit_params_match_their_float32_casts(rng):
    for dtype in (BF16, F16):
        x = make_x(rng, (9, 5, 8), dtype)
        dy = make_x(rng, (9, 5, 8), dtype)
        w, b = make_affine(rng, 5, dtype)
        a = cynorm.batch_norm(x, w, b, None, None, True)
        c = cynorm.batch_norm(x, w.astype(F32), b.astype(F32), None, None, True)
        for u, v in zip(a, c):
            np.testing.assert_array_equal(bits(u), bits(v))
        ga = cynorm.batch_norm_backward(dy, x, w, None, None, a[1], a[2], True)
        gc = cynorm.batch_norm_backward(dy, x, w.astype(F32), None, None, a[1], a[2], True)
        np.testing.assert_array_equal(bits(ga[0]), bits(gc[0]))
        assert ga[1].dtype == dtype and gc[1].dtype == F32
        np.testing.assert_array_equal(bits(ga[1]), bits(gc[1].astype(dtype)))
        # 16-bit running stats are updated in their own dtype
        rm, rv = np.zeros(5, dtype), np.ones(5, dtype)
        rm32, rv32 = np.zeros(5, F32), np.ones(5, F32)
        cynorm.batch_norm(x, None, None, rm, rv, True, 0.1)
        cynorm.batch_norm(x, None, None, rm32, rv32, True, 0.1)
        assert rm.dtype == dtype
        assert_close(rm, as_stored(rm32, dtype), dtype, scale=np.abs(rm32) + 0.1)
        assert_close(rv, as_stored(rv32, dtype), dtype)


@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=str)
@pytest.mark.parametrize("axis", [1, -1])
def test_grad_out_and_x_in_different_layouts(axis, dtype, rng):
    shape = (6, 5, 40)
    C = shape[axis]
    x = make_x(rng, shape, dtype)
    dy = make_x(rng, shape, dtype)
    w, _ = make_affine(rng, C, param_dtypes(dtype)[-1])
    _, sm, si = cynorm.batch_norm(x, None, None, None, None, True, 0.1, 1e-5, axis)
    n = x.size // C
    for kx, kdy in (("C", "F"), ("F", "C"), ("F", "strided"), ("strided", "C")):
        xx, dd = layout(x, kx), layout(dy, kdy)
        check_backward(dd, xx, w, None, None, sm, si, True, axis=axis, what=f"x {kx} dy {kdy}")
        sdy, sdx, _, _ = cynorm.batch_norm_backward_reduce(dd, xx, sm, si, w, True, True, True, axis)
        gx = cynorm.batch_norm_backward_elemt(dd, xx, sm, si, w, sdy, sdx, np.array([n]), axis)
        gx_ref = ref.batch_norm_backward_elemt(dy, x, sm, si, w, sdy, sdx, [n], axis)
        assert_close(gx, gx_ref, dtype, scale=bn_gx_scale(dy, x, axis, sm, si, w), what=f"elemt x {kx} dy {kdy}")


@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=str)
@pytest.mark.parametrize("last_shape", [(6, 7, 9, 5), (3, 4, 6, 5, 8)], ids=str)
def test_channels_last_memory_seen_channels_first_is_read_in_place(last_shape, dtype, rng):
    """A channels-last array seen as (N, C, ...) with axis=1 (a channels_last
    torch tensor's view): read in place, as the same memory with axis=-1 is
    (the same bits), its input-shaped outputs in the same memory order; the
    split-statistics ops too.  With grad_out in another layout, both are
    taken in C order."""
    xl = make_x(rng, last_shape, dtype)
    dyl = make_x(rng, last_shape, dtype)
    C = last_shape[-1]
    x, dy = np.moveaxis(xl, -1, 1), np.moveaxis(dyl, -1, 1)
    assert not x.flags.c_contiguous and not x.flags.f_contiguous
    w, b = make_affine(rng, C, param_dtypes(dtype)[-1])
    stat = np.float64 if dtype == F64 else np.float32

    def same(a, b, what):
        for u, v in zip(a, b):
            np.testing.assert_array_equal(bits(u), bits(v), err_msg=what)

    def back(a):          # an input-shaped output of the view, in the kernels' order
        assert np.shares_memory(a, np.moveaxis(a, 1, -1))
        assert np.moveaxis(a, 1, -1).flags.c_contiguous, a.strides
        return np.moveaxis(a, 1, -1)

    for training in (True, False):
        rm, rv = np.zeros(C, stat), np.ones(C, stat)
        rml, rvl = rm.copy(), rv.copy()
        got = cynorm.batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5, 1)
        want = cynorm.batch_norm(xl, w, b, rml, rvl, training, 0.1, 1e-5, -1)
        same((back(got[0]),) + got[1:] + (rm, rv), want + (rml, rvl), f"forward {training}")
        sm, si = (want[1], want[2]) if training else (None, None)
        got = cynorm.batch_norm_backward(dy, x, w, rm, rv, sm, si, training, 1e-5,
                                         (True, True, True), 1)
        want = cynorm.batch_norm_backward(dyl, xl, w, rm, rv, sm, si, training, 1e-5,
                                          (True, True, True), -1)
        same((back(got[0]),) + got[1:], want, f"backward {training}")
    m, i = cynorm.batch_norm_stats(x, 1e-5, 1)
    same((m, i), cynorm.batch_norm_stats(xl, 1e-5, -1), "stats")
    same((back(cynorm.batch_norm_elemt(x, w, b, m, i, 1e-5, 1)),),
         (cynorm.batch_norm_elemt(xl, w, b, m, i, 1e-5, -1),), "elemt")
    red = cynorm.batch_norm_backward_reduce(dy, x, m, i, w, True, True, True, 1)
    same(red, cynorm.batch_norm_backward_reduce(dyl, xl, m, i, w, True, True, True, -1), "reduce")
    count = np.array([x.size // C])
    gx = cynorm.batch_norm_backward_elemt(dy, x, m, i, w, red[0], red[1], count, 1)
    same((back(gx),), (cynorm.batch_norm_backward_elemt(dyl, xl, m, i, w, red[0], red[1], count,
                                                         -1),), "backward_elemt")
    # grad_out in C order: the inputs have no common order, x is copied to
    # C order, and the results are C order's
    sm, si = cynorm.batch_norm(xl, w, b, None, None, True, 0.1, 1e-5, -1)[1:]
    dyc, xc = np.ascontiguousarray(dy), np.ascontiguousarray(x)
    got = cynorm.batch_norm_backward(dyc, x, w, None, None, sm, si, True, 1e-5,
                                     (True, True, True), 1)
    assert got[0].flags.c_contiguous
    same(got, cynorm.batch_norm_backward(dyc, xc, w, None, None, sm, si, True, 1e-5,
                                         (True, True, True), 1), "mixed layouts")


@pytest.mark.parametrize("shape,axis", [((2, 0, 200), 1), ((2, 0, 5), 1), ((2, 200, 0), -1), ((4, 0), 1)])
def test_zero_channels(shape, axis):
    x = np.ones(shape, np.float32)
    y, sm, si = cynorm.batch_norm(x, axis=axis)
    assert y.shape == shape and sm.shape == (0,) and si.shape == (0,)
    gx, gw, gb = cynorm.batch_norm_backward(x, x, None, None, None, sm, si, True, axis=axis)
    assert gx.shape == shape and gw.shape == (0,) and gb.shape == (0,)
    m, i = cynorm.batch_norm_stats(x, axis=axis)
    assert m.shape == (0,) and i.shape == (0,)
    sums = cynorm.batch_norm_backward_reduce(x, x, m, i, None, axis=axis)
    assert all(s.shape == (0,) for s in sums)


@pytest.mark.parametrize("shape", [(2, 3, 200), (2, 16, 200), (64, 3)])
def test_outputs_overlapping_x(shape, rng):
    """Statistics written into x's memory, or running stats that live in x,
    must not change y: x is read from a private copy."""
    x = rng.standard_normal(shape) + 5
    C = shape[1]
    want = ref.batch_norm(x, None, None, np.zeros(C), np.ones(C), True, 0.1, 1e-5)
    xx = x.copy()
    y, _, _ = cynorm.batch_norm(xx, out=(None, xx.reshape(-1)[:C], None))
    assert_close(y, want[0], F64, scale=4.0)
    xx = x.copy()
    rm = xx.reshape(-1)[:C]
    want_rm = ref.batch_norm(x, None, None, rm.copy(), np.ones(C), True, 0.1, 1e-5)[3]
    y, _, _ = cynorm.batch_norm(xx, None, None, rm, np.ones(C), True)
    assert_close(y, want[0], F64, scale=4.0)
    assert_close(rm, want_rm, F64, scale=1.0)


@pytest.mark.parametrize("training", [False, True])
def test_bfloat16_short_channel_rows_from_any_channel(training, team_always, restore_threads):
    # planes of 64-128 values (here 99) go several channels to one bfloat16
    # pack; at 2 threads the second worker's rows start at channel 3 of 7
    # (rows 10.., 21 rows): same bits as one thread, and within one
    # bfloat16 rounding of the float64 reference, forward and backward
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((3, 7, 9, 11)) * 2 + 1).astype(BF16)
    dy = rng.standard_normal(x.shape).astype(BF16)
    w, b = rng.standard_normal(7).astype(F32), rng.standard_normal(7).astype(F32)
    rm, rv = rng.standard_normal(7).astype(F32), (rng.random(7) + 0.5).astype(F32)

    def run():
        y, sm, si = cynorm.batch_norm(x, w, b, rm.copy(), rv.copy(), training)
        gx = cynorm.batch_norm_backward(dy, x, w, rm, rv, sm, si, training)[0]
        return y, gx

    cynorm.set_num_threads(1)
    y1, gx1 = run()
    cynorm.set_num_threads(2)
    y2, gx2 = run()
    np.testing.assert_array_equal(bits(y2), bits(y1))
    np.testing.assert_array_equal(bits(gx2), bits(gx1))
    ry, rmean, rinv = ref.batch_norm(x.astype(F64), w, b, rm, rv, training, 0.1, 1e-5)[:3]
    np.testing.assert_allclose(y1.astype(F64), ry, rtol=2.0**-8, atol=1e-6)
    if not training:
        rmean, rinv = rm.astype(F64), 1 / np.sqrt(rv.astype(F64) + 1e-5)
    rgx = ref.batch_norm_backward(dy.astype(F64), x.astype(F64), w, rm, rv, rmean, rinv,
                                  training, 1e-5)[0]
    np.testing.assert_allclose(gx1.astype(F64), rgx, rtol=2.0**-8, atol=1e-3 * np.abs(rgx).max())
