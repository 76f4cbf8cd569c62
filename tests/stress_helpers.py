"""Memory probes and the call table of the leak tests (tests/test_stress.py).

Four probes, read before and after a run of calls:

* tracemalloc's traced memory: everything Python allocates (objects,
  pymalloc and PyMem blocks) plus NumPy's data buffers, which NumPy reports
  to tracemalloc itself (also those of cynorm's block-cache handler, since
  the tracking sits in NumPy's allocation wrapper, not in the handler);
* the C heap in use (glibc's mallinfo2: uordblks + hblkhd), which sees
  what the Cython kernels and the block cache malloc and never free, and
  which tracemalloc cannot see; byte-exact, not rounded to pages;
* sys.getallocatedblocks(): pymalloc blocks in use, one per small Python
  object, however small (a leaked float is one block);
* the process's resident set (/proc/self/statm), the number the issue asks
  for: anything a leak ends up touching, page-granular.

The probes that the platform lacks read as None and their bound is skipped.
"""
import ctypes
import ctypes.util
import gc
import os
import sys
import tracemalloc
from dataclasses import dataclass

import ml_dtypes
import numpy as np

import cynorm
import cynorm.nested as nt

KiB, MiB = 1 << 10, 1 << 20


# ---- probes

def rss_bytes():
    """The anonymous resident memory of this process (Linux), else None:
    statm's resident pages less its shared ones (file-backed and shmem).  A
    leak is anonymous memory; the libraries' file pages are mapped in and
    out by the kernel on its own schedule, whatever the calls do."""
    try:
        with open("/proc/self/statm") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _libc_function(name, restype, argtypes):
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = getattr(libc, name)
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


_mallinfo2 = _libc_function("mallinfo2", _Mallinfo2, [])
_malloc_trim = _libc_function("malloc_trim", ctypes.c_int, [ctypes.c_size_t])


def trim_c_heap():
    """Give the C heap's free pages back to the system (glibc), so that RSS
    counts the heap's live memory: without it, a leak first fills pages the
    process freed earlier and still has resident, and RSS does not move
    (measured: a leaked 1 KiB array per call grew RSS by 76 KiB per 400
    calls, not the 440 KiB it holds)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def c_heap_bytes():
    """Bytes the C allocator has handed out and not had back (glibc >= 2.33:
    small and large chunks in use plus mmap'd blocks), else None."""
    if _mallinfo2 is None:
        return None
    mi = _mallinfo2()
    return mi.uordblks + mi.hblkhd


def _diff(a, b):
    return None if a is None or b is None else b - a


PROBES = ("traced", "blocks", "c_heap", "rss")


def read_probes():
    """The four probes now (None where unavailable or, for tracemalloc, off)."""
    return {"traced": tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None,
            "blocks": sys.getallocatedblocks(), "c_heap": c_heap_bytes(), "rss": rss_bytes()}


@dataclass
class Growth:
    """Per-window growth of each probe (None where the probe is off)."""
    calls: int
    window_calls: int
    windows: dict

    def settled(self, probe):
        """Growth per window after the first (the first settles: pools that
        keep a bounded number of recently freed blocks, such as NumPy's
        small-buffer cache, refill there; and under tracemalloc, a pool
        whose untraced entries are replaced by traced ones looks like
        growth until it has turned over once)."""
        w = self.windows[probe]
        return None if not w or w[0] is None else w[1:]

    def settled_total(self, probe):
        w = self.settled(probe)
        return None if w is None else sum(w)

    def worst_but_one(self, probe):
        """The second-largest settled window: a one-time allocation makes
        one window grow, a leak makes every window grow."""
        w = self.settled(probe)
        return None if w is None else sorted(w)[-2] if len(w) > 1 else w[0]

    def __str__(self):
        def fmt(probe):
            w = self.windows[probe]
            if not w or w[0] is None:
                return f"{probe} n/a"
            if probe == "blocks":
                return f"blocks [" + " ".join(f"{v:+d}" for v in w) + "]"
            return f"{probe} [" + " ".join(f"{v / KiB:+.1f}" for v in w) + "] KiB"
        return (f"{self.calls} calls in windows of {self.window_calls}: "
                + "; ".join(fmt(p) for p in PROBES))


def measure(call, n, windows=5, traced=False, warm=300, abort_rss=256 * MiB, settle=None):
    """Growth of the probes over n calls of `call`, read at the ends of
    `windows` equal windows, after `warm` warm-up calls (traced ones when
    `traced`, so that tracemalloc's own tables and any pool of recently
    freed blocks are in place before the first reading).  Each reading
    follows gc.collect() (and settle(), if given).  A run whose RSS grows by
    more than abort_rss stops at the end of a window, so that a runaway leak
    cannot take the machine down; `calls` says how many ran.  The C heap
    is trimmed before each reading (see trim_c_heap).  The objects
    alive after the warm-up are frozen (gc.freeze) for the run."""
    started = traced and not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    per = max(1, n // windows)
    grown = {p: [] for p in PROBES}
    done = 0
    frozen = False
    try:
        for _ in range(warm):
            call()
        # what exists now is not garbage of these calls: keep it out of the
        # collections below, which then take microseconds, not 0.1 s each
        gc.collect()
        gc.freeze()
        frozen = True

        def reading():
            gc.collect()
            if settle is not None:
                settle()
            trim_c_heap()
            return read_probes()
        first = prev = reading()
        for _ in range(windows):
            for _ in range(per):
                call()
            done += per
            cur = reading()
            for p in PROBES:
                grown[p].append(_diff(prev[p], cur[p]))
            prev = cur
            if first["rss"] is not None and cur["rss"] - first["rss"] > abort_rss:
                break
    finally:
        if frozen:
            gc.unfreeze()
        if started:
            tracemalloc.stop()
    return Growth(done, per, grown)


# ---- the calls: every public op family on small inputs

F32 = np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)


def _raises(exc, fn, *args, **kwargs):
    """A call of fn that must raise exc (and nothing else)."""
    def call():
        try:
            fn(*args, **kwargs)
        except exc:
            return
        raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc.__name__}")
    return call


def leak_cases():
    """name -> zero-argument callable, inputs built once here.  Every output
    is at least 1 KiB where the op allows (the smallest: norms and
    statistics of 256 channels/rows in float32), so a leaked output costs at
    least ~1.1 KiB a call with its array object."""
    rng = np.random.default_rng(7)
    r = lambda *s: rng.standard_normal(s).astype(F32)
    cases = {}

    # weight norm: v (256, 8), one norm per row (256 float32 = 1 KiB)
    v, gw = r(256, 8), r(256, 8)
    g = (rng.random((256, 1)) + 0.5).astype(F32)
    norm = cynorm.norm_except_dim(v, 2, 0)
    cases["norm_except_dim"] = lambda: cynorm.norm_except_dim(v, 2, 0)
    cases["norm_except_dim pow=inf dim=None"] = lambda: cynorm.norm_except_dim(v, np.inf, None)
    cases["weight_norm"] = lambda: cynorm.weight_norm(v, g, 0)
    cases["weight_norm_interface"] = lambda: cynorm.weight_norm_interface(v, g, 0)
    cases["weight_norm_backward"] = lambda: cynorm.weight_norm_backward(gw, v, g, norm, 0)
    vb, gb16 = v.astype(BF16), gw.astype(BF16)
    normb = cynorm.norm_except_dim(vb, 2, 0).astype(F32)
    cases["weight_norm_backward bfloat16"] = lambda: cynorm.weight_norm_backward(gb16, vb, g, normb, 0)
    vF = np.asfortranarray(v)
    cases["weight_norm F-order dim=1"] = lambda: cynorm.weight_norm_interface(vF, np.ones(8, F32), 1)

    # layer norm: x (256, 16): mean and rstd 1 KiB each, y 16 KiB
    x, dy = r(256, 16), r(256, 16)
    w, b = (rng.random(16) + 0.5).astype(F32), r(16)
    _, mean, rstd = cynorm.layer_norm(x, 16, w, b)
    cases["layer_norm"] = lambda: cynorm.layer_norm(x, 16, w, b)
    cases["layer_norm no affine"] = lambda: cynorm.layer_norm(x, (16,))
    cases["layer_norm_backward"] = lambda: cynorm.layer_norm_backward(dy, x, 16, mean, rstd, w, b)
    cases["layer_norm_backward mask"] = lambda: cynorm.layer_norm_backward(
        dy, x, 16, mean, rstd, None, None, (False, True, True))
    cases["layer_norm_backward list mask"] = lambda: cynorm.layer_norm_backward(
        dy, x, [16], mean, rstd, w, b, [True, False, True])
    xb, dyb = x.astype(BF16), dy.astype(BF16)
    cases["layer_norm bfloat16"] = lambda: cynorm.layer_norm(xb, 16, w, b)
    # one parameter: the other made as ones or zeros (a scratch buffer)
    cases["layer_norm weight only"] = lambda: cynorm.layer_norm(x, 16, w)
    cases["layer_norm bfloat16 bias only"] = lambda: cynorm.layer_norm(xb, 16, None, b)

    # batch norm: x (4, 256, 3), 256 channels: statistics 1 KiB each
    C = 256
    xn, dyn = r(4, C, 3), r(4, C, 3)
    bw, bb = (rng.random(C) + 0.5).astype(F32), r(C)
    rm, rv = r(C) * 0.1, (rng.random(C) + 0.5).astype(F32)
    _, sm, si = cynorm.batch_norm(xn, bw, bb, training=True)
    xcl, dycl = np.ascontiguousarray(np.moveaxis(xn, 1, -1)), np.ascontiguousarray(np.moveaxis(dyn, 1, -1))
    cases["batch_norm train"] = lambda: cynorm.batch_norm(xn, bw, bb, rm, rv, True)
    cases["batch_norm train channels-last"] = lambda: cynorm.batch_norm(xcl, bw, bb, None, None, True, axis=-1)
    cases["batch_norm inference"] = lambda: cynorm.batch_norm(xn, bw, bb, rm, rv, False)
    # (N, C, L) axes over (N, L, C) memory: a channels_last tensor's view
    xmv, dymv = np.moveaxis(xcl, -1, 1), np.moveaxis(dycl, -1, 1)
    cases["batch_norm train other order"] = lambda: cynorm.batch_norm(xmv, bw, bb, None, None, True)
    cases["batch_norm_backward other order"] = lambda: cynorm.batch_norm_backward(
        dymv, xmv, bw, rm, rv, sm, si, True)
    cases["batch_norm_backward train"] = lambda: cynorm.batch_norm_backward(
        dyn, xn, bw, rm, rv, sm, si, True)
    cases["batch_norm_backward inference"] = lambda: cynorm.batch_norm_backward(
        dyn, xn, bw, rm, rv, None, None, False)
    cases["cudnn_batch_norm_backward"] = lambda: cynorm.cudnn_batch_norm_backward(
        xn, dyn, bw, rm, rv, sm, si, 1e-5)
    # the five split-statistics ops
    ms, ist = cynorm.batch_norm_stats(xn)
    m2, i2 = np.stack([ms, ms * 0.5]), np.stack([ist, ist * 2])
    counts = np.array([12.0, 20.0])
    grm, grv = rm.copy(), rv.copy()
    sdy, sdx, _, _ = cynorm.batch_norm_backward_reduce(dyn, xn, ms, ist, bw)
    cases["batch_norm_stats"] = lambda: cynorm.batch_norm_stats(xn)
    cases["batch_norm_gather_stats"] = lambda: cynorm.batch_norm_gather_stats(m2, i2, counts, grm, grv)
    cases["batch_norm_elemt"] = lambda: cynorm.batch_norm_elemt(xn, bw, bb, ms, ist)
    cases["batch_norm_backward_reduce"] = lambda: cynorm.batch_norm_backward_reduce(dyn, xn, ms, ist, bw)
    cases["batch_norm_backward_elemt"] = lambda: cynorm.batch_norm_backward_elemt(
        dyn, xn, ms, ist, bw, sdy, sdx, np.array([12]))
    cases["batch_norm_backward_reduce channels-last"] = lambda: cynorm.batch_norm_backward_reduce(
        dycl, xcl, ms, ist, bw, axis=-1)

    # softmax family, nll, trace, log_sigmoid: (256, 4) float32 (4 KiB)
    s, gs = r(256, 4), r(256, 4)
    ys, lys = cynorm.softmax(s, 1), cynorm.log_softmax(s, 1)
    cases["softmax"] = lambda: cynorm.softmax(s, 1)
    cases["log_softmax"] = lambda: cynorm.log_softmax(s, -1)
    cases["softmax bfloat16 half_to_float"] = lambda: cynorm.softmax(s.astype(BF16), 1, True)
    cases["softmax_backward_data"] = lambda: cynorm.softmax_backward_data(gs, ys, 1, F32)
    cases["log_softmax_backward_data"] = lambda: cynorm.log_softmax_backward_data(gs, lys, 1, F32)
    target = rng.integers(0, 4, 256)
    target[::7] = -100
    cw = (rng.random(4) + 0.5).astype(F32)
    out_none, tw = cynorm.nll_loss_forward(lys, target, cw, "none")
    cases["nll_loss_forward none"] = lambda: cynorm.nll_loss_forward(lys, target, cw, "none")
    cases["nll_loss mean"] = lambda: cynorm.nll_loss(lys, target, cw, "mean")
    cases["nll_loss_backward none"] = lambda: cynorm.nll_loss_backward(
        out_none, lys, target, cw, "none", -100, tw)
    lp2 = cynorm.log_softmax(r(2, 4, 8, 16), 1)
    t2 = rng.integers(0, 4, (2, 8, 16))
    o2, tw2 = cynorm.nll_loss2d_forward(lp2, t2, None, "sum")
    cases["nll_loss2d_forward sum"] = lambda: cynorm.nll_loss2d_forward(lp2, t2, None, "sum")
    cases["nll_loss2d_backward sum"] = lambda: cynorm.nll_loss2d_backward(
        np.float32(1.0), lp2, t2, None, "sum", -100, tw2)
    sq = r(64, 64)
    cases["trace"] = lambda: cynorm.trace(sq)
    cases["log_sigmoid_forward"] = lambda: cynorm.log_sigmoid_forward(s)

    # forward-mode derivatives
    tx, tw_, tdy = r(256, 16), r(16), r(256, 16)
    cases["jvp layer_norm"] = lambda: cynorm.jvp(cynorm.layer_norm, (x, (16,), w, b), (tx, None, tw_, None))
    cases["jvp layer_norm_backward"] = lambda: cynorm.jvp(
        cynorm.layer_norm_backward, (dy, x, (16,), mean, rstd, w, b), (tdy, tx, None, None, None, tw_, None))
    txn = r(4, C, 3)
    cases["jvp batch_norm train"] = lambda: cynorm.jvp(
        cynorm.batch_norm, (xn, bw, bb), (txn, None, None), training=True)
    tv = r(256, 8)
    cases["jvp weight_norm_interface"] = lambda: cynorm.jvp(cynorm.weight_norm_interface, (v, g, 0), (tv, None, None))

    # nested arrays: 3 components of (rows, 16)
    comps = [r(n, 16) for n in (17, 3, 60)]
    xnest = nt.nested_array(comps)
    gnest = nt.nested_array([r(n, 16) for n in (17, 3, 60)])
    ynest, mnest, rnest = nt.layer_norm(xnest, (16,), w, b)
    lw, lb = r(24, 16), r(24)
    snest = nt.softmax(xnest, 2)
    cases["nested layer_norm"] = lambda: nt.layer_norm(xnest, (16,), w, b)
    cases["nested layer_norm_backward"] = lambda: nt.layer_norm_backward(
        gnest, xnest, (16,), mnest, rnest, w, b)
    cases["nested softmax"] = lambda: nt.softmax(xnest, 2)
    cases["nested softmax_backward"] = lambda: nt.softmax_backward(gnest, snest, 2)
    cases["nested linear"] = lambda: nt.linear(xnest, lw, lb)
    cases["nested gelu"] = lambda: nt.gelu(xnest, "tanh")
    cases["nested silu_backward"] = lambda: nt.silu_backward(gnest, xnest)

    # out= variants: the outputs are reused every call
    o_norm = np.empty((256, 1), F32)
    o_w, o_n = np.empty_like(v), np.empty((256, 1), F32)
    o_gv, o_gg = np.empty_like(v), np.empty_like(g)
    o_y, o_m, o_r = np.empty_like(x), np.empty((256, 1), F32), np.empty((256, 1), F32)
    o_yn, o_sm, o_si = np.empty_like(xn), np.empty(C, F32), np.empty(C, F32)
    o_e, o_gx = np.empty_like(xn), np.empty_like(xn)
    vin = v.copy()
    cases["out= norm_except_dim"] = lambda: cynorm.norm_except_dim(v, 2, 0, out=o_norm)
    cases["out= weight_norm"] = lambda: cynorm.weight_norm(v, g, 0, out=o_w)
    cases["out= weight_norm in place"] = lambda: cynorm.weight_norm(vin, g, 0, out=vin)
    cases["out= weight_norm_interface"] = lambda: cynorm.weight_norm_interface(v, g, 0, out=(o_w, o_n))
    cases["out= weight_norm_backward"] = lambda: cynorm.weight_norm_backward(gw, v, g, norm, 0, out=(o_gv, o_gg))
    cases["out= layer_norm"] = lambda: cynorm.layer_norm(x, 16, w, b, out=(o_y, o_m, o_r))
    cases["out= layer_norm partial"] = lambda: cynorm.layer_norm(x, 16, w, b, out=(o_y, None, None))
    cases["out= batch_norm"] = lambda: cynorm.batch_norm(xn, bw, bb, rm, rv, True, out=(o_yn, o_sm, o_si))
    cases["out= batch_norm_elemt"] = lambda: cynorm.batch_norm_elemt(xn, bw, bb, ms, ist, out=o_e)
    cases["out= batch_norm_backward_elemt"] = lambda: cynorm.batch_norm_backward_elemt(
        dyn, xn, ms, ist, bw, sdy, sdx, np.array([12]), out=o_gx)

    # error paths: a call that raises must not leak either
    bad_out = np.empty_like(x, dtype=np.float64)
    ro = rm.copy()
    ro.setflags(write=False)
    cases["error weight_norm g shape"] = _raises(ValueError, cynorm.weight_norm, v, g[:5], 0)
    cases["error weight_norm dim"] = _raises((ValueError, IndexError), cynorm.weight_norm, v, g, 5)
    cases["error weight_norm out dtype"] = _raises((ValueError, TypeError), cynorm.weight_norm, v, g, 0,
                                                   out=np.empty(v.shape, np.float64))
    cases["error weight_norm_interface second out"] = _raises(
        (ValueError, TypeError), cynorm.weight_norm_interface, v, g, 0, out=(o_w, np.empty(3, F32)))
    cases["error weight_norm_backward norm"] = _raises(
        (ValueError, TypeError), cynorm.weight_norm_backward, gw, v, g, norm[:7], 0)
    cases["error layer_norm shape"] = _raises(ValueError, cynorm.layer_norm, x, 15, None, None)
    cases["error layer_norm out"] = _raises((ValueError, TypeError), cynorm.layer_norm, x, 16, w, b,
                                            out=(bad_out, None, None))
    cases["error layer_norm_backward rstd"] = _raises(
        ValueError, cynorm.layer_norm_backward, dy, x, 16, mean, rstd[:9], w, b)
    cases["error batch_norm weight"] = _raises(ValueError, cynorm.batch_norm, xn, bw[:3], bb)
    cases["error batch_norm read-only running"] = _raises(
        ValueError, cynorm.batch_norm, xn, bw, bb, ro, rv, True)
    cases["error batch_norm one value"] = _raises(ValueError, cynorm.batch_norm, r(1, C), None, None)
    cases["error batch_norm_backward stats"] = _raises(
        ValueError, cynorm.batch_norm_backward, dyn, xn, bw, None, None, sm[:4], si, True)
    cases["error batch_norm_gather_stats counts"] = _raises(
        ValueError, cynorm.batch_norm_gather_stats, m2, i2, np.array([1.0, 2.0, 3.0]))
    cases["error batch_norm_backward_elemt count"] = _raises(
        ValueError, cynorm.batch_norm_backward_elemt, dyn, xn, ms, ist, bw, sdy, sdx, np.array([0]))
    cases["error batch_norm_elemt out"] = _raises(
        (ValueError, TypeError), cynorm.batch_norm_elemt, xn, bw, bb, ms, ist, out=o_y)
    cases["error softmax dim"] = _raises((ValueError, IndexError), cynorm.softmax, s, 3)
    cases["error nll target"] = _raises(ValueError, cynorm.nll_loss_forward, lys, target + 5, cw, "none")
    cases["error trace"] = _raises(ValueError, cynorm.trace, xn)
    cases["error jvp tangent shape"] = _raises(
        ValueError, cynorm.jvp, cynorm.layer_norm, (x, (16,), w, b), (tx[:3], None, None, None))
    cases["error jvp nondiff tangent"] = _raises(
        TypeError, cynorm.jvp, cynorm.layer_norm, (x, (16,), w, b), (None, np.zeros(1), None, None))
    cases["error nested layer_norm"] = _raises(ValueError, nt.layer_norm, xnest, (15,), None, None)
    return cases


def cache_cases():
    """name -> callable whose outputs are >= 1 MiB: they come from (and go
    back to) the block cache of cynorm._kernels._alloc."""
    rng = np.random.default_rng(8)
    v = rng.standard_normal((512, 520)).astype(F32)       # 1.02 MiB outputs
    g = np.ones(512, F32)
    x = rng.standard_normal((520, 512)).astype(F32)
    cases = {}
    cases["weight_norm 1 MiB"] = lambda: cynorm.weight_norm(v, g, 0)
    cases["layer_norm 1 MiB"] = lambda: cynorm.layer_norm(x, 512)

    # more sizes than the cache has slots (8), the previous output alive
    # while the next is made: nine sizes are free at a time, so blocks are
    # taken, kept, refused (slots full) and freed.  Ten sizes, so that every
    # reading (after a multiple of 10 calls) sees the same output alive.
    shapes = [(512, 520 + 8 * k) for k in range(10)]
    vs = [rng.standard_normal(s).astype(F32) for s in shapes]
    state = {"i": 0, "alive": []}

    def rotating():
        i = state["i"]
        state["i"] = (i + 1) % len(vs)
        alive = state["alive"]
        alive.append(cynorm.weight_norm(vs[i], g, 0))
        if len(alive) > 1:
            del alive[0]
    cases[ROUND_ROBIN_CACHE_CASE] = rotating

    # an output grown in place: NumPy reallocates it through the handler
    ref = cynorm.weight_norm(v, g, 0).reshape(-1).copy()

    def resized():
        w = cynorm.weight_norm(v, g, 0)
        w.resize((w.size + 4099,), refcheck=False)
        if not np.array_equal(w[:ref.size], ref):
            raise AssertionError("ndarray.resize lost the contents of a block-cache output")
    cases["weight_norm 1 MiB, then resized"] = resized
    return cases


SINGLE_SIZE_CACHE_CASES = ("weight_norm 1 MiB", "layer_norm 1 MiB")
ROUND_ROBIN_CACHE_CASE = "10 sizes round robin, 2 alive"
