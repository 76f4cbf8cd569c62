"""python -m cynorm: the build configuration, then every kernel on a
ResNet-50-sized set of weights, checked against the float64 reference.

Exit status 1 if any check fails.  Options: --quick (a few layers),
--dtypes float32,bfloat16, --threads N.
"""
import argparse
import sys
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

        for _ in range(2):          # the second, warm call is the one timed
            t = time.perf_counter()
            n = cynorm.norm_except_dim(v, 2, 0)
            t1 = time.perf_counter()
            w, norm = cynorm.weight_norm_interface(v, g, 0)
            t2 = time.perf_counter()
            gv, gg = cynorm.weight_norm_backward(gw, v, g, norm, 0)
            t3 = time.perf_counter()

        w_ref, n_ref = ref.weight_norm(v, g, 0)
        gv_ref, gg_ref = ref.weight_norm_backward(gw, v, g, 0)
        n_ref_stored = n_ref.astype(np.float32).astype(dtype) if _dtypes.is_16bit(dtype) else n_ref
        errs = {
            "norm_except_dim": normwise_error(n, n_ref_stored),
            "weight_norm_interface": max(normwise_error(w, w_ref), normwise_error(norm, n_ref)),
            "weight_norm_backward": max(normwise_error(gv, gv_ref), normwise_error(gg, gg_ref)),
        }
        for key, dt in zip(results, (t1 - t, t2 - t1, t3 - t2)):
            results[key][0] += dt
            results[key][1] = max(results[key][1], errs[key])
            results[key][2] += v.nbytes
        progress.step(f"{dtype} {name}")
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m cynorm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the first layers of each stage")
    parser.add_argument("--dtypes", default="float32,float64,bfloat16,float16",
                        help="comma-separated storage dtypes (default: all four)")
    parser.add_argument("--threads", type=int, default=None, help="OpenMP threads (default: OMP_NUM_THREADS or all)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        cynorm.set_num_threads(args.threads)

    names = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    known = {str(d): d for d in _dtypes.SUPPORTED_DTYPES}
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown dtype(s) {', '.join(unknown)}; choose from {', '.join(known)}")

    print(f"cynorm {cynorm.__version__} — build configuration")
    cynorm.show_config()

    layers = resnet50_weights()
    if args.quick:
        layers = [layers[0], layers[1], layers[-2], layers[-1]]
    nvalues = sum(int(np.prod(s)) for _, s in layers)
    print(f"\nworkload: {len(layers)} conv/linear weights of ResNet-50 ({nvalues / 1e6:.1f}M values), "
          f"weight norm over dim 0, {cynorm.get_num_threads()} thread(s)")
    rng = np.random.default_rng(0)
    progress = Progress(len(layers) * len(names))
    rows = []
    for n in names:
        for kernel, (secs, err, nbytes) in run_dtype(known[n], layers, rng, progress).items():
            rows.append((kernel, n, secs * 1e3, nbytes / secs / 1e9 if secs else 0.0, err, TOLERANCE[n]))

    print(f"\n  {'kernel':<24}{'dtype':<10}{'time ms':>9}{'v GB/s':>8}{'max err':>11}{'limit':>9}  check")
    failed = 0
    for kernel, n, ms, gbs, err, tol in rows:
        ok = err <= tol
        failed += not ok
        print(f"  {kernel:<24}{n:<10}{ms:>9.2f}{gbs:>8.1f}{err:>11.2e}{tol:>9.0e}  {'ok' if ok else 'FAIL'}")
    print("\nerrors: max over layers of max|got - ref| / max|ref| against the float64 NumPy reference;"
          "\ntimes: summed over layers, second call of each (fresh outputs, from the block cache).")
    if failed:
        print(f"\n{failed} check(s) FAILED", file=sys.stderr)
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
