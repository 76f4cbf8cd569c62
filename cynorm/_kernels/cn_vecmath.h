/* float32 exp and log1p without libm calls, so the loops that call them
 * vectorize: softmax's rows (softmax_rows.pxi.tp) and log_sigmoid
 * (pointwise.pyx.tp).  setup.py compiles those modules with
 * -fno-trapping-math, without which GCC keeps the selects as branches.
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

#endif /* CN_VECMATH_H */
