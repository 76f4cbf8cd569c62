"""cynorm.torch's compiled group norm and instance norm
(cynorm/_torch_ops.cpp): eager calls with gradients run them where they
are loaded; they give the bits of the Python Functions (the same kernels)
for every dtype, layout, parameter set and gradient layout, and hand
anything outside their plain case (instance norm with running statistics
among it) to those Functions."""
import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("cynorm.torch")

from torch_native_helpers import native, node, run, same  # noqa: E402,F401

pytestmark = pytest.mark.torch

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
C = 8


def _layout(t, layout):
    if layout == "channels_last":
        return t.contiguous(memory_format=torch.channels_last if t.dim() == 4
                            else torch.channels_last_3d)
    return t


def _cases():
    # (dtype, x shape, x layout, parameters, parameter dtype, gradient layout)
    for dtype in DTYPES:
        wide = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        for params in ("wb", "w", "b", ""):
            yield dtype, (3, C, 5, 4), "c", params, dtype, "c"
        yield dtype, (3, C, 5, 4), "channels_last", "wb", wide, "channels_last"
        yield dtype, (3, C, 5, 4), "channels_last", "wb", dtype, "c"
        yield dtype, (3, C, 5, 4), "c", "w", dtype, "channels_last"
        # an axis of length 1 beside channels last: read in place too
        yield dtype, (1, C, 3, 1, 5), "channels_last", "wb", dtype, "channels_last"
        yield dtype, (4, C, 33), "c", "wb", wide, "c"


def _args(case, g):
    dtype, shape, layout, params, pdtype, glayout = case
    x = _layout((torch.randn(shape, generator=g) * 2 + 1).to(dtype), layout).requires_grad_()
    w = (torch.rand(C, generator=g) + 0.5).to(pdtype).requires_grad_() if "w" in params else None
    b = torch.randn(C, generator=g).to(pdtype).requires_grad_() if "b" in params else None
    gy = _layout(torch.randn(shape, generator=g).to(dtype), glayout)
    return x, w, b, gy


@pytest.mark.parametrize("case", list(_cases()), ids=str)
@pytest.mark.parametrize("groups", [1, 4, C])
def test_group_norm_gives_the_python_functions_bits(native, case, groups):
    x, w, b, gy = _args(case, torch.Generator().manual_seed(groups + len(case[3])))

    def op(x, w, b):
        return ct.group_norm(x, groups, w, b, 1e-5)

    name, compiled = run(op, (x, w, b), (gy,), python=False)
    assert "cynorm_native::GroupNorm" in name
    pname, python = run(op, (x, w, b), (gy,), python=True)
    assert pname.endswith("_group_norm_plainBackward")
    same(compiled, python)
    want = torch.nn.functional.group_norm(
        x.detach().double(), groups, None if w is None else w.detach().double(),
        None if b is None else b.detach().double(), 1e-5)
    tol = {torch.float64: 1e-10, torch.float32: 1e-5}.get(case[0], 3e-2)
    torch.testing.assert_close(compiled[0].double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", list(_cases()), ids=str)
def test_instance_norm_gives_the_python_functions_bits(native, case):
    x, w, b, gy = _args(case, torch.Generator().manual_seed(len(case[3])))

    def op(x, w, b):
        return ct.instance_norm(x, None, None, w, b, True, 0.1, 1e-5)

    name, compiled = run(op, (x, w, b), (gy,), python=False)
    assert "cynorm_native::InstanceNorm" in name
    pname, python = run(op, (x, w, b), (gy,), python=True)
    assert pname.endswith("_instance_norm_plainBackward")
    same(compiled, python)
    assert compiled[0].is_contiguous()       # as PyTorch's instance norm returns y
    want = torch.nn.functional.instance_norm(
        x.detach().double(), None, None, None if w is None else w.detach().double(),
        None if b is None else b.detach().double(), True, 0.1, 1e-5)
    tol = {torch.float64: 1e-10, torch.float32: 1e-5}.get(case[0], 3e-2)
    torch.testing.assert_close(compiled[0].double(), want, rtol=tol, atol=tol)


def test_modules_run_the_compiled_operators(native):
    x = torch.randn(2, C, 6, 6, requires_grad=True)
    gn, ref = ct.GroupNorm(2, C), torch.nn.GroupNorm(2, C)
    y = gn(x)
    assert "cynorm_native::GroupNorm" in node(y)
    y.sum().backward()
    gx = x.grad.clone()
    x.grad = None
    ref(x).sum().backward()
    torch.testing.assert_close(gx, x.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gn.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-4)
    assert "cynorm_native::InstanceNorm" in node(ct.InstanceNorm2d(C, affine=True)(x))


def test_instance_norm_with_running_statistics_takes_the_python_function(native):
    # the running statistics' update is the Python path's
    m = ct.InstanceNorm2d(C, track_running_stats=True)
    ref = torch.nn.InstanceNorm2d(C, track_running_stats=True)
    x = torch.randn(3, C, 4, 4, requires_grad=True)
    y = m(x)
    assert node(y).endswith("_instance_norm_plainBackward")
    ref(x)
    torch.testing.assert_close(m.running_mean, ref.running_mean)
    torch.testing.assert_close(m.running_var, ref.running_var)


def test_gradcheck_through_the_compiled_operators(native):
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, C, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w = (torch.rand(C, dtype=torch.float64, generator=g) + 0.5).requires_grad_()
    b = torch.randn(C, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: ct.group_norm(x, 4, w, b), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, b: ct.group_norm(x, 2, None, b), (x, b))
    assert torch.autograd.gradcheck(
        lambda x, w, b: ct.instance_norm(x, None, None, w, b, True), (x, w, b))
    xl = torch.randn(2, C, 3, 2, dtype=torch.float64, generator=g).contiguous(
        memory_format=torch.channels_last).requires_grad_()
    assert "cynorm_native::GroupNorm" in node(ct.group_norm(xl, 2, w))
    assert torch.autograd.gradcheck(lambda x, w: ct.group_norm(x, 2, w), (xl, w))


def test_outside_the_plain_case_and_errors(native):
    # a strided x: the Python Function; groups that do not divide C: its error
    x = torch.randn(2, 2 * C, 5)[:, ::2].requires_grad_()
    y = ct.group_norm(x, 2)
    assert node(y).endswith("_group_norm_plainBackward")
    torch.testing.assert_close(y, torch.nn.functional.group_norm(x, 2))
    with pytest.raises(ValueError):
        ct.group_norm(torch.randn(2, C, 3, requires_grad=True), 3)
    with pytest.raises(NotImplementedError, match="derivative of a derivative"):
        xx = torch.randn(2, C, 3, requires_grad=True)
        torch.autograd.grad(ct.group_norm(xx, 2).pow(2).sum(), xx, create_graph=True)
