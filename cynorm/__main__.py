"""python -m cynorm: the build configuration, then every kernel on
ResNet-50-sized work (weight norm on its conv/linear weights, batch norm on
its activations at batch 1, N,C,H,W and channels-last) and on a ViT-B-sized
layer norm, each result checked against the float64 reference.

Exit status 1 if any check fails.  Options: --quick (a few layers),
--dtypes float32,bfloat16, --threads N.
"""
import argparse
import os
import sys
import statistics
import time

import numpy as np

import cynorm
from cynorm import _dtypes
from cynorm import reference as ref

# normwise relative error allowed per storage dtype
TOLERANCE = {"float64": 1e-12, "float32": 2e-6, "bfloat16": 8e-3, "float16": 1e-3}


def resnet50_weights():
    """(name, shape) of every conv and linear weight of ResNet-50 (25.5M values)."""
    shapes = [("conv1", (64, 3, 7, 7))]
    cin = 64
    for stage, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=1):
        for b in range(blocks):
            pre = f"layer{stage}.{b}"
            shapes += [(f"{pre}.conv1", (width, cin, 1, 1)),
                       (f"{pre}.conv2", (width, width, 3, 3)),
                       (f"{pre}.conv3", (4 * width, width, 1, 1))]
            if b == 0:
                shapes.append((f"{pre}.downsample", (4 * width, cin, 1, 1)))
            cin = 4 * width
    shapes.append(("fc", (1000, 2048)))
    return shapes


def resnet50_activations():
    """(name, N,C,H,W shape) of the distinct batch-norm inputs of ResNet-50 at
    batch 1 and 224x224 input, one per stage and width."""
    return [("bn1", (1, 64, 112, 112)),
            ("layer1.bn", (1, 64, 56, 56)), ("layer1.bn3", (1, 256, 56, 56)),
            ("layer2.bn", (1, 128, 28, 28)), ("layer2.bn3", (1, 512, 28, 28)),
            ("layer3.bn", (1, 256, 14, 14)), ("layer3.bn3", (1, 1024, 14, 14)),
            ("layer4.bn", (1, 512, 7, 7)), ("layer4.bn3", (1, 2048, 7, 7))]


# ViT-B/16 layer norms: (batch, tokens, features), and an MLP-sized one
LAYER_NORM_SHAPES = [("vit.ln", (2, 197, 768)), ("vit.mlp", (2, 197, 3072))]
# a LLaMA-7B block's RMSNorm input: (batch, tokens, hidden)
RMS_NORM_SHAPES = [("llama-7b.rms", (1, 256, 4096))]
# a Stable Diffusion UNet block's GroupNorm (32 groups) at a 64x64 latent,
# and an nnU-Net-style 3-D instance norm: (name, N,C,*spatial shape, groups)
GROUP_NORM_SHAPES = [("unet.gn", (1, 320, 64, 64), 32), ("nnunet.in", (2, 32, 16, 16, 16), 32)]


class Progress:
    def __init__(self, total, stream=sys.stderr):
        self.total, self.done, self.stream = total, 0, stream
        self.tty = stream.isatty()

    def step(self, label):
        self.done += 1
        width = 30
        filled = int(width * self.done / self.total)
        bar = f"  [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {label:<28}"
        if self.tty:
            self.stream.write("\r" + bar + ("\n" if self.done == self.total else ""))
        elif self.done == self.total or self.done % max(1, self.total // 8) == 0:
            self.stream.write(bar + "\n")      # a log file gets whole lines
        self.stream.flush()


def normwise_error(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    scale = np.max(np.abs(want)) if want.size else 0.0
    if scale == 0:
        return float(np.max(np.abs(got - want))) if want.size else 0.0
    return float(np.max(np.abs(got - want)) / scale)


def run_dtype(dtype, layers, rng, progress):
    """Times and errors of the three kernels over every layer, dim=0 (as
    torch.nn.utils.weight_norm on conv/linear weights)."""
    results = {k: [0.0, 0.0, 0] for k in ("norm_except_dim", "weight_norm_interface", "weight_norm_backward")}
    gdt = _dtypes.FLOAT32 if _dtypes.is_16bit(dtype) else dtype
    for name, shape in layers:
        v = rng.standard_normal(shape).astype(dtype)
        gw = rng.standard_normal(shape).astype(dtype)
        g = (rng.random((shape[0],) + (1,) * (len(shape) - 1)) + 0.5).astype(gdt)

        n, t_norm = _timed(lambda: cynorm.norm_except_dim(v, 2, 0))
        (w, norm), t_fwd = _timed(lambda: cynorm.weight_norm_interface(v, g, 0))
        (gv, gg), t_bwd = _timed(lambda: cynorm.weight_norm_backward(gw, v, g, norm, 0))

        w_ref, n_ref = ref.weight_norm(v, g, 0)
        gv_ref, gg_ref = ref.weight_norm_backward(gw, v, g, 0)
        n_ref_stored = n_ref.astype(np.float32).astype(dtype) if _dtypes.is_16bit(dtype) else n_ref
        errs = {
            "norm_except_dim": normwise_error(n, n_ref_stored),
            "weight_norm_interface": max(normwise_error(w, w_ref), normwise_error(norm, n_ref)),
            "weight_norm_backward": max(normwise_error(gv, gv_ref), normwise_error(gg, gg_ref)),
        }
        for key, dt in zip(results, (t_norm, t_fwd, t_bwd)):
            results[key][0] += dt
            results[key][1] = max(results[key][1], errs[key])
            results[key][2] += v.nbytes
        progress.step(f"{dtype} {name}")
    return results


TIMED_CALLS = 5


def _timed(fn):
    """(fn()'s result, the median seconds of TIMED_CALLS calls after a warm-up
    call): one call's time on a busy machine can be many times the typical one."""
    out = fn()
    times = []
    for _ in range(TIMED_CALLS):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, statistics.median(times)


def channel_layouts(rng, shape, dtype):
    """(axis, x, dy): an N,C,... activation and its gradient, stored channels
    first (axis 1), then a new draw stored channels last (axis -1)."""
    for axis in (1, -1):
        x = rng.standard_normal(shape).astype(dtype)
        dy = rng.standard_normal(shape).astype(dtype)
        if axis == -1:
            x, dy = np.moveaxis(x, 1, -1).copy(), np.moveaxis(dy, 1, -1).copy()
        yield axis, x, dy


def run_norms(dtype, activations, rng, progress):
    """Times and errors of layer norm, RMS norm and batch norm (training,
    inference, backward) over the workload, for one storage dtype."""
    keys = ("layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward",
            "group_norm", "group_norm_backward", "batch_norm (training)",
            "batch_norm (inference)", "batch_norm_backward")
    results = {k: [0.0, 0.0, 0] for k in keys}
    pdt = _dtypes.FLOAT32 if _dtypes.is_16bit(dtype) else dtype

    def record(key, secs, err, nbytes):
        results[key][0] += secs
        results[key][1] = max(results[key][1], err)
        results[key][2] += nbytes

    for name, shape in LAYER_NORM_SHAPES:
        F = shape[-1]
        x = rng.standard_normal(shape).astype(dtype)
        dy = rng.standard_normal(shape).astype(dtype)
        w = (rng.random(F) + 0.5).astype(pdt)
        b = rng.standard_normal(F).astype(pdt)
        (y, mean, rstd), secs = _timed(lambda: cynorm.layer_norm(x, F, w, b))
        y_ref, mean_ref, rstd_ref = ref.layer_norm(x, F, w, b)
        record("layer_norm", secs, max(normwise_error(y, y_ref), normwise_error(mean, mean_ref),
                                       normwise_error(rstd, rstd_ref)), x.nbytes)
        grads, secs = _timed(lambda: cynorm.layer_norm_backward(dy, x, F, mean, rstd, w, b))
        refs = ref.layer_norm_backward(dy, x, F, mean_ref, rstd_ref, w)
        record("layer_norm_backward", secs,
               max(normwise_error(g, r) for g, r in zip(grads, refs)), x.nbytes)
        progress.step(f"{dtype} {name}")

    for name, shape in RMS_NORM_SHAPES:
        F = shape[-1]
        x = rng.standard_normal(shape).astype(dtype)
        dy = rng.standard_normal(shape).astype(dtype)
        w = (rng.random(F) + 0.5).astype(pdt)
        (y, rstd), secs = _timed(lambda: cynorm.rms_norm(x, F, w))
        y_ref, rstd_ref = ref.rms_norm(x, F, w)
        record("rms_norm", secs, max(normwise_error(y, y_ref), normwise_error(rstd, rstd_ref)),
               x.nbytes)
        grads, secs = _timed(lambda: cynorm.rms_norm_backward(dy, x, F, rstd, w))
        refs = ref.rms_norm_backward(dy, x, F, rstd_ref, w)
        record("rms_norm_backward", secs,
               max(normwise_error(g, r) for g, r in zip(grads, refs)), x.nbytes)
        progress.step(f"{dtype} {name}")

    for name, shape, G in GROUP_NORM_SHAPES:
        C = shape[1]
        for axis, x, dy in channel_layouts(rng, shape, dtype):
            w = (rng.random(C) + 0.5).astype(pdt)
            b = rng.standard_normal(C).astype(pdt)
            (y, mean, rstd), secs = _timed(lambda: cynorm.group_norm(x, G, w, b, axis=axis))
            y_ref, mean_ref, rstd_ref = ref.group_norm(x, G, w, b, axis=axis)
            record("group_norm", secs, max(normwise_error(y, y_ref), normwise_error(
                mean, mean_ref), normwise_error(rstd, rstd_ref)), x.nbytes)
            grads, secs = _timed(lambda: cynorm.group_norm_backward(dy, x, mean, rstd, w, G,
                                                                    axis=axis))
            refs = ref.group_norm_backward(dy, x, mean_ref, rstd_ref, w, G, axis=axis)
            record("group_norm_backward", secs,
                   max(normwise_error(g, r) for g, r in zip(grads, refs)), x.nbytes)
        progress.step(f"{dtype} {name}")

    for name, shape in activations:
        C = shape[1]
        for axis, x, dy in channel_layouts(rng, shape, dtype):
            w = (rng.random(C) + 0.5).astype(pdt)
            b = rng.standard_normal(C).astype(pdt)
            rm, rv = np.zeros(C, pdt), np.ones(C, pdt)
            (y, sm, si), secs = _timed(lambda: cynorm.batch_norm(
                x, w, b, None, None, training=True, axis=axis))
            y_ref, sm_ref, si_ref, _, _ = ref.batch_norm(x, w, b, None, None, True, 0.1, 1e-5,
                                                         axis=axis)
            record("batch_norm (training)", secs,
                   max(normwise_error(y, y_ref), normwise_error(sm, sm_ref),
                       normwise_error(si, si_ref)), x.nbytes)
            (y, _, _), secs = _timed(lambda: cynorm.batch_norm(
                x, w, b, rm, rv, training=False, axis=axis))
            y_ref = ref.batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5, axis=axis)[0]
            record("batch_norm (inference)", secs, normwise_error(y, y_ref), x.nbytes)
            grads, secs = _timed(lambda: cynorm.batch_norm_backward(
                dy, x, w, None, None, sm, si, True, axis=axis))
            refs = ref.batch_norm_backward(dy, x, w, None, None, sm_ref, si_ref, True, axis=axis)
            record("batch_norm_backward", secs,
                   max(normwise_error(g, r) for g, r in zip(grads, refs)), x.nbytes)
        progress.step(f"{dtype} {name}")
    return results


# a note under the table when other processes used more than this share of
# the machine's CPU time while the job ran
BUSY_SHARE = 0.25


def cpu_busy_seconds():
    """(seconds all CPUs spent busy, as /proc/stat counts them, steal
    included; this process's CPU seconds), or None where /proc/stat is
    missing."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)     # idle + iowait
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    own = os.times()
    return (sum(fields[:8]) - idle) / hz, own.user + own.system


def others_share(before, after, wall, cpus):
    """The share of the machine's CPU time (wall * cpus) that other processes
    used between two cpu_busy_seconds() readings, or None without them;
    elsewhere than Linux, the load average beyond this process over the
    CPUs."""
    if before is None or after is None:
        if not hasattr(os, "getloadavg"):
            return None
        return max(0.0, (os.getloadavg()[0] - 1.0) / cpus)
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, others / (wall * cpus)) if wall > 0 else None


def busy_note(share):
    """The line the job prints when other processes held the CPUs, or None."""
    if share is None or share <= BUSY_SHARE:
        return None
    return (f"note: other processes used {share:.0%} of this machine's CPU time during the run, "
            "so the times above are not to be trusted; for clean numbers rerun on an idle "
            "machine (--threads 1 shows one core's speed)")


def print_cudnn():
    """cudnn_bind's view of the GPU side in one line (the configuration's
    cudnn entry above says which library and, when unavailable, why)."""
    import cudnn_bind
    print(f"\ncudnn_bind.is_available() = {cudnn_bind.is_available()}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m cynorm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the first layers of each stage")
    parser.add_argument("--dtypes", default="float32,float64,bfloat16,float16",
                        help="comma-separated storage dtypes (default: all four)")
    parser.add_argument("--threads", type=int, default=None, help="OpenMP threads (default: OMP_NUM_THREADS or all)")
    parser.add_argument("--version", action="version", version=f"cynorm {cynorm.__version__}")
    args = parser.parse_args(argv)
    if args.threads is not None:
        try:
            cynorm.set_num_threads(args.threads)
        except ValueError as e:
            parser.error(f"--threads: {e}")

    names = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    known = _dtypes.STORAGE_NAMES
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown dtype(s) {', '.join(unknown)}; choose from {', '.join(known)}")

    print(f"cynorm {cynorm.__version__} — build configuration")
    cynorm.show_config()
    print_cudnn()

    layers = resnet50_weights()
    activations = resnet50_activations()
    if args.quick:
        layers = [layers[0], layers[1], layers[-2], layers[-1]]
        activations = [activations[1], activations[-1]]
    nvalues = sum(int(np.prod(s)) for _, s in layers)
    print(f"\nworkload ({cynorm.get_num_threads()} thread(s)):\n"
          f"  weight norm over dim 0 of {len(layers)} conv/linear weights of ResNet-50 "
          f"({nvalues / 1e6:.1f}M values)\n"
          f"  batch norm of {len(activations)} ResNet-50 activations (batch 1), "
          f"N,C,H,W and channels-last\n"
          f"  layer norm of {len(LAYER_NORM_SHAPES)} ViT-B activations\n"
          f"  RMS norm of a LLaMA-7B block's activations {RMS_NORM_SHAPES[0][1]}\n"
          f"  group norm of a UNet block's activations {GROUP_NORM_SHAPES[0][1]} (32 groups) and "
          f"instance norm\n  (a group per channel) of 3-D volumes {GROUP_NORM_SHAPES[1][1]}, "
          f"N,C,... and channels-last")
    rng = np.random.default_rng(0)
    cpus = os.cpu_count() or 1
    started, busy_before = time.perf_counter(), cpu_busy_seconds()
    progress = Progress((len(layers) + len(activations) + len(LAYER_NORM_SHAPES)
                         + len(RMS_NORM_SHAPES) + len(GROUP_NORM_SHAPES)) * len(names))
    rows = []
    for n in names:
        dtype = _dtypes.bfloat16() if n == "bfloat16" else np.dtype(n)
        measured = run_dtype(dtype, layers, rng, progress)
        measured.update(run_norms(dtype, activations, rng, progress))
        for kernel, (secs, err, nbytes) in measured.items():
            rows.append((kernel, n, secs * 1e3, nbytes / secs / 1e9 if secs else 0.0, err, TOLERANCE[n]))
    rows.sort(key=lambda r: (r[0], names.index(r[1])))

    print(f"\n  {'kernel':<24}{'dtype':<10}{'time ms':>9}{'in GB/s':>8}{'max err':>11}{'limit':>9}  check")
    failed = 0
    for kernel, n, ms, gbs, err, tol in rows:
        ok = err <= tol
        failed += not ok
        print(f"  {kernel:<24}{n:<10}{ms:>9.2f}{gbs:>8.1f}{err:>11.2e}{tol:>9.0e}  {'ok' if ok else 'FAIL'}")
    print("\nerrors: max over layers and outputs of max|got - ref| / max|ref| against the float64"
          f"\nNumPy reference; times: summed over layers, each layer's the median of {TIMED_CALLS} calls"
          "\nafter a warm-up (fresh outputs, from the block cache; a busy machine still moves them);"
          "\nGB/s: the main input's bytes over that time.")
    note = busy_note(others_share(busy_before, cpu_busy_seconds(),
                                  time.perf_counter() - started, cpus))
    if note:
        print("\n" + note)
    if failed:
        print(f"\n{failed} check(s) FAILED", file=sys.stderr)
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
