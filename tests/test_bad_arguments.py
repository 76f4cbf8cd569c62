"""Bad arguments a seeded fuzzer found taking the wrong way out: each now
raises TypeError or ValueError naming the argument as the caller spelled it
(never float()'s OverflowError, a bare IndexError or an AttributeError);
out= arrays refuse masked arrays; the NumPy-level ops refuse a broadcast view
too large for memory at once, as the kernels do; and eps = 0 is refused
exactly where PyTorch refuses it."""
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numpy.exceptions import AxisError

import cynorm
import cynorm.nested as nt
from cynorm import aten

BIG = 10**400          # an int float() cannot convert


def x32(shape=(4, 3, 5)):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def ones(n, dtype=np.float32):
    return np.ones(n, dtype)


def nested():
    rng = np.random.default_rng(1)
    return nt.nested_array([rng.standard_normal((2, 4)), rng.standard_normal((3, 4))])


def raises_naming(cls, name, fn):
    """fn() raises cls with a message naming `name` (as a whole word)."""
    with pytest.raises(cls) as info:
        fn()
    msg = str(info.value)
    assert re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", msg), msg
    return msg


# ------------------------------------------------- ints too large for a float

def _stats():
    return cynorm.batch_norm_stats(x32())


SCALARS = {
    "batch_norm eps": ("eps", lambda v: cynorm.batch_norm(x32(), eps=v)),
    "batch_norm eval eps": ("eps", lambda v: cynorm.batch_norm(
        x32(), None, None, np.zeros(3, np.float32), ones(3), False, 0.1, v)),
    "batch_norm momentum": ("momentum", lambda v: cynorm.batch_norm(x32(), momentum=v)),
    "batch_norm_backward eps": ("eps", lambda v: cynorm.batch_norm_backward(
        x32(), x32(), None, None, None, *_stats(), True, v)),
    "batch_norm_stats eps": ("eps", lambda v: cynorm.batch_norm_stats(x32(), v)),
    "batch_norm_gather_stats eps": ("eps", lambda v: cynorm.batch_norm_gather_stats(
        _stats()[0][None], _stats()[1][None], np.array([20]), eps=v)),
    "batch_norm_gather_stats momentum": ("momentum", lambda v: cynorm.batch_norm_gather_stats(
        _stats()[0][None], _stats()[1][None], np.array([20]), np.zeros(3, np.float32), ones(3), v)),
    "batch_norm_elemt eps": ("eps", lambda v: cynorm.batch_norm_elemt(
        x32(), None, None, *_stats(), v)),
    "cudnn_batch_norm_backward epsilon": ("epsilon", lambda v: cynorm.cudnn_batch_norm_backward(
        x32(), x32(), ones(3), None, None, *_stats(), v)),
    "layer_norm eps": ("eps", lambda v: cynorm.layer_norm(x32(), 5, eps=v)),
    "norm_except_dim pow": ("pow", lambda v: cynorm.norm_except_dim(x32(), v, 0)),
    "nested layer_norm eps": ("eps", lambda v: nt.layer_norm(nested(), 4, eps=v)),
    "nested threshold": ("threshold", lambda v: nt.threshold(nested(), v, 0.0)),
    "nested threshold value": ("value", lambda v: nt.threshold(nested(), 0.0, v)),
    "nested threshold_backward": ("threshold", lambda v: nt.threshold_backward(
        nested(), nested(), v)),
    "to_padded fill": ("fill", lambda v: nested().to_padded(v)),
}


@pytest.mark.parametrize("case", list(SCALARS))
@pytest.mark.parametrize("value", [BIG, -BIG], ids=["10**400", "-10**400"])
def test_ints_too_large_for_a_float_are_value_errors(case, value):
    name, call = SCALARS[case]
    raises_naming(ValueError, name, lambda: call(value))


def test_to_padded_fill_is_a_real_number():
    x = nested()
    assert np.isneginf(x.to_padded(-np.inf)[0, 2]).all()
    assert np.isnan(x.to_padded(np.nan)[0, 2]).all()
    raises_naming(TypeError, "fill", lambda: x.to_padded("0"))
    raises_naming(TypeError, "fill", lambda: x.to_padded([]))


def test_thread_and_cache_limits_out_of_c_range(restore_threads):
    raises_naming(ValueError, "n", lambda: cynorm.set_num_threads(2**70))
    raises_naming(ValueError, "n", lambda: cynorm.set_num_threads(BIG))
    limit = cynorm.alloc_cache_info()["limit"]
    raises_naming(ValueError, "limit", lambda: cynorm.set_alloc_cache_limit(2**70))
    for bad in (float("inf"), float("nan"), 1.5, None, "1"):
        raises_naming(TypeError, "limit", lambda: cynorm.set_alloc_cache_limit(bad))
    assert cynorm.alloc_cache_info()["limit"] == limit
    cynorm.set_alloc_cache_limit(np.int64(limit))
    assert cynorm.alloc_cache_info()["limit"] == limit


# ------------------------------------------------------- indices and shapes

@pytest.mark.parametrize("dim, index", [(1, 3), (2, 4), (2, -5), (0, 7), (0, -3), (1, 2**70),
                                        (0, BIG)],
                         ids=["1,3", "2,4", "2,-5", "0,7", "0,-3", "1,2**70", "0,10**400"])
def test_nested_select_index_out_of_range(dim, index):
    x = nested()
    msg = raises_naming(ValueError, "index", lambda: nt.select(x, dim, index))
    assert "out of range" in msg
    with pytest.raises(IndexError):        # still an IndexError too, as before
        nt.select(x, dim, index)
    grad = np.zeros((3, 4)) if dim == 0 else nt.select(x, dim, 0)
    raises_naming(ValueError, "index", lambda: nt.select_backward(grad, x, dim, index))


@pytest.mark.parametrize("dim", [BIG, -4, 3, 1.0, None], ids=["10**400", "-4", "3", "1.0", "None"])
def test_nested_select_bad_dim_is_named_before_grad(dim):
    x = nested()
    # dim is checked first: the dense grad of a dim-0 select is not blamed
    with pytest.raises((TypeError, ValueError)) as info:
        nt.select_backward(np.zeros((3, 4)), x, dim, 0)
    assert "dim" in str(info.value) and "grad" not in str(info.value)


@pytest.mark.parametrize("padded", [np.float32(1), 1.0, np.array(2.0)])
def test_from_padded_needs_an_array_of_components(padded):
    raises_naming(ValueError, "padded", lambda: nt.from_padded(padded, [[1]]))


def test_from_padded_names_padded_and_sizes():
    raises_naming(TypeError, "padded", lambda: nt.from_padded(np.ones((2, 3), np.int32), [[1], [2]]))
    raises_naming(ValueError, "sizes", lambda: nt.from_padded(np.ones((2, 3)), [[1, 2], [3]]))


def test_nested_sizes_whose_product_wraps_int64():
    # 2**32 * 2**32 elements would wrap to 0 in int64 and match an empty buffer
    raises_naming(ValueError, "sizes", lambda: nt.NestedArray(np.empty(0), [[2**32, 2**32]]))


def test_nested_shapes_and_flags_are_named():
    x = nested()
    for bad in (float("inf"), "4", None, np.array(4.0), (4.0,)):
        raises_naming(TypeError, "normalized_shape", lambda: nt.layer_norm(x, bad))
    y, mean, rstd = nt.layer_norm(x, 4)
    raises_naming(TypeError, "normalized_shape",
                  lambda: nt.layer_norm_backward(x, x, float("nan"), mean, rstd))
    for bad in ((2, float("inf"), 4), "234", np.array(5.0), (2, None, 4)):
        raises_naming(TypeError, "output_size", lambda: x.to_padded(0.0, bad))
    raises_naming(ValueError, "output_size", lambda: x.to_padded(0.0, 5))
    raises_naming(TypeError, "dtype", lambda: nt.nested_array([np.ones(2)], dtype=BIG))
    raises_naming(TypeError, "arrays", lambda: nt.nested_array([np.array([BIG])]))
    raises_naming(ValueError, "approximate", lambda: nt.gelu(x, np.array(["none", "tanh"])))
    raises_naming(TypeError, "keepdim", lambda: nt.sum(x, 2, np.array([1, 0])))
    raises_naming(TypeError, "keepdim", lambda: nt.sum_backward(nt.sum(x, 2), x, 2, BIG))


@pytest.mark.parametrize("axis", [None])
def test_batch_norm_axis_none_is_named(axis):
    x = x32()
    m, i = cynorm.batch_norm_stats(x)
    calls = [
        lambda: cynorm.batch_norm(x, axis=axis),
        lambda: cynorm.batch_norm_stats(x, 1e-5, axis),
        lambda: cynorm.batch_norm_elemt(x, None, None, m, i, axis=axis),
        lambda: cynorm.batch_norm_backward(x, x, None, None, None, m, i, True, axis=axis),
        lambda: cynorm.batch_norm_backward_reduce(x, x, m, i, None, axis=axis),
        lambda: cynorm.batch_norm_backward_elemt(x, x, m, i, None, m, m, 20, axis=axis),
        lambda: cynorm.distributed.sync_batch_norm(x, None, None, np.zeros(3, np.float32),
                                                   ones(3), False, axis=axis),
    ]
    for call in calls:
        raises_naming(TypeError, "axis", call)
    with pytest.raises(AxisError, match="axis"):       # out of range: AxisError, as before
        cynorm.batch_norm(x, axis=3)


def test_ragged_lists_name_the_argument():
    ragged = [[1.0, 2.0], [3.0]]
    raises_naming(ValueError, "x", lambda: cynorm.layer_norm(ragged, 2))
    raises_naming(ValueError, "x", lambda: cynorm.trace(ragged))
    raises_naming(ValueError, "weight", lambda: cynorm.batch_norm(x32(), ragged))
    raises_naming(ValueError, "target", lambda: cynorm.nll_loss(x32((2, 5)), ragged))
    m, i = cynorm.batch_norm_stats(x32())
    raises_naming(ValueError, "counts",
                  lambda: cynorm.batch_norm_gather_stats(m[None], i[None], ragged))
    raises_naming(ValueError, "arrays[0]", lambda: nt.nested_array([ragged]))


# ------------------------------------------- ATen adapters: the caller's names

def _bn_args():
    x = x32()
    m, i = cynorm.batch_norm_stats(x)
    return x, x32(), ones(3), np.zeros(3, np.float32), ones(3), m, i


@pytest.mark.parametrize("op", [cynorm.cudnn_batch_norm_backward, cynorm.miopen_batch_norm_backward])
def test_cudnn_and_miopen_adapters_name_their_own_arguments(op):
    x, dy, w, rm, rv, m, i = _bn_args()
    msg = raises_naming(ValueError, "input", lambda: op(x[0, 0], dy, w, rm, rv, m, i, 1e-5))
    assert not re.search(r"\bx\b", msg)
    msg = raises_naming(ValueError, "grad_output", lambda: op(x, dy[:2], w, rm, rv, m, i, 1e-5))
    assert "grad_out " not in msg
    msg = raises_naming(ValueError, "save_var", lambda: op(x, dy, w, rm, rv, m, i[:2], 1e-5))
    assert "save_invstd" not in msg
    raises_naming(TypeError, "save_var", lambda: op(x, dy, w, rm, rv, m, i.astype(np.int32), 1e-5))
    raises_naming(ValueError, "epsilon", lambda: op(x, dy, w, rm, rv, m, i, -1.0))
    raises_naming(TypeError, "epsilon", lambda: op(x, dy, w, rm, rv, m, i, "1e-5"))
    # the JVP rule checks with the same names
    raises_naming(ValueError, "input",
                  lambda: cynorm.jvp(op, (x[0, 0], dy, w, rm, rv, m, i, 1e-5),
                                     (None, None, ones(3), None, None, None, None, None)))


def test_aten_batch_norm_backward_names_its_own_arguments():
    x, dy, w, rm, rv, m, i = _bn_args()
    mask = (True, True, True)
    op = aten.batch_norm_backward
    msg = raises_naming(TypeError, "update", lambda: op(dy, x, w, rm, rv, m, i, 1, 1e-5, mask))
    assert "training" not in msg
    msg = raises_naming(ValueError, "update", lambda: op(dy, x, w, None, None, m, i, False, 1e-5, mask))
    assert "update=False" in msg and "training" not in msg
    raises_naming(ValueError, "input", lambda: op(dy, x[0, 0], w, rm, rv, m, i, True, 1e-5, mask))
    raises_naming(ValueError, "save_var", lambda: op(dy, x, w, rm, rv, m, i[:1], True, 1e-5, mask))
    raises_naming(ValueError, "grad_out", lambda: op(dy[:1], x, w, rm, rv, m, i, True, 1e-5, mask))
    raises_naming(ValueError, "eps", lambda: op(dy, x, w, rm, rv, m, i, True, BIG, mask))
    raises_naming(TypeError, "update",
                  lambda: cynorm.jvp(op, (dy, x, w, rm, rv, m, i, "yes", 1e-5, mask),
                                     (dy, None, None, None, None, None, None, None, None, None)))
    # batch_norm_backward itself keeps its own names
    raises_naming(ValueError, "x", lambda: cynorm.batch_norm_backward(dy, x[0, 0], w, rm, rv, m, i, True))
    raises_naming(ValueError, "save_invstd",
                  lambda: cynorm.batch_norm_backward(dy, x, w, rm, rv, m, i[:1], True))
    raises_naming(ValueError, "training",
                  lambda: cynorm.batch_norm_backward(dy, x, w, None, None, m, i, False))


# ---------------------------------------------------------------- JVP rules

def test_jvp_rules_take_array_like_primals_the_ops_take():
    """A list primal (no tangent) with a tangent for another argument: the
    rules read it as the op does, instead of an AttributeError on .dtype."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3, 5))
    w, tw = rng.random(3) + 0.5, rng.standard_normal(3)
    for op, primals, tangents in [
            (cynorm.batch_norm, (x, w), (None, tw)),
            (cynorm.layer_norm, (x, 5, w[:1].repeat(5)), (None, None, tw[:1].repeat(5))),
            (cynorm.weight_norm, (x, w[None, :, None], 1), (None, tw[None, :, None], None))]:
        want = cynorm.jvp(op, primals, tangents)
        got = cynorm.jvp(op, (x.tolist(),) + primals[1:], tangents)
        for a, b in zip(np.atleast_1d(want[1]) if not isinstance(want[1], tuple) else want[1],
                        np.atleast_1d(got[1]) if not isinstance(got[1], tuple) else got[1]):
            np.testing.assert_allclose(a, b)


def test_jvp_refuses_masked_and_read_only_tangents():
    x = x32()
    t = np.ma.masked_array(x, mask=np.zeros(x.shape, bool))
    raises_naming(TypeError, "tangents[0]", lambda: cynorm.jvp(cynorm.layer_norm, (x, 5), (t, None)))
    rm, rv = np.zeros(3, np.float32), ones(3)
    t_rm = np.zeros(3, np.float32)
    t_rm.flags.writeable = False
    raises_naming(ValueError, "tangents[3]",
                  lambda: cynorm.jvp(cynorm.batch_norm, (x, None, None, rm, rv),
                                     (x, None, None, t_rm, None)))
    assert np.all(rm == 0)          # refused before the running statistics moved


# ------------------------------------------------------ masked out= arrays

def _masked(shape, dtype=np.float32):
    return np.ma.masked_array(np.empty(shape, dtype), mask=np.zeros(shape, bool))


def test_masked_out_arrays_are_refused():
    v, g = x32((4, 5)), ones(4)
    x = x32()
    m, i = cynorm.batch_norm_stats(x)
    calls = {
        "out": lambda: cynorm.weight_norm(v, g, 0, out=_masked(v.shape)),
        "out[0] (w)": lambda: cynorm.weight_norm_interface(v, g, 0, out=(_masked(v.shape), None)),
        "out[1] (norm)": lambda: cynorm.weight_norm_interface(v, g, 0, out=(None, _masked((4,)))),
        "out[0] (grad_v)": lambda: cynorm.weight_norm_backward(
            v, v, g, ones(4), 0, out=(_masked(v.shape), None)),
        "out[1] (grad_g)": lambda: cynorm.weight_norm_backward(
            v, v, g, ones(4), 0, out=(None, _masked((4,)))),
        "out ": lambda: cynorm.norm_except_dim(v, 2, 0, out=_masked((4, 1))),
        "out[0] (y)": lambda: cynorm.layer_norm(x, 5, out=(_masked(x.shape), None, None)),
        "out[2] (rstd)": lambda: cynorm.layer_norm(x, 5, out=(None, None, _masked((4, 3, 1)))),
        "out[0] (y) ": lambda: cynorm.batch_norm(x, out=(_masked(x.shape), None, None)),
        "out[1] (save_mean)": lambda: cynorm.batch_norm(x, out=(None, _masked((3,)), None)),
        "out  ": lambda: cynorm.batch_norm_elemt(x, None, None, m, i, out=_masked(x.shape)),
        "out   ": lambda: cynorm.batch_norm_backward_elemt(x, x, m, i, None, m, m, 20,
                                                          out=_masked(x.shape)),
    }
    for name, call in calls.items():
        msg = raises_naming(TypeError, name.strip(), call)
        assert "masked" in msg


# ------------------------------------- broadcast views too large for memory

def test_numpy_level_ops_refuse_huge_broadcast_views_at_once():
    """softmax and friends on a view claiming 2**47 elements (512 TiB of
    float32: no address space holds a copy) fail with the kernels'
    MemoryError at once, instead of reducing over every element first
    (hours).  In a subprocess, so that a hang fails the test."""
    code = textwrap.dedent("""
        import numpy as np, cynorm
        B = np.broadcast_to(np.float32(1), (2**23, 2**24))
        ops = [
            lambda: cynorm.layer_norm(B, 2**24),                  # the kernels, for reference
            lambda: cynorm.softmax(B, 1),
            lambda: cynorm.softmax(B, 0),
            lambda: cynorm.log_softmax(B, 1),
            lambda: cynorm.softmax_backward_data(B, B, 1, np.float32),
            lambda: cynorm.log_softmax_backward_data(B, B, 0, np.float32),
            lambda: cynorm.jvp(cynorm.softmax, (B, 1), (B, None)),
            lambda: cynorm.jvp(cynorm.log_softmax, (B, 0), (None, None)),
            lambda: cynorm.jvp(cynorm.log_softmax_backward_data, (B, B, 1, np.float32),
                               (B, None, None, None)),
        ]
        for op in ops:
            try:
                op()
                print("returned")
            except MemoryError:
                print("MemoryError")
            except Exception as e:
                print(type(e).__name__, e)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:-1] == ["MemoryError"] * 9, run.stdout
    # broadcast views that fit work as before
    row = np.arange(5.0, dtype=np.float32)
    b = np.broadcast_to(row, (3, 5))
    np.testing.assert_array_equal(cynorm.softmax(b, 1), cynorm.softmax(np.array(b), 1))
    np.testing.assert_array_equal(cynorm.log_softmax(b, 0), cynorm.log_softmax(np.array(b), 0))
    y = cynorm.softmax(np.array(b), 1)
    np.testing.assert_array_equal(
        cynorm.softmax_backward_data(b, np.broadcast_to(y[:1], (3, 5)), 1, np.float32),
        cynorm.softmax_backward_data(np.array(b), np.repeat(y[:1], 3, 0), 1, np.float32))


# ------------------------------------------------------- eps = 0 in training

@pytest.mark.parametrize("eps", [0, 0.0, -0.0, np.float32(0)])
def test_batch_norm_training_refuses_zero_eps(eps):
    x = x32()
    rm, rv = np.zeros(3, np.float32), ones(3)
    msg = raises_naming(ValueError, "eps", lambda: cynorm.batch_norm(x, None, None, rm, rv, True,
                                                                     0.1, eps))
    assert "must be positive during training" in msg
    assert np.all(rm == 0) and np.all(rv == 1)          # nothing updated
    raises_naming(ValueError, "eps", lambda: cynorm.jvp(cynorm.batch_norm, (x,), (x,), eps=eps))
    # ATen's ops (native_batch_norm_backward, batch_norm_elemt, ...) and
    # F.batch_norm in eval take eps = 0: only F.batch_norm in training refuses
    x, dy, w, rm, rv, _, _ = _bn_args()
    y, m, i = cynorm.batch_norm(x, w, None, rm, rv, False, 0.1, 0.0)
    assert np.isfinite(y).all()
    m, i = cynorm.batch_norm_stats(x, 0.0)
    cynorm.batch_norm_gather_stats(m[None], i[None], np.array([20]), eps=0.0)
    cynorm.batch_norm_elemt(x, w, None, m, i, 0.0)
    cynorm.layer_norm(x, 5, eps=0.0)
    for training in (True, False):
        cynorm.batch_norm_backward(dy, x, w, rm, rv, m, i, training, 0.0)
        aten.batch_norm_backward(dy, x, w, rm, rv, m, i, training, 0.0, (True, True, True))
    cynorm.cudnn_batch_norm_backward(x, dy, w, rm, rv, m, i, 0.0)
    cynorm.miopen_batch_norm_backward(x, dy, w, rm, rv, m, i, 0.0)


def test_zero_eps_matches_torch_functional_batch_norm():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = x32()
    for training in (True, False):
        for eps in (0.0, -1e-5, 1e-5):
            rm, rv = np.zeros(3, np.float32), ones(3)
            try:
                F.batch_norm(torch.from_numpy(x), torch.from_numpy(rm.copy()),
                             torch.from_numpy(rv.copy()), training=training, eps=eps)
                torch_raises = False
            except ValueError:
                torch_raises = True
            try:
                cynorm.batch_norm(x, None, None, rm, rv, training, 0.1, eps)
                ours = False
            except ValueError as e:
                assert "eps" in str(e)
                ours = True
            assert ours == torch_raises, (training, eps)


def test_nll_loss_backward_jvp_with_zero_total_weight():
    """Every target ignored: total_weight is 0 and the op's gradient is all
    zeros.  Its JVP rule divided a Python float by that 0 (ZeroDivisionError)
    before masking the ignored entries."""
    x = np.log(np.full((3, 4), 0.25))
    target = np.full(3, -100)
    g, tw = np.array(1.0), np.array(0.0)
    gi, t_gi = cynorm.jvp(cynorm.nll_loss_backward, (g, x, target, None, "mean", -100, tw),
                          (np.array(1.0), None, None, None, None, None, np.array(1.0)))
    np.testing.assert_array_equal(gi, cynorm.nll_loss_backward(g, x, target, None, "mean", -100, tw))
    assert t_gi.shape == x.shape and not np.any(t_gi)     # ignored entries: 0, as in the op


# ------------------------------------------- register_jvp's arguments (fuzzer regressions)

def _twice(x):
    return 2 * x


def _twice_rule(p, t, k):
    return 2 * p[0], 2 * t[0]


@pytest.mark.parametrize("kwargs,cls,name", [
    ({"nondiff": 3}, TypeError, "nondiff"),           # cynorm.register_jvp:20261124:31
    ({"nondiff": None}, TypeError, "nondiff"),
    ({"nondiff": b"x"}, TypeError, "nondiff"),
    ({"nondiff": ("x", 1)}, TypeError, "nondiff[1]"),
    ({"ignored": 2.5}, TypeError, "ignored"),
    ({"ignored": [None]}, TypeError, "ignored[0]"),
    ({"nondiff": "x", "ignored": ("x",)}, ValueError, "ignored"),
])
def test_register_jvp_refuses_bad_names_naming_the_argument(kwargs, cls, name):
    """register_jvp(op, nondiff=3) raised "'int' object is not iterable" (from
    frozenset, naming nothing) and only when the rule was registered."""
    try:
        msg = raises_naming(cls, name, lambda: cynorm.register_jvp(_twice, **kwargs))
        assert msg.startswith("register_jvp: ")
        assert _twice not in cynorm.jvp_rules
    finally:
        cynorm.jvp_rules.pop(_twice, None)


def test_register_jvp_takes_one_name_or_a_sequence():
    try:
        for nondiff in ("x", ("x",), ["x"], frozenset({"x"})):
            cynorm.register_jvp(_twice, nondiff=nondiff)(_twice_rule)
            assert cynorm.jvp_rules[_twice].nondiff == frozenset({"x"})
            raises_naming(TypeError, "tangents[0]",
                          lambda: cynorm.jvp(_twice, (np.ones(3),), (np.ones(3),)))
        cynorm.register_jvp(_twice, nondiff=(), ignored=[])(_twice_rule)
        out, t = cynorm.jvp(_twice, (np.arange(3.0),), (np.ones(3),))
        np.testing.assert_array_equal(t, 2 * np.ones(3))
    finally:
        cynorm.jvp_rules.pop(_twice, None)


def test_gather_stats_with_one_value_in_all_names_counts():
    """batch_norm_gather_stats' "Expected more than 1 value per channel" named
    no argument ("the shards hold 1 in all"): the total comes from counts."""
    mean, invstd = np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)
    rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
    msg = raises_naming(ValueError, "counts", lambda: cynorm.batch_norm_gather_stats(
        mean, invstd, np.array([1, 0]), rm, rv))
    assert msg.startswith("Expected more than 1 value per channel when training")
    np.testing.assert_array_equal(rm, 0)        # nothing updated
    np.testing.assert_array_equal(rv, 1)
