/* The hot inner loops of every kernel family, one set per storage type.
 *
 * Cython owns the orchestration (tasks, prange, partial merges); these loops
 * are plain C so their shape is what the vectorizer sees.  They are kept out
 * of line on purpose: inlined into an OpenMP-outlined body GCC 12 turned the
 * 16-bit reductions back into scalar code (measured 3.5x slower).
 *
 * Reductions: LANES independent float64 accumulators merged by a fixed tree.
 * One chain of adds is latency bound; sixteen keep the vector units busy, and
 * float64 keeps float32 rows of any length accurate to far below one float32
 * ulp.  Elementwise ops compute in the storage's math type (float64 for
 * float64, float32 otherwise) and round 16-bit stores to nearest even.
 */
#ifndef CN_ROWS_H
#define CN_ROWS_H

#include <stddef.h>
#include "cn_scalar.h"

#if defined(__GNUC__) || defined(__clang__)
#define CN_NOINLINE __attribute__((noinline))
#else
#define CN_NOINLINE
#endif

#if defined(_MSC_VER) && !defined(__clang__)
#define restrict __restrict
#endif

#define CN_LANES 16

static inline double cn_merge_lanes(const double *a) {
    return ((((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])))
            + (((a[8] + a[9]) + (a[10] + a[11])) + ((a[12] + a[13]) + (a[14] + a[15]))));
}

static inline float cn_load_f32(float x) { return x; }
static inline float cn_store_f32(float x) { return x; }
#define cn_load_bf16 cn_bf16_bits_to_f32
#define cn_store_bf16 cn_f32_to_bf16_bits
#define cn_load_f16 cn_f16_bits_to_f32
#define cn_store_f16 cn_f32_to_f16_bits
static inline double cn_load_f64(double x) { return x; }
static inline double cn_store_f64(double x) { return x; }

/* SFX: name suffix; T: storage type in the signatures; IO: the element type
 * the loops read and write (raw uint16_t bits for the 16-bit types: with the
 * one-member structs GCC left the loops scalar, 4x slower); M: math type. */
#define CN_ROW_OPS(SFX, T, IO, M)                                                    \
CN_NOINLINE static double cn_sumsq_##SFX(const T *xs, ptrdiff_t n) {                 \
    const IO *x = (const IO *)xs;                                                    \
    double acc[CN_LANES] = {0};                                                      \
    IO pad[CN_LANES] = {0};                                                          \
    ptrdiff_t i, m = n - n % CN_LANES;                                               \
    int k;                                                                           \
    for (i = 0; i < m; i += CN_LANES)                                                \
        for (k = 0; k < CN_LANES; k++) {                                             \
            double t = cn_load_##SFX(x[i + k]);                                      \
            acc[k] += t * t;                                                         \
        }                                                                            \
    /* the tail runs as one zero-padded block (adding 0 is exact): a loop  */       \
    /* indexing acc by a variable lane kept the main loop scalar            */       \
    for (k = 0; k < n - m; k++) pad[k] = x[m + k];                                   \
    for (k = 0; k < CN_LANES; k++) {                                                 \
        double t = cn_load_##SFX(pad[k]);                                            \
        acc[k] += t * t;                                                             \
    }                                                                                \
    return cn_merge_lanes(acc);                                                      \
}                                                                                    \
CN_NOINLINE static double cn_dot_##SFX(const T *xs, const T *ys, ptrdiff_t n) {      \
    const IO *x = (const IO *)xs, *y = (const IO *)ys;                               \
    double acc[CN_LANES] = {0};                                                      \
    IO px[CN_LANES] = {0}, py[CN_LANES] = {0};                                       \
    ptrdiff_t i, m = n - n % CN_LANES;                                               \
    int k;                                                                           \
    for (i = 0; i < m; i += CN_LANES)                                                \
        for (k = 0; k < CN_LANES; k++)                                               \
            acc[k] += (double)cn_load_##SFX(x[i + k]) * (double)cn_load_##SFX(y[i + k]); \
    for (k = 0; k < n - m; k++) {                                                    \
        px[k] = x[m + k];                                                            \
        py[k] = y[m + k];                                                            \
    }                                                                                \
    for (k = 0; k < CN_LANES; k++)                                                   \
        acc[k] += (double)cn_load_##SFX(px[k]) * (double)cn_load_##SFX(py[k]);       \
    return cn_merge_lanes(acc);                                                      \
}                                                                                    \
CN_NOINLINE static void cn_colsq_##SFX(double *restrict acc, const T *xs, ptrdiff_t n) { \
    const IO *restrict x = (const IO *)xs;                                           \
    for (ptrdiff_t j = 0; j < n; j++) {                                              \
        double t = cn_load_##SFX(x[j]);                                              \
        acc[j] += t * t;                                                             \
    }                                                                                \
}                                                                                    \
CN_NOINLINE static void cn_coldot_##SFX(double *restrict acc, const T *xs,           \
                                        const T *ys, ptrdiff_t n) {                  \
    const IO *restrict x = (const IO *)xs, *restrict y = (const IO *)ys;             \
    for (ptrdiff_t j = 0; j < n; j++)                                                \
        acc[j] += (double)cn_load_##SFX(x[j]) * (double)cn_load_##SFX(y[j]);         \
}                                                                                    \
CN_NOINLINE static void cn_scale_##SFX(T *outs, const T *xs, ptrdiff_t n, M s) {     \
    IO *restrict out = (IO *)outs;                                                   \
    const IO *restrict x = (const IO *)xs;                                           \
    for (ptrdiff_t j = 0; j < n; j++)                                                \
        out[j] = cn_store_##SFX(cn_load_##SFX(x[j]) * s);                            \
}                                                                                    \
CN_NOINLINE static void cn_scalecols_##SFX(T *outs, const T *xs, ptrdiff_t n,        \
                                           const M *restrict s) {                    \
    IO *restrict out = (IO *)outs;                                                   \
    const IO *restrict x = (const IO *)xs;                                           \
    for (ptrdiff_t j = 0; j < n; j++)                                                \
        out[j] = cn_store_##SFX(cn_load_##SFX(x[j]) * s[j]);                         \
}                                                                                    \
CN_NOINLINE static void cn_axpby_##SFX(T *outs, const T *xs, const T *ys,            \
                                       ptrdiff_t n, M a, M b) {                      \
    IO *restrict out = (IO *)outs;                                                   \
    const IO *restrict x = (const IO *)xs, *restrict y = (const IO *)ys;             \
    for (ptrdiff_t j = 0; j < n; j++)                                                \
        out[j] = cn_store_##SFX(a * cn_load_##SFX(x[j]) - b * cn_load_##SFX(y[j]));  \
}                                                                                    \
CN_NOINLINE static void cn_axpbycols_##SFX(T *outs, const T *xs, const T *ys,        \
                                           ptrdiff_t n, const M *restrict a,         \
                                           const M *restrict b) {                    \
    IO *restrict out = (IO *)outs;                                                   \
    const IO *restrict x = (const IO *)xs, *restrict y = (const IO *)ys;             \
    for (ptrdiff_t j = 0; j < n; j++)                                                \
        out[j] = cn_store_##SFX(a[j] * cn_load_##SFX(x[j]) - b[j] * cn_load_##SFX(y[j])); \
}

CN_ROW_OPS(f32, float, float, float)
CN_ROW_OPS(f64, double, double, double)
CN_ROW_OPS(bf16, cn_bf16, uint16_t, float)
CN_ROW_OPS(f16, cn_f16, uint16_t, float)

#endif
