/* float32 exp for the segmented softmax (segments.pyx.tp): no libm call,
 * so the loop that calls it vectorizes (setup.py compiles that module with
 * -fno-trapping-math, without which GCC keeps cn_expf's selects as
 * branches).
 */
#ifndef CN_SEGMENTS_H
#define CN_SEGMENTS_H

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

#endif /* CN_SEGMENTS_H */
