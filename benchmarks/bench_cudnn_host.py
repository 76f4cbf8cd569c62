"""Host cost of one cudnn_bind call, measured through the host stand-in for
libcudnn and the CUDA runtime (tests/cudnn_standin/standin.c, compiled here
against the real headers): µs per call after warm-up and the CUDA/cuDNN
calls each one makes, for forward training, backward and inference on a
tiny (2, 4, 1, 1) float32 DeviceArray batch, and forward training on the
same arrays seen only through __cuda_array_interface__ (as CuPy or Numba
arrays are).

    python benchmarks/bench_cudnn_host.py               # needs the nvidia wheels' headers
    python benchmarks/bench_cudnn_host.py --calls 20000
    python benchmarks/bench_cudnn_host.py --cpu-time    # on a shared machine
    git archive HEAD cudnn_bind | tar -x -C /tmp/base   # an earlier cudnn_bind ...
    python benchmarks/bench_cudnn_host.py --baseline /tmp/base --cpu-time   # ... against this one

The stand-in computes on the host, so its own work (argument checks, a
scratch allocation, the tiny batch norm) is inside the time; on a GPU that
part is cuDNN's launch.  A sample is the mean of `--inner` calls; the
median and the minimum of the samples are reported.  --cpu-time times the
thread's CPU time instead of the wall clock: other processes on the
machine then cost less noise (cache and frequency effects remain).

--baseline DIR compares the cudnn_bind package in DIR with this checkout's,
in one run: `--rounds` pairs of child processes, one of each, their order
alternating, each timing every case on the same compiled stand-in; the
table gives both (median and minimum over all their samples) and the
ratios of the medians and of the minimums (noise from other processes only
adds time, so the minimums' ratio is the steadier one).
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def measure(path, calls, inner, clock):
    """{case: (samples in µs, {C function: calls made by one call})} for the
    cudnn_bind that imports here, loaded on the stand-in at `path`."""
    import cudnn_bind
    from cudnn_bind import _lib

    cudnn_bind.load(path, cudart=path)
    hooks = ctypes.CDLL(path)
    hooks.standin_calls.restype, hooks.standin_calls.argtypes = ctypes.c_long, [ctypes.c_char_p]
    names = list(_lib.CUDNN_FUNCTIONS) + list(_lib.CUDART_FUNCTIONS)

    def counts():
        return {n: hooks.standin_calls(n.encode()) for n in names}

    dev = cudnn_bind.DeviceArray.from_numpy
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 1, 1)).astype(np.float32)
    w, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    gx, gdy, gw, gb = dev(x), dev(x), dev(w), dev(b)
    gm, gv = dev(np.zeros(4, np.float32)), dev(np.ones(4, np.float32))
    y, sm, si, rs = cudnn_bind.batch_norm_forward_training(gx, gw, gb, gm, gv)

    class Exported:
        """A foreign array, seen only through __cuda_array_interface__ (kept
        alive across calls, as a user's CuPy arrays are)."""

        def __init__(self, array):
            self.__cuda_array_interface__ = array.__cuda_array_interface__
            self._keep = array

    cx, cw, cb, cm, cv = (Exported(a) for a in (gx, gw, gb, gm, gv))
    cases = [
        ("forward training", lambda: cudnn_bind.batch_norm_forward_training(gx, gw, gb, gm, gv)),
        ("backward", lambda: cudnn_bind.batch_norm_backward(gx, gdy, gw, sm, si, 1e-5, rs)),
        ("inference", lambda: cudnn_bind.batch_norm_forward_inference(gx, gw, gb, gm, gv)),
        ("forward training, __cuda_array_interface__ inputs",
         lambda: cudnn_bind.batch_norm_forward_training(cx, cw, cb, cm, cv)),
    ]
    results = {}
    for name, fn in cases:
        for _ in range(200):
            fn()
        before = counts()
        fn()
        after = counts()
        made = {n: after[n] - before[n] for n in names if after[n] != before[n]}
        samples = []
        for _ in range(max(1, calls // inner)):
            t = clock()
            for _ in range(inner):
                fn()
            samples.append((clock() - t) / inner * 1e6)
        results[name] = (samples, made)
    return results


def made_text(made):
    what = ", ".join(f"{n} {k}" for n, k in sorted(made.items()))
    return f"{sum(made.values())}: {what}"


def compare(args, path):
    """Children timing the baseline's cudnn_bind and this one's, alternately."""
    script = os.path.abspath(__file__)
    samples = {"before": {}, "after": {}}
    made = {}
    for r in range(args.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for which in order:
            env = dict(os.environ, PYTHONPATH=args.baseline if which == "before" else ROOT)
            cmd = [sys.executable, script, "--child", path, "--calls", str(args.calls),
                   "--inner", str(args.inner)] + (["--cpu-time"] if args.cpu_time else [])
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            for name, (got, calls_made) in json.loads(out).items():
                samples[which].setdefault(name, []).extend(got)
                made[(which, name)] = calls_made
    print("| call | before µs (median / min) | after µs (median / min) | "
          "after / before (medians / mins) | C calls per call, before → after |")
    print("|---|---|---|---|---|")
    for name in samples["after"]:
        b, a = samples["before"][name], samples["after"][name]
        print(f"| {name} | {statistics.median(b):.1f} / {min(b):.1f} | "
              f"{statistics.median(a):.1f} / {min(a):.1f} | "
              f"{statistics.median(a) / statistics.median(b):.2f} / {min(a) / min(b):.2f} | "
              f"{sum(made[('before', name)].values())} → {sum(made[('after', name)].values())} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--inner", type=int, default=500)
    ap.add_argument("--cpu-time", action="store_true",
                    help="time the thread's CPU time, not the wall clock")
    ap.add_argument("--baseline", metavar="DIR",
                    help="a directory holding another cudnn_bind package to compare with")
    ap.add_argument("--rounds", type=int, default=3, help="child pairs with --baseline")
    ap.add_argument("--child", metavar="STANDIN", help=argparse.SUPPRESS)
    args = ap.parse_args()
    clock = time.thread_time if args.cpu_time else time.perf_counter

    if args.child:  # one side of --baseline: samples as JSON on stdout
        print(json.dumps(measure(args.child, args.calls, args.inner, clock)))
        return
    from cudnn_helpers import build_standin  # tests/: compiles the stand-in
    path = build_standin(tempfile.mkdtemp(prefix="cudnn_standin_"))
    if args.baseline:
        compare(args, path)
        return
    print("| call | median µs | min µs | CUDA/cuDNN calls per call |")
    print("|---|---|---|---|")
    for name, (samples, made) in measure(path, args.calls, args.inner, clock).items():
        print(f"| {name} | {statistics.median(samples):.1f} | {min(samples):.1f} | "
              f"{made_text(made)} |")


if __name__ == "__main__":
    main()
