"""Stress tests:

* leaks: every public op family, its out= variants and its error paths,
  called thousands of times on small inputs (10**4 in the slow sweep), with
  bounds on the growth of tracemalloc's traced memory, pymalloc's block
  count, the C heap and the process's RSS; and outputs of >= 1 MiB through
  the block cache of cynorm._kernels._alloc at its default limit, a tiny
  one, and off;
* 8 Python threads calling the ops at once on shared read-only inputs, each
  with its own OpenMP thread count, every result bitwise equal to a
  single-threaded call;
* OpenMP thread counts 1, 2, 3, 4 give the same bits for every op family,
  with the thread team woken for every call (the families' serial
  thresholds, cynorm/_kernels/entry.pxd, set aside) on sizes that do not
  divide evenly,
  also with streaming stores forced on;
* layer_norm and batch_norm calls past 2**31 elements (slow; they need
  ~9 GiB of free memory and skip without it).

The thread-count tests of test_weight_norm.py, test_layer_norm.py,
test_batch_norm.py and test_jvp.py run their op at 1-3 threads (weight norm
1-4); the ones here add 4 threads everywhere and cover what those do not:
out= variants, batch_norm_elemt, batch_norm_gather_stats, the nested kernels
(segmented softmax, GELU, SiLU), every JVP rule with a kernel, and streaming
stores at every thread count.
"""
import os
import tempfile
import threading
import time

try:
    import fcntl
except ImportError:          # not POSIX: the tests past 2**31 take no lock
    fcntl = None

import numpy as np
import pytest

import cynorm
import cynorm.nested as nt
from conftest import DTYPE_IDS, DTYPES
from helpers import BF16, F16, F32, OPENMP_BUILD, bits, g_dtype, is16
import stress_helpers as sh
from stress_helpers import KiB, MiB


# ======================================================================
# leaks
# ======================================================================

# Per-call rates a settled window may grow by (see check_growth).  A leak of
# one output per call costs at least 1 KiB of data (every leak case's main
# output is >= 1 KiB, see stress_helpers.leak_cases) and one pymalloc block
# (its ndarray object).  Deliberate leaks around norm_except_dim (1 KiB
# output), measured with these exact settings (fast: 2000 untraced calls,
# slow: 10**4 traced), per settled window (400 / 2000 calls):
#   output kept in a list:  blocks +804 / +4004, C heap +441 KiB / +2.9-3.5 MiB,
#                           RSS +896 KiB / +3.3-3.9 MiB, traced - / +2.4 MiB
#   Py_IncRef(output):      the same to within 10%
#   malloc(1024) a call:    C heap +406 KiB / +2.0 MiB, RSS +408 KiB / +2.0 MiB
#   malloc(8) a call:       C heap +12.5 KiB / +65 KiB (RSS: nothing)
#   one float a call:       blocks +403 / +2004, traced - / +62 KiB
# each failing check_growth; without a leak it passes (figures in the
# docstrings of test_no_leak and test_no_leak_10k_calls_traced).
BLOCKS_PER_CALL = 0.25          # a leaked Python object of any size: >= 1 per call
C_HEAP_PER_CALL = 16            # bytes; the smallest malloc chunk is 32 bytes
TRACED_PER_CALL = 8             # bytes; the smallest Python object is 16 bytes
# Totals over the settled windows: they bound what the one exception a
# window may take (a one-time allocation) can be, and RSS, which is counted
# in pages and only checked here.  Measured one-time events: NumPy's
# ndarray.__array_interface__ (which cynorm's out= checks read) allocates
# 532 KiB of C heap (939 KiB traced) once, some thousand calls in,
# reproducible with NumPy alone; a pool in nested layer_norm_backward fills
# with ~480 pymalloc blocks over its first ~10**4 calls, then stays flat.
SETTLED_TOTAL = {"blocks": 2000, "c_heap": 1 * MiB, "traced": 2 * MiB}
# RSS (anonymous pages), like the other probes, may take one jump in one
# settled window: a one-time event outside the calls' allocations (seen: a
# whole suite's run grew 5.2 MiB in the last window of one case, C heap and
# blocks flat).  The other settled windows together get the total bound.
RSS_TOTAL_FAST = 1 * MiB        # 3 windows, 1200 calls: a leaked 1 KiB output measured 1.4 MiB
RSS_TOTAL_SLOW = 2 * MiB        # 3 windows, 6000 calls: the same leak measured 8.4 MiB
RSS_ONE_TIME = 32 * MiB         # the jump one window may take

FAST_CALLS, SLOW_CALLS, WINDOWS = 2000, 10 ** 4, 5


def check_growth(g, rss_total, what=""):
    """The bounds, for a Growth of WINDOWS windows of g.window_calls calls.

    The first window is not checked: it settles (pools of recently freed
    blocks refill there).  Of the settled windows, at most one may grow a
    probe beyond RATE * window calls (a one-time allocation lands in one
    window; a leak grows every window), and their total must stay under
    SETTLED_TOTAL.  RSS, page-granular, gets no per-window rate: one
    settled window may jump by up to RSS_ONE_TIME, the others together by
    up to rss_total."""
    assert g.calls == WINDOWS * g.window_calls, f"{what}: stopped early, RSS ran away: {g}"
    rates = {"blocks": BLOCKS_PER_CALL, "c_heap": C_HEAP_PER_CALL, "traced": TRACED_PER_CALL}
    for probe, rate in rates.items():
        if g.settled(probe) is None:
            continue
        bound = rate * g.window_calls
        assert g.worst_but_one(probe) <= bound, (
            f"{what}: {probe} grew by more than {bound:g} in two or more windows "
            f"of {g.window_calls} calls: {g}")
        assert g.settled_total(probe) <= SETTLED_TOTAL[probe], (
            f"{what}: {probe} grew by {g.settled_total(probe)} in all: {g}")
    if g.settled("rss") is not None:
        jump = max(g.settled("rss"))
        assert jump <= RSS_ONE_TIME, (
            f"{what}: RSS grew by {jump / MiB:.2f} MiB in one window "
            f"(bound {RSS_ONE_TIME / MiB:g} MiB): {g}")
        rest = g.settled_total("rss") - jump
        assert rest <= rss_total, (
            f"{what}: RSS grew by {rest / MiB:.2f} MiB over the settled windows but "
            f"the largest (bound {rss_total / MiB:g} MiB): {g}")


_CASES = None
BUILD_FAILED = "<the cases could not be built>"


def leak_case(name):
    global _CASES
    if _CASES is None:
        _CASES = sh.leak_cases()
    return _CASES[name]


def _names(build):
    """The case names (building the cases calls the ops: if that fails, one
    test that fails with the error, instead of a collection error that
    would take every other test of this module with it)."""
    try:
        return list(build())
    except Exception:  # noqa: BLE001 - raised again by the test itself
        return [BUILD_FAILED]


LEAK_NAMES = _names(sh.leak_cases)


@pytest.mark.parametrize("name", LEAK_NAMES)
def test_no_leak(name):
    """Always-on leak check: 300 warm-up calls, then 2000 calls in 5
    windows of 400, probes read after gc.collect() at each window's end,
    without tracemalloc (it makes these calls ~5x slower; the slow sweep
    below runs 10**4 traced calls of every case).

    Bounds (check_growth), per settled window of 400 calls: pymalloc blocks
    <= 100 (a leaked object per call: >= 400), C heap <= 6.4 KiB (a leaked
    1 KiB output per call: >= 400 KiB; a leaked malloc(1) per call: 12.8 KiB),
    and RSS <= 1 MiB over the settled windows but the largest, 1200 calls (a
    leaked 1 KiB output per call: 1.4 MiB, measured), the largest <= 32 MiB.  Measured over all cases without a leak: blocks
    <= 31 in all settled windows but one (64 at most: nested
    layer_norm_backward's pool filling), C heap <= 80 bytes a window, RSS
    <= 8 KiB in all (532 KiB in a run where NumPy's one-time allocation
    fell in a measured window)."""
    g = sh.measure(leak_case(name), FAST_CALLS, windows=WINDOWS, traced=False, warm=300)
    check_growth(g, RSS_TOTAL_FAST, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", LEAK_NAMES)
def test_no_leak_10k_calls_traced(name):
    """The full sweep: 300 traced warm-up calls, then 10**4 calls under
    tracemalloc in 5 windows of 2000.

    Bounds per settled window of 2000 calls: traced memory <= 16 KiB
    (8 B/call; a leaked output per call: >= 2.2 MiB), pymalloc blocks <= 500,
    C heap <= 32 KiB; settled totals: traced <= 2 MiB, C heap <= 1 MiB,
    RSS <= 2 MiB over the settled windows but the largest, 6000 calls (a
    leaked 1 KiB output per call: 8.4 MiB, measured), the largest <= 32 MiB.  Measured over all cases without a leak,
    in all settled windows but one (and at most): traced <= 1.1 KiB (2.2),
    blocks <= 14 (33), C heap <= 4.0 KiB (5.3: tracemalloc's own tables),
    RSS <= 32 KiB in all (NumPy's one-time allocation: 939 KiB traced,
    532 KiB C heap and RSS, when it falls in a measured window)."""
    g = sh.measure(leak_case(name), SLOW_CALLS, windows=WINDOWS, traced=True, warm=300)
    check_growth(g, RSS_TOTAL_SLOW, name)


@pytest.fixture
def alloc_cache():
    info = cynorm.alloc_cache_info()
    yield
    cynorm.set_alloc_cache_limit(info["limit"])
    cynorm.clear_alloc_cache()


CACHE_NAMES = _names(sh.cache_cases)
CACHE_LIMITS = {"default": None, "1.5MiB": 3 * MiB // 2, "off": 0}


@pytest.mark.parametrize("limit", list(CACHE_LIMITS), ids=list(CACHE_LIMITS))
@pytest.mark.parametrize("name", CACHE_NAMES)
def test_no_leak_through_the_block_cache(name, limit, alloc_cache, restore_threads):
    """Outputs of >= 1 MiB come from cynorm's block cache (cn_alloc.h):
    taken from a slot, freed into one, or (slots full, over the limit, cache
    off) malloc'd and freed for real.  500 calls (20 warm-up) in 5 windows;
    the cache is emptied before each reading, so the C heap counts only
    blocks nobody holds.  Bounds as in test_no_leak (per settled window of
    100 calls: C heap <= 1.6 KiB, blocks <= 25; RSS over 300 calls <= 4 MiB,
    glibc may keep freed 1 MiB chunks mapped): one leaked block per call
    would be >= 100 MiB a window.  Also: the cache never holds more than its
    limit or its slots; at the default limit the single-size cases are
    served from it (hits >= 90% of calls; measured 99%) and so is most of
    the round robin (measured 80%), at 1.5 MiB most of the round robin is
    not (measured 89% misses: its blocks are freed for real); off, it is
    never asked.  At 1 OpenMP thread: the leak
    is about allocation, and on a loaded machine every 2-thread team can
    wait a scheduler tick for its second thread."""
    cynorm.set_num_threads(1)
    if CACHE_LIMITS[limit] is not None:
        cynorm.set_alloc_cache_limit(CACHE_LIMITS[limit])
    cynorm.clear_alloc_cache()
    call = sh.cache_cases()[name]
    info0 = cynorm.alloc_cache_info()
    most = {"held": 0, "blocks": 0}

    def watched():
        call()
        info = cynorm.alloc_cache_info()
        for k in most:
            most[k] = max(most[k], info[k])
    g = sh.measure(watched, 500, windows=WINDOWS, traced=False, warm=20,
                   settle=cynorm.clear_alloc_cache)
    check_growth(g, 4 * MiB, f"{name} cache {limit}")
    info = cynorm.alloc_cache_info()
    assert most["held"] <= info["limit"] and most["blocks"] <= info["slots"], (most, info)
    hits, misses = info["hits"] - info0["hits"], info["misses"] - info0["misses"]
    if limit == "off":
        assert hits == misses == 0, info
    elif limit == "default" and name in sh.SINGLE_SIZE_CACHE_CASES:
        assert hits >= 0.9 * 520, info
    elif name == sh.ROUND_ROBIN_CACHE_CASE:
        if limit == "default":                          # 8 slots for 9 free sizes
            assert hits >= 0.5 * 520, info
        else:                                           # room for one block
            assert misses >= 0.5 * 520, info


# ======================================================================
# 8 Python threads on shared inputs
# ======================================================================

def _read_only(*arrays):
    for a in arrays:
        a.setflags(write=False)
    return arrays


def _thread_ops(rng):
    """(name, fn(ctx) -> list of arrays) on shared read-only inputs of
    ~265k elements (over the families' thresholds: every kernel runs an OpenMP team;
    1 MiB float32 outputs: the block cache is shared too).  ctx holds the
    calling thread's own outputs and running statistics."""
    r = lambda *s: rng.standard_normal(s).astype(F32)
    v, gw = _read_only(r(257, 1031), r(257, 1031))
    g = _read_only((rng.random(257) + 0.5).astype(F32))[0]
    g1 = _read_only((rng.random(1031) + 0.5).astype(F32))[0]
    _, norm = cynorm.weight_norm_interface(v, g, 0)
    x, dy = _read_only(r(257, 1031), r(257, 1031))
    w, b = _read_only((rng.random(1031) + 0.5).astype(F32), r(1031))
    _, mean, rstd = cynorm.layer_norm(x, 1031, w, b)
    xb16 = _read_only(r(257, 1031).astype(BF16))[0]
    xn, dyn = _read_only(r(6, 37, 1031), r(6, 37, 1031))
    xcl = _read_only(np.ascontiguousarray(np.moveaxis(r(6, 37, 1031), 1, -1)))[0]
    C = 37
    bw, bb = _read_only((rng.random(C) + 0.5).astype(F32), r(C))
    rm0, rv0 = _read_only(r(C) * 0.1, (rng.random(C) + 0.5).astype(F32))
    _, sm, si = cynorm.batch_norm(xn, bw, bb, training=True)
    sdy, sdx, _, _ = cynorm.batch_norm_backward_reduce(dyn, xn, sm, si, bw)
    n_per = np.array([xn.size // C])
    nx = nt.nested_array([r(k, 1031) for k in (17, 3, 250)])
    ng = nt.nested_array([r(k, 1031) for k in (17, 3, 250)])
    for a in (nx.buffer, ng.buffer):
        a.setflags(write=False)
    tdy, tx, tw = _read_only(r(257, 1031), r(257, 1031), r(1031))
    derived = _read_only(norm, mean, rstd, sm, si, sdy, sdx, n_per)

    def bn_train(ctx):
        rm, rv = rm0.copy(), rv0.copy()
        return [*cynorm.batch_norm(xn, bw, bb, rm, rv, True), rm, rv]

    def bn_train_out(ctx):
        rm, rv = rm0.copy(), rv0.copy()
        y, m, s = ctx["bn_out"]
        cynorm.batch_norm(xn, bw, bb, rm, rv, True, out=(y, m, s))
        return [y, m, s, rm, rv]

    def wn_out(ctx):
        o_w, o_n = ctx["wn_out"]
        cynorm.weight_norm_interface(v, g, 0, out=(o_w, o_n))
        return [o_w, o_n]

    def wnb_out(ctx):
        o_gv, o_gg = ctx["wnb_out"]
        cynorm.weight_norm_backward(gw, v, g, norm, 0, out=(o_gv, o_gg))
        return [o_gv, o_gg]

    def ln_out(ctx):
        y, m, s = ctx["ln_out"]
        cynorm.layer_norm(x, 1031, w, b, out=(y, m, s))
        return [y, m, s]

    def elemt_out(ctx):
        cynorm.batch_norm_elemt(xn, bw, bb, sm, si, out=ctx["elemt_out"])
        return [ctx["elemt_out"]]

    def belemt_out(ctx):
        cynorm.batch_norm_backward_elemt(dyn, xn, sm, si, bw, sdy, sdx, n_per, out=ctx["belemt_out"])
        return [ctx["belemt_out"]]

    def outs():
        return {"bn_out": (np.empty_like(xn), np.empty(C, F32), np.empty(C, F32)),
                "wn_out": (np.empty_like(v), np.empty(257, F32)),
                "wnb_out": (np.empty_like(v), np.empty_like(g)),
                "ln_out": (np.empty_like(x), np.empty((257, 1), F32), np.empty((257, 1), F32)),
                "elemt_out": np.empty_like(xn), "belemt_out": np.empty_like(xn)}

    ops = [
        ("weight_norm_interface dim 0", lambda c: list(cynorm.weight_norm_interface(v, g, 0))),
        ("weight_norm dim 1", lambda c: [cynorm.weight_norm(v, g1, 1)]),
        ("weight_norm_backward", lambda c: list(cynorm.weight_norm_backward(gw, v, g, norm, 0))),
        ("norm_except_dim p=3", lambda c: [cynorm.norm_except_dim(v, 3, 1)]),
        ("layer_norm", lambda c: list(cynorm.layer_norm(x, 1031, w, b))),
        ("layer_norm bfloat16", lambda c: list(cynorm.layer_norm(xb16, 1031, w, b))),
        ("layer_norm_backward", lambda c: list(cynorm.layer_norm_backward(dy, x, 1031, mean, rstd, w, b))),
        ("batch_norm train", bn_train),
        ("batch_norm inference", lambda c: list(cynorm.batch_norm(xn, bw, bb, rm0, rv0, False))[:1]),
        ("batch_norm channels-last", lambda c: list(cynorm.batch_norm(xcl, bw, bb, None, None, True, axis=-1))),
        ("batch_norm_backward", lambda c: list(cynorm.batch_norm_backward(dyn, xn, bw, None, None, sm, si, True))),
        ("batch_norm_stats", lambda c: list(cynorm.batch_norm_stats(xn))),
        ("batch_norm_backward_reduce", lambda c: list(cynorm.batch_norm_backward_reduce(dyn, xn, sm, si, bw))),
        ("batch_norm_elemt", lambda c: [cynorm.batch_norm_elemt(xn, bw, bb, sm, si)]),
        ("batch_norm_backward_elemt", lambda c: [cynorm.batch_norm_backward_elemt(
            dyn, xn, sm, si, bw, sdy, sdx, n_per)]),
        ("nested layer_norm", lambda c: [a.buffer if hasattr(a, "buffer") else a
                                         for a in nt.layer_norm(nx, (1031,), w, b)]),
        ("nested softmax", lambda c: [nt.softmax(nx, 2).buffer]),
        ("nested softmax_backward", lambda c: [nt.softmax_backward(ng, nx, 2).buffer]),
        ("nested gelu", lambda c: [nt.gelu(nx).buffer]),
        ("nested silu_backward", lambda c: [nt.silu_backward(ng, nx).buffer]),
        ("jvp layer_norm_backward", lambda c: [a for part in cynorm.jvp(
            cynorm.layer_norm_backward, (dy, x, (1031,), mean, rstd, w, b),
            (tdy, tx, None, None, None, tw, None)) for a in part]),
        ("softmax", lambda c: [cynorm.softmax(x, 1)]),
        ("out= batch_norm train", bn_train_out),
        ("out= weight_norm_interface", wn_out),
        ("out= weight_norm_backward", wnb_out),
        ("out= layer_norm", ln_out),
        ("out= batch_norm_elemt", elemt_out),
        ("out= batch_norm_backward_elemt", belemt_out),
    ]
    shared = [v, gw, g, g1, x, dy, w, b, xb16, xn, dyn, xcl, bw, bb, rm0, rv0,
              nx.buffer, ng.buffer, tdy, tx, tw, *derived]
    return ops, outs, shared


def test_eight_python_threads_share_inputs(rng, restore_threads, team_always):
    """8 Python threads, each with its own OpenMP thread count (1-4; the
    count belongs to the calling thread), run every op 3 times in a
    thread-dependent order, started together at a barrier.  The kernels
    release the GIL, so OpenMP teams of different threads run at once and
    the block cache serves them all.  Every result must be bitwise equal to
    the same call made alone at 1 thread; the shared inputs, read-only, must
    come out unchanged; out= outputs are per thread."""
    ops, outs, shared = _thread_ops(rng)
    before = [a.tobytes() for a in shared]
    cynorm.set_num_threads(1)
    ref_ctx = outs()
    want = {name: [bits(a).copy() for a in fn(ref_ctx)] for name, fn in ops}
    n_threads, rounds = 8, 3
    barrier = threading.Barrier(n_threads)
    failures, counts, calls = [], [None] * n_threads, [0] * n_threads

    def worker(i):
        try:
            cynorm.set_num_threads(1 + i % 4)
            counts[i] = cynorm.get_num_threads()
            ctx = outs()
            order = ops[i * 5 % len(ops):] + ops[:i * 5 % len(ops)]
            if i % 2:
                order = order[::-1]
            barrier.wait()
            for _ in range(rounds):
                for name, fn in order:
                    got = fn(ctx)
                    calls[i] += 1
                    if len(got) != len(want[name]) or any(
                            not np.array_equal(bits(a), w_) for a, w_ in zip(got, want[name])):
                        failures.append((i, name))
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append((i, repr(e)))
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), f"threads hung (deadlock?): {calls}"
    assert not failures, failures[:10]
    # each worker set its own count (a serial build runs one thread whatever is asked)
    assert counts == [1 + i % 4 if OPENMP_BUILD else 1 for i in range(n_threads)]
    assert calls == [rounds * len(ops)] * n_threads
    assert [a.tobytes() for a in shared] == before, "a shared input was written"
    assert cynorm.get_num_threads() == 1     # the workers' settings stayed theirs


# ======================================================================
# OpenMP thread counts 1-4: bitwise identical
# ======================================================================

def _mk(rng, shape, dtype, order="C", offset=0.0):
    a = (rng.standard_normal(shape) + offset).astype(dtype)
    return np.asfortranarray(a) if order == "F" else a


def _param(rng, n, dtype, lo=0.5):
    return (rng.random(n) + lo).astype(g_dtype(dtype))


def wn_case(shape, dim, order="C"):
    def run(rng, dtype):
        v, gw = _mk(rng, shape, dtype, order), _mk(rng, shape, dtype, order)
        gshape = (1,) * len(shape) if dim is None else tuple(
            s if i == dim else 1 for i, s in enumerate(shape))
        g = (rng.random(gshape) + 0.5).astype(g_dtype(dtype))

        def calls():
            w, n = cynorm.weight_norm_interface(v, g, dim)
            gv, gg = cynorm.weight_norm_backward(gw, v, g, n, dim)
            o = (np.empty(shape, dtype, order=order), np.empty_like(n))
            cynorm.weight_norm_interface(v, g, dim, out=o)
            ob = (np.empty(shape, dtype), np.empty_like(g))
            cynorm.weight_norm_backward(gw, v, g, n, dim, out=ob)
            vin = v.copy(order="K")
            cynorm.weight_norm(vin, g, dim, out=vin)
            return [w, n, gv, gg, *o, *ob, vin, cynorm.weight_norm(v, g, dim),
                    cynorm.norm_except_dim(v, 2, dim), cynorm.norm_except_dim(v, 3, dim),
                    cynorm.norm_except_dim(v, np.inf, dim)]
        return calls
    return run


def ln_case(shape, k, order="C", offset=0.0):
    def run(rng, dtype):
        x, dy = _mk(rng, shape, dtype, order, offset), _mk(rng, shape, dtype, order)
        ns = shape[len(shape) - k:]
        pd = g_dtype(dtype)
        w, b = (rng.random(ns) + 0.5).astype(pd), rng.standard_normal(ns).astype(pd)

        def calls():
            y, mean, rstd = cynorm.layer_norm(x, ns, w, b)
            y0 = cynorm.layer_norm(x, ns)[0]
            o = (np.empty(shape, dtype), np.empty_like(mean), np.empty_like(rstd))
            cynorm.layer_norm(x, ns, w, b, out=o)
            g = cynorm.layer_norm_backward(dy, x, ns, mean, rstd, w, b)
            g0 = cynorm.layer_norm_backward(dy, x, ns, mean, rstd)
            gm = cynorm.layer_norm_backward(dy, x, ns, mean, rstd, w, b, (False, True, True))
            return [y, mean, rstd, y0, *o, *g, *g0, *gm[1:]]
        return calls
    return run


def bn_case(shape, axis=1, order="C"):
    def run(rng, dtype):
        x, dy = _mk(rng, shape, dtype, order, 0.5), _mk(rng, shape, dtype, order)
        C = shape[axis]
        w, b = _param(rng, C, dtype), _param(rng, C, dtype, -0.5)
        rm0, rv0 = _param(rng, C, dtype, -0.5), _param(rng, C, dtype)

        def calls():
            rm, rv = rm0.copy(), rv0.copy()
            y, sm, si = cynorm.batch_norm(x, w, b, rm, rv, True, axis=axis)
            o = (np.empty(shape, dtype, order=order), np.empty_like(sm), np.empty_like(si))
            rm2, rv2 = rm0.copy(), rv0.copy()
            cynorm.batch_norm(x, w, b, rm2, rv2, True, axis=axis, out=o)
            ye = cynorm.batch_norm(x, w, b, rm0, rv0, False, axis=axis)[0]
            g = cynorm.batch_norm_backward(dy, x, w, None, None, sm, si, True, axis=axis)
            ge = cynorm.batch_norm_backward(dy, x, w, rm0, rv0, None, None, False, axis=axis)
            ms, ist = cynorm.batch_norm_stats(x, axis=axis)
            half = x.shape[0] // 2
            ms2, ist2 = cynorm.batch_norm_stats(x[half:], axis=axis)
            rm3, rv3 = rm0.copy(), rv0.copy()
            ga = cynorm.batch_norm_gather_stats(np.stack([ms, ms2]), np.stack([ist, ist2]),
                                                [x.size // C, x[half:].size // C], rm3, rv3)
            el = cynorm.batch_norm_elemt(x, w, b, ms, ist, axis=axis)
            oel = np.empty(shape, dtype, order=order)
            cynorm.batch_norm_elemt(x, w, b, ms, ist, axis=axis, out=oel)
            red = cynorm.batch_norm_backward_reduce(dy, x, ms, ist, w, axis=axis)
            cnt = np.array([x.size // C])
            gxe = cynorm.batch_norm_backward_elemt(dy, x, ms, ist, w, red[0], red[1], cnt, axis=axis)
            ogx = np.empty(shape, dtype, order=order)
            cynorm.batch_norm_backward_elemt(dy, x, ms, ist, w, red[0], red[1], cnt, axis=axis,
                                             out=ogx)
            return [y, sm, si, rm, rv, *o, rm2, rv2, ye, *g, *ge, ms, ist, *ga, rm3, rv3,
                    el, oel, *red, gxe, ogx]
        return calls
    return run


def nested_case(rows, feat):
    def run(rng, dtype):
        x = nt.nested_array([_mk(rng, (n, feat), dtype) for n in rows])
        g = nt.nested_array([_mk(rng, (n, feat), dtype) for n in rows])
        pd = g_dtype(dtype)
        w, b = (rng.random(feat) + 0.5).astype(pd), rng.standard_normal(feat).astype(pd)
        W = rng.standard_normal((5, feat)).astype(dtype)

        def calls():
            y, mean, rstd = nt.layer_norm(x, (feat,), w, b)
            gb = nt.layer_norm_backward(g, x, (feat,), mean, rstd, w, b)
            s = nt.softmax(x, 2)
            return [y.buffer, mean, rstd, gb[0].buffer, gb[1], gb[2], s.buffer,
                    nt.softmax_backward(g, s, 2).buffer, nt.gelu(x).buffer,
                    nt.gelu(x, "tanh").buffer, nt.gelu_backward(g, x).buffer,
                    nt.gelu_backward(g, x, "tanh").buffer, nt.silu(x).buffer,
                    nt.silu_backward(g, x).buffer, nt.linear(x, W).buffer]
        return calls
    return run


def jvp_case(shape):
    def run(rng, dtype):
        if is16(dtype):
            pytest.skip("the JVP kernels take float32/float64 primals")
        r = lambda *s: rng.standard_normal(s).astype(dtype)
        M, N = shape
        x, dy, tx, tdy = r(M, N), r(M, N), r(M, N), r(M, N)
        w, b, tw = rng.random(N).astype(dtype) + 0.5, r(N), r(N)
        _, mean, rstd = cynorm.layer_norm(x, N, w, b)
        xb = r(6, 37, 307)
        C = 37
        bw, bb = rng.random(C).astype(dtype) + 0.5, r(C)
        _, sm, si = cynorm.batch_norm(xb, bw, bb, training=True)
        dyb, txb, tdyb = r(*xb.shape), r(*xb.shape), r(*xb.shape)
        g = rng.random((M, 1)).astype(dtype) + 0.5
        _, norm = cynorm.weight_norm_interface(x, g, 0)

        def calls():
            out = []
            for res in (
                cynorm.jvp(cynorm.layer_norm_backward, (dy, x, (N,), mean, rstd, w, b),
                           (tdy, tx, None, None, None, tw, None)),
                cynorm.jvp(cynorm.layer_norm, (x, (N,), w, b), (tx, None, tw, None)),
                cynorm.jvp(cynorm.batch_norm, (xb, bw, bb), (txb, None, None), training=True),
                cynorm.jvp(cynorm.batch_norm_backward, (dyb, xb, bw, None, None, sm, si, True),
                           (tdyb, txb, None, None, None, None, None, None)),
                cynorm.jvp(cynorm.weight_norm_interface, (x, g, 0), (tx, None, None)),
                cynorm.jvp(cynorm.weight_norm_backward, (dy, x, g, norm, 0),
                           (tdy, tx, None, None, None)),
            ):
                for part in res:
                    out.extend(a for a in part if a is not None)
            return out
        return calls
    return run


def numpy_ops_case():
    """The ops that run on NumPy (no cynorm threads): one call each, so
    that every op family is in the sweep."""
    def run(rng, dtype):
        if dtype != F32:
            pytest.skip("NumPy-backed ops: float32 is enough")
        s, gs = rng.standard_normal((257, 1031)).astype(F32), rng.standard_normal((257, 1031)).astype(F32)
        t = rng.integers(0, 1031, 257)
        lp2 = cynorm.log_softmax(rng.standard_normal((2, 7, 67, 131)).astype(F32), 1)
        t2 = rng.integers(0, 7, (2, 67, 131))

        def calls():
            y, ly = cynorm.softmax(s, 1), cynorm.log_softmax(s, 1)
            o, tw = cynorm.nll_loss_forward(ly, t, None, "none")
            o2, tw2 = cynorm.nll_loss2d_forward(lp2, t2, None, "mean")
            return [y, ly, cynorm.softmax_backward_data(gs, y, 1, F32),
                    cynorm.log_softmax_backward_data(gs, ly, 1, F32), o, tw,
                    cynorm.nll_loss_backward(o, ly, t, None, "none", -100, tw), o2, tw2,
                    cynorm.nll_loss2d_backward(np.float32(1), lp2, t2, None, "mean", -100, tw2),
                    cynorm.trace(s), *cynorm.log_sigmoid_forward(s)]
        return calls
    return run


# shapes: none a multiple of the thread counts (the tests wake the team for every call)
THREAD_CASES = {
    # weight norm: fused rows (A == 1, D >= 8), plain rows, columns (B < 128),
    # A > 1, one norm over all, F order (read transposed), rows past ROW_CHUNK
    "wn rows fused (301, 1031) dim 0": wn_case((301, 1031), 0),
    "wn rows (3, 100003) dim 0": wn_case((3, 100003), 0),
    "wn columns (1031, 301) dim 1": wn_case((1031, 301), 1),
    "wn (7, 67, 257) dim 1": wn_case((7, 67, 257), 1),
    "wn (3, 50021) dim None": wn_case((3, 50021), None),
    "wn F-order (1031, 301) dim 0": wn_case((1031, 301), 0, "F"),
    # layer norm: long rows, rows past ROW_CHUNK (32768), short rows (16 row
    # blocks in the backward's column sums), two normalized axes, F order
    "ln (257, 1031)": ln_case((257, 1031), 1),
    "ln (3, 100003)": ln_case((3, 100003), 1, offset=100.0),
    "ln (4099, 33)": ln_case((4099, 33), 1),
    "ln (37, 29, 71) over 2 axes": ln_case((37, 29, 71), 2),
    "ln F-order (1031, 67)": ln_case((1031, 67), 1, "F"),
    # batch norm: fused per-channel path (C >= 16; rows of 128+ elements
    # under 1 KiB too, in a small input), rows (C < 16), channels last and
    # 2-D (columns), short rows (segments), rows past ROW_CHUNK, F order
    "bn fused (6, 37, 1031)": bn_case((6, 37, 1031)),
    "bn fused short rows (9, 67, 129)": bn_case((9, 67, 129)),
    "bn rows (40, 3, 2003)": bn_case((40, 3, 2003)),
    "bn channels-last (6, 1031, 37)": bn_case((6, 1031, 37), -1),
    "bn 2-D (4099, 33)": bn_case((4099, 33)),
    "bn segments (9, 67, 100)": bn_case((9, 67, 100)),
    "bn long rows (3, 5, 40003)": bn_case((3, 5, 40003)),
    "bn F-order (7, 19, 23, 31)": bn_case((7, 19, 23, 31), 1, "F"),
    "nested (17, 3, 250) x 1031": nested_case((17, 3, 250), 1031),
    "jvp (257, 1031)": jvp_case((257, 1031)),
    "numpy ops": numpy_ops_case(),
}


def _all_counts_agree(calls, what):
    results = []
    for t in (1, 2, 3, 4):
        cynorm.set_num_threads(t)
        results.append([bits(a).copy() for a in calls()])
    for t, other in zip((2, 3, 4), results[1:]):
        assert len(other) == len(results[0])
        for i, (a, b_) in enumerate(zip(results[0], other)):
            if not np.array_equal(a, b_):
                raise AssertionError(f"{what}: output {i} differs between 1 and {t} threads "
                                     f"({np.count_nonzero(a != b_)} of {a.size} bytes)")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", list(THREAD_CASES))
def test_thread_counts_1_to_4_bitwise(case, dtype, rng, restore_threads, team_always):
    """Each case's calls (forward, backward, out= variants, split statistics,
    ...) at 1, 2, 3 and 4 OpenMP threads: every output bitwise equal."""
    _all_counts_agree(THREAD_CASES[case](rng, dtype), case)


@pytest.fixture
def streaming_everywhere():
    """Streaming (non-temporal) stores for every output size in every
    kernel module, restored afterwards."""
    from cynorm._kernels import _runtime
    old = _runtime.set_stream_min_bytes(0)
    yield
    _runtime.set_stream_min_bytes(old)


STREAM_CASES = ["wn rows fused (301, 1031) dim 0", "wn columns (1031, 301) dim 1", "ln (257, 1031)",
                "ln (4099, 33)", "bn fused (6, 37, 1031)", "bn channels-last (6, 1031, 37)",
                "bn rows (40, 3, 2003)"]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", STREAM_CASES)
def test_thread_counts_1_to_4_bitwise_streaming(case, dtype, rng, restore_threads, team_always,
                                                streaming_everywhere):
    """As above with streaming stores forced on (the path large outputs
    take: from 16 MiB), where
    each thread's stores start and end at its own task boundaries."""
    _all_counts_agree(THREAD_CASES[case](rng, dtype), case + " streaming")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", STREAM_CASES)
def test_streamed_outputs_hold_the_cached_bits(case, dtype, rng, restore_threads):
    """Each case's outputs streamed (non-temporal stores: from the registers
    where the module has vector lanes, else through stack blocks) against
    the same calls with every output stored through the caches: bitwise
    equal."""
    from cynorm._kernels import _runtime
    calls = THREAD_CASES[case](rng, dtype)
    cynorm.set_num_threads(2)
    old = _runtime.set_stream_min_bytes(1 << 62)
    try:
        cached = [bits(a).copy() for a in calls()]
        _runtime.set_stream_min_bytes(0)
        streamed = [bits(a).copy() for a in calls()]
    finally:
        _runtime.set_stream_min_bytes(old)
    assert len(cached) == len(streamed)
    for i, (a, b_) in enumerate(zip(cached, streamed)):
        if not np.array_equal(a, b_):
            raise AssertionError(f"{case}: output {i} differs when streamed "
                                 f"({np.count_nonzero(a != b_)} of {a.size} bytes)")


# ======================================================================
# one call past 2**31 elements
# ======================================================================

def _available_memory():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * KiB
    except OSError:
        pass
    return None


# 2**31 + 2947 float16 elements (4 GiB), seen as (523905, 4099) by layer norm
# and as (5, 4099, 104781) by batch norm
BIG_N = 4099                                    # odd, prime
BIG_M = (2 ** 31) // BIG_N + 1                  # 523905 = 5 * 104781
BIG_SIZE = BIG_M * BIG_N
BIG_BN_SHAPE = (5, BIG_N, BIG_M // 5)
BIG_ROW_BLOCK = 4096                            # rows generated and checked at a time


@pytest.fixture(scope="module")
def big_x():
    """The 4 GiB float16 input, shared by the tests past 2**31 (made once).
    Rows of 4099 are contiguous slices of a random pool at random offsets,
    each row with its own random scale (0.5-2) and shift (-4..4): no two
    rows are alike, and every row's mean and spread differ from its
    neighbours', so data read from a wrong (wrapped) index shows.

    One process at a time holds it (a lock file): with the suite in several
    processes (pytest -n), a second one waits here rather than finding the
    first one's 9 GiB gone from the free memory and skipping."""
    if fcntl is None:
        yield from _big_x()
        return
    with open(os.path.join(tempfile.gettempdir(), "cynorm-tests-past-2-pow-31.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield from _big_x()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _big_x():
    need = 2 * BIG_SIZE * 2 + 1024 * MiB          # x, y, one block's temporaries
    avail = _available_memory()
    if avail is None or avail < need + 2 * 1024 * MiB:
        pytest.skip(f"needs ~{need / 2 ** 30:.1f} GiB of free memory (+2 GiB margin), "
                    f"have {None if avail is None else round(avail / 2 ** 30, 1)} GiB")
    assert BIG_SIZE > 2 ** 31 and (BIG_M - 1) * BIG_N < 2 ** 31 and BIG_M % 5 == 0
    rng = np.random.default_rng(31)
    pool = rng.standard_normal(BIG_ROW_BLOCK * BIG_N * 2, dtype=np.float32)
    x = np.empty((BIG_M, BIG_N), F16)
    for r0 in range(0, BIG_M, BIG_ROW_BLOCK):
        r1 = min(BIG_M, r0 + BIG_ROW_BLOCK)
        k = (r1 - r0) * BIG_N
        o = int(rng.integers(0, pool.size - k))
        blk = pool[o:o + k].reshape(r1 - r0, BIG_N) * rng.uniform(0.5, 2.0, (r1 - r0, 1)).astype(F32)
        blk += rng.uniform(-4, 4, (r1 - r0, 1)).astype(F32)
        x[r0:r1] = blk
    yield x.reshape(-1)
    del x


@pytest.mark.slow
def test_layer_norm_past_2_pow_31_elements(big_x, restore_threads):
    """layer_norm of a float16 (523905, 4099) array: 2**31 + 2947 elements,
    4 GiB, into a 4 GiB output (layer norm's streaming-store path: over
    256 MiB).  The last row starts 1152 elements before element 2**31 and
    ends past it, its bytes past 4 GiB; row 261952's bytes cross 2**31.

    Every row is checked against float64, 4096 rows at a time (a float64
    copy of the whole array would be 17 GiB; layer_norm_rows_off): its mean
    and rstd (float32) within 2e-6 of the row's standard deviation / of
    rstd, its y within 2**-10 of the row's largest |xhat| (float16 rounding).
    Peak RSS measured: 8.8 GiB (x, y, one block's float64 temporaries)."""
    cynorm.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    x = big_x.reshape(BIG_M, BIG_N)
    t0 = time.perf_counter()
    y, mean, rstd = cynorm.layer_norm(x, BIG_N)
    elapsed = time.perf_counter() - t0
    assert y.shape == x.shape and y.dtype == F16
    assert mean.shape == rstd.shape == (BIG_M, 1)
    bad = layer_norm_rows_off(x, y, mean, rstd)
    assert not bad, (f"rows {bad} wrong (first element index {bad[0] * BIG_N}; "
                     f"2**31 = {2 ** 31}); the call took {elapsed:.1f} s")
    # the far end once more by hand: the last row's elements past 2**31
    last = x[-1].astype(np.float64)
    lm, lsd = last.mean(), last.std()
    past = np.arange(2 ** 31 - (BIG_M - 1) * BIG_N, BIG_N)
    assert past.size == BIG_SIZE - 2 ** 31
    want = (last[past] - lm) / np.sqrt(lsd ** 2 + 1e-5)
    assert np.abs(y[-1, past].astype(np.float64) - want).max() <= 2.0 ** -10 * np.abs(want).max()


def layer_norm_rows_off(x, y, mean, rstd, eps=1e-5, block=BIG_ROW_BLOCK, limit=5):
    """Rows (up to `limit`) of layer_norm(x, x.shape[-1]) = (y, mean, rstd),
    without affine, that are off from a float64 reference computed `block`
    rows at a time: mean and rstd (float32) beyond 2e-6 of the row's
    standard deviation / of rstd, y beyond 2**-10 of the row's largest |xhat|
    (float16 rounding: 2**-11 relative, plus float32 math)."""
    bad = []
    M = x.shape[0]
    for r0 in range(0, M, block):
        r1 = min(M, r0 + block)
        xb = x[r0:r1].astype(np.float64)
        m = xb.mean(axis=1, keepdims=True)
        xb -= m
        var = np.mean(xb * xb, axis=1, keepdims=True)
        rs = 1.0 / np.sqrt(var + eps)
        xb *= rs                                   # xhat: the exact y
        ok = np.abs(mean[r0:r1].astype(np.float64) - m) <= 2e-6 * np.sqrt(var)
        ok &= np.abs(rstd[r0:r1].astype(np.float64) - rs) <= 2e-6 * rs
        tol = 2.0 ** -10 * np.max(np.abs(xb), axis=1, keepdims=True)
        ok &= np.all(np.abs(y[r0:r1].astype(np.float64) - xb) <= tol, axis=1, keepdims=True)
        bad.extend((np.flatnonzero(~ok[:, 0]) + r0)[:limit - len(bad)].tolist())
        if len(bad) >= limit:
            break
    return bad


@pytest.mark.slow
def test_batch_norm_past_2_pow_31_elements(big_x, restore_threads):
    """Training batch_norm of the same 4 GiB buffer seen as (5, 4099, 104781)
    float16, N, C, L: 4099 channels of 5 rows of 104781, rows C * 104781
    apart (the fused per-channel path, rows longer than ROW_CHUNK); the last
    channel's last row starts at element 2147381814 and ends at 2**31 + 2947.

    Checked against float64, 16 channels at a time (batch_norm_channels_off):
    save_mean and save_invstd within 2e-6 (of the channel's standard
    deviation / of invstd), the running statistics updated in place to
    0.9 old + 0.1 batch (unbiased variance) within 2e-6, y within 2**-10 of
    the channel's largest |xhat * w + b|.  Peak memory as above."""
    cynorm.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    x = big_x.reshape(BIG_BN_SHAPE)
    C = BIG_N
    rng = np.random.default_rng(32)
    w, b = rng.uniform(0.5, 1.5, C).astype(F32), rng.uniform(-1, 1, C).astype(F32)
    rm0, rv0 = rng.uniform(-1, 1, C).astype(F32), rng.uniform(0.5, 2, C).astype(F32)
    rm, rv = rm0.copy(), rv0.copy()
    y, sm, si = cynorm.batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
    assert y.shape == x.shape and y.dtype == F16 and sm.shape == si.shape == (C,)
    bad = batch_norm_channels_off(x, y, w, b, sm, si, rm0, rv0, rm, rv)
    assert not bad, f"channels {bad} wrong (of {C}; 2**31 = {2 ** 31})"


def batch_norm_channels_off(x, y, w, b, sm, si, rm0, rv0, rm, rv, eps=1e-5, momentum=0.1,
                            group=16, limit=5):
    """Channels (axis 1, up to `limit`) of a training batch_norm call whose
    results are off from a float64 reference computed `group` channels at a
    time (see test_batch_norm_past_2_pow_31_elements for the bounds)."""
    bad = []
    C = x.shape[1]
    n = x.size // C
    for c0 in range(0, C, group):
        c1 = min(C, c0 + group)
        xb = x[:, c0:c1].astype(np.float64)
        m = xb.mean(axis=(0, 2))
        xb -= m[None, :, None]
        var = np.mean(xb * xb, axis=(0, 2))
        inv = 1.0 / np.sqrt(var + eps)
        xb *= (inv * w[c0:c1])[None, :, None]
        xb += b[c0:c1][None, :, None]                  # the exact y
        sd = np.sqrt(var)
        ok = np.abs(sm[c0:c1] - m) <= 2e-6 * sd
        ok &= np.abs(si[c0:c1] - inv) <= 2e-6 * inv
        want_rm = (1 - momentum) * rm0[c0:c1] + momentum * m
        want_rv = (1 - momentum) * rv0[c0:c1] + momentum * var * n / (n - 1)
        ok &= np.abs(rm[c0:c1] - want_rm) <= 2e-6 * (np.abs(want_rm) + sd)
        ok &= np.abs(rv[c0:c1] - want_rv) <= 2e-6 * want_rv
        tol = 2.0 ** -10 * np.max(np.abs(xb), axis=(0, 2))
        ok &= np.all(np.abs(y[:, c0:c1].astype(np.float64) - xb) <= tol[None, :, None], axis=(0, 2))
        bad.extend((np.flatnonzero(~ok) + c0)[:limit - len(bad)].tolist())
        if len(bad) >= limit:
            break
    return bad


def test_big_checkers_catch_wrong_rows_and_channels(rng):
    """The checkers of the tests past 2**31, on small arrays: they pass the
    right answer and flag a row or channel written from another one's data
    (what a wrapped index does), a wrong statistic, a wrong running stat."""
    x = (rng.standard_normal((64, 4099)) * rng.uniform(0.5, 2, (64, 1))
         + rng.uniform(-4, 4, (64, 1))).astype(F16)
    y, mean, rstd = cynorm.layer_norm(x, 4099)
    assert layer_norm_rows_off(x, y, mean, rstd, block=16) == []
    y2, mean2, rstd2 = y.copy(), mean.copy(), rstd.copy()
    y2[-1] = y2[3]
    mean2[40] = mean2[41]
    rstd2[20] *= 1.00001
    assert layer_norm_rows_off(x, y2, mean2, rstd2, block=16) == [20, 40, 63]

    x3 = x.reshape(4, 16, -1)
    w, b = rng.uniform(0.5, 1.5, 16).astype(F32), rng.uniform(-1, 1, 16).astype(F32)
    rm0, rv0 = rng.uniform(-1, 1, 16).astype(F32), rng.uniform(0.5, 2, 16).astype(F32)
    rm, rv = rm0.copy(), rv0.copy()
    y, sm, si = cynorm.batch_norm(x3, w, b, rm, rv, True)
    args = (w, b, sm, si, rm0, rv0, rm, rv)
    assert batch_norm_channels_off(x3, y, *args, group=5) == []
    y2 = y.copy()
    y2[3, 15] = y2[3, 2]
    assert batch_norm_channels_off(x3, y2, *args, group=5) == [15]
    si2, rv2 = si.copy(), rv.copy()
    si2[7] *= 1.00001
    rv2[11] = rv0[11]
    assert batch_norm_channels_off(x3, y, w, b, sm, si2, rm0, rv0, rm, rv2, group=5) == [7, 11]
