"""The measurement behind cynorm.tune_threads: where a thread team starts to
pay, per kernel family, on this machine.

Each family's op runs at input sizes from 2 Ki to 1 Mi float32 elements, on
one thread and on a team (the thresholds forced to 0 meanwhile), the two
interleaved sample by sample, and the fastest sample of each compared.  The
traffic counted is the kernels' own (elements x 4 bytes x the call's
passes), the quantity entry.pxd's threads_for compares with the threshold.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np

from cynorm._kernels import _runtime

SIZES = [1 << k for k in range(11, 21)]     # input elements: 2 Ki .. 1 Mi
SAMPLE_BYTES = 8 << 20                      # traffic per timed sample, at least (~1 ms)
CLEAR_WIN = 1.2                             # two sizes in a row this far ahead: stop
NOISE = 0.05                                # a dip this far behind, above the crossover: noise
# one tuning at a time: each forces the process-wide override to 0 and puts
# back what it found, which a second run in between would have changed
_TUNING = threading.Lock()


def family_call(family: str, n: int, rng: np.random.Generator) -> tuple[int, Callable[[], object]]:
    """(bytes moved by the kernels' count, call) of family's op on about n
    float32 elements."""
    from cynorm.batchnorm import batch_norm
    from cynorm.layernorm import layer_norm, layer_norm_backward
    from cynorm.softmax_ops import softmax
    from cynorm.weightnorm import weight_norm_interface

    def arr(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    rows = max(1, n // 256)
    if family in ("rows", "row_grads"):
        x = arr(rows, 256)
        w, b = np.ones(256, np.float32), np.zeros(256, np.float32)
        if family == "rows":            # reads x twice, writes y
            return x.size * 4 * 3, lambda: layer_norm(x, (256,), w, b)
        _, mean, rstd = layer_norm(x, (256,), w, b)
        return x.size * 4 * 5, lambda: layer_norm_backward(x, x, (256,), mean, rstd, w, b)
    if family in ("elementwise", "channels"):
        x = arr(max(1, n // (64 * 49)), 64, 7, 7)      # N,C,H,W: channel rows of 49
        if family == "channels":        # moments over x, then the pass
            return x.size * 4 * 3, lambda: batch_norm(x, training=True)
        rm, rv = np.zeros(64, np.float32), np.ones(64, np.float32)
        return x.size * 4 * 2, lambda: batch_norm(x, None, None, rm, rv, False)
    x = arr(rows, 256)
    if family == "columns":
        g = np.ones((1, 256), np.float32)
        return x.size * 4 * 3, lambda: weight_norm_interface(x, g, 1)
    if family == "exp":
        return x.size * 4 * 5, lambda: softmax(x, 1)
    raise ValueError(f"unknown kernel family {family!r}")


def team_speedup(call: Callable[[], object], moved: int, threads: int, repeats: int) -> float:
    """Fastest sample on one thread over fastest on `threads`, samples of
    the two interleaved (interference only ever adds time: the minimum is
    the cost without it, the steadiest figure on a shared machine)."""
    inner = max(1, SAMPLE_BYTES // moved)
    times: dict[int, list[float]] = {1: [], threads: []}
    for _ in range(repeats):
        for t in (1, threads):
            _runtime.set_num_threads(t)
            call()                      # the team awake (or asleep) as the next calls find it
            start = time.perf_counter()
            for _ in range(inner):
                call()
            times[t].append(time.perf_counter() - start)
    return min(times[1]) / min(times[threads])


def crossover(moved: list[int], speedups: list[float], fallback: int) -> int:
    """The smallest traffic at which the team was ahead and from which it
    never fell more than 5 % behind (a noisy sample may); `fallback` if no
    size qualifies (the team never paid within the sweep, up to 20 MiB of
    traffic: an odd machine state rather than a threshold beyond it)."""
    threshold = fallback
    for m, s in zip(reversed(moved), reversed(speedups)):
        if s < 1.0 - NOISE:
            break
        if s >= 1.0:
            threshold = m
    return threshold


def measure_thresholds(threads: int, repeats: int) -> dict[str, int]:
    """{family: bytes} measured at `threads` threads (>= 2)."""
    with _TUNING:
        return _measure(threads, repeats)


def _measure(threads: int, repeats: int) -> dict[str, int]:
    rng = np.random.default_rng(0)
    old_threads = _runtime.get_num_threads()
    old_forced = _runtime.set_parallel_min_bytes(0)        # the team for every call
    found = {}
    try:
        for family, default in zip(_runtime.FAMILIES, _runtime.DEFAULT_FAMILY_MIN_BYTES):
            moved: list[int] = []
            speedups: list[float] = []
            for n in SIZES:
                nbytes, call = family_call(family, n, rng)
                if moved and nbytes == moved[-1]:
                    continue            # the same shape again (batch norm's smallest)
                moved.append(nbytes)
                speedups.append(team_speedup(call, nbytes, threads, repeats))
                if len(speedups) >= 2 and min(speedups[-2:]) >= CLEAR_WIN:
                    break               # larger sizes only widen the team's lead
            found[family] = crossover(moved, speedups, default)
    finally:
        _runtime.set_parallel_min_bytes(old_forced)
        _runtime.set_num_threads(old_threads)
    return found
