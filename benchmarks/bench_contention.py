"""cynorm under load: every op family, idle and with k busy loops beside it.

    python benchmarks/bench_contention.py                  # k = 0 .. ncpu, all cases
    python benchmarks/bench_contention.py --loads 0,2 --sizes cache
    python benchmarks/bench_contention.py --cases softmax,"batch norm inference"
    python benchmarks/bench_contention.py --seconds 0.2 --no-torch
    python benchmarks/bench_contention.py --policy fixed   # cynorm's teams as asked

For each load k the benchmark starts k busy loops (`sh -c 'while :; do :;
done'`, each under `timeout`, so none outlives a killed benchmark by more
than --max-load-seconds) and stops them before the next k.  Under each load
every case is timed three ways, interleaved call by call so that the load's
drift hits all alike: cynorm at the default thread count (the team policy
at its default too, unless --policy says otherwise), cynorm on one thread,
and torch at its default thread count (when installed).  A case runs for
--seconds per contender (the rounds take that in all per contender, each
contender at least --min-calls calls), on one fixed input;
the table gives each contender's median and p90 per call in microseconds,
and two ratios: cynorm's default over its own one-thread time under the same
load (the "cliff": the target is <= 2 at the median and at p90) and torch
over cynorm (> 1: cynorm is faster).

Cases: weight norm forward and backward, layer norm forward and backward,
batch norm training, inference and backward, the split ops
(batch_norm_stats, batch_norm_elemt, batch_norm_backward_reduce: torch has
them on CUDA only, so their torch column is empty) and softmax, each on a
cache-resident shape and a DRAM-sized one.
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cynorm  # noqa: E402

EPS = 1e-5


def cases(size):
    """[(name, shape label, {contender: callable})] for one size class:
    'cache' (a few hundred KiB to a few MiB) or 'dram' (tens of MiB)."""
    rng = np.random.default_rng(0)
    f32 = np.float32
    if size == "cache":
        wn, ln, bn, sm = (256, 256), (64, 768), (8, 64, 28, 28), (256, 1024)
    else:
        wn, ln, bn, sm = (4096, 4096), (8192, 1024), (32, 64, 56, 56), (8192, 1024)
    out = []

    v = rng.standard_normal(wn).astype(f32)
    g = (rng.random((wn[0], 1)) + 0.5).astype(f32)
    gw = rng.standard_normal(wn).astype(f32)
    _, norm = cynorm.weight_norm_interface(v, g, 0)
    out.append(("weight norm fwd", wn, {
        "cynorm": lambda: cynorm.weight_norm_interface(v, g, 0),
        "torch": lambda t: t.ops.aten._weight_norm_interface(t.v, t.g, 0),
    }, dict(v=v, g=g)))
    out.append(("weight norm bwd", wn, {
        "cynorm": lambda: cynorm.weight_norm_backward(gw, v, g, norm, 0),
        "torch": lambda t: t.ops.aten._weight_norm_interface_backward(t.gw, t.v, t.g, t.norm, 0),
    }, dict(v=v, g=g, gw=gw, norm=norm)))

    x = rng.standard_normal(ln).astype(f32)
    dy = rng.standard_normal(ln).astype(f32)
    w = (rng.random(ln[-1]) + 0.5).astype(f32)
    b = rng.standard_normal(ln[-1]).astype(f32)
    _, mean, rstd = cynorm.layer_norm(x, ln[-1], w, b)
    n = ln[-1]
    out.append(("layer norm fwd", ln, {
        "cynorm": lambda: cynorm.layer_norm(x, n, w, b),
        "torch": lambda t: t.nn.functional.layer_norm(t.x, (n,), t.w, t.b, EPS),
    }, dict(x=x, w=w, b=b)))
    out.append(("layer norm bwd", ln, {
        "cynorm": lambda: cynorm.layer_norm_backward(dy, x, n, mean, rstd, w, b),
        "torch": lambda t: t.ops.aten.native_layer_norm_backward(
            t.dy, t.x, [n], t.mean, t.rstd, t.w, t.b, [True, True, True]),
    }, dict(x=x, dy=dy, w=w, b=b, mean=mean.reshape(-1, 1), rstd=rstd.reshape(-1, 1))))

    xb = rng.standard_normal(bn).astype(f32)
    dyb = rng.standard_normal(bn).astype(f32)
    C = bn[1]
    wb = (rng.random(C) + 0.5).astype(f32)
    bb = rng.standard_normal(C).astype(f32)
    rm, rv = np.zeros(C, f32), np.ones(C, f32)
    _, sm_, si_ = cynorm.batch_norm(xb, wb, bb, None, None, True)
    sdy, sdyx, _, _ = cynorm.batch_norm_backward_reduce(dyb, xb, sm_, si_, wb)
    bn_t = dict(x=xb, dy=dyb, w=wb, b=bb, rm=rm, rv=rv, sm=sm_, si=si_)
    out.append(("batch norm training", bn, {
        "cynorm": lambda: cynorm.batch_norm(xb, wb, bb, None, None, True),
        "torch": lambda t: t.ops.aten.native_batch_norm(t.x, t.w, t.b, None, None, True, 0.1, EPS),
    }, bn_t))
    out.append(("batch norm inference", bn, {
        "cynorm": lambda: cynorm.batch_norm(xb, wb, bb, rm, rv, False),
        "torch": lambda t: t.ops.aten.native_batch_norm(t.x, t.w, t.b, t.rm, t.rv, False, 0.1, EPS),
    }, bn_t))
    out.append(("batch norm bwd", bn, {
        "cynorm": lambda: cynorm.batch_norm_backward(dyb, xb, wb, None, None, sm_, si_, True),
        "torch": lambda t: t.ops.aten.native_batch_norm_backward(
            t.dy, t.x, t.w, None, None, t.sm, t.si, True, EPS, [True, True, True]),
    }, bn_t))
    out.append(("batch_norm_stats", bn, {
        "cynorm": lambda: cynorm.batch_norm_stats(xb, EPS),
        "torch": None,       # CUDA-only in torch
    }, bn_t))
    out.append(("batch_norm_elemt", bn, {
        "cynorm": lambda: cynorm.batch_norm_elemt(xb, wb, bb, sm_, si_, EPS),
        "torch": None,       # CUDA-only in torch
    }, bn_t))
    out.append(("batch_norm_backward_reduce", bn, {
        "cynorm": lambda: cynorm.batch_norm_backward_reduce(dyb, xb, sm_, si_, wb),
        "torch": None,       # CUDA-only in torch
    }, bn_t))

    xs = rng.standard_normal(sm).astype(f32)
    out.append(("softmax", sm, {
        "cynorm": lambda: cynorm.softmax(xs, -1),
        "torch": lambda t: t.softmax(t.x, -1),
    }, dict(x=xs)))
    del sdy, sdyx
    return out


class TorchArgs:
    """The torch module with a case's arrays as tensors (t.x, t.w, ...)."""

    def __init__(self, torch, arrays):
        self._torch = torch
        for k, a in arrays.items():
            setattr(self, k, torch.from_numpy(np.ascontiguousarray(a)))

    def __getattr__(self, name):
        return getattr(self._torch, name)


def start_load(k, max_seconds):
    """k busy loops, each ended by `timeout` after max_seconds at the latest."""
    sh = shutil.which("sh")
    cmd = ["sh", "-c", "while :; do :; done"]
    if shutil.which("timeout"):
        cmd = ["timeout", str(int(max_seconds))] + cmd
    if sh is None:
        raise SystemExit("bench_contention.py needs sh for its busy loops")
    # each in a session of its own, so that stop_load ends timeout's child too
    procs = [subprocess.Popen(cmd, start_new_session=True) for _ in range(k)]
    time.sleep(0.3)     # let the scheduler spread them
    return procs


def stop_load(procs):
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()


def time_case(fns, seconds, min_calls):
    """{name: [seconds per call]}: the callables in turn, one call each per
    round, until the rounds have taken `seconds` per callable in all and
    each has had at least min_calls calls (so a slow contender does not make
    the fast ones run for minutes)."""
    samples = {k: [] for k in fns}
    for f in fns.values():     # warm up: allocator, thread pools, caches
        f()
    start = time.perf_counter()
    order = list(fns.items())
    while (time.perf_counter() - start < seconds * len(fns)
           or min(len(s) for s in samples.values()) < min_calls):
        for k, f in order:
            t = time.perf_counter()
            f()
            samples[k].append(time.perf_counter() - t)
        # each contender runs in turn right after each other one: a peer's
        # threads still spinning after its call slow whoever comes next
        order = order[1:] + order[:1]
    return samples


def p90(xs):
    return float(np.percentile(xs, 90))


def main():
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loads", default=",".join(str(k) for k in range(ncpu + 1)),
                    help=f"comma-separated busy-loop counts (default 0..{ncpu})")
    ap.add_argument("--sizes", default="cache,dram", help="cache, dram or both")
    ap.add_argument("--seconds", type=float, default=0.3, help="time per contender and case")
    ap.add_argument("--min-calls", type=int, default=20)
    ap.add_argument("--max-load-seconds", type=float, default=1800,
                    help="no busy loop lives longer than this")
    ap.add_argument("--policy", choices=("adaptive", "fixed"), default=None,
                    help="cynorm's team policy (default: the library's default)")
    ap.add_argument("--cases", default="",
                    help="comma-separated parts of case names to run (default: all)")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]

    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            print("torch not installed: its column is left out", file=sys.stderr)
    if args.policy:
        cynorm.set_team_policy(args.policy)
    default_threads = cynorm.get_num_threads()
    loads = [int(k) for k in args.loads.split(",")]
    sizes = [s.strip() for s in args.sizes.split(",")]

    def one_thread(f):
        def call():
            cynorm.set_num_threads(1)
            try:
                return f()
            finally:
                cynorm.set_num_threads(default_threads)
        return call

    print(f"cynorm {cynorm.__version__}, {ncpu} CPUs, default threads {default_threads}, "
          f"team policy {cynorm.get_team_policy()}"
          + (f"; torch {torch.__version__}, {torch.get_num_threads()} threads" if torch else ""))
    print(f"per call, microseconds: median (p90); {args.seconds} s per contender and case\n")
    head = (f"| load | case | shape | cynorm {default_threads} thr | cynorm 1 thr | "
            f"{'torch | ' if torch else ''}cliff (default / 1 thr) | {'torch / cynorm |' if torch else ''}")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    worst = {}
    for k in loads:
        procs = start_load(k, args.max_load_seconds)
        try:
            for size in sizes:
                for name, shape, calls, arrays in cases(size):
                    if wanted and not any(w in name for w in wanted):
                        continue
                    fns = {"default": calls["cynorm"], "one": one_thread(calls["cynorm"])}
                    has_torch = torch is not None and calls["torch"] is not None
                    if has_torch:
                        targs = TorchArgs(torch, arrays)
                        fns["torch"] = (lambda c=calls["torch"], t=targs: c(t))
                    s = time_case(fns, args.seconds, args.min_calls)
                    med = {c: statistics.median(v) * 1e6 for c, v in s.items()}
                    q90 = {c: p90(v) * 1e6 for c, v in s.items()}
                    cliff = (med["default"] / med["one"], q90["default"] / q90["one"])
                    row = (f"| {k} | {name} | {'x'.join(map(str, shape))} | "
                           f"{med['default']:.1f} ({q90['default']:.1f}) | "
                           f"{med['one']:.1f} ({q90['one']:.1f}) | ")
                    if torch:
                        row += (f"{med['torch']:.1f} ({q90['torch']:.1f}) | " if has_torch
                                else "— | ")
                    row += f"{cliff[0]:.2f} ({cliff[1]:.2f}) | "
                    if torch:
                        row += (f"{med['torch'] / med['default']:.2f} "
                                f"({q90['torch'] / q90['default']:.2f}) |" if has_torch else "— |")
                    print(row, flush=True)
                    w = worst.setdefault(k, [0.0, 0.0, 1e9])
                    w[0] = max(w[0], cliff[0])
                    w[1] = max(w[1], cliff[1])
                    if has_torch:
                        w[2] = min(w[2], med["torch"] / med["default"])
        finally:
            stop_load(procs)
    print()
    for k, (m, q, t) in worst.items():
        print(f"load {k}: worst cliff {m:.2f} (median), {q:.2f} (p90)"
              + (f"; lowest torch/cynorm {t:.2f}" if torch else ""))
    info = cynorm.thread_team_info()
    print(f"team: {info['regions']} timed regions, {info['late_regions']} late")


if __name__ == "__main__":
    main()
