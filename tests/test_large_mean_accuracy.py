"""Layer norm and batch norm on data far from zero: y keeps the accuracy of
the float64 result.  The normalizing pass subtracts the statistics' mean as
hi + lo (hi its rounding to the math type, lo what the rounding dropped), so
float32 y is within ~1e-6 of float64 (the rounded mean alone: 1.5-2e-4 at
mean 1e4, unit spread; torch 3.7e-4), and 16-bit y within one rounding of
the float64 result.  References: float64 NumPy on the same (rounded) inputs."""
import ml_dtypes
import numpy as np
import pytest

import cynorm

EPS = 1e-5
FLOAT32_BOUND = 2e-6       # max |y - y64|, y of order 1 (|y| < 6 here)
MANTISSA = {np.dtype(ml_dtypes.bfloat16): 8, np.dtype(np.float16): 11}


def far_from_zero(rng, shape, dtype, mean):
    return (mean + rng.standard_normal(shape)).astype(np.float32).astype(dtype)


def affine64(xhat, w, b, shape):
    """(y, the size of its terms): |xhat * w| + |b| bounds what float32
    math can lose, where y itself may be small (cancellation)."""
    if w is None:
        return xhat, np.abs(xhat)
    w, b = np.reshape(w.astype(np.float64), shape), np.reshape(b.astype(np.float64), shape)
    return xhat * w + b, np.abs(xhat * w) + np.abs(b)


def layer_norm64(x, w, b):
    x = x.astype(np.float64)
    m = x.mean(-1, keepdims=True)
    xhat = (x - m) / np.sqrt(x.var(-1, keepdims=True) + EPS)
    return affine64(xhat, w, b, (-1,))


def batch_norm64(x, axis, w, b, mean=None, var=None):
    x = x.astype(np.float64)
    axes = tuple(i for i in range(x.ndim) if i != axis % x.ndim)
    shape = [1] * x.ndim
    shape[axis % x.ndim] = -1
    if mean is None:
        mean, var = x.mean(axes), x.var(axes)
    xhat = (x - np.reshape(mean, shape)) / np.sqrt(np.reshape(var, shape) + EPS)
    return affine64(xhat, w, b, shape)


def assert_close(y, ref):
    """float32: within FLOAT32_BOUND (relative to the size of y's terms);
    16-bit: within one rounding of y64, plus that float32 part."""
    y64, terms = ref
    got = y.astype(np.float64)
    err = np.abs(got - y64)
    if y.dtype == np.float32:
        worst = np.max(err / np.maximum(terms, 1.0))
        assert worst <= FLOAT32_BOUND, f"max |y - y64| / max(terms, 1) = {worst:.3g}"
        return
    # half a unit in the last place of y64 in y's format (normal range),
    # plus what the float32 math may add before the final rounding
    exponent = np.floor(np.log2(np.maximum(np.abs(y64), 2.0 ** -14)))
    half_ulp = 2.0 ** (exponent - MANTISSA[y.dtype])
    bound = half_ulp + FLOAT32_BOUND * terms + 1e-12
    worst = np.argmax(err - bound)
    assert np.all(err <= bound), (f"y = {got.flat[worst]!r} vs float64 {y64.flat[worst]!r}: "
                                  f"{err.flat[worst]:.3g} > {bound.flat[worst]:.3g}")


# (dtype, the data's mean): 16-bit data far from zero where its spacing
# still resolves a unit spread
DTYPES = [(np.float32, 1e4), (ml_dtypes.bfloat16, 40.0), (np.float16, 300.0)]
IDS = ["float32", "bfloat16", "float16"]


@pytest.mark.parametrize("dtype,mean", DTYPES, ids=IDS)
@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
@pytest.mark.parametrize("shape", [(64, 1000), (300, 7), (4, 3, 65)])
def test_layer_norm(dtype, mean, affine, shape):
    rng = np.random.default_rng(1)
    x = far_from_zero(rng, shape, dtype, mean)
    N = shape[-1]
    pdt = np.float32 if np.dtype(dtype).itemsize == 2 else dtype
    w = (rng.random(N) + 0.5).astype(pdt) if affine else None
    b = rng.standard_normal(N).astype(pdt) if affine else None
    y, _, _ = cynorm.layer_norm(x, (N,), w, b, EPS)
    assert_close(y, layer_norm64(x, w, b))


# every path of the batch-norm kernels: channel-fused training (C >= 16),
# long rows, short rows in segments, columns (channels-last, (N, C))
BN_CASES = [((8, 32, 6, 6), 1), ((4, 4, 20, 20), 1), ((16, 4, 10, 10), 1), ((8, 6, 6, 8), -1),
            ((2000, 8), 1), ((3, 5, 7), 2)]


@pytest.mark.parametrize("dtype,mean", DTYPES, ids=IDS)
@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
@pytest.mark.parametrize("shape,axis", BN_CASES)
def test_batch_norm_training(dtype, mean, affine, shape, axis):
    rng = np.random.default_rng(2)
    x = far_from_zero(rng, shape, dtype, mean)
    C = shape[axis]
    pdt = np.float32 if np.dtype(dtype).itemsize == 2 else dtype
    w = (rng.random(C) + 0.5).astype(pdt) if affine else None
    b = rng.standard_normal(C).astype(pdt) if affine else None
    y, save_mean, _ = cynorm.batch_norm(x, w, b, training=True, eps=EPS, axis=axis)
    assert_close(y, batch_norm64(x, axis, w, b))
    # the saved mean is still the float64 mean rounded once
    axes = tuple(i for i in range(x.ndim) if i != axis % x.ndim)
    np.testing.assert_array_equal(save_mean, x.astype(np.float64).mean(axes).astype(save_mean.dtype))


@pytest.mark.parametrize("dtype,mean", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape,axis", BN_CASES)
def test_batch_norm_inference(dtype, mean, shape, axis):
    """The running statistics are the mean and variance: y against float64
    with exactly those values."""
    rng = np.random.default_rng(3)
    x = far_from_zero(rng, shape, dtype, mean)
    C = shape[axis]
    pdt = np.float32 if np.dtype(dtype).itemsize == 2 else dtype
    rm = (mean + 0.1 * rng.standard_normal(C)).astype(pdt)
    rv = (rng.random(C) + 0.5).astype(pdt)
    y, _, _ = cynorm.batch_norm(x, None, None, rm, rv, training=False, eps=EPS, axis=axis)
    assert_close(y, batch_norm64(x, axis, None, None, rm.astype(np.float64), rv.astype(np.float64)))


def test_the_bound_separates_the_old_rounded_mean():
    """The bound is tight enough to catch y computed from the float32-rounded
    mean alone (what the normalizing pass did before)."""
    rng = np.random.default_rng(4)
    x = far_from_zero(rng, (64, 1000), np.float32, 1e4)
    _, mean, rstd = cynorm.layer_norm(x, (1000,), eps=EPS)
    old = ((x - mean[:, None]) * rstd[:, None]).astype(np.float32)    # float32 throughout
    with pytest.raises(AssertionError):
        assert_close(old, layer_norm64(x, None, None))
