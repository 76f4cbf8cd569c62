# Shared scalar helpers for every kernel family: the one-member 16-bit
# structs of cn_scalar.h and their conversions (the tests' _convert module),
# build facts for show_config(), the row chunk and the float32 range checks.
#
# Determinism rule: a row reduction is defined as ROW_CHUNK-element chunks,
# each reduced with 16 independent float64 accumulators merged by a fixed
# tree (cn_rows.h), chunk results then added left to right.  Every code path
# (fused or not, any thread count) computes exactly that expression.

from libc.math cimport INFINITY

cdef extern from "cn_scalar.h" nogil:
    ctypedef struct cn_bf16:
        unsigned short bits
    ctypedef struct cn_f16:
        unsigned short bits
    float cn_bf16_to_f32(cn_bf16 h)
    cn_bf16 cn_f32_to_bf16(float f)
    float cn_f16_to_f32(cn_f16 h)
    cn_f16 cn_f32_to_f16(float f)
    const char* CN_SIMD_LEVEL
    const char* CN_COMPILER
    const char* CN_F16_IMPL
    int CN_OPENMP

cdef enum:
    # Elements per row chunk: bounds the serial part of a long row and fixes
    # where partial sums meet, independently of the thread count.
    ROW_CHUNK = 32768


cdef inline bint float32_squares_ok(double mean_square) noexcept nogil:
    """Whether a mean of squares formed in float32 (a variance plus eps, or a
    sum of squares over its count) is as accurate as float64 squares would
    make it: finite (no square or shifted value overflowed) and at least
    2**-96 (a square below float32's normal range, 2**-126, is off by at most
    that much: 2**-30 of the result).  NaN is not ok.  Rows and channels that
    fail are recomputed with float64 squares: data beyond about 1e19 or
    below 1e-19 in magnitude."""
    return float32_sum_of_squares_ok(mean_square, 1)


cdef inline bint float32_sums_finite(double a, double b) noexcept nogil:
    """Whether two float64 sums of terms formed in float32 (a backward's sum
    of dy and sum of dy * (x - mean)) are finite.  An inf or NaN there, from
    finite data, means a float32 term or partial sum overflowed although the
    float64 sum need not: the row or channel is recomputed with float64
    terms (from data that held inf or NaN, with the same result)."""
    return (a - a == 0.0) & (b - b == 0.0)


cdef inline bint float32_tiny_scale(double first, double mean, double var, double s1,
                                    double s2) noexcept nogil:
    """Whether a row's (or channel's) values all lie far below float32's
    normal range, judged by its first value, its mean and variance (and the
    shifted sums s1, s2 they came from): all under 2**-100 in magnitude (var
    under 2**-190).  float32 differences and products of such data (and the
    mean's low part) fall under 2**-126, where float32 keeps fewer bits, so
    the row is normalized in float64 (in float32, y of subnormal data was up
    to 15% off).  A row of zeros is not tiny: float32 gives it exactly."""
    return ((first < 7.888609052210118e-31) & (first > -7.888609052210118e-31)
            & (mean < 7.888609052210118e-31) & (mean > -7.888609052210118e-31)
            & (var < 6.372367644529809e-58)
            & ((first != 0.0) | (s1 != 0.0) | (s2 != 0.0)))      # 2**-100, 2**-190


cdef inline bint float32_sum_of_squares_ok(double s, Py_ssize_t n) noexcept nogil:
    # float32_squares_ok(s / n) for a sum s of n squares (or products), n > 0
    # (`&`, not `and`: no branch, so loops over rows or columns vectorize)
    return (s >= n * 1.2621774483536189e-29) & (s < INFINITY)     # n * 2**-96
