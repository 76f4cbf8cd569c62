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
 * cn_short_rows_sums_f32 / _bf16: consecutive short rows (the rows of a
 * group's channels), as row_pair_centered_dot_ / row_pair_moments_
 * (float32) and instance_short_rows_sums_ (bfloat16) sum them, with the
 * call, the lane arrays' set-up and the per-pair branches out of the loop
 * over the rows; with AVX-512 four rows at a time, whose eight trees run
 * together in registers (cn_rq_store), then pairs through cn_merge_lanes4.
 * A row's first block is taken as it is rather than added to lanes of 0.0
 * (cn_ct_add_terms).  (2, 1280, 8, 8) NCHW backward: 1.23x float32 and
 * 1.14x bfloat16 for the pairs, then 1.1x for four rows and the first
 * block (Zen 4).
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
 * each widened to float64.  first: a holds nothing yet and takes the sums
 * as they are, where the loops add them to lanes of 0.0: the same bits in
 * the end (a lane of -0.0 in place of +0.0 changes only the sign of a zero
 * tree, and every tree is added to a tail sum begun at +0.0) */
static inline __attribute__((always_inline)) void
cn_ct_add_terms(cn_ct_sums *a, const cn_ct_f *c, const cn_ct_f *g, int terms, int first) {
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
    if (first) {
        a->s1lo = cn_ct_lo(t1);
        a->s1hi = cn_ct_hi(t1);
        a->s2lo = cn_ct_lo(t2);
        a->s2hi = cn_ct_hi(t2);
    } else {
        a->s1lo += cn_ct_lo(t1);
        a->s1hi += cn_ct_hi(t1);
        a->s2lo += cn_ct_lo(t2);
        a->s2hi += cn_ct_hi(t2);
    }
}

/* one block of `terms` rows (4, 2 or 1) at x (and dy), ld apart, `step`
 * rows between terms, into a: c = x - s, g = c (dy NULL) or dy */
static inline __attribute__((always_inline)) void
cn_ct_block(cn_ct_sums *a, const float *dy, const float *x, cn_ct_f s, ptrdiff_t ld,
            ptrdiff_t step, int terms, int first) {
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
    cn_ct_add_terms(a, c, g, terms, first);
}

static inline cn_ct_sums cn_ct_add(cn_ct_sums a, cn_ct_sums b) {
    cn_ct_sums r = {a.s1lo + b.s1lo, a.s1hi + b.s1hi, a.s2lo + b.s2lo, a.s2hi + b.s2hi};
    return r;
}

/* lane l of W columns: its blocks of four rows L apart below m4, then
 * one of two below m2 (the first of them taken as it is) */
static inline __attribute__((always_inline)) void
cn_ct_lane(cn_ct_sums *v, const float *dj, const float *xj, cn_ct_f sj, ptrdiff_t ld, int l,
           ptrdiff_t m4, ptrdiff_t m2) {
    enum { L = 16 };
    ptrdiff_t i;
    if (m4 > 0) {
        cn_ct_block(v, dj ? dj + l * ld : NULL, xj + l * ld, sj, ld, L, 4, 1);
        for (i = 4 * L; i < m4; i += 4 * L)
            cn_ct_block(v, dj ? dj + (i + l) * ld : NULL, xj + (i + l) * ld, sj, ld, L, 4, 0);
        if (m2 > m4)
            cn_ct_block(v, dj ? dj + (m4 + l) * ld : NULL, xj + (m4 + l) * ld, sj, ld, L, 2, 0);
    } else if (m2 > 0) {
        cn_ct_block(v, dj ? dj + l * ld : NULL, xj + l * ld, sj, ld, L, 2, 1);
    } else {
        memset(v, 0, sizeof *v);
    }
}

/* out1[j] += the tree of the lanes + the rows' tail, out2 likewise, for
 * the columns j < n - n % CN_CT_W of nr rows ld apart at x (and dy; NULL:
 * moments, g = c), centre or shift s[j]; returns that count */
static inline ptrdiff_t cn_cols_tree_run(const float *dy, const float *x, const float *s,
                                         ptrdiff_t n, ptrdiff_t nr, ptrdiff_t ld, double *out1,
                                         double *out2) {
    enum { L = 16 };
    ptrdiff_t m4 = nr - nr % (4 * L), m2 = nr - nr % (2 * L), j, r;
    ptrdiff_t nw = n - n % CN_CT_W;
    for (j = 0; j < nw; j += CN_CT_W) {
        cn_ct_f sj = cn_ct_load(s + j);
        const float *xj = x + j, *dj = dy ? dy + j : NULL;
        cn_ct_sums P[4], v, t;
        int l, k;
#pragma GCC unroll 16
        for (l = 0; l < L; l++) {
            cn_ct_lane(&v, dj, xj, sj, ld, l, m4, m2);
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
            cn_ct_block(&t, dj ? dj + r * ld : NULL, xj + r * ld, sj, ld, 0, 1, 0);
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
 * a[0:CN_RP_V] (first: as they are): c = x - s, g = c (dy NULL) or dy */
static inline __attribute__((always_inline)) void
cn_rp_block(cn_ct_sums *a, const void *dy, const void *x, float s, int terms, int first,
            int bf16) {
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
        cn_ct_add_terms(&a[v], c, g, terms, first);
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

/* a row's tail: the elements from i on, one by one, into t[0] (g) and t[1]
 * (g * c) */
static inline __attribute__((always_inline)) void
cn_rp_tail(double *t, const char *dy, const char *x, float s, ptrdiff_t i, ptrdiff_t n, int bf16) {
    for (; i < n; i++) {
        float c = cn_rp_value(x, i, bf16) - s;
        float g = dy ? cn_rp_value(dy, i, bf16) : c;
        t[0] += (double)g;
        t[1] += (double)(g * c);
    }
}

/* R rows' blocks at element i (terms 4: a read-ahead for each pair of rows,
 * ahead of its second row) */
static inline __attribute__((always_inline)) void
cn_rows_block(cn_ct_sums (*a)[CN_RP_V], int R, const char *const *dr, const char *const *xr,
              const float *s, ptrdiff_t i, ptrdiff_t n, ptrdiff_t isz, int terms, int first,
              int bf16) {
    int k;
    if (terms == 4)
        for (k = 1; k < R; k += 2) {
            cn_prefetch_read_ahead(xr[k], i, n, n, isz, CN_BLOCK * isz);
            if (dr[k])
                cn_prefetch_read_ahead(dr[k], i, n, n, isz, CN_BLOCK * isz);
        }
    for (k = 0; k < R; k++)
        cn_rp_block(a[k], dr[k] ? dr[k] + i * isz : NULL, xr[k] + i * isz, s[k], terms, first,
                    bf16);
}

#if defined(__AVX512F__)
/* cn_merge.h's tree, four rows' two sums (eight lane arrays) at once in
 * registers: each add forms the same pair sums as cn_merge_lanes4 (the
 * same operands in the same order), eight arrays a vector */
static inline __m512d cn_rq_adjacent(cn_ct_d lo, cn_ct_d hi) {
    /* one array's lanes 0-7 and 8-15: [A01 B01 A23 B23 A45 B45 A67 B67] */
    __m512d a = (__m512d)lo, b = (__m512d)hi;
    return _mm512_add_pd(_mm512_unpacklo_pd(a, b), _mm512_unpackhi_pd(a, b));
}

static inline __m512d cn_rq_blocks(__m512d p, __m512d q) {
    /* each vector's 128-bit blocks 0 + 1 and 2 + 3: p's, then q's */
    return _mm512_add_pd(_mm512_shuffle_f64x2(p, q, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f64x2(p, q, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* s1[0:4] = 0.0 + (tree + t[k][0]) of rows 0..3, s2[0:4] likewise */
static inline void cn_rq_store(cn_ct_sums (*a)[CN_RP_V], double (*t)[2], double *s1,
                               double *s2) {
    __m512d q1 = cn_rq_blocks(cn_rq_adjacent(a[0][0].s1lo, a[0][0].s1hi),
                              cn_rq_adjacent(a[1][0].s1lo, a[1][0].s1hi));
    __m512d q2 = cn_rq_blocks(cn_rq_adjacent(a[2][0].s1lo, a[2][0].s1hi),
                              cn_rq_adjacent(a[3][0].s1lo, a[3][0].s1hi));
    __m512d q3 = cn_rq_blocks(cn_rq_adjacent(a[0][0].s2lo, a[0][0].s2hi),
                              cn_rq_adjacent(a[1][0].s2lo, a[1][0].s2hi));
    __m512d q4 = cn_rq_blocks(cn_rq_adjacent(a[2][0].s2lo, a[2][0].s2hi),
                              cn_rq_adjacent(a[3][0].s2lo, a[3][0].s2hi));
    /* [lanes 0-7, lanes 8-15] of s1 rows 0..3, and of s2 */
    __m512d r1 = cn_rq_blocks(q1, q2), r2 = cn_rq_blocks(q3, q4);
    /* the last add, lanes 0-7's sum first: [s1 of row 0, its s2, s1 of
     * row 1, ...], as t is laid out */
    __m512d r = _mm512_add_pd(_mm512_unpacklo_pd(r1, r2), _mm512_unpackhi_pd(r1, r2));
    r = _mm512_add_pd(_mm512_setzero_pd(), _mm512_add_pd(r, _mm512_loadu_pd(&t[0][0])));
    r = _mm512_permutexvar_pd(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), r);
    _mm256_storeu_pd(s1, _mm512_castpd512_pd256(r));
    _mm256_storeu_pd(s2, _mm512_extractf64x4_pd(r, 1));
}
#define CN_ROWS_MAX 4
#else
#define CN_ROWS_MAX 2
#endif

/* s1[0:2], s2[0:2] of two rows: their lanes through cn_merge_lanes4 */
static inline void cn_rp_store(cn_ct_sums (*a)[CN_RP_V], double (*t)[2], double *s1,
                               double *s2) {
    double la[4][CN_RP_L], m[4];
    cn_rp_lanes(la[0], la[1], a[0]);
    cn_rp_lanes(la[2], la[3], a[1]);
    cn_merge_lanes4(la[0], la[1], la[2], la[3], m);
    s1[0] = 0.0 + (m[0] + t[0][0]);
    s2[0] = 0.0 + (m[1] + t[0][1]);
    s1[1] = 0.0 + (m[2] + t[1][0]);
    s2[1] = 0.0 + (m[3] + t[1][1]);
}

/* the first rows - rows % R of `rows` consecutive rows of n at x (and dy;
 * NULL: moments), R at a time (2, or 4 with AVX-512), row p shifted by
 * (float)center[p * cstep]: s1[p] = its sum of g, s2[p] its sum of g * c;
 * returns how many rows that was.  bfloat16 or float32 storage (bf16),
 * float32 arithmetic either way */
static inline __attribute__((always_inline)) ptrdiff_t
cn_rows_run(int R, const void *dy, const void *x, const double *center, ptrdiff_t cstep,
            ptrdiff_t n, ptrdiff_t rows, double *s1, double *s2, int bf16) {
    ptrdiff_t isz = bf16 ? 2 : 4, m4 = n - n % (4 * CN_RP_L), m2 = n - n % (2 * CN_RP_L), p, i;
    const char *xb = (const char *)x, *db = (const char *)dy;
    for (p = 0; p + R <= rows; p += R) {
        const char *xr[CN_ROWS_MAX], *dr[CN_ROWS_MAX];
        float s[CN_ROWS_MAX];
        cn_ct_sums a[CN_ROWS_MAX][CN_RP_V];
        double t[CN_ROWS_MAX][2];
        int k;
        for (k = 0; k < R; k++) {
            xr[k] = xb + (p + k) * n * isz;
            dr[k] = db ? db + (p + k) * n * isz : NULL;
            s[k] = (float)center[(p + k) * cstep];
            t[k][0] = t[k][1] = 0.0;
        }
        /* the first block taken as it is (cn_ct_add_terms) */
        if (m4 > 0) {
            cn_rows_block(a, R, dr, xr, s, 0, n, isz, 4, 1, bf16);
            for (i = 4 * CN_RP_L; i < m4; i += 4 * CN_RP_L)
                cn_rows_block(a, R, dr, xr, s, i, n, isz, 4, 0, bf16);
            if (i < m2) {
                cn_rows_block(a, R, dr, xr, s, i, n, isz, 2, 0, bf16);
                i += 2 * CN_RP_L;
            }
        } else if (m2 > 0) {
            cn_rows_block(a, R, dr, xr, s, 0, n, isz, 2, 1, bf16);
            i = 2 * CN_RP_L;
        } else {
            memset(a, 0, sizeof a);
            i = 0;
        }
        for (k = 0; k < R; k++)
            cn_rp_tail(t[k], dr[k], xr[k], s[k], i, n, bf16);
#if defined(__AVX512F__)
        if (R == 4)
            cn_rq_store(a, t, s1 + p, s2 + p);
        else
#endif
            cn_rp_store(a, t, s1 + p, s2 + p);
    }
    return p;
}

/* four rows at a time with AVX-512, then pairs */
static inline __attribute__((always_inline)) ptrdiff_t
cn_rp_run(const void *dy, const void *x, const double *center, ptrdiff_t cstep, ptrdiff_t n,
          ptrdiff_t rows, double *s1, double *s2, int bf16) {
    ptrdiff_t p = 0, isz = bf16 ? 2 : 4;
    if (CN_ROWS_MAX == 4)
        p = cn_rows_run(CN_ROWS_MAX, dy, x, center, cstep, n, rows, s1, s2, bf16);
    return p + cn_rows_run(2, dy ? (const char *)dy + p * n * isz : NULL,
                           (const char *)x + p * n * isz, center + p * cstep, cstep, n,
                           rows - p, s1 + p, s2 + p, bf16);
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

static inline ptrdiff_t cn_short_rows_sums_f32(const float *dy, const float *x,
                                              const double *center, ptrdiff_t cstep,
                                              ptrdiff_t n, ptrdiff_t rows, double *s1,
                                              double *s2) {
    return cn_rp_run(dy, x, center, cstep, n, rows, s1, s2, 0);
}

static inline ptrdiff_t cn_short_rows_sums_bf16(const uint16_t *dy, const uint16_t *x,
                                               const double *center, ptrdiff_t cstep,
                                               ptrdiff_t n, ptrdiff_t rows, double *s1,
                                               double *s2) {
    return cn_rp_run(dy, x, center, cstep, n, rows, s1, s2, 1);
}

#endif
