"""Tensors of other libraries (torch, JAX) passed straight in: read in place
through DLPack, bfloat16 included; out= and running statistics written in
place; refusals that name the argument."""
import gc

import ml_dtypes
import numpy as np
import pytest

import cynorm
from cynorm._kernels._dlpack import from_dlpack

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

BF16 = np.dtype(ml_dtypes.bfloat16)
TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
                np.dtype(np.float16): torch.float16, BF16: torch.bfloat16}


def to_torch(a):
    """A torch tensor holding a's values (bfloat16 through its bits)."""
    a = np.ascontiguousarray(a)
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def to_numpy(t):
    """t's values as a NumPy array (an independent route: torch's own)."""
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(BF16)
    return t.numpy()


def data(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def same(a, b):
    """the same dtype, shape and bits"""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


# ---- the import itself -----------------------------------------------------

@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
def test_reads_in_place_with_the_values(dtype):
    t = to_torch(data((3, 5), dtype))
    a = from_dlpack(t, "x")[0]
    assert a.dtype == dtype and a.shape == (3, 5)
    same(a, to_numpy(t))
    t[0, 0] = 7.0                   # the same memory: the array sees it
    assert float(a[0, 0]) == 7.0


def test_strides_offsets_and_empty_tensors():
    t = torch.arange(24.0).reshape(4, 6)[1:, ::2].t()
    a = from_dlpack(t, "x")[0]
    assert a.shape == (3, 3)
    same(a, t.contiguous().numpy())
    cl = torch.arange(120.0).reshape(2, 3, 4, 5).to(memory_format=torch.channels_last)
    b = from_dlpack(cl, "x")[0]
    assert [s // 4 for s in b.strides] == list(cl.stride())
    assert from_dlpack(torch.empty(0, 3), "x")[0].shape == (0, 3)
    assert from_dlpack(torch.tensor(2.5), "x")[0].shape == ()


def test_the_array_keeps_the_tensor_alive():
    a = from_dlpack(torch.arange(1000.0), "x")[0]
    gc.collect()
    assert a.sum() == 499500.0


# ---- the export (cynorm.torch's results as tensors) --------------------------

@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
def test_export_gives_torch_the_array_in_place(dtype):
    from cynorm._kernels._dlpack import to_dlpack
    a = data((4, 6), dtype)
    for view in (a, a[1:, ::2], a.T, a[:0], a[0, :0], np.asarray(a[0, 0])):
        t = torch.from_dlpack(to_dlpack(view))
        assert t.dtype == TORCH_DTYPES[dtype] and tuple(t.shape) == view.shape
        same(to_numpy(t), view)
        if view.size:
            assert t.data_ptr() == view.__array_interface__["data"][0]
            assert [s * view.itemsize for s in t.stride()] == list(view.strides)


def test_export_holds_the_array_and_lets_it_go():
    import sys
    from cynorm._kernels._dlpack import to_dlpack
    a = data((3, 3), np.float32)
    before = sys.getrefcount(a)
    t = torch.from_dlpack(to_dlpack(a))
    assert sys.getrefcount(a) == before + 1     # the tensor holds the array
    del t
    gc.collect()
    assert sys.getrefcount(a) == before
    cap = to_dlpack(a)                          # a capsule nobody takes
    assert sys.getrefcount(a) == before + 1
    del cap
    assert sys.getrefcount(a) == before
    b = data(1000, np.float64)
    t = torch.from_dlpack(to_dlpack(b))
    del b
    gc.collect()
    assert float(t.sum()) == pytest.approx(float(to_numpy(t).sum()))


def test_export_refuses_what_dlpack_cannot_say():
    from cynorm._kernels._dlpack import to_dlpack
    with pytest.raises(TypeError, match="to_dlpack: float64, float32, float16 or bfloat16"):
        to_dlpack(np.ones(3, np.int32))
    with pytest.raises(TypeError, match="to_dlpack"):
        to_dlpack(np.ones(3, ">f4"))
    odd = np.zeros(13, np.uint8)[1:].view(np.float32)
    with pytest.raises(ValueError, match="aligned"):
        to_dlpack(odd)
    with pytest.raises(ValueError, match="none negative"):
        to_dlpack(np.ones((3, 2), np.float32)[::-1])


def test_refusals_name_the_argument():
    with pytest.raises(TypeError, match=r"x could not be read through DLPack.*detach"):
        cynorm.layer_norm(torch.ones(2, 3, requires_grad=True), (3,))

    class OnDevice:
        def __dlpack__(self, **kw):
            raise AssertionError("not asked for: the device is checked first")

        def __dlpack_device__(self):
            return (2, 0)

    with pytest.raises(TypeError, match=r"weight is in CUDA memory.*host \(CPU\) memory"):
        cynorm.layer_norm(np.ones((2, 3), np.float32), (3,), OnDevice())
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        cynorm.layer_norm(torch.ones(2, 3, dtype=torch.int32), (3,))


# ---- through the ops: the bits of the same call on NumPy arrays -------------

@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
def test_ops_give_the_bits_of_numpy_inputs(dtype):
    x, w, b = data((6, 32), dtype), data(32, np.float32, 1), data(32, np.float32, 2)
    if dtype == np.float64:
        w, b = w.astype(np.float64), b.astype(np.float64)
    tx, tw, tb = map(to_torch, (x, w, b))
    for got, want in zip(cynorm.layer_norm(tx, (32,), tw, tb), cynorm.layer_norm(x, (32,), w, b)):
        same(got, want)
    for got, want in zip(cynorm.rms_norm(tx, (32,), tw), cynorm.rms_norm(x, (32,), w)):
        same(got, want)
    x4 = data((2, 8, 3, 4), dtype, 3)
    for got, want in zip(cynorm.group_norm(to_torch(x4), 4, tw[:8], tb[:8]),
                         cynorm.group_norm(x4, 4, w[:8], b[:8])):
        same(got, want)
    dy = data((6, 32), dtype, 4)
    y, mean, rstd = cynorm.layer_norm(x, (32,), w, b)
    for got, want in zip(cynorm.layer_norm_backward(to_torch(dy), tx, (32,), to_torch(mean),
                                                    to_torch(rstd), tw, tb),
                         cynorm.layer_norm_backward(dy, x, (32,), mean, rstd, w, b)):
        same(got, want)
    assert np.array_equal(to_numpy(tx).view(np.uint8), x.view(np.uint8))   # never modified


def test_channels_last_tensor_is_read_in_place_as_channels_last():
    x = data((2, 8, 5, 6), np.float32)
    t = to_torch(x).to(memory_format=torch.channels_last)
    y, mean, rstd = cynorm.group_norm(t, 4)
    want = cynorm.group_norm(x, 4)
    for got, w in zip((y, mean, rstd), want):
        same(got, w)
    assert y.strides == from_dlpack(t, "x")[0].strides     # the layout it came in


def test_out_and_running_statistics_are_written_into_the_tensors():
    x = data((4, 3, 5, 5), np.float32)
    rm, rv = torch.zeros(3), torch.ones(3)
    y = torch.empty(4, 3, 5, 5)
    res = cynorm.batch_norm(to_torch(x), None, None, rm, rv, training=True, momentum=0.1,
                            eps=1e-5, out=(y, None, None))
    rm_np, rv_np = np.zeros(3, np.float32), np.ones(3, np.float32)
    want = cynorm.batch_norm(x, None, None, rm_np, rv_np, training=True, momentum=0.1, eps=1e-5)
    same(res[0], want[0])
    same(y.numpy(), want[0])
    assert np.shares_memory(res[0], y.numpy())
    same(rm.numpy(), rm_np)
    same(rv.numpy(), rv_np)
    # y written over x itself, element by element
    t = to_torch(x)
    cynorm.batch_norm(t, None, None, None, None, training=True, momentum=0.1, eps=1e-5,
                      out=(t, None, None))
    same(t.numpy(), want[0])


def test_jvp_and_nested_take_tensors():
    x, tx = data((3, 8), np.float32), data((3, 8), np.float32, 1)
    got = cynorm.jvp(cynorm.rms_norm, (to_torch(x), (8,)), (to_torch(tx), None))
    want = cynorm.jvp(cynorm.rms_norm, (x, (8,)), (tx, None))
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            same(a, b)
    buf = data(12, np.float32)
    nested = cynorm.nested.NestedArray(to_torch(buf), [[2, 2], [2, 4]])
    same(nested.buffer, buf)


def test_jax_arrays_are_read_but_never_written():
    jnp = pytest.importorskip("jax.numpy")
    x = data((4, 16), np.float32)
    jx = jnp.asarray(x)
    for got, want in zip(cynorm.layer_norm(jx, (16,)), cynorm.layer_norm(x, (16,))):
        same(got, want)
    xb = data((4, 16), BF16)
    for got, want in zip(cynorm.rms_norm(jnp.asarray(xb), (16,)), cynorm.rms_norm(xb, (16,))):
        same(got, want)
    with pytest.raises(ValueError, match=r"out\[0\] \(y\) is read-only"):
        cynorm.layer_norm(x, (16,), out=(jnp.zeros((4, 16), jnp.float32), None, None))
