"""Weight norm: cynorm vs PyTorch (CPU) vs NumPy, in one process, interleaved.

    python benchmarks/bench_weight_norm.py            # both allocation settings
    python benchmarks/bench_weight_norm.py --quick    # fewer repeats

Each allocation setting runs in its own child process:
  (a) default   - both libraries allocate as they normally do;
  (b) faultfree - MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736, so
                  freed memory is reused and fresh outputs cost no page faults.
Cases that move more than 16 MiB (as bench_norms.py counts DRAM-bound ones)
are timed with cold caches: a _common.CacheEvictor pass before every call, so
that no callable finds the input left in the last-level cache by the one
before it.  Per case and thread count it prints the median ms of cynorm
(fresh outputs and out=), torch and NumPy, the ratio torch/cynorm, and the %
of STREAM triad bandwidth reached (nominal bytes: read v and write w
forward; read grad_w and v and write grad_v backward).  A PNG plot goes next
to this script.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    HERE, CacheEvictor, median_ms, run_child, setting_heading, stream_triad_gbs, time_interleaved,
    tune_threads,
)

DRAM_BYTES = 16 << 20          # more than this moved: timed with cold caches
CASES = [((4096, 4096), 0), ((4096, 4096), 1), ((512, 512, 3, 3), 0), ((1024, 64), 1), ((256, 256), 0)]
DTYPES = ["float32", "bfloat16"]
OPS = ["forward", "backward"]


# --------------------------------------------------------------------------- #
# one allocation setting, run in a child process
def numpy_forward(v, g, dim):
    axes = tuple(i for i in range(v.ndim) if i != dim)
    return v * (g / np.sqrt(np.sum(v * v, axis=axes, keepdims=True)))


def numpy_backward(gw, v, g, norm, dim):
    axes = tuple(i for i in range(v.ndim) if i != dim)
    s = np.sum(gw * v, axis=axes, keepdims=True)
    grad_g = s / norm
    a = g / norm
    return a * gw - (a * grad_g / norm) * v, grad_g


def run_setting(repeats, threads_list, tune=False):
    import ml_dtypes
    import torch

    import cynorm

    results = []
    rng = np.random.default_rng(0)
    for threads in threads_list:
        cynorm.set_num_threads(threads)
        torch.set_num_threads(threads)
        if tune and threads > 1:
            tune_threads(cynorm, threads)
        evict = CacheEvictor(threads)
        for shape, dim in CASES:
            gshape = tuple(s if i == dim else 1 for i, s in enumerate(shape))
            v32 = rng.standard_normal(shape).astype(np.float32)
            gw32 = rng.standard_normal(shape).astype(np.float32)
            g32 = (rng.random(gshape) + 0.5).astype(np.float32)
            for dtype in DTYPES:
                npdt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
                tdt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
                v, gw, g = v32.astype(npdt), gw32.astype(npdt), g32.astype(npdt)
                tv, tgw, tg = (torch.from_numpy(a).to(tdt) for a in (v32, gw32, g32))
                _, norm = cynorm.weight_norm_interface(v, g, dim)
                _, tnorm = torch._weight_norm_interface(tv, tg, dim)
                w_out = np.empty_like(v)
                n_out = np.empty(g.shape, np.float32)
                gv_out = np.empty_like(v)
                gg_out = np.empty(g.shape, g.dtype)
                tbwd = torch.ops.aten._weight_norm_interface_backward
                runners = {
                    "forward": {
                        "cynorm": lambda: cynorm.weight_norm_interface(v, g, dim),
                        "cynorm_out": lambda: cynorm.weight_norm_interface(v, g, dim, out=(w_out, n_out)),
                        "torch": lambda: torch._weight_norm_interface(tv, tg, dim),
                        "numpy": (lambda: numpy_forward(v32, g32, dim)) if dtype == "float32" else None,
                    },
                    "backward": {
                        "cynorm": lambda: cynorm.weight_norm_backward(gw, v, g, norm, dim),
                        "cynorm_out": lambda: cynorm.weight_norm_backward(gw, v, g, norm, dim, out=(gv_out, gg_out)),
                        "torch": lambda: tbwd(tgw, tv, tg, tnorm, dim),
                        "numpy": (lambda: numpy_backward(gw32, v32, g32, norm, dim)) if dtype == "float32" else None,
                    },
                }
                for op in OPS:
                    fns = {k: f for k, f in runners[op].items() if f is not None}
                    small = v.nbytes < (8 << 20)
                    reps = repeats * (8 if small else 1)
                    inner = 20 if v.nbytes < (1 << 20) else 1
                    nominal = (2 if op == "forward" else 3) * v.nbytes
                    # the evictor dirties the share of the call's bytes it writes
                    share = v.nbytes / nominal
                    before = (lambda: evict(dirty=share)) if nominal > DRAM_BYTES else None
                    samples = time_interleaved(fns, reps, inner, before=before)
                    results.append({
                        "threads": threads, "shape": list(shape), "dim": dim, "dtype": dtype, "op": op,
                        "bytes": nominal,
                        "ms": {k: median_ms(s) for k, s in samples.items()},
                    })
                    print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return results


# --------------------------------------------------------------------------- #
# parent: run the settings, print, plot
def child(setting, repeats, threads_list, tune=False):
    return run_child(__file__, setting, ["--repeats", str(repeats), "--threads",
                                         ",".join(map(str, threads_list))] + ["--tune"] * tune)


def print_table(setting, results, stream):
    print("\n" + setting_heading(setting))
    print("\n| thr | op | dtype | shape | dim | cynorm ms | cynorm out= ms | torch ms | numpy ms "
          "| torch/cynorm | torch/cynorm out= | cynorm out= % STREAM | torch % STREAM |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ms = r["ms"]
        bw = stream[str(r["threads"])]
        pct = lambda t: 100 * r["bytes"] / (t / 1e3) / 1e9 / bw
        numpy_ms = f"{ms['numpy']:.3f}" if "numpy" in ms else "–"
        print(f"| {r['threads']} | {r['op']} | {r['dtype']} | {tuple(r['shape'])} | {r['dim']} "
              f"| {ms['cynorm']:.3f} | {ms['cynorm_out']:.3f} | {ms['torch']:.3f} | {numpy_ms} "
              f"| {ms['torch'] / ms['cynorm']:.2f} | {ms['torch'] / ms['cynorm_out']:.2f} "
              f"| {pct(ms['cynorm_out']):.0f} % | {pct(ms['torch']):.0f} % |")


def plot(all_results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot; pip install '.[bench]')")
        return
    settings = list(all_results)
    fig, axes = plt.subplots(len(settings), 1, figsize=(14, 4.5 * len(settings)), squeeze=False)
    for ax, setting in zip(axes[:, 0], settings):
        res = all_results[setting]
        short = {"forward": "fwd", "backward": "bwd", "float32": "f32", "bfloat16": "bf16"}
        labels = [f"{short[r['op']]} {short[r['dtype']]} {'x'.join(map(str, r['shape']))} "
                  f"dim{r['dim']} {r['threads']}thr" for r in res]
        x = np.arange(len(res))
        ax.bar(x - 0.2, [r["ms"]["torch"] / r["ms"]["cynorm"] for r in res], 0.4, label="torch / cynorm")
        ax.bar(x + 0.2, [r["ms"]["torch"] / r["ms"]["cynorm_out"] for r in res], 0.4, label="torch / cynorm out=")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(x, labels, rotation=90, fontsize=6)
        ax.set_ylabel("speed-up over torch")
        ax.set_title(f"weight norm, allocation setting: {setting}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\nplot: {os.path.relpath(path)}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--settings", default="default,faultfree")
    p.add_argument("--quick", action="store_true", help="5 repeats")
    p.add_argument("--tune", action="store_true", help="cynorm.tune_threads() at each thread "
                   "count before timing (this machine's thread-team thresholds)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", default=os.path.join(HERE, "results", "latest.json"))
    args = p.parse_args()
    threads_list = [int(t) for t in args.threads.split(",")]
    repeats = 5 if args.quick else args.repeats
    if args.child:
        json.dump(run_setting(repeats, threads_list, args.tune), sys.stdout)
        return

    import cynorm
    import torch
    print(f"cynorm {cynorm.__version__} ({cynorm.config()['simd_compiled']}), torch {torch.__version__}, "
          f"numpy {np.__version__}; {os.cpu_count()} CPUs; median of {repeats} interleaved repeats "
          f"(x8 for outputs < 8 MiB)")
    stream = {}
    for t in threads_list:
        gbs, how = stream_triad_gbs(t)
        stream[str(t)] = gbs
        print(f"STREAM triad ({how}), {t} thread(s): {gbs:.1f} GB/s")
    all_results = {}
    for setting in args.settings.split(","):
        all_results[setting] = child(setting, repeats, threads_list, args.tune)
        print_table(setting, all_results[setting], stream)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"stream_gbs": stream, "results": all_results}, f, indent=1)
    plot(all_results, os.path.join(HERE, "weight_norm.png"))


if __name__ == "__main__":
    main()
