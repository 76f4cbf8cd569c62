"""Layer norm backward by parts: what grad_x and the column sums cost, next to
torch and to NumPy passes over the same bytes (a bound from the caches).

    python benchmarks/bench_ln_backward_parts.py                    # (512, 768) float32, 1 thread
    python benchmarks/bench_ln_backward_parts.py --shape 2048,1024 --threads 2

Calls run back to back (`--calls` per sample, the median of `--repeats`
samples, each op's samples interleaved with the others'), so the operands
stay wherever they fit; for a shape that fits in the L3 the NumPy rows
give what reading dy and x (np.dot) and reading two arrays and writing one
(np.add with out=) cost there.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import median_ms, time_interleaved  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="512,768", help="M,N: M rows of N")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    M, N = (int(s) for s in args.shape.split(","))

    import cynorm
    try:
        import torch
    except ImportError:         # the torch row is left out (pip install torch==2.13.0)
        torch = None

    cynorm.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((M, N), dtype=np.float32)
    dy = rng.standard_normal((M, N), dtype=np.float32)
    w = rng.random(N, dtype=np.float32) + 0.5
    b = rng.standard_normal(N, dtype=np.float32)
    _, mean, rstd = cynorm.layer_norm(x, (N,), w, b)
    out = np.empty_like(x)
    fns = {
        "cynorm, grad_x + grad_weight + grad_bias":
            lambda: cynorm.layer_norm_backward(dy, x, (N,), mean, rstd, w, b),
        "cynorm, grad_x only":
            lambda: cynorm.layer_norm_backward(dy, x, (N,), mean, rstd, w, b,
                                               output_mask=(True, False, False)),
        "cynorm, grad_weight + grad_bias only":
            lambda: cynorm.layer_norm_backward(dy, x, (N,), mean, rstd, w, b,
                                               output_mask=(False, True, True)),
        "np.add(dy, x, out=): read two, write one": lambda: np.add(dy, x, out=out),
        "np.dot(dy, x) (flat): read two": lambda: np.dot(dy.ravel(), x.ravel()),
    }
    if torch is not None:
        torch.set_num_threads(args.threads)
        tx, tdy, tw, tb = map(torch.from_numpy, (x, dy, w, b))
        _, tmean, trstd = torch.native_layer_norm(tx, [N], tw, tb, 1e-5)
        fns["torch, all three"] = lambda: torch.ops.aten.native_layer_norm_backward(
            tdy, tx, [N], tmean, trstd, tw, tb, [True, True, True])
    samples = time_interleaved(fns, args.repeats, inner=args.calls)
    print(f"layer norm backward float32 ({M}, {N}), {args.threads} thread(s); median of "
          f"{args.repeats} samples of {args.calls} back-to-back calls\n")
    print("| call | µs |")
    print("|---|---|")
    for name, s in samples.items():
        print(f"| {name} | {median_ms(s) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
