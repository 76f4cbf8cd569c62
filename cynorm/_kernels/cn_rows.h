/* The elementwise store paths and prefetch macros of the layer-norm and
 * batch-norm loops (cn_stats.h), and their lane merge.  Weight norm's loops
 * moved to Cython templates (row_loops.pxi.tp); these follow (issue 20).
 *
 * Reductions: CN_LANES independent float64 accumulators merged by a fixed
 * tree.  One chain of adds is latency bound; sixteen keep the vector units
 * busy.  Elementwise ops compute in the storage's math type (float64 for
 * float64, float32 otherwise) and round 16-bit stores to nearest even.
 */
#ifndef CN_ROWS_H
#define CN_ROWS_H

#include <stddef.h>
#include <stdint.h>
#include "cn_scalar.h"
#include "cn_pack.h"

#if defined(__GNUC__) || defined(__clang__)
#define CN_NOINLINE __attribute__((noinline, unused))
#else
#define CN_NOINLINE
#endif

#if defined(_MSC_VER) && !defined(__clang__)
#define restrict __restrict
#endif

#define CN_LANES 16

/* Software prefetch a fixed distance ahead of a streaming read.  The L2
 * streamer stops at every 4 KiB page; measured here, a 4 KiB lead lifts a
 * two-thread read of a 64 MiB array from 12.0 to 13-14 GB/s.  A prefetch of
 * an address past the end of the data is harmless (it never faults). */
#ifndef CN_PREFETCH_BYTES
#define CN_PREFETCH_BYTES 4096
#endif
#if defined(__GNUC__) || defined(__clang__)
#define CN_PREFETCH_AT(p) __builtin_prefetch((const char *)(p), 0, 3)
#elif defined(_MSC_VER)
#include <xmmintrin.h>
#define CN_PREFETCH_AT(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#else
#define CN_PREFETCH_AT(p) ((void)0)
#endif
#define CN_PREFETCH(p) CN_PREFETCH_AT((const char *)(p) + CN_PREFETCH_BYTES)
/* Prefetch for writing, the same distance ahead: the line arrives owned
 * before the store, so stores to a cold output do not pile up in the store
 * buffer waiting for their read-for-ownership. */
#ifndef CN_PREFETCHW_BYTES
#define CN_PREFETCHW_BYTES CN_PREFETCH_BYTES
#endif
#if defined(__GNUC__) || defined(__clang__)
#define CN_PREFETCHW_AT(p) __builtin_prefetch((const char *)(p), 1, 3)
#else
#define CN_PREFETCHW_AT(p) ((void)0)
#endif
#define CN_PREFETCHW(p) CN_PREFETCHW_AT((const char *)(p) + CN_PREFETCHW_BYTES)
/* Rows up to this long are "short": a loop over one of them is over before
 * the hardware streamer ramps up, so callers prefetch the rows that follow
 * (cn_stats.h); longer rows prefetch within themselves. */
#define CN_PREFETCH_ROW_BYTES 1024
#define CN_PREFETCHW_BLOCK(IO, p) CN_PREFETCH_SPAN(CN_PREFETCHW, p, CN_BLOCK * sizeof(IO))
/* The reductions run in blocks of CN_BLOCK elements: one prefetch per 64-byte
 * line of the block ahead of it, then the lanes.  A prefetch inside the
 * lane loop itself made GCC give up vectorizing it. */
#define CN_BLOCK (4 * CN_LANES)
#define CN_PREFETCH_BLOCK(IO, p) CN_PREFETCH_SPAN(CN_PREFETCH, p, CN_BLOCK * sizeof(IO))

/* Rows of a strided set (a batch-norm channel's rows, one per sample) are far
 * apart: the data CN_PREFETCH_BYTES past a row's end belongs to another
 * channel.  Past the end the look-ahead continues into the next row of the
 * set, nxt, and stops (NULL) beyond that row's end, where it would reach
 * another channel again.  nxt == p + n (contiguous rows, or no next row)
 * is plain look-ahead. */
static inline const char *cn_ahead(const char *p, ptrdiff_t i, ptrdiff_t n,
                                   const char *nxt, size_t isz) {
    ptrdiff_t t = i + (ptrdiff_t)(CN_PREFETCH_BYTES / isz);
    if (t < n || nxt == p + n * (ptrdiff_t)isz)
        return p + t * (ptrdiff_t)isz;
    return t - n < n ? nxt + (t - n) * (ptrdiff_t)isz : NULL;
}
#define CN_AHEAD(IO, p, i, n, nxt)                                                    \
    cn_ahead((const char *)(p), i, n, (const char *)(nxt), sizeof(IO))
/* every 64-byte line of the `bytes` at p, with PF (a read or a write prefetch) */
#define CN_PREFETCH_SPAN(PF, p, bytes)                                                \
    do {                                                                              \
        for (size_t l_ = 0; l_ < (size_t)(bytes); l_ += 64)                           \
            PF((const char *)(p) + l_);                                               \
    } while (0)
/* the `bytes` CN_AHEAD of p[i] (none past the set's next row) */
#define CN_PREFETCH_AHEAD_WITH(PF, IO, p, i, n, nxt, bytes)                           \
    do {                                                                              \
        const char *a_ = CN_AHEAD(IO, p, i, n, nxt);                                  \
        if (a_ != NULL)                                                               \
            CN_PREFETCH_SPAN(PF, a_, bytes);                                          \
    } while (0)
#define CN_PREFETCH_BLOCK_ROW(IO, p, i, n, nxt)                                       \
    CN_PREFETCH_AHEAD_WITH(CN_PREFETCH_AT, IO, p, i, n, nxt, CN_BLOCK * sizeof(IO))
#define CN_PREFETCHW_BLOCK_ROW(IO, p, i, n, nxt)                                      \
    CN_PREFETCH_AHEAD_WITH(CN_PREFETCHW_AT, IO, p, i, n, nxt, CN_BLOCK * sizeof(IO))

/* ---- streaming (non-temporal) stores ------------------------------------ */
/* A large output is written once and not read back by the kernel: storing it
 * around the caches saves the read-for-ownership of every line (one third of
 * the traffic of a scale pass).  Results are computed into a small aligned
 * block with the ordinary vectorized loop, then the block is streamed out, so
 * streamed and cached outputs hold the same bits. */
#if defined(__SSE2__) || defined(_M_X64) || defined(_M_AMD64)
#include <emmintrin.h>
#define CN_HAVE_STREAM 1
#define CN_STREAM_BLOCK_BYTES 1024
static inline void cn_stream_block(void *dst, const void *src) {
    for (int i = 0; i < CN_STREAM_BLOCK_BYTES; i += 16)
        _mm_stream_si128((__m128i *)((char *)dst + i), _mm_load_si128((const __m128i *)((const char *)src + i)));
}
static inline void cn_stream_fence(void) { _mm_sfence(); }
#else
#define CN_HAVE_STREAM 0
#endif

#if defined(_MSC_VER) && !defined(__clang__)
#define CN_ALIGN64 __declspec(align(64))
#else
#define CN_ALIGN64 __attribute__((aligned(64)))
#endif

/* out[J] = the storage rounding of MEXPR (math type) for J in [0, n):
 * streamed when asked (the head up to 64-byte alignment and the tail are
 * stored normally).  Cached float32/float64 stores run in blocks with a write
 * prefetch ahead (measured: batch-norm training N,C,H,W 8.0 -> 5.8 ms and
 * eval 6.2 -> 4.5 ms at 1 thread); 16-bit outputs keep one plain loop, whose
 * conversions bound them (blocking it made bfloat16 eval 1.2x slower).
 * Cached bfloat16 stores on a CPU with AVX512-BF16 (cn_pack.h) instead
 * compute blocks of float32 and round each with one instruction per 32
 * values; the bits are the same. */
#define CN_ELEMENTWISE_PACKED(SFX, out, n, nxt, J, MEXPR)                             \
    do {                                                                              \
        CN_ALIGN64 float pk_[CN_PACK_BLOCK];                                          \
        for (ptrdiff_t j_ = 0; j_ < (n); j_ += CN_PACK_BLOCK) {                       \
            ptrdiff_t e_ = (n) - j_ < CN_PACK_BLOCK ? (n) - j_ : CN_PACK_BLOCK;       \
            if ((n) * sizeof(uint16_t) > CN_PREFETCH_ROW_BYTES)                       \
                CN_PREFETCH_AHEAD_WITH(CN_PREFETCHW_AT, uint16_t, (const uint16_t *)(out), \
                                       j_, n, (const uint16_t *)(nxt),                \
                                       e_ * sizeof(uint16_t));                        \
            for (ptrdiff_t k_ = 0; k_ < e_; k_++) {                                   \
                ptrdiff_t J = j_ + k_;                                                \
                pk_[k_] = (float)(MEXPR);                                             \
            }                                                                         \
            cn_pack_bf16((uint16_t *)((out) + j_), pk_, e_);                          \
        }                                                                             \
    } while (0)
#if CN_HAVE_STREAM
#define CN_ELEMENTWISE(SFX, IO, out, n, nxt, stream, J, MEXPR)                        \
    do {                                                                              \
        ptrdiff_t j_ = 0;                                                             \
        if (CN_PACKS_##SFX && cn_bf16_pack_ok && !(stream)) {                         \
            CN_ELEMENTWISE_PACKED(SFX, out, n, nxt, J, MEXPR);                        \
            break;                                                                    \
        }                                                                             \
        if (stream) {                                                                 \
            enum { B_ = CN_STREAM_BLOCK_BYTES / sizeof(IO) };                         \
            CN_ALIGN64 IO blk_[B_];                                                   \
            for (; j_ < (n) && (((uintptr_t)((out) + j_)) & 63u); j_++) {            \
                ptrdiff_t J = j_;                                                     \
                (out)[J] = cn_store_##SFX(MEXPR);                                     \
            }                                                                         \
            for (; j_ + B_ <= (n); j_ += B_) {                                        \
                for (ptrdiff_t k_ = 0; k_ < B_; k_++) {                               \
                    ptrdiff_t J = j_ + k_;                                            \
                    blk_[k_] = cn_store_##SFX(MEXPR);                                 \
                }                                                                     \
                cn_stream_block((out) + j_, blk_);                                    \
            }                                                                         \
            cn_stream_fence();                                                        \
        }                                                                             \
        if (sizeof(IO) >= 4) {                                                        \
            for (; j_ < (n); j_ += CN_BLOCK) {                                        \
                ptrdiff_t e_ = j_ + CN_BLOCK < (n) ? j_ + CN_BLOCK : (n);             \
                CN_PREFETCHW_BLOCK_ROW(IO, out, j_, n, nxt);                          \
                for (ptrdiff_t J = j_; J < e_; J++)                                   \
                    (out)[J] = cn_store_##SFX(MEXPR);                                 \
            }                                                                         \
        }                                                                             \
        for (; j_ < (n); j_++) {                                                      \
            ptrdiff_t J = j_;                                                         \
            (out)[J] = cn_store_##SFX(MEXPR);                                         \
        }                                                                             \
    } while (0)
#else
#define CN_ELEMENTWISE(SFX, IO, out, n, nxt, stream, J, MEXPR)                        \
    do {                                                                              \
        (void)(stream);                                                               \
        if (CN_PACKS_##SFX && cn_bf16_pack_ok) {                                      \
            CN_ELEMENTWISE_PACKED(SFX, out, n, nxt, J, MEXPR);                        \
            break;                                                                    \
        }                                                                             \
        for (ptrdiff_t J = 0; J < (n); J++)                                           \
            (out)[J] = cn_store_##SFX(MEXPR);                                         \
    } while (0)
#endif

static inline double cn_merge_lanes(const double *a) {
    return ((((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])))
            + (((a[8] + a[9]) + (a[10] + a[11])) + ((a[12] + a[13]) + (a[14] + a[15]))));
}

/* loads widen to the math type; stores round back to the storage */
static inline float cn_load_f32(float x) { return x; }
static inline float cn_store_f32(float x) { return x; }
static inline double cn_load_f64(double x) { return x; }
static inline double cn_store_f64(double x) { return x; }
static inline float cn_load_bf16(uint16_t h) { return cn_bf16_bits_to_f32(h); }
static inline uint16_t cn_store_bf16(float x) { return cn_f32_to_bf16_bits(x); }
static inline float cn_load_f16(uint16_t h) { return cn_f16_bits_to_f32(h); }
static inline uint16_t cn_store_f16(float x) { return cn_f32_to_f16_bits(x); }

#endif
