"""cynorm.nested against torch.nested (jagged layout where torch supports the
op and its autograd, strided otherwise): forward outputs and, through
torch.autograd, the backward ops."""
import numpy as np
import pytest

import cynorm.nested as nt

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

LENGTHS = (3, 5, 1, 4)
D = 8


def _pair(rng, layout=None, dtype=np.float64):
    comps = [rng.standard_normal((n, D)).astype(dtype) for n in LENGTHS]
    x = nt.nested_array(comps)
    tx = torch.nested.nested_tensor([torch.from_numpy(c) for c in comps],
                                    layout=layout or torch.jagged, requires_grad=True)
    return x, tx


def _torch_backward(ty, tx, grad):
    """torch's gradient w.r.t. tx's components for output cotangent `grad` (a NestedArray)."""
    loss = sum((t * torch.from_numpy(g)).sum() for t, g in zip(ty.unbind(), grad.unbind()))
    (gx,) = torch.autograd.grad(loss, tx)
    return [g.detach().numpy() for g in gx.unbind()]


def _close(ours, theirs, rtol=1e-10, atol=1e-12):
    ours = ours.unbind() if isinstance(ours, nt.NestedArray) else ours
    theirs = [t.detach().numpy() for t in theirs.unbind()] if hasattr(theirs, "unbind") else theirs
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


CASES = {
    "gelu": (lambda x: nt.gelu(x), lambda t: torch.nn.functional.gelu(t),
             lambda g, x, y: nt.gelu_backward(g, x)),
    "gelu tanh": (lambda x: nt.gelu(x, "tanh"), lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
                  lambda g, x, y: nt.gelu_backward(g, x, "tanh")),
    "silu": (nt.silu, torch.nn.functional.silu, lambda g, x, y: nt.silu_backward(g, x)),
    "relu": (nt.relu, torch.relu, lambda g, x, y: nt.threshold_backward(g, x, 0.0)),
    "softmax last": (lambda x: nt.softmax(x, -1), lambda t: torch.softmax(t, -1),
                     lambda g, x, y: nt.softmax_backward(g, y, -1)),
    "softmax ragged dim": (lambda x: nt.softmax(x, 1), lambda t: torch.softmax(t, 1),
                           lambda g, x, y: nt.softmax_backward(g, y, 1)),
}


def _dense_torch_backward(torch_f, x, g):
    """torch autograd of torch_f per component, on dense tensors."""
    out = []
    for c, gc in zip(x.unbind(), g.unbind()):
        t = torch.from_numpy(c.copy()).requires_grad_()
        (torch_f(t[None])[0] * torch.from_numpy(gc)).sum().backward()
        out.append(t.grad.numpy())
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_pointwise_and_softmax(name, rng):
    ours_f, torch_f, ours_b = CASES[name]
    x, tx = _pair(rng)
    y, ty = ours_f(x), torch_f(tx)
    _close(y, ty)
    g = y.like(rng.standard_normal(y.buffer.size))
    if name == "softmax ragged dim":
        # torch 2.13's jagged softmax backward over the ragged dim disagrees with
        # dense autograd on each component (and with finite differences):
        # compare with the latter
        _close(ours_b(g, x, y), _dense_torch_backward(torch_f, x, g))
    else:
        _close(ours_b(g, x, y), _torch_backward(ty, tx, g))


def test_layer_norm(rng):
    x, tx = _pair(rng)
    w, b = rng.random(D) + 0.5, rng.standard_normal(D)
    tw, tb = torch.from_numpy(w).requires_grad_(), torch.from_numpy(b).requires_grad_()
    y, mean, rstd = nt.layer_norm(x, (D,), w, b)
    ty = torch.nn.functional.layer_norm(tx, (D,), tw, tb)
    _close(y, ty)
    g = y.like(rng.standard_normal(y.buffer.size))
    gi, gw, gb = nt.layer_norm_backward(g, x, (D,), mean, rstd, w, b)
    loss = sum((t * torch.from_numpy(c)).sum() for t, c in zip(ty.unbind(), g.unbind()))
    tgx, tgw, tgb = torch.autograd.grad(loss, (tx, tw, tb))
    _close(gi, tgx)
    np.testing.assert_allclose(gw, tgw.numpy(), rtol=1e-10)
    np.testing.assert_allclose(gb, tgb.numpy(), rtol=1e-10)


def test_linear_and_matmul(rng):
    x, tx = _pair(rng)
    W, b = rng.standard_normal((5, D)), rng.standard_normal(5)
    tW, tb = torch.from_numpy(W).requires_grad_(), torch.from_numpy(b).requires_grad_()
    y = nt.linear(x, W, b)
    ty = torch.nn.functional.linear(tx, tW, tb)
    _close(y, ty)
    g = y.like(rng.standard_normal(y.buffer.size))
    gi, gw, gb = nt.linear_backward(x, g, W)
    loss = sum((t * torch.from_numpy(c)).sum() for t, c in zip(ty.unbind(), g.unbind()))
    tgx, tgw, tgb = torch.autograd.grad(loss, (tx, tW, tb))
    _close(gi, tgx)
    np.testing.assert_allclose(gw, tgw.numpy(), rtol=1e-10)
    np.testing.assert_allclose(gb, tgb.numpy(), rtol=1e-10)
    B = rng.standard_normal((D, 3))
    tB = torch.from_numpy(B).requires_grad_()
    m, tm = nt.matmul(x, B), tx @ tB
    _close(m, tm)
    g = m.like(rng.standard_normal(m.buffer.size))
    gs, go = nt.matmul_backward(g, x, B)
    loss = sum((t * torch.from_numpy(c)).sum() for t, c in zip(tm.unbind(), g.unbind()))
    tgs, tgo = torch.autograd.grad(loss, (tx, tB))
    _close(gs, tgs)
    np.testing.assert_allclose(go, tgo.numpy(), rtol=1e-10)


def test_sum_and_select(rng):
    x, tx = _pair(rng)
    _close(nt.sum(x, -1), tx.sum(-1))
    _close(nt.select(x, 2, 1), tx.select(2, 1))
    # torch's jagged layout has no sum backward; its strided layout does, with keepdim
    x, sx = _pair(rng, torch.strided)
    s, ts = nt.sum(x, -1, keepdim=True), sx.sum(-1, keepdim=True)
    _close(s, ts)
    g = s.like(rng.standard_normal(s.buffer.size))
    _close(nt.sum_backward(g, x, -1, True), _torch_backward(ts, sx, g))


# ------------------------------------------- across the batch: sum over dim 0, (B, D, E) matmul

def test_sum_over_batch_and_every_dim(rng):
    x, tx = _pair(rng)
    # torch's jagged sum over dim 0 takes the ragged dim (1) with it; over
    # every dim it is torch.sum(x); both give dense tensors
    for dims, keepdim in [((0, 1), False), ((0, 1), True), ((0, 1, 2), False), ((0, 1, 2), True)]:
        ours, theirs = nt.sum(x, dims, keepdim), tx.sum(dims, keepdim=keepdim)
        assert not theirs.is_nested and ours.shape == tuple(theirs.shape)
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-12)
    ours, theirs = nt.sum(x), tx.sum()
    assert ours.shape == tuple(theirs.shape) == ()
    np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-12)
    # torch's jagged autograd has the backward of torch.sum(x) alone
    (tg,) = torch.autograd.grad(tx.sum() * 2.5, tx)
    _close(nt.sum_backward(np.asarray(2.5), x, None), tg)


def test_sum_over_batch_backward_against_dense_torch(rng):
    # torch 2.13 refuses the jagged backward over (0, ragged) (no
    # _nested_sum_backward for it) and dim 0 alone even for components of
    # one shape: compare with torch's dense autograd of the same sums
    x, _ = _pair(rng)
    rows = torch.from_numpy(np.concatenate(x.unbind())).requires_grad_()
    g = rng.standard_normal((1, 1, D))
    (rows.sum(0, keepdim=True)[None] * torch.from_numpy(g)).sum().backward()
    ours = nt.sum_backward(g, x, (0, 1), True)
    np.testing.assert_allclose(np.concatenate(ours.unbind()), rows.grad.numpy(), rtol=0, atol=0)
    same = nt.nested_array([rng.standard_normal((3, D)) for _ in range(4)])
    stacked = torch.from_numpy(np.stack(same.unbind())).requires_grad_()
    ts = stacked.sum(0)
    np.testing.assert_allclose(nt.sum(same, 0), ts.detach().numpy(), rtol=1e-12)
    g = rng.standard_normal((3, D))
    (ts * torch.from_numpy(g)).sum().backward()
    _close(nt.sum_backward(g, same, 0), list(stacked.grad.numpy()))


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-10), (np.float32, 1e-5)], ids=str)
@pytest.mark.parametrize("B", [len(LENGTHS), 1])
def test_matmul_batch_of_matrices(B, dtype, rtol, rng):
    # torch.matmul(jagged (B, j, D), dense (B, D, E)): component i times b[i];
    # a b of batch 1 broadcasts to every component
    x, tx = _pair(rng, dtype=dtype)
    b = rng.standard_normal((B, D, 3)).astype(dtype)
    tb = torch.from_numpy(b).requires_grad_()
    m, tm = nt.matmul(x, b), torch.matmul(tx, tb)
    _close(m, tm, rtol=rtol, atol=rtol)
    g = m.like(rng.standard_normal(m.buffer.size).astype(dtype))
    gs, go = nt.matmul_backward(g, x, b)
    loss = sum((t * torch.from_numpy(c)).sum() for t, c in zip(tm.unbind(), g.unbind()))
    tgs, tgo = torch.autograd.grad(loss, (tx, tb))
    _close(gs, tgs, rtol=rtol, atol=rtol)
    assert go.shape == tuple(tgo.shape) and go.dtype == dtype
    np.testing.assert_allclose(go, tgo.numpy(), rtol=rtol, atol=rtol)
