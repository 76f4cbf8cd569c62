/* float32 exp and log1p without libm calls, so the loops that call them
 * vectorize: softmax's rows (softmax_rows.pxi.tp) and log_sigmoid
 * (pointwise.pyx.tp).  setup.py compiles those modules with
 * -fno-trapping-math, without which GCC keeps the selects as branches.
 * And a float32 row's NaN-propagating maximum in vector lanes.
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
     * would be undefined); one unordered compare */
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

/* The maximum of float32 x[0..n), NaN if any x is NaN.  GCC does not
 * vectorize this from a scalar loop (it will not SLP a compare-and-select),
 * so it is written in vector lanes (GCC and clang vector extensions, the
 * widest vector the target has): four vectors of lanes keep the pipes busy,
 * each lane taking a value that is greater or NaN (a NaN stays: nothing
 * compares greater than it); the vectors, then the halves of one, merge the
 * same way.  The maximum is exact, so the width never changes the result.
 * Elsewhere, value by value. */
#if defined(__AVX512F__)
#define CN_MAX_LANES 16
#elif defined(__AVX__)
#define CN_MAX_LANES 8
#else
#define CN_MAX_LANES 4
#endif

static inline float cn_greater_or_nan(float a, float b) {
    return (b > a) | (b != b) ? b : a;
}

static inline float cn_row_max_f32(const float *x, ptrdiff_t n) {
    ptrdiff_t j = 0;
    float top = -INFINITY;
    int k, w, h;
#if defined(__GNUC__) || defined(__clang__)
    typedef float vec __attribute__((vector_size(4 * CN_MAX_LANES)));
    typedef int32_t mask __attribute__((vector_size(4 * CN_MAX_LANES)));
    vec lane[4], v;
    mask m;
    float half[CN_MAX_LANES];
    if (n >= CN_MAX_LANES) {
        for (k = 0; k < CN_MAX_LANES; k++)
            half[k] = -INFINITY;
        for (w = 0; w < 4; w++)
            memcpy(&lane[w], half, sizeof half);
        for (; j + 4 * CN_MAX_LANES <= n; j += 4 * CN_MAX_LANES) {
            for (w = 0; w < 4; w++) {
                memcpy(&v, x + j + w * CN_MAX_LANES, sizeof v);
                m = (v > lane[w]) | (v != v);
                lane[w] = (vec)(((mask)v & m) | ((mask)lane[w] & ~m));
            }
        }
        for (; j + CN_MAX_LANES <= n; j += CN_MAX_LANES) {
            memcpy(&v, x + j, sizeof v);
            m = (v > lane[0]) | (v != v);
            lane[0] = (vec)(((mask)v & m) | ((mask)lane[0] & ~m));
        }
        if (j < n) {    /* the last lanes' worth, some seen already: max is idempotent */
            memcpy(&v, x + n - CN_MAX_LANES, sizeof v);
            m = (v > lane[1]) | (v != v);
            lane[1] = (vec)(((mask)v & m) | ((mask)lane[1] & ~m));
            j = n;
        }
        for (w = 1; w < 4; w++) {
            m = (lane[w] > lane[0]) | (lane[w] != lane[w]);
            lane[0] = (vec)(((mask)lane[w] & m) | ((mask)lane[0] & ~m));
        }
        memcpy(half, &lane[0], sizeof half);
        for (h = CN_MAX_LANES / 2; h > 0; h /= 2)
            for (k = 0; k < h; k++)
                half[k] = cn_greater_or_nan(half[k], half[k + h]);
        top = half[0];
    }
#endif
    for (; j < n; j++)
        top = cn_greater_or_nan(top, x[j]);
    return top != top ? NAN : top;
}

#endif /* CN_VECMATH_H */
