/* The fixed tree that ends every float64 reduction: an array's 16 lanes
 * (LANES, storage.pxd.tp) added as
 *   (((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)))
 *     + (((l8 + l9) + (l10 + l11)) + ((l12 + l13) + (l14 + l15))),
 * so that a result never depends on how its terms were spread over threads.
 *
 * One array's tree is a chain of scalar adds (its lanes sit side by side in
 * one vector), which is much of a short row's time.  cn_merge_lanes4 takes
 * four arrays' trees together: the lanes are transposed level by level so
 * that each vector add forms the same pair sum of several arrays, every sum
 * with the same two operands in the same order as cn_merge_lanes', so the
 * results carry its bits (NaN payloads included).
 */
#ifndef CN_MERGE_H
#define CN_MERGE_H

#include <stddef.h>

/* the tree over l[0], l[ld], ..., l[15 * ld] (merge_lanes: ld 1; a column
 * of lane arrays ld apart: its loop over columns vectorizes) */
static inline double cn_merge_lanes_strided(const double *l, ptrdiff_t ld)
{
    return (((l[0] + l[ld]) + (l[2 * ld] + l[3 * ld]))
            + ((l[4 * ld] + l[5 * ld]) + (l[6 * ld] + l[7 * ld])))
           + (((l[8 * ld] + l[9 * ld]) + (l[10 * ld] + l[11 * ld]))
              + ((l[12 * ld] + l[13 * ld]) + (l[14 * ld] + l[15 * ld])));
}

static inline double cn_merge_lanes(const double *l) { return cn_merge_lanes_strided(l, 1); }

#if defined(__AVX512F__)
#include <immintrin.h>

static inline void cn_merge_lanes4(const double *a, const double *b, const double *c,
                                   const double *d, double *out)
{
    /* A..H: lanes 0-7 and 8-15 of a, b, c, d.  Level 1: adjacent lanes,
     * two arrays per vector: [A01 B01 A23 B23 A45 B45 A67 B67] */
    __m512d A = _mm512_loadu_pd(a), B = _mm512_loadu_pd(a + 8);
    __m512d C = _mm512_loadu_pd(b), D = _mm512_loadu_pd(b + 8);
    __m512d E = _mm512_loadu_pd(c), F = _mm512_loadu_pd(c + 8);
    __m512d G = _mm512_loadu_pd(d), H = _mm512_loadu_pd(d + 8);
    __m512d ab = _mm512_add_pd(_mm512_unpacklo_pd(A, B), _mm512_unpackhi_pd(A, B));
    __m512d cd = _mm512_add_pd(_mm512_unpacklo_pd(C, D), _mm512_unpackhi_pd(C, D));
    __m512d ef = _mm512_add_pd(_mm512_unpacklo_pd(E, F), _mm512_unpackhi_pd(E, F));
    __m512d gh = _mm512_add_pd(_mm512_unpacklo_pd(G, H), _mm512_unpackhi_pd(G, H));
    /* level 2, pairs of 128-bit blocks: [A0123 B0123 A4567 B4567 C0123 ...] */
    __m512d t1 = _mm512_add_pd(_mm512_shuffle_f64x2(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f64x2(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    __m512d t2 = _mm512_add_pd(_mm512_shuffle_f64x2(ef, gh, _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f64x2(ef, gh, _MM_SHUFFLE(3, 1, 3, 1)));
    /* level 3: [A0-7 B0-7 C0-7 D0-7 E0-7 F0-7 G0-7 H0-7] */
    __m512d r = _mm512_add_pd(_mm512_shuffle_f64x2(t1, t2, _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f64x2(t1, t2, _MM_SHUFFLE(3, 1, 3, 1)));
    /* the last add, lanes 0-7's sum first: even elements a, b, c, d */
    r = _mm512_add_pd(r, _mm512_permute_pd(r, 0x55));
    _mm256_storeu_pd(out, _mm512_castpd512_pd256(_mm512_maskz_compress_pd(0x55, r)));
}

#elif defined(__AVX__)
#include <immintrin.h>

static inline __m256d cn_merge_quarter4(const double *a, const double *b, const double *c,
                                        const double *d)
{
    /* lanes k..k+3 of four arrays: [a's tree of them, b's, c's, d's] */
    __m256d A = _mm256_loadu_pd(a), B = _mm256_loadu_pd(b);
    __m256d C = _mm256_loadu_pd(c), D = _mm256_loadu_pd(d);
    __m256d ab = _mm256_add_pd(_mm256_unpacklo_pd(A, B), _mm256_unpackhi_pd(A, B));
    __m256d cd = _mm256_add_pd(_mm256_unpacklo_pd(C, D), _mm256_unpackhi_pd(C, D));
    return _mm256_add_pd(_mm256_permute2f128_pd(ab, cd, 0x20),
                         _mm256_permute2f128_pd(ab, cd, 0x31));
}

static inline void cn_merge_lanes4(const double *a, const double *b, const double *c,
                                   const double *d, double *out)
{
    __m256d lo = _mm256_add_pd(cn_merge_quarter4(a, b, c, d),
                               cn_merge_quarter4(a + 4, b + 4, c + 4, d + 4));
    __m256d hi = _mm256_add_pd(cn_merge_quarter4(a + 8, b + 8, c + 8, d + 8),
                               cn_merge_quarter4(a + 12, b + 12, c + 12, d + 12));
    _mm256_storeu_pd(out, _mm256_add_pd(lo, hi));
}

#else

static inline void cn_merge_lanes4(const double *a, const double *b, const double *c,
                                   const double *d, double *out)
{
    out[0] = cn_merge_lanes(a);
    out[1] = cn_merge_lanes(b);
    out[2] = cn_merge_lanes(c);
    out[3] = cn_merge_lanes(d);
}
#endif

#endif
