"""Streamed (non-temporal) against cached stores, on outputs large enough to
stream: each op timed both ways in one process, interleaved, cold caches.

    python benchmarks/bench_stream_stores.py                  # 1 thread, both dtypes
    python benchmarks/bench_stream_stores.py --threads 2 --dtypes bfloat16
    python benchmarks/bench_stream_stores.py --stream-from 16   # stream from 16 MiB

cynorm streams an output of at least `_runtime.streaming_threshold()` bytes
by default; "streamed" here streams from `--stream-from` MiB (default: that
threshold) and "cached" sets the threshold out of reach
(`set_stream_min_bytes(1 << 62)`) for its calls.  Both give the
same bits.  Prints the median ms of each and cached/streamed: above 1, the
streamed stores pay on this machine.  Run it under the fault-free
allocation setting (MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736)
to keep page faults out of both.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import CacheEvictor  # noqa: E402


def cases(cynorm, dtype, rng):
    """(name, callable) pairs whose outputs stream at the default threshold."""
    x = rng.standard_normal((8192, 1024)).astype(dtype)
    dy = rng.standard_normal((8192, 1024)).astype(dtype)
    w, b = np.ones(1024, np.float32), np.zeros(1024, np.float32)
    _, mean, rstd = cynorm.layer_norm(x, (1024,), w, b)
    yield "LN fwd (8192, 1024)", lambda: cynorm.layer_norm(x, (1024,), w, b)
    yield "LN bwd (8192, 1024)", lambda: cynorm.layer_norm_backward(dy, x, (1024,), mean, rstd, w, b)
    xb = rng.standard_normal((64, 64, 56, 56)).astype(dtype)
    wc, bc = np.ones(64, np.float32), np.zeros(64, np.float32)
    rm, rv = np.zeros(64, np.float32), np.ones(64, np.float32)
    yield "BN train (64, 64, 56, 56)", lambda: cynorm.batch_norm(xb, wc, bc, rm, rv, True, 0.1, 1e-5)
    yield "BN eval (64, 64, 56, 56)", lambda: cynorm.batch_norm(xb, wc, bc, rm, rv, False, 0.1, 1e-5)
    v = rng.standard_normal((4096, 4096)).astype(dtype)
    g0, g1 = np.ones((4096, 1), dtype), np.ones((1, 4096), dtype)
    xg = rng.standard_normal((8, 320, 64, 64)).astype(dtype)
    wg, bg = np.ones(320, np.float32), np.zeros(320, np.float32)
    xgl = np.ascontiguousarray(np.moveaxis(xg, 1, -1))
    yield "GN fwd (8, 320, 64, 64) NCHW", lambda: cynorm.group_norm(xg, 32, wg, bg)
    yield "GN fwd (8, 320, 64, 64) NHWC", lambda: cynorm.group_norm(xgl, 32, wg, bg, axis=-1)
    xi = rng.standard_normal((2, 64, 32, 32, 32)).astype(dtype)
    yield "IN fwd (2, 64, 32, 32, 32) NCDHW", lambda: cynorm.instance_norm(xi)
    yield "WN fwd (4096, 4096) dim=0", lambda: cynorm.weight_norm_interface(v, g0, 0)
    yield "WN fwd (4096, 4096) dim=1", lambda: cynorm.weight_norm_interface(v, g1, 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--stream-from", type=float, default=None,
                   help="MiB from which the streamed calls stream (default: this machine's threshold)")
    args = p.parse_args()

    import ml_dtypes

    import cynorm
    from cynorm._kernels import _runtime

    cynorm.set_num_threads(args.threads)
    threshold = _runtime.streaming_threshold()
    stream_from = threshold if args.stream_from is None else int(args.stream_from * (1 << 20))
    evict = CacheEvictor(args.threads)
    rng = np.random.default_rng(0)
    print(f"cynorm {cynorm.__version__}, {args.threads} thread(s), streaming from "
          f"{threshold >> 20} MiB by default, {stream_from >> 20} MiB in the streamed calls; "
          f"median of {args.repeats} cold-cache calls each\n")
    print("| dtype | case | streamed ms | cached ms | cached/streamed |")
    print("|---|---|---|---|---|")
    for name in args.dtypes.split(","):
        dtype = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
        for case, call in cases(cynorm, dtype, rng):
            times = {"streamed": [], "cached": []}
            try:
                for _ in range(args.repeats):
                    for mode in times:
                        _runtime.set_stream_min_bytes(stream_from if mode == "streamed" else 1 << 62)
                        evict()
                        t = time.perf_counter()
                        call()
                        times[mode].append(time.perf_counter() - t)
            finally:
                _runtime.set_stream_min_bytes(threshold)
            s, c = (statistics.median(times[m]) * 1e3 for m in ("streamed", "cached"))
            print(f"| {name} | {case} | {s:.3f} | {c:.3f} | {c / s:.2f} |")


if __name__ == "__main__":
    main()
