"""A CPU training step of two small models, with PyTorch's norms and with
cynorm's (cynorm.torch.replace_norms), side by side in one process.

    python benchmarks/bench_torch_models.py [--threads 1,2] [--steps 15] [--compile]
        [--models vit,resnet]

Models: a ViT-S/16-style stack of 4 pre-norm transformer blocks (384 wide, 6
heads, 197 tokens, LayerNorm) at batch 8, and a ResNet-18 (BatchNorm2d) on
112x112 images at batch 16; float32, and bfloat16 autocast.  A step is the
forward, a cross-entropy loss, the backward and an SGD update.  The two
models start from the same weights; their steps are interleaved (the order
reversed every other step) and the medians compared.  Each run also reports
the norm operators' time in a step, as torch.profiler shows it (forward op
and backward node, each with what runs inside it; the median of 3 profiled
steps each, alternating), and their share of the step's CPU time.  With
--compile both models run under torch.compile (Inductor; the first steps,
untimed, compile them): Inductor fuses PyTorch's norms with their
neighbours, and cynorm's batch norm but for its statistics operator;
cynorm's layer norm stays one opaque operator.
"""
import argparse
import copy
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import cynorm  # noqa: E402
import cynorm.torch as ct  # noqa: E402


class VitBlocks(nn.Module):
    """Patch embedding, 4 pre-norm transformer blocks, a LayerNorm and a head."""

    def __init__(self, dim=384, heads=6, depth=4, classes=100):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, 16, stride=16)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = nn.Sequential(*[
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        h = self.embed(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], 1)
        return self.head(self.norm(self.blocks(h))[:, 0])


class Basic(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                   nn.BatchNorm2d(cout)) if stride != 1 or cin != cout else None)

    def forward(self, x):
        h = self.b2(self.c2(self.b1(self.c1(x)).relu()))
        return (h + (x if self.down is None else self.down(x))).relu()


class ResNet18(nn.Module):
    def __init__(self, classes=100):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(512, classes)

    def forward(self, x):
        return self.head(self.layers(self.stem(x)).mean((2, 3)))


CASES = [("vit", "ViT-S/16 blocks x4", VitBlocks, (8, 3, 224, 224)),
         ("resnet", "ResNet-18", ResNet18, (16, 3, 112, 112))]
# the norms' top-level events: torch's forward ops and backward nodes, and
# cynorm.torch's (its compiled operators, cynorm_native::<op>, and their
# backward nodes; its eager Functions, _<op>_plain, and theirs)
NORM_FORWARD = ("aten::layer_norm", "aten::batch_norm")
BACKWARD = "autograd::engine::evaluate_function: "
NORM_BACKWARD = ("NativeLayerNormBackward0", "NativeBatchNormBackward0")
NATIVE = "cynorm_native::"


def is_norm(key):
    if key.startswith(BACKWARD):
        node = key[len(BACKWARD):]
        return (node in NORM_BACKWARD or node.endswith("_plainBackward")
                or node.startswith("torch::autograd::CppNode<" + NATIVE))
    return (key in NORM_FORWARD or (key.startswith("_") and key.endswith("_plain"))
            or key.startswith(NATIVE))


def step_fn(model, x, target, autocast, compiled=False):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    run = torch.compile(model) if compiled else model

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = nn.functional.cross_entropy(run(x), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def norm_time(step):
    """The norm operators' milliseconds in one step, and their share of the
    step's CPU time (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    norms = sum(e.cpu_time_total for e in events if is_norm(e.key))
    return norms / 1e3, (norms / total if total else float("nan"))


def native_line():
    """Which path cynorm.torch's eager layer and batch norms take (its
    compiled operators load on the first call that needs gradients)."""
    ct.layer_norm(torch.randn(2, 4, requires_grad=True), 4)
    return f"cynorm.torch's compiled operators: {ct.native_status()}"


def interleaved(steps, rounds, measure):
    """{name: [measure(step), ...]}, every step measured once a round, the
    order reversed every other round."""
    out = {k: [] for k in steps}
    items = list(steps.items())
    for i in range(rounds):
        for k, f in (items if i % 2 == 0 else items[::-1]):
            out[k].append(measure(f))
    return out


def _seconds(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def model_cases(threads, models, autocasts=(False, True)):
    """(threads, name, autocast, model, x, target) for each case asked for,
    torch's and cynorm's thread counts set, the model built from seed 0."""
    for t in threads:
        torch.set_num_threads(t)
        cynorm.set_num_threads(t)
        for key, name, make, shape in CASES:
            if key not in models:
                continue
            for autocast in autocasts:
                torch.manual_seed(0)
                model = make()
                x = torch.randn(*shape)
                target = torch.randint(0, 100, (shape[0],))
                yield t, name, autocast, model, x, target


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--compile", action="store_true", help="both models under torch.compile")
    p.add_argument("--models", default="vit,resnet", help="vit, resnet or both (vit,resnet)")
    args = p.parse_args()
    print(f"torch {torch.__version__}, cynorm {cynorm.__version__}; median of {args.steps} "
          f"interleaved steps" + (", torch.compile" if args.compile else ""))
    print(native_line())
    print("| model | dtype | threads | torch ms/step | cynorm ms/step | torch/cynorm | "
          "norm ops ms/step, torch / cynorm (ratio) | norms' share, torch / cynorm |")
    print("|---|---|---|---|---|---|---|---|")
    for threads, name, autocast, ref, x, target in model_cases(
            [int(t) for t in args.threads.split(",")], args.models.split(",")):
        ours = copy.deepcopy(ref)
        ct.replace_norms(ours)
        steps = {"torch": step_fn(ref, x, target, autocast, args.compile),
                 "cynorm": step_fn(ours, x, target, autocast, args.compile)}
        for f in steps.values():
            f()
            f()
        times = interleaved(steps, args.steps, _seconds)
        a, b = (1e3 * np.median(times[k]) for k in ("torch", "cynorm"))
        dt = "bfloat16 autocast" if autocast else "float32"
        if args.compile:
            # torch's norms are inside Inductor's fused kernels: no
            # operator of their own to profile
            print(f"| {name} | {dt} | {threads} | {a:.1f} | {b:.1f} | {a / b:.2f} | – | – |",
                  flush=True)
            continue
        profiled = interleaved(steps, 3, norm_time)
        ms = {k: float(np.median([p[0] for p in v])) for k, v in profiled.items()}
        share = " / ".join(f"{100 * np.median([p[1] for p in profiled[k]]):.0f} %"
                           for k in ("torch", "cynorm"))
        print(f"| {name} | {dt} | {threads} | {a:.1f} | {b:.1f} | {a / b:.2f} | "
              f"{ms['torch']:.1f} / {ms['cynorm']:.1f} ({ms['torch'] / ms['cynorm']:.2f}) "
              f"| {share} |", flush=True)


if __name__ == "__main__":
    main()
