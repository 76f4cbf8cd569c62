"""Hypothesis: random shapes, axes, dtypes, layouts and parameters for layer
norm and batch norm against the float64 reference."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cynorm
from cynorm import reference as ref
from conftest import DTYPES
from helpers import RTOL, assert_close, layout, stat_dtype
from norm_helpers import (bn_gx_scale, bn_sum_scale, bn_y_scale, f64, ln_gx_scale, ln_rows, ln_y_scale,
                          param_dtypes, stat_rtol)


@st.composite
def ln_cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=5)))
    k = draw(st.integers(1, len(shape)))
    dtype = draw(st.sampled_from(DTYPES))
    kind = draw(st.sampled_from(["C", "F", "strided"]))
    wdt = draw(st.sampled_from([None] + param_dtypes(dtype)))
    bdt = draw(st.sampled_from([None] + param_dtypes(dtype)))
    eps = draw(st.sampled_from([1e-5, 1e-3, 0.1]))
    offset = draw(st.sampled_from([0.0, 3.0, -20.0]))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    return shape, k, dtype, kind, wdt, bdt, eps, offset, seed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ln_cases())
def test_layer_norm_matches_reference(case):
    shape, k, dtype, kind, wdt, bdt, eps, offset, seed = case
    rng = np.random.default_rng(seed)
    ns = shape[len(shape) - k:]
    x = layout((rng.standard_normal(shape) + offset).astype(dtype), kind)
    dy = layout(rng.standard_normal(shape).astype(dtype), kind)
    w = None if wdt is None else (rng.random(ns) + 0.5).astype(wdt)
    b = None if bdt is None else rng.standard_normal(ns).astype(bdt)
    y, mean, rstd = cynorm.layer_norm(x, ns, w, b, eps)
    y_ref, m_ref, r_ref = ref.layer_norm(x, ns, w, b, eps)
    sd = stat_dtype(dtype)
    assert mean.dtype == sd and mean.shape == m_ref.shape and rstd.shape == r_ref.shape
    assert_close(mean, m_ref, sd, scale=np.abs(m_ref) + 1 / r_ref, rtol=stat_rtol(dtype), what="mean")
    assert_close(rstd, r_ref, sd, rtol=stat_rtol(dtype), what="rstd")
    assert_close(y, y_ref, dtype, scale=ln_y_scale(x, k, m_ref, r_ref, w, b), what="y")
    gx, gw, gb = cynorm.layer_norm_backward(dy, x, ns, mean, rstd, w, b)
    gx_ref, gw_ref, gb_ref = ref.layer_norm_backward(dy, x, ns, mean, rstd, w)
    assert_close(gx, gx_ref, dtype, scale=ln_gx_scale(dy, x, k, mean, rstd, w), what="grad_x")
    rows, d = ln_rows(x, k), ln_rows(dy, k)
    xhat = (rows - f64(mean).reshape(-1, 1)) * f64(rstd).reshape(-1, 1)
    assert_close(gw, gw_ref, gw.dtype, scale=np.sum(np.abs(d * xhat), axis=0).reshape(ns),
                 rtol=2 * RTOL[gw.dtype], what="grad_weight")
    assert_close(gb, gb_ref, gb.dtype, scale=np.sum(np.abs(d), axis=0).reshape(ns),
                 rtol=2 * RTOL[gb.dtype], what="grad_bias")


@st.composite
def bn_cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=2, max_size=5)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    C = shape[axis]
    if np.prod(shape) // C < 2:          # training needs 2 values per channel
        shape = (shape[0] + 1,) + shape[1:] if axis % len(shape) != 0 else shape[:1] + (shape[1] + 1,) + shape[2:]
    dtype = draw(st.sampled_from(DTYPES))
    kind = draw(st.sampled_from(["C", "F", "strided"]))
    pdt = draw(st.sampled_from([None] + param_dtypes(dtype)))
    rdt = draw(st.sampled_from([None] + param_dtypes(dtype)))
    momentum = draw(st.sampled_from([0.1, 0.5, 1.0, 0.0]))
    offset = draw(st.sampled_from([0.0, 3.0, -20.0]))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    return shape, axis, dtype, kind, pdt, rdt, momentum, offset, seed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bn_cases())
def test_batch_norm_matches_reference(case):
    shape, axis, dtype, kind, pdt, rdt, momentum, offset, seed = case
    rng = np.random.default_rng(seed)
    eps = 1e-5
    C = shape[axis]
    x = layout((rng.standard_normal(shape) + offset).astype(dtype), kind)
    dy = layout(rng.standard_normal(shape).astype(dtype), kind)
    w = None if pdt is None else (rng.random(C) + 0.5).astype(pdt)
    b = None if pdt is None else rng.standard_normal(C).astype(pdt)
    rm = None if rdt is None else rng.standard_normal(C).astype(rdt)
    rv = None if rdt is None else (rng.random(C) + 0.5).astype(rdt)
    rm0 = None if rm is None else rm.copy()
    rv0 = None if rv is None else rv.copy()
    y, sm, si = cynorm.batch_norm(x, w, b, rm, rv, True, momentum, eps, axis)
    y_ref, m_ref, i_ref, rm_ref, rv_ref = ref.batch_norm(x, w, b, rm0, rv0, True, momentum, eps, axis)
    sd = stat_dtype(dtype)
    assert sm.dtype == sd and sm.shape == (C,)
    assert_close(sm, m_ref, sd, scale=np.abs(m_ref) + 1 / i_ref, rtol=stat_rtol(dtype), what="save_mean")
    assert_close(si, i_ref, sd, rtol=stat_rtol(dtype), what="save_invstd")
    assert_close(y, y_ref, dtype, scale=bn_y_scale(x, axis, m_ref, i_ref, w, b), what="y")
    if rm is not None:
        tol = RTOL[np.dtype(rdt)]
        assert_close(rm, rm_ref, rdt, scale=np.abs(rm_ref) + np.abs(f64(rm0)) + 1 / i_ref, rtol=2 * tol,
                     what="running_mean")
        assert_close(rv, rv_ref, rdt, rtol=2 * tol, what="running_var")
    g = cynorm.batch_norm_backward(dy, x, w, rm, rv, sm, si, True, eps, axis=axis)
    g_ref = ref.batch_norm_backward(dy, x, w, rm, rv, sm, si, True, eps, axis)
    gdt = sd if w is None else w.dtype
    assert g[1].dtype == gdt and g[2].dtype == gdt
    assert_close(g[0], g_ref[0], dtype, scale=bn_gx_scale(dy, x, axis, sm, si, w), what="grad_x")
    sw, sb = bn_sum_scale(dy, x, axis, sm, si)
    assert_close(g[1], g_ref[1], gdt, scale=sw, rtol=2 * RTOL[np.dtype(gdt)], what="grad_weight")
    assert_close(g[2], g_ref[2], gdt, scale=sb, rtol=2 * RTOL[np.dtype(gdt)], what="grad_bias")
    if rm is not None:
        rm1, rv1 = rm.copy(), rv.copy()
        ye, _, _ = cynorm.batch_norm(x, w, b, rm, rv, False, momentum, eps, axis)
        np.testing.assert_array_equal(rm, rm1)
        ye_ref = ref.batch_norm(x, w, b, rm, rv, False, momentum, eps, axis)[0]
        inv = 1 / np.sqrt(f64(rv) + eps)
        assert_close(ye, ye_ref, dtype, scale=bn_y_scale(x, axis, rm, inv, w, b), what="eval y")
        ge = cynorm.batch_norm_backward(dy, x, w, rm, rv, sm[:0], si[:0], False, eps, axis=axis)
        ge_ref = ref.batch_norm_backward(dy, x, w, rm, rv, None, None, False, eps, axis)
        assert_close(ge[0], ge_ref[0], dtype, scale=np.max(np.abs(ge_ref[0])), what="eval grad_x")
