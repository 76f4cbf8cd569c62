"""Where a second thread starts to pay, per kernel family: each op at a sweep
of sizes, timed at 1 and at 2 threads (cynorm.set_num_threads), interleaved
in one process, inputs warm in cache.

    python benchmarks/bench_threads.py
    python benchmarks/bench_threads.py --dtype bfloat16 --repeats 41

The kernels run one thread below 65,536 elements whatever the setting
(entry.pxd's SERIAL_BELOW), so the sweep starts there: the table says, for
each family (row and column reductions, elementwise passes) and size, the
time at 1 thread over the time at 2 (above 1: the second thread pays).
"""
import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import time_interleaved  # noqa: E402

SIZES = [1 << k for k in range(16, 23)]      # elements: 64 Ki .. 4 Mi


def families(cn, n, dtype, rng):
    """(family, op, callable) with about n elements of input."""
    def arr(*shape):
        return rng.standard_normal(shape).astype(np.float32).astype(dtype)

    pdt = np.float32 if np.dtype(dtype).itemsize == 2 else dtype
    out = []
    # layer norm: rows of 256 (reduction along rows, then the elementwise pass)
    x = arr(n // 256, 256)
    w, b = np.ones(256, pdt), np.zeros(256, pdt)
    y, mean, rstd = cn.layer_norm(x, (256,), w, b)
    out.append(("row reduction + elementwise", f"LN fwd ({n // 256}, 256)",
                lambda: cn.layer_norm(x, (256,), w, b)))
    out.append(("row reduction + elementwise", f"LN bwd ({n // 256}, 256)",
                lambda: cn.layer_norm_backward(x, x, (256,), mean, rstd, w, b)))
    # batch norm: N,C,H,W with 14x14 planes (channel rows), channels-last (columns)
    C = 64
    xr = arr(max(1, n // (C * 196)), C, 14, 14)
    xc = arr(max(1, n // (C * 196)), 14, 14, C)
    rm, rv = np.zeros(C, np.float32), np.ones(C, np.float32)
    out.append(("channel reduction (rows)", f"BN train {xr.shape} NCHW",
                lambda: cn.batch_norm(xr, training=True)))
    out.append(("channel reduction (columns)", f"BN train {xc.shape} NHWC",
                lambda: cn.batch_norm(xc, training=True, axis=-1)))
    out.append(("elementwise (rows)", f"BN eval {xr.shape} NCHW",
                lambda: cn.batch_norm(xr, None, None, rm, rv, False)))
    out.append(("elementwise (columns)", f"BN eval {xc.shape} NHWC",
                lambda: cn.batch_norm(xc, None, None, rm, rv, False, axis=-1)))
    # weight norm over rows (dim 0) and columns (dim 1)
    v = arr(n // 256, 256)
    g0, g1 = np.ones((n // 256, 1), pdt), np.ones((1, 256), pdt)
    out.append(("row norms + scale", f"WN fwd ({n // 256}, 256) dim=0",
                lambda: cn.weight_norm_interface(v, g0, 0)))
    out.append(("column norms + scale", f"WN fwd ({n // 256}, 256) dim=1",
                lambda: cn.weight_norm_interface(v, g1, 1)))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=21)
    args = p.parse_args()
    import ml_dtypes

    import cynorm as cn
    dtype = np.dtype(ml_dtypes.bfloat16) if args.dtype == "bfloat16" else np.dtype(np.float32)
    rng = np.random.default_rng(0)

    def at(threads, f):
        def call():
            cn.set_num_threads(threads)
            return f()
        return call

    print(f"{args.dtype}; median of {args.repeats} interleaved samples (more calls per sample for "
          "small inputs); inputs warm\n")
    print("| family | op | KiB in | 1 thread µs | 2 threads µs | 1 thr / 2 thr |")
    print("|---|---|---|---|---|---|")
    for n in SIZES:
        for family, name, f in families(cn, n, dtype, rng):
            inner = max(1, (1 << 20) // (n * dtype.itemsize))
            s = time_interleaved({"1": at(1, f), "2": at(2, f)}, args.repeats, inner)
            t1, t2 = (statistics.median(s[k]) * 1e6 for k in ("1", "2"))
            print(f"| {family} | {name} | {n * dtype.itemsize >> 10} | {t1:.1f} | {t2:.1f} | "
                  f"{t1 / t2:.2f} |", flush=True)
    cn.set_num_threads(os.cpu_count() or 1)


if __name__ == "__main__":
    main()
