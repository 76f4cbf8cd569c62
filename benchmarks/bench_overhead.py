"""Fixed cost of one call: every public op of cynorm and its PyTorch twin on
tiny float32 inputs, in one process, interleaved, at each thread count.

    python benchmarks/bench_overhead.py                 # 1 and 2 threads
    python benchmarks/bench_overhead.py --threads 1 --calls 20000
    python benchmarks/bench_overhead.py --threads 1 --ops nll      # the NLL losses only
    python benchmarks/bench_overhead.py --dtype bfloat16           # a model cast to bfloat16

--dtype makes every floating input that dtype, the per-channel parameters
and running statistics too (what `model.to(torch.bfloat16)` gives torch);
the statistics an op returns keep their own dtype (float32 for 16-bit x).

A sample is the mean of `--inner` back-to-back calls; the median of the
samples (at least `--calls` calls in all) is reported in µs, with
torch/cynorm (above 1: cynorm's call is the cheaper).  The inputs are a few
elements, so the time is the cost of crossing into the op: argument checks,
output allocation, dispatch, the kernel's setup.  Nested ops run on a
two-component array against torch.nested's jagged layout; their backward
ops (no public torch twin) are timed alone, as are the ops torch has no CPU
kernel for (its split batch-norm statistics ops and the cudnn/miopen
adapters are CUDA-only).  jvp and cynorm.distributed are not listed
(torch.func's and torch.distributed's calls are not one op).
"""
import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import time_interleaved  # noqa: E402


def cases(cn, torch, dtype=np.float32):
    """(name, cynorm callable, torch callable) on tiny inputs of dtype."""
    rng = np.random.default_rng(0)
    dtype = np.dtype(dtype)

    def arr(*shape):
        return rng.standard_normal(shape).astype(dtype)

    def t(a):
        if a.dtype.name == "bfloat16":          # ml_dtypes' type: torch reads its bits
            return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(a.copy())

    arr.dtype = dtype
    arr.torch_dtype = t(np.zeros(1, dtype)).dtype

    # one function per family: each keeps its own inputs for its lambdas
    return [c for family in (weight_norm_cases, layer_norm_cases, group_norm_cases,
                             batch_norm_cases, softmax_cases, nll_cases, nested_cases)
            for c in family(cn, torch, arr, t)]


def weight_norm_cases(cn, torch, arr, t):
    """v (4, 3), g one per row, dim 0."""
    aten = torch.ops.aten
    v, g, gw = arr(4, 3), (np.abs(arr(4, 1)) + 0.5).astype(arr.dtype), arr(4, 3)
    tv, tg, tgw = t(v), t(g), t(gw)
    _, norm = cn.weight_norm_interface(v, g, 0)
    _, tnorm = torch._weight_norm_interface(tv, tg, 0)
    out, tout = (np.empty_like(v), np.empty_like(norm)), (torch.empty_like(tv), torch.empty_like(tnorm))
    return [
        ("weight_norm_interface", lambda: cn.weight_norm_interface(v, g, 0),
         lambda: torch._weight_norm_interface(tv, tg, 0)),
        ("weight_norm", lambda: cn.weight_norm(v, g, 0), lambda: torch._weight_norm(tv, tg, 0)),
        ("weight_norm_backward", lambda: cn.weight_norm_backward(gw, v, g, norm, 0),
         lambda: aten._weight_norm_interface_backward(tgw, tv, tg, tnorm, 0)),
        ("norm_except_dim", lambda: cn.norm_except_dim(v, 2, 0), lambda: torch.norm_except_dim(tv, 2, 0)),
        ("weight_norm_interface out=", lambda: cn.weight_norm_interface(v, g, 0, out=out),
         lambda: aten._weight_norm_interface.out(tv, tg, 0, out0=tout[0], out1=tout[1])),
    ]


def layer_norm_cases(cn, torch, arr, t):
    """(2, 4) over the last axis."""
    aten = torch.ops.aten
    x, dy, w, b = arr(2, 4), arr(2, 4), arr(4), arr(4)
    tx, tdy, tw, tb = t(x), t(dy), t(w), t(b)
    _, mean, rstd = cn.layer_norm(x, (4,), w, b)
    _, tmean, trstd = torch.native_layer_norm(tx, [4], tw, tb, 1e-5)
    out = (np.empty_like(x), np.empty_like(mean), np.empty_like(rstd))
    tout = (torch.empty_like(tx), torch.empty_like(tmean), torch.empty_like(trstd))
    return [
        ("layer_norm", lambda: cn.layer_norm(x, (4,), w, b), lambda: torch.native_layer_norm(tx, [4], tw, tb, 1e-5)),
        ("layer_norm_backward", lambda: cn.layer_norm_backward(dy, x, (4,), mean, rstd, w, b),
         lambda: aten.native_layer_norm_backward(tdy, tx, [4], tmean, trstd, tw, tb, [True] * 3)),
        ("layer_norm out=", lambda: cn.layer_norm(x, (4,), w, b, out=out),
         lambda: aten.native_layer_norm.out(tx, [4], tw, tb, 1e-5, out0=tout[0], out1=tout[1],
                                            out2=tout[2])),
    ] + rms_norm_cases(cn, torch, x, dy, w, t)


def rms_norm_cases(cn, torch, x, dy, w, t):
    """RMS norm and its fused add on layer norm's (2, 4); torch's backward is
    autograd's over F.rms_norm (it has no CPU backward op)."""
    if not hasattr(cn, "rms_norm"):
        return []
    tx, tdy, tw = t(x), t(dy), t(w)
    _, rstd = cn.rms_norm(x, (4,), w)
    gx, gw = tx.clone().requires_grad_(), tw.clone().requires_grad_()
    ty = torch.nn.functional.rms_norm(gx, [4], gw)
    return [
        ("rms_norm", lambda: cn.rms_norm(x, (4,), w), lambda: torch._fused_rms_norm(tx, [4], tw, None)),
        ("rms_norm_backward", lambda: cn.rms_norm_backward(dy, x, (4,), rstd, w),
         lambda: torch.autograd.grad(ty, (gx, gw), tdy, retain_graph=True)),
        ("add_rms_norm", lambda: cn.add_rms_norm(x, dy, (4,), w),
         lambda: (lambda h: (torch._fused_rms_norm(h, [4], tw, None), h))(tx + tdy)),
    ]


def group_norm_cases(cn, torch, arr, t):
    """(2, 4, 3, 3), 2 groups, channels first; instance norm without running
    statistics (torch: instance_norm and autograd's gradients of it)."""
    if not hasattr(cn, "group_norm"):
        return []
    aten = torch.ops.aten
    x, dy, w, b = arr(2, 4, 3, 3), arr(2, 4, 3, 3), arr(4), arr(4)
    tx, tdy, tw, tb = t(x), t(dy), t(w), t(b)
    _, mean, rstd = cn.group_norm(x, 2, w, b)
    _, tmean, trstd = torch.native_group_norm(tx, tw, tb, 2, 4, 9, 2, 1e-5)
    _, imean, irstd = cn.instance_norm(x, w, b)
    gx, gw, gb = (a.clone().requires_grad_() for a in (tx, tw, tb))
    ty = torch.instance_norm(gx, gw, gb, None, None, True, 0.1, 1e-5, False)
    return [
        ("group_norm", lambda: cn.group_norm(x, 2, w, b),
         lambda: torch.native_group_norm(tx, tw, tb, 2, 4, 9, 2, 1e-5)),
        ("group_norm_backward", lambda: cn.group_norm_backward(dy, x, mean, rstd, w, 2),
         lambda: aten.native_group_norm_backward(tdy, tx, tmean, trstd, tw, 2, 4, 9, 2,
                                                 [True] * 3)),
        ("instance_norm", lambda: cn.instance_norm(x, w, b),
         lambda: torch.instance_norm(tx, tw, tb, None, None, True, 0.1, 1e-5, False)),
        ("instance_norm_backward", lambda: cn.instance_norm_backward(dy, x, imean, irstd, w),
         lambda: torch.autograd.grad(ty, (gx, gw, gb), tdy, retain_graph=True)),
    ]


def batch_norm_cases(cn, torch, arr, t):
    """(2, 4, 1, 1), channel axis 1, and the split-statistics ops."""
    aten = torch.ops.aten
    x, dy, w, b = arr(2, 4, 1, 1), arr(2, 4, 1, 1), arr(4), arr(4)
    tw, tb = t(w), t(b)
    rm, rv = (arr(4) * 0.1).astype(arr.dtype), (np.abs(arr(4)) + 0.5).astype(arr.dtype)
    rm2, rv2 = rm.copy(), rv.copy()          # updated in place by the training calls
    tx, tdy, trm, trv = t(x), t(dy), t(rm), t(rv)
    _, sm, si = cn.batch_norm(x, w, b, rm2, rv2, True)
    _, tsm, tsi = torch.native_batch_norm(tx, tw, tb, t(rm), t(rv), True, 0.1, 1e-5)
    cnt = np.full(2, 2.0, np.float32)
    smean, sinv = np.stack([sm, sm]), np.stack([si, si])
    sdy, sdyx, _, _ = cn.batch_norm_backward_reduce(dy, x, sm, si, w)
    tsdy, tsdyx = t(sdy), t(sdyx)
    tcnt32 = torch.tensor([2, 2], dtype=torch.int32)
    reserve, treserve = np.empty(0, np.uint8), torch.empty(0, dtype=torch.uint8)
    out = (np.empty_like(x), np.empty_like(sm), np.empty_like(si))
    eval_out = (out[0], np.empty(0, sm.dtype), np.empty(0, sm.dtype))
    tout = (torch.empty_like(tx), torch.empty_like(tsm), torch.empty_like(tsi))
    teval = (torch.empty(0, dtype=tsm.dtype), torch.empty(0, dtype=tsm.dtype))
    return [
        ("batch_norm (training)", lambda: cn.batch_norm(x, w, b, rm2, rv2, True),
         lambda: torch.native_batch_norm(tx, tw, tb, trm, trv, True, 0.1, 1e-5)),
        ("batch_norm (inference)", lambda: cn.batch_norm(x, w, b, rm, rv, False),
         lambda: torch.native_batch_norm(tx, tw, tb, trm, trv, False, 0.1, 1e-5)),
        ("batch_norm (training) out=", lambda: cn.batch_norm(x, w, b, rm2, rv2, True, out=out),
         lambda: aten.native_batch_norm.out(tx, tw, tb, trm, trv, True, 0.1, 1e-5, out=tout[0],
                                            save_mean=tout[1], save_invstd=tout[2])),
        ("batch_norm (inference) out=", lambda: cn.batch_norm(x, w, b, rm, rv, False, out=eval_out),
         lambda: aten.native_batch_norm.out(tx, tw, tb, trm, trv, False, 0.1, 1e-5, out=tout[0],
                                            save_mean=teval[0], save_invstd=teval[1])),
        ("batch_norm_backward", lambda: cn.batch_norm_backward(dy, x, w, rm, rv, sm, si, True),
         lambda: aten.native_batch_norm_backward(tdy, tx, tw, trm, trv, tsm, tsi, True, 1e-5, [True] * 3)),
        ("batch_norm_stats", lambda: cn.batch_norm_stats(x), lambda: torch.batch_norm_stats(tx, 1e-5)),
        ("batch_norm_gather_stats", lambda: cn.batch_norm_gather_stats(smean, sinv, cnt, rm2, rv2),
         lambda: torch.batch_norm_gather_stats_with_counts(
             tx, t(smean), t(sinv), trm, trv, 0.1, 1e-5, t(cnt))),
        ("batch_norm_elemt", lambda: cn.batch_norm_elemt(x, w, b, sm, si),
         lambda: torch.batch_norm_elemt(tx, tw, tb, tsm, tsi, 1e-5)),
        ("batch_norm_backward_reduce", lambda: cn.batch_norm_backward_reduce(dy, x, sm, si, w),
         lambda: torch.batch_norm_backward_reduce(tdy, tx, tsm, tsi, tw, True, True, True)),
        ("batch_norm_backward_elemt", lambda: cn.batch_norm_backward_elemt(dy, x, sm, si, w, sdy, sdyx, 4),
         lambda: torch.batch_norm_backward_elemt(tdy, tx, tsm, tsi, tw, tsdy, tsdyx, tcnt32)),
        ("aten.batch_norm_backward",
         lambda: cn.aten.batch_norm_backward(dy, x, w, rm, rv, sm, si, True, 1e-5, (True,) * 3,
                                             reserve),
         lambda: aten.batch_norm_backward(tdy, tx, tw, trm, trv, tsm, tsi, True, 1e-5, [True] * 3,
                                          treserve)),
        ("aten.cudnn_batch_norm_backward",
         lambda: cn.aten.cudnn_batch_norm_backward(x, dy, w, rm, rv, sm, si, 1e-5, reserve),
         lambda: aten.cudnn_batch_norm_backward(tx, tdy, tw, trm, trv, tsm, tsi, 1e-5, treserve)),
        ("aten.miopen_batch_norm_backward",
         lambda: cn.aten.miopen_batch_norm_backward(x, dy, w, rm, rv, sm, si, 1e-5),
         lambda: aten.miopen_batch_norm_backward(tx, tdy, tw, trm, trv, tsm, tsi, 1e-5)),
    ]


def softmax_cases(cn, torch, arr, t):
    """softmax family, log_sigmoid, trace: (2, 5)."""
    aten = torch.ops.aten
    x, dy = arr(2, 5), arr(2, 5)
    tx, tdy = t(x), t(dy)
    y, ly = cn.softmax(x, 1), cn.log_softmax(x, 1)
    ty, tly = torch._softmax(tx, 1, False), torch._log_softmax(tx, 1, False)
    return [
        ("softmax", lambda: cn.softmax(x, 1), lambda: torch._softmax(tx, 1, False)),
        ("log_softmax", lambda: cn.log_softmax(x, 1), lambda: torch._log_softmax(tx, 1, False)),
        ("softmax_backward_data", lambda: cn.softmax_backward_data(dy, y, 1, arr.dtype),
         lambda: aten._softmax_backward_data(tdy, ty, 1, arr.torch_dtype)),
        ("log_softmax_backward_data", lambda: cn.log_softmax_backward_data(dy, ly, 1, arr.dtype),
         lambda: aten._log_softmax_backward_data(tdy, tly, 1, arr.torch_dtype)),
        ("log_sigmoid_forward", lambda: cn.log_sigmoid_forward(x), lambda: aten.log_sigmoid_forward(tx)),
        ("trace", lambda: cn.trace(x), lambda: torch.trace(tx)),
    ]


def nll_cases(cn, torch, arr, t):
    """NLL losses, mean, no weight: (2, 5) and (2, 3, 2, 2) log-probabilities."""
    aten = torch.ops.aten
    ly, ly4 = cn.log_softmax(arr(2, 5), 1), cn.log_softmax(arr(2, 3, 2, 2), 1)
    tly, tly4 = t(ly), t(ly4)
    target, target4 = np.array([1, 3]), np.random.default_rng(1).integers(0, 3, (2, 2, 2))
    tt, tt4 = torch.from_numpy(target), torch.from_numpy(target4)
    _, tw = cn.nll_loss_forward(ly, target)
    _, tw4 = cn.nll_loss2d_forward(ly4, target4)
    _, ttw = aten.nll_loss_forward(tly, tt, None, 1, -100)
    _, ttw4 = aten.nll_loss2d_forward(tly4, tt4, None, 1, -100)
    g = np.ones((), arr.dtype)
    tg = t(g)
    return [
        ("nll_loss", lambda: cn.nll_loss(ly, target), lambda: torch.nn.functional.nll_loss(tly, tt)),
        ("nll_loss_forward", lambda: cn.nll_loss_forward(ly, target),
         lambda: aten.nll_loss_forward(tly, tt, None, 1, -100)),
        ("nll_loss_backward", lambda: cn.nll_loss_backward(g, ly, target, None, 1, -100, tw),
         lambda: aten.nll_loss_backward(tg, tly, tt, None, 1, -100, ttw)),
        ("nll_loss2d", lambda: cn.nll_loss2d(ly4, target4), lambda: torch.nn.functional.nll_loss(tly4, tt4)),
        ("nll_loss2d_forward", lambda: cn.nll_loss2d_forward(ly4, target4),
         lambda: aten.nll_loss2d_forward(tly4, tt4, None, 1, -100)),
        ("nll_loss2d_backward", lambda: cn.nll_loss2d_backward(g, ly4, target4, None, 1, -100, tw4),
         lambda: aten.nll_loss2d_backward(tg, tly4, tt4, None, 1, -100, ttw4)),
    ]


def nested_cases(cn, torch, arr, t):
    """cynorm.nested on components (3, 4) and (2, 4) against torch.nested's
    jagged layout (its backward ops have no public twin: timed alone)."""
    import warnings
    warnings.filterwarnings("ignore", message=".*nested.*")     # torch's prototype notice
    nn, F = cn.nested, torch.nn.functional
    comps = [arr(3, 4), arr(2, 4)]
    x, g = nn.nested_array(comps), nn.nested_array([(c * 0.5).astype(c.dtype) for c in comps])

    def jagged(cs):
        return torch.nested.nested_tensor([t(c) for c in cs], layout=torch.jagged)

    tx = jagged(comps)
    w, b, W = arr(4), arr(4), arr(5, 4)
    tw, tb, tW = t(w), t(b), t(W)
    _, mean, rstd = nn.layer_norm(x, 4, w, b)
    y_soft, y_lin = nn.softmax(x, -1), nn.linear(x, W)
    return [
        ("nested.nested_array", lambda: nn.nested_array(comps), lambda: jagged(comps)),
        ("nested.layer_norm", lambda: nn.layer_norm(x, 4, w, b),
         lambda: F.layer_norm(tx, (4,), tw, tb)),
        ("nested.layer_norm_backward", lambda: nn.layer_norm_backward(g, x, 4, mean, rstd, w, b),
         None),
        ("nested.softmax", lambda: nn.softmax(x, -1), lambda: F.softmax(tx, -1)),
        ("nested.softmax_backward", lambda: nn.softmax_backward(g, y_soft, -1), None),
        ("nested.relu", lambda: nn.relu(x), lambda: F.relu(tx)),
        ("nested.threshold", lambda: nn.threshold(x, 0.1, 0.0), lambda: F.threshold(tx, 0.1, 0.0)),
        ("nested.threshold_backward", lambda: nn.threshold_backward(g, x, 0.1), None),
        ("nested.gelu", lambda: nn.gelu(x), lambda: F.gelu(tx)),
        ("nested.gelu_backward", lambda: nn.gelu_backward(g, x), None),
        ("nested.silu", lambda: nn.silu(x), lambda: F.silu(tx)),
        ("nested.silu_backward", lambda: nn.silu_backward(g, x), None),
        ("nested.linear", lambda: nn.linear(x, W), lambda: F.linear(tx, tW)),
        ("nested.linear_backward", lambda: nn.linear_backward(x, y_lin, W), None),
        ("nested.matmul", lambda: nn.matmul(x, W.T), lambda: torch.matmul(tx, tW.T)),
        ("nested.sum", lambda: nn.sum(x, -1), lambda: tx.sum(-1)),
        ("nested.select", lambda: nn.select(x, 0, 1), lambda: tx.select(0, 1)),
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--calls", type=int, default=10000, help="calls per op and library (default 10000)")
    p.add_argument("--inner", type=int, default=50, help="calls per sample (default 50)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16", "float16"),
                   help="the inputs' dtype, parameters included (default float32)")
    p.add_argument("--ops", default="", help="only the ops whose name contains one of these "
                   "comma-separated strings (default: all)")
    args = p.parse_args()
    import torch

    import ml_dtypes

    import cynorm as cn
    dtype = np.dtype(ml_dtypes.bfloat16 if args.dtype == "bfloat16" else args.dtype)
    print(f"cynorm {cn.__version__}, torch {torch.__version__}, numpy {np.__version__}; "
          f"{dtype.name} inputs; median of {max(1, args.calls // args.inner)} samples of {args.inner} calls, interleaved\n")
    print("| threads | op | cynorm µs | torch µs | torch/cynorm |")
    print("|---|---|---|---|---|")
    ratios = {}
    for threads in (int(s) for s in args.threads.split(",")):
        cn.set_num_threads(threads)
        torch.set_num_threads(threads)
        for name, fc, ft in cases(cn, torch, dtype):
            if args.ops and not any(o in name for o in args.ops.split(",")):
                continue
            fns = {"cynorm": fc}
            try:
                if ft is not None:
                    ft()
                    fns["torch"] = ft
            except (NotImplementedError, RuntimeError):     # no CPU kernel in torch
                pass
            s = time_interleaved(fns, max(1, args.calls // args.inner), args.inner)
            c = statistics.median(s["cynorm"]) * 1e6
            if "torch" not in s:
                why = "no public twin" if ft is None else "no CPU kernel"
                print(f"| {threads} | {name} | {c:.2f} | – ({why}) | – |", flush=True)
                continue
            t = statistics.median(s["torch"]) * 1e6
            ratios.setdefault(threads, []).append(t / c)
            print(f"| {threads} | {name} | {c:.2f} | {t:.2f} | {t / c:.2f} |", flush=True)
    for threads, r in ratios.items():
        print(f"\n{threads} thread(s): torch/cynorm median {statistics.median(r):.2f}, "
              f"cynorm cheaper in {sum(x >= 1 for x in r)} of {len(r)} ops")


if __name__ == "__main__":
    main()
