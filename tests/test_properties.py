"""Hypothesis: random shapes, dims, dtypes and layouts against the reference."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cynorm
from cynorm import reference as ref
from conftest import DTYPES
from helpers import F64, as_stored, assert_close, layout, make_g, stat_dtype


@st.composite
def cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=5)))
    dim = draw(st.sampled_from(list(range(-len(shape), len(shape))) + [None]))
    dtype = draw(st.sampled_from(DTYPES))
    kind = draw(st.sampled_from(["C", "F", "strided"]))
    flat_g = draw(st.booleans())
    seed = draw(st.integers(0, 2 ** 32 - 1))
    return shape, dim, dtype, kind, flat_g, seed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_forward_and_backward_match_reference(case):
    shape, dim, dtype, kind, flat_g, seed = case
    rng = np.random.default_rng(seed)
    d = None if dim is None else dim % len(shape)
    v = layout(rng.standard_normal(shape).astype(dtype), kind)
    gw = layout(rng.standard_normal(shape).astype(dtype), kind)
    g = make_g(rng, shape, d, dtype, flat=flat_g and d is not None)
    w, norm = cynorm.weight_norm_interface(v, g, dim)
    w_ref, n_ref = ref.weight_norm(v, g, d)
    assert norm.dtype == stat_dtype(dtype) and norm.shape == g.shape
    assert_close(w, w_ref, dtype, what="w")
    assert_close(norm, n_ref.reshape(g.shape), F64 if dtype == F64 else np.float32,
                 rtol=1e-12 if dtype == F64 else 1e-6, what="norm")
    gv, gg = cynorm.weight_norm_backward(gw, v, g, norm, dim)
    gv_ref, gg_ref = ref.weight_norm_backward(gw, v, g, d)
    # normwise: cancellation in a*gw - b*v makes elementwise bounds meaningless
    scale = np.max(np.abs(gv_ref)) + np.max(np.abs(np.asarray(g, np.float64))) * np.max(np.abs(gw.astype(np.float64))) / np.min(n_ref)
    assert_close(gv, gv_ref, dtype, scale=scale, what="grad_v")
    gg_scale = np.sqrt(np.sum(gw.astype(np.float64) ** 2))
    assert_close(gg, gg_ref.reshape(g.shape), F64 if dtype == F64 else np.float32,
                 scale=gg_scale, rtol=1e-12 if dtype == F64 else 2e-6, what="grad_g")


@settings(max_examples=60, deadline=None)
@given(cases(), st.sampled_from([1, 2, 3, 0.5, np.inf]))
def test_norm_except_dim_matches_reference(case, p):
    shape, dim, dtype, kind, _, seed = case
    rng = np.random.default_rng(seed)
    v = layout(rng.standard_normal(shape).astype(dtype), kind)
    got = cynorm.norm_except_dim(v, p, dim)
    want = as_stored(ref.norm_except_dim(v, p, None if dim is None else dim % len(shape)), dtype)
    assert got.shape == want.shape and got.dtype == v.dtype
    assert_close(got, want, dtype, rtol={F64: 1e-12}.get(np.dtype(dtype), 1e-2 if dtype != np.float32 else 1e-6))
