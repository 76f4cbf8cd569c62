/* Memory helpers the Cython loops call: software prefetch and streaming
 * (non-temporal) stores.  Plain functions, one job each; the loops that use
 * them are in the .pxd.tp / .pyx.tp templates.
 *
 * Prefetch.  The L2 streamer stops at every 4 KiB page, so a streaming read
 * asks for the data CN_PREFETCH_BYTES ahead of where it is; a prefetch of an
 * address past the end of the data never faults.
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

/* a read (cn_prefetch_read) or write (cn_prefetch_write) prefetch of every
 * 64-byte line of the nbytes at p */
static inline void cn_prefetch_read(const void *p, size_t nbytes) {
#if defined(__GNUC__) || defined(__clang__)
    for (size_t line = 0; line < nbytes; line += 64)
        __builtin_prefetch((const char *)p + line, 0, 3);
#else
    (void)p; (void)nbytes;
#endif
}

static inline void cn_prefetch_write(const void *p, size_t nbytes) {
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

#endif
