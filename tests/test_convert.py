"""The kernels' 16-bit conversions against ml_dtypes and NumPy, bit for bit."""
import ml_dtypes
import numpy as np
import pytest

from cynorm._kernels import _convert

ALL16 = np.arange(1 << 16, dtype=np.uint16)


def test_bfloat16_to_float32_every_pattern():
    got = _convert.bf16_to_f32(ALL16)
    want = ALL16.view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_float16_to_float32_every_pattern():
    got = _convert.f16_to_f32(ALL16)
    want = ALL16.view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


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
        quiet = ~np.isnan(f) | ((u & 0x00400000) != 0)
        np.testing.assert_array_equal(_convert.f32_to_f16(f)[quiet], want_h[quiet])
