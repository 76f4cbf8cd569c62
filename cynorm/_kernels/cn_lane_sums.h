/* Group norm's sums with their float64 lanes in vector registers: short
 * float32 and bfloat16 channel rows two at a time (channels first) and the
 * float32 columns of a short sample (channels last).
 *
 * Both sum as group_norm_stats.pxi.tp's loops (and stats_loops.pxi.tp's
 * row loops) do: 16 lanes, lane l taking elements l, l + 16, l + 32, l + 48
 * (bfloat16: 2l, 2l + 1, 2l + 32, 2l + 33) of each block of 64 as one
 * float32 four-term sum (of g and of g * c,
 * c = x - shift, g = c for moments or dy for gradient sums), widened and
 * added to the lane in float64; then elements l, l + 16 of one block of 32
 * likewise; then cn_merge.h's fixed tree over the lanes, plus the elements
 * past the last block one by one.  The same operations in the same order,
 * so the same bits; each returns how many rows or columns it did (whole
 * steps, 0 without AVX) and the Cython loops do the rest.
 *
 * cn_row_pairs_sums_f32 / _bf16: two consecutive short rows at a time (the
 * rows of a group's channels), as row_pair_centered_dot_ /
 * row_pair_moments_ (float32) and instance_short_rows_sums_ (bfloat16)
 * sum them, with the call, the lane arrays' set-up and the per-pair
 * branches out of the loop over the pairs ((2, 1280, 8, 8) NCHW backward
 * 1.23x float32, 1.14x bfloat16).
 *
 * cn_cols_sums_tree_f32: the columns of rows ld apart (a channels-last
 * sample; an element is a row of it), as cols_moments_ / cols_centered_dot_,
 * which keep every column's lanes in memory (16 lanes x 2 sums x 8 bytes a
 * column: 320 KiB on 1280 channels, written and read back).  Here W columns
 * at a time: each lane's sums in registers, folded into the tree as soon as
 * the lane is done (a pair's left operand waits at its level of the tree),
 * so only the data is read.  For chunks of fewer than 128 rows (the
 * caller's TREE_MAX_ROWS): a block of W columns reads every row of the
 * chunk, and on longer chunks that many rows apart defeat the caches
 * (1.3-1.8x slower than the lanes in memory at 196 and 256 rows, Zen 4).
 */
#ifndef CN_LANE_SUMS_H
#define CN_LANE_SUMS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "cn_scalar.h"
#include "cn_memory.h"
#include "cn_merge.h"

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && defined(__AVX__)
#include <immintrin.h>
#define CN_HAVE_LANE_SUMS 1

#if defined(__AVX512F__)
/* W = 16 float32 values a vector (columns, or a row's lanes), two float64 halves */
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
/* W = 8 (AVX) */
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

/* W columns' (or lanes') two sums, each in two float64 halves */
typedef struct { cn_ct_d s1lo, s1hi, s2lo, s2hi; } cn_ct_sums;

/* a->s1 += the float32 sum of the terms g[q], a->s2 += that of the
 * g[q] * c[q] (q < terms: 1, 2 or 4, paired as the row loops pair them),
 * each widened to float64 */
static inline __attribute__((always_inline)) void
cn_ct_add_terms(cn_ct_sums *a, const cn_ct_f *c, const cn_ct_f *g, int terms) {
    cn_ct_f t1, t2;
    if (terms == 1) {
        t1 = g[0];
        t2 = g[0] * c[0];
    } else if (terms == 2) {
        t1 = g[0] + g[1];
        t2 = g[0] * c[0] + g[1] * c[1];
    } else {
        t1 = (g[0] + g[1]) + (g[2] + g[3]);
        t2 = (g[0] * c[0] + g[1] * c[1]) + (g[2] * c[2] + g[3] * c[3]);
    }
    a->s1lo += cn_ct_lo(t1);
    a->s1hi += cn_ct_hi(t1);
    a->s2lo += cn_ct_lo(t2);
    a->s2hi += cn_ct_hi(t2);
}

/* one block of `terms` rows (4, 2 or 1) at x (and dy), ld apart, `step`
 * rows between terms, into a: c = x - s, g = c (dy NULL) or dy */
static inline __attribute__((always_inline)) void
cn_ct_block(cn_ct_sums *a, const float *dy, const float *x, cn_ct_f s, ptrdiff_t ld,
            ptrdiff_t step, int terms) {
    cn_ct_f c[4], g[4];
    c[0] = cn_ct_load(x) - s;
    g[0] = dy ? cn_ct_load(dy) : c[0];
    if (terms > 1) {
        c[1] = cn_ct_load(x + step * ld) - s;
        g[1] = dy ? cn_ct_load(dy + step * ld) : c[1];
    }
    if (terms > 2) {
        c[2] = cn_ct_load(x + 2 * step * ld) - s;
        c[3] = cn_ct_load(x + 3 * step * ld) - s;
        g[2] = dy ? cn_ct_load(dy + 2 * step * ld) : c[2];
        g[3] = dy ? cn_ct_load(dy + 3 * step * ld) : c[3];
    }
    cn_ct_add_terms(a, c, g, terms);
}

static inline cn_ct_sums cn_ct_add(cn_ct_sums a, cn_ct_sums b) {
    cn_ct_sums r = {a.s1lo + b.s1lo, a.s1hi + b.s1hi, a.s2lo + b.s2lo, a.s2hi + b.s2hi};
    return r;
}

/* out1[j] += the tree of the lanes + the rows' tail, out2 likewise, for
 * the columns j < n - n % CN_CT_W of nr rows ld apart at x (and dy; NULL:
 * moments, g = c), centre or shift s[j]; returns that count */
static inline ptrdiff_t cn_cols_tree_run(const float *dy, const float *x, const float *s,
                                         ptrdiff_t n, ptrdiff_t nr, ptrdiff_t ld, double *out1,
                                         double *out2) {
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

/* a row's 16 lanes: W lanes a vector, 16 / W vectors (cn_ct_sums each) */
enum { CN_RP_L = 16, CN_RP_V = CN_RP_L / CN_CT_W };

/* W bfloat16 pairs (2W elements from p) as two float32 vectors, each
 * pair's first element and its second (cn_scalar.h's cn_bf16_first /
 * cn_bf16_second, little-endian) */
typedef uint32_t cn_ct_u __attribute__((vector_size(CN_CT_W * 4)));
static inline void cn_ct_pairs(const uint16_t *p, cn_ct_f *first, cn_ct_f *second) {
    cn_ct_u u;
    memcpy(&u, p, sizeof u);
    *first = (cn_ct_f)(u << 16);
    *second = (cn_ct_f)(u & 0xffff0000u);
}

/* a row's terms c0 .. c(terms-1) of lanes v * W .. v * W + W - 1 (x - s),
 * the lanes' elements of the block at p: float32, lane l's elements l,
 * l + 16, l + 32, l + 48; bfloat16, its elements 2l, 2l + 1, 2l + 32,
 * 2l + 33 (stats_loops.pxi.tp's row loops) */
static inline __attribute__((always_inline)) void
cn_rp_terms(cn_ct_f *c, const void *p, int v, int terms, int bf16) {
    if (bf16) {
        const uint16_t *h = (const uint16_t *)p + 2 * v * CN_CT_W;
        cn_ct_pairs(h, &c[0], &c[1]);
        if (terms == 4)
            cn_ct_pairs(h + 2 * CN_RP_L, &c[2], &c[3]);
    } else {
        const float *f = (const float *)p + v * CN_CT_W;
        for (int q = 0; q < terms; q++)
            c[q] = cn_ct_load(f + q * CN_RP_L);
    }
}

/* one row's block of `terms` (4 or 2) lanes' terms at x (and dy) into
 * a[0:CN_RP_V]: c = x - s, g = c (dy NULL) or dy */
static inline __attribute__((always_inline)) void
cn_rp_block(cn_ct_sums *a, const void *dy, const void *x, float s, int terms, int bf16) {
    for (int v = 0; v < CN_RP_V; v++) {
        cn_ct_f c[4], g[4];
        cn_rp_terms(c, x, v, terms, bf16);
        for (int q = 0; q < terms; q++)
            c[q] = c[q] - s;
        if (dy)
            cn_rp_terms(g, dy, v, terms, bf16);
        else
            for (int q = 0; q < terms; q++)
                g[q] = c[q];
        cn_ct_add_terms(&a[v], c, g, terms);
    }
}

/* the lane arrays o1[0:16], o2[0:16] of a row's two sums */
static inline void cn_rp_lanes(double *o1, double *o2, const cn_ct_sums *a) {
    for (int v = 0; v < CN_RP_V; v++) {
        cn_ct_dstore(o1 + v * CN_CT_W, a[v].s1lo);
        cn_ct_dstore(o1 + v * CN_CT_W + CN_CT_W / 2, a[v].s1hi);
        cn_ct_dstore(o2 + v * CN_CT_W, a[v].s2lo);
        cn_ct_dstore(o2 + v * CN_CT_W + CN_CT_W / 2, a[v].s2hi);
    }
}

static inline __attribute__((always_inline)) float cn_rp_value(const void *p, ptrdiff_t i,
                                                               int bf16) {
    return bf16 ? cn_bf16_bits_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* the first rows - rows % 2 of `rows` consecutive rows of n at x (and dy;
 * NULL: moments), row p shifted by (float)center[p * cstep]: s1[p] = its
 * sum of g, s2[p] its sum of g * c; returns how many rows that was.
 * bfloat16 or float32 storage (bf16), float32 arithmetic either way */
static inline __attribute__((always_inline)) ptrdiff_t
cn_rp_run(const void *dy, const void *x, const double *center, ptrdiff_t cstep, ptrdiff_t n,
          ptrdiff_t rows, double *s1, double *s2, int bf16) {
    ptrdiff_t isz = bf16 ? 2 : 4, m4 = n - n % (4 * CN_RP_L), m2 = n - n % (2 * CN_RP_L), p, i;
    const char *xb = (const char *)x, *db = (const char *)dy;
    for (p = 0; p + 2 <= rows; p += 2) {
        const char *zb = xb + n * isz, *eb = db ? db + n * isz : NULL;
        float s = (float)center[p * cstep], t = (float)center[(p + 1) * cstep];
        cn_ct_sums a[CN_RP_V], b[CN_RP_V];
        double ta1 = 0.0, ta2 = 0.0, tb1 = 0.0, tb2 = 0.0, m[4];
        double la[4][CN_RP_L];
        memset(a, 0, sizeof a);
        memset(b, 0, sizeof b);
        for (i = 0; i < m4; i += 4 * CN_RP_L) {
            cn_prefetch_read_ahead(zb, i, n, n, isz, CN_BLOCK * isz);
            if (eb)
                cn_prefetch_read_ahead(eb, i, n, n, isz, CN_BLOCK * isz);
            cn_rp_block(a, db ? db + i * isz : NULL, xb + i * isz, s, 4, bf16);
            cn_rp_block(b, eb ? eb + i * isz : NULL, zb + i * isz, t, 4, bf16);
        }
        if (i < m2) {
            cn_rp_block(a, db ? db + i * isz : NULL, xb + i * isz, s, 2, bf16);
            cn_rp_block(b, eb ? eb + i * isz : NULL, zb + i * isz, t, 2, bf16);
            i += 2 * CN_RP_L;
        }
        for (; i < n; i++) {
            float c = cn_rp_value(xb, i, bf16) - s, d = cn_rp_value(zb, i, bf16) - t;
            float g = db ? cn_rp_value(db, i, bf16) : c, h = eb ? cn_rp_value(eb, i, bf16) : d;
            ta1 += (double)g;
            ta2 += (double)(g * c);
            tb1 += (double)h;
            tb2 += (double)(h * d);
        }
        cn_rp_lanes(la[0], la[1], a);
        cn_rp_lanes(la[2], la[3], b);
        cn_merge_lanes4(la[0], la[1], la[2], la[3], m);
        s1[p] = 0.0 + (m[0] + ta1);
        s2[p] = 0.0 + (m[1] + ta2);
        s1[p + 1] = 0.0 + (m[2] + tb1);
        s2[p + 1] = 0.0 + (m[3] + tb2);
        xb += 2 * n * isz;
        if (db)
            db += 2 * n * isz;
    }
    return p;
}

#else
#define CN_HAVE_LANE_SUMS 0
/* without AVX: nothing done here, the Cython loops do all */
static inline ptrdiff_t cn_cols_tree_run(const float *dy, const float *x, const float *s,
                                         ptrdiff_t n, ptrdiff_t nr, ptrdiff_t ld, double *out1,
                                         double *out2) {
    (void)dy; (void)x; (void)s; (void)n; (void)nr; (void)ld; (void)out1; (void)out2;
    return 0;
}
static inline ptrdiff_t cn_rp_run(const void *dy, const void *x, const double *center,
                                  ptrdiff_t cstep, ptrdiff_t n, ptrdiff_t rows, double *s1,
                                  double *s2, int bf16) {
    (void)dy; (void)x; (void)center; (void)cstep; (void)n; (void)rows; (void)s1; (void)s2;
    (void)bf16;
    return 0;
}
#endif

/* the entries: how many columns or rows they did */
static inline ptrdiff_t cn_cols_sums_tree_f32(const float *dy, const float *x, const float *s,
                                              ptrdiff_t n, ptrdiff_t nr, ptrdiff_t ld,
                                              double *out1, double *out2) {
    return cn_cols_tree_run(dy, x, s, n, nr, ld, out1, out2);
}

static inline ptrdiff_t cn_row_pairs_sums_f32(const float *dy, const float *x,
                                              const double *center, ptrdiff_t cstep,
                                              ptrdiff_t n, ptrdiff_t rows, double *s1,
                                              double *s2) {
    return cn_rp_run(dy, x, center, cstep, n, rows, s1, s2, 0);
}

static inline ptrdiff_t cn_row_pairs_sums_bf16(const uint16_t *dy, const uint16_t *x,
                                               const double *center, ptrdiff_t cstep,
                                               ptrdiff_t n, ptrdiff_t rows, double *s1,
                                               double *s2) {
    return cn_rp_run(dy, x, center, cstep, n, rows, s1, s2, 1);
}

#endif
