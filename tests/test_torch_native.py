"""cynorm.torch's compiled operators (cynorm/_torch_ops.cpp): eager layer
norm and RMS norm with gradients run them where they are loaded; they give
the bits of the Python Functions (the same kernels) for every dtype,
parameter set and gradient layout, hand anything outside their plain case
to those Functions, keep autograd's checks, and when they cannot be built
the calls still compute, with a warning that says why."""
import os
import subprocess
import sys

import numpy as np

import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("cynorm.torch")

from torch_native_helpers import native, node as _node  # noqa: E402,F401
from torch_native_helpers import run as _run, same as _same  # noqa: E402

pytestmark = pytest.mark.torch

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
ROW_OPS = ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm")


def test_the_compiled_operators_load(native):
    x = torch.randn(4, 8, requires_grad=True)
    y = ct.layer_norm(x, 8)
    assert ct.native_status().startswith("loaded from "), ct.native_status()
    assert "cynorm_native::LayerNorm" in _node(y)
    assert "cynorm_native::RMSNorm" in _node(ct.rms_norm(x, [8]))
    # nothing needs a gradient: the kernels straight, no autograd node
    assert ct.layer_norm(x.detach(), 8).grad_fn is None


def _cases():
    # (x shape, normalized shape, which parameters, parameter dtype, gradient layout)
    for dtype in DTYPES:
        wide = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        for params in ("wb", "w", "b", ""):
            yield dtype, (6, 5, 16), [16], params, dtype, "c"
        yield dtype, (3, 4, 6, 8), [6, 8], "wb", dtype, "c"
        yield dtype, (8, 7, 24), [24], "wb", wide, "transposed"
        yield dtype, (5, 3, 8), [8], "wb", dtype, "strided"


@pytest.mark.parametrize("case", list(_cases()), ids=str)
@pytest.mark.parametrize("norm", ROW_OPS)
def test_same_bits_as_the_python_functions(native, case, norm):
    dtype, shape, ns, params, pdtype, layout = case
    if "rms" in norm:
        params = params.replace("b", "")
    g = torch.Generator().manual_seed(len(shape) * 7 + len(params))
    x = (torch.randn(shape, generator=g) * 3 + 1).to(dtype).requires_grad_()
    res = torch.randn(shape, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(ns, generator=g) + 1).to(pdtype).requires_grad_() if "w" in params else None
    b = torch.randn(ns, generator=g).to(pdtype).requires_grad_() if "b" in params else None
    if layout == "c":
        gy = torch.randn(shape, generator=g).to(dtype)
    elif layout == "transposed":
        # a batch_first attention's gradient: each row contiguous, the rows
        # in another order than C's (read in place)
        gy = torch.randn(shape[1], shape[0], shape[2], generator=g).to(dtype).transpose(0, 1)
    else:
        # rows not contiguous: copied first
        gy = torch.randn(shape[:-1] + (2 * shape[-1],), generator=g).to(dtype)[..., ::2]
    gh = torch.randn(shape, generator=g).to(dtype)
    op = {"layer_norm": lambda x, w, b: ct.layer_norm(x, ns, w, b, 1e-5),
          "rms_norm": lambda x, w: ct.rms_norm(x, ns, w),
          "add_layer_norm": lambda x, r, w, b: ct.add_layer_norm(x, r, ns, w, b, 1e-5),
          "add_rms_norm": lambda x, r, w: ct.add_rms_norm(x, r, ns, w)}[norm]
    args = ((x, res) if norm.startswith("add") else (x,)) + ((w,) if "rms" in norm else (w, b))
    # the fused forms: both results used, y's alone, h's alone
    uses = [(gy, gh), (gy, None), (None, gh)] if norm.startswith("add") else [(gy,)]
    for grads in uses:
        node, native = _run(op, args, grads, python=False)
        assert "cynorm_native" in node
        pnode, python = _run(op, args, grads, python=True)
        assert pnode.endswith("_plainBackward")
        _same(native, python)
    # and PyTorch's answer, to its dtype's accuracy
    ref = (torch.nn.functional.layer_norm if "layer" in norm else torch.nn.functional.rms_norm)
    h = (x + res) if norm.startswith("add") else x
    tail = args[-1:] if "rms" in norm else args[-2:]
    want = ref(*[a.double() if isinstance(a, torch.Tensor) else a
                 for a in (h.detach(), ns) + tuple(tail)])
    tol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 2e-2)
    torch.testing.assert_close(native[0].double(), want, rtol=tol, atol=tol)


def test_only_the_gradients_asked_for(native):
    x = torch.randn(4, 3, 8)
    w = torch.randn(8, requires_grad=True)
    b = torch.randn(8)
    y = ct.layer_norm(x, 8, w, b)
    assert "cynorm_native" in _node(y)
    gw, = torch.autograd.grad(y.sum() * 2, w)
    xh = (x - x.double().mean(-1, keepdim=True).float())
    xh = xh / (x.double().var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt().float()
    torch.testing.assert_close(gw, 2 * xh.sum((0, 1)), rtol=1e-4, atol=1e-4)
    # x's gradient alone
    xg = x.clone().requires_grad_()
    gx, = torch.autograd.grad(ct.rms_norm(xg, [8], w.detach()).sum(), xg)
    ref = xg.detach().requires_grad_()
    gr, = torch.autograd.grad(torch.nn.functional.rms_norm(ref, [8], w.detach()).sum(), ref)
    torch.testing.assert_close(gx, gr, rtol=1e-4, atol=1e-5)


def test_calls_outside_the_plain_case_take_the_python_functions():
    # a transposed x, an empty batch, a float64 weight beside float32 x:
    # the Python Functions compute them (or torch's kernel raises, as before)
    t = torch.randn(2, 16, 4).transpose(1, 2).requires_grad_()
    y = ct.layer_norm(t, [16])
    assert _node(y).endswith("_plainBackward")
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(t, [16]))
    e = torch.randn(0, 8, requires_grad=True)
    assert ct.layer_norm(e, 8).shape == (0, 8)
    # the fused forms: a transposed residual
    x = torch.randn(2, 4, 16, requires_grad=True)
    r = torch.randn(4, 2, 16).transpose(0, 1).requires_grad_()
    y, h = ct.add_layer_norm(x, r, 16)
    assert _node(y).endswith("_plainBackward")
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x + r, [16]))
    with pytest.raises((RuntimeError, TypeError, ValueError)):
        ct.layer_norm(torch.randn(3, 8, requires_grad=True), 8,
                      torch.randn(8, dtype=torch.float64))


def test_wrong_shapes_raise_the_python_paths_errors():
    x = torch.randn(3, 8, requires_grad=True)
    with pytest.raises(ValueError, match="normalized_shape"):
        ct.layer_norm(x, 7)
    with pytest.raises(ValueError):
        ct.rms_norm(x, [8], torch.randn(7, requires_grad=True))


def _subprocess(code, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full, timeout=600)


CHECK = """
import warnings, torch, cynorm.torch as ct
x = torch.randn(4, 8, requires_grad=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    y = ct.layer_norm(x, 8)
y.sum().backward()
ref = x.detach().requires_grad_()
torch.nn.functional.layer_norm(ref, [8]).sum().backward()
torch.testing.assert_close(x.grad, ref.grad)
print("NODE", y.grad_fn.name())
print("STATUS", ct.native_status())
print("WARNINGS", [str(w.message) for w in caught])
"""


def test_turned_off_by_the_environment():
    run = _subprocess(CHECK, CYNORM_TORCH_NATIVE="0")
    assert run.returncode == 0, run.stderr
    assert "NODE _layer_norm_plainBackward" in run.stdout
    assert "STATUS off (CYNORM_TORCH_NATIVE=0)" in run.stdout
    assert "WARNINGS []" in run.stdout


def test_a_failed_build_warns_and_the_calls_still_compute(tmp_path):
    # a compiler that fails: the Python Functions take the calls, and one
    # warning says why
    run = _subprocess(CHECK, CYNORM_TORCH_NATIVE="1", CXX="false",
                      CYNORM_CACHE_DIR=str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert "NODE _layer_norm_plainBackward" in run.stdout
    assert "STATUS unavailable (the C++ compiler failed (exit 1)" in run.stdout
    assert "its compiled operators are unavailable" in run.stdout
    assert list(tmp_path.iterdir()) == []      # no partial library left behind


def test_gradcheck_through_the_compiled_operators(native):
    g = torch.Generator().manual_seed(3)
    x, w, b = (torch.randn(s, dtype=torch.float64, generator=g, requires_grad=True)
               for s in ((3, 5, 8), (8,), (8,)))
    assert torch.autograd.gradcheck(lambda x, w, b: ct.layer_norm(x, 8, w, b), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: ct.rms_norm(x, [8], w, 1e-6), (x, w))
    assert torch.autograd.gradcheck(lambda x, b: ct.layer_norm(x, 8, None, b), (x, b))
    r = torch.randn((3, 5, 8), dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, r, w, b: ct.add_layer_norm(x, r, 8, w, b),
                                    (x, r, w, b))
    assert torch.autograd.gradcheck(lambda x, r, w: ct.add_rms_norm(x, r, 8, w), (x, r, w))
    y, h = ct.add_rms_norm(x, r, 8, w)
    assert "cynorm_native::AddRMSNorm" in _node(y)


def test_saved_tensor_hooks_see_the_saved_tensors():
    # activation checkpointing and offloading work through saved-tensor hooks
    packed = []

    def pack(t):
        packed.append(t.shape)
        return t

    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = ct.layer_norm(x, 8, w)
    y.sum().backward()
    assert (4, 8) in packed and np.isfinite(x.grad.numpy()).all()
