"""The residual add fused into the norm inside PyTorch: cynorm.torch's
add_rms_norm / add_layer_norm against PyTorch's unfused composition (eager,
and compiled by Inductor, which fuses the add into its norm loop), side by
side in one process.

    python benchmarks/bench_torch_add_norms.py [--threads 1,2] [--repeats 21]
        [--dtypes float32,bfloat16] [--forward-only]

A call is ``y, h = add_norm(x, r)`` and, unless --forward-only, the backward
of a loss that reaches h through y and on its own (``y * gy + h * gh``, the
gradients fixed), with x, r and the weight requiring gradients.  Calls are
interleaved (the order reversed every other repeat); the table gives median
milliseconds and torch/cynorm (> 1: cynorm's is faster).  The compiled
composition is Inductor's (caches off), compiled once per case before timing;
"cynorm compiled" is cynorm.torch's call inside torch.compile (one opaque
operator), against the compiled composition.
"""
import argparse
import os
import sys

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import cynorm  # noqa: E402
import cynorm.torch as ct  # noqa: E402
from _common import median_ms, time_interleaved  # noqa: E402

F = torch.nn.functional

# (label, cynorm.torch's function, PyTorch's composition, shapes)
CASES = [
    ("add+RMS", lambda x, r, w, b: ct.add_rms_norm(x, r, x.shape[-1], w),
     lambda x, r, w, b: (F.rms_norm(x + r, (x.shape[-1],), w), x + r),
     [(2048, 4096), (64, 4096)]),
    ("add+LN", lambda x, r, w, b: ct.add_layer_norm(x, r, x.shape[-1], w, b),
     lambda x, r, w, b: (F.layer_norm(x + r, (x.shape[-1],), w, b), x + r),
     [(8192, 1024), (512, 768)]),
]


def step(fn, x, r, w, b, gy, gh, forward_only):
    def run():
        y, h = fn(x, r, w, b)
        if not forward_only:
            torch.autograd.backward((y, h), (gy, gh))
            for t in (x, r, w, b):
                t.grad = None
        return y
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--forward-only", action="store_true")
    args = p.parse_args()
    what = "forward" if args.forward_only else "forward + backward"
    print(f"torch {torch.__version__}; {what}; median of {args.repeats} interleaved calls")
    print("| threads | case | dtype | shape | cynorm ms | torch ms | torch compiled ms "
          "| cynorm compiled ms | torch/cynorm | compiled/cynorm | compiled/cynorm compiled |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        cynorm.set_num_threads(threads)
        for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
            for label, ours, theirs, shapes in CASES:
                for shape in shapes:
                    g = torch.Generator().manual_seed(0)
                    x, r, gy, gh = (torch.randn(shape, generator=g).to(dtype) for _ in range(4))
                    x.requires_grad_()
                    r.requires_grad_()
                    # float32 parameters (a mixed-precision model's), as ct takes them;
                    # torch's composition takes them in x's dtype
                    w = torch.randn(shape[-1], generator=g, requires_grad=True)
                    b = torch.randn(shape[-1], generator=g, requires_grad=True)
                    wt = w.detach().to(dtype).requires_grad_()
                    bt = b.detach().to(dtype).requires_grad_()
                    torch._dynamo.reset()
                    compiled = torch.compile(theirs, fullgraph=True)
                    ours_compiled = torch.compile(ours, fullgraph=True)
                    fns = {"cynorm": step(ours, x, r, w, b, gy, gh, args.forward_only),
                           "torch": step(theirs, x, r, wt, bt, gy, gh, args.forward_only),
                           "compiled": step(compiled, x, r, wt, bt, gy, gh,
                                            args.forward_only),
                           "ours_compiled": step(ours_compiled, x, r, w, b, gy, gh,
                                                 args.forward_only)}
                    t = {k: median_ms(v)
                         for k, v in time_interleaved(fns, args.repeats, warmup=3).items()}
                    print(f"| {threads} | {label} | {str(dtype)[6:]} | {shape} "
                          f"| {t['cynorm']:.3f} | {t['torch']:.3f} | {t['compiled']:.3f} "
                          f"| {t['ours_compiled']:.3f} | {t['torch'] / t['cynorm']:.2f} "
                          f"| {t['compiled'] / t['cynorm']:.2f} "
                          f"| {t['compiled'] / t['ours_compiled']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
