"""Parameters given as Python lists (the docstrings' array_like): a list, tuple
or Python number has no dtype of its own, so it is read in x's math type
(float64 for float64 x, float32 otherwise) and gives the bits of that array;
gradients of such a parameter come back in the math type.  An ndarray
parameter of another dtype is still refused (the dtype policy)."""
import ml_dtypes
import numpy as np
import pytest

import cynorm

DTYPES = [np.dtype(np.float64), np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16),
          np.dtype(np.float16)]


def math_type(dtype):
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if w is None:
            assert g is None
            continue
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))


def calls(dtype):
    """name: (the parameters' shape, call(weight, bias)) per op; weight
    norm's call takes g in weight's place."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6, 5)).astype(dtype)
    r = rng.standard_normal((4, 6, 5)).astype(dtype)
    dy = rng.standard_normal((4, 6, 5)).astype(dtype)
    mask3, mask2 = (True, True, True), (True, True)
    y, mean, rstd = cynorm.layer_norm(x, 5)
    _, mr = cynorm.rms_norm(x, 5)
    _, gm, gr = cynorm.group_norm(x, 3)
    _, im, ir = cynorm.instance_norm(x)
    v = x.reshape(4, 30)
    norm = cynorm.weight_norm_interface(v, np.ones((4, 1), math_type(dtype)), 0)[1]
    return {
        "layer_norm": (5, lambda w, b: cynorm.layer_norm(x, 5, w, b)),
        "layer_norm_backward": (5, lambda w, b: cynorm.layer_norm_backward(
            dy, x, 5, mean, rstd, w, b, mask3)),
        "rms_norm": (5, lambda w, b: cynorm.rms_norm(x, 5, w)),
        "rms_norm_backward": (5, lambda w, b: cynorm.rms_norm_backward(dy, x, 5, mr, w, mask2)),
        "add_layer_norm": (5, lambda w, b: cynorm.add_layer_norm(x, r, 5, w, b)),
        "add_rms_norm": (5, lambda w, b: cynorm.add_rms_norm(x, r, 5, w)),
        "group_norm": (6, lambda w, b: cynorm.group_norm(x, 3, w, b)),
        "group_norm_backward": (6, lambda w, b: cynorm.group_norm_backward(
            dy, x, gm, gr, w, 3, mask3)),
        "instance_norm": (6, lambda w, b: cynorm.instance_norm(x, w, b)),
        "instance_norm_backward": (6, lambda w, b: cynorm.instance_norm_backward(
            dy, x, im, ir, w, output_mask=mask3)),
        "batch_norm": (6, lambda w, b: cynorm.batch_norm(x, w, b, None, None, True, 0.1, 1e-5)),
        "weight_norm": ((4, 1), lambda g, _: (cynorm.weight_norm(v, g, 0),)),
        "weight_norm_backward": ((4, 1), lambda g, _: cynorm.weight_norm_backward(
            dy.reshape(4, 30), v, g, norm, 0)),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_list_parameters_read_in_the_math_type(dtype):
    mt = math_type(dtype)
    rng = np.random.default_rng(1)
    for name, (n, call) in calls(dtype).items():
        w = rng.uniform(0.5, 1.5, n).astype(mt)
        b = rng.standard_normal(n).astype(mt)
        # a list and a tuple (g: a nested list of its (4, 1) shape)
        same(call(w.tolist(), tuple(b.tolist())), call(w, b))
    # an ndarray of another dtype is refused, as before
    other = np.ones(5, np.float64 if dtype != np.float64 else np.float32)
    with pytest.raises(TypeError, match="weight must have dtype"):
        cynorm.layer_norm(np.ones((2, 5), dtype), 5, other)


def test_a_list_of_ints_is_a_parameter_too():
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    same(cynorm.rms_norm(x, 4, [1, 2, 3, 4]),
         cynorm.rms_norm(x, 4, np.array([1, 2, 3, 4], np.float32)))
    for bad in (["a", "b", "c", "d"], [True, False, True, True]):
        with pytest.raises(TypeError, match="weight"):
            cynorm.rms_norm(x, 4, bad)
