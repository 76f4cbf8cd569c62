"""Bad input gets a clear ValueError/TypeError naming the argument."""
import numpy as np
import pytest

import cynorm
from helpers import BF16


def v32(shape=(4, 5)):
    return np.ones(shape, np.float32)


@pytest.mark.parametrize("bad", [np.ones((4, 5), np.int32), np.ones((4, 5), bool),
                                 np.ones((4, 5), np.complex64), np.ones((4, 5), object),
                                 np.ones((4, 5), np.float128) if hasattr(np, "float128") else np.ones((4, 5), "U1")])
def test_non_float_v_is_a_type_error(bad):
    with pytest.raises(TypeError, match=r"\bv must have a floating dtype"):
        cynorm.weight_norm(bad, np.ones(4, np.float32), 0)
    with pytest.raises(TypeError, match=r"\bv must have a floating dtype"):
        cynorm.norm_except_dim(bad, 2, 0)


def test_non_array_v():
    with pytest.raises(TypeError, match="v must be a NumPy array"):
        cynorm.weight_norm("abc", np.ones(4), 0)
    # lists are converted like NumPy does
    w = cynorm.weight_norm([[3.0, 4.0]], [1.0], 0)
    np.testing.assert_allclose(w, [[0.6, 0.8]])


@pytest.mark.parametrize("dim", [2, -3, 10])
def test_dim_out_of_range(dim):
    with pytest.raises(ValueError, match=f"dim={dim} is out of range"):
        cynorm.weight_norm(v32(), np.ones(4, np.float32), dim)
    with pytest.raises(ValueError, match="dim="):
        cynorm.norm_except_dim(v32(), 2, dim)


@pytest.mark.parametrize("dim", [1.0, "0", True, [0]])
def test_dim_of_wrong_type(dim):
    with pytest.raises(TypeError, match="dim must be an int or None"):
        cynorm.weight_norm(v32(), np.ones(4, np.float32), dim)


def test_zero_dim_v_needs_dim_none():
    with pytest.raises(ValueError, match="0-d array"):
        cynorm.weight_norm(np.float64(3.0), np.ones(1), 0)
    np.testing.assert_allclose(cynorm.weight_norm(np.array(-3.0), np.array(2.0), None), -2.0)


@pytest.mark.parametrize("gshape", [(5,), (4, 5), (1, 4), (4, 1, 1), (3,)])
def test_g_shape_mismatch(gshape):
    with pytest.raises(ValueError, match=r"g must have shape \(4, 1\) or \(4,\)"):
        cynorm.weight_norm(v32(), np.ones(gshape, np.float32), 0)


def test_g_dtype_rules():
    with pytest.raises(TypeError, match="g must have dtype float32, got float64"):
        cynorm.weight_norm(v32(), np.ones(4), 0)
    with pytest.raises(TypeError, match="g must have dtype float64, got float32"):
        cynorm.weight_norm(np.ones((4, 5)), np.ones(4, np.float32), 0)
    with pytest.raises(TypeError, match="g must have dtype bfloat16 or float32, got float16"):
        cynorm.weight_norm(v32().astype(BF16), np.ones(4, np.float16), 0)
    with pytest.raises(TypeError, match="g must have a floating dtype"):
        cynorm.weight_norm(v32(), np.ones(4, np.int64), 0)


def test_backward_shape_and_dtype_mismatches():
    v = v32()
    g = np.ones((4, 1), np.float32)
    _, n = cynorm.weight_norm_interface(v, g, 0)
    with pytest.raises(ValueError, match=r"grad_w must have the shape of saved_v"):
        cynorm.weight_norm_backward(np.ones((4, 6), np.float32), v, g, n, 0)
    with pytest.raises(TypeError, match=r"grad_w must have the dtype of saved_v"):
        cynorm.weight_norm_backward(np.ones((4, 5)), v, g, n, 0)
    with pytest.raises(ValueError, match="saved_norm must have shape"):
        cynorm.weight_norm_backward(v, v, g, np.ones((5, 1), np.float32), 0)
    with pytest.raises(TypeError, match="saved_norm must have dtype float32"):
        cynorm.weight_norm_backward(v, v, g, n.astype(np.float64), 0)
    with pytest.raises(TypeError, match="saved_norm must have dtype float32"):
        vb = v.astype(BF16)
        cynorm.weight_norm_backward(vb, vb, g, n.astype(BF16), 0)
    with pytest.raises(ValueError, match="saved_g must have shape"):
        cynorm.weight_norm_backward(v, v, np.ones(5, np.float32), n, 0)


def test_out_validation():
    v = v32()
    g = np.ones(4, np.float32)
    with pytest.raises(ValueError, match=r"out must have shape \(4, 5\)"):
        cynorm.weight_norm(v, g, 0, out=np.empty((5, 4), np.float32))
    with pytest.raises(TypeError, match="out must have dtype float32"):
        cynorm.weight_norm(v, g, 0, out=np.empty((4, 5)))
    with pytest.raises(ValueError, match="out must be C-contiguous or F-contiguous"):
        cynorm.weight_norm(v, g, 0, out=np.empty((4, 10), np.float32)[:, ::2])
    with pytest.raises(ValueError, match=r"out\[1\] \(norm\) must be C-contiguous"):
        cynorm.weight_norm_interface(np.ones((4, 2, 5), np.float32), np.ones((1, 2, 1), np.float32), 1,
                                     out=(None, np.empty((1, 4, 1), np.float32)[:, ::2]))
    ro = np.empty((4, 5), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        cynorm.weight_norm(v, g, 0, out=ro)
    with pytest.raises(TypeError, match=r"out must be None or a tuple of 2"):
        cynorm.weight_norm_interface(v, g, 0, out=np.empty((4, 5), np.float32))
    with pytest.raises(TypeError, match=r"out must be None or a tuple of 2"):
        cynorm.weight_norm_interface(v, g, 0, out=(None,))
    with pytest.raises(TypeError, match=r"out\[1\] \(norm\) must have dtype float32"):
        cynorm.weight_norm_interface(v, g, 0, out=(None, np.empty(4)))
    with pytest.raises(ValueError, match=r"out\[1\] \(norm\) must have shape \(4,\)"):
        cynorm.weight_norm_interface(v, g, 0, out=(None, np.empty((4, 1), np.float32)))
    with pytest.raises(TypeError, match="out must be a NumPy array"):
        cynorm.weight_norm(v, g, 0, out=[0.0] * 20)
    with pytest.raises(ValueError, match=r"out must have shape \(\)"):
        cynorm.norm_except_dim(v, 2, None, out=np.empty(1, np.float32))


@pytest.mark.parametrize("p", [0, -1, float("nan")])
def test_bad_pow_values(p):
    with pytest.raises(ValueError, match="pow must be > 0"):
        cynorm.norm_except_dim(v32(), p, 0)


@pytest.mark.parametrize("p", ["2", None, True, 2j])
def test_bad_pow_types(p):
    with pytest.raises(TypeError, match="pow must be a positive real number"):
        cynorm.norm_except_dim(v32(), p, 0)


def test_set_num_threads_validation(restore_threads):
    with pytest.raises(ValueError, match="n must be >= 1"):
        cynorm.set_num_threads(0)
    with pytest.raises(TypeError, match="n must be a positive int"):
        cynorm.set_num_threads(2.0)
    with pytest.raises(TypeError, match="n must be a positive int"):
        cynorm.set_num_threads(True)


def test_alloc_limit_validation():
    with pytest.raises(ValueError, match="limit must be >= 0"):
        cynorm.set_alloc_cache_limit(-1)


def test_masked_arrays_are_refused():
    v = np.ma.masked_array(np.ones((4, 5), np.float32), mask=np.zeros((4, 5), bool))
    with pytest.raises(TypeError, match="v is a masked array"):
        cynorm.weight_norm(v, np.ones(4, np.float32), 0)


def test_non_native_byte_order_is_converted():
    v = np.arange(1.0, 21.0).reshape(4, 5)
    g = np.ones(4)
    want = cynorm.weight_norm(v, g, 0)
    swapped = v.astype(v.dtype.newbyteorder(">" if np.little_endian else "<"))
    got = cynorm.weight_norm(swapped, g.astype(swapped.dtype), 0)
    assert got.dtype == np.float64 and got.dtype.isnative
    np.testing.assert_array_equal(got, want)
