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
    if name == "rms_norm":
        x, ns, w = p
        return (lambda x, w: aten._fused_rms_norm(x, list(ns), w, EPS)), (x, w), \
            (tangents[0], tangents[2])
    if name.startswith("rms_norm_backward"):
        # no CPU backward op in torch: the gradients of F.rms_norm by torch.func.vjp
        # (forward over reverse), rstd recomputed from x
        dy, x, ns = p[:3]
        w = p[4] if len(p) > 4 else None

        def grads(dy, x, *w):
            _, pull = torch.func.vjp(
                lambda x, *w: torch.nn.functional.rms_norm(x, list(ns), *(w or (None,)), EPS),
                x, *w)
            return pull(dy)
        return grads, (dy, x) + ((w,) if w is not None else ()), \
            (tangents[0], tangents[1]) + ((tangents[4],) if w is not None else ())
    if name == "add_layer_norm":
        # torch's composition; its mean / rstd tangents are zero (see above)
        x, res, ns, w, b = p
        return (lambda x, r, w, b: (aten.native_layer_norm(x + r, list(ns), w, b, EPS)[0], x + r)), \
            (x, res, w, b), (tangents[0], tangents[1], tangents[3], tangents[4])
    if name == "add_layer_norm_backward":
        dy, dh, h, ns, mean, rstd, w, b = p
        tm, tr = _ln_rstd_tangent(h, ns, tangents[2])

        def f(dy, dh, h, m, r, w):
            gx, gw, gb = aten.native_layer_norm_backward(dy, h, list(ns), m, r, w, _t(b),
                                                         [True, True, True])
            return gx + dh, gw, gb
        return f, (dy, dh, h, mean, rstd, w), \
            (tangents[0], tangents[1], tangents[2], tm, tr, tangents[6])
    if name == "add_rms_norm":
        x, res, ns, w = p
        return (lambda x, r, w: (lambda y, rstd: (y, x + r, rstd))(
            *aten._fused_rms_norm(x + r, list(ns), w, EPS))), (x, res, w), \
            (tangents[0], tangents[1], tangents[3])
    if name == "add_rms_norm_backward":
        dy, dh, h, ns, _, w = p

        def f(dy, dh, h, w):
            _, pull = torch.func.vjp(
                lambda h, w: torch.nn.functional.rms_norm(h, list(ns), w, EPS), h, w)
            gh, gw = pull(dy)
            return gh + dh, gw
        return f, (dy, dh, h, w), (tangents[0], tangents[1], tangents[2], tangents[5])
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
    if name.startswith("norm_except_dim"):
        v, pw, dim = p
        if float(pw).is_integer() and dim is not None:
            return (lambda v: aten.norm_except_dim(v, int(pw), dim)), (v,), tangents[:1]
        # torch's norm_except_dim takes an integer p, and its forward AD
        # fails over all dims (dim=-1): the same norm by vector_norm
        axes = tuple(i for i in range(v.ndim) if dim is None or i != dim)
        return (lambda v: torch.linalg.vector_norm(v, pw, axes, keepdim=dim is not None)), (v,), \
            tangents[:1]
    if name.startswith("batch_norm_") and name.split()[0] in SPLIT_STATS:
        return _split_stats_call(name.split()[0], c, tangents)
    return None


# PyTorch has no forward-mode formulas for the split-statistics ops: their
# JVPs are compared with torch.func.jvp of each op's defining formula
SPLIT_STATS = ("batch_norm_stats", "batch_norm_gather_stats", "batch_norm_elemt",
               "batch_norm_backward_reduce", "batch_norm_backward_elemt")


def _split_stats_call(op, c, tangents):
    p, axis = c.primals, c.kwargs.get("axis", 1)
    x = p[1] if op.startswith("batch_norm_backward") else p[0]
    axis = axis % np.ndim(x)
    others = tuple(i for i in range(np.ndim(x)) if i != axis)

    def per_channel(a):      # a (C,) tensor broadcast along x's channel axis
        return a.reshape([-1 if i == axis else 1 for i in range(np.ndim(x))])

    def keep(which):         # the case's primals and tangents at positions `which`
        return tuple(p[i] for i in which), tuple(tangents[i] for i in which)
    if op == "batch_norm_stats":
        def f(x):
            return x.mean(others), 1 / torch.sqrt(x.var(others, unbiased=False) + EPS)
        return (f, *keep((0,)))
    if op == "batch_norm_gather_stats":
        n = torch.from_numpy(np.asarray(p[2], np.float64))[:, None]

        def f(mean, invstd):
            mu = (n * mean).sum(0) / n.sum()
            var = (n * (1 / invstd ** 2 - EPS + (mean - mu) ** 2)).sum(0) / n.sum()
            return mu, 1 / torch.sqrt(var + EPS)
        return (f, *keep((0, 1)))
    if op == "batch_norm_elemt":
        x_, w, b, mean, invstd = p
        diff = [i for i in c.diff]

        def f(*a):
            v = dict(zip(diff, a))
            y = (v[0] - per_channel(v[3])) * per_channel(v[4])
            y = y * per_channel(v[1]) if 1 in v else y
            return y + per_channel(v[2]) if 2 in v else y
        return (f, *keep(diff))
    if op == "batch_norm_backward_reduce":
        def f(dy, x, mean, invstd):
            s_dy, s_dxmu = dy.sum(others), (dy * (x - per_channel(mean))).sum(others)
            return s_dy, s_dxmu, s_dxmu * invstd, s_dy
        if len(p) > 5 and not p[6]:      # input_g only
            return ((lambda *a: f(*a)[:2]), *keep((0, 1, 2, 3)))
        return (f, *keep((0, 1, 2, 3)))
    if op == "batch_norm_backward_elemt":
        total = float(np.sum(p[7]))
        diff = [i for i in c.diff]

        def f(*a):
            v = dict(zip(diff, a))
            xmu = v[1] - per_channel(v[2])
            inv = per_channel(v[3])
            g = (v[0] - per_channel(v[5]) / total - xmu * inv * inv * per_channel(v[6]) / total) * inv
            return g * per_channel(v[4]) if 4 in v else g
        return (f, *keep(diff))
    raise AssertionError(op)


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
    if name == "add_layer_norm":        # y and h: torch's mean / rstd tangents are zero
        ours = ours[:2]
    for a, b in zip(ours, theirs):
        if a is None or b is None or b.numel() == 0:
            continue
        np.testing.assert_allclose(np.asarray(a), b.detach().numpy().reshape(np.shape(a)),
                                   rtol=1e-9, atol=1e-10, err_msg=name)
