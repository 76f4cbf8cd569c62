"""Where a second thread starts to pay, per kernel family: each op at a sweep
of sizes, timed at 1 and at 2 threads (cynorm.set_num_threads), interleaved
in one process, inputs warm in cache.

    python benchmarks/bench_threads.py
    python benchmarks/bench_threads.py --dtype bfloat16 --repeats 41

A kernel call runs one thread while it moves fewer bytes (reads and writes
over all its passes) than the threshold of set_parallel_min_bytes; this
benchmark sets the threshold to 0, so "2 threads" always wakes the team.
The table says, for each family (row and column reductions, elementwise
passes, softmax, log_sigmoid) and size, the time at 1 thread over the time
at 2 (above 1: the second thread pays), and the bytes the call moves by the
kernels' own count (the traffic the threshold is compared with: 16-bit
elements count at float32's width).
"""
import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import time_interleaved  # noqa: E402

SIZES = [1 << k for k in range(11, 21)]      # elements: 2 Ki .. 1 Mi


def families(cn, n, dtype, rng):
    """(family, op, elements, passes, callable) with about n elements of input;
    passes: the kernels' count of element reads and writes (entry.pxd's
    threads_for)."""
    def arr(*shape):
        return rng.standard_normal(shape).astype(np.float32).astype(dtype)

    pdt = np.float32 if np.dtype(dtype).itemsize == 2 else dtype
    out = []
    # layer norm: rows of 256 (reduction along rows, then the elementwise pass)
    x = arr(n // 256, 256)
    w, b = np.ones(256, pdt), np.zeros(256, pdt)
    y, mean, rstd = cn.layer_norm(x, (256,), w, b)
    out.append(("row reduction + elementwise", f"LN fwd ({n // 256}, 256)", x.size, 3,
                lambda: cn.layer_norm(x, (256,), w, b)))
    out.append(("row reduction + elementwise", f"LN bwd ({n // 256}, 256)", x.size, 5,
                lambda: cn.layer_norm_backward(x, x, (256,), mean, rstd, w, b)))
    # batch norm: N,C,H,W with 14x14 planes (channel rows), channels-last (columns)
    C = 64
    # (A, 64, 7, 7): planes of 49 elements, so the small sizes have a batch
    xr = arr(max(1, n // (C * 49)), C, 7, 7)
    xc = arr(max(1, n // (C * 49)), 7, 7, C)
    rm, rv = np.zeros(C, np.float32), np.ones(C, np.float32)
    out.append(("channel reduction (rows)", f"BN train {xr.shape} NCHW", xr.size, 3,
                lambda: cn.batch_norm(xr, training=True)))
    out.append(("channel reduction (columns)", f"BN train {xc.shape} NHWC", xc.size, 3,
                lambda: cn.batch_norm(xc, training=True, axis=-1)))
    out.append(("elementwise (rows)", f"BN eval {xr.shape} NCHW", xr.size, 2,
                lambda: cn.batch_norm(xr, None, None, rm, rv, False)))
    out.append(("elementwise (columns)", f"BN eval {xc.shape} NHWC", xc.size, 2,
                lambda: cn.batch_norm(xc, None, None, rm, rv, False, axis=-1)))
    # weight norm over rows (dim 0) and columns (dim 1)
    v = arr(n // 256, 256)
    g0, g1 = np.ones((n // 256, 1), pdt), np.ones((1, 256), pdt)
    out.append(("row norms + scale", f"WN fwd ({n // 256}, 256) dim=0", v.size, 3,
                lambda: cn.weight_norm_interface(v, g0, 0)))
    out.append(("column norms + scale", f"WN fwd ({n // 256}, 256) dim=1", v.size, 3,
                lambda: cn.weight_norm_interface(v, g1, 1)))
    if dtype == np.float32:
        out.append(("softmax rows", f"softmax ({n // 256}, 256)", v.size, 5, lambda: cn.softmax(v, 1)))
        out.append(("pointwise (exp, log1p)", f"log_sigmoid ({v.size},)", v.size, 6,
                    lambda: cn.log_sigmoid_forward(v.reshape(-1))))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=21)
    args = p.parse_args()
    import ml_dtypes

    import cynorm as cn
    from cynorm._kernels import _runtime
    _runtime.set_parallel_min_bytes(0)
    dtype = np.dtype(ml_dtypes.bfloat16) if args.dtype == "bfloat16" else np.dtype(np.float32)
    rng = np.random.default_rng(0)

    def at(threads, f):
        def call():
            cn.set_num_threads(threads)
            return f()
        return call

    print(f"{args.dtype}; median of {args.repeats} interleaved samples (more calls per sample for "
          "small inputs); inputs warm\n")
    print("| family | op | KiB in | KiB moved | 1 thread µs | 2 threads µs | 1 thr / 2 thr |")
    print("|---|---|---|---|---|---|---|")
    for n in SIZES:
        for family, name, size, passes, f in families(cn, n, dtype, rng):
            inner = max(1, (1 << 20) // (size * dtype.itemsize))
            s = time_interleaved({"1": at(1, f), "2": at(2, f)}, args.repeats, inner)
            t1, t2 = (statistics.median(s[k]) * 1e6 for k in ("1", "2"))
            counted = max(dtype.itemsize, 4)       # 16-bit counts at float32's width
            print(f"| {family} | {name} | {size * dtype.itemsize / 1024:g} | "
                  f"{size * counted * passes / 1024:g} | {t1:.1f} | {t2:.1f} | {t1 / t2:.2f} |",
                  flush=True)
    cn.set_num_threads(os.cpu_count() or 1)


if __name__ == "__main__":
    main()
