"""Parity with PyTorch 2.13 (CPU) where it is installed."""
import numpy as np
import pytest

import cynorm
from conftest import requires_torch
from helpers import BF16, F32, F64, assert_close, bits

pytestmark = [pytest.mark.torch, requires_torch]


@pytest.fixture(scope="module")
def torch():
    import torch
    return torch


def to_torch(torch, a):
    if a.dtype == BF16:    # exact: every bfloat16 is a float32
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def to_numpy(t):
    import torch
    if t.dtype == torch.bfloat16:
        return t.to(torch.float32).numpy().astype(BF16)
    return t.detach().numpy()


SHAPES_DIMS = [((64, 300), 0), ((300, 64), 1), ((512, 64, 3, 3), 0), ((128, 64), -1),
               ((7, 1023), 0), ((5000, 7), 1)]


@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=str)
@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
def test_weight_norm_interface_and_backward(torch, shape, dim, dtype):
    rng = np.random.default_rng(5)
    v = rng.standard_normal(shape).astype(dtype)
    gw = rng.standard_normal(shape).astype(dtype)
    d = dim % len(shape)
    gshape = tuple(s if i == d else 1 for i, s in enumerate(shape))
    g = (rng.random(gshape) + 0.5).astype(dtype)
    tv, tg, tgw = to_torch(torch, v), to_torch(torch, g), to_torch(torch, gw)
    tw, tn = torch._weight_norm_interface(tv, tg, d)
    w, n = cynorm.weight_norm_interface(v, g, dim)
    assert str(tn.dtype).endswith(str(n.dtype)) or (dtype == BF16 and n.dtype == F32)
    rtol = {F64: 1e-12, F32: 2e-6, BF16: 1e-2}[dtype]
    # torch sums float32/bfloat16 in float32 (cynorm in float64): allow its drift
    assert_close(n, tn.numpy(), F32 if dtype != F64 else F64, rtol=1e-12 if dtype == F64 else 2e-5)
    assert_close(w, to_numpy(tw).astype(np.float64), dtype, rtol=rtol)
    tgv, tgg = torch.ops.aten._weight_norm_interface_backward(tgw, tv, tg, tn, d)
    gv, gg = cynorm.weight_norm_backward(gw, v, g, n, dim)
    tgv64 = to_numpy(tgv).astype(np.float64)
    scale = np.max(np.abs(tgv64)) + 1e-30
    assert_close(gv, tgv64, dtype, scale=scale, rtol=rtol * 4)
    assert_close(gg, to_numpy(tgg).astype(np.float64), dtype,
                 scale=np.max(np.abs(to_numpy(tgg).astype(np.float64))), rtol=rtol * 4)


@pytest.mark.parametrize("dtype", [F64, F32, BF16, np.dtype(np.float16)], ids=str)
@pytest.mark.parametrize("shape,dim", [((6, 7, 8), 1), ((6, 7, 8), 0), ((6, 7, 8), 2), ((50, 40), 1)])
def test_weight_norm_any_dim(torch, shape, dim, dtype):
    """torch._weight_norm: fused at the ends, unfused in the middle and for half."""
    rng = np.random.default_rng(7)
    v = rng.standard_normal(shape).astype(dtype)
    gshape = tuple(s if i == dim else 1 for i, s in enumerate(shape))
    g = (rng.random(gshape) + 0.5).astype(dtype)
    tw = torch._weight_norm(to_torch(torch, v), to_torch(torch, g), dim)
    w = cynorm.weight_norm(v, g, dim)
    rtol = {F64: 1e-12, F32: 2e-6, BF16: 1.6e-2, np.dtype(np.float16): 2e-3}[np.dtype(dtype)]
    assert_close(w, to_numpy(tw).astype(np.float64), dtype, rtol=rtol)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_norm_except_dim(torch, p, dim):
    rng = np.random.default_rng(3)
    v = rng.standard_normal((5, 6, 7))
    want = torch.norm_except_dim(torch.from_numpy(v), p, dim).numpy()
    got = cynorm.norm_except_dim(v, p, dim)
    assert got.shape == want.shape
    assert_close(got, want, F64)
    # ATen's dim=-1 means the whole tensor: cynorm spells that None
    whole = torch.norm_except_dim(torch.from_numpy(v), p, -1).numpy()
    assert_close(cynorm.norm_except_dim(v, p, None), whole, F64)


def test_zero_norm_is_nan_in_both(torch):
    v = np.zeros((3, 4), np.float32)
    v[1] = 1.0
    g = np.ones((3, 1), np.float32)
    tw, tn = torch._weight_norm_interface(torch.from_numpy(v), torch.from_numpy(g), 0)
    w, n = cynorm.weight_norm_interface(v, g, 0)
    np.testing.assert_array_equal(np.isnan(w), np.isnan(tw.numpy()))
    gw = np.ones_like(v)
    tgv, tgg = torch.ops.aten._weight_norm_interface_backward(torch.from_numpy(gw), torch.from_numpy(v),
                                                              torch.from_numpy(g), tn, 0)
    gv, gg = cynorm.weight_norm_backward(gw, v, g, n, 0)
    np.testing.assert_array_equal(np.isnan(gv), np.isnan(tgv.numpy()))
    np.testing.assert_array_equal(np.isnan(gg), np.isnan(tgg.numpy()))


def test_float32_bits_match_torch_on_the_fused_first_dim(torch):
    """Same formula, same rounding of the scale: identical bits wherever the
    two norms agree (they are summed in different orders)."""
    rng = np.random.default_rng(11)
    v = rng.standard_normal((256, 512)).astype(np.float32)
    g = (rng.random((256, 1)) + 0.5).astype(np.float32)
    tw, tn = torch._weight_norm_interface(torch.from_numpy(v), torch.from_numpy(g), 0)
    w, n = cynorm.weight_norm_interface(v, g, 0)
    same = (n == tn.numpy()).ravel()
    assert same.mean() > 0.5
    np.testing.assert_array_equal(bits(w[same]), bits(tw.numpy()[same]))
