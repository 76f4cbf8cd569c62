/* bfloat16 column sums in eight AVX2 lanes: weight norm's column reductions.
 *
 * weight_norm.pyx.tp's col_block adds, for each column k of a block of rows
 * C elements apart, the rows a pair at a time: the pair's two terms in
 * float32, their float32 sum widened and added to acc[k] in float64, pair
 * after pair.  GCC compiles the Cython loops (weight_norm_loops.pxi.tp) with the
 * bfloat16 values widened one by one; these do the same operations, in the
 * same order, eight columns a step, so acc holds the same bits.  They take
 * the whole steps only and return how many columns that was (0 without
 * AVX2): the Cython loop does the rest, so the scalar arithmetic is written
 * once.  A column sum is stored in acc between calls (float64 to float64,
 * exact), so the rows per call do not change the bits either.  The kernels
 * call them where cn_bf16_regs_on().
 */
#ifndef CN_BF16_COLS_H
#define CN_BF16_COLS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "cn_bf16_regs.h"

#if CN_HAVE_BF16_REGS
/* eight float64 column sums, acc[k..k+8], in two vectors */
typedef struct { cn_v4d lo, hi; } cn_acc8;

static inline cn_acc8 cn_acc8_load(const double *acc) {
    cn_acc8 s = {cn_v4_f64(acc), cn_v4_f64(acc + 4)};
    return s;
}

static inline void cn_acc8_store(double *acc, cn_acc8 s) {
    memcpy(acc, &s.lo, sizeof s.lo);
    memcpy(acc + 4, &s.hi, sizeof s.hi);
}

/* s += the eight float32 pair sums, widened to float64 */
static inline void cn_acc8_add(cn_acc8 *s, cn_v8f pairs) {
    s->lo += (cn_v4d)_mm256_cvtps_pd(_mm256_castps256_ps128((__m256)pairs));
    s->hi += (cn_v4d)_mm256_cvtps_pd(_mm256_extractf128_ps((__m256)pairs, 1));
}
#endif

/* acc[k] += x0[k]^2 + x1[k]^2, then x2, x3, ... x6, x7 (rows C apart), each
 * pair's squares summed in float32, for the columns k < n - n % 8; returns
 * that count.  Eight rows: their squares fit the registers with acc loaded
 * and stored once */
static inline ptrdiff_t cn_col_sumsq8_bf16(double *acc, const uint16_t *x, ptrdiff_t C,
                                           ptrdiff_t n) {
    ptrdiff_t k = 0;
#if CN_HAVE_BF16_REGS
    for (; k + 8 <= n; k += 8) {
        cn_acc8 s = cn_acc8_load(acc + k);
        for (ptrdiff_t r = 0; r < 8; r += 2) {
            cn_v8f a = cn_v8_bf16(x + r * C + k), b = cn_v8_bf16(x + (r + 1) * C + k);
            cn_acc8_add(&s, a * a + b * b);
        }
        cn_acc8_store(acc + k, s);
    }
#else
    (void)acc; (void)x; (void)C; (void)n;
#endif
    return k;
}

/* acc[k] += x0[k] * y0[k] + x1[k] * y1[k], then rows 2 and 3 (rows C
 * apart), each pair's products summed in float32, for the columns
 * k < n - n % 8; returns that count.  Four rows of each input (eight row
 * pointers: sixteen would not fit the registers) */
static inline ptrdiff_t cn_col_dot4_bf16(double *acc, const uint16_t *x, const uint16_t *y,
                                         ptrdiff_t C, ptrdiff_t n) {
    ptrdiff_t k = 0;
#if CN_HAVE_BF16_REGS
    for (; k + 8 <= n; k += 8) {
        cn_acc8 s = cn_acc8_load(acc + k);
        for (ptrdiff_t r = 0; r < 4; r += 2) {
            cn_v8f a = cn_v8_bf16(x + r * C + k) * cn_v8_bf16(y + r * C + k);
            cn_v8f b = cn_v8_bf16(x + (r + 1) * C + k) * cn_v8_bf16(y + (r + 1) * C + k);
            cn_acc8_add(&s, a + b);
        }
        cn_acc8_store(acc + k, s);
    }
#else
    (void)acc; (void)x; (void)y; (void)C; (void)n;
#endif
    return k;
}

#endif
