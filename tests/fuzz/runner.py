"""The fuzz driver: runs cases in worker processes and classifies each outcome.

    python -m tests.fuzz.runner --seed 1 --budget-seconds 60 [--cases N]
                                [--targets PATTERN ...] [--workers 2] [--json out.json]
    python -m tests.fuzz.runner --replay cynorm.layer_norm:1:17
    python -m tests.fuzz.runner --list

A case is (target, seed, index).  Targets run round-robin, index 0, 1, ...
of each, until the time budget is spent or every target has run --cases
cases.  Each case runs in a worker process ('spawn'); a worker that dies
(a signal, an abort) is recorded as a crash and one that takes longer than
--timeout seconds as a hang, and is replaced.

Outcomes:
  ok                 returned, and every output matches the reference
  error              raised TypeError/ValueError naming an argument where an
                     error was expected (MemoryError too, for broadcast views
                     claiming ~2**41 elements: no copy of those can be allocated)
  unnamed            such an error whose message names none of the arguments
  spurious_error     such an error for a valid call
  no_error           returned where the documented error was expected
  wrong_answer       returned outputs that disagree with the reference (or
                     out= arrays not returned as such)
  wrong_class        raised any other exception (IndexError, OverflowError,
                     KeyError, AttributeError, RuntimeError, ...)
  modified_input     changed an input (other than out= and documented
                     in-place running statistics)
  wrote_outside_out  changed memory next to an out= array (guard bytes)
  crash              the worker died;  hang: it ran past the timeout
  fuzzer_error       the fuzzer itself failed (a bug here, not in cynorm)
"""
import argparse
import ctypes
import faulthandler
import json
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import re
import sys
import tempfile
import time
import traceback

import numpy as np

OUTCOMES = ("ok", "error", "unnamed", "spurious_error", "no_error", "wrong_answer", "wrong_class",
            "modified_input", "wrote_outside_out", "crash", "hang", "fuzzer_error")
# what the CI budget asserts to be zero
FAILURES = ("spurious_error", "no_error", "wrong_answer", "wrong_class", "modified_input",
            "wrote_outside_out", "crash", "hang", "fuzzer_error")
PRIORITY = {o: i for i, o in enumerate(("crash", "hang", "fuzzer_error", "wrong_class", "modified_input",
                                         "wrote_outside_out", "wrong_answer", "no_error",
                                         "spurious_error", "unnamed", "error", "ok"))}

DEFAULT_SEED = 20261124
SNAPSHOT_LIMIT = 4_000_000      # elements: bigger (broadcast) arrays are not copied
QUARANTINE = 3                  # a target that crashed or hung this often is not run further


# ---------------------------------------------------------------- arrays in arguments

def _nested_type():
    try:
        from cynorm.nested import NestedArray
        return NestedArray
    except Exception:          # pragma: no cover - cynorm broken: the case errors anyway
        return ()


def arrays_in(obj, path, found, depth=0):
    """(path, ndarray) for every array reachable from obj (tuples, lists,
    dicts, NestedArray buffers)."""
    if depth > 4:
        return found
    if isinstance(obj, np.ndarray):
        found.append((path, obj))
        if isinstance(obj, np.ma.MaskedArray) and isinstance(obj.mask, np.ndarray):
            found.append((path + ".mask", obj.mask))
    elif isinstance(obj, _nested_type()):
        for attr in ("buffer", "sizes", "offsets"):
            arrays_in(getattr(obj, attr), f"{path}.{attr}", found, depth + 1)
    elif isinstance(obj, (tuple, list)) and len(obj) < 64:
        for i, e in enumerate(obj):
            arrays_in(e, f"{path}[{i}]", found, depth + 1)
    elif isinstance(obj, dict) and len(obj) < 64:
        for k, e in obj.items():
            arrays_in(e, f"{path}[{k!r}]", found, depth + 1)
    return found


def snapshot(v, depth=0):
    """A copy of an argument as it was before the call (for the oracle)."""
    if depth > 4:
        return v
    if isinstance(v, np.ma.MaskedArray):
        return v.copy()
    if isinstance(v, np.ndarray):
        if v.size > SNAPSHOT_LIMIT:
            return v
        return np.array(v, copy=True, order="K")
    NA = _nested_type()
    if NA and isinstance(v, NA):
        try:
            return NA(v.buffer.copy(), v.sizes)
        except Exception:
            return v
    if isinstance(v, tuple):
        return tuple(snapshot(e, depth + 1) for e in v)
    if isinstance(v, list):
        return [snapshot(e, depth + 1) for e in v]
    if isinstance(v, dict):
        return {k: snapshot(e, depth + 1) for k, e in v.items()}
    return v


def _bounds(a):
    return np.lib.array_utils.byte_bounds(a)


def footprint(a):
    """The byte addresses of a's elements (sorted int64)."""
    if a.size == 0:
        return np.zeros(0, np.int64)
    base = a.__array_interface__["data"][0]
    offs = np.zeros(1, np.int64)
    for s, st in zip(a.shape, a.strides):
        if s > 1 and st != 0:
            offs = (offs[:, None] + np.arange(s, dtype=np.int64) * st).ravel()
    return np.unique((offs[:, None] + np.arange(a.itemsize)).ravel() + base)


class Watch:
    """The memory of every array argument (and guard buffers), compared
    byte for byte before and after the call."""

    def __init__(self, items, extra):
        self.items = [(p, a) for p, a in items if a.size and a.nbytes]
        spans = sorted([_bounds(a) for _, a in self.items]
                       + [_bounds(a) for a in extra if a.size])
        regions = []
        for lo, hi in spans:
            if regions and lo <= regions[-1][1]:
                regions[-1][1] = max(regions[-1][1], hi)
            else:
                regions.append([lo, hi])
        self.regions = [(lo, hi) for lo, hi in regions if hi - lo <= 1 << 30]
        self.before = [ctypes.string_at(lo, hi - lo) for lo, hi in self.regions]
        self.extra = extra

    def changes(self, writable, outs):
        """Problems: (outcome, text) for bytes changed outside `writable`
        (paths of arrays that may change); `outs`: paths of out= arrays."""
        problems = []
        allowed = None
        for (lo, hi), before in zip(self.regions, self.before):
            after = ctypes.string_at(lo, hi - lo)
            if after == before:
                continue
            changed = np.flatnonzero(np.frombuffer(after, np.uint8) != np.frombuffer(before, np.uint8)) + lo
            if allowed is None:
                fps = [footprint(a) for p, a in self.items if p in writable]
                allowed = np.unique(np.concatenate(fps)) if fps else np.zeros(0, np.int64)
            bad = changed[~np.isin(changed, allowed)]
            if not bad.size:
                continue
            hit = [p for p, a in self.items if p not in writable and np.isin(bad, footprint(a)).any()]
            if hit:
                problems.append(("modified_input", f"modified input {', '.join(sorted(set(hit)))} "
                                                   f"({bad.size} bytes)"))
                continue
            near_out = any(_bounds(a)[0] - 64 <= bad[0] < _bounds(a)[1] + 64
                           for p, a in self.items if p in outs) or any(
                _bounds(a)[0] <= bad[0] < _bounds(a)[1] for a in self.extra)
            if near_out:
                problems.append(("wrote_outside_out", f"wrote {bad.size} bytes outside the out= "
                                                      "array(s) (guard bytes / gaps)"))
            else:
                inside = [p for p, a in self.items if _bounds(a)[0] <= bad[0] < _bounds(a)[1]]
                problems.append(("modified_input", f"wrote {bad.size} bytes into memory between the "
                                                   f"elements of {', '.join(inside) or 'an argument'}"))
        return problems


# ---------------------------------------------------------------- describing calls

def describe(v, full=False):
    """A short (or, full=True, complete) description of an argument value."""
    if isinstance(v, np.ma.MaskedArray):
        return "masked " + describe(v.data, full)
    if isinstance(v, np.ndarray):
        flags = []
        if v.ndim > 1 and v.flags.f_contiguous and not v.flags.c_contiguous:
            flags.append("F")
        elif not (v.flags.c_contiguous or v.flags.f_contiguous):
            flags.append("strides=" + str(v.strides))
        if not v.flags.writeable:
            flags.append("ro")
        if not v.flags.aligned:
            flags.append("unaligned")
        if v.dtype.byteorder not in ("=", "|"):
            flags.append("swapped")
        head = f"{v.dtype}{list(v.shape)}" + (f"[{','.join(flags)}]" if flags else "")
        if full and v.size <= 4096:
            with np.printoptions(precision=17, threshold=4096, linewidth=120):
                return head + "\n    " + repr(np.asarray(v)).replace("\n", "\n    ")
        if full:
            return head + " (large; first values " + repr(np.asarray(v).reshape(-1)[:8].tolist()) + ")"
        return head
    NA = _nested_type()
    if NA and isinstance(v, NA):
        return repr(v) + (("\n    buffer " + describe(v.buffer, True)) if full else "")
    if isinstance(v, tuple) and len(v) < 16:
        return "(" + ", ".join(describe(e, full) for e in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, list) and not full and len(v) > 4:
        return f"list[{len(v)}]"
    if callable(v) and hasattr(v, "__qualname__"):
        return f"{getattr(v, '__module__', '')}.{v.__qualname__}"
    r = repr(v)
    return r if full or len(r) < 60 else r[:57] + "..."


def call_text(case, full=False):
    args = ", ".join(f"{a.name}={describe(a.value, full)}" for a in case.args)
    return f"{case.target}({args})"


def names_an_argument(exc, case):
    msg = str(exc)
    names = [a.name for a in case.args] + ["out", "index"] + list(getattr(case, "extra_names", ()))
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", msg) for n in names)


# ---------------------------------------------------------------- one case

def accepted_error(case, exc):
    if isinstance(exc, (TypeError, ValueError)):
        return True
    if isinstance(exc, MemoryError) and case.huge:
        return True
    extra = getattr(case, "accept", ())
    return bool(extra) and isinstance(exc, extra)


def execute(case):
    """Run one case here; returns (outcome, problems, exception text)."""
    items = []
    for a in case.args:
        arrays_in(a.value, a.name, items)
    out_paths = {p for p, _ in items if p == "out" or p.startswith("out[") or p.startswith("out.")}
    watch = Watch(items, list(case.watch))
    snaps = {a.name: snapshot(a.value) for a in case.args}
    exc = res = None
    try:
        res = case.call()
    except Exception as e:   # noqa: BLE001 - every exception is an outcome
        exc = e
    live = {a.name: a.value for a in case.args}
    writable = set(out_paths)
    if exc is None:
        writable |= {p for p, _ in items if p in case.inplace}
    problems = watch.changes(writable, out_paths)     # (outcome, text)
    try:
        if exc is not None:
            text = f"{type(exc).__name__}: {exc}"
            if not accepted_error(case, exc):
                problems.append(("wrong_class", text))
            elif case.expect == "ok":
                problems.append(("spurious_error", text))
            elif isinstance(exc, (TypeError, ValueError)) and not names_an_argument(exc, case):
                problems.append(("unnamed", text))
            else:
                problems.append(("error", text))
        elif case.expect == "error":
            problems.append(("no_error", "returned " + describe(res) + " where an error was expected"))
        else:
            try:
                from . import oracles
                oracles.F64_EXTREME = oracles.f64_extreme([a for _, a in arrays_in(snaps, "", [])])
                wrong = case.oracle(snaps, res, live) if case.oracle else []
            except Exception:   # noqa: BLE001
                problems.append(("fuzzer_error", "oracle failed: " + traceback.format_exc(limit=6)))
                wrong = []
            problems += [("wrong_answer", w) for w in wrong]
            if wrong and case.out is not None and case.out.value is not None:
                problems.append(("wrong_answer", _without_out(case, snaps)))
            if not problems:
                problems.append(("ok", ""))
    finally:
        if case.after is not None:
            case.after()
    outcome = min((p[0] for p in problems), key=PRIORITY.__getitem__)
    exc_text = None if exc is None else "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return outcome, [t for o, t in problems if o not in ("ok", "error")] or [t for o, t in problems], exc_text


def _without_out(case, snaps):
    """Triage of a wrong answer with out=: the same call on fresh copies
    of the inputs and no out= arrays."""
    saved = [(a, a.value) for a in case.args]
    slots, case.out_slots = case.out_slots, []
    try:
        for a in case.args:
            a.value = None if a is case.out else snapshot(snaps[a.name])
        fresh = {a.name: snapshot(snaps[a.name]) for a in case.args}
        res = case.call()
        wrong = case.oracle(fresh, res, {a.name: a.value for a in case.args})
        return ("(without out= the call is right: the out= arrays"
                + (" / their aliasing" if case.aliased else "") + " cause the error)") if not wrong else \
            "(without out= the call is wrong too)"
    except Exception as e:   # noqa: BLE001
        return f"(without out= the call raises {type(e).__name__}: {e})"
    finally:
        for a, v in saved:
            a.value = v
        case.out_slots = slots


def run_case(target, seed, index):
    """Generate and run (target, seed, index); a result dict."""
    from .cases import TARGETS
    t0 = time.perf_counter()
    rec = {"target": target, "seed": seed, "index": index}
    try:
        case = TARGETS[target].case(seed, index)
    except Exception:   # noqa: BLE001
        rec.update(outcome="fuzzer_error", summary="generator failed: "
                   + traceback.format_exc(limit=4).splitlines()[-1], detail=traceback.format_exc())
        return rec
    try:
        outcome, problems, exc_text = execute(case)
    except Exception:   # noqa: BLE001
        outcome, problems, exc_text = "fuzzer_error", ["runner failed: " + traceback.format_exc(limit=4)], None
    rec.update(outcome=outcome, expect=case.expect, notes=case.notes,
               summary=f"{call_text(case)}: {problems[0] if problems else ''}"[:600],
               problems=problems, elapsed=time.perf_counter() - t0)
    if outcome == "wrong_class" and exc_text:
        rec["detail"] = exc_text[-3000:]
    return rec


# ---------------------------------------------------------------- workers

def _setup_worker(opts):
    os.environ.setdefault("OMP_NUM_THREADS", str(opts.get("threads", 1)))
    limit = opts.get("memory_limit")
    # AddressSanitizer (.ci/sanitize) maps terabytes of shadow address space:
    # no address-space limit there (its allocator_may_return_null=1 turns a
    # too large request into the MemoryError the limit gives elsewhere)
    if limit and "libasan" not in os.environ.get("LD_PRELOAD", ""):
        try:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass
    log = opts.get("log")
    if log:      # stdout and stderr (faulthandler, C-level messages) go to the worker's log
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
    faulthandler.enable(sys.stderr)
    import warnings
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    import cynorm
    cynorm.set_num_threads(opts.get("threads", 1))
    from . import cases  # noqa: F401


def worker_main(conn, opts):
    _setup_worker(opts)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        target, seed, index = msg
        sys.stderr.write(f"\n--- case {target}:{seed}:{index}\n")
        sys.stderr.flush()
        conn.send(run_case(target, seed, index))


class Worker:
    def __init__(self, opts, slot):
        self.opts = dict(opts)
        self.slot = slot
        self.log = os.path.join(opts["logdir"], f"worker{slot}.log")
        self.proc = self.conn = None
        self.task = None
        self.started = 0.0
        self.restarts = -1

    def start(self):
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.opts["log"] = self.log
        self.proc = ctx.Process(target=worker_main, args=(child, self.opts), daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        self.restarts += 1
        if not self.conn.poll(120):
            raise RuntimeError(f"fuzz worker did not start; see {self.log}")
        self.conn.recv()

    def submit(self, task):
        if self.proc is None or not self.proc.is_alive():
            self.start()
        self.task = task
        self.started = time.monotonic()
        self.conn.send(task)

    def log_tail(self, n=2500):
        try:
            with open(self.log, errors="replace") as f:
                text = f.read()
        except OSError:
            return ""
        return text[-n:]

    def kill(self):
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.proc = None

    def stop(self):
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(None)
                self.proc.join(5)
            except (OSError, BrokenPipeError):
                pass
        self.kill()


def _died(worker, outcome, what):
    target, seed, index = worker.task
    tail = worker.log_tail()
    marker = f"--- case {target}:{seed}:{index}"
    tail = tail[tail.rfind(marker):] if marker in tail else tail
    lines = [ln for ln in tail.splitlines()[1:] if ln.strip()]
    return {"target": target, "seed": seed, "index": index, "outcome": outcome,
            "summary": f"{what}; " + (" | ".join(lines[:3])[:400] if lines else "no output"),
            "detail": tail[-3000:]}


# ---------------------------------------------------------------- the driver

def select_targets(patterns=None):
    from .cases import TARGETS
    names = list(TARGETS)
    if patterns:
        names = [n for n in names if any(re.search(p, n) for p in patterns)]
    skipped = {}
    for n in list(names):
        why = TARGETS[n].unavailable()
        if why:
            skipped[n] = why
            names.remove(n)
    return names, skipped


def drive(seed=DEFAULT_SEED, budget=60.0, cases=None, targets=None, workers=1, timeout=20.0,
          threads=1, memory_limit=8 << 30, progress=None):
    """Run the fuzzer; returns the report dict."""
    names, skipped = select_targets(targets)
    logdir = tempfile.mkdtemp(prefix="cynorm-fuzz-")
    opts = {"threads": threads, "memory_limit": memory_limit, "logdir": logdir}
    pool = [Worker(opts, i) for i in range(max(1, workers))]
    counts = {n: {} for n in names}
    failures = []
    fatal = {}
    others = []
    t0 = time.monotonic()
    deadline = t0 + budget

    quarantined = {}

    def tasks():
        i = 0
        while names and (cases is None or i < cases):
            for n in names:
                if n not in quarantined:
                    yield (n, seed, i)
            i += 1
            if len(quarantined) == len(names):
                return
    queue = tasks()
    exhausted = False
    done = 0

    def record(r):
        nonlocal done
        done += 1
        c = counts.setdefault(r["target"], {})
        c[r["outcome"]] = c.get(r["outcome"], 0) + 1
        r["replay"] = f"{r['target']}:{r['seed']}:{r['index']}"
        if r["outcome"] in FAILURES:
            failures.append(r)
        if r["outcome"] in ("crash", "hang"):
            fatal[r["target"]] = fatal.get(r["target"], 0) + 1
            if fatal[r["target"]] >= QUARANTINE:
                quarantined[r["target"]] = f"stopped after {QUARANTINE} crashes/hangs"
        elif r["outcome"] == "unnamed":
            others.append(r)
        if progress and done % 500 == 0:
            progress(f"{done} cases, {time.monotonic() - t0:.0f} s, {len(failures)} failures")

    try:
        while True:
            for w in pool:
                if w.task is None and not exhausted and time.monotonic() < deadline:
                    nxt = next(queue, None)
                    if nxt is None:
                        exhausted = True
                    else:
                        w.submit(nxt)
            busy = [w for w in pool if w.task is not None]
            if not busy:
                break
            now = time.monotonic()
            wait_for = max(0.01, min(w.started + timeout - now for w in busy))
            ready = mpc.wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], wait_for)
            for w in busy:
                if w.conn in ready:
                    try:
                        r = w.conn.recv()
                    except (EOFError, OSError):
                        w.proc.join(2)
                        code = w.proc.exitcode
                        r = _died(w, "crash", f"worker died (exit code {code})")
                        w.kill()
                    record(r)
                    w.task = None
                elif w.proc.sentinel in ready:
                    w.proc.join(2)
                    r = _died(w, "crash", f"worker died (exit code {w.proc.exitcode})")
                    w.kill()
                    record(r)
                    w.task = None
                elif time.monotonic() - w.started > timeout:
                    w.kill()
                    record(_died(w, "hang", f"no result after {timeout:g} s"))
                    w.task = None
    finally:
        for w in pool:
            w.stop()
    if not fatal:            # the workers' logs matter only for crashes and hangs
        import shutil
        shutil.rmtree(logdir, ignore_errors=True)
        logdir = None
    elapsed = time.monotonic() - t0
    totals = {}
    for c in counts.values():
        for o, k in c.items():
            totals[o] = totals.get(o, 0) + k
    return {"seed": seed, "budget_seconds": budget, "cases_per_target": cases, "workers": workers,
            "threads": threads, "timeout": timeout, "elapsed": elapsed, "cases": done,
            "rate": done / elapsed if elapsed else 0.0, "counts": counts, "totals": totals,
            "skipped_targets": skipped, "quarantined": quarantined, "failures": failures, "unnamed": others,
            "restarts": sum(w.restarts for w in pool), "logdir": logdir}


# ---------------------------------------------------------------- reporting

def table(report):
    cols = [o for o in OUTCOMES if report["totals"].get(o)]
    width = max([len(t) for t in report["counts"]] + [6])
    lines = [f"{'target':<{width}} " + " ".join(f"{c:>{max(len(c), 5)}}" for c in cols) + f" {'total':>6}"]
    for t, c in report["counts"].items():
        lines.append(f"{t:<{width}} " + " ".join(f"{c.get(o, 0):>{max(len(o), 5)}}" for o in cols)
                     + f" {sum(c.values()):>6}")
    lines.append(f"{'TOTAL':<{width}} " + " ".join(f"{report['totals'].get(o, 0):>{max(len(o), 5)}}"
                                                  for o in cols) + f" {report['cases']:>6}")
    return "\n".join(lines)


def failure_lines(report, limit=60, include_unnamed=False):
    rows = report["failures"] + (report["unnamed"] if include_unnamed else [])
    rows = sorted(rows, key=lambda r: (PRIORITY[r["outcome"]], r["target"], r["index"]))
    out = [f"{r['outcome']:<17} {r['replay']}  {r['summary']}" for r in rows[:limit]]
    if len(rows) > limit:
        out.append(f"... and {len(rows) - limit} more")
    return out


def summary(report, include_unnamed=True):
    head = (f"seed {report['seed']}: {report['cases']} cases in {report['elapsed']:.1f} s "
            f"({report['rate']:.0f}/s, {report['workers']} worker(s), {report['threads']} thread(s)); "
            f"{len(report['failures'])} failures, {len(report['unnamed'])} unnamed errors")
    parts = [head, table(report)]
    if report["skipped_targets"]:
        parts.append("skipped: " + "; ".join(f"{t} ({why})" for t, why in report["skipped_targets"].items()))
    if report.get("quarantined"):
        parts.append("quarantined: " + "; ".join(f"{t} ({why})" for t, why in report["quarantined"].items()))
    lines = failure_lines(report, include_unnamed=include_unnamed)
    if lines:
        parts.append("replay with: python -m tests.fuzz.runner --replay TARGET:SEED:INDEX")
        parts += lines
    return "\n".join(parts)


def replay(spec):
    from .cases import TARGETS
    target, seed, index = spec.rsplit(":", 2)
    faulthandler.enable()
    import cynorm  # noqa: F401
    case = TARGETS[target].case(int(seed), int(index))
    print(f"case {spec}  (expect: {case.expect}; {'; '.join(case.notes) or 'no mutation'})")
    print(call_text(case, full=True).replace(", ", ",\n  ", 0))
    for a in case.args:
        print(f"  {a.name} = {describe(a.value, full=True)}")
    sys.stdout.flush()
    outcome, problems, exc_text = execute(case)
    print(f"outcome: {outcome}")
    for p in problems:
        print("  " + p)
    if exc_text and outcome not in ("error",):
        print(exc_text)
    return outcome


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz.runner", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("CYNORM_FUZZ_SEED", DEFAULT_SEED)))
    ap.add_argument("--budget-seconds", type=float, default=60.0)
    ap.add_argument("--cases", type=int, default=None, help="at most this many cases per target")
    ap.add_argument("--targets", nargs="*", default=None, help="regular expressions on target names")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="cynorm threads in each worker")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per case before it is a hang")
    ap.add_argument("--json", default=None, help="write the report here")
    ap.add_argument("--replay", default=None, metavar="TARGET:SEED:INDEX")
    ap.add_argument("--list", action="store_true", help="list the targets and exit")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.list:
        names, skipped = select_targets(args.targets)
        print("\n".join(names))
        for t, why in skipped.items():
            print(f"{t}  (skipped: {why})")
        return 0
    if args.replay:
        outcome = replay(args.replay)
        return 0 if outcome not in FAILURES else 1
    report = drive(seed=args.seed, budget=args.budget_seconds, cases=args.cases, targets=args.targets,
                   workers=args.workers, timeout=args.timeout, threads=args.threads,
                   progress=None if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True)))
    print(summary(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
