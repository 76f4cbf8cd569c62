"""Layer norm / batch norm: bad arguments get a ValueError/TypeError that
names the argument (the tests match the name only, not the wording)."""
import numpy as np
import pytest
from numpy.exceptions import AxisError

import cynorm
from helpers import BF16, F16


def x32(shape=(4, 3, 5)):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def ones(n, dtype=np.float32):
    return np.ones(n, dtype)


# ---------------------------------------------------------------- layer norm

@pytest.mark.parametrize("ns", [4, (3,), (4, 3, 5, 1), (3, 4), (5, 3), (2, 5), (1, 3, 5)])
def test_layer_norm_normalized_shape_must_match_trailing_axes(ns):
    with pytest.raises(ValueError, match="normalized_shape"):
        cynorm.layer_norm(x32(), ns)


@pytest.mark.parametrize("ns", [(), []])
def test_layer_norm_empty_normalized_shape(ns):
    with pytest.raises(ValueError, match="normalized_shape"):
        cynorm.layer_norm(x32(), ns)


@pytest.mark.parametrize("ns", [5.0, "5", None, (5.0,), (3, "5")])
def test_layer_norm_normalized_shape_type(ns):
    with pytest.raises((TypeError, ValueError), match="normalized_shape"):
        cynorm.layer_norm(x32(), ns)


@pytest.mark.parametrize("ns", [True, (True,), (3, True), [np.True_]])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_a_bool_is_not_a_size_inside_a_shape_either(op, ns):
    # (True,) was read as (1,), and the error then named a shape not given
    x = np.ones((4, 3, 1), np.float32)
    with pytest.raises(TypeError, match="normalized_shape must be an int or a tuple of ints"):
        getattr(cynorm, op)(x, ns)


def test_masked_running_statistics_are_named_as_masked():
    x = x32((2, 3, 4))
    rm, rv = np.ma.array(np.zeros(3, np.float32)), np.ones(3, np.float32)
    for call in (lambda: cynorm.instance_norm(x, running_mean=rm, running_var=rv),
                 lambda: cynorm.batch_norm(x, None, None, rm, rv, True)):
        with pytest.raises(TypeError, match="running_mean is a masked array"):
            call()


def test_a_tensor_that_requires_grad_is_named_in_the_hint():
    torch = pytest.importorskip("torch")
    x = np.ones((4, 8), np.float32)
    w = torch.ones(8, requires_grad=True)
    with pytest.raises(TypeError, match=r"weight could not be read .* pass weight\.detach\(\)"):
        cynorm.rms_norm(x, 8, w)
    with pytest.raises(TypeError, match=r"pass residual\.detach\(\)"):
        cynorm.add_rms_norm(x, torch.ones(4, 8, requires_grad=True), 8)


@pytest.mark.parametrize("shape", [(4,), (15,), (3, 5, 1), (1, 5), (5, 3)])
def test_layer_norm_weight_and_bias_shape(shape):
    with pytest.raises(ValueError, match="weight"):
        cynorm.layer_norm(x32(), (3, 5), np.ones(shape, np.float32), None)
    with pytest.raises(ValueError, match="bias"):
        cynorm.layer_norm(x32(), (3, 5), None, np.ones(shape, np.float32))
    with pytest.raises(ValueError, match="weight"):
        cynorm.layer_norm(x32(), 5, np.ones(shape, np.float32), None)


def test_layer_norm_weight_dtype():
    with pytest.raises(TypeError, match="weight"):
        cynorm.layer_norm(x32(), 5, ones(5, np.float64))
    with pytest.raises(TypeError, match="bias"):
        cynorm.layer_norm(x32(), 5, None, ones(5, np.float64))
    with pytest.raises(TypeError, match="weight"):
        cynorm.layer_norm(x32().astype(BF16), 5, ones(5, F16))
    with pytest.raises(TypeError, match="weight"):
        cynorm.layer_norm(x32(), 5, ones(5, np.int32))
    with pytest.raises(TypeError, match="weight"):
        cynorm.layer_norm(x32().astype(np.float64), 5, ones(5, np.float32))


@pytest.mark.parametrize("bad", [np.ones((4, 5), np.int32), np.ones((4, 5), bool), np.ones((4, 5), np.complex64),
                                 np.ones((4, 5), object)])
def test_non_float_x_is_a_type_error(bad):
    with pytest.raises(TypeError, match=r"\bx\b"):
        cynorm.layer_norm(bad, 5)
    with pytest.raises(TypeError, match=r"\bx\b"):
        cynorm.batch_norm(bad, training=True)
    with pytest.raises(TypeError, match=r"\bx\b"):
        cynorm.batch_norm_stats(bad)


@pytest.mark.parametrize("eps", [-1e-5, -1.0])
def test_negative_eps(eps):
    x = x32()
    with pytest.raises(ValueError, match="eps"):
        cynorm.layer_norm(x, 5, eps=eps)
    with pytest.raises(ValueError, match="eps"):
        cynorm.batch_norm(x, eps=eps)
    with pytest.raises(ValueError, match="eps"):
        cynorm.batch_norm(x, None, None, ones(3), ones(3), False, 0.1, eps)
    with pytest.raises(ValueError, match="eps"):
        cynorm.batch_norm_stats(x, eps)
    _, m, i = cynorm.batch_norm(x)
    with pytest.raises(ValueError, match="eps"):
        cynorm.batch_norm_backward(x, x, None, ones(3), ones(3), m[:0], i[:0], False, eps)
    with pytest.raises(ValueError, match="eps"):
        cynorm.batch_norm_gather_stats(m[None], i[None], np.array([20]), eps=eps)


def test_eps_type():
    with pytest.raises(TypeError, match="eps"):
        cynorm.layer_norm(x32(), 5, eps="1e-5")
    with pytest.raises(TypeError, match="eps"):
        cynorm.batch_norm(x32(), eps="1e-5")


def test_layer_norm_out_validation():
    x = x32()
    with pytest.raises(TypeError, match="out"):
        cynorm.layer_norm(x, 5, out=np.empty_like(x))
    with pytest.raises(TypeError, match="out"):
        cynorm.layer_norm(x, 5, out=(np.empty_like(x), None))
    with pytest.raises(ValueError, match="out"):
        cynorm.layer_norm(x, 5, out=(np.empty((4, 3, 4), np.float32), None, None))
    with pytest.raises(TypeError, match="out"):
        cynorm.layer_norm(x, 5, out=(np.empty(x.shape, np.float64), None, None))
    with pytest.raises(ValueError, match="out"):
        cynorm.layer_norm(x, 5, out=(None, np.empty((4, 3), np.float32), None))
    with pytest.raises(TypeError, match="out"):
        cynorm.layer_norm(x, 5, out=(None, None, np.empty((4, 3, 1), np.float64)))
    with pytest.raises(TypeError, match="out"):
        cynorm.layer_norm(x.astype(BF16), 5, out=(None, np.empty((4, 3, 1), BF16), None))
    ro = np.empty_like(x)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        cynorm.layer_norm(x, 5, out=(ro, None, None))


def test_layer_norm_backward_validation():
    x = x32()
    w = ones(5)
    _, mean, rstd = cynorm.layer_norm(x, 5, w)
    with pytest.raises(ValueError, match="grad_out"):
        cynorm.layer_norm_backward(np.ones((4, 3, 6), np.float32), x, 5, mean, rstd, w)
    with pytest.raises(TypeError, match="grad_out"):
        cynorm.layer_norm_backward(x.astype(np.float64), x, 5, mean, rstd, w)
    with pytest.raises(ValueError, match="mean"):
        cynorm.layer_norm_backward(x, x, 5, mean.reshape(4, 3), rstd, w)
    with pytest.raises(ValueError, match="rstd"):
        cynorm.layer_norm_backward(x, x, 5, mean, np.ones((4, 1, 1), np.float32), w)
    # saved statistics of another float dtype are accepted (converted)
    a = cynorm.layer_norm_backward(x, x, 5, mean.astype(np.float64), rstd, w)
    b = cynorm.layer_norm_backward(x, x, 5, mean, rstd, w)
    np.testing.assert_array_equal(a[0], b[0])
    with pytest.raises(TypeError, match="mean"):
        cynorm.layer_norm_backward(x, x, 5, mean.astype(np.int32), rstd, w)
    with pytest.raises(ValueError, match="weight"):
        cynorm.layer_norm_backward(x, x, 5, mean, rstd, ones(3))
    with pytest.raises(ValueError, match="normalized_shape"):
        cynorm.layer_norm_backward(x, x, 3, mean, rstd, w)
    for mask in [(True, True), (True, True, True, True), [True]]:
        with pytest.raises((ValueError, TypeError), match="output_mask"):
            cynorm.layer_norm_backward(x, x, 5, mean, rstd, w, None, mask)
    for mask in [True, None, "abc"]:
        with pytest.raises((ValueError, TypeError), match="output_mask"):
            cynorm.layer_norm_backward(x, x, 5, mean, rstd, w, None, mask)


# ---------------------------------------------------------------- batch norm

@pytest.mark.parametrize("name", ["weight", "bias", "running_mean", "running_var"])
@pytest.mark.parametrize("n", [2, 4, 15])
def test_batch_norm_per_channel_lengths(name, n):
    x = x32()
    kw = dict(weight=ones(3), bias=ones(3), running_mean=np.zeros(3, np.float32), running_var=ones(3))
    kw[name] = ones(n)
    for training in (True, False):
        with pytest.raises(ValueError, match=name):
            cynorm.batch_norm(x, training=training, **kw)


def test_batch_norm_per_channel_lengths_with_axis():
    x = x32((4, 3, 5))
    with pytest.raises(ValueError, match="weight"):
        cynorm.batch_norm(x, ones(3), axis=-1)
    cynorm.batch_norm(x, ones(5), axis=-1)


@pytest.mark.parametrize("shape", [(5,), ()])
def test_batch_norm_rank(shape):
    x = np.ones(shape, np.float32)
    with pytest.raises(ValueError, match=r"\bx\b"):
        cynorm.batch_norm(x)
    with pytest.raises(ValueError, match=r"\bx\b"):
        cynorm.batch_norm_stats(x)


@pytest.mark.parametrize("shape", [(1, 3), (1, 3, 1), (1, 3, 1, 1)])
def test_one_value_per_channel_when_training(shape):
    x = np.ones(shape, np.float32)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        cynorm.batch_norm(x, None, None, None, None, True)
    # eval is fine
    y, _, _ = cynorm.batch_norm(x, None, None, np.zeros(3, np.float32), ones(3), False)
    assert y.shape == shape


def test_eval_needs_running_stats():
    x = x32()
    with pytest.raises(ValueError, match="running_mean|running_var"):
        cynorm.batch_norm(x, training=False)
    with pytest.raises(ValueError, match="running_var"):
        cynorm.batch_norm(x, None, None, np.zeros(3, np.float32), None, False)
    with pytest.raises(ValueError, match="running_mean"):
        cynorm.batch_norm(x, None, None, None, ones(3), False)
    _, m, i = cynorm.batch_norm(x)
    with pytest.raises(ValueError, match="running_mean|running_var"):
        cynorm.batch_norm_backward(x, x, None, None, None, m[:0], i[:0], False)


def test_batch_norm_dtypes():
    x = x32()
    with pytest.raises(TypeError, match="weight"):
        cynorm.batch_norm(x, ones(3, np.float64))
    with pytest.raises(TypeError, match="running_mean"):
        cynorm.batch_norm(x, None, None, ones(3, np.float64), ones(3))
    with pytest.raises(TypeError, match="running_var"):
        cynorm.batch_norm(x, None, None, ones(3), ones(3, np.int64))
    with pytest.raises(TypeError, match="bias"):
        cynorm.batch_norm(x.astype(F16), None, ones(3, BF16))
    with pytest.raises(TypeError, match="weight"):
        cynorm.batch_norm(x.astype(np.float64), ones(3, np.float32))


@pytest.mark.parametrize("momentum", ["0.1", [0.1]])
def test_momentum_type(momentum):
    with pytest.raises(TypeError, match="momentum"):
        cynorm.batch_norm(x32(), None, None, np.zeros(3, np.float32), ones(3), True, momentum)
    m = np.zeros((1, 3), np.float32)
    with pytest.raises(TypeError, match="momentum"):
        cynorm.batch_norm_gather_stats(m, m + 1, np.array([20]), np.zeros(3, np.float32), ones(3), momentum)


@pytest.mark.parametrize("axis", [3, -4, 10])
def test_axis_out_of_range(axis):
    x = x32()
    with pytest.raises(AxisError, match="axis"):
        cynorm.batch_norm(x, axis=axis)
    with pytest.raises(AxisError, match="axis"):
        cynorm.batch_norm_stats(x, 1e-5, axis)
    assert issubclass(AxisError, ValueError)


@pytest.mark.parametrize("axis", [1.0, "1"])
def test_axis_type(axis):
    with pytest.raises(TypeError, match="axis"):
        cynorm.batch_norm(x32(), axis=axis)


def test_batch_norm_out_validation():
    x = x32()
    with pytest.raises(ValueError, match="out"):
        cynorm.batch_norm(x, out=(np.empty((4, 3, 4), np.float32), None, None))
    with pytest.raises(TypeError, match="out"):
        cynorm.batch_norm(x, out=(np.empty(x.shape, np.float64), None, None))
    with pytest.raises(ValueError, match="out"):
        cynorm.batch_norm(x, out=(None, np.empty(4, np.float32), None))
    with pytest.raises(TypeError, match="out"):
        cynorm.batch_norm(x, out=(None, None, np.empty(3, np.float64)))
    with pytest.raises(TypeError, match="out"):
        cynorm.batch_norm(x, out=np.empty_like(x))
    _, m, i = cynorm.batch_norm(x)
    with pytest.raises(ValueError, match="out"):
        cynorm.batch_norm_elemt(x, None, None, m, i, out=np.empty((4, 3), np.float32))
    with pytest.raises(TypeError, match="out"):
        cynorm.batch_norm_elemt(x, None, None, m, i, out=np.empty(x.shape, np.float64))


def test_batch_norm_backward_validation():
    x = x32()
    w = ones(3)
    rm, rv = np.zeros(3, np.float32), ones(3)
    _, m, i = cynorm.batch_norm(x, w)
    with pytest.raises(ValueError, match="grad_out"):
        cynorm.batch_norm_backward(np.ones((4, 3, 6), np.float32), x, w, rm, rv, m, i, True)
    with pytest.raises(TypeError, match="grad_out"):
        cynorm.batch_norm_backward(x.astype(np.float64), x, w, rm, rv, m, i, True)
    with pytest.raises(ValueError, match="save_mean"):
        cynorm.batch_norm_backward(x, x, w, rm, rv, m[:2], i, True)
    with pytest.raises(ValueError, match="save_invstd"):
        cynorm.batch_norm_backward(x, x, w, rm, rv, m, ones(4), True)
    with pytest.raises(ValueError, match="weight"):
        cynorm.batch_norm_backward(x, x, ones(4), rm, rv, m, i, True)
    for mask in [(True, True), (True, True, True, True), [True]]:
        with pytest.raises((ValueError, TypeError), match="output_mask"):
            cynorm.batch_norm_backward(x, x, w, rm, rv, m, i, True, 1e-5, mask)


def test_split_ops_validation():
    x = x32()
    w = ones(3)
    m, i = cynorm.batch_norm_stats(x)
    with pytest.raises(ValueError, match="mean"):
        cynorm.batch_norm_elemt(x, w, None, ones(4), i)
    with pytest.raises(ValueError, match="invstd"):
        cynorm.batch_norm_elemt(x, w, None, m, ones(2))
    with pytest.raises(ValueError, match="weight"):
        cynorm.batch_norm_elemt(x, ones(2), None, m, i)
    with pytest.raises(ValueError, match="mean"):
        cynorm.batch_norm_backward_reduce(x, x, ones(4), i, w)
    with pytest.raises(ValueError, match="grad_out"):
        cynorm.batch_norm_backward_reduce(x[:2], x, m, i, w)
    sdy, sdx, _, _ = cynorm.batch_norm_backward_reduce(x, x, m, i, w)
    with pytest.raises(ValueError, match="sum_dy"):
        cynorm.batch_norm_backward_elemt(x, x, m, i, w, sdy[:2], sdx, np.array([20]))
    with pytest.raises(ValueError, match="sum_dy_xmu"):
        cynorm.batch_norm_backward_elemt(x, x, m, i, w, sdy, ones(5), np.array([20]))
    with pytest.raises(AxisError, match="axis"):
        cynorm.batch_norm_elemt(x, w, None, m, i, axis=5)
    # gather: (W, C) stats, (W,) counts
    with pytest.raises(ValueError, match="counts"):
        cynorm.batch_norm_gather_stats(m[None], i[None], np.array([20, 20]))
    with pytest.raises(ValueError, match="invstd"):
        cynorm.batch_norm_gather_stats(np.stack([m, m]), i[None], np.array([20, 20]))
    with pytest.raises(ValueError, match="running_mean"):
        cynorm.batch_norm_gather_stats(m[None], i[None], np.array([20]), ones(4), ones(3))
    with pytest.raises(ValueError, match="mean"):
        cynorm.batch_norm_gather_stats(m, i, np.array([20]))
