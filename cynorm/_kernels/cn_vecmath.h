/* float32 exp and log1p without libm calls, so the loops that call them
 * vectorize: softmax's rows (softmax_rows.pxi.tp) and log_sigmoid
 * (pointwise.pyx.tp).  setup.py compiles those modules with
 * -fno-trapping-math, without which GCC keeps the selects as branches.
 * And a row's NaN-propagating maximum in vector lanes, which GCC does not
 * vectorize from a scalar loop (it will not SLP a compare-and-select).
 */
#ifndef CN_VECMATH_H
#define CN_VECMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stddef.h>

/* exp(x) for float32 to about 1 ulp: x = n ln2 + r (Cody-Waite split of ln2),
 * a degree-7 polynomial for exp(r) on |r| <= ln2/2 (Cephes' coefficients),
 * times 2^n built in the exponent bits.  Below -87.3 the result is 0 (the
 * float32 normal range ends there; exp(-inf) = 0 as softmax needs); NaN
 * stays NaN.  Meant for x <= 88 (softmax feeds it x - max <= 0): above that
 * 2^n leaves the float range and the result is inf. */
static inline float cn_expf(float x) {
    const float log2e = 1.44269504088896341f;
    /* !(x >= -87.3f), not x < -87.3f: NaN takes the low end too, so n stays
     * in range (converting NaN to int, and shifting the negative result,
     * would be undefined); one unordered compare, as before */
    float xc = !(x >= -87.3f) ? -87.3f : (x > 88.7f ? 88.7f : x);
    float t = xc * log2e;
    /* nearbyintf, not a select on t's sign: GCC vectorizes it (roundps) */
    int32_t n = (int32_t)nearbyintf(t);
    float fn = (float)n;
    float r = (xc - fn * 0.693359375f) - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t bits = (n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float e = p * scale;
    e = !(x >= -87.3f) ? 0.0f : e;
    e = x > 88.7f ? INFINITY : e;
    return x != x ? x : e;
}

/* log1p(z) for float32 z in [0, 1] (log_sigmoid's log1p(exp(-|x|))) to
 * about 2 ulp: u = 1 + z rounded, c = z - (u - 1) what the rounding dropped
 * (exact: u - 1 is exact for u in [1, 2]), log1p(z) = log(u) + c / u.  log(u)
 * by Cephes' logf: u = m 2^e with m in [sqrt(1/2), sqrt(2)], a degree-8
 * polynomial in m - 1, e ln2 in two parts.  NaN stays NaN. */
static inline float cn_log1pf_unit(float z) {
    float u = 1.0f + z;
    float c = (z - (u - 1.0f)) / u;
    int big = u > 1.41421356f;
    float m = big ? u * 0.5f : u;
    float e = big ? 1.0f : 0.0f;
    float x = m - 1.0f;
    float x2 = x * x;
    float p = 7.0376836292e-2f;
    p = p * x - 1.1514610310e-1f;
    p = p * x + 1.1676998740e-1f;
    p = p * x - 1.2420140846e-1f;
    p = p * x + 1.4249322787e-1f;
    p = p * x - 1.6668057665e-1f;
    p = p * x + 2.0000714765e-1f;
    p = p * x - 2.4999993993e-1f;
    p = p * x + 3.3333331174e-1f;
    float y = x * x2 * p;
    y = y + e * -2.12194440e-4f;
    y = y - 0.5f * x2;
    float r = x + y;
    r = r + e * 0.693359375f;
    return r + c;
}

/* The maximum of x[0..n), NaN if any x is NaN.  Four vectors of lanes (a
 * compare and a select per vector: four chains keep the pipes busy), each
 * lane taking a value that is greater or NaN (a NaN stays: nothing compares
 * greater than it); the vectors, then the halves of one, are merged the same
 * way, so a short row costs a few vector steps.  The maximum is exact, so the
 * lane width (the widest vector the target has; GCC and clang vector
 * extensions) never changes the result.  Elsewhere, value by value. */
#if defined(__AVX512F__)
#define CN_VEC_BYTES 64
#elif defined(__AVX__)
#define CN_VEC_BYTES 32
#else
#define CN_VEC_BYTES 16
#endif

#if defined(__GNUC__) || defined(__clang__)
/* a = the greater of a and b, or NaN where either is NaN */
#define CN_TAKE_MAX(mask, a, b)                                                 \
    do {                                                                       \
        mask m_ = ((b) > (a)) | ((b) != (b));                                  \
        (a) = (__typeof__(a))(((mask)(b) & m_) | ((mask)(a) & ~m_));           \
    } while (0)
#define CN_ROW_MAX(NAME, T, IT)                                                 \
static inline T NAME(const T *x, ptrdiff_t n) {                                \
    typedef T vec __attribute__((vector_size(CN_VEC_BYTES)));                  \
    typedef IT mask __attribute__((vector_size(CN_VEC_BYTES)));                \
    enum { L = CN_VEC_BYTES / sizeof(T), W = 4 };                              \
    vec lane[W], v;                                                            \
    T half[L], top = -INFINITY;                                                \
    ptrdiff_t j = 0;                                                           \
    int k, w, h;                                                               \
    if (n < L) {                                                               \
        for (; j < n; j++)                                                     \
            top = (x[j] > top) | (x[j] != x[j]) ? x[j] : top;                  \
        return top != top ? (T)NAN : top;                                      \
    }                                                                          \
    for (w = 0; w < W; w++)                                                    \
        for (k = 0; k < L; k++)                                                \
            lane[w][k] = -INFINITY;                                            \
    for (; j + W * L <= n; j += W * L) {                                       \
        for (w = 0; w < W; w++) {                                              \
            memcpy(&v, x + j + w * L, sizeof v);                               \
            CN_TAKE_MAX(mask, lane[w], v);                                     \
        }                                                                      \
    }                                                                          \
    for (; j + L <= n; j += L) {                                               \
        memcpy(&v, x + j, sizeof v);                                           \
        CN_TAKE_MAX(mask, lane[0], v);                                         \
    }                                                                          \
    if (j < n) {    /* the last L values, some seen already: max is idempotent */ \
        memcpy(&v, x + n - L, sizeof v);                                       \
        CN_TAKE_MAX(mask, lane[1], v);                                         \
    }                                                                          \
    CN_TAKE_MAX(mask, lane[0], lane[2]);                                       \
    CN_TAKE_MAX(mask, lane[1], lane[3]);                                       \
    CN_TAKE_MAX(mask, lane[0], lane[1]);                                       \
    memcpy(half, &lane[0], sizeof half);                                       \
    for (h = L / 2; h > 0; h /= 2)                                             \
        for (k = 0; k < h; k++)                                                \
            half[k] = (half[k + h] > half[k]) | (half[k + h] != half[k + h])   \
                      ? half[k + h] : half[k];                                 \
    return half[0] != half[0] ? (T)NAN : half[0];                              \
}
#else
#define CN_ROW_MAX(NAME, T, IT)                                                 \
static inline T NAME(const T *x, ptrdiff_t n) {                                \
    T top = -INFINITY;                                                         \
    int nan = 0;                                                               \
    ptrdiff_t j;                                                               \
    for (j = 0; j < n; j++) {                                                  \
        top = x[j] > top ? x[j] : top;                                         \
        nan |= x[j] != x[j];                                                   \
    }                                                                          \
    return nan ? (T)NAN : top;                                                 \
}
#endif
CN_ROW_MAX(cn_row_max_f32, float, int32_t)
CN_ROW_MAX(cn_row_max_f64, double, int64_t)
#undef CN_ROW_MAX
#undef CN_TAKE_MAX

#endif /* CN_VECMATH_H */
