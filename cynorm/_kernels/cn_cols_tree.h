/* Channels-last group norm's per-column sums over a short chunk of rows,
 * with every lane in registers (float32).
 *
 * group_norm_stats.pxi.tp's cols_moments_ / cols_centered_dot_ add a
 * column's values as a row loop adds a row: LANES = 16 lanes, lane l taking
 * rows l, l + 16, l + 32, l + 48 of each block of 64 as one float32
 * four-term sum, widened and added in float64, then rows l, l + 16 of one
 * block of 32 likewise, then cn_merge.h's fixed tree over the lanes, plus
 * the rows past the last block one by one.  Their loop keeps every
 * column's lanes in memory (16 lanes x 2 sums x 8 bytes a column: 320 KiB
 * on 1280 channels, written and read back).  Here W columns at a time:
 * each lane's sums in registers, folded into the tree as soon as the lane
 * is done (a pair's left operand waits at its level of the tree), so only
 * the data is read and each column's sums are stored once.  The same
 * operations in the same order on every column, so the same bits.
 *
 * For chunks of fewer than 128 rows (the caller's TREE_MAX_ROWS): a block of
 * W columns reads every row of the chunk, and on longer chunks that many
 * rows apart defeat the caches (1.3-1.8x slower than the lanes in memory at
 * 196 and 256 rows, Zen 4).  It does the whole steps of W columns and
 * returns how many columns that was (0 without AVX); the Cython loop does
 * the rest.
 */
#ifndef CN_COLS_TREE_H
#define CN_COLS_TREE_H

#include <stddef.h>
#include <string.h>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && defined(__AVX__)
#include <immintrin.h>
#define CN_HAVE_COLS_TREE 1

#if defined(__AVX512F__)
/* 16 columns: a float32 vector, two float64 halves */
#define CN_CT_W 16
typedef float cn_ct_f __attribute__((vector_size(64)));
typedef double cn_ct_d __attribute__((vector_size(64)));
static inline cn_ct_f cn_ct_load(const float *p) { return (cn_ct_f)_mm512_loadu_ps(p); }
static inline cn_ct_d cn_ct_lo(cn_ct_f v) {
    return (cn_ct_d)_mm512_cvtps_pd(_mm512_castps512_ps256((__m512)v));
}
static inline cn_ct_d cn_ct_hi(cn_ct_f v) {
    return (cn_ct_d)_mm512_cvtps_pd(
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd((__m512)v), 1)));
}
static inline cn_ct_d cn_ct_dload(const double *p) { return (cn_ct_d)_mm512_loadu_pd(p); }
static inline void cn_ct_dstore(double *p, cn_ct_d v) { _mm512_storeu_pd(p, (__m512d)v); }
#else
/* 8 columns */
#define CN_CT_W 8
typedef float cn_ct_f __attribute__((vector_size(32)));
typedef double cn_ct_d __attribute__((vector_size(32)));
static inline cn_ct_f cn_ct_load(const float *p) { return (cn_ct_f)_mm256_loadu_ps(p); }
static inline cn_ct_d cn_ct_lo(cn_ct_f v) {
    return (cn_ct_d)_mm256_cvtps_pd(_mm256_castps256_ps128((__m256)v));
}
static inline cn_ct_d cn_ct_hi(cn_ct_f v) {
    return (cn_ct_d)_mm256_cvtps_pd(_mm256_extractf128_ps((__m256)v, 1));
}
static inline cn_ct_d cn_ct_dload(const double *p) { return (cn_ct_d)_mm256_loadu_pd(p); }
static inline void cn_ct_dstore(double *p, cn_ct_d v) { _mm256_storeu_pd(p, (__m256d)v); }
#endif

/* W columns' two sums, each in two float64 halves */
typedef struct { cn_ct_d s1lo, s1hi, s2lo, s2hi; } cn_ct_sums;

/* one block of `terms` rows (4, 2 or 1) at x (and dy), ld apart, `step`
 * rows between terms: s1 += the terms g, s2 += the terms g * c, c = x - s,
 * g = c (dy NULL) or dy; each sum in float32, widened, added in float64 */
static inline __attribute__((always_inline)) void
cn_ct_block(cn_ct_sums *a, const float *dy, const float *x, cn_ct_f s, ptrdiff_t ld,
            ptrdiff_t step, int terms) {
    cn_ct_f c0 = cn_ct_load(x) - s, g0 = dy ? cn_ct_load(dy) : c0, t1, t2;
    if (terms == 1) {
        t1 = g0;
        t2 = g0 * c0;
    } else {
        cn_ct_f c1 = cn_ct_load(x + step * ld) - s;
        cn_ct_f g1 = dy ? cn_ct_load(dy + step * ld) : c1;
        if (terms == 2) {
            t1 = g0 + g1;
            t2 = g0 * c0 + g1 * c1;
        } else {
            cn_ct_f c2 = cn_ct_load(x + 2 * step * ld) - s;
            cn_ct_f c3 = cn_ct_load(x + 3 * step * ld) - s;
            cn_ct_f g2 = dy ? cn_ct_load(dy + 2 * step * ld) : c2;
            cn_ct_f g3 = dy ? cn_ct_load(dy + 3 * step * ld) : c3;
            t1 = (g0 + g1) + (g2 + g3);
            t2 = (g0 * c0 + g1 * c1) + (g2 * c2 + g3 * c3);
        }
    }
    a->s1lo += cn_ct_lo(t1);
    a->s1hi += cn_ct_hi(t1);
    a->s2lo += cn_ct_lo(t2);
    a->s2hi += cn_ct_hi(t2);
}

static inline cn_ct_sums cn_ct_add(cn_ct_sums a, cn_ct_sums b) {
    cn_ct_sums r = {a.s1lo + b.s1lo, a.s1hi + b.s1hi, a.s2lo + b.s2lo, a.s2hi + b.s2hi};
    return r;
}

/* out1[j] += the tree of the lanes + the rows' tail, out2 likewise, for
 * the columns j < n - n % CN_CT_W of nr rows ld apart at x (and dy; NULL:
 * moments, g = c), centre or shift s[j]; returns that count */
static inline ptrdiff_t cn_cols_sums_tree_f32(const float *dy, const float *x, const float *s,
                                              ptrdiff_t n, ptrdiff_t nr, ptrdiff_t ld,
                                              double *out1, double *out2) {
    enum { L = 16 };
    ptrdiff_t m4 = nr - nr % (4 * L), m2 = nr - nr % (2 * L), j, i, r;
    ptrdiff_t nw = n - n % CN_CT_W;
    for (j = 0; j < nw; j += CN_CT_W) {
        cn_ct_f sj = cn_ct_load(s + j);
        const float *xj = x + j, *dj = dy ? dy + j : NULL;
        cn_ct_sums P[4], v, t;
        int l, k;
#pragma GCC unroll 16
        for (l = 0; l < L; l++) {
            memset(&v, 0, sizeof v);
            for (i = 0; i < m4; i += 4 * L)
                cn_ct_block(&v, dj ? dj + (i + l) * ld : NULL, xj + (i + l) * ld, sj, ld, L, 4);
            if (m2 > m4)
                cn_ct_block(&v, dj ? dj + (m4 + l) * ld : NULL, xj + (m4 + l) * ld, sj, ld, L, 2);
            /* into the tree: at each level, the left operand waits for its
             * right one (cn_merge.h's pairs, in its order) */
            for (k = 0; k < 4; k++) {
                if (!((l >> k) & 1)) {
                    P[k] = v;
                    break;
                }
                v = cn_ct_add(P[k], v);
            }
        }
        memset(&t, 0, sizeof t);
        for (r = m2; r < nr; r++)
            cn_ct_block(&t, dj ? dj + r * ld : NULL, xj + r * ld, sj, ld, 0, 1);
        /* v is the tree (l = 15 carried it to the top) */
        cn_ct_dstore(out1 + j, cn_ct_dload(out1 + j) + (v.s1lo + t.s1lo));
        cn_ct_dstore(out1 + j + CN_CT_W / 2, cn_ct_dload(out1 + j + CN_CT_W / 2) + (v.s1hi + t.s1hi));
        cn_ct_dstore(out2 + j, cn_ct_dload(out2 + j) + (v.s2lo + t.s2lo));
        cn_ct_dstore(out2 + j + CN_CT_W / 2, cn_ct_dload(out2 + j + CN_CT_W / 2) + (v.s2hi + t.s2hi));
    }
    return nw;
}

#else
#define CN_HAVE_COLS_TREE 0
static inline ptrdiff_t cn_cols_sums_tree_f32(const float *dy, const float *x, const float *s,
                                              ptrdiff_t n, ptrdiff_t nr, ptrdiff_t ld,
                                              double *out1, double *out2) {
    (void)dy; (void)x; (void)s; (void)n; (void)nr; (void)ld; (void)out1; (void)out2;
    return 0;
}
#endif

#endif
