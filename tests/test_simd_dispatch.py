"""Runtime SIMD dispatch: every level this build and CPU offer gives the same
bits (the arithmetic is fixed by the code, not the vector width: explicit
lanes, no FMA contraction), and CYNORM_SIMD picks the level."""
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

from cynorm import _kernels

LEVELS = _kernels.available_levels()

# computes a spread of every op family, all four dtypes, and saves the bits
SCRIPT = r"""
import sys, numpy as np, ml_dtypes, cynorm
from cynorm import _kernels
rng = np.random.default_rng(0)
out = {"level": np.array(_kernels.SIMD_LEVEL)}
for dt in (np.float32, np.float64, ml_dtypes.bfloat16, np.float16):
    name = np.dtype(dt).name
    v = (rng.standard_normal((37, 300)) * 3 + 1).astype(dt)
    g = rng.standard_normal((37, 1)).astype(dt)
    w, n = cynorm.weight_norm_interface(v, g, 0)
    gv, gg = cynorm.weight_norm_backward(v, v, g, n, 0)
    x = (rng.standard_normal((6, 5, 7, 9)) * 2 + 0.5).astype(dt)
    y, m, r = cynorm.layer_norm(x, (7, 9))
    lx = cynorm.layer_norm_backward(x, x, (7, 9), m, r)[0]
    by, bm, bi = cynorm.batch_norm(x, training=True)
    bx = cynorm.batch_norm_backward(x, x, None, None, None, bm, bi, True)[0]
    cl, _, _ = cynorm.batch_norm(np.ascontiguousarray(np.moveaxis(x, 1, -1)), axis=-1)
    # column statistics with full groups of 32 columns, a tail and 8-row blocks
    # (bfloat16 reads them as word pairs)
    c2 = (rng.standard_normal((203, 70)) * 2 + 1).astype(dt)
    cm, ci = cynorm.batch_norm_stats(c2)
    cr = cynorm.batch_norm_backward_reduce(c2, c2, cm, ci, None, True, False, False)
    for k, a in dict(w=w, n=n, gv=gv, gg=gg, y=y, m=m, r=r, lx=lx, by=by, bm=bm, bi=bi, bx=bx,
                     cl=cl, cm=cm, ci=ci, cr0=cr[0], cr1=cr[1]).items():
        out[f"{name}-{k}"] = np.asarray(a).view(np.uint8)
    # NaNs of both signs (each order in a row) and +inf with -inf: the NaNs'
    # bits too (statistics, rows and channels of NaN coefficients)
    sp = v.astype(np.float64)
    sp[::5, 3], sp[1::5, 5] = np.nan, -np.nan
    sp[2::5, 4], sp[2::5, 9], sp[3::5, 9], sp[3::5, 4] = np.nan, -np.nan, np.nan, -np.nan
    sp[4::5, 1], sp[4::5, 2] = np.inf, -np.inf
    sp = sp.astype(dt)
    s3 = sp.reshape(37, 12, 25)
    sw, sn = cynorm.weight_norm_interface(sp, g, 0)
    sy, sm, sr = cynorm.layer_norm(sp, 300)
    sb = cynorm.batch_norm(s3, training=True)
    for k, a in dict(
            sw=sw, sn=sn, wb=cynorm.weight_norm_backward(sp, sp, g, sn, 0),
            sy=sy, sm=sm, sr=sr, lb=cynorm.layer_norm_backward(sp, sp, 300, sm, sr),
            rms=cynorm.rms_norm(sp, 300), sb=sb,
            bb=cynorm.batch_norm_backward(s3, s3, None, None, None, sb[1], sb[2], True),
            bc=cynorm.batch_norm(sp, training=True), gn=cynorm.group_norm(s3, 3),
            ).items():
        for i, part in enumerate(a if isinstance(a, tuple) else (a,)):
            out[f"{name}-nan-{k}-{i}"] = np.asarray(part).view(np.uint8)
import cynorm.nested as nt
for dt in (np.float32, np.float64):
    nx = nt.nested_array([(rng.standard_normal((n, m)) * 3).astype(dt) for n, m in ((3, 40), (5, 7), (2, 300))])
    ny = nt.softmax(nx, -1)
    out[f"nested-{np.dtype(dt).name}-softmax"] = ny.buffer.view(np.uint8)
    out[f"nested-{np.dtype(dt).name}-softmax_bwd"] = nt.softmax_backward(nx, ny, -1).buffer.view(np.uint8)
    out[f"nested-{np.dtype(dt).name}-sum"] = nt.sum(nx, -1).buffer.view(np.uint8)
np.savez(sys.argv[1], **out)
"""


# every bfloat16 store the kernels make (elementwise passes of each layout,
# layer norm's fused backward, weight norm), on rows long enough for the
# blocked paths and with subnormals, NaNs and infinities among the values
BF16_SCRIPT = r"""
import sys, numpy as np, ml_dtypes, cynorm
bf = ml_dtypes.bfloat16
rng = np.random.default_rng(1)
out = {}
def special(a):
    f = a.astype(np.float32).ravel()
    u = f.view(np.uint32)
    u[::101] = 0x7fa10000                 # NaNs with a payload (signalling) ...
    u[50::101] = 0xffe30000               # ... and quiet, negative
    f[7::211] = 3e-39
    f[3::307] = -np.inf
    return f.reshape(a.shape).astype(bf)
from cynorm._kernels import _runtime
# (6, 21, 9, 11): rows of 99, several to a pack (their channels differing)
# (3, 70, 5, 7): a column pass of 8192 columns and one of 2308 (not a
# multiple of 16); (2, 5, 3, 3): runs shorter than 16
cases = (((4, 3, 37, 41), 1), ((6, 64, 14, 14), 1), ((8, 9, 10, 64), -1), ((300, 70), 1),
         ((5, 1100), 1), ((6, 21, 9, 11), 1), ((3, 70, 5, 7), 1), ((2, 5, 3, 3), 1))
# every case again with every output streamed (non-temporal stores)
for i, (shape, axis) in enumerate(cases + cases):
    _runtime.set_stream_min_bytes(0 if i >= len(cases) else _runtime.streaming_threshold())
    for tag, x in (("plain", (rng.standard_normal(shape) * 2).astype(bf)),
                   ("special", special(rng.standard_normal(shape)))):
        C = shape[axis]
        w = rng.standard_normal(C).astype(np.float32)
        b = rng.standard_normal(C).astype(np.float32)
        rm, rv = np.zeros(C, np.float32), np.ones(C, np.float32)
        y, sm, si = cynorm.batch_norm(x, w, b, rm, rv, training=True, axis=axis)
        ye = cynorm.batch_norm(x, w, b, rm, rv, training=False, axis=axis)[0]
        dy = (rng.standard_normal(shape)).astype(bf)
        gx = cynorm.batch_norm_backward(dy, x, w, rm, rv, sm, si, True, axis=axis)[0]
        gxe = cynorm.batch_norm_backward(dy, x, w, rm, rv, sm, si, False, axis=axis)[0]
        N = shape[-1]
        ly, lm, lr = cynorm.layer_norm(x, N, w[:1].repeat(N), b[:1].repeat(N))
        lg = cynorm.layer_norm_backward(dy, x, N, lm, lr, w[:1].repeat(N))[0]
        v = x.reshape(shape[0], -1)
        wn = cynorm.weight_norm_interface(v, np.ones((shape[0], 1), bf), 0)[0]
        # over the last dim: the column passes (short contiguous rows share a pack)
        wnc = cynorm.weight_norm_interface(v, np.ones((1, v.shape[1]), bf), 1)[0]
        # weight norm's backward passes (rows and columns)
        gw = rng.standard_normal(v.shape).astype(bf)
        wb = {}
        for d in (0, 1):
            gd = (rng.random(v.shape[d]) + 0.5).astype(bf).reshape((-1, 1) if d == 0 else (1, -1))
            nd = cynorm.weight_norm_interface(v, gd, d)[1]
            wb[f"wnb{d}"] = cynorm.weight_norm_backward(gw, v, gd, nd, d)[0]
        # in place (out is v): each step of 16 reads its values before it stores
        vi = v.copy()
        cynorm.weight_norm(vi, np.full((1, 1), 0.5, np.float32), None, out=vi)
        # the mean's low part (a mean far from zero)
        lo = cynorm.layer_norm((x.astype(np.float32) + 300).astype(bf), N, w[:1].repeat(N),
                               b[:1].repeat(N))[0]
        # subnormal outputs: a weight of 1e-38 scales the normalized values down
        tiny = np.full(C, 1e-38, np.float32)
        ys = cynorm.batch_norm(x, tiny, None, rm, rv, training=False, axis=axis)[0]
        for k, a in dict(y=y, ye=ye, gx=gx, gxe=gxe, ly=ly, lg=lg, wn=wn, wnc=wnc, ys=ys, vi=vi,
                         lo=lo, **wb).items():
            out[f"{i}-{tag}-{k}"] = np.asarray(a).view(np.uint8)
np.savez(sys.argv[1], **out)
"""


def _run(level, path, script=SCRIPT, **env):
    env = dict(os.environ, CYNORM_SIMD=level, **env)
    proc = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return np.load(path)


def test_the_chosen_level_is_the_best_available_and_reported():
    assert _kernels.SIMD_LEVEL in LEVELS
    if not os.environ.get("CYNORM_SIMD"):
        assert _kernels.SIMD_LEVEL == LEVELS[-1]
    import cynorm
    reported = cynorm.config()["simd_dispatch"]
    if _kernels.has_variants():
        assert reported.startswith(_kernels.SIMD_LEVEL)
    else:
        assert reported.startswith("off: one build")


@pytest.mark.skipif(len(LEVELS) < 2, reason="this build has one SIMD level (a -march build, "
                    "or a CPU without AVX2): nothing to compare")
def test_every_level_gives_the_same_bits(tmp_path):
    results = {lv: _run(lv, tmp_path / f"{lv}.npz") for lv in LEVELS}
    ref = results[LEVELS[0]]
    for lv, res in results.items():
        assert str(res["level"]) == lv
        for key in ref.files:
            if key != "level":
                assert np.array_equal(res[key], ref[key]), f"{key} differs at {lv} vs {LEVELS[0]}"


STORE_PATH = _kernels.load("_convert").bf16_store_path()


@pytest.mark.skipif(STORE_PATH.startswith("integer"),
                    reason="the kernels here round bfloat16 value by value (no block pack at "
                    "this SIMD level)")
def test_bf16_block_packs_give_the_integer_paths_bits(tmp_path):
    # the packed stores: AVX512-BF16's block pack where the CPU has it, else
    # (AVX2) the elementwise passes' rounding in registers and the AVX2 block
    # pack of the other loops
    level = _kernels.SIMD_LEVEL
    packed = _run(level, tmp_path / "packed.npz", BF16_SCRIPT)
    plain = _run(level, tmp_path / "plain.npz", BF16_SCRIPT, CYNORM_NO_BF16_PACK="1")
    runs = {"the packed stores": packed}
    if STORE_PATH.startswith("AVX512-BF16"):      # its AVX2 fallback too
        runs["the AVX2 pack"] = _run(level, tmp_path / "avx2.npz", BF16_SCRIPT,
                                     CYNORM_NO_AVX512BF16="1")
    for what, res in runs.items():
        assert res.files == plain.files
        for key in res.files:
            assert np.array_equal(res[key], plain[key]), f"{key} differs with {what}"


# x86-64 psABI levels by their Linux /proc/cpuinfo flag names (lzcnt is "abm")
V3_FLAGS = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave",
            "sse4_1", "sse4_2", "ssse3", "popcnt", "cx16"}
V4_FLAGS = V3_FLAGS | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


def _cpuinfo_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or _cpuinfo_flags() is None,
                    reason="no x86 /proc/cpuinfo flags (not x86 Linux; under qemu the file "
                           "is the host's)")
def test_cpu_level_agrees_with_the_kernels_feature_list():
    # cpu_level reads CPUID and XCR0 itself (one code path for GCC and MSVC);
    # the Linux kernel lists only the features the OS has enabled
    flags = _cpuinfo_flags()
    expected = 4 if V4_FLAGS <= flags else 3 if V3_FLAGS <= flags else 1
    if expected == 4 and "avx512_bf16" in flags:
        expected = 5
    assert _kernels._cpu_level() == expected


def test_an_unknown_or_unavailable_level_is_refused():
    for value, message in (("sse9", "expected one of"), ("avx1024", "expected one of")):
        proc = subprocess.run([sys.executable, "-c", "import cynorm"], capture_output=True,
                              text=True, env=dict(os.environ, CYNORM_SIMD=value))
        assert proc.returncode != 0 and message in proc.stderr
    missing = [lv for lv in _kernels.LEVELS if lv not in LEVELS]
    for lv in missing:
        proc = subprocess.run([sys.executable, "-c", "import cynorm"], capture_output=True,
                              text=True, env=dict(os.environ, CYNORM_SIMD=lv))
        assert proc.returncode != 0 and "offers only" in proc.stderr


def test_a_build_with_no_runnable_kernels_says_why(monkeypatch):
    """No level available (a kernel module that does not import, say for a
    missing dependency): the baseline module's own ImportError, or, where it
    imports, an ImportError naming the problem (not an IndexError)."""
    monkeypatch.setattr(_kernels, "available_levels", lambda: [])
    with pytest.raises(ImportError, match="no kernel modules this CPU can run"):
        _kernels._choose()
    real_import = _kernels.importlib.import_module

    def failing_import(name, *args):
        if name == "cynorm._kernels.batch_norm":
            raise ModuleNotFoundError("No module named 'ml_dtypes'")
        return real_import(name, *args)
    monkeypatch.setattr(_kernels.importlib, "import_module", failing_import)
    with pytest.raises(ModuleNotFoundError, match="ml_dtypes"):
        _kernels._choose()
