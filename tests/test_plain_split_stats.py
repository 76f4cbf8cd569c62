"""The plain-case entries of the split batch-norm statistics ops
(batch_norm_stats, batch_norm_gather_stats, batch_norm_elemt,
batch_norm_backward_reduce, batch_norm_backward_elemt): each plain call
here must take its entry (checked) and give the same bits as the Python
layer, reached with the same data as an ndarray subclass; what is not plain
is left to Python (the entries return None)."""
import ml_dtypes
import numpy as np
import pytest

import cynorm
from cynorm import _channels
from test_plain_calls import (
    AFFINE_FORMS, BN_SHAPES, DTYPE_PARAMS, DTYPES, data, param_dtype, same_bits, via_python,
)

STAT_DTYPES = [np.float64, np.float32, ml_dtypes.bfloat16, np.float16]
# the ops with one parameter (weight): "mixed" would be "own"
ONE_PARAM_FORMS = [(d, form) for d, form in DTYPE_PARAMS if form != "mixed"]


def statistics(x, axis, stat_dtype=None):
    """Per-channel mean and invstd of x, optionally stored in another dtype."""
    mean, invstd = cynorm.batch_norm_stats(via_python(x), 1e-5, axis)
    if stat_dtype is not None:
        mean, invstd = mean.astype(stat_dtype), invstd.astype(stat_dtype)
    return mean, invstd


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", BN_SHAPES)
def test_batch_norm_stats(dtype, shape, axis, threads):
    x = data(shape, dtype, mean=1e4 if dtype == np.float32 else 0.5)
    assert _channels.plain_stats(x, 1e-5, axis) is not None
    same_bits(cynorm.batch_norm_stats(x, 1e-5, axis),
              cynorm.batch_norm_stats(via_python(x), 1e-5, axis))


def test_batch_norm_stats_zero_variance_and_eps():
    """A constant channel with eps 0: invstd is inf on both paths."""
    x = np.ones((3, 2, 4), np.float32)
    assert _channels.plain_stats(x, 0.0, 1) is not None
    same_bits(cynorm.batch_norm_stats(x, 0.0), cynorm.batch_norm_stats(via_python(x), 0.0))
    assert np.isinf(cynorm.batch_norm_stats(x, 0.0)[1]).all()


@pytest.mark.parametrize("stat_dtype", STAT_DTYPES)
@pytest.mark.parametrize("count_dtype", [np.float64, np.float32, np.int64, np.int32])
@pytest.mark.parametrize("running", [None, np.float32, np.float64, ml_dtypes.bfloat16])
def test_batch_norm_gather_stats(stat_dtype, count_dtype, running):
    W, C = 5, 7
    rng = np.random.default_rng(3)
    mean = (rng.standard_normal((W, C)) * 3 + 100).astype(stat_dtype)
    invstd = (rng.uniform(0.2, 3.0, (W, C))).astype(stat_dtype)
    counts = np.array([4, 0, 9, 1, 30]).astype(count_dtype)     # a shard with no values
    rm = None if running is None else data(C, running, 3)
    rv = None if running is None else (np.abs(data(C, np.float64, 4)) + 0.5).astype(running)

    def run(m, plain):
        rm2 = None if rm is None else rm.copy()
        rv2 = None if rv is None else rv.copy()
        if plain:
            assert _channels.plain_gather_stats(m, invstd, counts, rm2, rv2, 0.1, 1e-5) is not None
            rm2 = None if rm is None else rm.copy()
            rv2 = None if rv is None else rv.copy()
        out = cynorm.batch_norm_gather_stats(m, invstd, counts, rm2, rv2, 0.1, 1e-5)
        return out + tuple(a for a in (rm2, rv2) if a is not None)

    same_bits(run(mean, True), run(via_python(mean), False))


@pytest.mark.parametrize("shape,axis", BN_SHAPES)
@pytest.mark.parametrize("dtype,form,affine", AFFINE_FORMS)
def test_batch_norm_elemt(dtype, form, shape, axis, affine, threads):
    x = data(shape, dtype, mean=1e4 if dtype == np.float32 else 0.5)
    C = shape[axis]
    w = data(C, param_dtype(dtype, form), 1) if affine else None
    b = data(C, param_dtype(dtype, form, False), 2) if affine else None
    for stat_dtype in (None, np.float64):       # the statistics as stats returns them, float64
        mean, invstd = statistics(x, axis, stat_dtype)
        args = (w, b, mean, invstd, 1e-5, axis)
        assert _channels.plain_elemt(x, *args) is not None
        same_bits(cynorm.batch_norm_elemt(x, *args),
                  cynorm.batch_norm_elemt(via_python(x), *args))


MASKS = [(True, True, True), (True, False, False), (False, True, False), (False, False, True),
         (False, False, False)]


def backward_inputs(dtype, form, shape, axis, weighted):
    """x (far from zero in float32), dy, and weight (of form's dtype) or None."""
    x = data(shape, dtype, mean=1e4 if dtype == np.float32 else 0.5)
    w = data(shape[axis], param_dtype(dtype, form), 1) if weighted else None
    return x, data(shape, dtype, 5), w


@pytest.mark.parametrize("dtype,form", ONE_PARAM_FORMS)
@pytest.mark.parametrize("shape,axis", BN_SHAPES)
@pytest.mark.parametrize("weighted", [True, False])
def test_batch_norm_backward_reduce(dtype, form, shape, axis, weighted, threads):
    x, dy, w = backward_inputs(dtype, form, shape, axis, weighted)
    mean, invstd = statistics(x, axis, np.float64)
    for mask in MASKS:
        args = (x, mean, invstd, w) + mask + (axis,)
        assert _channels.plain_backward_reduce(dy, *args) is not None
        same_bits(cynorm.batch_norm_backward_reduce(dy, *args),
                  cynorm.batch_norm_backward_reduce(via_python(dy), *args))


@pytest.mark.parametrize("dtype,form", ONE_PARAM_FORMS)
@pytest.mark.parametrize("shape,axis", BN_SHAPES)
@pytest.mark.parametrize("weighted", [True, False])
def test_batch_norm_backward_elemt(dtype, form, shape, axis, weighted, threads):
    x, dy, w = backward_inputs(dtype, form, shape, axis, weighted)
    n = x.size // shape[axis]
    mean, invstd = statistics(x, axis)
    sum_dy, sum_dy_xmu, _, _ = cynorm.batch_norm_backward_reduce(dy, x, mean, invstd, w, axis=axis)
    # the total as a number, and as per-shard counts of every accepted dtype
    for count in (n, float(n), np.array([n - n // 3, n // 3]), np.array([n], np.int32),
                  np.array([n - n // 2, n // 2], np.float64), np.array([n], np.float32)):
        args = (x, mean, invstd, w, sum_dy, sum_dy_xmu, count, axis)
        assert _channels.plain_backward_elemt(dy, *args) is not None, count
        same_bits(cynorm.batch_norm_backward_elemt(dy, *args),
                  cynorm.batch_norm_backward_elemt(via_python(dy), *args))


def _split_args():
    x = data((2, 4, 3, 3), np.float32)
    dy = data((2, 4, 3, 3), np.float32, 5)
    mean, invstd = statistics(x, 1)
    s1, s2, _, _ = cynorm.batch_norm_backward_reduce(dy, x, mean, invstd, None)
    return x, dy, mean, invstd, s1, s2


def _gather_args():
    mean = data((3, 4), np.float32)
    invstd = np.abs(data((3, 4), np.float32, 1)) + 0.5
    return mean, invstd, np.array([2.0, 3.0, 4.0])


@pytest.mark.parametrize("call", [
    # batch_norm_stats
    lambda x, dy, m, s, s1, s2: _channels.plain_stats(x, 1, 1),               # eps an int
    lambda x, dy, m, s, s1, s2: _channels.plain_stats(x, 1e-5, 4),            # axis out of range
    lambda x, dy, m, s, s1, s2: _channels.plain_stats(x[:0], 1e-5, 1),        # no values
    lambda x, dy, m, s, s1, s2: _channels.plain_stats(np.asfortranarray(x), 1e-5, 1),
    # batch_norm_elemt
    lambda x, dy, m, s, s1, s2: _channels.plain_elemt(x, None, None, m[:2], s, 1e-5, 1),
    lambda x, dy, m, s, s1, s2: _channels.plain_elemt(x, None, None, m, None, 1e-5, 1),
    lambda x, dy, m, s, s1, s2: _channels.plain_elemt(x, m.astype(np.float64), None, m, s,
                                                      1e-5, 1),        # weight of another dtype
    lambda x, dy, m, s, s1, s2: _channels.plain_elemt(x, None, None, m, s, -1.0, 1),
    # batch_norm_backward_reduce
    lambda x, dy, m, s, s1, s2: _channels.plain_backward_reduce(dy, x, m, s, None, 1, True,
                                                                True, 1),  # a flag an int
    lambda x, dy, m, s, s1, s2: _channels.plain_backward_reduce(dy[:1], x, m, s, None, True,
                                                                True, True, 1),
    lambda x, dy, m, s, s1, s2: _channels.plain_backward_reduce(dy, x, m, s.reshape(4, 1), None,
                                                                True, True, True, 1),
    # batch_norm_backward_elemt: counts whose total the Python layer sums or rejects
    lambda x, dy, m, s, s1, s2: _channels.plain_backward_elemt(dy, x, m, s, None, s1, s2,
                                                               np.array([9.5, 8.5]), 1),
    lambda x, dy, m, s, s1, s2: _channels.plain_backward_elemt(dy, x, m, s, None, s1, s2, 0, 1),
    lambda x, dy, m, s, s1, s2: _channels.plain_backward_elemt(dy, x, m, s, None, s1, s2, -18, 1),
    lambda x, dy, m, s, s1, s2: _channels.plain_backward_elemt(dy, x, m, s, None, s1, s2,
                                                               float("nan"), 1),
    lambda x, dy, m, s, s1, s2: _channels.plain_backward_elemt(dy, x, m, s, None, s1, s2,
                                                               np.array([18.0, -1.0]), 1),
    lambda x, dy, m, s, s1, s2: _channels.plain_backward_elemt(dy, x, m, s, None, s1, s2,
                                                               [9, 9], 1),
    lambda x, dy, m, s, s1, s2: _channels.plain_backward_elemt(dy, x, m, s, None, s1, s2,
                                                               2 ** 60, 1),
    lambda x, dy, m, s, s1, s2: _channels.plain_backward_elemt(dy, x, m, s, None, None, s2, 18, 1),
])
def test_split_ops_leave_the_rest_to_python(call):
    assert call(*_split_args()) is None


@pytest.mark.parametrize("call", [
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, c * 0, None, None, 0.1, 1e-5),
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, np.array([0.5, 0.0, 0.0]), rm, rv,
                                                         0.1, 1e-5),     # total <= 1, running
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, np.array([1.0, np.inf, 2.0]),
                                                         None, None, 0.1, 1e-5),
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, np.array([1.0, -1.0, 2.0]),
                                                         None, None, 0.1, 1e-5),
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, c[:2], None, None, 0.1, 1e-5),
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, [2, 3, 4], rm, rv, 0.1, 1e-5),
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, [2, 3, 4], None, None, 0.1, 1e-5),
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, 9, rm, rv, 0.1, 1e-5),
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s[:2], c, None, None, 0.1, 1e-5),
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m[:0], s[:0], c[:0], None, None, 0.1,
                                                         1e-5),              # no shards
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m[:, :0], s[:, :0], c, None, None, 0.1,
                                                         1e-5),              # no channels
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m[0], s[0], c[:1], None, None, 0.1,
                                                         1e-5),              # mean 1-D
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, c, rm, None, 0.1, 1e-5),
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, c, rm, rm, 0.1, 1e-5),
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, c, m[0], rv, 0.1, 1e-5),
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, c, rm, rv, 1, 1e-5),
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, c, rm, rv, float("inf"), 1e-5),
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, c.astype(np.float16), rm, rv,
                                                         0.1, 1e-5),
    lambda m, s, c, rm, rv: _channels.plain_gather_stats(m, s, c, rm, rv[:3], 0.1, 1e-5),
])
def test_gather_stats_leaves_the_rest_to_python(call):
    mean, invstd, counts = _gather_args()
    rm, rv = np.zeros(4, np.float32), np.ones(4, np.float32)
    assert call(mean, invstd, counts, rm, rv) is None


def test_gather_stats_leaves_read_only_running_stats_to_python():
    mean, invstd, counts = _gather_args()
    rm, rv = np.zeros(4, np.float32), np.ones(4, np.float32)
    rv.flags.writeable = False
    assert _channels.plain_gather_stats(mean, invstd, counts, rm, rv, 0.1, 1e-5) is None
    with pytest.raises(ValueError, match="running_var"):
        cynorm.batch_norm_gather_stats(mean, invstd, counts, rm, rv)
    np.testing.assert_array_equal(rm, 0)            # nothing updated before the error


def test_split_ops_reach_the_whole_batch_result():
    """The plain split ops compose to batch_norm's forward and backward."""
    x = data((6, 5, 4, 4), np.float64)
    dy = data((6, 5, 4, 4), np.float64, 7)
    w, b = data(5, np.float64, 1), data(5, np.float64, 2)
    shards = np.split(x, 3)
    stats = [cynorm.batch_norm_stats(s) for s in shards]
    counts = np.array([s.size // 5 for s in shards])
    mean, invstd = cynorm.batch_norm_gather_stats(np.stack([m for m, _ in stats]),
                                                  np.stack([v for _, v in stats]), counts)
    y = np.concatenate([cynorm.batch_norm_elemt(s, w, b, mean, invstd) for s in shards])
    want_y, want_mean, want_invstd = cynorm.batch_norm(x, w, b, None, None, True)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(invstd, want_invstd, rtol=1e-12)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    sums = [cynorm.batch_norm_backward_reduce(d, s, mean, invstd, w)
            for d, s in zip(np.split(dy, 3), shards)]
    sum_dy = sum(s[0] for s in sums)
    sum_dy_xmu = sum(s[1] for s in sums)
    gx = np.concatenate([cynorm.batch_norm_backward_elemt(d, s, mean, invstd, w, sum_dy,
                                                          sum_dy_xmu, counts)
                         for d, s in zip(np.split(dy, 3), shards)])
    want_gx, want_gw, want_gb = cynorm.batch_norm_backward(dy, x, w, None, None, mean, invstd,
                                                           True)
    np.testing.assert_allclose(gx, want_gx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sum(s[2] for s in sums), want_gw, rtol=1e-12)
    np.testing.assert_allclose(sum_dy, want_gb, rtol=1e-12, atol=1e-12)
