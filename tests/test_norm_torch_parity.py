"""Layer norm and batch norm against PyTorch 2.13 (CPU) where it is installed.

torch sums float32/bfloat16 statistics in float32 and returns bfloat16
statistics for bfloat16 inputs (cynorm: float32), so the statistics are
compared with a float32 (or bfloat16) tolerance and each backward is fed the
statistics torch saved, so that both compute from the same numbers."""
import numpy as np
import pytest

import cynorm
from conftest import requires_torch
from helpers import BF16, F16, F32, F64, RTOL, assert_close
from norm_helpers import bn_gx_scale, bn_sum_scale, bn_y_scale, f64, ln_gx_scale, ln_rows, ln_y_scale

pytestmark = [pytest.mark.torch, requires_torch]


@pytest.fixture(scope="module")
def torch():
    import torch
    return torch


def to_torch(torch, a):
    if a is None:
        return None
    if a.dtype == BF16:    # exact: every bfloat16 is a float32
        return torch.from_numpy(np.ascontiguousarray(a.astype(np.float32))).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a).copy())


def to_numpy(t, dtype=None):
    import torch
    if t is None:
        return None
    if t.dtype == torch.bfloat16:
        a = t.detach().to(torch.float32).numpy().astype(BF16)
    else:
        a = t.detach().numpy().copy()
    return a if dtype is None else a.astype(dtype)


# torch vs cynorm: both round float32 results, from statistics that differ in
# their last bits (float32 vs float64 sums)
TOL = {F64: 1e-11, F32: 1e-5, BF16: 1.6e-2, F16: 2e-3}
STAT_TOL = {F64: 1e-11, F32: 1e-5, BF16: 8e-3, F16: 1e-5}

LN_CASES = [((8, 1024), (1024,)), ((64, 300), (300,)), ((3, 4, 5), (4, 5)), ((2, 3, 4, 5), (3, 4, 5)),
            ((5000, 7), (7,)), ((2, 100003), (100003,)), ((6, 1), (1,))]


def ln_param_variants(dtype):
    if dtype == BF16:      # torch: bfloat16 input takes float32 or bfloat16 params, not a mix
        return [F32, BF16, None]
    return [dtype, None]


@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=str)
@pytest.mark.parametrize("shape,ns", LN_CASES, ids=[str(c) for c in LN_CASES])
def test_layer_norm_forward_and_backward(torch, shape, ns, dtype):
    rng = np.random.default_rng(21)
    k = len(ns)
    for pdt in ln_param_variants(dtype):
        x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
        dy = rng.standard_normal(shape).astype(dtype)
        w = None if pdt is None else (rng.random(ns) + 0.5).astype(pdt)
        b = None if pdt is None else rng.standard_normal(ns).astype(pdt)
        ty, tm, tr = torch.native_layer_norm(to_torch(torch, x), list(ns), to_torch(torch, w),
                                             to_torch(torch, b), 1e-5)
        y, mean, rstd = cynorm.layer_norm(x, ns, w, b, 1e-5)
        sshape = shape[:len(shape) - k] + (1,) * k
        assert tuple(tm.shape) == mean.shape == sshape
        tm64, tr64 = f64(to_numpy(tm)), f64(to_numpy(tr))
        sd = F64 if dtype == F64 else F32
        assert_close(mean, tm64, sd, scale=np.abs(tm64) + 1 / tr64, rtol=STAT_TOL[dtype], what="mean")
        assert_close(rstd, tr64, sd, rtol=STAT_TOL[dtype], what="rstd")
        # torch's statistics are off by rounding: |d mean| rstd <= tol (|mean| rstd + 1)
        wmax = 1.0 if w is None else np.max(np.abs(f64(w)))
        y_scale = ln_y_scale(x, k, tm64, tr64, w, b) + wmax * (np.abs(tm64) * tr64 + 1)
        assert_close(y, f64(to_numpy(ty)), dtype, scale=y_scale, rtol=TOL[dtype], what=f"y p={pdt}")
        # backward from torch's saved statistics
        sd_np = np.float64 if dtype == F64 else np.float32
        m_in, r_in = tm64.astype(sd_np), tr64.astype(sd_np)
        mask = [True, w is not None, b is not None]
        tgx, tgw, tgb = torch.ops.aten.native_layer_norm_backward(
            to_torch(torch, dy), to_torch(torch, x), list(ns), tm, tr, to_torch(torch, w), to_torch(torch, b), mask)
        gx, gw, gb = cynorm.layer_norm_backward(dy, x, ns, m_in, r_in, w, b, tuple(mask))
        assert_close(gx, f64(to_numpy(tgx)), dtype, scale=ln_gx_scale(dy, x, k, m_in, r_in, w),
                     rtol=TOL[dtype], what="grad_x")
        if w is not None:
            assert gw.dtype == w.dtype and gb.dtype == b.dtype
        # torch sums a bfloat16 input's grad_weight/grad_bias in low precision
        # (13% off the exact sum on (5000, 7)); rows of 1 element have
        # xhat = 0 exactly here, rounding noise times 1/sqrt(eps) in torch
        if w is not None and dtype != BF16 and int(np.prod(ns)) > 1:
            rows, d = ln_rows(x, k), ln_rows(dy, k)
            M = rows.shape[0]
            xhat = (rows - m_in.reshape(M, 1)) * r_in.reshape(M, 1)
            sw = np.sum(np.abs(d * xhat), axis=0).reshape(ns)
            sb = np.sum(np.abs(d), axis=0).reshape(ns)
            assert_close(gw, f64(to_numpy(tgw)), w.dtype, scale=sw, rtol=4 * TOL[w.dtype], what="grad_weight")
            assert_close(gb, f64(to_numpy(tgb)), b.dtype, scale=sb, rtol=4 * TOL[b.dtype], what="grad_bias")
        if w is None:
            assert gw is None and gb is None


def test_layer_norm_empty_rows_like_torch(torch):
    x = np.zeros((3, 0), np.float32)
    ty, tm, tr = torch.native_layer_norm(torch.from_numpy(x), [0], None, None, 1e-5)
    y, mean, rstd = cynorm.layer_norm(x, 0)
    np.testing.assert_array_equal(mean, tm.numpy())
    np.testing.assert_array_equal(np.isnan(rstd), np.isnan(tr.numpy()))
    assert y.shape == tuple(ty.shape)


BN_CASES = [((4, 3), 1), ((2, 3, 7, 7), 1), ((8, 64, 5, 5), 1), ((16, 2048), 1), ((2, 1, 1000), 1),
            ((4, 5, 6, 3), -1), ((2, 7, 7, 3), -1), ((32, 4, 2, 2, 2), 1), ((3, 2, 5, 4, 16), -1),
            ((4, 32, 300), 1), ((2, 24, 20, 20), 1)]


def bn_param_variants(dtype):
    if dtype == BF16:
        return [F32, BF16]
    return [dtype]


def torch_layout(torch, a, axis):
    """cynorm's channel axis `axis` moved to torch's axis 1."""
    t = to_torch(torch, a)
    ax = axis % a.ndim
    return t if ax == 1 else t.movedim(ax, 1).contiguous()


def from_torch_layout(t, axis, ndim, dtype=None):
    ax = axis % ndim
    if ax != 1:
        t = t.movedim(1, ax)
    return to_numpy(t.contiguous(), dtype)


@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=str)
@pytest.mark.parametrize("shape,axis", BN_CASES, ids=[f"{s}-axis{a}" for s, a in BN_CASES])
def test_batch_norm_forward_and_backward(torch, shape, axis, dtype):
    rng = np.random.default_rng(22)
    C = shape[axis % len(shape)]
    sd = F64 if dtype == F64 else F32
    for pdt in bn_param_variants(dtype):
        w = (rng.random(C) + 0.5).astype(pdt)
        b = rng.standard_normal(C).astype(pdt)
        rm = (rng.standard_normal(C) * 0.3).astype(pdt)
        rv = (rng.random(C) + 0.5).astype(pdt)
        trm, trv = to_torch(torch, rm), to_torch(torch, rv)
        tw, tb = to_torch(torch, w), to_torch(torch, b)
        # several training steps: the running stats follow torch's
        for step in range(3):
            x = (rng.standard_normal(shape) * (1 + step) + step).astype(dtype)
            tx = torch_layout(torch, x, axis)
            ty, tsm, tsi = torch.native_batch_norm(tx, tw, tb, trm, trv, True, 0.1, 1e-5)
            y, sm, si = cynorm.batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5, axis)
            tsm64, tsi64 = f64(to_numpy(tsm)), f64(to_numpy(tsi))
            assert sm.dtype == sd and sm.shape == (C,)
            assert_close(sm, tsm64, sd, scale=np.abs(tsm64) + 1 / tsi64, rtol=STAT_TOL[dtype], what="save_mean")
            assert_close(si, tsi64, sd, rtol=STAT_TOL[dtype], what="save_invstd")
            assert_close(y, f64(from_torch_layout(ty, axis, x.ndim)), dtype,
                         scale=bn_y_scale(x, axis, tsm64, tsi64, w, b), rtol=TOL[dtype], what=f"y step {step}")
            rtol = 4 * (STAT_TOL[dtype] if pdt != BF16 else RTOL[BF16])
            assert_close(rm, f64(to_numpy(trm)), pdt, scale=np.abs(f64(to_numpy(trm))) + 1 / tsi64, rtol=rtol,
                         what=f"running_mean step {step}")
            assert_close(rv, f64(to_numpy(trv)), pdt, rtol=rtol, what=f"running_var step {step}")
        # keep both on the same running stats from here
        rm, rv = to_numpy(trm), to_numpy(trv)
        dy = rng.standard_normal(shape).astype(dtype)
        tdy = torch_layout(torch, dy, axis)
        # training backward, from torch's saved statistics
        sm_in, si_in = tsm64.astype(sd), tsi64.astype(sd)
        tg = torch.ops.aten.native_batch_norm_backward(tdy, tx, tw, trm, trv, tsm, tsi, True, 1e-5, [True] * 3)
        g = cynorm.batch_norm_backward(dy, x, w, rm, rv, sm_in, si_in, True, 1e-5, axis=axis)
        assert_close(g[0], f64(from_torch_layout(tg[0], axis, x.ndim)), dtype,
                     scale=bn_gx_scale(dy, x, axis, sm_in, si_in, w), rtol=TOL[dtype], what="grad_x")
        sw, sb = bn_sum_scale(dy, x, axis, sm_in, si_in)
        assert g[1].dtype == pdt and g[2].dtype == pdt
        assert_close(g[1], f64(to_numpy(tg[1])), pdt, scale=sw, rtol=4 * TOL[pdt], what="grad_weight")
        assert_close(g[2], f64(to_numpy(tg[2])), pdt, scale=sb, rtol=4 * TOL[pdt], what="grad_bias")
        # eval forward and backward
        ty, tsm, tsi = torch.native_batch_norm(tx, tw, tb, trm, trv, False, 0.1, 1e-5)
        y, sm, si = cynorm.batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5, axis)
        assert sm.shape == (0,) == tuple(tsm.shape)
        inv = 1 / np.sqrt(f64(rv) + 1e-5)
        assert_close(y, f64(from_torch_layout(ty, axis, x.ndim)), dtype,
                     scale=bn_y_scale(x, axis, rm, inv, w, b), rtol=TOL[dtype], what="eval y")
        tg = torch.ops.aten.native_batch_norm_backward(tdy, tx, tw, trm, trv, None, None, False, 1e-5, [True] * 3)
        g = cynorm.batch_norm_backward(dy, x, w, rm, rv, sm, si, False, 1e-5, axis=axis)
        gx_t = f64(from_torch_layout(tg[0], axis, x.ndim))
        assert_close(g[0], gx_t, dtype, scale=np.abs(gx_t), rtol=2 * TOL[dtype], what="eval grad_x")
        sw, sb = bn_sum_scale(dy, x, axis, rm, inv)
        assert_close(g[1], f64(to_numpy(tg[1])), pdt, scale=sw, rtol=4 * TOL[pdt], what="eval grad_weight")
        assert_close(g[2], f64(to_numpy(tg[2])), pdt, scale=sb, rtol=4 * TOL[pdt], what="eval grad_bias")


@pytest.mark.parametrize("dtype", [F64, F32], ids=str)
def test_batch_norm_without_params(torch, dtype):
    rng = np.random.default_rng(23)
    x = rng.standard_normal((6, 4, 9)).astype(dtype)
    dy = rng.standard_normal((6, 4, 9)).astype(dtype)
    ty, tsm, tsi = torch.native_batch_norm(to_torch(torch, x), None, None, None, None, True, 0.1, 1e-5)
    y, sm, si = cynorm.batch_norm(x, None, None, None, None, True, 0.1, 1e-5)
    assert_close(y, to_numpy(ty), dtype, scale=4.0, rtol=TOL[dtype])
    tg = torch.ops.aten.native_batch_norm_backward(to_torch(torch, dy), to_torch(torch, x), None, None, None,
                                                   tsm, tsi, True, 1e-5, [True, False, False])
    g = cynorm.batch_norm_backward(dy, x, None, None, None, to_numpy(tsm), to_numpy(tsi), True, 1e-5,
                                   (True, False, False))
    assert g[1] is None and g[2] is None
    assert_close(g[0], to_numpy(tg[0]), dtype, scale=bn_gx_scale(dy, x, 1, to_numpy(tsm), to_numpy(tsi), None),
                 rtol=TOL[dtype])


# ---------------------------------------------------------------- split-statistics ops

@pytest.fixture(scope="module")
def torch_split_ops(torch):
    """torch's batch_norm_stats & co. where they run on the CPU (in 2.13 they
    are CUDA-only: then these tests skip)."""
    try:
        torch.batch_norm_stats(torch.ones(2, 3, 4, dtype=torch.float64), 1e-5)
    except (NotImplementedError, RuntimeError) as e:
        pytest.skip(f"torch.batch_norm_stats does not run on the CPU ({type(e).__name__})")
    return torch


@pytest.mark.parametrize("dtype", [F64, F32], ids=str)
def test_split_ops_against_torch(torch_split_ops, dtype):
    torch = torch_split_ops
    rng = np.random.default_rng(24)
    x = rng.standard_normal((6, 4, 9)).astype(dtype)
    dy = rng.standard_normal((6, 4, 9)).astype(dtype)
    w = (rng.random(4) + 0.5).astype(dtype)
    b = rng.standard_normal(4).astype(dtype)
    tx, tdy, tw, tb = (to_torch(torch, a) for a in (x, dy, w, b))
    tm, ti = torch.batch_norm_stats(tx, 1e-5)
    m, i = cynorm.batch_norm_stats(x, 1e-5)
    assert_close(m, tm.numpy(), dtype, scale=1.0, rtol=STAT_TOL[dtype])
    assert_close(i, ti.numpy(), dtype, rtol=STAT_TOL[dtype])
    counts = np.array([54.0])
    rm, rv = np.zeros(4, dtype), np.ones(4, dtype)
    trm, trv = to_torch(torch, rm), to_torch(torch, rv)
    tgm, tgi = torch.batch_norm_gather_stats_with_counts(tx, tm[None], ti[None], trm, trv, 0.1, 1e-5,
                                                        torch.from_numpy(counts).to(tx.dtype))
    gm, gi = cynorm.batch_norm_gather_stats(m[None], i[None], counts, rm, rv, 0.1, 1e-5)
    assert_close(gm, tgm.numpy(), dtype, scale=1.0, rtol=STAT_TOL[dtype])
    assert_close(gi, tgi.numpy(), dtype, rtol=STAT_TOL[dtype])
    assert_close(rv, trv.numpy(), dtype, rtol=STAT_TOL[dtype])
    ty = torch.batch_norm_elemt(tx, tw, tb, tm, ti, 1e-5)
    y = cynorm.batch_norm_elemt(x, w, b, m, i, 1e-5)
    assert_close(y, ty.numpy(), dtype, scale=4.0, rtol=TOL[dtype])
    tr = torch.batch_norm_backward_reduce(tdy, tx, tm, ti, tw, True, True, True)
    r = cynorm.batch_norm_backward_reduce(dy, x, m, i, w, True, True, True)
    for a, t in zip(r, tr):
        assert_close(a, t.numpy(), dtype, scale=np.sum(np.abs(dy)) * 4, rtol=STAT_TOL[dtype])
    tgx = torch.batch_norm_backward_elemt(tdy, tx, tm, ti, tw, tr[0], tr[1],
                                          torch.tensor([54], dtype=torch.int32))
    gx = cynorm.batch_norm_backward_elemt(dy, x, m, i, w, r[0], r[1], np.array([54], np.int32))
    assert_close(gx, tgx.numpy(), dtype, scale=bn_gx_scale(dy, x, 1, m, i, w), rtol=TOL[dtype])
