/* Group norm's float32 sums with their float64 lanes in vector registers:
 * short channel rows two at a time (channels first) and the columns of a
 * short sample (channels last).
 *
 * Both sum as group_norm_stats.pxi.tp's loops (and stats_loops.pxi.tp's
 * row loops) do: 16 lanes, lane l taking elements l, l + 16, l + 32, l + 48
 * of each block of 64 as one float32 four-term sum (of g and of g * c,
 * c = x - shift, g = c for moments or dy for gradient sums), widened and
 * added to the lane in float64; then elements l, l + 16 of one block of 32
 * likewise; then cn_merge.h's fixed tree over the lanes, plus the elements
 * past the last block one by one.  The same operations in the same order,
 * so the same bits; each returns how many rows or columns it did (whole
 * steps, 0 without AVX) and the Cython loops do the rest.
 *
 * cn_row_pairs_sums_f32: two consecutive short rows at a time (the rows of
 * a group's channels), as row_pair_centered_dot_ / row_pair_moments_, with
 * the call, the lane arrays' set-up and the per-pair branches out of the
 * loop over the pairs ((2, 1280, 8, 8) NCHW backward 1.23x).
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
#include <string.h>
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

/* the float32 four-term (or two-term) sums of 16 lanes, one row's block,
 * widened into float64 accumulators: W lanes a vector, 16 / W vectors */
enum { CN_RP_L = 16, CN_RP_V = CN_RP_L / CN_CT_W };
typedef struct { cn_ct_d s1lo[CN_RP_V], s1hi[CN_RP_V], s2lo[CN_RP_V], s2hi[CN_RP_V]; } cn_rp_acc;

static inline __attribute__((always_inline)) void
cn_rp_block(cn_rp_acc *a, const float *dy, const float *x, float s, int terms) {
    for (int v = 0; v < CN_RP_V; v++) {
        const float *xv = x + v * CN_CT_W, *dv = dy ? dy + v * CN_CT_W : NULL;
        cn_ct_f c0 = cn_ct_load(xv) - s, c1 = cn_ct_load(xv + CN_RP_L) - s;
        cn_ct_f g0 = dv ? cn_ct_load(dv) : c0, g1 = dv ? cn_ct_load(dv + CN_RP_L) : c1;
        cn_ct_f t1, t2;
        if (terms == 2) {
            t1 = g0 + g1;
            t2 = g0 * c0 + g1 * c1;
        } else {
            cn_ct_f c2 = cn_ct_load(xv + 2 * CN_RP_L) - s, c3 = cn_ct_load(xv + 3 * CN_RP_L) - s;
            cn_ct_f g2 = dv ? cn_ct_load(dv + 2 * CN_RP_L) : c2;
            cn_ct_f g3 = dv ? cn_ct_load(dv + 3 * CN_RP_L) : c3;
            t1 = (g0 + g1) + (g2 + g3);
            t2 = (g0 * c0 + g1 * c1) + (g2 * c2 + g3 * c3);
        }
        a->s1lo[v] += cn_ct_lo(t1);
        a->s1hi[v] += cn_ct_hi(t1);
        a->s2lo[v] += cn_ct_lo(t2);
        a->s2hi[v] += cn_ct_hi(t2);
    }
}

/* lane array out[0:16] of one accumulated sum */
static inline void cn_rp_lanes(double *out, const cn_ct_d *lo, const cn_ct_d *hi) {
    for (int v = 0; v < CN_RP_V; v++) {
        cn_ct_dstore(out + v * CN_CT_W, lo[v]);
        cn_ct_dstore(out + v * CN_CT_W + CN_CT_W / 2, hi[v]);
    }
}

/* the first rows - rows % 2 of `rows` consecutive rows of n at x (and dy;
 * NULL: moments), row p shifted by (float)center[p * cstep]: s1[p] = its
 * sum of g, s2[p] its sum of g * c; returns how many rows that was */
static inline ptrdiff_t cn_row_pairs_sums_f32(const float *dy, const float *x,
                                              const double *center, ptrdiff_t cstep,
                                              ptrdiff_t n, ptrdiff_t rows, double *s1,
                                              double *s2) {
    ptrdiff_t m4 = n - n % (4 * CN_RP_L), m2 = n - n % (2 * CN_RP_L), p, i;
    for (p = 0; p + 2 <= rows; p += 2) {
        const float *z = x + n, *dz = dy ? dy + n : NULL;
        float s = (float)center[p * cstep], t = (float)center[(p + 1) * cstep];
        cn_rp_acc a, b;
        double ta1 = 0.0, ta2 = 0.0, tb1 = 0.0, tb2 = 0.0, m[4];
        double la[4][CN_RP_L];
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        for (i = 0; i < m4; i += 4 * CN_RP_L) {
            cn_prefetch_read_ahead(z, i, n, n, 4, CN_BLOCK * 4);
            if (dz)
                cn_prefetch_read_ahead(dz, i, n, n, 4, CN_BLOCK * 4);
            cn_rp_block(&a, dy ? dy + i : NULL, x + i, s, 4);
            cn_rp_block(&b, dz ? dz + i : NULL, z + i, t, 4);
        }
        if (i < m2) {
            cn_rp_block(&a, dy ? dy + i : NULL, x + i, s, 2);
            cn_rp_block(&b, dz ? dz + i : NULL, z + i, t, 2);
            i += 2 * CN_RP_L;
        }
        for (; i < n; i++) {
            float g = dy ? dy[i] : x[i] - s, h = dz ? dz[i] : z[i] - t;
            ta1 += (double)g;
            ta2 += (double)(g * (x[i] - s));
            tb1 += (double)h;
            tb2 += (double)(h * (z[i] - t));
        }
        cn_rp_lanes(la[0], a.s1lo, a.s1hi);
        cn_rp_lanes(la[1], a.s2lo, a.s2hi);
        cn_rp_lanes(la[2], b.s1lo, b.s1hi);
        cn_rp_lanes(la[3], b.s2lo, b.s2hi);
        cn_merge_lanes4(la[0], la[1], la[2], la[3], m);
        s1[p] = 0.0 + (m[0] + ta1);
        s2[p] = 0.0 + (m[1] + ta2);
        s1[p + 1] = 0.0 + (m[2] + tb1);
        s2[p + 1] = 0.0 + (m[3] + tb2);
        x += 2 * n;
        if (dy)
            dy += 2 * n;
    }
    return p;
}

#else
#define CN_HAVE_LANE_SUMS 0
static inline ptrdiff_t cn_cols_sums_tree_f32(const float *dy, const float *x, const float *s,
                                              ptrdiff_t n, ptrdiff_t nr, ptrdiff_t ld,
                                              double *out1, double *out2) {
    (void)dy; (void)x; (void)s; (void)n; (void)nr; (void)ld; (void)out1; (void)out2;
    return 0;
}
static inline ptrdiff_t cn_row_pairs_sums_f32(const float *dy, const float *x,
                                              const double *center, ptrdiff_t cstep,
                                              ptrdiff_t n, ptrdiff_t rows, double *s1,
                                              double *s2) {
    (void)dy; (void)x; (void)center; (void)cstep; (void)n; (void)rows; (void)s1; (void)s2;
    return 0;
}
#endif

#endif
