"""cynorm.torch: the operators under autograd (gradcheck), the modules
against PyTorch's (outputs, gradients, running statistics, state_dict),
replace_norms, torch.compile(fullgraph=True) and torch.export."""
import copy
import warnings

import numpy as np

import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("cynorm.torch")

pytestmark = pytest.mark.torch

F = torch.nn.functional


def f64(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=g, requires_grad=True)


# ---- the operators' gradients against finite differences (float64) ---------

def test_layer_norm_and_rms_norm_gradcheck():
    x, w, b = f64(3, 5, 8), f64(8, seed=1), f64(8, seed=2)
    assert torch.autograd.gradcheck(lambda x, w, b: ct.layer_norm(x, 8, w, b), (x, w, b))
    assert torch.autograd.gradcheck(lambda x: ct.layer_norm(x, (5, 8)), (x,))
    assert torch.autograd.gradcheck(lambda x, w: ct.rms_norm(x, [8], w), (x, w))


def test_group_norm_gradcheck_both_layouts():
    x, w, b = f64(2, 6, 3, 4), f64(6, seed=1), f64(6, seed=2)
    assert torch.autograd.gradcheck(lambda x, w, b: ct.group_norm(x, 3, w, b), (x, w, b))
    xl = x.detach().to(memory_format=torch.channels_last).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w, b: ct.group_norm(x, 2, w, b), (xl, w, b))


def test_instance_norm_gradcheck():
    x, w, b = f64(2, 3, 5), f64(3, seed=1), f64(3, seed=2)
    assert torch.autograd.gradcheck(lambda x, w, b: ct.instance_norm(x, weight=w, bias=b),
                                    (x, w, b))
    rm, rv = torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5
    assert torch.autograd.gradcheck(
        lambda x, w, b: ct.instance_norm(x, rm, rv, w, b, use_input_stats=False), (x, w, b))


def test_batch_norm_gradcheck_training_and_eval():
    x, w, b = f64(4, 3, 5), f64(3, seed=1), f64(3, seed=2)
    assert torch.autograd.gradcheck(lambda x, w, b: ct.batch_norm(x, None, None, w, b, True),
                                    (x, w, b))
    rm, rv = torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5
    assert torch.autograd.gradcheck(lambda x, w, b: ct.batch_norm(x, rm, rv, w, b, False),
                                    (x, w, b))


# ---- outputs from PyTorch's side of the allocator, not cynorm's cache --------

def test_adapter_outputs_stay_out_of_the_block_cache():
    import cynorm
    x = torch.randn(2048, 512, requires_grad=True)
    xc = torch.randn(16, 64, 32, 32, requires_grad=True)
    mods = [(ct.LayerNorm(512), x), (ct.RMSNorm(512), x), (ct.GroupNorm(8, 64), xc),
            (ct.BatchNorm2d(64), xc), (ct.InstanceNorm2d(64, affine=True), xc)]
    info = cynorm.alloc_cache_info()
    assert info["limit"] > 0
    for m, t in mods:
        for _ in range(2):
            m(t).sum().backward()
    after = cynorm.alloc_cache_info()
    assert (after["hits"], after["misses"]) == (info["hits"], info["misses"])
    # (the same sizes through cynorm's NumPy API do go through it)
    cynorm.layer_norm(x.detach().numpy(), (512,))
    assert cynorm.alloc_cache_info()["misses"] + cynorm.alloc_cache_info()["hits"] > (
        after["hits"] + after["misses"])


# ---- forward mode (dual tensors, torch.func) ---------------------------------

_G = torch.Generator().manual_seed(5)
RM, RV = (torch.randn(3, dtype=torch.float64, generator=_G),
          torch.rand(3, dtype=torch.float64, generator=_G) + 0.5)


# (name, cynorm's function, torch's, the shapes of its differentiable inputs)
FORWARD_CASES = [
    ("layer_norm", lambda x, w, b: ct.layer_norm(x, 8, w, b),
     lambda x, w, b: F.layer_norm(x, (8,), w, b), [(3, 5, 8), (8,), (8,)]),
    ("rms_norm", lambda x, w: ct.rms_norm(x, [8], w), lambda x, w: F.rms_norm(x, [8], w),
     [(3, 5, 8), (8,)]),
    ("group_norm", lambda x, w, b: ct.group_norm(x, 3, w, b),
     lambda x, w, b: F.group_norm(x, 3, w, b), [(2, 6, 3, 4), (6,), (6,)]),
    ("instance_norm", lambda x, w, b: ct.instance_norm(x, weight=w, bias=b),
     lambda x, w, b: F.instance_norm(x, weight=w, bias=b), [(2, 3, 5), (3,), (3,)]),
    ("batch_norm training", lambda x, w, b: ct.batch_norm(x, None, None, w, b, True),
     lambda x, w, b: F.batch_norm(x, None, None, w, b, True), [(4, 3, 5), (3,), (3,)]),
    ("batch_norm eval", lambda x, w, b: ct.batch_norm(x, RM, RV, w, b, False),
     lambda x, w, b: F.batch_norm(x, RM, RV, w, b, False), [(4, 3, 5), (3,), (3,)]),
    ("weight_norm", lambda v, g: ct._weight_norm(v, g, 0)[0],
     # (torch's _weight_norm has no forward-mode formula: its definition)
     lambda v, g: g * v / torch.linalg.vector_norm(v, dim=1, keepdim=True), [(5, 7), (5, 1)]),
]
FORWARD_IDS = [c[0] for c in FORWARD_CASES]


def _inputs(shapes, seed=0):
    return [f64(*s, seed=seed + i) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("name, ours, theirs, shapes", FORWARD_CASES, ids=FORWARD_IDS)
def test_forward_ad_gradcheck(name, ours, theirs, shapes):
    # dual tensors through the Function's jvp (cynorm.jvp's rules), against
    # finite differences; the backward checked alongside
    torch.manual_seed(0)
    assert torch.autograd.gradcheck(ours, tuple(_inputs(shapes)), check_forward_ad=True)


@pytest.mark.parametrize("name, ours, theirs, shapes", FORWARD_CASES, ids=FORWARD_IDS)
def test_torch_func_jvp_and_grad_match_torch(name, ours, theirs, shapes):
    primals = [t.detach() for t in _inputs(shapes)]
    tangents = [t.detach() for t in _inputs(shapes, seed=10)]
    torch.manual_seed(0)
    y, ty = torch.func.jvp(ours, tuple(primals), tuple(tangents))
    torch.manual_seed(0)
    ry, rty = torch.func.jvp(theirs, tuple(primals), tuple(tangents))
    torch.testing.assert_close(y, ry)
    torch.testing.assert_close(ty, rty)
    argnums = tuple(range(len(primals)))
    torch.manual_seed(0)
    g = torch.func.grad(lambda *a: (ours(*a) ** 2).sum(), argnums)(*primals)
    torch.manual_seed(0)
    rg = torch.func.grad(lambda *a: (theirs(*a) ** 2).sum(), argnums)(*primals)
    torch.testing.assert_close(g, rg)


def test_dual_tensor_tangents_reach_the_output():
    # a tangent is never dropped: before forward mode was wired, a dual
    # tensor's tangent vanished and the output had none
    import torch.autograd.forward_ad as fwad
    x, w, b = (t.detach() for t in _inputs([(3, 5, 8), (8,), (8,)]))
    tx, tw, tb = (t.detach() for t in _inputs([(3, 5, 8), (8,), (8,)], seed=10))
    with fwad.dual_level():
        y = ct.layer_norm(fwad.make_dual(x, tx), 8, fwad.make_dual(w, tw), fwad.make_dual(b, tb))
        ry = F.layer_norm(fwad.make_dual(x, tx), (8,), fwad.make_dual(w, tw),
                          fwad.make_dual(b, tb))
        torch.testing.assert_close(fwad.unpack_dual(y).tangent, fwad.unpack_dual(ry).tangent)


def test_second_derivatives_are_refused():
    x, w = _inputs([(3, 5, 8), (8,)])
    with pytest.raises(NotImplementedError, match="derivative of a derivative"):
        gx, = torch.autograd.grad((ct.layer_norm(x, 8, w) ** 2).sum(), x, create_graph=True)
    inner = torch.func.grad(lambda a: (ct.rms_norm(a, [8], w.detach()) ** 2).sum())
    with pytest.raises(NotImplementedError, match="derivative of a derivative"):
        torch.func.grad(lambda a: inner(a).sum())(x.detach())
    with pytest.raises(NotImplementedError, match="derivative of a derivative"):
        torch.func.jvp(inner, (x.detach(),), (torch.ones_like(x),))


def test_output_layouts_are_pytorchs():
    # layer norm, RMS norm and instance norm: y contiguous whatever x's
    # strides; group and batch norm keep channels last; the fused forms' h
    # as x + residual.  Eager (with and without grad), compiled, forward
    # mode and torch.func give the same layout
    import torch.autograd.forward_ad as fwad
    t = torch.randn(2, 16, 4).transpose(1, 2)
    c = torch.randn(2, 8, 5, 5).to(memory_format=torch.channels_last)
    cases = [(lambda f, x: f(x, [16]), F.layer_norm, ct.layer_norm, t),
             (lambda f, x: f(x, [16]), F.rms_norm, ct.rms_norm, t),
             (lambda f, x: f(x), F.instance_norm, ct.instance_norm, c),
             (lambda f, x: f(x, 2), F.group_norm, ct.group_norm, c),
             (lambda f, x: f(x, None, None, training=True), F.batch_norm, ct.batch_norm, c)]
    for call, theirs, ours, x in cases:
        want = call(theirs, x).stride()
        assert call(ours, x).stride() == want
        xg = x.detach().requires_grad_()
        y = call(ours, xg)
        assert y.stride() == want
        y.sum().backward()
        assert xg.grad.stride() == x.stride()
        compiled = torch.compile(lambda a: call(ours, a), fullgraph=True, backend="eager")
        assert compiled(x).stride() == want
        with fwad.dual_level():
            p, d = fwad.unpack_dual(call(ours, fwad.make_dual(x, torch.randn_like(x))))
        assert p.stride() == want and d.stride() == want
        assert torch.func.grad(lambda a: call(ours, a).sum())(x).stride() == x.stride()
    r = torch.randn_like(t)
    for fused, norm in [(ct.add_layer_norm, F.layer_norm), (ct.add_rms_norm, F.rms_norm)]:
        y, h = fused(t, r, 16)
        assert y.stride() == norm(t + r, [16]).stride() and h.stride() == (t + r).stride()
    y = ct.LayerNorm(16)(t)
    torch.testing.assert_close(y.view(2, -1), torch.nn.LayerNorm(16)(t).view(2, -1))


def test_vmap_is_refused_with_a_runtime_error():
    # vmap's own check refuses the forward; in a backward (jacrev, batched
    # gradients) the batched tensor reaches the operator, which says so
    x = torch.randn(3, 6, requires_grad=True)
    with pytest.raises(RuntimeError, match="vmap"):
        torch.func.vmap(lambda a: ct.layer_norm(a, 6))(x)
    for op in (lambda a: ct.layer_norm(a, 6), lambda a: ct.rms_norm(a, [6]),
               lambda a: ct.group_norm(a.reshape(1, 6, 3), 2),
               lambda a: ct.batch_norm(a, None, None, training=True)):
        with pytest.raises(RuntimeError, match="cynorm.torch's operators do not support vmap"):
            torch.func.jacrev(op)(x)
        y = op(x)
        with pytest.raises(RuntimeError, match="cynorm.torch's operators do not support vmap"):
            torch.autograd.grad(y, x, torch.randn((2,) + y.shape), is_grads_batched=True)


# ---- autograd's bookkeeping, as torch's own ops keep it ---------------------

@pytest.mark.parametrize("which", ["input", "weight"])
def test_a_saved_tensor_changed_in_place_is_an_error(which):
    # as with torch's ops: a backward after x or the weight changed in place
    # (an optimizer step before it) raises rather than computing from new values
    for f in (ct.layer_norm, F.layer_norm):
        x, w = _inputs([(3, 5, 8), (8,)])
        xx = x * 1.0
        y = f(xx, (8,), w)
        with torch.no_grad():
            (xx if which == "input" else w).add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def test_running_statistics_updated_in_place_as_torch_does():
    ref = torch.nn.BatchNorm2d(3)
    ours = copy.deepcopy(ref)
    ct.replace_norms(ours)
    x = torch.randn(4, 3, 5, 5, requires_grad=True)
    before = (ours.running_mean.data_ptr(), ours.running_mean._version)
    ours(x).sum().backward()
    ref(x).sum().backward()
    # the module's own buffer, written in place, its version bumped as by
    # torch's kernel (what autograd checks saved tensors against)
    assert ours.running_mean.data_ptr() == before[0]
    assert ours.running_mean._version > before[1]
    torch.testing.assert_close(ours.running_mean, ref.running_mean)
    torch.testing.assert_close(ours.running_var, ref.running_var)
    # eval: the gradient of the statistics as they were used, whatever a
    # later training call does to the buffers before the backward
    ours.eval()
    xe = torch.randn(4, 3, 5, 5, requires_grad=True)
    y = ours(xe)
    want = torch.autograd.grad(F.batch_norm(xe, ours.running_mean.clone(),
                                            ours.running_var.clone(), ours.weight, ours.bias,
                                            False).sum(), xe)[0]
    ours.train()
    ours(torch.randn(4, 3, 5, 5) * 5 + 3)
    got = torch.autograd.grad(y.sum(), xe)[0]
    torch.testing.assert_close(got, want)


def test_a_second_backward_through_freed_buffers_is_an_error():
    x, w = _inputs([(3, 5, 8), (8,)])
    y = ct.rms_norm(x, [8], w)
    y.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()



def test_a_tensor_kept_from_a_torch_func_transform_takes_its_gradient():
    # a tensor kept from inside torch.func.grad is a dead wrapper: as with
    # PyTorch's own ops, it stands for the tensor it wraps, and the
    # gradient reaches that tensor
    x, w = _inputs([(3, 8), (8,)])
    kept = {}

    def f(x):
        kept["x"] = x
        return x.sin().sum()

    torch.func.grad(f)(x)
    ct.layer_norm(kept["x"], [8], w).pow(2).sum().backward()
    ours = x.grad.clone()
    x.grad = None
    F.layer_norm(x, [8], w).pow(2).sum().backward()
    torch.testing.assert_close(ours, x.grad)

# ---- the modules against PyTorch's ----------------------------------------

MODULES = [
    (lambda: torch.nn.LayerNorm(16), (4, 7, 16)),
    (lambda: torch.nn.LayerNorm((7, 16), elementwise_affine=False), (4, 7, 16)),
    (lambda: torch.nn.RMSNorm(16), (4, 7, 16)),
    (lambda: torch.nn.RMSNorm(16, eps=1e-3), (4, 7, 16)),
    (lambda: torch.nn.GroupNorm(4, 8), (3, 8, 5, 5)),
    (lambda: torch.nn.BatchNorm1d(8), (6, 8)),
    (lambda: torch.nn.BatchNorm1d(8, momentum=None), (6, 8, 5)),
    (lambda: torch.nn.BatchNorm2d(8), (4, 8, 5, 5)),
    (lambda: torch.nn.BatchNorm3d(4, affine=False), (2, 4, 3, 3, 3)),
    (lambda: torch.nn.InstanceNorm1d(6), (3, 6, 10)),
    (lambda: torch.nn.InstanceNorm2d(6, affine=True, track_running_stats=True), (3, 6, 4, 5)),
    (lambda: torch.nn.InstanceNorm3d(4, affine=True), (2, 4, 3, 3, 4)),
    (lambda: torch.nn.InstanceNorm2d(6, affine=True), (6, 4, 5)),      # unbatched
]


@pytest.mark.parametrize("make, shape", MODULES)
def test_modules_match_torch(make, shape):
    ref = make()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.rand_like(p) + 0.5)
    ours = copy.deepcopy(ref)
    assert ct.replace_norms(ours) == [""]
    assert isinstance(ours, type(ref)) and type(ours) is not type(ref)
    for training in (True, True, False):
        ref.train(training)
        ours.train(training)
        x = torch.randn(*shape) * 3 + 1
        xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
        yr, yo = ref(xr), ours(xo)
        torch.testing.assert_close(yo, yr, rtol=1e-5, atol=1e-5)
        dy = torch.randn_like(yr)
        yr.backward(dy)
        yo.backward(dy)
        torch.testing.assert_close(xo.grad, xr.grad, rtol=1e-4, atol=1e-5)
        for (name, pr), po in zip(ref.named_parameters(), ours.parameters()):
            torch.testing.assert_close(po.grad, pr.grad, rtol=1e-4, atol=1e-4, msg=name)
        for (name, br), bo in zip(ref.named_buffers(), ours.buffers()):
            torch.testing.assert_close(bo, br, rtol=1e-5, atol=1e-6, msg=name)
    # state_dict: the same keys, and round trips
    assert list(ours.state_dict()) == list(ref.state_dict())
    fresh = make()
    ct.replace_norms(fresh)
    fresh.load_state_dict(ref.state_dict())
    for (k, a), b in zip(fresh.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, msg=k)


def test_bfloat16_module_and_channels_last():
    ref = torch.nn.GroupNorm(4, 8)
    ours = copy.deepcopy(ref)
    ct.replace_norms(ours)
    x = torch.randn(2, 8, 6, 6).to(memory_format=torch.channels_last)
    y = ours(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, ref(x), rtol=1e-5, atol=1e-5)
    ln = ct.LayerNorm(32).to(torch.bfloat16)
    xb = torch.randn(5, 32).to(torch.bfloat16)
    torch.testing.assert_close(ln(xb).float(), F.layer_norm(xb.float(), (32,), ln.weight.float(),
                                                            ln.bias.float()), rtol=2e-2, atol=2e-2)


def test_tensors_cynorm_does_not_take_run_torch():
    x = torch.randn(4, 8, dtype=torch.complex64)
    with pytest.raises(RuntimeError):        # torch's own error for complex input
        ct.layer_norm(x, 8)
    m = ct.LayerNorm(8)
    assert torch.equal(m(torch.zeros(2, 8)), torch.zeros(2, 8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_tensors_read_in_place_in_any_layout(dtype):
    # cynorm reads a tensor's memory through its data pointer and strides:
    # a transposed tensor, one that starts past its storage's first element,
    # and a weight with a stride give torch's values and gradients
    x = torch.randn(5, 9, 12, dtype=dtype)[1:, 2:, 1:9].transpose(0, 1).requires_grad_()
    w = torch.randn(16, dtype=dtype)[::2].requires_grad_()
    assert x.storage_offset() > 0 and not x.is_contiguous() and w.stride() == (2,)
    xs = torch.randn(40, dtype=dtype)[3:].as_strided((4, 8), (1, 4)).detach().requires_grad_()
    assert xs.storage_offset() == 3
    tol = dict(atol=2e-2, rtol=2e-2) if dtype in (torch.bfloat16, torch.float16) else {}
    for t in (x, xs):
        g = torch.randn(t.shape, dtype=dtype)
        ours = ct.layer_norm(t, [8], w)
        ours.backward(g)
        got = (ours.detach(), t.grad, w.grad)
        t.grad = w.grad = None
        theirs = F.layer_norm(t, [8], w)
        theirs.backward(g)
        for a, b in zip(got, (theirs.detach(), t.grad, w.grad)):
            torch.testing.assert_close(a, b, **tol)
        t.grad = w.grad = None


def test_empty_and_negative_view_tensors():
    # a tensor with no element, and one with the negative bit set (its
    # memory holds -values): read through Tensor.numpy(), which resolves it
    x = torch.randn(0, 8, requires_grad=True)
    assert ct.layer_norm(x, 8).shape == (0, 8)
    y = torch.randn(3, 8, dtype=torch.float64)
    neg = torch._neg_view(y)
    assert neg.is_neg()
    torch.testing.assert_close(ct.layer_norm(neg, 8), F.layer_norm(-y, [8]))
    w = torch._neg_view(torch.randn(8, dtype=torch.float64))
    torch.testing.assert_close(ct.layer_norm(y, 8, w), F.layer_norm(y, [8], w.resolve_neg()))


def test_replace_norms_names_and_refusals():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8),
                                torch.nn.Sequential(torch.nn.BatchNorm1d(8), torch.nn.ReLU()))
    assert ct.replace_norms(model) == ["1", "2.0"]
    assert isinstance(model[1], ct.LayerNorm) and isinstance(model[2][0], ct.BatchNorm1d)
    assert ct.replace_norms(model) == []          # already swapped: nothing left
    meta = torch.nn.Sequential(torch.nn.LayerNorm(8)).to("meta")
    with pytest.raises(ValueError, match=r"replace_norms: 0 \(LayerNorm\) is on meta"):
        ct.replace_norms(meta)
    assert type(meta[0]) is torch.nn.LayerNorm
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got NoneType"):
        ct.replace_norms(None)


# ---- torch.compile and torch.export ----------------------------------------

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.gn = torch.nn.GroupNorm(2, 8)
        self.inorm = torch.nn.InstanceNorm2d(8, affine=True, track_running_stats=True)
        self.ln = torch.nn.LayerNorm(8)
        self.rms = torch.nn.RMSNorm(8)

    def forward(self, x):
        h = self.gn(self.bn(self.conv(x)).relu())
        h = h * self.inorm(h)
        h = h.mean((2, 3))
        return self.rms(self.ln(h))


def test_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    model = Block()
    ct.replace_norms(model)
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(4, 3, 6, 6)
    torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)
    compiled(x).sum().backward()
    eager(x).sum().backward()
    for (name, a), b in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(model.bn.running_mean, eager.bn.running_mean)
    torch.testing.assert_close(model.inorm.running_var, eager.inorm.running_var)


def _batch_norm_steps(model, x, steps=2):
    """Training steps (forward, backward) then an eval forward: the outputs,
    the input's and parameters' gradients, and the buffers after each."""
    out = []
    for _ in range(steps):
        xi = x.detach().clone().requires_grad_()
        y = model(xi)
        (y.float() * torch.linspace(-1, 2, y.numel()).view(y.shape)).sum().backward()
        out += [y, xi.grad] + [p.grad.clone() for p in model.parameters()]
        out += [b.clone() for b in model.buffers()]
        model.zero_grad()
    model.eval()
    out.append(model(x))
    model.train()
    return out


@pytest.mark.parametrize("dtype,channels_last", [(torch.float32, False), (torch.float32, True),
                                                 (torch.float64, False), (torch.bfloat16, True)])
def test_compiled_batch_norm_matches_eager(dtype, channels_last):
    # under torch.compile batch norm runs cynorm's statistics operator and
    # leaves the normalization and the gradient to Inductor's loops
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.BatchNorm2d(6), torch.nn.ReLU()).to(dtype)
    with torch.no_grad():
        model[0].weight.uniform_(0.5, 1.5)
        model[0].bias.uniform_(-1, 1)
    ct.replace_norms(model)
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    x = (torch.randn(4, 6, 5, 5) * 2 + 3).to(dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    got, want = _batch_norm_steps(compiled, x), _batch_norm_steps(eager, x)
    tol = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12),
           torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}[dtype]
    for i, (a, b) in enumerate(zip(got, want)):
        scale = max(1.0, float(b.detach().abs().max()))
        torch.testing.assert_close(a, b, rtol=tol["rtol"], atol=tol["atol"] * scale,
                                   msg=f"output {i}")


@pytest.mark.parametrize("make,shape", [
    (lambda: torch.nn.BatchNorm1d(5), (7, 5)),
    (lambda: torch.nn.BatchNorm1d(5, momentum=None), (3, 5, 4)),
    (lambda: torch.nn.BatchNorm2d(5, affine=False), (3, 5, 2, 2)),
    (lambda: torch.nn.BatchNorm2d(5, track_running_stats=False), (3, 5, 2, 2)),
])
def test_compiled_batch_norm_module_variants(make, shape):
    torch.manual_seed(1)
    ref = make()
    model = copy.deepcopy(ref)
    ct.replace_norms(model)
    torch._dynamo.reset()
    x = torch.randn(*shape)
    got = _batch_norm_steps(torch.compile(model, fullgraph=True), x, steps=3)
    for i, (a, b) in enumerate(zip(got, _batch_norm_steps(ref, x, steps=3))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"output {i}")


def test_compiled_batch_norm_is_cynorms_statistics_operator():
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))
    ct.replace_norms(model)
    torch._dynamo.reset()
    backend = AotEagerAndRecordGraphs()
    torch.compile(model, backend=backend, fullgraph=True)(torch.randn(2, 3, 4, 4)).sum().backward()
    forward = {str(n.target) for g in backend.fw_graphs for n in g.graph.nodes}
    backward = {str(n.target) for g in backend.bw_graphs for n in g.graph.nodes}
    # the statistics are cynorm's; no batch norm operator, PyTorch's or cynorm's
    assert "cynorm.batch_norm_moments.default" in forward, forward
    assert not [t for t in forward | backward if "batch_norm" in t and "moments" not in t]
    assert "aten.sum.dim_IntList" in backward
    # one value per channel: the eager call's error (fullgraph=True wraps it,
    # as it wraps the one torch's own batch norm raises)
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        torch.compile(model, backend="eager")(torch.randn(1, 3, 1, 1))


def test_compiled_batch_norm_keeps_the_precision_of_data_far_from_zero():
    # mean 1e4, std 1: float32 y within a few float32 roundings of the float64
    # result (a float32 mean alone is off by up to 5e-4, and y with it)
    g = torch.Generator().manual_seed(3)
    x = (1e4 + torch.randn(8, 3, 16, 16, dtype=torch.float64, generator=g)).float()
    x64 = x.double()
    want = (x64 - x64.mean((0, 2, 3), keepdim=True)) / torch.sqrt(
        x64.var((0, 2, 3), unbiased=False, keepdim=True) + 1e-5)
    torch._dynamo.reset()
    f = torch.compile(lambda x: ct.batch_norm(x, None, None, None, None, True), fullgraph=True)
    # (docs/torch.rst: within 3e-7 of float64 relative to max(|y|, 1))
    err = ((f(x).double() - want).abs() / want.abs().clamp(min=1)).max().item()
    assert err < 3e-7, err


def test_export_runs_cynorm_operators():
    model = Block().eval()
    ct.replace_norms(model)
    x = torch.randn(2, 3, 6, 6)
    ep = torch.export.export(model, (x,))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"cynorm.layer_norm.default", "cynorm.rms_norm.default",
            "cynorm.group_norm.default", "cynorm.batch_norm.default",
            "cynorm.instance_norm.default"} <= targets
    torch.testing.assert_close(ep.module()(x), model(x))


# ---- the residual-fused norms (two results with gradients: y and h) ---------

# (name, cynorm's function, torch's unfused composition, their inputs' shapes)
ADD_CASES = [
    ("add_rms_norm", lambda x, r, w: ct.add_rms_norm(x, r, 8, w),
     lambda x, r, w: (F.rms_norm(x + r, (8,), w), x + r), [(3, 5, 8), (3, 5, 8), (8,)]),
    ("add_layer_norm", lambda x, r, w, b: ct.add_layer_norm(x, r, [8], w, b),
     lambda x, r, w, b: (F.layer_norm(x + r, (8,), w, b), x + r),
     [(3, 5, 8), (3, 5, 8), (8,), (8,)]),
]
ADD_IDS = [c[0] for c in ADD_CASES]


def _both(y, h):
    # a loss that reaches h through y and on its own
    return (y * torch.linspace(-1, 2, y.numel(), dtype=y.dtype).view(y.shape)).sum() \
        + (h * h).sum()


@pytest.mark.parametrize("name, ours, theirs, shapes", ADD_CASES, ids=ADD_IDS)
def test_residual_fused_norms_gradcheck(name, ours, theirs, shapes):
    # both outputs' gradients, and forward mode (cynorm.jvp's rules)
    assert torch.autograd.gradcheck(ours, tuple(_inputs(shapes)), check_forward_ad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("name, ours, theirs, shapes", ADD_CASES, ids=ADD_IDS)
def test_residual_fused_norms_match_the_unfused_composition(name, ours, theirs, shapes, dtype):
    g = torch.Generator().manual_seed(3)
    x, r = (torch.randn(*shapes[0], generator=g).to(dtype).requires_grad_() for _ in range(2))
    params = [torch.randn(*s, generator=g, requires_grad=True) for s in shapes[2:]]
    if dtype == torch.float64:
        params = [p.detach().double().requires_grad_() for p in params]
    y, h = ours(x, r, *params)
    assert y.dtype == h.dtype == dtype and y.shape == h.shape == x.shape
    _both(y.double(), h.double()).backward()
    got = [y, h] + [t.grad for t in [x, r] + params]
    for t in [x, r] + params:
        t.grad = None
    # torch's composition in float64 from the same inputs: the reference
    ry, rh = theirs(*[t.double() for t in [x, r] + params])
    _both(ry, rh).backward()
    want = [ry, rh] + [t.grad for t in [x, r] + params]
    tol = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 5e-2}[dtype]
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol, msg=str(i))
    assert torch.equal(h, x + r)       # h rounded to x's dtype, as the unfused add


@pytest.mark.parametrize("name, ours, theirs, shapes", ADD_CASES, ids=ADD_IDS)
def test_residual_fused_norms_under_torch_func(name, ours, theirs, shapes):
    primals = tuple(t.detach() for t in _inputs(shapes))
    tangents = tuple(t.detach() for t in _inputs(shapes, seed=10))
    out, tout = torch.func.jvp(ours, primals, tangents)
    rout, rtout = torch.func.jvp(theirs, primals, tangents)
    torch.testing.assert_close(out, rout)
    torch.testing.assert_close(tout, rtout)
    argnums = tuple(range(len(primals)))
    g = torch.func.grad(lambda *a: _both(*ours(*a)), argnums)(*primals)
    rg = torch.func.grad(lambda *a: _both(*theirs(*a)), argnums)(*primals)
    torch.testing.assert_close(g, rg)


def test_residual_fused_norm_with_one_result_used():
    x, r, w = _inputs([(4, 8), (4, 8), (8,)])
    y, h = ct.add_rms_norm(x, r, 8, w)
    h.sum().backward()           # y not used: x and r take h's gradient alone
    assert torch.equal(x.grad, torch.ones_like(x)) and torch.equal(r.grad, torch.ones_like(r))
    assert w.grad is None
    x.grad = r.grad = None
    y, h = ct.add_layer_norm(x, r, 8, w)
    y.sum().backward()           # h not used
    hh = (x + r).detach().requires_grad_()
    F.layer_norm(hh, (8,), w.detach()).sum().backward()
    torch.testing.assert_close(x.grad, hh.grad)
    torch.testing.assert_close(r.grad, hh.grad)


def test_residual_fused_norm_h_changed_in_place_is_an_error():
    x, r = _inputs([(4, 8), (4, 8)])
    y, h = ct.add_rms_norm(x, r, 8)
    h.add_(1.0)                  # the backward reads h
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (y * 2).sum().backward()


def test_residual_fused_norm_inputs_changed_in_place_are_not_read_again():
    # the backward reads h, not x or residual: changing them in place after
    # the call is no error, and the call keeps neither alive
    import weakref
    x, r, w = _inputs([(4, 8), (4, 8), (8,)])
    hh = (x + r).detach().requires_grad_()
    F.rms_norm(hh, (8,), w.detach()).sum().backward()
    r = r.detach().clone()
    y, h = ct.add_rms_norm(x, r, 8, w)
    r.add_(1.0)
    with torch.no_grad():
        x.add_(1.0)
    (y.sum() + h.sum()).backward()
    torch.testing.assert_close(x.grad, hh.grad + 1)
    xd, rd = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    y, h = ct.add_layer_norm(xd * 1.0, rd, 8)
    refs = weakref.ref(rd)
    del rd
    assert refs() is None


def test_residual_fused_norm_h_has_a_gradient_only_with_x_or_residual():
    x, r, w = torch.randn(4, 8), torch.randn(4, 8), torch.randn(8, requires_grad=True)
    y, h = ct.add_rms_norm(x, r, 8, w)
    assert y.requires_grad and not h.requires_grad     # as x + r
    y, h = ct.add_rms_norm(x, r.requires_grad_(), 8, w)
    assert h.requires_grad


def test_residual_fused_norm_errors_and_fallback():
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match="residual must be a torch.Tensor"):
        ct.add_rms_norm(x, x.numpy(), 8)
    # a residual the kernel does not take (broadcast, another dtype: a float32
    # residual stream beside bfloat16 activations): PyTorch's add, then
    # cynorm's norm, with torch's broadcasting and type promotion
    w = torch.randn(8)
    for xi, r in ((x, torch.randn(1, 8)), (x.to(torch.bfloat16), torch.randn(4, 8))):
        y, h = ct.add_rms_norm(xi, r, 8, w)
        assert torch.equal(h, xi + r)
        torch.testing.assert_close(y, ct.rms_norm(xi + r, 8, w), rtol=0, atol=0)
    xb = x.to(torch.bfloat16).requires_grad_()
    r = torch.randn(4, 8, requires_grad=True)
    y, h = ct.add_layer_norm(xb, r, 8)
    assert y.dtype == h.dtype == torch.float32
    (y * h).sum().backward()
    assert xb.grad.dtype == torch.bfloat16 and r.grad.shape == r.shape
    # tensors cynorm does not take: the composition in torch's operators
    xm, rm = torch.randn(4, 8, device="meta"), torch.randn(4, 8, device="meta")
    y, h = ct.add_layer_norm(xm, rm, 8)
    assert y.device.type == h.device.type == "meta" and y.shape == (4, 8)


def test_residual_fused_norm_operators_pass_torchs_opcheck():
    # the schema, the fake kernels against the real ones, the autograd
    # registration, AOT dispatch with dynamic shapes (torch.library.opcheck)
    x, r, gy = (torch.randn(3, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    w, b = torch.randn(8), torch.randn(8)
    ops = torch.ops.cynorm
    torch.library.opcheck(ops.add_rms_norm.default, (x.requires_grad_(), r, [8], w, None))
    torch.library.opcheck(ops.add_layer_norm.default, (x, r, [8], w, b, 1e-5))
    x = x.detach()
    _, h, rstd = ops.add_rms_norm(x, r, [8], w, None)
    torch.library.opcheck(ops.add_rms_norm_backward.default,
                          (gy, None, h, [8], rstd, w, [True, True]))
    _, h, mean, rstd = ops.add_layer_norm(x, r, [8], None, b, 1e-5)
    torch.library.opcheck(ops.add_layer_norm_backward.default,
                          (gy, gy, h, [8], mean, rstd, None, b, [True, False, True]))


def test_residual_fused_norms_compile_and_export():
    torch._dynamo.reset()

    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8))
            self.b = torch.nn.Parameter(torch.randn(8))

        def forward(self, x, r):
            y, h = ct.add_rms_norm(x, r, 8, self.w)
            y2, h2 = ct.add_layer_norm(y, h, 8, self.w, self.b)
            return y2 * h2

    torch.manual_seed(0)
    model = Blocks()
    eager = copy.deepcopy(model)
    x, r = torch.randn(6, 8, requires_grad=True), torch.randn(6, 8)
    xe = x.detach().clone().requires_grad_()
    out = torch.compile(model, fullgraph=True)(x, r)
    torch.testing.assert_close(out, eager(xe, r))
    out.sum().backward()
    eager(xe, r).sum().backward()
    torch.testing.assert_close(x.grad, xe.grad)
    for (name, a), b in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    ep = torch.export.export(model, (x.detach(), r))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"cynorm.add_rms_norm.default", "cynorm.add_layer_norm.default"} <= targets
    torch.testing.assert_close(ep.module()(x.detach(), r), eager(x.detach(), r))


# ---- weight norm -------------------------------------------------------------

def test_weight_norm_gradcheck():
    v, g = f64(5, 7), f64(5, 1, seed=1)
    assert torch.autograd.gradcheck(lambda v, g: ct._weight_norm(v, g, 0)[0], (v, g))
    v, g = f64(3, 4, 2, seed=2), f64(1, 4, 1, seed=3)
    assert torch.autograd.gradcheck(lambda v, g: ct._weight_norm(v, g, 1)[0], (v, g))
    assert torch.autograd.gradcheck(lambda v, g: ct._weight_norm(v, g, None)[0],
                                    (v, f64(1, 1, 1, seed=4)))


@pytest.mark.parametrize("dim", [0, 1, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_weight_norm_matches_torchs_parametrization(dim, dtype):
    torch.manual_seed(0)
    ours, theirs = torch.nn.Conv2d(3, 4, 3).to(dtype), torch.nn.Conv2d(3, 4, 3).to(dtype)
    theirs.load_state_dict(ours.state_dict())
    ct.weight_norm(ours, dim=dim)
    torch.nn.utils.parametrizations.weight_norm(theirs, dim=dim)
    assert type(ours.parametrizations.weight[0]) is ct.WeightNorm
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    x = torch.randn(2, 3, 6, 6, dtype=dtype)
    y, want = ours(x), theirs(x)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(y, want, **tol)
    y.square().sum().backward()
    want.square().sum().backward()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        if dtype == torch.bfloat16:     # both round the float32 gradient: two bfloat16 steps
            tol = dict(rtol=1.6e-2, atol=1.6e-2 * float(b.grad.abs().max()))
        torch.testing.assert_close(a.grad, b.grad, msg=name, **tol)
    # the state_dict round trip, and the old-style weight_g / weight_v keys
    sd = theirs.state_dict()
    old = {"weight_g": sd["parametrizations.weight.original0"],
           "weight_v": sd["parametrizations.weight.original1"], "bias": sd["bias"]}
    for state in (sd, old):
        fresh = ct.weight_norm(torch.nn.Conv2d(3, 4, 3).to(dtype), dim=dim)
        fresh.load_state_dict(state)
        torch.testing.assert_close(fresh(x), y)


def test_replace_norms_swaps_weight_norm_and_compile_takes_it():
    model = torch.nn.Sequential(torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(6, 4)),
                                torch.nn.LayerNorm(4))
    eager = copy.deepcopy(model)
    assert ct.replace_norms(model) == ["0.parametrizations.weight.0", "1"]
    x = torch.randn(3, 6)
    torch.testing.assert_close(model(x), eager(x))
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), eager(x))
    ep = torch.export.export(model, (x,))
    assert "cynorm.weight_norm.default" in {str(n.target) for n in ep.graph.nodes}


# ---- argument errors: the classes PyTorch raises -----------------------------

_X = torch.randn(4, 6, 5)
_BAD_CALLS = {
    "layer norm's shape": (lambda m, x: m.layer_norm(x, (4,)), ValueError),
    "layer norm's weight": (lambda m, x: m.layer_norm(x, (5,), torch.ones(4)), ValueError),
    "RMS norm's shape": (lambda m, x: m.rms_norm(x, (4,)), ValueError),
    "group count": (lambda m, x: m.group_norm(x, 4), ValueError),
    "group norm's weight": (lambda m, x: m.group_norm(x, 3, torch.ones(5)), ValueError),
    "running statistics' shape": (
        lambda m, x: m.batch_norm(x, torch.zeros(5), torch.ones(5), training=True), ValueError),
    "instance norm's running statistics": (
        lambda m, x: m.instance_norm(x, torch.zeros(5), torch.ones(5)), ValueError),
}


@pytest.mark.parametrize("name", list(_BAD_CALLS))
@pytest.mark.parametrize("mode", ["no grad", "grad", "torch.func"])
def test_argument_errors_are_also_pytorchs_class(name, mode):
    # torch raises RuntimeError for these; cynorm.torch a ValueError or
    # TypeError (as its NumPy functions) that is a RuntimeError too
    call, kind = _BAD_CALLS[name]
    x = _X.clone().requires_grad_(mode != "no grad")
    with pytest.raises(RuntimeError):
        call(F, x)
    with pytest.raises(kind) as info:
        if mode == "torch.func":
            torch.func.grad(lambda x: call(ct, x).sum())(x.detach())
        else:
            call(ct, x)
    assert isinstance(info.value, RuntimeError)
    assert type(info.value) in (ct.ArgumentError, ct.ArgumentTypeError)
    # the message and the traceback are the kernels' own
    assert info.traceback[-1].name != "run" and str(info.value)


def test_value_errors_where_pytorch_raises_value_errors():
    x = torch.randn(1, 3, 1)
    for m in (F, ct):
        with pytest.raises(ValueError, match="more than 1 value per channel when training"):
            m.batch_norm(x, None, None, training=True)
        with pytest.raises(ValueError, match="more than 1 spatial element when training"):
            m.instance_norm(x)
        with pytest.raises(ValueError, match="more than 1 spatial element when training"):
            m.instance_norm(torch.randn(2, 3, 1, 1, 1), use_input_stats=True)
    for module in (torch.nn.InstanceNorm1d(3), ct.InstanceNorm1d(3)):
        with pytest.raises(ValueError, match="more than 1 spatial element when training"):
            module(x)
    # with the running statistics, one element per instance is normalized
    rm, rv = torch.rand(3), torch.rand(3) + 0.5
    torch.testing.assert_close(ct.instance_norm(x, rm, rv, use_input_stats=False),
                               F.instance_norm(x, rm, rv, use_input_stats=False))
    with pytest.raises(RuntimeError, match="running_mean and running_var are required"):
        ct.batch_norm(torch.randn(4, 3), None, None)


def test_number_arguments_as_pytorch_takes_them():
    x = torch.randn(4, 6, 5)
    for eps in (True, torch.tensor(1e-5), np.float32(1e-5), 1e-5):
        torch.testing.assert_close(ct.layer_norm(x, 5, eps=eps), F.layer_norm(x, (5,), eps=eps))
    torch.testing.assert_close(ct.group_norm(x, np.int64(3)), F.group_norm(x, 3))
    for m in (F, ct):
        # a string, None: refused (float("1e-5") would read it)
        with pytest.raises(TypeError, match="eps"):
            m.layer_norm(x, (5,), eps="1e-5")
        with pytest.raises(TypeError, match="momentum"):
            m.batch_norm(x, torch.zeros(6), torch.ones(6), momentum=None)
        # a float group count: refused (int() would truncate it); a bool too
        for groups in (1.5, True):
            with pytest.raises(TypeError, match="num_groups"):
                m.group_norm(x, groups)


@pytest.mark.parametrize("training", [False, True])
def test_running_statistics_that_require_grad_are_refused(training):
    # PyTorch's operators have no derivative in them, and say so; a silently
    # missing gradient is worse
    x = torch.randn(8, 4, 5)
    for m in (F, ct):
        for rm, rv in ((torch.zeros(4, requires_grad=True), torch.ones(4)),
                       (torch.zeros(4), torch.ones(4, requires_grad=True))):
            with pytest.raises(RuntimeError, match="not differentiable with respect to "
                                                   "(argument ')?running_(mean|var)"):
                m.batch_norm(x, rm, rv, training=training)
            with pytest.raises(RuntimeError, match="not differentiable with respect to "
                                                   "(argument ')?running_(mean|var)"):
                m.instance_norm(x, rm, rv, use_input_stats=training)
    # without grad mode they normalize, as PyTorch's
    rm, rv = torch.rand(4).requires_grad_(), torch.rand(4) + 0.5
    with torch.no_grad():
        torch.testing.assert_close(ct.batch_norm(x, rm, rv), F.batch_norm(x, rm, rv))


def test_parameters_outside_the_dtype_rule_run_pytorchs_kernels():
    # a float64 weight beside float32 input: PyTorch's answer, or its error
    x = torch.randn(4, 6, 5)
    w64 = torch.rand(5, dtype=torch.float64) + 0.5
    with warnings.catch_warnings():
        # (PyTorch's "Mismatch dtype" warning, given once a process)
        warnings.simplefilter("ignore", UserWarning)
        torch.testing.assert_close(ct.rms_norm(x, 5, w64), F.rms_norm(x, (5,), w64))
    for m in (F, ct):
        with pytest.raises(RuntimeError, match="mixed dtype"):
            m.layer_norm(x, (5,), w64)
    # float32 parameters beside bfloat16 input are cynorm's (its rule)
    xb, w = x.bfloat16(), torch.rand(5) + 0.5
    y = ct.rms_norm(xb, 5, w)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), F.rms_norm(xb.float(), (5,), w), atol=2e-2, rtol=1e-2)
