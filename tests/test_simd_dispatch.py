"""Runtime SIMD dispatch: every level this build and CPU offer gives the same
bits (the arithmetic is fixed by the code, not the vector width: explicit
lanes, no FMA contraction), and CYNORM_SIMD picks the level."""
import os
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
    for k, a in dict(w=w, n=n, gv=gv, gg=gg, y=y, m=m, r=r, lx=lx, by=by, bm=bm, bi=bi, bx=bx,
                     cl=cl).items():
        out[f"{name}-{k}"] = np.asarray(a).view(np.uint8)
np.savez(sys.argv[1], **out)
"""


def _run(level, path):
    env = dict(os.environ, CYNORM_SIMD=level)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True,
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
