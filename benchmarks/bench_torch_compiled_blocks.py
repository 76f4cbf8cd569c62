"""A norm and the activation after it under torch.compile, PyTorch's modules
against cynorm.torch's, side by side in one process.

    python benchmarks/bench_torch_compiled_blocks.py [--threads 1] [--steps 21]
        [--blocks bn,gn] [--forward-only] [--dtype float32]

Blocks: BatchNorm2d + ReLU twice (ResNet-18's shapes at batch 16) and
GroupNorm(32) + SiLU (a UNet's), each in channels-first and channels-last
layouts, compiled with Inductor (caches off); a step is the forward and,
unless --forward-only, the backward of a fixed gradient.  The two modules'
steps are interleaved (the order reversed every other step) and the
medians compared: torch/cynorm > 1 means cynorm's is faster.
"""
import argparse
import copy
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

BLOCKS = {
    "bn": ("BatchNorm2d + ReLU, x2",
           lambda C: torch.nn.Sequential(torch.nn.BatchNorm2d(C), torch.nn.ReLU(),
                                         torch.nn.BatchNorm2d(C), torch.nn.ReLU()),
           [(16, 64, 56, 56), (16, 128, 14, 14), (16, 512, 4, 4)]),
    "gn": ("GroupNorm(32) + SiLU",
           lambda C: torch.nn.Sequential(torch.nn.GroupNorm(32, C), torch.nn.SiLU()),
           [(4, 320, 32, 32), (2, 640, 16, 16)]),
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=21)
    p.add_argument("--blocks", default="bn,gn")
    p.add_argument("--forward-only", action="store_true")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cynorm.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}; {args.threads} thread(s), {args.dtype}, "
          f"{'forward' if args.forward_only else 'forward + backward'}, median of "
          f"{args.steps} interleaved steps")
    print("| block | shape | layout | torch ms | cynorm ms | torch/cynorm |")
    print("|---|---|---|---|---|---|")
    for key in args.blocks.split(","):
        name, make, shapes = BLOCKS[key]
        for shape in shapes:
            for layout in (torch.contiguous_format, torch.channels_last):
                torch.manual_seed(0)
                ref = make(shape[1]).to(dtype)
                ours = copy.deepcopy(ref)
                ct.replace_norms(ours)
                x = torch.randn(*shape).to(dtype).to(memory_format=layout)
                g = torch.randn(*shape).to(dtype).to(memory_format=layout)
                x.requires_grad_(not args.forward_only)
                torch._dynamo.reset()
                fs = {}
                for k, m in (("torch", ref), ("cynorm", ours)):
                    run = torch.compile(m)

                    def step(run=run):
                        y = run(x)
                        if not args.forward_only:
                            y.backward(g)
                    fs[k] = step
                # (the two warm-up calls compile)
                ms = {k: median_ms(v) for k, v in time_interleaved(fs, args.steps).items()}
                lay = "NCHW" if layout == torch.contiguous_format else "channels last"
                print(f"| {name} | {shape} | {lay} | {ms['torch']:.3f} | {ms['cynorm']:.3f} | "
                      f"{ms['torch'] / ms['cynorm']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
