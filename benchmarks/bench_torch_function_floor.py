"""The floor under cynorm.torch in a model step: PyTorch's own norm kernels
behind a minimal Python torch.autograd.Function, beside PyTorch's norms and
cynorm's, in the training steps of bench_torch_models.py.

    python benchmarks/bench_torch_function_floor.py [--threads 1,2] [--steps 8]
        [--models vit,resnet] [--dtypes float32,bfloat16]

cynorm.torch's eager layer and batch norms run compiled operators whose
autograd formula is C++, as PyTorch's norms have theirs, where they are
built (cynorm.torch.native_status(), printed first), else Python
autograd.Functions.  The middle model here keeps PyTorch's kernels
(aten::native_layer_norm, aten::native_batch_norm and their backward ops)
and changes only that: its LayerNorm and BatchNorm2d call them from an
autograd.Function whose forward saves what the backward reads and whose
backward calls the backward op, nothing else.  What it loses against
PyTorch's norms is what any Python Function costs inside a model step:
the cost the compiled operators do not pay, and what cynorm's kernels must
gain back where those operators cannot be built.  Norm-op time as
bench_torch_models.py measures it (torch.profiler: forward op and backward
node with what runs inside them); the models' profiled steps interleaved
(the order reversed every other step), medians.
"""
import argparse
import copy
import os
import sys

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import cynorm  # noqa: E402
import cynorm.torch as ct  # noqa: E402
from bench_torch_models import interleaved, model_cases, native_line, norm_time, step_fn  # noqa: E402


# the names end in _plain: bench_torch_models.is_norm counts their forward
# events and backward nodes as norm operators, as it counts cynorm's
class _aten_layer_norm_plain(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, normalized_shape, weight, bias, eps):
        y, mean, rstd = torch.native_layer_norm(x, normalized_shape, weight, bias, eps)
        ctx.save_for_backward(x, mean, rstd, weight, bias)
        ctx.normalized_shape = normalized_shape
        return y

    @staticmethod
    def backward(ctx, gy):
        x, mean, rstd, weight, bias = ctx.saved_tensors
        gx, gw, gb = torch.ops.aten.native_layer_norm_backward(
            gy, x, ctx.normalized_shape, mean, rstd, weight, bias, [True, True, True])
        return gx, None, gw, gb, None


class _aten_batch_norm_plain(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
        y, save_mean, save_invstd = torch.native_batch_norm(
            x, weight, bias, running_mean, running_var, True, momentum, eps)
        ctx.save_for_backward(x, weight, save_mean, save_invstd)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, gy):
        x, weight, save_mean, save_invstd = ctx.saved_tensors
        gx, gw, gb = torch.ops.aten.native_batch_norm_backward(
            gy, x, weight, None, None, save_mean, save_invstd, True, ctx.eps, [True, True, True])
        return gx, gw, gb, None, None, None, None


class FunctionLayerNorm(nn.LayerNorm):
    def forward(self, x):
        return _aten_layer_norm_plain.apply(x, list(self.normalized_shape), self.weight,
                                            self.bias, self.eps)


class FunctionBatchNorm2d(nn.BatchNorm2d):
    def forward(self, x):
        if not self.training:
            return super().forward(x)
        self.num_batches_tracked.add_(1)
        return _aten_batch_norm_plain.apply(x, self.weight, self.bias, self.running_mean,
                                            self.running_var, self.momentum, self.eps)


def swap(model):
    """model with its LayerNorm and BatchNorm2d modules made the classes
    above (subclasses adding no state: the modules keep theirs)."""
    for m in model.modules():
        cls = {nn.LayerNorm: FunctionLayerNorm, nn.BatchNorm2d: FunctionBatchNorm2d}.get(type(m))
        if cls is not None:
            m.__class__ = cls
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--steps", type=int, default=8, help="profiled steps of each model")
    p.add_argument("--models", default="vit,resnet")
    p.add_argument("--dtypes", default="float32,bfloat16",
                   help="float32 and/or bfloat16 (autocast)")
    args = p.parse_args()
    print(f"torch {torch.__version__}, cynorm {cynorm.__version__}; norm ops ms/step, "
          f"median of {args.steps} profiled steps each, interleaved")
    print(native_line())
    print("| model | dtype | threads | torch | torch's kernels in a Python Function (ratio) "
          "| cynorm (ratio) |")
    print("|---|---|---|---|---|---|")
    autocasts = [dt == "bfloat16" for dt in args.dtypes.split(",")]
    for threads, name, autocast, ref, x, target in model_cases(
            [int(t) for t in args.threads.split(",")], args.models.split(","), autocasts):
        function, ours = swap(copy.deepcopy(ref)), copy.deepcopy(ref)
        ct.replace_norms(ours)
        steps = {k: step_fn(m, x, target, autocast)
                 for k, m in (("torch", ref), ("function", function), ("cynorm", ours))}
        for f in steps.values():
            f()
            f()
        ms = interleaved(steps, args.steps, lambda f: norm_time(f)[0])
        t, fn, cy = (float(np.median(ms[k])) for k in ("torch", "function", "cynorm"))
        label = "bfloat16 autocast" if autocast else "float32"
        print(f"| {name} | {label} | {threads} | {t:.1f} | {fn:.1f} ({t / fn:.2f}) "
              f"| {cy:.1f} ({t / cy:.2f}) |", flush=True)


if __name__ == "__main__":
    main()
