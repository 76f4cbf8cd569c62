"""The fixed cost of one cynorm.torch call, by parts, beside PyTorch's.

Layer norm with weight and bias, float32, 1 thread: PyTorch's
F.layer_norm, cynorm.torch.layer_norm, and an autograd.Function that does
nothing but save its inputs (the floor under any Python adapter), forward
with gradients and forward plus `y.backward`; then the parts of cynorm's
call: its NumPy kernels alone, its tensors read as arrays, its result made
a tensor.  Interleaved, median of `--repeats` batches of 50 calls, µs.

    python benchmarks/bench_torch_call_parts.py [--shape 64,384] [--repeats 40]
"""
import argparse
import time

import numpy as np
import torch

import cynorm
import cynorm.torch as ct
from cynorm import torch as adapter


class Empty(torch.autograd.Function):
    """A layer norm's Function with nothing inside: the inputs saved, an
    output allocated, the gradient passed through."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        return x.new_empty(x.shape)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="64,384", help="x's shape; normalized over the last dim")
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    torch.set_num_threads(1)
    cynorm.set_num_threads(1)

    x = torch.randn(*shape, requires_grad=True)
    w = torch.ones(shape[-1], requires_grad=True)
    b = torch.zeros(shape[-1], requires_grad=True)
    n = [shape[-1]]
    xa, wa, ba = (t.detach().numpy() for t in (x, w, b))
    y, mean, rstd = cynorm.layer_norm(xa, (shape[-1],), wa, ba, 1e-5)
    gy = torch.ones(shape)

    def forward_backward(f):
        f(x, n, w, b).backward(gy)

    cases = {
        "torch, forward with gradients": lambda: torch.nn.functional.layer_norm(x, n, w, b),
        "cynorm.torch, forward with gradients": lambda: ct.layer_norm(x, n, w, b),
        "empty Function, forward": lambda: Empty.apply(x, w, b),
        "torch, forward and backward": lambda: forward_backward(torch.nn.functional.layer_norm),
        "cynorm.torch, forward and backward": lambda: forward_backward(ct.layer_norm),
        "empty Function, forward and backward":
            lambda: forward_backward(lambda a, _, c, d: Empty.apply(a, c, d)),
        "cynorm's NumPy layer_norm": lambda: cynorm.layer_norm(xa, (shape[-1],), wa, ba, 1e-5),
        "cynorm's NumPy layer_norm_backward":
            lambda: cynorm.layer_norm_backward(y, xa, (shape[-1],), mean, rstd, wa, ba,
                                               (True, True, True)),
        "three tensors as arrays": lambda: (adapter._memory(x), adapter._memory(w),
                                            adapter._memory(b)),
        "a result as a tensor": lambda: adapter._like(y, x, xa, True),
    }
    for f in cases.values():
        for _ in range(300):
            f()
    times = {k: [] for k in cases}
    for _ in range(args.repeats):
        for k, f in cases.items():
            t0 = time.perf_counter()
            for _ in range(50):
                f()
            times[k].append((time.perf_counter() - t0) / 50)
    print(f"layer norm {shape} float32, 1 thread, median µs a call")
    print("| call | µs |\n|---|---|")
    for k, v in times.items():
        print(f"| {k} | {np.median(v) * 1e6:.1f} |")


if __name__ == "__main__":
    main()
