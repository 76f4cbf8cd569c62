"""JVP test cases: every registered rule with float64 primals, tangents for
each differentiable argument, and the primal as a function of exactly those
arguments (saved statistics recomputed from the perturbed input, as
PyTorch's forward-mode decompositions define them) for finite differences."""
import numpy as np

import cynorm as cn

EPS = 1e-5


class Case:
    """`primals`/`kwargs` for cynorm.jvp(op, ...); `diff` the positions that
    get tangents; `f(*primals)` the primal for finite differences."""

    def __init__(self, name, op, primals, diff, f=None, kwargs=None, ignored=()):
        self.name, self.op, self.primals, self.diff = name, op, tuple(primals), tuple(diff)
        self.kwargs = kwargs or {}
        self.f = f or (lambda *p: op(*p, **self.kwargs))
        self.ignored = tuple(ignored)   # positions whose tangents the rule ignores

    def tangents(self, rng, which=None):
        which = self.diff if which is None else which
        return tuple(rng.standard_normal(np.shape(p)).astype(np.asarray(p).dtype)
                     if i in which else None for i, p in enumerate(self.primals))

    def __repr__(self):
        return self.name


def _ln_stats(x, ns):
    return cn.layer_norm(x, ns, eps=EPS)[1:]


def _rms_stat(x, ns):
    return cn.rms_norm(x, ns, eps=EPS)[1]


def _gn_stats(x, G, axis=1):
    return cn.group_norm(x, G, eps=EPS, axis=axis)[1:]


def _bn_stats(x, axis=1):
    return cn.batch_norm(x, training=True, eps=EPS, axis=axis)[1:]


def cases(rng):
    r = rng.standard_normal
    x4 = r((4, 3, 5, 6))
    out = []
    # layer norm
    x, w, b = r((6, 4, 9)), rng.random((4, 9)) + 0.5, r((4, 9))
    out.append(Case("layer_norm", cn.layer_norm, (x, (4, 9), w, b), (0, 2, 3)))
    dy = r(x.shape)
    mean, rstd = _ln_stats(x, (4, 9))
    out.append(Case("layer_norm_backward", cn.layer_norm_backward,
                    (dy, x, (4, 9), mean, rstd, w, b), (0, 1, 5),
                    f=lambda dy, x, ns, mean, rstd, w, b: cn.layer_norm_backward(
                        dy, x, ns, *_ln_stats(x, ns), w, b), ignored=(3, 4)))
    out.append(Case("layer_norm_backward no weight", cn.layer_norm_backward,
                    (dy, x, (9,), *_ln_stats(x, (9,))), (0, 1),
                    f=lambda dy, x, ns, mean, rstd: cn.layer_norm_backward(
                        dy, x, ns, *_ln_stats(x, ns))))
    # RMS norm
    out.append(Case("rms_norm", cn.rms_norm, (x, (4, 9), w), (0, 2), kwargs=dict(eps=EPS)))
    out.append(Case("rms_norm_backward", cn.rms_norm_backward,
                    (dy, x, (4, 9), _rms_stat(x, (4, 9)), w), (0, 1, 4),
                    f=lambda dy, x, ns, rstd, w: cn.rms_norm_backward(
                        dy, x, ns, _rms_stat(x, ns), w), ignored=(3,)))
    out.append(Case("rms_norm_backward no weight", cn.rms_norm_backward,
                    (dy, x, (9,), _rms_stat(x, (9,))), (0, 1),
                    f=lambda dy, x, ns, rstd: cn.rms_norm_backward(dy, x, ns, _rms_stat(x, ns))))
    # the residual-fused forms: h = x + res, then the norm of h
    res, dh = r(x.shape), r(x.shape)
    h = x + res
    out.append(Case("add_layer_norm", cn.add_layer_norm, (x, res, (4, 9), w, b), (0, 1, 3, 4)))
    out.append(Case("add_layer_norm_backward", cn.add_layer_norm_backward,
                    (dy, dh, h, (4, 9), *_ln_stats(h, (4, 9)), w, b), (0, 1, 2, 6),
                    f=lambda dy, dh, h, ns, mean, rstd, w, b: cn.add_layer_norm_backward(
                        dy, dh, h, ns, *_ln_stats(h, ns), w, b), ignored=(4, 5)))
    out.append(Case("add_rms_norm", cn.add_rms_norm, (x, res, (4, 9), w), (0, 1, 3),
                    kwargs=dict(eps=EPS)))
    out.append(Case("add_rms_norm_backward", cn.add_rms_norm_backward,
                    (dy, dh, h, (4, 9), _rms_stat(h, (4, 9)), w), (0, 1, 2, 5),
                    f=lambda dy, dh, h, ns, rstd, w: cn.add_rms_norm_backward(
                        dy, dh, h, ns, _rms_stat(h, ns), w), ignored=(4,)))
    # group norm and instance norm, channels first and last
    xg, dyg = r((3, 6, 4, 5)), r((3, 6, 4, 5))
    gw, gb = rng.random(6) + 0.5, r(6)
    xgl, dygl = (np.ascontiguousarray(np.moveaxis(a, 1, -1)) for a in (xg, dyg))
    out.append(Case("group_norm", cn.group_norm, (xg, 3, gw, gb), (0, 2, 3)))
    out.append(Case("group_norm channels-last", cn.group_norm, (xgl, 2, gw, gb), (0, 2, 3),
                    kwargs=dict(axis=-1)))
    out.append(Case("group_norm_backward", cn.group_norm_backward,
                    (dyg, xg, *_gn_stats(xg, 3), gw, 3), (0, 1, 4),
                    f=lambda dy, x, mean, rstd, w, G: cn.group_norm_backward(
                        dy, x, *_gn_stats(x, G), w, G), ignored=(2, 3)))
    out.append(Case("group_norm_backward channels-last", cn.group_norm_backward,
                    (dygl, xgl, *_gn_stats(xgl, 2, -1), gw, 2), (0, 1, 4), kwargs=dict(axis=-1),
                    f=lambda dy, x, mean, rstd, w, G: cn.group_norm_backward(
                        dy, x, *_gn_stats(x, G, -1), w, G, axis=-1)))
    irm, irv = r(6) * 0.1, rng.random(6) + 0.5
    out.append(Case("instance_norm", cn.instance_norm, (xg, gw, gb), (0, 1, 2)))
    out.append(Case("instance_norm running stats", cn.instance_norm,
                    (xgl, gw, gb, irm, irv, False), (0, 1, 2, 3, 4), kwargs=dict(axis=-1)))
    im, ir = cn.instance_norm(xg)[1:]
    out.append(Case("instance_norm_backward", cn.instance_norm_backward,
                    (dyg, xg, im, ir, gw), (0, 1, 4),
                    f=lambda dy, x, mean, rstd, w: cn.instance_norm_backward(
                        dy, x, *cn.instance_norm(x)[1:], w), ignored=(2, 3)))
    em, er = cn.instance_norm(xg, running_mean=irm, running_var=irv, use_input_stats=False)[1:]
    out.append(Case("instance_norm_backward running stats", cn.instance_norm_backward,
                    (dyg, xg, em, er, gw, False), (0, 1, 2, 3, 4)))
    # batch norm
    C = x4.shape[1]
    bw, bb = rng.random(C) + 0.5, r(C)
    rm, rv = r(C) * 0.1, rng.random(C) + 0.5
    out.append(Case("batch_norm train", cn.batch_norm, (x4, bw, bb), (0, 1, 2),
                    kwargs=dict(training=True, eps=EPS)))
    out.append(Case("batch_norm eval", cn.batch_norm, (x4, bw, bb, rm, rv), (0, 1, 2, 3, 4),
                    kwargs=dict(training=False, eps=EPS)))
    xcl = np.ascontiguousarray(np.moveaxis(x4, 1, -1))
    out.append(Case("batch_norm train channels-last", cn.batch_norm, (xcl, bw, bb), (0, 1, 2),
                    kwargs=dict(training=True, eps=EPS, axis=-1)))
    dy4 = r(x4.shape)
    sm, si = _bn_stats(x4)
    out.append(Case("batch_norm_backward train", cn.batch_norm_backward,
                    (dy4, x4, bw, None, None, sm, si, True, EPS), (0, 1, 2),
                    f=lambda dy, x, w, rm_, rv_, sm_, si_, tr, eps: cn.batch_norm_backward(
                        dy, x, w, None, None, *_bn_stats(x), True, eps), ignored=(5, 6)))
    out.append(Case("batch_norm_backward eval", cn.batch_norm_backward,
                    (dy4, x4, bw, rm, rv, None, None, False, EPS), (0, 1, 2, 3, 4)))
    dycl = np.ascontiguousarray(np.moveaxis(dy4, 1, -1))
    out.append(Case("batch_norm_backward train channels-last", cn.batch_norm_backward,
                    (dycl, xcl, bw, None, None, *_bn_stats(xcl, -1), True, EPS), (0, 1, 2),
                    kwargs=dict(axis=-1),
                    f=lambda dy, x, w, rm_, rv_, sm_, si_, tr, eps: cn.batch_norm_backward(
                        dy, x, w, None, None, *_bn_stats(x, -1), True, eps, axis=-1)))
    out.append(Case("cudnn_batch_norm_backward", cn.cudnn_batch_norm_backward,
                    (x4, dy4, bw, rm, rv, sm, si, EPS), (0, 1, 2),
                    f=lambda x, dy, w, rm_, rv_, sm_, si_, eps: cn.cudnn_batch_norm_backward(
                        x, dy, w, rm_, rv_, *_bn_stats(x), eps)))
    out.append(Case("miopen_batch_norm_backward", cn.miopen_batch_norm_backward,
                    (x4, dy4, bw, rm, rv, sm, si, EPS), (0, 1, 2),
                    f=lambda x, dy, w, rm_, rv_, sm_, si_, eps: cn.miopen_batch_norm_backward(
                        x, dy, w, rm_, rv_, *_bn_stats(x), eps)))
    out.append(Case("aten.batch_norm_backward eval", cn.aten.batch_norm_backward,
                    (dy4, x4, bw, rm, rv, sm, si, False, EPS, (True, True, True)), (0, 1, 2, 3, 4)))
    # weight norm
    v, g = r((5, 4, 3)), rng.random((1, 4, 1)) + 0.5
    out.append(Case("weight_norm", cn.weight_norm, (v, g, 1), (0, 1)))
    out.append(Case("weight_norm_interface", cn.weight_norm_interface, (v, g, 1), (0, 1)))
    gw = r(v.shape)
    norm = cn.norm_except_dim(v, 2, 1)
    out.append(Case("weight_norm_backward", cn.weight_norm_backward, (gw, v, g, norm, 1), (0, 1, 2),
                    f=lambda gw, v, g, n, dim: cn.weight_norm_backward(
                        gw, v, g, cn.norm_except_dim(v, 2, dim), dim)))
    out.append(Case("weight_norm_backward dim=None", cn.weight_norm_backward,
                    (gw, v, np.array(1.3), cn.norm_except_dim(v, 2, None), None), (0, 1, 2),
                    f=lambda gw, v, g, n, dim: cn.weight_norm_backward(
                        gw, v, g, cn.norm_except_dim(v, 2, None), None)))
    for pw, dim in ((2, 0), (1, 1), (3, None), (np.inf, 2), (0.5, 1)):
        out.append(Case(f"norm_except_dim p={pw} dim={dim}", cn.norm_except_dim, (v, pw, dim), (0,)))
    # the split-statistics ops: the statistics and sums passed in are
    # independent arguments (another process computed them)
    out.append(Case("batch_norm_stats", cn.batch_norm_stats, (x4,), (0,), kwargs=dict(eps=EPS)))
    out.append(Case("batch_norm_stats channels-last", cn.batch_norm_stats, (xcl,), (0,),
                    kwargs=dict(eps=EPS, axis=-1)))
    shard_mean = r((3, C))
    shard_invstd = rng.random((3, C)) + 0.5
    out.append(Case("batch_norm_gather_stats", cn.batch_norm_gather_stats,
                    (shard_mean, shard_invstd, np.array([40.0, 0.0, 25.0])), (0, 1),
                    kwargs=dict(eps=EPS)))
    bm, bi = r(C), rng.random(C) + 0.5
    out.append(Case("batch_norm_elemt", cn.batch_norm_elemt, (x4, bw, bb, bm, bi), (0, 1, 2, 3, 4)))
    out.append(Case("batch_norm_elemt channels-last no affine", cn.batch_norm_elemt,
                    (xcl, None, None, bm, bi), (0, 3, 4), kwargs=dict(axis=-1)))
    out.append(Case("batch_norm_backward_reduce", cn.batch_norm_backward_reduce,
                    (dy4, x4, bm, bi, bw), (0, 1, 2, 3), ignored=(4,)))
    out.append(Case("batch_norm_backward_reduce input_g only", cn.batch_norm_backward_reduce,
                    (dy4, x4, bm, bi, None, True, False, False), (0, 1, 2, 3)))
    out.append(Case("batch_norm_backward_elemt", cn.batch_norm_backward_elemt,
                    (dy4, x4, bm, bi, bw, r(C), r(C), np.array([90.0, 110.0])),
                    (0, 1, 2, 3, 4, 5, 6)))
    out.append(Case("batch_norm_backward_elemt no weight", cn.batch_norm_backward_elemt,
                    (dy4, x4, bm, bi, None, r(C), r(C), 360), (0, 1, 2, 3, 5, 6)))
    # the seed's other ops
    out.append(Case("trace", cn.trace, (r((4, 6)),), (0,)))
    out.append(Case("log_sigmoid_forward", cn.log_sigmoid_forward, (r((7, 5)) * 3,), (0,)))
    s = r((4, 6, 3))
    out.append(Case("softmax", cn.softmax, (s, 1), (0,)))
    out.append(Case("log_softmax", cn.log_softmax, (s, -1), (0,)))
    y = cn.softmax(s, 1)
    out.append(Case("softmax_backward_data", cn.softmax_backward_data,
                    (r(s.shape), y, 1, np.float64), (0, 1)))
    ly = cn.log_softmax(s, 2)
    out.append(Case("log_softmax_backward_data", cn.log_softmax_backward_data,
                    (r(s.shape), ly, 2, np.float64), (0, 1)))
    lp = cn.log_softmax(r((6, 5)), 1)
    target = np.array([0, 4, -100, 2, 2, 1])
    cw = rng.random(5) + 0.5
    for red in ("none", "mean", "sum"):
        out.append(Case(f"nll_loss_forward {red}", cn.nll_loss_forward, (lp, target, cw, red), (0, 2)))
        out.append(Case(f"nll_loss {red}", cn.nll_loss, (lp, target, cw, red), (0, 2)))
        o, tw = cn.nll_loss_forward(lp, target, cw, red)
        go = r(o.shape)
        out.append(Case(f"nll_loss_backward {red}", cn.nll_loss_backward,
                        (go, lp, target, cw, red, -100, tw), (0, 3, 6)))
    lp2 = cn.log_softmax(r((2, 4, 3, 5)), 1)
    t2 = rng.integers(0, 4, (2, 3, 5))
    t2[0, 1, 2] = -100
    out.append(Case("nll_loss2d_forward mean", cn.nll_loss2d_forward, (lp2, t2, None, "mean"), (0,)))
    out.append(Case("nll_loss2d sum", cn.nll_loss2d, (lp2, t2, rng.random(4) + 0.5, "sum"), (0, 2)))
    o2, tw2 = cn.nll_loss2d_forward(lp2, t2, None, "none")
    out.append(Case("nll_loss2d_backward none", cn.nll_loss2d_backward,
                    (r(o2.shape), lp2, t2, None, "none", -100, tw2), (0,)))
    return out
