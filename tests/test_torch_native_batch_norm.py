"""cynorm.torch's compiled batch norm (cynorm/_torch_ops.cpp): eager calls
with gradients run it where it is loaded; it gives the bits of the Python
Function (the same kernels) for every dtype, layout, parameter set, mode
and gradient layout, updates the running statistics in place as that path
does (their version counters bumped), and hands anything outside its plain
case to the Python Function."""
import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("cynorm.torch")

from torch_native_helpers import native, node, run, same  # noqa: E402,F401

pytestmark = pytest.mark.torch

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
C = 6


def _x(shape, dtype, layout, g):
    x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4
                         else torch.channels_last_3d)
    return x


def _grad(like, layout, g):
    gy = torch.randn(like.shape, generator=g).to(like.dtype)
    if layout == "channels_last":
        return gy.contiguous(memory_format=torch.channels_last if gy.dim() == 4
                             else torch.channels_last_3d)
    if layout == "expanded":        # y.sum()'s gradient: one value, broadcast
        return torch.ones((), dtype=like.dtype).expand(like.shape)
    return gy


def _cases():
    # (dtype, x shape, x layout, parameters, parameter dtype, running statistics'
    # dtype (None: none), gradient layout)
    for dtype in DTYPES:
        wide = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        for params in ("wb", "w", "b", ""):
            yield dtype, (4, C, 5, 3), "c", params, dtype, dtype, "c"
        yield dtype, (4, C, 5, 3), "channels_last", "wb", wide, wide, "channels_last"
        yield dtype, (4, C, 5, 3), "channels_last", "wb", dtype, dtype, "c"
        yield dtype, (4, C, 5, 3), "c", "wb", dtype, dtype, "channels_last"
        yield dtype, (2, C, 3, 2, 4), "channels_last", "wb", dtype, None, "channels_last"
        yield dtype, (16, C), "c", "wb", wide, None, "expanded"
        yield dtype, (3, C, 40), "c", "w", dtype, wide, "c"


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("case", list(_cases()), ids=str)
def test_same_bits_as_the_python_function(native, case, training):
    dtype, shape, layout, params, pdtype, sdtype, glayout = case
    if not training and sdtype is None:
        sdtype = pdtype             # inference needs the running statistics
    g = torch.Generator().manual_seed(len(shape) * 11 + len(params))
    x = _x(shape, dtype, layout, g).requires_grad_()
    w = (torch.rand(C, generator=g) + 0.5).to(pdtype).requires_grad_() if "w" in params else None
    b = torch.randn(C, generator=g).to(pdtype).requires_grad_() if "b" in params else None
    rm = torch.randn(C, generator=g).to(sdtype) if sdtype is not None else None
    rv = (torch.rand(C, generator=g) + 0.5).to(sdtype) if sdtype is not None else None
    gy = _grad(x, glayout, g)

    def op(x, w, b):
        # fresh running statistics for each path, returned to compare
        m, v = (None if s is None else s.clone() for s in (rm, rv))
        y = ct.batch_norm(x, m, v, w, b, training, 0.1, 1e-5)
        return (y,) + tuple(s for s in (m, v) if s is not None)

    name, compiled = run(op, (x, w, b), (gy,), python=False)
    assert "cynorm_native::BatchNorm" in name
    pname, python = run(op, (x, w, b), (gy,), python=True)
    assert pname.endswith("_batch_norm_plainBackward")
    same(compiled, python)
    # and PyTorch's answer, to its dtype's accuracy
    m, v = (None if s is None else s.double() for s in (rm, rv))
    want = torch.nn.functional.batch_norm(
        x.detach().double(), m, v, None if w is None else w.detach().double(),
        None if b is None else b.detach().double(), training, 0.1, 1e-5)
    tol = {torch.float64: 1e-10, torch.float32: 1e-5}.get(dtype, 3e-2)
    torch.testing.assert_close(compiled[0].double(), want, rtol=tol, atol=tol)
    if training and rm is not None:
        torch.testing.assert_close(compiled[1].double(), m, rtol=tol, atol=tol)
        torch.testing.assert_close(compiled[2].double(), v, rtol=tol, atol=tol)


def test_the_running_statistics_are_updated_in_place(native):
    bn = ct.BatchNorm2d(C)
    x = torch.randn(4, C, 3, 3, requires_grad=True)
    ref = torch.nn.BatchNorm2d(C)
    before = bn.running_mean._version, bn.running_var._version
    y = bn(x)
    assert "cynorm_native::BatchNorm" in node(y)
    ref(x)
    # in place (the module's own buffers, their versions bumped, as PyTorch's)
    assert bn.running_mean._version > before[0] and bn.running_var._version > before[1]
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    assert int(bn.num_batches_tracked) == 1
    # eval: read, not updated
    bn.eval()
    kept = bn.running_mean.clone(), bn.running_mean._version
    y = bn(x)
    assert "cynorm_native::BatchNorm" in node(y)
    assert torch.equal(bn.running_mean, kept[0]) and bn.running_mean._version == kept[1]


def test_eval_backward_reads_the_statistics_the_forward_used(native):
    x = torch.randn(4, C, 5, requires_grad=True)
    rm, rv = torch.randn(C), torch.rand(C) + 0.5
    y = ct.batch_norm(x, rm, rv, None, None, False)
    rv.mul_(4.0)       # a later update of the buffers, before this backward
    y.backward(torch.ones_like(y))
    want = (1.0 / (rv / 4.0 + 1e-5).sqrt()).view(1, C, 1).expand_as(x)
    torch.testing.assert_close(x.grad, want)


def test_a_saved_input_modified_in_place_raises(native):
    x = torch.randn(4, C, 3, requires_grad=True)
    w = torch.rand(C, requires_grad=True)
    xx = x * 1.0
    y = ct.batch_norm(xx, None, None, w, None, True)
    xx.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_double_backward_raises(native):
    x = torch.randn(4, C, 3, requires_grad=True)
    y = ct.batch_norm(x, None, None, None, None, True)
    with pytest.raises(NotImplementedError, match="derivative of a derivative"):
        torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)


def test_gradcheck_through_the_compiled_operator(native):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, C, 4, dtype=torch.float64, generator=g, requires_grad=True)
    w = (torch.rand(C, dtype=torch.float64, generator=g) + 0.5).requires_grad_()
    b = torch.randn(C, dtype=torch.float64, generator=g, requires_grad=True)
    rm, rv = torch.zeros(C, dtype=torch.float64), torch.ones(C, dtype=torch.float64)
    assert "cynorm_native::BatchNorm" in node(ct.batch_norm(x, None, None, w, b, True))
    assert torch.autograd.gradcheck(
        lambda x, w, b: ct.batch_norm(x, None, None, w, b, True), (x, w, b))
    assert torch.autograd.gradcheck(
        lambda x, w, b: ct.batch_norm(x, rm.clone(), rv.clone(), w, b, False), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, b: ct.batch_norm(x, None, None, None, b, True),
                                    (x, b))
    xl = torch.randn(2, C, 3, 4, dtype=torch.float64, generator=g).contiguous(
        memory_format=torch.channels_last).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: ct.batch_norm(x, None, None, w, None, True),
                                    (xl, w))


def test_calls_outside_the_plain_case_take_the_python_function(native):
    w = torch.rand(C, requires_grad=True)
    # channels last with an axis of length 1 (its stride leaves the order
    # open), a strided x, a running statistic sharing x's memory: the
    # Python Function computes them
    for x in (torch.randn(1, C, 3, 3).contiguous(memory_format=torch.channels_last),
              torch.randn(4, 2 * C, 3)[:, ::2]):
        x.requires_grad_()
        y = ct.batch_norm(x, None, None, w, None, True)
        assert node(y).endswith("_batch_norm_plainBackward")
        torch.testing.assert_close(y, torch.nn.functional.batch_norm(x, None, None, w, None,
                                                                     True))
    buf = torch.zeros(C + 4 * C * 3)
    x = buf[C:].view(4, C, 3).normal_().requires_grad_()
    y = ct.batch_norm(x, buf[:C], torch.ones(C), w, None, True)
    assert node(y).endswith("_batch_norm_plainBackward")
    # one value per channel in training: the Python path's error
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        ct.batch_norm(torch.randn(1, C, requires_grad=True), None, None, w, None, True)
