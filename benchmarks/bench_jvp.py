"""Forward-mode JVP of layer_norm_backward: cynorm.jvp vs torch.func.jvp of
aten.native_layer_norm_backward (PyTorch's decomposition), one process,
interleaved, same thread count.

    python benchmarks/bench_jvp.py [--shape 8192,1024] [--threads 2] [--repeats 15]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import median_ms, time_interleaved  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="8192,1024")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = p.parse_args()
    import torch

    import cynorm as cn
    M, N = map(int, args.shape.split(","))
    torch.set_num_threads(args.threads)
    cn.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    dt = np.dtype(args.dtype)
    x, dy, tx, tdy = (rng.standard_normal((M, N)).astype(dt) for _ in range(4))
    w, tw = (rng.random(N) + 0.5).astype(dt), rng.standard_normal(N).astype(dt)
    b = np.zeros(N, dt)
    _, mean, rstd = cn.layer_norm(x, (N,), w, b)
    _, (_, tmean, trstd) = cn.jvp(cn.layer_norm, (x, (N,), w, b), (tx, None, None, None))
    primals = (dy, x, (N,), mean, rstd, w, b)
    tangents = (tdy, tx, None, None, None, tw, None)
    T = [torch.from_numpy(a) for a in (dy, x, mean, rstd, w, tdy, tx, tmean, trstd, tw)]
    tb = torch.from_numpy(b)

    def torch_fn(dy, x, m, r, w):
        return torch.ops.aten.native_layer_norm_backward(dy, x, [N], m, r, w, tb, [True, True, True])
    fns = {
        "cynorm": lambda: cn.jvp(cn.layer_norm_backward, primals, tangents),
        "torch": lambda: torch.func.jvp(torch_fn, tuple(T[:5]), tuple(T[5:])),
    }
    ours = fns["cynorm"]()[1]
    theirs = fns["torch"]()[1]
    err = max(float(np.max(np.abs(a - b_.numpy())) / np.max(np.abs(b_.numpy())))
              for a, b_ in zip(ours, theirs))
    ms = {k: median_ms(v) for k, v in time_interleaved(fns, args.repeats).items()}
    print(f"jvp(layer_norm_backward) {args.dtype} ({M}, {N}), {args.threads} threads, median of "
          f"{args.repeats}: cynorm {ms['cynorm']:.2f} ms, torch.func.jvp {ms['torch']:.2f} ms, "
          f"torch/cynorm {ms['torch'] / ms['cynorm']:.2f}x (max rel. difference {err:.1e})")


if __name__ == "__main__":
    main()
