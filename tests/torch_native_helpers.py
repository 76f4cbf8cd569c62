"""What the tests of cynorm.torch's compiled operators share: the fixture
that needs them loaded, a call through either path (the compiled operators
or the Python Functions), and the bitwise comparison of the results."""
import os

import pytest
import torch

import cynorm.torch as ct

NATIVE_OFF = os.environ.get("CYNORM_TORCH_NATIVE", "").strip() == "0"
# every compiled operator (cynorm.torch's _native_op names)
NATIVE_OPS = ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "batch_norm",
              "group_norm", "instance_norm")


@pytest.fixture
def native():
    """The compiled operators, loaded; skips where they are off or cannot be
    built here (no C++ compiler), unless CYNORM_REQUIRE_TORCH_NATIVE=1
    (CI), where that fails."""
    if NATIVE_OFF:
        pytest.skip("CYNORM_TORCH_NATIVE=0 turns the compiled operators off")
    ct.layer_norm(torch.randn(2, 4, requires_grad=True), 4)
    status = ct.native_status()
    if not status.startswith("loaded from "):
        if os.environ.get("CYNORM_REQUIRE_TORCH_NATIVE") == "1":
            pytest.fail(f"the compiled operators did not load: {status}")
        pytest.skip(f"the compiled operators did not load: {status}")


def node(y):
    """The name of y's autograd node."""
    return y.grad_fn.name()


def run(op, args, grads, python):
    """op's outputs, its autograd node's name and the gradients of its
    tensor arguments that require them (grads: one per output, None for an
    output not used further), through the compiled operators or (python)
    the Python Functions: (node, outputs + gradients)."""
    saved = dict(ct._NATIVE)
    if python:
        ct._NATIVE.update({k: None for k in NATIVE_OPS})
    try:
        leaves = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor)
                  else a for a in args]
        ys = op(*leaves)
        ys = ys if isinstance(ys, tuple) else (ys,)
        name = node(ys[0])
        used = [(y, g) for y, g in zip(ys, grads) if g is not None]
        torch.autograd.backward([y for y, _ in used], [g for _, g in used])
        out = [a.grad for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
        return name, [y.detach() for y in ys] + out
    finally:
        ct._NATIVE.clear()
        ct._NATIVE.update(saved)


def bits(t):
    return t.view(torch.int16 if t.element_size() == 2 else
                  torch.int32 if t.element_size() == 4 else torch.int64)


def same(a, b):
    """a and b (lists of tensors or None) hold the same bits, dtypes, shapes
    and strides."""
    assert len(a) == len(b)
    for u, v in zip(a, b):
        if u is None or v is None:     # a gradient neither path computes
            assert u is None and v is None
            continue
        assert u.dtype == v.dtype and u.shape == v.shape and u.stride() == v.stride()
        assert torch.equal(bits(u.contiguous()), bits(v.contiguous()))
