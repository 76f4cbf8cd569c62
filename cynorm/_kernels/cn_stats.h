/* The hot loops of layer norm and batch norm: moments, centred gradient sums,
 * and the normalizing / gradient elementwise passes, one set per storage type,
 * plus dispatchers that pick the set by the storage code of cynorm/_dtypes.py
 * (0 float32, 1 float64, 2 bfloat16, 3 float16).
 *
 * Dispatch happens here rather than through Cython fused types: the
 * orchestration in layer_norm.pyx / batch_norm.pyx is then written once, and
 * a switch per row chunk costs nothing next to the loop it selects.
 *
 * Numerics.  Statistics are sums of *shifted* values: the caller passes a
 * shift k (a sample of the same row or channel), the loops add x - k and
 * (x - k)^2, and the variance is S2/n - (S1/n)^2.  With k a sample, S1/n is
 * of the order of the standard deviation, so nothing large cancels (plain
 * E[x^2] - E[x]^2 loses every digit when the mean is 1e4 times the spread).
 * Differences and products are formed in the math type (float32 for
 * float32/16-bit storage) and added four at a time in it (elements
 * CN_LANES apart; bfloat16: two adjacent pairs, see CN_POS) before each
 * float64 accumulation: the conversion to
 * float64 and its add bounded the 16-bit loops (pairs: bfloat16 statistics
 * passes 4-13 % slower), and a four-term float32 sum is off by at most
 * ~2^-23 of its terms' magnitude (a pair's 2^-24).  The float64 sums run in CN_LANES lanes merged by a
 * fixed tree, as in cn_rows.h, so a result never depends on how rows were
 * spread over threads.
 */
#ifndef CN_STATS_H
#define CN_STATS_H

#include "cn_rows.h"

/* Row reductions keep their float64 lanes in a caller's array between calls:
 * L[0, CN_LANES) and L[CN_LANES, 2 CN_LANES) the two sums' lanes, then the
 * two tail sums.  A reduction over many rows can then visit them in any
 * interleaving (batch norm's short rows: every channel's row of a sample in
 * memory order) and still add every element to the same lane in the same
 * order as one call over the rows would. */
#define CN_LANE_WORDS (2 * CN_LANES + 2)

#define CN_LANES_STORE(L, a1, a2, t1, t2)                                            \
    do {                                                                             \
        for (int l = 0; l < CN_LANES; l++) {                                         \
            L[l] = a1[l];                                                            \
            L[CN_LANES + l] = a2[l];                                                 \
        }                                                                            \
        L[2 * CN_LANES] = t1;                                                        \
        L[2 * CN_LANES + 1] = t2;                                                    \
    } while (0)

/* s[0] += the first sum of lanes L, s[1] += the second (fixed tree) */
static inline void cn_lanes_add(const double *L, double *s) {
    s[0] += cn_merge_lanes(L) + L[2 * CN_LANES];
    s[1] += cn_merge_lanes(L + CN_LANES) + L[2 * CN_LANES + 1];
}

/* Where the row loops find the terms of a lane: term q (0-3) of lane l in a
 * block of 4 * CN_LANES elements is element CN_POS(l, q) of the block.
 * float32/64 and float16: q * CN_LANES + l, so each term is one contiguous
 * vector.  bfloat16: lane l reads the two 32-bit words at 2l and 2 CN_LANES
 * + 2l and takes both halves of each (q = 0, 1 from the first word): a half
 * becomes a float32 with one shift or one mask, where widening a vector of
 * uint16 took a zero-extension, a shift and an extract per 16 values, and
 * GCC vectorized 16 lanes of uint16 at half width.  Measured at 1 thread,
 * interleaved A/B: layer-norm forward 1.15-1.22x, backward 1.08-1.10x,
 * N,C,H,W batch-norm training 1.12-1.13x, backward 1.05-1.11x.  The pair
 * loop uses q = 0, 1 of the same formula.  Any fixed assignment of elements
 * to lanes is as deterministic as another: every path and SIMD level runs
 * this one. */
#define CN_POS_f32(l, q) ((q) * CN_LANES + (l))
#define CN_POS_f64(l, q) ((q) * CN_LANES + (l))
#define CN_POS_f16(l, q) ((q) * CN_LANES + (l))
#define CN_POS_bf16(l, q) (2 * CN_LANES * ((q) >> 1) + 2 * (l) + ((q) & 1))
#define CN_LOADQ_f32(p, i, l, q) cn_load_f32((p)[(i) + CN_POS_f32(l, q)])
#define CN_LOADQ_f64(p, i, l, q) cn_load_f64((p)[(i) + CN_POS_f64(l, q)])
#define CN_LOADQ_f16(p, i, l, q) cn_load_f16((p)[(i) + CN_POS_f16(l, q)])
#define CN_LOADQ_bf16(p, i, l, q)                                                    \
    cn_bf16_half(CN_WORD((p) + (i) + CN_POS_bf16(l, (q) & 2)), (q) & 1)

/* A 32-bit word at a 2-byte aligned address (rows of bfloat16 start at any
 * element): GCC and clang are told the alignment and that it aliases the
 * uint16 data; other compilers copy it out. */
#if defined(__GNUC__) || defined(__clang__)
typedef uint32_t cn_u32_a2 __attribute__((aligned(2), may_alias));
#define CN_WORD(p) (*(const cn_u32_a2 *)(p))
#else
static inline uint32_t cn_word(const void *p) { uint32_t w; memcpy(&w, p, 4); return w; }
#define CN_WORD(p) cn_word(p)
#endif
/* element `odd` (0 or 1) of the two bfloat16 in word w, as float32: the
 * first element of a pair is the low half on a little-endian machine */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define CN_BF16_FIRST_IS_LOW 0
#else
#define CN_BF16_FIRST_IS_LOW 1
#endif
static inline float cn_bf16_half(uint32_t w, int odd) {
    return cn_bits_f32((odd == CN_BF16_FIRST_IS_LOW) ? (w & 0xffff0000u) : (w << 16));
}

/* Terms of the row sums below, from an element's math value v and index j,
 * named so that one loop serves them all: (x - shift), dy, dy * w[j]. */
#define CN_TERM_SHIFTED(v, s, w, j) ((v) - (s))
#define CN_TERM_PLAIN(v, s, w, j) (v)
#define CN_TERM_WEIGHTED(v, s, w, j) ((v) * (w)[j])
/* term q of lane l in the block at i */
#define CN_TERMQ(SFX, G, p, s, w, i, l, q)                                           \
    G(CN_LOADQ_##SFX(p, i, l, q), s, w, (i) + CN_POS_##SFX(l, q))

/* Lanes a1 += G(j), a2 += G(j) * C(j) over a row of n elements, C(j) =
 * (cp[j] - s): four terms per lane per float64 add, then pairs, then a
 * scalar tail into t1/t2.  G is one of the CN_TERM_ macros, over gp. */
#define CN_SUMS_ROW(SFX, IO, M, G, gp, cp, s, w, n, ld, last, a1, a2, t1, t2)        \
    do {                                                                             \
        ptrdiff_t m4_ = (n) - (n) % (4 * CN_LANES), m_ = (n) - (n) % (2 * CN_LANES);  \
        ptrdiff_t i = 0;                                                             \
        /* look ahead into the next row of the set (see CN_AHEAD) */                \
        const ptrdiff_t nx_ = (last) ? (n) : (ld);                                   \
        for (; i < m4_; i += 4 * CN_LANES) {                                         \
            CN_PREFETCH_BLOCK_ROW(IO, cp, i, n, (cp) + nx_);                         \
            if ((const void *)(gp) != (const void *)(cp))                            \
                CN_PREFETCH_BLOCK_ROW(IO, gp, i, n, (gp) + nx_);                     \
            for (int l = 0; l < CN_LANES; l++) {                                     \
                M g0 = CN_TERMQ(SFX, G, gp, s, w, i, l, 0);                          \
                M g1 = CN_TERMQ(SFX, G, gp, s, w, i, l, 1);                          \
                M g2 = CN_TERMQ(SFX, G, gp, s, w, i, l, 2);                          \
                M g3 = CN_TERMQ(SFX, G, gp, s, w, i, l, 3);                          \
                M c0 = CN_TERMQ(SFX, CN_TERM_SHIFTED, cp, s, w, i, l, 0);            \
                M c1 = CN_TERMQ(SFX, CN_TERM_SHIFTED, cp, s, w, i, l, 1);            \
                M c2 = CN_TERMQ(SFX, CN_TERM_SHIFTED, cp, s, w, i, l, 2);            \
                M c3 = CN_TERMQ(SFX, CN_TERM_SHIFTED, cp, s, w, i, l, 3);            \
                a1[l] += (double)((g0 + g1) + (g2 + g3));                            \
                a2[l] += (double)((g0 * c0 + g1 * c1) + (g2 * c2 + g3 * c3));        \
            }                                                                        \
        }                                                                            \
        for (; i < m_; i += 2 * CN_LANES) {                                          \
            for (int l = 0; l < CN_LANES; l++) {                                     \
                M g0 = CN_TERMQ(SFX, G, gp, s, w, i, l, 0);                          \
                M g1 = CN_TERMQ(SFX, G, gp, s, w, i, l, 1);                          \
                M c0 = CN_TERMQ(SFX, CN_TERM_SHIFTED, cp, s, w, i, l, 0);            \
                M c1 = CN_TERMQ(SFX, CN_TERM_SHIFTED, cp, s, w, i, l, 1);            \
                a1[l] += (double)(g0 + g1);                                          \
                a2[l] += (double)(g0 * c0 + g1 * c1);                                \
            }                                                                        \
        }                                                                            \
        for (; i < (n); i++) {                                                       \
            M g = G(cn_load_##SFX((gp)[i]), s, w, i);                                \
            t1 += (double)g;                                                         \
            t2 += (double)(g * CN_TERM_SHIFTED(cn_load_##SFX((cp)[i]), s, w, i));    \
        }                                                                            \
    } while (0)

/* One row's share of the two row reductions, in lanes a1/a2 (CN_LANES each)
 * and tail sums t1/t2: the same loop for a call over many rows (lanes in
 * registers from zero) and for lanes carried in memory between calls.
 * Moments: sums of d = x - k and d * d. */
#define CN_MOM_ROW(SFX, IO, M, x, n, ld, last, k, a1, a2, t1, t2)                    \
    CN_SUMS_ROW(SFX, IO, M, CN_TERM_SHIFTED, x, x, k, NULL, n, ld, last, a1, a2, t1, t2)

/* g = dy (w == NULL) or dy * w[j]: a1/a2 lanes of sum(g), sum(g * (x - mu)) */
#define CN_CDOT_ROW(SFX, IO, M, dy, x, w, n, ld, last, mu, a1, a2, t1, t2)           \
    do {                                                                             \
        if (w == NULL)                                                               \
            CN_SUMS_ROW(SFX, IO, M, CN_TERM_PLAIN, dy, x, mu, w, n, ld, last,          \
                        a1, a2, t1, t2);                                             \
        else                                                                         \
            CN_SUMS_ROW(SFX, IO, M, CN_TERM_WEIGHTED, dy, x, mu, w, n, ld, last,       \
                        a1, a2, t1, t2);                                             \
    } while (0)

/* Column loops read R rows at a time (4; bfloat16 word pairs 8).  Short
 * rows (a pitch of up to CN_PREFETCH_ROW_BYTES: channels-last batch norm)
 * are prefetched line by line, rows_ahead rows (CN_PREFETCH_BYTES or more)
 * ahead, since the hardware streamer stops at every 4 KiB page: measured,
 * channels-last (32, 56, 56, 64) training 1.14x faster (float32, 1 and 2
 * threads).  Longer rows ((4096, 1024) float32, 4 KiB) ran up to 1.15x
 * slower with whole rows prefetched ahead; they fetch the next row group
 * line by line instead (CN_PREFETCH_NEXT_GROUP). */
#define CN_PREFETCH_ROW(IO, p, n) CN_PREFETCH_SPAN(CN_PREFETCH_AT, p, (n) * sizeof(IO))
#define CN_PREFETCH_ROWS(IO, p, n, ld, rows_ahead, R)                                 \
    do {                                                                              \
        if ((rows_ahead) > 0)                                                         \
            for (int q_ = 0; q_ < (R); q_++)                                          \
                CN_PREFETCH_ROW(IO, (p) + ((rows_ahead) + q_) * (ld), n);             \
    } while (0)
/* Elementwise passes over one short row at a time, rows in memory order (the
 * N,C,H,W batch-norm pass at 14x14, one task per row): the data
 * CN_PREFETCH_BYTES ahead of inputs a and b (the rows that follow), and for
 * 16-bit outputs, whose loop has no blocked write prefetch (see
 * CN_ELEMENTWISE), the output lines as far ahead.  Measured at
 * (128, 256, 14, 14), interleaved A/B: eval 1.13x (bfloat16) and 1.2x
 * (float32) faster at 1 thread, training 1.05-1.11x, backward 1.06-1.12x.
 * Calls over several strided rows (fused training: one channel's rows) skip
 * it: what follows a row there is another channel's data. */
#define CN_PREFETCH_SHORT_ROW(IO, out, a, b, n, rows)                                 \
    do {                                                                              \
        if ((rows) == 1 && (n) * sizeof(IO) <= CN_PREFETCH_ROW_BYTES) {               \
            CN_PREFETCH_ROW(IO, (a) + CN_PREFETCH_BYTES / sizeof(IO), n);             \
            if ((const void *)(a) != (const void *)(b))                               \
                CN_PREFETCH_ROW(IO, (b) + CN_PREFETCH_BYTES / sizeof(IO), n);         \
            CN_PREFETCHW_ROW16(IO, (out) + CN_PREFETCH_BYTES / sizeof(IO), n);        \
        }                                                                             \
    } while (0)
/* 16-bit outputs: their loops have no blocked write prefetch (see
 * CN_ELEMENTWISE), so a column pass claims the output row it will write
 * rows_ahead rows later.  Near a task's end that is the next task's row,
 * which under the static schedule is mostly the same thread's; stopping at
 * the task's end measured slower (bfloat16 channels-last eval, tasks of 512
 * rows, 32 ahead). */
#define CN_PREFETCHW_ROW16(IO, p, n)                                                  \
    do {                                                                              \
        if (sizeof(IO) < 4)                                                           \
            CN_PREFETCH_SPAN(CN_PREFETCHW_AT, p, (n) * sizeof(IO));                   \
    } while (0)
/* rows_ahead for rows ld elements of isz bytes apart: 0 (no prefetch) for
 * long rows */
static inline ptrdiff_t cn_rows_ahead(ptrdiff_t ld, size_t isz) {
    ptrdiff_t row = ld * (ptrdiff_t)isz;
    if (row <= 0 || row > CN_PREFETCH_ROW_BYTES)
        return 0;
    return (CN_PREFETCH_BYTES + row - 1) / row;
}

/* one column of cn_gradrowacc2: both rows' grad_x through STORE0/STORE1 (a
 * storage rounding, or a float32 block entry), then the two column sums */
#define CN_GRADROWACC2_STEP(SFX, M, j, STORE0, STORE1)                               \
    do {                                                                             \
        M wj = w == NULL ? (M)1 : w[j];                                              \
        M g0 = cn_load_##SFX(dy0[j]), c0 = cn_load_##SFX(x0[j]) - mu0;               \
        M g1 = cn_load_##SFX(dy1[j]), c1 = cn_load_##SFX(x1[j]) - mu1;               \
        STORE0((g0 * wj - p0 - c0 * q0) * r0);                                       \
        STORE1((g1 * wj - p1 - c1 * q1) * r1);                                       \
        a1[j] += (double)(g0 + g1);                                                  \
        a2[j] += (double)(g0 * (c0 * r0) + g1 * (c1 * r1));                          \
    } while (0)

/* Column loops over long rows (a pitch over CN_PREFETCH_ROW_BYTES, so no
 * CN_PREFETCH_ROWS) fetch, at each 64-byte step, the same line of the next
 * group of R rows: a hardware stream per row restarted at every row group,
 * and with the caches cold (bench_norms.py) (4096, 1024) training measured
 * 1.04-1.05x (float32) and 1.09-1.12x (bfloat16, CN_PAIR_COLS) faster. */
#define CN_PREFETCH_NEXT_GROUP(p, ld, R)                                              \
    do {                                                                              \
        for (int q_ = (R); q_ < 2 * (R); q_++)                                        \
            CN_PREFETCH_AT((p) + q_ * (ld));                                          \
    } while (0)
/* The loop over columns j of the four-row column loops, the body being the
 * variadic arguments: for long rows (ahead == 0) in 64-byte steps, each
 * preceded by PF (statements, with j the step's first column); short rows
 * keep one plain loop. */
#define CN_COLS_NEXT_GROUP(IO, n, ahead, j, PF, ...)                                  \
    do {                                                                              \
        const ptrdiff_t w_ = (ptrdiff_t)(64 / sizeof(IO));                            \
        if ((ahead) == 0) {                                                           \
            for (ptrdiff_t jb_ = 0; jb_ < (n); jb_ += w_) {                           \
                const ptrdiff_t je_ = jb_ + w_ < (n) ? jb_ + w_ : (n);                \
                {                                                                     \
                    const ptrdiff_t j = jb_;                                          \
                    (void)j;                                                          \
                    PF;                                                               \
                }                                                                     \
                for (ptrdiff_t j = jb_; j < je_; j++)                                 \
                    __VA_ARGS__                                                       \
            }                                                                         \
        } else {                                                                      \
            for (ptrdiff_t j = 0; j < (n); j++)                                       \
                __VA_ARGS__                                                           \
        }                                                                             \
    } while (0)

#define CN_STATS_OPS(SFX, T, IO, M)                                                  \
/* rows rows of n elements, ld apart: s[0] += sum(x - k), s[1] += sum((x - k)^2) */ \
/* (the lanes carry on from row to row)                                       */ \
CN_NOINLINE static void cn_rmom_##SFX(const T *xs, ptrdiff_t n, ptrdiff_t rows,      \
                                      ptrdiff_t ld, M k, double *s) {                \
    double a1[CN_LANES] = {0}, a2[CN_LANES] = {0}, t1 = 0.0, t2 = 0.0;               \
    for (ptrdiff_t r = 0; r < rows; r++) {                                           \
        const IO *x = (const IO *)xs + r * ld;                                       \
        CN_MOM_ROW(SFX, IO, M, x, n, ld, r + 1 == rows, k, a1, a2, t1, t2);         \
    }                                                                                \
    s[0] += cn_merge_lanes(a1) + t1;                                                 \
    s[1] += cn_merge_lanes(a2) + t2;                                                 \
}                                                                                    \
/* one row of n elements into lanes L carried between calls (CN_LANE_WORDS) */    \
CN_NOINLINE static void cn_lmom_##SFX(const T *xs, ptrdiff_t n, M k,                 \
                                      double *restrict L) {                          \
    double a1[CN_LANES], a2[CN_LANES], t1 = L[2 * CN_LANES], t2 = L[2 * CN_LANES + 1]; \
    const IO *x = (const IO *)xs;                                                    \
    for (int l = 0; l < CN_LANES; l++) {                                             \
        a1[l] = L[l];                                                                \
        a2[l] = L[CN_LANES + l];                                                     \
    }                                                                                \
    CN_MOM_ROW(SFX, IO, M, x, n, n, 1, k, a1, a2, t1, t2);                           \
    CN_LANES_STORE(L, a1, a2, t1, t2);                                               \
}                                                                                    \
/* rows rows of n elements, ld apart; g = dy (w == NULL) or dy * w[j]:       */ \
/* s[0] += sum(g), s[1] += sum(g * (x - mu))                                   */ \
CN_NOINLINE static void cn_rcdot_##SFX(const T *dys, const T *xs, const M *w,        \
                                       ptrdiff_t n, ptrdiff_t rows, ptrdiff_t ld,    \
                                       M mu, double *s) {                            \
    double a1[CN_LANES] = {0}, a2[CN_LANES] = {0}, t1 = 0.0, t2 = 0.0;               \
    for (ptrdiff_t r = 0; r < rows; r++) {                                           \
        const IO *dy = (const IO *)dys + r * ld, *x = (const IO *)xs + r * ld;       \
        CN_CDOT_ROW(SFX, IO, M, dy, x, w, n, ld, r + 1 == rows, mu, a1, a2, t1, t2); \
    }                                                                                \
    s[0] += cn_merge_lanes(a1) + t1;                                                 \
    s[1] += cn_merge_lanes(a2) + t2;                                                 \
}                                                                                    \
/* one row into lanes L carried between calls (batch norm: w is NULL)        */ \
CN_NOINLINE static void cn_lcdot_##SFX(const T *dys, const T *xs, ptrdiff_t n, M mu,  \
                                       double *restrict L) {                         \
    double a1[CN_LANES], a2[CN_LANES], t1 = L[2 * CN_LANES], t2 = L[2 * CN_LANES + 1]; \
    const IO *dy = (const IO *)dys, *x = (const IO *)xs;                             \
    const M *w = NULL;                                                               \
    for (int l = 0; l < CN_LANES; l++) {                                             \
        a1[l] = L[l];                                                                \
        a2[l] = L[CN_LANES + l];                                                     \
    }                                                                                \
    CN_CDOT_ROW(SFX, IO, M, dy, x, w, n, n, 1, mu, a1, a2, t1, t2);                  \
    CN_LANES_STORE(L, a1, a2, t1, t2);                                               \
}                                                                                    \
/* rows rows of n columns, ld elements apart: per column j,                  */ \
/* a1[j] += x - k[j], a2[j] += (x - k[j])^2.  Four rows' terms are summed in  */ \
/* the math type per float64 add, as in CN_SUMS_ROW: one add per element      */ \
/* kept these column loops at 3-5 GB/s, a load, convert, add and store of     */ \
/* both partials for every element.  Leftover rows go one at a time.          */ \
CN_NOINLINE static void cn_cmom_##SFX(double *restrict a1, double *restrict a2,      \
                                      const T *xs, const M *restrict k, ptrdiff_t n, \
                                      ptrdiff_t rows, ptrdiff_t ld) {                \
    ptrdiff_t r = 0, ahead = cn_rows_ahead(ld, sizeof(IO));                          \
    for (; r + 4 <= rows; r += 4) {                                                  \
        const IO *restrict x0 = (const IO *)xs + r * ld;                             \
        const IO *restrict x1 = x0 + ld, *restrict x2 = x1 + ld, *restrict x3 = x2 + ld; \
        CN_PREFETCH_ROWS(IO, x0, n, ld, ahead, 4);                                   \
        CN_COLS_NEXT_GROUP(IO, n, ahead, j, CN_PREFETCH_NEXT_GROUP(x0 + j, ld, 4), {   \
            M d0 = cn_load_##SFX(x0[j]) - k[j], d1 = cn_load_##SFX(x1[j]) - k[j];    \
            M d2 = cn_load_##SFX(x2[j]) - k[j], d3 = cn_load_##SFX(x3[j]) - k[j];    \
            a1[j] += (double)((d0 + d1) + (d2 + d3));                                \
            a2[j] += (double)((d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3));            \
        });                                                                          \
    }                                                                                \
    for (; r < rows; r++) {                                                          \
        const IO *restrict x = (const IO *)xs + r * ld;                              \
        for (ptrdiff_t j = 0; j < n; j++) {                                          \
            M d = cn_load_##SFX(x[j]) - k[j];                                        \
            a1[j] += (double)d;                                                      \
            a2[j] += (double)(d * d);                                                \
        }                                                                            \
    }                                                                                \
}                                                                                    \
/* rows rows as above: a1[j] += dy, a2[j] += dy * (x - m[j]), four rows per  */ \
/* float64 add as in cn_cmom                                                 */ \
CN_NOINLINE static void cn_ccdot_##SFX(double *restrict a1, double *restrict a2,     \
                                       const T *dys, const T *xs, const M *restrict mu, \
                                       ptrdiff_t n, ptrdiff_t rows, ptrdiff_t ld) {  \
    ptrdiff_t r = 0, ahead = cn_rows_ahead(ld, sizeof(IO));                          \
    for (; r + 4 <= rows; r += 4) {                                                  \
        const IO *restrict g0p = (const IO *)dys + r * ld, *restrict x0 = (const IO *)xs + r * ld; \
        const IO *restrict g1p = g0p + ld, *restrict g2p = g1p + ld, *restrict g3p = g2p + ld; \
        const IO *restrict x1 = x0 + ld, *restrict x2 = x1 + ld, *restrict x3 = x2 + ld; \
        CN_PREFETCH_ROWS(IO, g0p, n, ld, ahead, 4);                                  \
        CN_PREFETCH_ROWS(IO, x0, n, ld, ahead, 4);                                   \
        CN_COLS_NEXT_GROUP(IO, n, ahead, j,                                          \
                           CN_PREFETCH_NEXT_GROUP(g0p + j, ld, 4);                   \
                           CN_PREFETCH_NEXT_GROUP(x0 + j, ld, 4), {                  \
            M g0 = cn_load_##SFX(g0p[j]), g1 = cn_load_##SFX(g1p[j]);                \
            M g2 = cn_load_##SFX(g2p[j]), g3 = cn_load_##SFX(g3p[j]);                \
            a1[j] += (double)((g0 + g1) + (g2 + g3));                                \
            a2[j] += (double)((g0 * (cn_load_##SFX(x0[j]) - mu[j])                   \
                               + g1 * (cn_load_##SFX(x1[j]) - mu[j]))                \
                              + (g2 * (cn_load_##SFX(x2[j]) - mu[j])                 \
                                 + g3 * (cn_load_##SFX(x3[j]) - mu[j])));            \
        });                                                                          \
    }                                                                                \
    for (; r < rows; r++) {                                                          \
        const IO *restrict dy = (const IO *)dys + r * ld;                            \
        const IO *restrict x = (const IO *)xs + r * ld;                              \
        for (ptrdiff_t j = 0; j < n; j++) {                                          \
            M g = cn_load_##SFX(dy[j]);                                              \
            a1[j] += (double)g;                                                      \
            a2[j] += (double)(g * (cn_load_##SFX(x[j]) - mu[j]));                    \
        }                                                                            \
    }                                                                                \
}                                                                                    \
/* one row of known mean and rstd: a1[j] += dy, a2[j] += dy * ((x - mu) * r) */     \
CN_NOINLINE static void cn_ccdots_##SFX(double *restrict a1, double *restrict a2,    \
                                        const T *dys, const T *xs, M mu, M r,        \
                                        ptrdiff_t n) {                               \
    const IO *restrict dy = (const IO *)dys, *restrict x = (const IO *)xs;           \
    for (ptrdiff_t j = 0; j < n; j++) {                                              \
        M g = cn_load_##SFX(dy[j]);                                                  \
        a1[j] += (double)g;                                                          \
        a2[j] += (double)(g * ((cn_load_##SFX(x[j]) - mu) * r));                     \
    }                                                                                \
}                                                                                    \
/* layer norm's grad_x of two rows, and their share of grad_weight/grad_bias */ \
/* (paired exactly as cn_ccdots2):                                            */ \
/* out_i = (dy_i * w[j] - p_i - (x_i - mu_i) * q_i) * r_i,                    */ \
/* a1[j] += dy0 + dy1, a2[j] += dy0 * xhat0 + dy1 * xhat1 (w may be NULL: 1)  */ \
CN_NOINLINE static void cn_gradrowacc2_##SFX(T *outs0, T *outs1, double *restrict a1,  \
                                             double *restrict a2, const T *dys0,     \
                                             const T *xs0, const T *dys1,            \
                                             const T *xs1, const M *restrict w,      \
                                             ptrdiff_t n, const M *restrict c) {     \
    IO *restrict out0 = (IO *)outs0, *restrict out1 = (IO *)outs1;                   \
    const IO *restrict dy0 = (const IO *)dys0, *restrict x0 = (const IO *)xs0;       \
    const IO *restrict dy1 = (const IO *)dys1, *restrict x1 = (const IO *)xs1;       \
    /* c: p, mu, q, r of row 0, then of row 1 */                                    \
    const M p0 = c[0], mu0 = c[1], q0 = c[2], r0 = c[3];                             \
    const M p1 = c[4], mu1 = c[5], q1 = c[6], r1 = c[7];                             \
    /* float32/64: blocks with a write prefetch ahead of both outputs (see   \
       CN_ELEMENTWISE); 16-bit: one plain pass, or with AVX512-BF16 blocks   \
       rounded by cn_pack_bf16 */                                               \
    const int packed = CN_PACKS_##SFX && cn_bf16_pack_ok;                            \
    CN_ALIGN64 float pk0[CN_PACKS_##SFX ? CN_PACK_BLOCK : 1];                        \
    CN_ALIGN64 float pk1[CN_PACKS_##SFX ? CN_PACK_BLOCK : 1];                        \
    const ptrdiff_t step = sizeof(IO) >= 4 ? CN_BLOCK                                \
                           : packed ? CN_PACK_BLOCK : (n > 0 ? n : 1);               \
    for (ptrdiff_t jb = 0; jb < n; jb += step) {                                     \
        if (sizeof(IO) >= 4) {                                                       \
            CN_PREFETCHW_BLOCK(IO, out0 + jb);                                       \
            CN_PREFETCHW_BLOCK(IO, out1 + jb);                                       \
        }                                                                            \
        ptrdiff_t je = jb + step < n ? jb + step : n;                                \
        if (packed) {                                                                \
            for (ptrdiff_t j = jb; j < je; j++)                                      \
                CN_GRADROWACC2_STEP(SFX, M, j, pk0[j - jb] = (float), pk1[j - jb] = (float)); \
            cn_pack_bf16((uint16_t *)(out0 + jb), pk0, je - jb);                     \
            cn_pack_bf16((uint16_t *)(out1 + jb), pk1, je - jb);                     \
        } else {                                                                     \
            for (ptrdiff_t j = jb; j < je; j++)                                      \
                CN_GRADROWACC2_STEP(SFX, M, j, out0[j] = cn_store_##SFX,             \
                                    out1[j] = cn_store_##SFX);                       \
        }                                                                            \
    }                                                                                \
}                                                                                    \
/* two rows of known mean and rstd at once: a1[j] += dy0 + dy1,              */ \
/* a2[j] += dy0 * xhat0 + dy1 * xhat1 (each pair summed in the math type)     */ \
CN_NOINLINE static void cn_ccdots2_##SFX(double *restrict a1, double *restrict a2,   \
                                         const T *dys0, const T *xs0, M mu0, M r0,   \
                                         const T *dys1, const T *xs1, M mu1, M r1,   \
                                         ptrdiff_t n) {                              \
    const IO *restrict dy0 = (const IO *)dys0, *restrict x0 = (const IO *)xs0;       \
    const IO *restrict dy1 = (const IO *)dys1, *restrict x1 = (const IO *)xs1;       \
    for (ptrdiff_t j = 0; j < n; j++) {                                              \
        M g0 = cn_load_##SFX(dy0[j]), g1 = cn_load_##SFX(dy1[j]);                    \
        a1[j] += (double)(g0 + g1);                                                  \
        a2[j] += (double)(g0 * ((cn_load_##SFX(x0[j]) - mu0) * r0)                   \
                          + g1 * ((cn_load_##SFX(x1[j]) - mu1) * r1));               \
    }                                                                                \
}                                                                                    \
/* rows rows of n elements, ld apart: out = (x - m) * s + t;                 */ \
/* with w: ((x - m) * s) * w[j] + b[j]                                         */ \
CN_NOINLINE static void cn_normrow_##SFX(T *outs, const T *xs, ptrdiff_t n,          \
                                         ptrdiff_t rows, ptrdiff_t ld, M mu, M s,    \
                                         M t, const M *restrict w,                   \
                                         const M *restrict b, int stream) {          \
    for (ptrdiff_t r = 0; r < rows; r++) {                                           \
        IO *restrict out = (IO *)outs + r * ld;                                      \
        const IO *restrict x = (const IO *)xs + r * ld;                              \
        IO *nxt = r + 1 < rows ? out + ld : out + n;   /* see CN_AHEAD */            \
        CN_PREFETCH_SHORT_ROW(IO, out, x, x, n, rows);                               \
        if (w == NULL)                                                               \
            CN_ELEMENTWISE(SFX, IO, out, n, nxt, stream, J,                          \
                           (cn_load_##SFX(x[J]) - mu) * s + t);                      \
        else                                                                         \
            CN_ELEMENTWISE(SFX, IO, out, n, nxt, stream, J,                          \
                           ((cn_load_##SFX(x[J]) - mu) * s) * w[J] + b[J]);          \
    }                                                                                \
}                                                                                    \
/* rows rows of n columns, ld elements apart: out[j] = (x[j] - m[j]) * s[j] + t[j] */ \
CN_NOINLINE static void cn_normcols_##SFX(T *outs, const T *xs, ptrdiff_t n,         \
                                          const M *restrict mu, const M *restrict s, \
                                          const M *restrict t, ptrdiff_t rows,       \
                                          ptrdiff_t ld, int stream) {                \
    const ptrdiff_t ahead = cn_rows_ahead(ld, sizeof(IO));                            \
    for (ptrdiff_t r = 0; r < rows; r++) {                                           \
        IO *restrict out = (IO *)outs + r * ld;                                      \
        const IO *restrict x = (const IO *)xs + r * ld;                              \
        if (ahead > 0) {                                                             \
            CN_PREFETCH_ROW(IO, x + ahead * ld, n);                                  \
            CN_PREFETCHW_ROW16(IO, out + ahead * ld, n);                             \
        }                                                                            \
        CN_ELEMENTWISE(SFX, IO, out, n, out + n, stream, J,                          \
                       (cn_load_##SFX(x[J]) - mu[J]) * s[J] + t[J]);                 \
    }                                                                                \
}                                                                                    \
/* rows rows of n elements, ld apart; g = dy (w == NULL) or dy * w[j]:       */ \
/* out = (g - p - (x - m) * q) * a                                             */               \
CN_NOINLINE static void cn_gradrow_##SFX(T *outs, const T *dys, const T *xs,         \
                                         const M *restrict w, ptrdiff_t n,           \
                                         ptrdiff_t rows, ptrdiff_t ld, M p, M mu,    \
                                         M q, M a, int stream) {                     \
    for (ptrdiff_t r = 0; r < rows; r++) {                                           \
        IO *restrict out = (IO *)outs + r * ld;                                      \
        const IO *restrict dy = (const IO *)dys + r * ld;                            \
        const IO *restrict x = (const IO *)xs + r * ld;                              \
        IO *nxt = r + 1 < rows ? out + ld : out + n;   /* see CN_AHEAD */            \
        CN_PREFETCH_SHORT_ROW(IO, out, dy, x, n, rows);                              \
        if (w == NULL)                                                               \
            CN_ELEMENTWISE(SFX, IO, out, n, nxt, stream, J,                          \
                           (cn_load_##SFX(dy[J]) - p                                 \
                            - (cn_load_##SFX(x[J]) - mu) * q) * a);                  \
        else                                                                         \
            CN_ELEMENTWISE(SFX, IO, out, n, nxt, stream, J,                          \
                           (cn_load_##SFX(dy[J]) * w[J] - p                          \
                            - (cn_load_##SFX(x[J]) - mu) * q) * a);                  \
    }                                                                                \
}                                                                                    \
/* rows rows as above: out[j] = (dy - p[j] - (x - m[j]) * q[j]) * a[j] */          \
CN_NOINLINE static void cn_gradcols_##SFX(T *outs, const T *dys, const T *xs,        \
                                          ptrdiff_t n, const M *restrict p,          \
                                          const M *restrict mu, const M *restrict q, \
                                          const M *restrict a, ptrdiff_t rows,       \
                                          ptrdiff_t ld, int stream) {                \
    const ptrdiff_t ahead = cn_rows_ahead(ld, sizeof(IO));                            \
    for (ptrdiff_t r = 0; r < rows; r++) {                                           \
        IO *restrict out = (IO *)outs + r * ld;                                      \
        const IO *restrict dy = (const IO *)dys + r * ld;                            \
        const IO *restrict x = (const IO *)xs + r * ld;                              \
        if (ahead > 0) {                                                             \
            CN_PREFETCH_ROW(IO, dy + ahead * ld, n);                                 \
            CN_PREFETCH_ROW(IO, x + ahead * ld, n);                                  \
            CN_PREFETCHW_ROW16(IO, out + ahead * ld, n);                             \
        }                                                                            \
        CN_ELEMENTWISE(SFX, IO, out, n, out + n, stream, J,                          \
                       (cn_load_##SFX(dy[J]) - p[J]                                  \
                        - (cn_load_##SFX(x[J]) - mu[J]) * q[J]) * a[J]);             \
    }                                                                                \
}

CN_STATS_OPS(f32, float, float, float)
CN_STATS_OPS(f64, double, double, double)
CN_STATS_OPS(bf16, cn_bf16, uint16_t, float)
CN_STATS_OPS(f16, cn_f16, uint16_t, float)

/* ---- bfloat16 column sums over word pairs -------------------------------- */
/* The column loops above widen 16 uint16 at a time (a zero-extension, a
 * shift and an extract per half vector) and add four rows per float64 add.
 * For bfloat16 the batch-norm column reductions read each row as 32-bit
 * words instead, as the row loops do (CN_POS_bf16): word w of a group of
 * CN_COL_GROUP columns holds columns 2w and 2w + 1, and a shift or a mask
 * makes either one a float32.  Their float64 partials then sit in the
 * order the words give them: column 2w at slot w of the group, column
 * 2w + 1 at slot 16 + w (cn_col_slot; only full groups are reordered, and
 * the shifts/means come in the same order).  Eight rows go into each
 * float64 add, summed pairwise in float32 (off by at most ~4 * 2^-24 of
 * their magnitude, products included).  Measured in cache, 1 thread:
 * 5.2 -> 8.5 G elements/s; interleaved A/B of batch_norm_stats on (4096, 1024) and channels-last
 * (32, 56, 56, 64): 1.25-1.27x at 1 thread, 1.14-1.18x at 2; training
 * forward (the statistics and the normalizing pass) 1.02-1.06x. */
#define CN_COL_GROUP 32

/* where the float64 partial of column j of n sits (code 2: see above) */
static inline ptrdiff_t cn_col_slot(int code, ptrdiff_t j, ptrdiff_t n) {
    ptrdiff_t g = j - j % CN_COL_GROUP, i = j % CN_COL_GROUP;
    if (code != 2 || g + CN_COL_GROUP > n)
        return j;
    return g + (i & 1) * (CN_COL_GROUP / 2) + (i >> 1);
}

#define CN_SUM8(a) ((((a)[0] + (a)[1]) + ((a)[2] + (a)[3])) + (((a)[4] + (a)[5]) + ((a)[6] + (a)[7])))
#define CN_DOT8(a, b)                                                                \
    ((((a)[0] * (b)[0] + (a)[1] * (b)[1]) + ((a)[2] * (b)[2] + (a)[3] * (b)[3]))       \
     + (((a)[4] * (b)[4] + (a)[5] * (b)[5]) + ((a)[6] * (b)[6] + (a)[7] * (b)[7])))
#define CN_SUM1(a) ((a)[0])
#define CN_DOT1(a, b) ((a)[0] * (b)[0])

/* R rows (8 or 1) from x0, ld apart, into columns [0, n): a1[slot] += sum
 * of g, a2[slot] += sum of g * c, where c = x - k[slot] and g = c
 * (moments, HD 0) or g = dy0 (centred dot, HD 1, k the means) */
#define CN_PAIR_COLS_ROWS(R, HD, PF, dy0, x0, ld, k, n, ng, a1, a2)                  \
    do {                                                                             \
        for (ptrdiff_t g_ = 0; g_ < (ng); g_ += CN_COL_GROUP) {                      \
            if (PF) {                                                                \
                CN_PREFETCH_NEXT_GROUP((x0) + g_, ld, R);                            \
                if (HD)                                                              \
                    CN_PREFETCH_NEXT_GROUP((dy0) + g_, ld, R);                       \
            }                                                                        \
            for (int w_ = 0; w_ < CN_COL_GROUP / 2; w_++) {                          \
                const ptrdiff_t j_ = g_ + 2 * w_, p_ = g_ + w_, h_ = p_ + CN_COL_GROUP / 2; \
                float c0_[R], c1_[R], g0_[R], g1_[R];                                \
                for (int q_ = 0; q_ < R; q_++) {                                     \
                    uint32_t u_ = CN_WORD((x0) + q_ * (ld) + j_);                    \
                    c0_[q_] = cn_bf16_half(u_, 0) - (k)[p_];                         \
                    c1_[q_] = cn_bf16_half(u_, 1) - (k)[h_];                         \
                    if (HD) {                                                        \
                        uint32_t v_ = CN_WORD((dy0) + q_ * (ld) + j_);               \
                        g0_[q_] = cn_bf16_half(v_, 0);                               \
                        g1_[q_] = cn_bf16_half(v_, 1);                               \
                    } else {                                                         \
                        g0_[q_] = c0_[q_];                                           \
                        g1_[q_] = c1_[q_];                                           \
                    }                                                                \
                }                                                                    \
                (a1)[p_] += (double)CN_SUM##R(g0_);                                  \
                (a2)[p_] += (double)CN_DOT##R(g0_, c0_);                             \
                (a1)[h_] += (double)CN_SUM##R(g1_);                                  \
                (a2)[h_] += (double)CN_DOT##R(g1_, c1_);                             \
            }                                                                        \
        }                                                                            \
        for (ptrdiff_t j_ = (ng); j_ < (n); j_++) {                                  \
            float c_[R], g_[R];                                                      \
            for (int q_ = 0; q_ < R; q_++) {                                         \
                c_[q_] = cn_load_bf16((x0)[q_ * (ld) + j_]) - (k)[j_];               \
                g_[q_] = (HD) ? cn_load_bf16((dy0)[q_ * (ld) + j_]) : c_[q_];        \
            }                                                                        \
            (a1)[j_] += (double)CN_SUM##R(g_);                                       \
            (a2)[j_] += (double)CN_DOT##R(g_, c_);                                   \
        }                                                                            \
    } while (0)

/* rows rows of n columns, ld elements apart; HD 0: moments about k, HD 1:
 * the centred dot of dys about the means k.  Short rows are prefetched ahead
 * as in cn_cmom (CN_PREFETCH_ROWS) */
#define CN_PAIR_COLS(HD, dys, xs, k, n, rows, ld, a1, a2)                            \
    do {                                                                             \
        const ptrdiff_t ng_ = (n) - (n) % CN_COL_GROUP;                              \
        const ptrdiff_t ahead_ = cn_rows_ahead(ld, 2);                               \
        ptrdiff_t r_ = 0;                                                            \
        for (; r_ + 8 <= (rows); r_ += 8) {                                          \
            const uint16_t *restrict x0_ = (xs) + r_ * (ld);                         \
            const uint16_t *restrict dy0_ = (HD) ? (dys) + r_ * (ld) : NULL;         \
            CN_PREFETCH_ROWS(uint16_t, x0_, n, ld, ahead_, 8);                       \
            if (HD)                                                                  \
                CN_PREFETCH_ROWS(uint16_t, dy0_, n, ld, ahead_, 8);                  \
            CN_PAIR_COLS_ROWS(8, HD, ahead_ == 0, dy0_, x0_, ld, k, n, ng_, a1, a2);  \
        }                                                                            \
        for (; r_ < (rows); r_++) {                                                  \
            const uint16_t *restrict x0_ = (xs) + r_ * (ld);                         \
            const uint16_t *restrict dy0_ = (HD) ? (dys) + r_ * (ld) : NULL;         \
            CN_PAIR_COLS_ROWS(1, HD, 0, dy0_, x0_, ld, k, n, ng_, a1, a2);           \
        }                                                                            \
    } while (0)

CN_NOINLINE static void cn_cmom_pairs_bf16(double *restrict a1, double *restrict a2,
                                           const uint16_t *xs, const float *restrict k,
                                           ptrdiff_t n, ptrdiff_t rows, ptrdiff_t ld) {
    CN_PAIR_COLS(0, (const uint16_t *)NULL, xs, k, n, rows, ld, a1, a2);
}

CN_NOINLINE static void cn_ccdot_pairs_bf16(double *restrict a1, double *restrict a2,
                                            const uint16_t *dys, const uint16_t *xs,
                                            const float *restrict mu, ptrdiff_t n,
                                            ptrdiff_t rows, ptrdiff_t ld) {
    CN_PAIR_COLS(1, dys, xs, mu, n, rows, ld, a1, a2);
}

/* ---- dispatch by storage code ------------------------------------------ */
/* Pointers are untyped; scalar coefficients arrive as double and are rounded
 * once to the math type; per-column coefficient arrays hold the math type
 * (double for code 1, float otherwise). */

static inline size_t cn_itemsize(int code) { return code == 1 ? 8 : code == 0 ? 4 : 2; }

#define CN_DISPATCH(code, CALL)                                                      \
    switch (code) {                                                                  \
    case 0: CALL(f32, float, float); break;                                          \
    case 1: CALL(f64, double, double); break;                                        \
    case 2: CALL(bf16, cn_bf16, float); break;                                       \
    default: CALL(f16, cn_f16, float); break;                                        \
    }

static inline void cn_row_moments(int code, const void *x, ptrdiff_t n, ptrdiff_t rows,
                                  ptrdiff_t ld, double k, double *s) {
#define C_(S, T, M) cn_rmom_##S((const T *)x, n, rows, ld, (M)k, s)
    CN_DISPATCH(code, C_)
#undef C_
}

static inline void cn_row_centered_dot(int code, const void *dy, const void *x, const void *w,
                                       ptrdiff_t n, ptrdiff_t rows, ptrdiff_t ld, double mu,
                                       double *s) {
#define C_(S, T, M) cn_rcdot_##S((const T *)dy, (const T *)x, (const M *)w, n, rows, ld,   \
                                 (M)mu, s)
    CN_DISPATCH(code, C_)
#undef C_
}

/* one row into lanes L carried between calls (see CN_LANE_WORDS) */
static inline void cn_lane_moments(int code, const void *x, ptrdiff_t n, double k, double *L) {
#define C_(S, T, M) cn_lmom_##S((const T *)x, n, (M)k, L)
    CN_DISPATCH(code, C_)
#undef C_
}

static inline void cn_lane_centered_dot(int code, const void *dy, const void *x, ptrdiff_t n,
                                        double mu, double *L) {
#define C_(S, T, M) cn_lcdot_##S((const T *)dy, (const T *)x, n, (M)mu, L)
    CN_DISPATCH(code, C_)
#undef C_
}

static inline void cn_col_moments(int code, double *a1, double *a2, const void *x,
                                  const void *k, ptrdiff_t n, ptrdiff_t rows, ptrdiff_t ld) {
    if (code == 2) {   /* partials in cn_col_slot order */
        cn_cmom_pairs_bf16(a1, a2, (const uint16_t *)x, (const float *)k, n, rows, ld);
        return;
    }
#define C_(S, T, M) cn_cmom_##S(a1, a2, (const T *)x, (const M *)k, n, rows, ld)
    CN_DISPATCH(code, C_)
#undef C_
}

static inline void cn_col_centered_dot(int code, double *a1, double *a2, const void *dy,
                                       const void *x, const void *mu, ptrdiff_t n,
                                       ptrdiff_t rows, ptrdiff_t ld) {
    if (code == 2) {   /* partials in cn_col_slot order */
        cn_ccdot_pairs_bf16(a1, a2, (const uint16_t *)dy, (const uint16_t *)x, (const float *)mu,
                            n, rows, ld);
        return;
    }
#define C_(S, T, M) cn_ccdot_##S(a1, a2, (const T *)dy, (const T *)x, (const M *)mu, n, rows, ld)
    CN_DISPATCH(code, C_)
#undef C_
}

static inline void cn_col_scaled_dot(int code, double *a1, double *a2, const void *dy,
                                     const void *x, double mu, double r, ptrdiff_t n) {
#define C_(S, T, M) cn_ccdots_##S(a1, a2, (const T *)dy, (const T *)x, (M)mu, (M)r, n)
    CN_DISPATCH(code, C_)
#undef C_
}

static inline void cn_grad_rows_acc(int code, void *out0, void *out1, double *a1, double *a2,
                                    const void *dy0, const void *x0, const void *dy1,
                                    const void *x1, const void *w, ptrdiff_t n,
                                    const double *coef) {
    /* coef: p, mu, q, r of each row, rounded once to the math type */
    double c64[8];
    float c32[8];
    for (int i = 0; i < 8; i++) { c64[i] = coef[i]; c32[i] = (float)coef[i]; }
#define C_(S, T, M) cn_gradrowacc2_##S((T *)out0, (T *)out1, a1, a2, (const T *)dy0,         \
                                       (const T *)x0, (const T *)dy1, (const T *)x1,         \
                                       (const M *)w, n, sizeof(M) == 8 ? (const M *)c64      \
                                                                       : (const M *)c32)
    CN_DISPATCH(code, C_)
#undef C_
}

static inline void cn_col_scaled_dot2(int code, double *a1, double *a2, const void *dy0,
                                      const void *x0, double mu0, double r0, const void *dy1,
                                      const void *x1, double mu1, double r1, ptrdiff_t n) {
#define C_(S, T, M) cn_ccdots2_##S(a1, a2, (const T *)dy0, (const T *)x0, (M)mu0, (M)r0,  \
                                   (const T *)dy1, (const T *)x1, (M)mu1, (M)r1, n)
    CN_DISPATCH(code, C_)
#undef C_
}

static inline void cn_norm_row(int code, void *out, const void *x, ptrdiff_t n,
                               ptrdiff_t rows, ptrdiff_t ld, double mu, double s, double t,
                               const void *w, const void *b, int stream) {
#define C_(S, T, M) cn_normrow_##S((T *)out, (const T *)x, n, rows, ld, (M)mu, (M)s,     \
                                   (M)t, (const M *)w, (const M *)b, stream)
    CN_DISPATCH(code, C_)
#undef C_
}

static inline void cn_norm_cols(int code, void *out, const void *x, ptrdiff_t n,
                                const void *mu, const void *s, const void *t, ptrdiff_t rows,
                                ptrdiff_t ld, int stream) {
#define C_(S, T, M) cn_normcols_##S((T *)out, (const T *)x, n, (const M *)mu,            \
                                    (const M *)s, (const M *)t, rows, ld, stream)
    CN_DISPATCH(code, C_)
#undef C_
}

static inline void cn_grad_row(int code, void *out, const void *dy, const void *x,
                               const void *w, ptrdiff_t n, ptrdiff_t rows, ptrdiff_t ld,
                               double p, double mu, double q, double a, int stream) {
#define C_(S, T, M) cn_gradrow_##S((T *)out, (const T *)dy, (const T *)x, (const M *)w,  \
                                   n, rows, ld, (M)p, (M)mu, (M)q, (M)a, stream)
    CN_DISPATCH(code, C_)
#undef C_
}

static inline void cn_grad_cols(int code, void *out, const void *dy, const void *x,
                                ptrdiff_t n, const void *p, const void *mu, const void *q,
                                const void *a, ptrdiff_t rows, ptrdiff_t ld, int stream) {
#define C_(S, T, M) cn_gradcols_##S((T *)out, (const T *)dy, (const T *)x, n,            \
                                    (const M *)p, (const M *)mu, (const M *)q,          \
                                    (const M *)a, rows, ld, stream)
    CN_DISPATCH(code, C_)
#undef C_
}

/* one element of a storage array, widened to double (for shifts) */
static inline double cn_load_any(int code, const void *x, ptrdiff_t i) {
    switch (code) {
    case 0: return ((const float *)x)[i];
    case 1: return ((const double *)x)[i];
    case 2: return cn_bf16_bits_to_f32(((const uint16_t *)x)[i]);
    default: return cn_f16_bits_to_f32(((const uint16_t *)x)[i]);
    }
}

/* a double rounded to the math type of `code`, stored at m[i] */
static inline void cn_store_math(int code, void *m, ptrdiff_t i, double v) {
    if (code == 1) ((double *)m)[i] = v;
    else ((float *)m)[i] = (float)v;
}

#endif
