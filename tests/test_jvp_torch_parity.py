"""cynorm.jvp against torch.func.jvp of the corresponding ATen op (float64).

PyTorch declares some outputs non-differentiable and gives them zero
tangents: the mean / rstd / invstd of native_layer_norm and
native_batch_norm, log_sigmoid_forward's buffer and nll_loss_forward's
total_weight.  cynorm gives their true derivatives (test_jvp checks them by
finite differences), so for those ops only the first output is compared."""
import numpy as np
import pytest

import cynorm as cn
from jvp_cases import EPS, cases

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
aten = torch.ops.aten
CASES = {c.name: c for c in cases(np.random.default_rng(7))}
# torch takes no tangent for these arguments (running statistics in eval; the
# class weights of nll_loss_forward): cynorm's rule gets None for them too
NOT_IN_TORCH = {"batch_norm eval": (3, 4), "nll_loss_forward": (2,)}
FIRST_OUTPUT_ONLY = ("layer_norm", "batch_norm train", "log_sigmoid_forward", "nll_loss_forward")


def _weight_norm_backward_dim0():
    # torch's _weight_norm_differentiable_backward takes only the first or last dim
    rng = np.random.default_rng(3)
    v, g, gw = rng.standard_normal((4, 3, 5)), rng.random((4, 1, 1)) + 0.5, rng.standard_normal((4, 3, 5))
    c = CASES["weight_norm_backward"]
    return type(c)("weight_norm_backward dim0", c.op, (gw, v, g, cn.norm_except_dim(v, 2, 0), 0),
                   c.diff, ignored=c.ignored)


CASES["weight_norm_backward dim0"] = _weight_norm_backward_dim0()
RED = {"none": 0, "mean": 1, "sum": 2}


def _t(a):
    return None if a is None else torch.from_numpy(np.ascontiguousarray(a))


def _ln_rstd_tangent(x, ns, tx):
    # torch's decomposition recomputes the statistics: the saved-stat tangents
    # it sees must be d mean / d x and d rstd / d x for the comparison
    _, (_, tm, tr) = cn.jvp(cn.layer_norm, (x, ns), (tx, None))
    return tm, tr


# name -> (torch function of the differentiable tensors, which case primals feed it,
#          extra tangents derived from the case's for torch's saved statistics)
def _torch_call(name, c, tangents):
    p = c.primals
    if name == "layer_norm":
        x, ns, w, b = p
        return (lambda x, w, b: aten.native_layer_norm(x, list(ns), w, b, EPS)), (x, w, b), \
            (tangents[0], tangents[2], tangents[3])
    if name == "layer_norm_backward":
        dy, x, ns, mean, rstd, w, b = p
        tm, tr = _ln_rstd_tangent(x, ns, tangents[1])
        return (lambda dy, x, m, r, w: aten.native_layer_norm_backward(
            dy, x, list(ns), m, r, w, _t(b), [True, True, True])), (dy, x, mean, rstd, w), \
            (tangents[0], tangents[1], tm, tr, tangents[5])
    if name == "batch_norm train":
        x, w, b = p
        return (lambda x, w, b: aten.native_batch_norm(x, w, b, None, None, True, 0.1, EPS)), \
            (x, w, b), tangents
    if name == "batch_norm eval":
        # torch refuses tangents for the running statistics
        x, w, b, rm, rv = p
        return (lambda x, w, b: aten.native_batch_norm(x, w, b, _t(rm), _t(rv), False, 0.1, EPS)[0]), \
            (x, w, b), tangents[:3]
    if name == "batch_norm_backward train":
        dy, x, w, _, _, sm, si, _, eps = p
        _, (_, tm, ti) = cn.jvp(cn.batch_norm, (x,), (tangents[1],), eps=EPS)
        return (lambda dy, x, w, sm, si: aten.native_batch_norm_backward(
            dy, x, w, None, None, sm, si, True, eps, [True, True, True])), (dy, x, w, sm, si), \
            (tangents[0], tangents[1], tangents[2], tm, ti)
    if name == "batch_norm_backward eval":
        dy, x, w, rm, rv, _, _, _, eps = p
        return (lambda dy, x, w, rm, rv: aten.native_batch_norm_backward(
            dy, x, w, rm, rv, None, None, False, eps, [True, True, True])), (dy, x, w, rm, rv), tangents[:5]
    if name == "weight_norm_interface":
        # _weight_norm_interface has no forward-AD formula in torch; its
        # composite twin computes the same two outputs
        v, g, dim = p
        return (lambda v, g: (aten._weight_norm(v, g, dim), aten.norm_except_dim(v, 2, dim))), \
            (v, g), tangents[:2]
    if name == "weight_norm_backward dim0":
        gw, v, g, n, dim = p
        _, (_, tn) = cn.jvp(cn.weight_norm_interface, (v, g, dim), (tangents[1], None, None))
        return (lambda gw, v, g, n: aten._weight_norm_differentiable_backward(gw, v, g, n, dim)), \
            (gw, v, g, n), (tangents[0], tangents[1], tangents[2], tn)
    if name == "trace":
        return aten.trace, p, tangents
    if name == "log_sigmoid_forward":
        return aten.log_sigmoid_forward, p, tangents
    if name == "softmax":
        return (lambda x: aten._softmax(x, p[1], False)), p[:1], tangents[:1]
    if name == "log_softmax":
        return (lambda x: aten._log_softmax(x, p[1], False)), p[:1], tangents[:1]
    if name == "softmax_backward_data":
        return (lambda g, y: aten._softmax_backward_data(g, y, p[2], torch.float64)), p[:2], tangents[:2]
    if name == "log_softmax_backward_data":
        return (lambda g, y: aten._log_softmax_backward_data(g, y, p[2], torch.float64)), p[:2], \
            tangents[:2]
    if name.startswith("nll_loss_forward"):
        lp, target, w, red = p
        return (lambda x, w: aten.nll_loss_forward(x, _t(target), w, RED[red], -100)), (lp, w), \
            (tangents[0], tangents[2])
    if name.startswith("nll_loss_backward"):
        go, lp, target, w, red, ii, tw = p
        return (lambda go, w, tw: aten.nll_loss_backward(go, _t(lp), _t(target), w, RED[red], ii, tw)), \
            (go, w, tw), (tangents[0], tangents[3], tangents[6])
    if name == "nll_loss2d_forward mean":
        lp, target, w, red = p
        return (lambda x: aten.nll_loss2d_forward(x, _t(target), None, 1, -100)), (lp,), tangents[:1]
    return None


NAMES = [n for n in CASES if _torch_call(n, CASES[n], CASES[n].tangents(np.random.default_rng(0)))]


@pytest.mark.parametrize("name", NAMES)
def test_jvp_matches_torch_func_jvp(name, rng):
    c = CASES[name]
    tangents = c.tangents(rng)
    drop = next((v for k, v in NOT_IN_TORCH.items() if name.startswith(k)), ())
    tangents = tuple(None if i in drop else t for i, t in enumerate(tangents))
    _, ours = cn.jvp(c.op, c.primals, tangents, **c.kwargs)
    fn, tprimals, ttangents = _torch_call(name, c, tangents)
    tp = tuple(_t(a) for a in tprimals)
    tt = tuple(torch.zeros_like(a) if t is None else _t(t) for a, t in zip(tp, ttangents))
    _, theirs = torch.func.jvp(fn, tp, tt)
    ours = ours if isinstance(ours, tuple) else (ours,)
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    if name.startswith(FIRST_OUTPUT_ONLY):
        ours, theirs = ours[:1], theirs[:1]
    for a, b in zip(ours, theirs):
        if a is None or b is None or b.numel() == 0:
            continue
        np.testing.assert_allclose(np.asarray(a), b.detach().numpy().reshape(np.shape(a)),
                                   rtol=1e-9, atol=1e-10, err_msg=name)
