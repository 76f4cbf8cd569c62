"""JVP rules of the ops in PyTorch's forward-mode decomposition table that are
not cynorm's normalizations: trace, log_sigmoid_forward, softmax and
log-softmax with their backward ops, the NLL losses and their backward ops,
and ATen's batch-norm backward adapters."""
import numpy as np

from cynorm import aten, nll_losses as _nll, pointwise as _pw, softmax_ops as _sm
from cynorm.forward_ad._registry import register_jvp
from cynorm.forward_ad.norm_rules import batch_norm_backward_output_tangents
from cynorm.forward_ad._common import bind, cast_like, m, math_dtype, zeros_like


@register_jvp(_pw.trace)
def _trace_jvp(primals, tangents, kwargs):
    args, t = bind(_pw.trace, primals, tangents, kwargs)
    out = _pw.trace(*primals, **kwargs)
    if t["x"] is None:
        return out, np.zeros_like(out)
    return out, _pw.trace(t["x"])


@register_jvp(_pw.log_sigmoid_forward)
def _log_sigmoid_forward_jvp(primals, tangents, kwargs):
    args, t = bind(_pw.log_sigmoid_forward, primals, tangents, kwargs)
    outs = _pw.log_sigmoid_forward(*primals, **kwargs)
    if t["x"] is None:
        return outs, zeros_like(outs)
    x = args["x"]
    dt = math_dtype(x.dtype)
    X, TX = m(x, dt), m(t["x"], dt)
    z = np.exp(-np.abs(X))
    sig_neg = np.where(X >= 0, z, 1.0) / (1.0 + z)          # sigmoid(-x), without overflow
    t_out = sig_neg * TX
    t_buf = -np.sign(X) * z * TX                             # d exp(-|x|); sign(0) = 0 as torch
    return outs, (cast_like(t_out, outs[0]), cast_like(t_buf, outs[1]))


def _softmax_dim(x, dim):
    return _sm._dim(dim, np.asarray(x))


@register_jvp(_sm.softmax, nondiff=("dim", "half_to_float"))
def _softmax_jvp(primals, tangents, kwargs):
    args, t = bind(_sm.softmax, primals, tangents, kwargs)
    y = _sm.softmax(*primals, **kwargs)
    if t["x"] is None:
        return y, np.zeros_like(y)
    d = _softmax_dim(args["x"], args["dim"])
    dt = math_dtype(y.dtype)
    Y, TX = m(y, dt), m(t["x"], dt)
    return y, cast_like(Y * (TX - np.sum(Y * TX, axis=d, keepdims=True)), y)


@register_jvp(_sm.log_softmax, nondiff=("dim", "half_to_float"))
def _log_softmax_jvp(primals, tangents, kwargs):
    args, t = bind(_sm.log_softmax, primals, tangents, kwargs)
    out = _sm.log_softmax(*primals, **kwargs)
    if t["x"] is None:
        return out, np.zeros_like(out)
    d = _softmax_dim(args["x"], args["dim"])
    dt = math_dtype(out.dtype)
    P, TX = np.exp(m(out, dt)), m(t["x"], dt)
    return out, cast_like(TX - np.sum(P * TX, axis=d, keepdims=True), out)


def _backward_data_rule(op, tangent):
    """A rule for softmax_backward_data / log_softmax_backward_data, whose
    primals grad_output and output are independent: `tangent(G, Y, TG, TY, d)`
    gives the tangent of grad_input (TG / TY None when not given)."""
    @register_jvp(op, nondiff=("dim", "input_dtype"))
    def rule(primals, tangents, kwargs):
        args, t = bind(op, primals, tangents, kwargs)
        gi = op(*primals, **kwargs)
        if t["grad_output"] is None and t["output"] is None:
            return gi, np.zeros_like(gi)
        y = np.asarray(args["output"])
        dt = math_dtype(y.dtype)
        return gi, cast_like(tangent(m(args["grad_output"], dt), m(y, dt), m(t["grad_output"], dt),
                                     m(t["output"], dt), _softmax_dim(y, args["dim"])), gi)
    return rule


def _softmax_backward_data_tangent(G, Y, TG, TY, d):
    # grad_input = y * (g - sum(g * y))
    res = np.zeros_like(Y)
    if TY is not None:
        res += TY * (G - np.sum(G * Y, axis=d, keepdims=True)) - Y * np.sum(G * TY, axis=d, keepdims=True)
    if TG is not None:
        res += Y * (TG - np.sum(TG * Y, axis=d, keepdims=True))
    return res


def _log_softmax_backward_data_tangent(G, Y, TG, TY, d):
    # grad_input = g - exp(out) * sum(g)
    P = np.exp(Y)
    res = np.zeros_like(P)
    if TY is not None:
        res -= P * TY * np.sum(G, axis=d, keepdims=True)
    if TG is not None:
        res += TG - P * np.sum(TG, axis=d, keepdims=True)
    return res


_backward_data_rule(_sm.softmax_backward_data, _softmax_backward_data_tangent)
_backward_data_rule(_sm.log_softmax_backward_data, _log_softmax_backward_data_tangent)


# ------------------------------------------------------------------- NLL loss
def _nll_forward_rule(op, two_d):
    @register_jvp(op, nondiff=("target", "reduction", "ignore_index"))
    def rule(primals, tangents, kwargs):
        args, t = bind(op, primals, tangents, kwargs)
        outs = op(*primals, **kwargs)
        out, total = outs if isinstance(outs, tuple) else (outs, None)
        if t["x"] is None and t["weight"] is None:
            return outs, zeros_like(outs)
        p = _nll._Problem(args["x"], args["target"], args["weight"], args["ignore_index"], two_d)
        r = _nll._reduction(args["reduction"])
        w = p.weights()
        t_losses = np.zeros(p.t.size)
        t_total = 0.0
        if t["x"] is not None:
            t_losses -= w * p.picked(p.as_rows(t["x"]))
        if t["weight"] is not None:
            tw = p.weights(t["weight"])
            t_losses -= tw * p.picked()
            # total_weight is weight's sum, as the primal reports it: also for
            # "none" on a single 1-D sample (ATen's weight[target] there)
            t_total = tw.sum() if r or p.x.ndim == 1 else 0.0
        if r == 0:
            t_out = t_losses.reshape(p.t_shape)
        elif r == 2:
            t_out = t_losses.sum()
        else:
            total = w.sum()
            with np.errstate(invalid="ignore", divide="ignore"):
                t_out = (t_losses.sum() - (-w * p.picked()).sum() / total * t_total) / total
        t_out = cast_like(t_out, np.asarray(out))
        if isinstance(outs, tuple):
            return outs, (t_out, cast_like(t_total, outs[1]))
        return outs, t_out
    return rule


for _op, _two_d in ((_nll.nll_loss_forward, False), (_nll.nll_loss2d_forward, True),
                    (_nll.nll_loss, False), (_nll.nll_loss2d, True)):
    _nll_forward_rule(_op, _two_d)


def _nll_backward_rule(op, two_d):
    # grad[k, t_k] = -weight[t_k] * g_k * s, s = 1 / total_weight for "mean", else 1
    @register_jvp(op, nondiff=("target", "reduction", "ignore_index"))
    def rule(primals, tangents, kwargs):
        args, t = bind(op, primals, tangents, kwargs)
        gi = op(*primals, **kwargs)
        if all(t[k] is None for k in ("grad_output", "weight", "total_weight")):
            return gi, np.zeros_like(gi)
        p = _nll._Problem(args["x"], args["target"], args["weight"], args["ignore_index"], two_d)
        r = _nll._reduction(args["reduction"])
        g = m(args["grad_output"], np.float64).reshape(-1)
        tw_total = np.float64(np.asarray(args["total_weight"], np.float64))
        w = p.weights()
        t_val = np.zeros(p.t.size)
        with np.errstate(invalid="ignore", divide="ignore"):   # total_weight 0: inf/nan, as the op
            scale = 1.0 / tw_total if r == 1 else 1.0
            if t["grad_output"] is not None:
                t_val -= w * m(t["grad_output"], np.float64).reshape(-1) * scale
            if t["weight"] is not None:
                t_val -= p.weights(t["weight"]) * g * scale
            if t["total_weight"] is not None and r == 1:
                t_val += w * g * float(t["total_weight"]) / (tw_total * tw_total)
        rows = np.zeros(p.rows.shape)
        if p.C:
            rows[np.arange(p.t.size), p.t] = np.where(p.valid, t_val, 0.0)
        return gi, cast_like(p.from_rows(rows), gi)
    return rule


_nll_backward_rule(_nll.nll_loss_backward, False)
_nll_backward_rule(_nll.nll_loss2d_backward, True)


# ------------------------------------------- ATen's batch-norm backward adapters
def _bn_adapter_rule(op, to_native):
    """A rule for an adapter: its arguments mapped to batch_norm_backward's
    by `to_native(args)` -> dict of batch_norm_backward's arguments."""
    @register_jvp(op, nondiff=("epsilon", "eps", "update", "output_mask", "reserveSpace", "reserve"),
                  ignored=("save_mean", "save_var"))
    def rule(primals, tangents, kwargs):
        args, t = bind(op, primals, tangents, kwargs)
        outs = op(*primals, **kwargs)       # its errors name op's own arguments
        return outs, batch_norm_backward_output_tangents(to_native(args), to_native(t), outs)
    return rule


def _common_args(a, training, eps, mask):
    return {"grad_out": a.get("grad_output", a.get("grad_out")), "x": a["input"],
            "weight": a["weight"], "running_mean": a["running_mean"],
            "running_var": a["running_var"], "save_mean": a["save_mean"],
            "save_invstd": a["save_var"], "training": training, "eps": eps, "output_mask": mask,
            "axis": 1}


_bn_adapter_rule(aten.cudnn_batch_norm_backward,
                 lambda a: _common_args(a, True, a["epsilon"], (True, True, True)))
_bn_adapter_rule(aten.miopen_batch_norm_backward,
                 lambda a: _common_args(a, True, a["epsilon"], (True, True, True)))
_bn_adapter_rule(aten.batch_norm_backward,
                 lambda a: _common_args(a, a["update"], a["eps"], a["output_mask"]))
