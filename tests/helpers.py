"""Input builders and tolerance checks shared by the tests."""
import ml_dtypes
import numpy as np
import pytest

import cynorm

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)

# relative tolerance of one elementwise result, by storage dtype
RTOL = {F64: 1e-12, F32: 2e-6, BF16: 1.6e-2, F16: 2e-3}
# absolute slack: float16's subnormals are spaced 2**-24 apart
ATOL = {F64: 1e-300, F32: 1e-40, BF16: 1e-38, F16: 2.0 ** -24}


def is16(dtype):
    return np.dtype(dtype) in (BF16, F16)


def g_dtype(dtype):
    return F32 if is16(dtype) else np.dtype(dtype)


def stat_dtype(dtype):
    return F32 if is16(dtype) else np.dtype(dtype)


def layout(a, kind):
    """a (C-contiguous) re-laid out as kind: 'C', 'F', or 'strided' (a view
    with a step on the last axis, contiguous in no order)."""
    if kind == "C":
        return np.ascontiguousarray(a)
    if kind == "F":
        return np.asfortranarray(a)
    if kind == "strided":
        if a.ndim == 0:
            return a
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        big[..., ::2] = a
        view = big[..., ::2]
        assert a.size <= 1 or not (view.flags.c_contiguous or view.flags.f_contiguous)
        return view
    raise ValueError(kind)


def make_v(rng, shape, dtype, kind="C"):
    v = rng.standard_normal(shape).astype(dtype)
    return layout(v, kind)


def make_g(rng, shape, dim, dtype, flat=False):
    D = 1 if dim is None else shape[dim]
    gshape = (D,) if flat else (tuple(s if i == dim else 1 for i, s in enumerate(shape))
                                if dim is not None else (1,) * len(shape))
    return (rng.random(gshape) + 0.5).astype(g_dtype(dtype))


def assert_close(got, ref, dtype, scale=None, rtol=None, what=""):
    """|got - ref| <= rtol * scale + atol elementwise (scale defaults to |ref|)."""
    rtol = RTOL[np.dtype(dtype)] if rtol is None else rtol
    atol = ATOL[np.dtype(dtype)]
    got64 = np.asarray(got, dtype=np.float64)
    ref64 = np.asarray(ref, dtype=np.float64)
    assert got64.shape == ref64.shape, (what, got64.shape, ref64.shape)
    scale = np.abs(ref64) if scale is None else np.broadcast_to(scale, ref64.shape)
    with np.errstate(invalid="ignore"):
        err = np.abs(got64 - ref64)
    bound = rtol * scale + atol
    bad = ~((err <= bound) | (got64 == ref64))
    if bad.any():
        i = np.argmax(np.where(bad, err / bound, 0))
        raise AssertionError(
            f"{what}: {bad.sum()} of {bad.size} elements off; worst at flat index {i}: "
            f"got {got64.flat[i]!r}, want {ref64.flat[i]!r} (rtol {rtol})")


def bits(a):
    """The raw bytes of a in C order, for bitwise comparisons (NaN == NaN)."""
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8)


def as_stored(ref, dtype):
    """A float64 reference as the kernels return it in `dtype` (16-bit values
    go through float32, as ml_dtypes rounds; float16 overflows to inf)."""
    if not is16(dtype):
        return ref
    with np.errstate(over="ignore"):
        return np.asarray(ref).astype(np.float32).astype(dtype)


# a serial build (no OpenMP) runs every kernel on one thread: tests of the
# thread count itself skip there
OPENMP_BUILD = bool(cynorm._kernels.load("_runtime").build_info()["openmp"])
needs_openmp = pytest.mark.skipif(not OPENMP_BUILD, reason="a serial build (no OpenMP): "
                                  "the kernels run on one thread whatever is asked")
