"""cynorm.jvp: every rule against central finite differences of its primal
(float64), partial tangents, 16-bit dtypes, the registry, and bad input."""
import ml_dtypes
import numpy as np
import pytest

import cynorm as cn
from jvp_cases import cases

FD_STEP = 1e-6
REL_TOL = 1e-6


def _as_tuple(o):
    return o if isinstance(o, tuple) else (o,)


def finite_difference(case, tangents):
    """Central difference of case.f along the tangents (None: not perturbed)."""
    def shifted(sign):
        p = [a if t is None else a + sign * FD_STEP * t for a, t in zip(case.primals, tangents)]
        return _as_tuple(case.f(*p))
    plus, minus = shifted(1.0), shifted(-1.0)
    return tuple(None if a is None else (np.asarray(a, np.float64) - np.asarray(b, np.float64))
                 / (2 * FD_STEP) for a, b in zip(plus, minus))


def rel_err(got, want):
    scale = max(np.max(np.abs(want), initial=0.0), 1e-3)
    return np.max(np.abs(np.asarray(got, np.float64) - want), initial=0.0) / scale


CASES = cases(np.random.default_rng(7))


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_every_rule_matches_finite_differences(case, rng):
    tangents = case.tangents(rng)
    outs, touts = cn.jvp(case.op, case.primals, tangents, **case.kwargs)
    ref_outs = _as_tuple(case.op(*case.primals, **case.kwargs))
    fd = finite_difference(case, tangents)
    for o, r_, t, want in zip(_as_tuple(outs), ref_outs, _as_tuple(touts), fd):
        if o is None:
            assert t is None and want is None
            continue
        np.testing.assert_array_equal(o, r_)           # the outputs are the op's
        assert t.shape == o.shape and t.dtype == o.dtype
        assert rel_err(t, want) <= REL_TOL, (case, rel_err(t, want))


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_each_tangent_alone_and_none(case, rng):
    # JVP is linear in the tangents: the sum over single-argument tangents is
    # the all-argument JVP, and all-None gives zeros
    full = case.tangents(rng)
    _, t_all = cn.jvp(case.op, case.primals, full, **case.kwargs)
    total = None
    for i in case.diff:
        one = tuple(t if j == i else None for j, t in enumerate(full))
        _, t_one = cn.jvp(case.op, case.primals, one, **case.kwargs)
        parts = [None if t is None else np.asarray(t, np.float64) for t in _as_tuple(t_one)]
        total = parts if total is None else [None if a is None else a + b for a, b in zip(total, parts)]
    for a, b in zip(_as_tuple(t_all), total):
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
    outs, t_none = cn.jvp(case.op, case.primals, (None,) * len(case.primals), **case.kwargs)
    for o, t in zip(_as_tuple(outs), _as_tuple(t_none)):
        assert (o is None and t is None) or (t.shape == o.shape and not np.any(t))


@pytest.mark.parametrize("case", [c for c in CASES if c.ignored], ids=repr)
def test_tangents_of_saved_statistics_are_ignored(case, rng):
    t = case.tangents(rng)
    t_stats = case.tangents(rng, which=case.diff + case.ignored)
    t_stats = tuple(s if i in case.ignored else a for i, (a, s) in enumerate(zip(t, t_stats)))
    _, a = cn.jvp(case.op, case.primals, t, **case.kwargs)
    _, b = cn.jvp(case.op, case.primals, t_stats, **case.kwargs)
    for u, v in zip(_as_tuple(a), _as_tuple(b)):
        np.testing.assert_array_equal(u, v)


def test_batch_norm_running_stat_tangents_follow_the_update(rng):
    x = rng.standard_normal((8, 3, 4))
    rm, rv = rng.standard_normal(3), rng.random(3) + 0.5
    tx, trm, trv = rng.standard_normal(x.shape), rng.standard_normal(3), rng.standard_normal(3)
    trm0, trv0 = trm.copy(), trv.copy()
    (y, mean, inv), (ty, tmean, tinv) = cn.jvp(
        cn.batch_norm, (x, None, None, rm, rv), (tx, None, None, trm, trv), momentum=0.2)
    n = x.size // 3

    def running(xx):
        m_, v_ = np.zeros(3), np.ones(3)
        cn.batch_norm(xx, None, None, m_, v_, momentum=0.2)
        return m_, v_
    plus, minus = running(x + FD_STEP * tx), running(x - FD_STEP * tx)
    np.testing.assert_allclose(trm, 0.8 * trm0 + (plus[0] - minus[0]) / (2 * FD_STEP), rtol=1e-6)
    np.testing.assert_allclose(trv, 0.8 * trv0 + (plus[1] - minus[1]) / (2 * FD_STEP), rtol=1e-6)
    assert n > 1


def test_gather_stats_running_stat_tangents_follow_the_update(rng):
    W, C = 3, 4
    mean, invstd = rng.standard_normal((W, C)), rng.random((W, C)) + 0.5
    counts = np.array([7.0, 0.0, 5.0])
    tm, ti = rng.standard_normal((W, C)), rng.standard_normal((W, C))
    trm, trv = rng.standard_normal(C), rng.standard_normal(C)
    trm0, trv0 = trm.copy(), trv.copy()
    cn.jvp(cn.batch_norm_gather_stats, (mean, invstd, counts, np.zeros(C), np.ones(C)),
           (tm, ti, None, trm, trv), momentum=0.3)

    def running(m_, i_):
        rm, rv = np.zeros(C), np.ones(C)
        cn.batch_norm_gather_stats(m_, i_, counts, rm, rv, momentum=0.3)
        return rm, rv
    plus = running(mean + FD_STEP * tm, invstd + FD_STEP * ti)
    minus = running(mean - FD_STEP * tm, invstd - FD_STEP * ti)
    np.testing.assert_allclose(trm, 0.7 * trm0 + (plus[0] - minus[0]) / (2 * FD_STEP), rtol=1e-6)
    np.testing.assert_allclose(trv, 0.7 * trv0 + (plus[1] - minus[1]) / (2 * FD_STEP), rtol=1e-6)


def test_split_stats_edge_values(rng):
    # an empty shard: NaN statistics, NaN tangents; no shard with values: the same
    x = np.zeros((0, 3, 4))
    (m_, i_), (tm, ti) = cn.jvp(cn.batch_norm_stats, (x,), (x,))
    assert np.isnan(m_).all() and np.isnan(tm).all() and np.isnan(ti).all()
    mean, invstd = rng.standard_normal((2, 3)), rng.random((2, 3)) + 0.5
    (m_, _), (tm, ti) = cn.jvp(cn.batch_norm_gather_stats, (mean, invstd, [0, 0]),
                               (mean, invstd, None))
    assert np.isnan(m_).all() and np.isnan(tm).all() and np.isnan(ti).all()
    # norm_except_dim: zero slices have zero tangents at every p; at p=inf
    # tied maxima share the tangent equally
    v = np.array([[0.0, 3.0], [0.0, -3.0], [0.0, 1.0]])
    tv = np.array([[1.0, 1.0], [2.0, 1.0], [3.0, 5.0]])
    for p in (0.5, 1, 2, 3, np.inf):
        _, t = cn.jvp(cn.norm_except_dim, (v, p, 1), (tv, None, None))
        assert t[0, 0] == 0.0, p
    _, t = cn.jvp(cn.norm_except_dim, (v, np.inf, 1), (tv, None, None))
    assert t[0, 1] == (1.0 - 1.0) / 2


@pytest.mark.parametrize("op, aliased", [("batch_norm_elemt", "x"),
                                         ("batch_norm_backward_elemt", "x"),
                                         ("batch_norm_backward_elemt", "grad_out")])
def test_split_stats_jvp_with_out_aliasing_an_input(op, aliased, rng):
    # out= may be an input's memory: the tangent still uses the input's values
    case = next(c for c in CASES if c.name == op)
    t = case.tangents(rng)
    outs, want = cn.jvp(case.op, case.primals, t)
    primals = [np.array(a) if isinstance(a, np.ndarray) else a for a in case.primals]
    i = 0 if aliased == "grad_out" or op == "batch_norm_elemt" else 1
    y, got = cn.jvp(case.op, tuple(primals), t, out=primals[i])
    assert y is primals[i]
    np.testing.assert_array_equal(y, outs)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_row_norm_jvp_with_y_written_into_x(name, rng):
    # out=(x, ...): the op overwrites x with y; the tangent still uses x's values
    case = next(c for c in CASES if c.name == name)
    t = case.tangents(rng)
    outs, want = cn.jvp(case.op, case.primals, t, **case.kwargs)
    primals = [np.array(a) if isinstance(a, np.ndarray) else a for a in case.primals]
    out = (primals[0],) + (None,) * (len(outs) - 1)
    got_outs, got = cn.jvp(case.op, tuple(primals), t, out=out, **case.kwargs)
    assert got_outs[0] is primals[0]
    for o, g, w_o, w in zip(got_outs, got, outs, want):
        np.testing.assert_array_equal(o, w_o)
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16], ids=str)
@pytest.mark.parametrize("name", ["layer_norm", "layer_norm_backward", "rms_norm",
                                  "rms_norm_backward", "add_layer_norm",
                                  "add_layer_norm_backward", "add_rms_norm",
                                  "add_rms_norm_backward", "batch_norm train",
                                  "batch_norm_backward train", "weight_norm_interface",
                                  "weight_norm_backward", "softmax", "log_sigmoid_forward",
                                  "norm_except_dim p=3 dim=None", "batch_norm_stats",
                                  "batch_norm_elemt", "batch_norm_backward_reduce",
                                  "batch_norm_backward_elemt"])
def test_reduced_precision_matches_float64(name, dtype, rng):
    case = next(c for c in CASES if c.name == name)
    dt = np.dtype(dtype)
    stat = np.float32 if dt.itemsize == 2 else dt
    t64 = case.tangents(rng)
    _, want = cn.jvp(case.op, case.primals, t64, **case.kwargs)

    def low(a, i):
        if not (isinstance(a, np.ndarray) and a.dtype == np.float64):
            return a
        # saved statistics and per-channel parameters of 16-bit inputs are float32
        per_channel = (a.ndim <= 1 or name.startswith("layer_norm") and i >= 3
                       or name.startswith("rms_norm") and i >= 2
                       or name.startswith("add_layer_norm") and i >= (4 if "backward" in name else 3)
                       or name.startswith("add_rms_norm") and i >= (4 if "backward" in name else 3))
        if case.name == "weight_norm_backward" and i == 3:
            per_channel = True
        return a.astype(stat if per_channel else dt)
    primals = tuple(low(a, i) for i, a in enumerate(case.primals))
    tangents = tuple(None if t is None else t.astype(p.dtype) for t, p in zip(t64, primals))
    outs, got = cn.jvp(case.op, primals, tangents, **case.kwargs)
    tol = {np.dtype(np.float32): 1e-4}.get(dt, 5e-2)
    for o, g, w in zip(_as_tuple(outs), _as_tuple(got), _as_tuple(want)):
        if o is None:
            continue
        assert g.dtype == o.dtype and g.shape == o.shape
        assert rel_err(g, w) <= tol, (name, rel_err(g, w))


# ----------------------------------------------------------------- registry
def test_register_jvp_for_a_user_op(rng):
    def cube(x, scale=1.0):
        return scale * x ** 3

    @cn.register_jvp(cube)
    def _rule(primals, tangents, kwargs):
        (x,), (tx,) = primals, tangents
        s = kwargs.get("scale", 1.0)
        return cube(x, s), (None if tx is None else 3 * s * x * x * tx)
    try:
        x, tx = rng.standard_normal(5), rng.standard_normal(5)
        y, ty = cn.jvp(cube, (x,), (tx,), scale=2.0)
        np.testing.assert_allclose(ty, 6 * x * x * tx)
        assert cn.jvp_rules[cube].fn is _rule
    finally:
        del cn.jvp_rules[cube]


# the public functions of cynorm that are not ops on arrays (threads,
# configuration, the allocation cache, the JVP machinery itself)
NOT_OPS = {"alloc_cache_info", "clear_alloc_cache", "config", "get_num_threads", "jvp",
           "register_jvp", "set_alloc_cache_limit", "set_num_threads", "show_config",
           "get_thread_thresholds", "set_thread_thresholds", "tune_threads",
           "get_team_policy", "set_team_policy", "thread_team_info"}


def _public_ops():
    ops = {}
    for name in cn.__all__:
        obj = getattr(cn, name)
        if callable(obj) and name not in NOT_OPS:
            ops[f"cynorm.{name}"] = obj
    for name in cn.aten.__all__:
        ops[f"cynorm.aten.{name}"] = getattr(cn.aten, name)
    return ops


def test_every_public_op_has_a_rule_and_a_case():
    # enumerated, not listed by hand: a new op without a rule fails here
    ops = _public_ops()
    assert len(ops) >= 30
    missing = sorted(name for name, op in ops.items() if op not in cn.jvp_rules)
    assert not missing, f"ops without a forward-mode rule: {missing}"
    tested = {c.op for c in CASES}
    untested = sorted(name for name, op in ops.items() if op not in tested)
    assert not untested, f"ops whose rule no finite-difference case covers: {untested}"
    # everything else public is a module (nested, distributed, aten) or in NOT_OPS
    others = {n for n in cn.__all__ if not callable(getattr(cn, n))}
    assert others <= {"__version__", "jvp_rules", "nested", "distributed", "aten"}, others
    assert NOT_OPS <= set(cn.__all__)


# ---------------------------------------------------------------- bad input
def test_bad_input_is_refused_with_the_argument_named(rng):
    x = rng.standard_normal((3, 4))
    with pytest.raises(TypeError, match="no forward-mode rule is registered for .*sum"):
        cn.jvp(np.sum, (x,), (x,))
    with pytest.raises(ValueError, match=r"one entry per primal \(2\)"):
        cn.jvp(cn.layer_norm, (x, (4,)), (x,))
    with pytest.raises(ValueError, match=r"tangents\[0\] \(for x\) must have the primal's shape"):
        cn.jvp(cn.layer_norm, (x, (4,)), (x[:2], None))
    with pytest.raises(TypeError, match=r"tangents\[0\] \(for x\) must have the primal's dtype float64"):
        cn.jvp(cn.layer_norm, (x, (4,)), (x.astype(np.float32), None))
    with pytest.raises(TypeError, match=r"tangents\[1\] \(for normalized_shape\): normalized_shape "
                       "is not differentiable"):
        cn.jvp(cn.layer_norm, (x, (4,)), (None, np.ones(1)))
    target = np.array([0, 1, 2])
    with pytest.raises(TypeError, match=r"tangents\[1\] \(for target\).*not differentiable"):
        cn.jvp(cn.nll_loss, (x, target), (None, target))
    with pytest.raises(TypeError, match=r"tangents\[0\].*must be a NumPy array or None"):
        cn.jvp(cn.layer_norm, (x, (4,)), ([1.0], None))
    with pytest.raises(TypeError, match="primals must be a tuple or list"):
        cn.jvp(cn.layer_norm, x, (None,))
    with pytest.raises(TypeError, match="register_jvp: op must be callable"):
        cn.register_jvp(3)


def test_arguments_bind_as_the_op_binds_them(rng):
    """The rules bind primals and keywords to op's parameters (a cached
    signature): keywords, defaults and positions give the same tangents,
    and what the op itself would refuse is a TypeError naming op's signature."""
    x, tx = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    w = rng.standard_normal(4)
    by_position = cn.jvp(cn.layer_norm, (x, (4,), w, None, 1e-3), (tx, None, None, None, None))
    by_keyword = cn.jvp(cn.layer_norm, (x, (4,)), (tx, None), weight=w, eps=1e-3)
    for a, b in zip(by_position[1], by_keyword[1]):
        np.testing.assert_array_equal(a, b)
    default = cn.jvp(cn.layer_norm, (x, (4,)), (tx, None))[1][0]
    np.testing.assert_array_equal(default, cn.jvp(cn.layer_norm, (x, (4,)), (tx, None), eps=1e-5)[1][0])
    assert not np.array_equal(default, cn.jvp(cn.layer_norm, (x, (4,)), (tx, None), eps=1e-1)[1][0])
    for primals, kwargs, what in [((x,), {}, "missing a required argument: 'normalized_shape'"),
                                  ((x, (4,)), {"epsilon": 1e-3}, "got an unexpected keyword argument 'epsilon'"),
                                  ((x, (4,)), {"x": x}, "multiple values for argument 'x'"),
                                  ((x, (4,), w, None, 1e-5, 7), {}, "too many positional arguments")]:
        with pytest.raises(TypeError, match=r"jvp: layer_norm\(x.*: " + what):
            cn.jvp(cn.layer_norm, primals, (tx,) + (None,) * (len(primals) - 1), **kwargs)


# ------------------------------------------- the fused layer_norm_backward JVP kernel
from hypothesis import given, settings, strategies as st  # noqa: E402

from cynorm import reference  # noqa: E402


def _ln_bwd_jvp(rng, shape, k, dtype, with_weight=True, which=("dy", "x", "w"),
                mask=(True, True, True)):
    ns = shape[len(shape) - k:]
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    pdt = np.float32 if np.dtype(dtype).itemsize == 2 else dtype
    w = (rng.random(ns) + 0.5).astype(pdt) if with_weight else None
    _, mean, rstd = cn.layer_norm(x, ns, w)
    t = {"dy": rng.standard_normal(shape).astype(dtype) if "dy" in which else None,
         "x": rng.standard_normal(shape).astype(dtype) if "x" in which else None,
         "w": rng.standard_normal(ns).astype(pdt) if "w" in which and with_weight else None}
    outs, touts = cn.jvp(cn.layer_norm_backward, (dy, x, ns, mean, rstd, w, None, mask),
                         (t["dy"], t["x"], None, None, None, t["w"], None, None))
    ref = reference.layer_norm_backward_jvp(dy, x, ns, rstd, w, t["dy"], t["x"], t["w"])
    return outs, touts, ref


@pytest.mark.parametrize("dtype", [np.float64, np.float32, ml_dtypes.bfloat16, np.float16], ids=str)
@pytest.mark.parametrize("shape,k", [((64, 300), 1), ((3, 5, 7), 2), ((1, 1), 1), ((0, 8), 1),
                                     ((9, 0), 1), ((257, 33), 1)])
def test_layer_norm_backward_jvp_kernel_matches_the_numpy_twin(shape, k, dtype, rng):
    outs, touts, ref = _ln_bwd_jvp(rng, shape, k, dtype)
    tol = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5}.get(np.dtype(dtype), 2e-2)
    for o, t, r in zip(outs, touts, ref):
        assert t.shape == o.shape and t.dtype == o.dtype
        assert rel_err(t, r) <= tol


@pytest.mark.parametrize("which", [("dy",), ("x",), ("w",), ("dy", "x"), ()], ids=str)
@pytest.mark.parametrize("mask", [(True, False, False), (False, True, True), (True, True, False)],
                         ids=str)
def test_layer_norm_backward_jvp_partial_tangents_and_masks(which, mask, rng):
    outs, touts, ref = _ln_bwd_jvp(rng, (40, 70), 1, np.float64, which=which, mask=mask)
    for o, t, r, on in zip(outs, touts, ref, mask):
        assert (o is None) == (not on) and (t is None) == (not on)
        if on:
            assert rel_err(t, r) <= 1e-12


def test_layer_norm_backward_jvp_without_weight(rng):
    _, touts, ref = _ln_bwd_jvp(rng, (30, 50), 1, np.float32, with_weight=False)
    assert touts[1] is not None and all(rel_err(t, r) <= 1e-5 for t, r in zip(touts, ref))


def test_layer_norm_backward_jvp_is_identical_at_any_thread_count(rng, restore_threads):
    got = []
    for n in (1, 2, 3):
        cn.set_num_threads(n)
        got.append(_ln_bwd_jvp(np.random.default_rng(5), (300, 700), 1, np.float32)[1])
    for other in got[1:]:
        for a, b in zip(got[0], other):
            np.testing.assert_array_equal(a, b)


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4), k=st.integers(1, 4),
       seed=st.integers(0, 2 ** 32 - 1))
def test_layer_norm_backward_jvp_over_shapes(shape, k, seed):
    k = min(k, len(shape))
    _, touts, ref = _ln_bwd_jvp(np.random.default_rng(seed), tuple(shape), k, np.float64)
    for t, r in zip(touts, ref):
        assert rel_err(t, r) <= 1e-10


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(2, 7), min_size=2, max_size=4), axis=st.integers(-4, 3),
       seed=st.integers(0, 2 ** 32 - 1))
def test_batch_norm_jvp_over_shapes_and_axes(shape, axis, seed):
    rng = np.random.default_rng(seed)
    axis = axis % len(shape)
    x, tx = rng.standard_normal(shape), rng.standard_normal(shape)
    C = shape[axis]
    w, tw = rng.random(C) + 0.5, rng.standard_normal(C)

    def f(x, w):
        return cn.batch_norm(x, w, None, training=True, axis=axis)
    _, t = cn.jvp(cn.batch_norm, (x, w), (tx, tw), training=True, axis=axis)
    plus, minus = f(x + FD_STEP * tx, w + FD_STEP * tw), f(x - FD_STEP * tx, w - FD_STEP * tw)
    for a, p, m_ in zip(t, plus, minus):
        assert rel_err(a, (p - m_) / (2 * FD_STEP)) <= 1e-6


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), dim=st.integers(-4, 3),
       log=st.booleans(), seed=st.integers(0, 2 ** 32 - 1))
def test_softmax_jvps_over_shapes_and_dims(shape, dim, log, seed):
    rng = np.random.default_rng(seed)
    dim = dim % len(shape)
    op = cn.log_softmax if log else cn.softmax
    x, tx = rng.standard_normal(shape), rng.standard_normal(shape)
    _, t = cn.jvp(op, (x, dim), (tx, None))
    fd = (op(x + FD_STEP * tx, dim) - op(x - FD_STEP * tx, dim)) / (2 * FD_STEP)
    assert rel_err(t, fd) <= 1e-6
    g = rng.standard_normal(shape)
    bwd = cn.log_softmax_backward_data if log else cn.softmax_backward_data
    y, ty = op(x, dim), rng.standard_normal(shape)
    _, tb = cn.jvp(bwd, (g, y, dim, np.float64), (tx, ty, None, None))
    fd = (bwd(g + FD_STEP * tx, y + FD_STEP * ty, dim, np.float64)
          - bwd(g - FD_STEP * tx, y - FD_STEP * ty, dim, np.float64)) / (2 * FD_STEP)
    assert rel_err(tb, fd) <= 1e-6


# ------------------------------------------- bugs a seeded fuzzer found (regressions)

@pytest.mark.parametrize("dtype", [np.float64, np.float32, ml_dtypes.bfloat16])
def test_layer_norm_jvp_of_an_empty_row_mean_is_zero(dtype):
    """cynorm.jvp.layer_norm:20261124:33: normalizing (3, 2, 5, 1, 0) over its
    last 3 dims, the mean of each (empty) row is the constant 0 but its tangent
    came back NaN (np.mean of nothing).  torch agrees on the primal."""
    x = np.zeros((3, 2, 5, 1, 0), dtype)
    w = np.zeros((5, 1, 0), dtype)
    (y, mean, rstd), (ty, t_mean, t_rstd) = cn.jvp(
        cn.layer_norm, (x, [5, 1, 0], w, None, 1e-5), (x.copy(), None, w.copy(), None, None))
    assert t_mean.shape == mean.shape == (3, 2, 1, 1, 1) and t_mean.dtype == mean.dtype
    np.testing.assert_array_equal(mean, 0)
    np.testing.assert_array_equal(t_mean, 0)
    assert ty.shape == y.shape == x.shape and t_rstd.shape == rstd.shape
    torch = pytest.importorskip("torch")
    _, tmean, _ = torch.ops.aten.native_layer_norm(torch.zeros(3, 2, 5, 1, 0), [5, 1, 0], None,
                                                   None, 1e-5)
    np.testing.assert_array_equal(tmean.numpy(), 0)


@pytest.mark.parametrize("dtype", [np.float64, ml_dtypes.bfloat16])
def test_weight_norm_jvp_of_an_empty_slice_norm_is_zero(dtype):
    """cynorm.jvp.weight_norm_interface:20261124:12: v (4, 0), dim=-2: every
    slice is empty, its norm the constant 0, but the norm's tangent was 0/0."""
    v = np.zeros((4, 0), dtype)
    g = np.arange(1.0, 5.0).reshape(4, 1).astype(np.float32 if v.dtype.itemsize == 2 else dtype)
    (w, norm), (tw, tn) = cn.jvp(cn.weight_norm_interface, (v, g, -2),
                                 (v.copy(), np.ones_like(g), None))
    np.testing.assert_array_equal(norm, 0)
    assert tn.shape == norm.shape and tn.dtype == norm.dtype
    np.testing.assert_array_equal(tn, 0)
    assert tw.shape == w.shape == (4, 0)


@pytest.mark.parametrize("target", [3, 1, -100])
def test_nll_loss_forward_jvp_of_total_weight_for_one_sample_and_no_reduction(target):
    """cynorm.jvp.nll_loss_forward:20261124:4: for 1-D x and reduction='none'
    the op returns total_weight = weight[target] (as ATen does) but its tangent
    was 0; it is t_weight[target] (0 for an ignored target)."""
    x = np.array([0.5, 0.8, 1.4, 0.1])
    w = np.array([3.0, -2.0, -2.0, -3.0])
    tx, tw = np.array([0.9, 0.3, -0.4, 0.6]), np.array([0.7, -0.5, 1.1, -0.8])
    t = np.array(target)
    (out, total), (t_out, t_total) = cn.jvp(cn.nll_loss_forward, (x, t, w, "none", -100),
                                            (tx, None, tw, None, None))
    assert total == (w[target] if target >= 0 else 0.0)
    assert t_total == (tw[target] if target >= 0 else 0.0)
    fd = (cn.nll_loss_forward(x, t, w + FD_STEP * tw, "none")[1]
          - cn.nll_loss_forward(x, t, w - FD_STEP * tw, "none")[1]) / (2 * FD_STEP)
    np.testing.assert_allclose(t_total, fd, rtol=1e-8, atol=1e-12)
    torch = pytest.importorskip("torch")
    _, ttotal = torch.ops.aten.nll_loss_forward(torch.from_numpy(x), torch.tensor(target),
                                                torch.from_numpy(w), 0, -100)
    assert float(ttotal) == float(total)
    # a batch of samples: total_weight is 0 for "none" (ATen's), and so its tangent
    (_, total2), (_, t_total2) = cn.jvp(cn.nll_loss_forward, (x[None], t.reshape(1), w, "none"),
                                        (tx[None], None, tw, None))
    assert total2 == 0 and t_total2 == 0
