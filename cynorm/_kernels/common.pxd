# Shared scalar helpers for every kernel family: the one-member 16-bit
# structs of cn_scalar.h and their conversions (the tests' _convert module),
# build facts for show_config(), the row chunk and the float32 range checks.
#
# Determinism rule: a row reduction is defined as ROW_CHUNK-element chunks,
# each reduced with 16 independent float64 accumulators merged by a fixed
# tree (merge_lanes, storage.pxd.tp), chunk results then added left to right.  Every code path
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
    float64 sum need not."""
    return (a - a == 0.0) & (b - b == 0.0)


cdef inline bint float32_beyond(double v) noexcept nogil:
    """Whether v rounds to +-inf in float32: |v| at least 2**128 - 2**104
    (float32's largest value plus half its last place), inf included.  A
    backward coefficient beyond that makes the float32 pass's outputs inf or
    NaN without raising the overflow flag (cn_fpflags.h); branch-free, so a
    loop over channels vectorizes."""
    return (v >= 3.4028235677973366e38) | (v <= -3.4028235677973366e38)


cdef inline bint float32_coef_lost(double v) noexcept nogil:
    """Whether v, a float64 coefficient of a float32 grad_x pass (r^2 * mean(g
    * xhat)), loses bits when rounded to float32: not 0 and under float32's
    normal range (2**-126), where x * v may still be a normal float32 (data
    near float32's top with rstd near its bottom).  The row then takes the
    float64 pass."""
    return (v != 0.0) & (v < 1.1754943508222875e-38) & (v > -1.1754943508222875e-38)


cdef inline bint float32_products_tiny(double a, double b, Py_ssize_t n) noexcept nogil:
    """Whether b, a float64 sum of n products formed in float32 (dy * (x -
    mean)), is so small (under n * 2**-100) that products under float32's
    normal range, which keep fewer bits, may make up much of it (tiny data or
    tiny gradients).  Not when b is 0: zero gradients, or x equal to its
    mean (a row of one, a constant channel), whose products are exact."""
    return (b != 0.0) & (b < n * 7.888609052210118e-31) & (b > n * -7.888609052210118e-31)


cdef inline bint float32_sums_ok(double a, double b, Py_ssize_t n) noexcept nogil:
    """Whether a backward's float64 sums a (of dy) and b (of n products dy *
    (x - mean)), formed from float32 terms, are as accurate as float64 terms
    would make them: finite, and b not float32_products_tiny.  A row or
    channel that fails is recomputed with float64 terms (exact_centered_dot,
    exact_sums), and from data that held inf or NaN gives the same."""
    return float32_sums_finite(a, b) & (not float32_products_tiny(a, b, n))


cdef inline void exact_sums(double* s, const double* e, Py_ssize_t n) noexcept nogil:
    """Into the fast sums s (of dy, of dy * (x - mean)) the float64-term sums e
    where the fast ones fell short: s[0] only where it is not finite (a NaN
    in x leaves the sum of dy's bits: batch norm returns it), s[1] where it
    is not finite or tiny."""
    if not (s[0] - s[0] == 0.0):
        s[0] = e[0]
    if not (s[1] - s[1] == 0.0) or float32_products_tiny(s[0], s[1], n):
        s[1] = e[1]


cdef inline bint float32_tiny_scale(double mean, double var) noexcept nogil:
    """Whether a row's (or channel's) values lie far below float32's normal
    range, judged by its mean and variance: mean under 2**-100 in magnitude
    (and not 0: a row of zeros is exact in float32) and variance under
    2**-190.  float32 differences and products of such data (and the mean's
    low part) fall under 2**-126, where float32 keeps fewer bits, so the row
    is normalized in float64 (in float32, y of subnormal data was up to 15%
    off)."""
    return ((mean != 0.0) & (mean < 7.888609052210118e-31) & (mean > -7.888609052210118e-31)
            & (var < 6.372367644529809e-58))      # 2**-100, 2**-190


cdef inline bint float32_mean_split_ok(double mean) noexcept nogil:
    """Whether a mean stored as float32 plus the float32 part its rounding
    dropped (low_part) holds it to about 48 bits: nothing was dropped, or
    the mean is at least 2**-100 in magnitude (its low part then a normal
    float32).  For the passes that get a mean without its variance."""
    return ((mean == <double>(<float>mean)) | (mean >= 7.888609052210118e-31)
            | (mean <= -7.888609052210118e-31) | (mean != mean))


cdef inline bint float32_sum_of_squares_ok(double s, Py_ssize_t n) noexcept nogil:
    # float32_squares_ok(s / n) for a sum s of n squares (or products), n > 0
    # (`&`, not `and`: no branch, so loops over rows or columns vectorize)
    return (s >= n * 1.2621774483536189e-29) & (s < INFINITY)     # n * 2**-96
