"""Pieces shared by the benchmark scripts in this directory.

- `stream_triad_gbs`: STREAM triad bandwidth with streamed stores at a thread
  count; `stream_bounds`: that and the other loops of stream_bounds.c;
- `time_interleaved`: warm up, then time several callables in turn, repeatedly;
- `CacheEvictor`: pushes the operands of the previous calls out of the caches
  (run before each timed call of a DRAM-bound case);
- `run_child` / `FAULT_FREE_ENV`: run a script's `--child` mode in a fresh
  process under one allocation setting ("default" or "faultfree") and read
  the JSON it prints;
- `setting_heading`: the markdown heading of one allocation setting;
- `cpu_snapshot` / `other_cpu_share`: how much of the machine other processes
  used while a child ran (a noise indicator on a shared VM).
"""
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FAULT_FREE_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736"}
SETTINGS = ("default", "faultfree")


# --------------------------------------------------------------------------- #
# STREAM triad
def stream_bounds(threads):
    """stream_bounds.c's lines at `threads` threads: {name: GB/s}, names
    "triad", "triad_nt", "scale_nt", "twopass_nt <unit> KiB",
    "twopass_ahead_nt <unit> KiB" and (builds with AVX512-BF16)
    "twopass_bf16_nt <unit> KiB"; None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    exe = os.path.join(tempfile.gettempdir(), "cynorm_stream_bounds")
    src = os.path.join(HERE, "stream_bounds.c")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        subprocess.run([cc, "-O3", "-march=native", "-fopenmp", src, "-o", exe], check=True)
    out = subprocess.run([exe], env=dict(os.environ, OMP_NUM_THREADS=str(threads)),
                         capture_output=True, text=True, check=True)
    bounds = {}
    for line in out.stdout.splitlines():
        if line.startswith("#"):
            print(f"stream_bounds.c: {line[1:].strip()}")
            continue
        name, gbs = line.split()[:2]
        unit = line.split("(unit ")[1].rstrip(")") if "(unit " in line else ""
        bounds[f"{name} {unit}".strip()] = float(gbs)
    return bounds


def stream_triad_gbs(threads):
    """The triad with streamed stores at `threads` threads, best of 10 runs
    on cold caches (stream_bounds.c; a NumPy triad without a C compiler)."""
    bounds = stream_bounds(threads)
    if bounds:
        return bounds["triad_nt"], "C triad, streamed stores"
    n = (256 << 20) // 8
    b, c, a = np.ones(n), np.full(n, 2.0), np.empty(n)
    best = 1e30
    for _ in range(5):
        t = time.perf_counter()
        np.multiply(c, 3.0, out=a)
        np.add(a, b, out=a)
        best = min(best, time.perf_counter() - t)
    return 24 * n / best / 1e9, "NumPy triad (2 passes, underestimates)"


# --------------------------------------------------------------------------- #
# timing
def median_ms(samples):
    return statistics.median(samples) * 1e3


def time_interleaved(fns, reps, inner=1, warmup=2, before=None):
    """{name: [seconds per call, one per repeat]} for the callables in `fns`.

    Each callable first runs `warmup` times (caches, thread pools, allocator);
    then every repeat calls each of them in turn (interleaved, so drifts in the
    machine's speed hit all alike), `inner` times per sample, in reverse order
    every other repeat: a callable's place in the turn (say, right after the
    cache evictor's dirty lines or another callable's) measured worth up to
    30 % on its own on a DRAM-bound op.  The result of a call is dropped
    before the next callable runs.  `before` (untimed), if given, runs before
    every sample: a CacheEvictor, say.
    """
    samples = {k: [] for k in fns}
    for f in fns.values():
        for _ in range(warmup):
            f()
    items = list(fns.items())
    for rep in range(reps):
        for k, f in (items if rep % 2 == 0 else items[::-1]):
            if before is not None:
                before()
            t = time.perf_counter()
            for _ in range(inner):
                r = f()
            samples[k].append((time.perf_counter() - t) / inner)
            del r
    return samples


def last_level_cache_bytes(default=128 << 20):
    """The largest CPU cache, as cynorm reads it (`default` when cynorm cannot
    be imported or the size is unknown)."""
    try:
        from cynorm._kernels._runtime import last_level_cache_bytes as llc
        return llc() or default
    except Exception:  # noqa: BLE001 - a broken cynorm must not stop a torch-only run
        return default


class CacheEvictor:
    """Passes over a buffer 1.5 times the last-level cache, so that the next
    call finds none of the previous calls' operands in any cache.

    Without it, an input of a few tens of MiB stays partly in a large shared
    L3 between calls, and how much of it does depends on which callable ran
    just before: on a 105 MiB L3, cynorm's out= variant (run right after the
    fresh-output call, on the same input) measured 10-20 % faster than the
    same kernel run after torch and NumPy had passed over their own arrays.

    `dirty` is the share of the buffer written (the rest is only read), in
    blocks spread evenly over it, and should be the timed call's written
    bytes over the bytes it reads and writes: each line the call brings in
    then evicts a dirty line with that probability, so it pays for about as
    many write-backs as it writes, as in a steady stream of calls.  (A
    read-only pass left the call's own output dirty in the L3, unpaid: layer
    norm forward measured 110 % of STREAM triad; an all-written one charged
    a write-back for every line read as well.)  The pass runs on `threads`
    threads, so that every core's own L2 is cleared too.
    """

    FACTOR = 1.5
    BLOCK = 4 << 20

    def __init__(self, threads=1):
        nblk = max(1, (self.size_mib() << 20) // self.BLOCK)
        self.buf = np.zeros((nblk, self.BLOCK // 8), dtype=np.uint64)
        self.threads = max(1, threads)
        self.pool = None
        if self.threads > 1:
            from concurrent.futures import ThreadPoolExecutor
            self.pool = ThreadPoolExecutor(self.threads)

    @classmethod
    def size_mib(cls):
        return int(cls.FACTOR * last_level_cache_bytes()) >> 20

    def _pass(self, rows, dirty):
        for i in rows:
            if int((i + 1) * dirty) > int(i * dirty):
                np.add(self.buf[i], 1, out=self.buf[i])
            else:
                self.buf[i].max()

    def __call__(self, dirty=1.0):
        n = len(self.buf)
        if self.pool is None:
            return self._pass(range(n), dirty)
        step = -(-n // self.threads)
        list(self.pool.map(lambda t: self._pass(range(t * step, min(n, t * step + step)), dirty),
                           range(self.threads)))


# --------------------------------------------------------------------------- #
# allocation settings: one child process each
def tune_threads(cn, threads):
    """cn.tune_threads(threads) (this machine's thread-team thresholds, set
    for the calls timed next), reported on stderr."""
    tuned = cn.tune_threads(threads)
    print(f"tune_threads({threads}): " + ", ".join(f"{k} {v >> 10} KiB" for k, v in tuned.items()),
          file=sys.stderr)
    return tuned


def child_env(setting):
    """os.environ for a child of allocation setting `setting`."""
    if setting not in SETTINGS:
        raise SystemExit(f"unknown allocation setting {setting!r} (choose from {', '.join(SETTINGS)})")
    env = dict(os.environ)
    for k in FAULT_FREE_ENV:
        env.pop(k, None)
    if setting == "faultfree":
        env.update(FAULT_FREE_ENV)
    return env


def run_child(script, setting, args, capture_stderr=True):
    """Run `python script --child *args` under `setting`; return its JSON stdout.

    With capture_stderr the child's stderr is shown only if it fails;
    otherwise it goes straight to ours (progress output).
    """
    cmd = [sys.executable, os.path.abspath(script), "--child", *args]
    out = subprocess.run(cmd, env=child_env(setting), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE if capture_stderr else None, text=True)
    if out.returncode:
        if capture_stderr:
            sys.stderr.write(out.stderr)
        raise SystemExit(f"benchmark child ({setting}) failed")
    return json.loads(out.stdout)


def setting_heading(setting):
    return (f"### ({'a' if setting == 'default' else 'b'}) {setting}"
            + (" — " + " ".join(f"{k}={v}" for k, v in FAULT_FREE_ENV.items()) if setting == "faultfree" else ""))


# --------------------------------------------------------------------------- #
# noise indicator: CPU time used by processes other than our children
def cpu_snapshot():
    """(wall s, busy CPU s of the whole machine incl. steal, CPU s of our finished children)."""
    busy = float("nan")
    try:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:9]]
        busy = (sum(vals) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")   # all but idle and iowait
    except (OSError, ValueError):
        pass
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), busy, ru.ru_utime + ru.ru_stime


def other_cpu_share(before, after):
    """Share of the machine's CPU capacity that other processes (and the
    hypervisor's steal) took between two cpu_snapshot()s; nan if unknown."""
    wall = after[0] - before[0]
    other = (after[1] - before[1]) - (after[2] - before[2])
    return max(other, 0.0) / (wall * (os.cpu_count() or 1)) if wall > 0 else float("nan")
