"""Nested (jagged) layer norm and linear, forward + backward: cynorm.nested vs
padding to the longest sequence and running dense cynorm / NumPy, and vs
torch.nested (jagged layout, autograd), in one process at one thread count.

    python benchmarks/bench_nested.py [--threads 2] [--repeats 9] [--batch 256] [--hidden 768]

Sequences: lengths drawn uniformly from 1..512 (seed 0); float32.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import median_ms, time_interleaved  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--max-len", type=int, default=512)
    args = p.parse_args()
    import torch

    import cynorm
    import cynorm.nested as nt
    torch.set_num_threads(args.threads)
    cynorm.set_num_threads(args.threads)
    try:                      # NumPy's BLAS (the nested and padded GEMMs) at the same count
        from threadpoolctl import threadpool_limits
        threadpool_limits(args.threads, user_api="blas")
    except ImportError:
        print("threadpoolctl missing: NumPy's BLAS runs at its default thread count", file=sys.stderr)
    rng = np.random.default_rng(0)
    H = args.hidden
    lengths = rng.integers(1, args.max_len + 1, args.batch)
    comps = [rng.standard_normal((int(n), H), dtype=np.float32) for n in lengths]
    x = nt.nested_array(comps)
    g = x.like(rng.standard_normal(x.buffer.size, dtype=np.float32))
    w, b = (rng.random(H, dtype=np.float32) + 0.5), rng.standard_normal(H, dtype=np.float32)
    W = (rng.standard_normal((H, H), dtype=np.float32) / np.sqrt(H)).astype(np.float32)
    bias = rng.standard_normal(H, dtype=np.float32)
    padded, gpad = x.to_padded(), g.to_padded()
    ratio = padded.size / x.buffer.size
    L = padded.shape[1]
    tx = torch.nested.nested_tensor([torch.from_numpy(c) for c in comps], layout=torch.jagged,
                                    requires_grad=True)
    # the cotangent must share tx's ragged structure (its offsets), not just equal sizes
    tg = torch.nested.nested_tensor_from_jagged(torch.from_numpy(g.buffer.reshape(-1, H)),
                                                offsets=tx.offsets())
    tw, tb = torch.from_numpy(w).requires_grad_(), torch.from_numpy(b).requires_grad_()
    tW, tbias = torch.from_numpy(W).requires_grad_(), torch.from_numpy(bias).requires_grad_()

    def ln_nested():
        y, mean, rstd = nt.layer_norm(x, (H,), w, b)
        return y, nt.layer_norm_backward(g, x, (H,), mean, rstd, w, b)

    def ln_padded():
        y, mean, rstd = cynorm.layer_norm(padded, (H,), w, b)
        return y, cynorm.layer_norm_backward(gpad, padded, (H,), mean, rstd, w, b)

    def ln_torch():
        y = torch.nn.functional.layer_norm(tx, (H,), tw, tb)
        return torch.autograd.grad(y, (tx, tw, tb), tg)

    def lin_nested():
        y = nt.linear(x, W, bias)
        return y, nt.linear_backward(x, g, W)

    def lin_padded():
        x2, g2 = padded.reshape(-1, H), gpad.reshape(-1, H)
        y = x2 @ W.T + bias
        return y, (g2 @ W, g2.T @ x2, g2.sum(axis=0))

    def lin_torch():
        y = torch.nn.functional.linear(tx, tW, tbias)
        return torch.autograd.grad(y, (tx, tW, tbias), tg)

    print(f"{args.batch} sequences, lengths 1..{args.max_len} (total {x.buffer.size // H} rows, padded "
          f"{args.batch} x {L} = {padded.size // H}: padding ratio {ratio:.2f}), hidden {H}, float32, "
          f"{args.threads} threads, median of {args.repeats}\n")
    print("| op (forward + backward) | cynorm.nested ms | padded dense ms | torch.nested ms | "
          "padded/nested | torch/nested |")
    print("|---|---|---|---|---|---|")
    for name, fns, padded_lib in (("layer_norm", (ln_nested, ln_padded, ln_torch), "cynorm"),
                                  ("linear 768->768", (lin_nested, lin_padded, lin_torch), "NumPy")):
        ms = {k: median_ms(v) for k, v in time_interleaved(dict(zip(("nested", "padded", "torch"), fns)),
                                                            args.repeats).items()}
        print(f"| {name} | {ms['nested']:.1f} | {ms['padded']:.1f} ({padded_lib}) | {ms['torch']:.1f} | "
              f"{ms['padded'] / ms['nested']:.2f}x | {ms['torch'] / ms['nested']:.2f}x |")


if __name__ == "__main__":
    main()
