/* Memory helpers the loops call: software prefetch and streaming
 * (non-temporal) stores, and the constants of the loops' blocks.  Plain
 * functions, one job each; the loops that use them are in the templates
 * (.pxi.tp, .pyx.tp, and the elementwise passes' cn_store_paths.h.tp).
 *
 * Prefetch.  The L2 streamer stops at every 4 KiB page, so a streaming read
 * asks for the data ahead of where it is (cn_read_ahead_bytes), a write
 * CN_PREFETCH_BYTES ahead; a prefetch of an address past the end of the data
 * never faults.
 *
 * Streaming stores.  A large output that the kernel does not read back is
 * stored around the caches, which saves reading every line before writing
 * it.  The loops compute a block with the ordinary vectorized loop, then
 * stream the block out, so streamed and cached outputs hold the same bits.
 */
#ifndef CN_MEMORY_H
#define CN_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#define CN_PREFETCH_BYTES 4096
/* A streaming read of 4- and 8-byte elements looks ahead this far, into L2,
 * where the L1 prefetcher takes the lines from (DRAM-sized layer-norm and
 * batch-norm backward 1.2-1.4x against CN_PREFETCH_BYTES into L1); 16-bit
 * reads, whose loops convert every element, keep CN_PREFETCH_BYTES into L1
 * (bfloat16 batch-norm training 1.19x slower the other way,
 * MEASUREMENTS.md) */
#define CN_READ_AHEAD_BYTES 12288
static inline ptrdiff_t cn_read_ahead_bytes(ptrdiff_t isz) {
    return isz >= 4 ? CN_READ_AHEAD_BYTES : CN_PREFETCH_BYTES;
}

/* A function inlined wherever it is called.  The prefetch helpers are:
 * GCC's analysis counts a prefetch as no side effect, so a call to a helper
 * it kept out of line (a function of no effect, then) is deleted,
 * prefetches and all. */
#if defined(__GNUC__) || defined(__clang__)
#define CN_ALWAYS_INLINE static inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define CN_ALWAYS_INLINE static __forceinline
#else
#define CN_ALWAYS_INLINE static inline
#endif

/* a read (cn_prefetch_read) or write (cn_prefetch_write) prefetch of every
 * 64-byte line of the nbytes at p */
CN_ALWAYS_INLINE void cn_prefetch_read(const void *p, size_t nbytes) {
#if defined(__GNUC__) || defined(__clang__)
    for (size_t line = 0; line < nbytes; line += 64)
        __builtin_prefetch((const char *)p + line, 0, 3);
#else
    (void)p; (void)nbytes;
#endif
}

CN_ALWAYS_INLINE void cn_prefetch_write(const void *p, size_t nbytes) {
#if defined(__GNUC__) || defined(__clang__)
    for (size_t line = 0; line < nbytes; line += 64)
        __builtin_prefetch((const char *)p + line, 1, 3);
#else
    (void)p; (void)nbytes;
#endif
}

/* bytes per streamed block: the loops compute this much into a stack block
 * and cn_stream_block writes it (dst 64-byte aligned) */
#define CN_STREAM_BLOCK_BYTES 1024

#if defined(__SSE2__) || defined(_M_X64) || defined(_M_AMD64)
#include <emmintrin.h>
#define CN_HAVE_STREAM 1
static inline void cn_stream_block(void *dst, const void *src) {
    for (int i = 0; i < CN_STREAM_BLOCK_BYTES; i += 16)
        _mm_stream_si128((__m128i *)((char *)dst + i),
                         _mm_loadu_si128((const __m128i *)((const char *)src + i)));
}
static inline void cn_stream_fence(void) { _mm_sfence(); }
#else
#define CN_HAVE_STREAM 0
static inline void cn_stream_block(void *dst, const void *src) {
    for (int i = 0; i < CN_STREAM_BLOCK_BYTES; i++)
        ((char *)dst)[i] = ((const char *)src)[i];
}
static inline void cn_stream_fence(void) {}
#endif

/* The 32-bit word holding the two 16-bit values p[0] and p[1] (p only
 * 2-byte aligned: a bfloat16 row starts at any element).  GCC and clang are
 * told the alignment and that the word aliases the uint16 data; other
 * compilers copy it out. */
#if defined(__GNUC__) || defined(__clang__)
typedef uint32_t cn_u32_a2 __attribute__((aligned(2), may_alias));
static inline uint32_t cn_load_pair(const uint16_t *p) { return *(const cn_u32_a2 *)p; }
#else
#include <string.h>
static inline uint32_t cn_load_pair(const uint16_t *p) { uint32_t w; memcpy(&w, p, 4); return w; }
#endif

/* whether p is 64-byte aligned (where a streamed block may start) */
static inline int cn_aligned64(const void *p) { return ((uintptr_t)p & 63u) == 0; }

/* elements per block of a loop over a row: one prefetch per 64-byte line
 * ahead of it (and the reductions' block) */
#define CN_BLOCK 64
/* rows up to this many bytes are short: a loop over one ends before the
 * hardware prefetcher ramps up, so loops over short rows prefetch the rows
 * that follow, and longer rows prefetch within themselves */
#define CN_SHORT_ROW_BYTES 1024
/* a float32 or float64 row (bfloat16: where it rounds in registers)
 * streamed with a fence of its own (CN_STREAM_ROW) is at least this long:
 * shorter ones are stored through the cache */
#define CN_STREAM_ROW_MIN_BYTES 4096
/* a row pass's `stream` argument: its output stored through the cache;
 * streamed (non-temporal stores), then a fence that waits for them at the
 * row's end; or streamed, with one fence after the caller's run of rows
 * (cn_stream_fence, in the thread that stored them): a fence per row costs
 * more than the stores on rows of a few KiB */
#define CN_STREAM_OFF 0
#define CN_STREAM_ROW 1
#define CN_STREAM_RUN 2

/* The address dist bytes past element i of a row of n elements (isz bytes
 * each) at p.  Rows of a strided set (one batch-norm channel's rows, one
 * per sample) are far apart, so past the row's end the look-ahead goes on
 * at element nx, the start of the set's next row, and stops (NULL) past
 * that row's end.  nx == n: plain look-ahead; nx < 0: none past the row's
 * end. */
CN_ALWAYS_INLINE const char *cn_ahead_by(const void *p, ptrdiff_t i, ptrdiff_t n, ptrdiff_t nx,
                                         ptrdiff_t isz, ptrdiff_t dist) {
    ptrdiff_t t = i + dist / isz;
    if (t < n || nx == n)
        return (const char *)p + t * isz;
    if (nx >= 0 && t - n < n)
        return (const char *)p + (nx + t - n) * isz;
    return NULL;
}

/* a read prefetch of the nbytes cn_read_ahead_bytes(isz) past element i
 * (into L2 for 4- and 8-byte elements), or a write prefetch of those
 * CN_PREFETCH_BYTES past it (cn_ahead_by) */
CN_ALWAYS_INLINE void cn_prefetch_read_ahead(const void *p, ptrdiff_t i, ptrdiff_t n, ptrdiff_t nx,
                                             ptrdiff_t isz, size_t nbytes) {
    const char *a = cn_ahead_by(p, i, n, nx, isz, cn_read_ahead_bytes(isz));
    if (a == NULL)
        return;
    if (isz < 4) {
        cn_prefetch_read(a, nbytes);
        return;
    }
#if defined(__GNUC__) || defined(__clang__)
    for (size_t line = 0; line < nbytes; line += 64)
        __builtin_prefetch(a + line, 0, 2);
#endif
}

CN_ALWAYS_INLINE void cn_prefetch_write_ahead(const void *p, ptrdiff_t i, ptrdiff_t n, ptrdiff_t nx,
                                              ptrdiff_t isz, size_t nbytes) {
    const char *a = cn_ahead_by(p, i, n, nx, isz, CN_PREFETCH_BYTES);
    if (a != NULL)
        cn_prefetch_write(a, nbytes);
}

/* A loop over R rows ld elements (isz bytes each) apart at p, n columns
 * each, CN_BLOCK columns at a time: a read prefetch of each row's block
 * CN_GROUP_AHEAD_BYTES past column i, into the next R rows past the end.
 * Shorter than CN_PREFETCH_BYTES: the R rows' look-ahead together stays in
 * L1. */
#define CN_GROUP_AHEAD_BYTES 1024
CN_ALWAYS_INLINE void cn_prefetch_group_ahead(const void *p, ptrdiff_t i, ptrdiff_t n, ptrdiff_t ld,
                                              int R, ptrdiff_t isz) {
    for (int q = 0; q < R; q++) {
        const char *a = cn_ahead_by((const char *)p + q * ld * isz, i, n, R * ld, isz,
                                    CN_GROUP_AHEAD_BYTES);
        if (a != NULL)
            cn_prefetch_read(a, CN_BLOCK * isz);
    }
}

/* a loop over R short rows ld elements (isz bytes) apart at p: the R rows
 * `ahead` rows on (the hardware prefetcher stops at every 4 KiB page) */
CN_ALWAYS_INLINE void cn_prefetch_rows(const void *p, ptrdiff_t n, ptrdiff_t ld, ptrdiff_t ahead,
                                       int R, ptrdiff_t isz) {
    if (ahead > 0)
        for (int q = 0; q < R; q++)
            cn_prefetch_read((const char *)p + (ahead + q) * ld * isz, n * isz);
}

/* the same into L2 only (a further look-ahead, which would evict from L1
 * the rows in use): rows `ahead` .. `ahead` + R - 1 on from p */
CN_ALWAYS_INLINE void cn_prefetch_rows_l2(const void *p, ptrdiff_t n, ptrdiff_t ld,
                                          ptrdiff_t ahead, int R, ptrdiff_t isz) {
#if defined(__GNUC__) || defined(__clang__)
    for (int q = 0; q < R; q++)
        for (ptrdiff_t line = 0; line < n * isz; line += 64)
            __builtin_prefetch((const char *)p + (ahead + q) * ld * isz + line, 0, 1);
#else
    (void)p; (void)n; (void)ld; (void)ahead; (void)R; (void)isz;
#endif
}

/* A streamed pass over a row that a first pass brought into L1 (a row
 * norm's normalize) only stores, and the memory's read side idles.  Done in
 * pieces of about CN_AHEAD_PIECE_BYTES of output, each followed by an L2
 * prefetch of the same bytes of the next row, the next row's reads overlap
 * this row's stores.  The end of the piece from element pos of an n-element
 * row at out: on a 64-byte line of out, or n. */
#define CN_AHEAD_PIECE_BYTES 1024
CN_ALWAYS_INLINE ptrdiff_t cn_piece_end(const void *out, ptrdiff_t pos, ptrdiff_t n,
                                        ptrdiff_t isz) {
    uintptr_t start = (uintptr_t)out;
    uintptr_t line = (start + (uintptr_t)((pos * isz) + CN_AHEAD_PIECE_BYTES)) & ~(uintptr_t)63;
    ptrdiff_t end = (ptrdiff_t)((line - start) / (uintptr_t)isz);
    return end < n ? end : n;
}

/* a loop over R long rows at p, at a 64-byte step: the same line of the
 * next R rows (a hardware stream per row restarts at every row group) */
CN_ALWAYS_INLINE void cn_prefetch_next_group(const void *p, ptrdiff_t ld, int R, ptrdiff_t isz) {
    for (int q = R; q < 2 * R; q++)
        cn_prefetch_read((const char *)p + q * ld * isz, 1);
}

/* An elementwise pass over one short row of two inputs, rows in memory
 * order (layer norm's grad_x row by row): the data CN_PREFETCH_BYTES ahead
 * of inputs a and b (the rows that follow), and for 2-byte elements the
 * output lines as far ahead (16-bit outputs have no blocked write
 * prefetch). */
CN_ALWAYS_INLINE void cn_prefetch_short_row(const void *out, const void *a, const void *b,
                                            ptrdiff_t n, ptrdiff_t isz) {
    cn_prefetch_read((const char *)a + CN_PREFETCH_BYTES, n * isz);
    if (a != b)
        cn_prefetch_read((const char *)b + CN_PREFETCH_BYTES, n * isz);
    if (isz == 2)
        cn_prefetch_write((const char *)out + CN_PREFETCH_BYTES, n * isz);
}

/* how many rows ahead (ld elements of isz bytes apart) a loop over short
 * rows prefetches, CN_PREFETCH_BYTES or more; 0 (none) for long rows */
static inline ptrdiff_t cn_rows_ahead(ptrdiff_t ld, ptrdiff_t isz) {
    ptrdiff_t row = ld * isz;
    if (row <= 0 || row > CN_SHORT_ROW_BYTES)
        return 0;
    return (CN_PREFETCH_BYTES + row - 1) / row;
}

#endif
