/* Row kernels of the segmented ops (segments.pyx): softmax of one row and
 * the sum of one row, written so that GCC vectorizes them without
 * -ffast-math:
 *   - float32 exp is cn_expf below (no libm call, so the loop vectorizes;
 *     setup.py compiles this module with -fno-trapping-math, without which
 *     GCC keeps cn_expf's selects as branches);
 *   - maxima and sums go into CN_SEG_LANES fixed lanes merged in a fixed
 *     order, so the result does not depend on the vector width.
 */
#ifndef CN_SEGMENTS_H
#define CN_SEGMENTS_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stddef.h>

#define CN_SEG_LANES 16

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

/* max over a row, NaN-propagating (a NaN anywhere gives NaN) */
#define CN_SEG_ROW_MAX(T, NAME)                                                  \
static inline T NAME(const T* x, ptrdiff_t n) {                                  \
    T lane[CN_SEG_LANES];                                                        \
    int nan = 0;                                                                 \
    for (int k = 0; k < CN_SEG_LANES; k++) lane[k] = -INFINITY;                   \
    ptrdiff_t j = 0;                                                             \
    for (; j + CN_SEG_LANES <= n; j += CN_SEG_LANES)                             \
        for (int k = 0; k < CN_SEG_LANES; k++) {                                 \
            T v = x[j + k];                                                      \
            lane[k] = v > lane[k] ? v : lane[k];                                 \
            nan |= v != v;                                                       \
        }                                                                        \
    T top = -INFINITY;                                                           \
    for (int k = 0; k < CN_SEG_LANES; k++) top = lane[k] > top ? lane[k] : top;  \
    for (; j < n; j++) { top = x[j] > top ? x[j] : top; nan |= x[j] != x[j]; }   \
    return nan ? (T)NAN : top;                                                   \
}

/* float64 sum of a row in fixed lanes */
#define CN_SEG_ROW_SUM(T, NAME)                                                  \
static inline double NAME(const T* x, ptrdiff_t n) {                             \
    double lane[CN_SEG_LANES];                                                   \
    for (int k = 0; k < CN_SEG_LANES; k++) lane[k] = 0.0;                        \
    ptrdiff_t j = 0;                                                             \
    for (; j + CN_SEG_LANES <= n; j += CN_SEG_LANES)                             \
        for (int k = 0; k < CN_SEG_LANES; k++) lane[k] += (double)x[j + k];      \
    double s = 0.0;                                                              \
    for (int k = 0; k < CN_SEG_LANES; k++) s += lane[k];                         \
    for (; j < n; j++) s += (double)x[j];                                        \
    return s;                                                                    \
}

/* float64 sum of products of two rows in fixed lanes */
#define CN_SEG_ROW_DOT(T, NAME)                                                  \
static inline double NAME(const T* x, const T* y, ptrdiff_t n) {                 \
    double lane[CN_SEG_LANES];                                                   \
    for (int k = 0; k < CN_SEG_LANES; k++) lane[k] = 0.0;                        \
    ptrdiff_t j = 0;                                                             \
    for (; j + CN_SEG_LANES <= n; j += CN_SEG_LANES)                             \
        for (int k = 0; k < CN_SEG_LANES; k++)                                   \
            lane[k] += (double)x[j + k] * (double)y[j + k];                      \
    double s = 0.0;                                                              \
    for (int k = 0; k < CN_SEG_LANES; k++) s += lane[k];                         \
    for (; j < n; j++) s += (double)x[j] * (double)y[j];                         \
    return s;                                                                    \
}

CN_SEG_ROW_MAX(float, cn_seg_max_f32)
CN_SEG_ROW_MAX(double, cn_seg_max_f64)
CN_SEG_ROW_SUM(float, cn_seg_sum_f32)
CN_SEG_ROW_SUM(double, cn_seg_sum_f64)
CN_SEG_ROW_DOT(float, cn_seg_dot_f32)
CN_SEG_ROW_DOT(double, cn_seg_dot_f64)

static inline void cn_seg_softmax_f32(const float* x, float* y, ptrdiff_t n) {
    float top = cn_seg_max_f32(x, n);
    for (ptrdiff_t j = 0; j < n; j++) y[j] = cn_expf(x[j] - top);
    float inv = (float)(1.0 / cn_seg_sum_f32(y, n));
    for (ptrdiff_t j = 0; j < n; j++) y[j] *= inv;
}

static inline void cn_seg_softmax_f64(const double* x, double* y, ptrdiff_t n) {
    double top = cn_seg_max_f64(x, n);
    for (ptrdiff_t j = 0; j < n; j++) y[j] = exp(x[j] - top);
    double inv = 1.0 / cn_seg_sum_f64(y, n);
    for (ptrdiff_t j = 0; j < n; j++) y[j] *= inv;
}

static inline void cn_seg_softmax_backward_f32(const float* g, const float* y, float* out,
                                               ptrdiff_t n) {
    float s = (float)cn_seg_dot_f32(g, y, n);
    for (ptrdiff_t j = 0; j < n; j++) out[j] = y[j] * (g[j] - s);
}

static inline void cn_seg_softmax_backward_f64(const double* g, const double* y, double* out,
                                               ptrdiff_t n) {
    double s = cn_seg_dot_f64(g, y, n);
    for (ptrdiff_t j = 0; j < n; j++) out[j] = y[j] * (g[j] - s);
}

#endif /* CN_SEGMENTS_H */
