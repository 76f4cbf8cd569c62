"""The kernels' 16-bit conversions against ml_dtypes and NumPy, bit for bit."""
import os
import platform
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from cynorm import _kernels
from cynorm._config import _cpu_features

# the conversions at the SIMD level the kernels run (the bfloat16 block
# rounding differs between levels: cn_pack.h)
_convert = _kernels.load("_convert")
PACKED = _convert.bf16_store_path().startswith("AVX512-BF16")

ALL16 = np.arange(1 << 16, dtype=np.uint16)


def test_bfloat16_to_float32_every_pattern():
    got = _convert.bf16_to_f32(ALL16)
    want = ALL16.view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_float16_to_float32_every_pattern():
    """NumPy's widening, except that a signalling NaN comes out quiet (its
    payload kept) on every platform: NumPy's software conversion keeps it
    signalling, the hardware's (NumPy on Arm) quiets it."""
    got = _convert.f16_to_f32(ALL16)
    want = ALL16.view(np.float16).astype(np.float32).view(np.uint32).copy()
    nan = ((ALL16 & 0x7C00) == 0x7C00) & ((ALL16 & 0x03FF) != 0)
    want[nan] |= np.uint32(0x00400000)
    assert int(nan.sum()) == 2046
    np.testing.assert_array_equal(got.view(np.uint32), want)
    snan = np.array([0x7C01, 0xFD00], np.uint16)
    assert [hex(v) for v in _convert.f16_to_f32(snan).view(np.uint32)] == ["0x7fc02000", "0xffe00000"]


def float32_patterns(step):
    """Every step-th float32 bit pattern plus the edges where rounding changes."""
    u = np.arange(0, 1 << 32, step, dtype=np.uint64).astype(np.uint32)
    edges = []
    for base in (0x38800000, 0x33000000, 0x477ff000, 0x477fefff, 0x7f800000, 0x7f7fffff, 0x00800000):
        edges.append(np.arange(base - 4096, base + 4096, dtype=np.int64) % (1 << 32))
    # ties: a half ulp above representable values of both 16-bit formats
    ties = (np.arange(0, 1 << 16, dtype=np.uint32) << 16) | 0x8000
    ties16 = (np.arange(0x33000000, 0x47800000, 1 << 13, dtype=np.uint64) | 0x1000).astype(np.uint32)
    u = np.concatenate([u, np.concatenate(edges).astype(np.uint32), ties, ties16])
    both_signs = np.concatenate([u & 0x7fffffff, u | 0x80000000])
    return both_signs.view(np.float32)


@pytest.mark.parametrize("step", [997])
def test_float32_to_bfloat16_rounds_like_ml_dtypes(step):
    f = float32_patterns(step)
    got = _convert.f32_to_bf16(f)
    with np.errstate(invalid="ignore"):
        want = f.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(got, want)


def ml_dtypes_bf16(f):
    with np.errstate(invalid="ignore", over="ignore"):
        return f.astype(ml_dtypes.bfloat16).view(np.uint16)


@pytest.mark.parametrize("step", [997])
def test_float32_blocks_to_bfloat16_round_like_ml_dtypes(step):
    # the kernels' block rounding (one instruction per 32 values with
    # AVX512-BF16) over the same patterns: subnormals and NaNs among them
    # take the integer path, vector by vector
    f = float32_patterns(step)
    np.testing.assert_array_equal(_convert.f32_to_bf16_blocks(f), ml_dtypes_bf16(f))


SPECIALS = np.array([0x00000001, 0x807fffff, 0x00400000,        # subnormals
                     0x7fc00001, 0xffa00000, 0x7f800001,        # NaNs with payloads, signalling
                     0x7f800000, 0xff800000, 0x80000000,        # infinities, -0
                     0x7f7fffff, 0x00800000], np.uint32).view(np.float32)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="the denormals-are-zero flag is an x86 MXCSR bit")
def test_block_rounding_ignores_denormals_are_zero():
    # another library may leave the MXCSR's DAZ flag set; the bfloat16
    # rounding of a subnormal must still be ml_dtypes' (the AVX512-BF16
    # instruction and VFPCLASSPS both read subnormals as zero under DAZ)
    u = np.concatenate([np.arange(1, 1 << 23, 4099, dtype=np.uint32),
                        np.array([0x00400000, 0x000ae398, 0x007fffff], np.uint32)])
    f = np.concatenate([u, u | 0x80000000]).view(np.float32)
    f = np.concatenate([f, np.ones(31, np.float32)])      # a masked tail too
    np.testing.assert_array_equal(_convert.f32_to_bf16_blocks(f, daz=True), ml_dtypes_bf16(f))


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="the denormals-are-zero flag is an x86 MXCSR bit")
@pytest.mark.parametrize("rows", [64, 2048])     # y through the cache; streamed (16 MiB)
def test_pass_rounding_ignores_denormals_are_zero(rows):
    # the passes round their float32 values in registers or in blocks
    # (cn_bf16_regs.h, cn_pack.h): under DAZ a subnormal value must still
    # round as ml_dtypes rounds it.  RMS norm's y = (x * rstd) * w with w
    # near float32's smallest normal: normal operands (DAZ changes no
    # arithmetic), subnormal values
    import cynorm
    x = np.random.default_rng(rows).standard_normal((rows, 4096)).astype(ml_dtypes.bfloat16)
    w = np.full(4096, 1.5e-38, ml_dtypes.bfloat16)
    threads = cynorm.get_num_threads()
    cynorm.set_num_threads(1)           # the kernel runs on this thread
    try:
        want, rstd = cynorm.rms_norm(x, 4096, w)
        got = _convert.call_with_daz(lambda: cynorm.rms_norm(x, 4096, w)[0])
    finally:
        cynorm.set_num_threads(threads)
    y32 = (x.astype(np.float32) * rstd) * w.astype(np.float32)
    assert (np.abs(y32) < np.finfo(np.float32).tiny).mean() > 0.3
    np.testing.assert_array_equal(want.view(np.uint16), ml_dtypes_bf16(y32))
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="the denormals-are-zero flag is an x86 MXCSR bit")
@pytest.mark.parametrize("rows", [64, 8192])     # y through the cache; streamed (16 MiB)
def test_column_pass_rounding_ignores_denormals_are_zero(rows):
    # channels-last passes round each row of their contiguous rows in
    # registers (cn_store_paths.h, cn_cols_bf16): batch norm's training
    # input gradient (dy - p - (x - mean) * q) * (invstd * w), with w near
    # float32's smallest normal, ends on a product of normal operands with
    # subnormal values, which DAZ must not flush when they are rounded
    import cynorm
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 16, 64)).astype(ml_dtypes.bfloat16)
    dy = rng.standard_normal((rows, 16, 64)).astype(ml_dtypes.bfloat16)
    w = np.full(64, 1.5e-38, np.float32)
    _, mean, invstd = cynorm.batch_norm(x, w, None, training=True, axis=-1)

    def grad_x():
        return cynorm.batch_norm_backward(dy, x, w, None, None, mean, invstd, True,
                                          output_mask=(True, False, False), axis=-1)[0]

    threads = cynorm.get_num_threads()
    cynorm.set_num_threads(1)           # the kernel runs on this thread
    try:
        want = grad_x()
        got = _convert.call_with_daz(grad_x)
    finally:
        cynorm.set_num_threads(threads)
    y = want.astype(np.float32)
    assert ((y != 0) & (np.abs(y) < np.finfo(np.float32).tiny)).mean() > 0.3
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("n", [1, 15, 16, 17, 31, 32, 33, 64, 95, 257])
def test_one_special_value_anywhere_in_a_block(n):
    # a subnormal or NaN sends its whole vector to the integer path: check
    # every position of it, the masked tail included, and that the normal
    # values beside it still round right
    rng = np.random.default_rng(n)
    base = (rng.standard_normal(n) * 1e3).astype(np.float32)
    base.view(np.uint32)[:] |= 0x8000                 # a tie or above at bit 15
    for special in SPECIALS:
        for pos in range(n):
            f = base.copy()
            f[pos] = special
            got = _convert.f32_to_bf16_blocks(f)
            np.testing.assert_array_equal(got, ml_dtypes_bf16(f), err_msg=f"{special!r} at {pos}")


def test_bfloat16_store_path_is_reported_and_can_be_turned_off():
    import cynorm
    assert cynorm.config()["bfloat16_stores"] == _convert.bf16_store_path()
    code = ("import cynorm; from cynorm import _kernels; "
            "print(_kernels.load('_convert').bf16_store_path())")

    def path_with(**env):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ, **env), timeout=120)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    assert path_with(CYNORM_NO_BF16_PACK="1") == "integer round-to-nearest-even"
    assert not path_with(CYNORM_NO_AVX512BF16="1").startswith("AVX512-BF16")
    # cn_pack.h's AVX2 pack is written with GCC/clang intrinsics: MSVC builds round per value
    built_for_avx2 = not cynorm.config()["compiler"].startswith("msvc") and (
        _kernels.SIMD_LEVEL in ("avx2", "avx512", "avx512bf16") or (
            not _kernels.has_variants() and "AVX2" in cynorm.config()["simd_compiled"]))
    if built_for_avx2:      # every module built for AVX2 carries the AVX2 rounding
        assert path_with(CYNORM_NO_AVX512BF16="1").startswith("AVX2 integer rounding")


@pytest.mark.skipif("avx512_bf16" not in _cpu_features()
                    or _kernels.SIMD_LEVEL not in ("avx512", "avx512bf16")
                    and _kernels.has_variants(),
                    reason="the AVX512-BF16 stores need a CPU with avx512_bf16 and AVX-512 kernels")
def test_avx512_kernels_use_the_bf16_instruction_where_the_cpu_has_it():
    import cynorm
    if "AVX-512" not in cynorm.config()["simd_compiled"] and not _kernels.has_variants():
        pytest.skip("this build's kernels are not compiled for AVX-512")
    if os.environ.get("CYNORM_NO_AVX512BF16", "") not in ("", "0"):
        pytest.skip("CYNORM_NO_AVX512BF16 is set")
    assert PACKED


@pytest.mark.parametrize("step", [997])
def test_float32_to_float16_rounds_like_numpy(step):
    f = float32_patterns(step)
    u = f.view(np.uint32)
    # NumPy keeps a signalling NaN's payload unquieted; arithmetic never
    # produces one, and the kernels quiet it: compare quiet NaNs only
    quiet = ~np.isnan(f) | ((u & 0x00400000) != 0)
    with np.errstate(invalid="ignore", over="ignore"):
        want = f.astype(np.float16).view(np.uint16)
    got = _convert.f32_to_f16(f)
    np.testing.assert_array_equal(got[quiet], want[quiet])
    assert np.isnan(_convert.f16_to_f32(got[~quiet])).all()


@pytest.mark.slow
def test_float32_to_16bit_dense_sweep():
    """Every 17th float32 pattern (253M values, 17 is coprime with every power
    of two, so all low-bit residues meet every exponent); the full 2**32 sweep
    took 9 minutes here for no extra coverage of the rounding logic."""
    step = 17
    chunk = step << 24
    for start in range(0, 1 << 32, chunk):
        u = np.arange(start, min(start + chunk, 1 << 32), step, dtype=np.uint64).astype(np.uint32)
        f = u.view(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            want_bf = f.astype(ml_dtypes.bfloat16).view(np.uint16)
            want_h = f.astype(np.float16).view(np.uint16)
        np.testing.assert_array_equal(_convert.f32_to_bf16(f), want_bf)
        np.testing.assert_array_equal(_convert.f32_to_bf16_blocks(f), want_bf)
        quiet = ~np.isnan(f) | ((u & 0x00400000) != 0)
        np.testing.assert_array_equal(_convert.f32_to_f16(f)[quiet], want_h[quiet])
