/* bfloat16 passes computed and rounded in registers, 16 values a step.
 *
 * The block pack (cn_pack.h) computes a block of float32 values into memory
 * and reads it back to round it; on AVX2 that round trip costs as much as
 * the arithmetic of a short pass.  Here a pass's 16 values go from the
 * arithmetic straight to the integer rounding, in registers.  The rounding
 * is cn_pack.h's (cn_scalar.h's bits; a step holding a NaN value by value),
 * and each lane computes the same float32 operations as the scalar loop, so
 * the bits are the same.  The passes themselves (the arithmetic of each) are
 * in cn_elementwise.h, their store paths in cn_store_paths.h; this header
 * holds the pieces they share.  Modules whose CPU has AVX512-BF16 keep its one-instruction
 * block pack.
 */
#ifndef CN_BF16_REGS_H
#define CN_BF16_REGS_H

#include <string.h>
#include "cn_lanes.h"
#include "cn_pack.h"

#if defined(CN_HAVE_AVX2_PACK)
#define CN_HAVE_BF16_REGS 1

/* p[0:8] widened to float32 (a bfloat16 is a float32's upper half) */
static inline cn_v8f cn_v8_bf16(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return (cn_v8f)_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
}

/* 1 where the passes round in registers: the packs are on (cn_pack.h) and
 * the CPU lacks AVX512-BF16, whose block pack stays */
static inline int cn_bf16_regs_on(void) {
    return cn_bf16_pack_ok && !cn_bf16_insn;
}

/* dst[0:16] = bfloat16 of a's lanes, then b's, as cn_f32_to_bf16_bits */
static inline void cn_store16_bf16(uint16_t *dst, cn_v8f a, cn_v8f b) {
    if (cn_round16_bf16_avx2(dst, (__m256)a, (__m256)b)) {
        float f[16];
        memcpy(f, &a, sizeof a);
        memcpy(f + 8, &b, sizeof b);
        cn_round_bf16(dst, f, 16);
    }
}

/* cn_store16_bf16 as one streaming (non-temporal) store, dst 32-byte
 * aligned: a streamed output goes from the registers to memory, without a
 * block to copy from */
static inline void cn_stream16_bf16(uint16_t *dst, cn_v8f a, cn_v8f b) {
    __m256i r;
    if (cn_round16_bf16_lanes(&r, (__m256)a, (__m256)b)) {
        uint16_t h[16];
        cn_store16_bf16(h, a, b);
        r = _mm256_loadu_si256((const __m256i *)h);
    }
    _mm256_stream_si256((__m256i *)dst, r);
}

/* the bfloat16 passes' lanes (cn_lanes.h's vocabulary): eight values
 * widened to float32, computed and rounded in float32 */
#define CN_LANES_bf16 8
typedef cn_v8f cn_lanes_bf16;
static inline cn_v8f cn_lanes_load_bf16(const uint16_t *p) { return cn_v8_bf16(p); }
static inline cn_v8f cn_lanes_coef_bf16(const float *p) { return cn_v8_f32(p); }
#else
#define CN_HAVE_BF16_REGS 0
#define cn_bf16_regs_on() 0

#define CN_LANES_bf16 0
typedef float cn_lanes_bf16;
static inline float cn_lanes_load_bf16(const uint16_t *p) { return cn_bf16_bits_to_f32(*p); }
static inline float cn_lanes_coef_bf16(const float *p) { return *p; }
#endif

#endif
