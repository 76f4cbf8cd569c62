"""Host cost of one cudnn_bind call, measured through the host stand-in for
libcudnn and the CUDA runtime (tests/cudnn_standin/standin.c, compiled here
against the real headers): µs per call after warm-up and the CUDA/cuDNN
calls each one makes, for forward training, backward and inference on a
tiny (2, 4, 1, 1) float32 DeviceArray batch.

    python benchmarks/bench_cudnn_host.py               # needs the nvidia wheels' headers
    python benchmarks/bench_cudnn_host.py --calls 20000

The stand-in computes on the host, so its own work (argument checks, a
scratch allocation, the tiny batch norm) is inside the time; on a GPU that
part is cuDNN's launch.  A sample is the mean of `--inner` calls; the
median and the minimum of the samples are reported.
"""
import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--inner", type=int, default=500)
    args = ap.parse_args()

    import cudnn_bind
    from cudnn_bind import _lib
    from cudnn_helpers import build_standin  # tests/: compiles the stand-in

    path = build_standin(tempfile.mkdtemp(prefix="cudnn_standin_"))
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
    cases = [
        ("forward training", lambda: cudnn_bind.batch_norm_forward_training(gx, gw, gb, gm, gv)),
        ("backward", lambda: cudnn_bind.batch_norm_backward(gx, gdy, gw, sm, si, 1e-5, rs)),
        ("inference", lambda: cudnn_bind.batch_norm_forward_inference(gx, gw, gb, gm, gv)),
    ]
    print("| call | median µs | min µs | CUDA/cuDNN calls per call |")
    print("|---|---|---|---|")
    for name, fn in cases:
        for _ in range(200):
            fn()
        before = counts()
        fn()
        after = counts()
        made = {n: after[n] - before[n] for n in names if after[n] != before[n]}
        samples = []
        for _ in range(max(1, args.calls // args.inner)):
            t = time.perf_counter()
            for _ in range(args.inner):
                fn()
            samples.append((time.perf_counter() - t) / args.inner * 1e6)
        what = ", ".join(f"{n} {k}" for n, k in sorted(made.items()))
        print(f"| {name} | {statistics.median(samples):.1f} | {min(samples):.1f} | "
              f"{sum(made.values())}: {what} |")


if __name__ == "__main__":
    main()
