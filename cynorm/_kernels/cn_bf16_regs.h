/* bfloat16 passes computed and rounded in registers, 16 values a step.
 *
 * The block pack (cn_pack.h) computes a block of float32 values into memory
 * and reads it back to round it; on AVX2 that round trip costs as much as
 * the arithmetic of a short pass.  Here a pass's 16 values go from the
 * arithmetic straight to the rounding, in registers: cn_pack.h's integer
 * rounding (cn_scalar.h's bits; a step holding a NaN value by value), or,
 * in a module compiled for AVX512-BF16 (-march=native on a CPU that has it),
 * its instruction, with the integer rounding for a step it would round
 * differently (cn_pack_odd).  Each lane computes the same float32 operations
 * as the scalar loop, so the bits are the same.  The passes themselves (the
 * arithmetic of each) are in cn_elementwise.h, their store paths in
 * cn_store_paths.h; this header holds the pieces they share.  Modules that
 * reach the instruction only through a run-time test (x86-64-v4) keep its
 * block pack.
 */
#ifndef CN_BF16_REGS_H
#define CN_BF16_REGS_H

#include <string.h>
#include "cn_lanes.h"
#include "cn_pack.h"

/* how the store drivers (cn_store_paths.h) round: CN_REGS_OFF, through the
 * block pack or value by value; CN_REGS_INT, the integer rounding in
 * registers; CN_REGS_INSN, the instruction in registers (a module compiled
 * for it, whose CPU has it) */
enum { CN_REGS_OFF = 0, CN_REGS_INT = 1, CN_REGS_INSN = 2 };

#if defined(CN_HAVE_AVX2_PACK)
#define CN_HAVE_BF16_REGS 1

/* p[0:8] widened to float32 (a bfloat16 is a float32's upper half) */
static inline cn_v8f cn_v8_bf16(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return (cn_v8f)_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
}

/* 1 where the passes round in registers: the packs are on (cn_pack.h) and
 * the CPU lacks AVX512-BF16, whose block pack stays (the column reductions,
 * cn_bf16_cols.h, use the same test) */
static inline int cn_bf16_regs_on(void) {
    return cn_bf16_pack_ok && !cn_bf16_insn;
}

/* how the store drivers (cn_store_paths.h) round (cn_bf16_regs_mode) */
#if defined(CN_HAVE_BF16_PACK) && defined(__AVX512BF16__)
#define CN_HAVE_BF16_REGS_INSN 1
#else
#define CN_HAVE_BF16_REGS_INSN 0
#endif

static inline int cn_bf16_regs_mode(void) {
    if (!cn_bf16_pack_ok)
        return CN_REGS_OFF;
    if (!cn_bf16_insn)
        return CN_REGS_INT;
    return CN_HAVE_BF16_REGS_INSN ? CN_REGS_INSN : CN_REGS_OFF;
}

/* the bfloat16 passes' lanes (cn_lanes.h's vocabulary), widened to float32,
 * computed and rounded in float32, and a step's 16 values (cn_step_bf16):
 * where the instruction rounds in registers, one AVX-512 register of 16
 * lanes; else two AVX2 registers of eight */
#if CN_HAVE_BF16_REGS_INSN
typedef float cn_v16f __attribute__((vector_size(64)));
#define CN_LANES_bf16 16
typedef cn_v16f cn_lanes_bf16;
static inline cn_v16f cn_lanes_load_bf16(const uint16_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return (cn_v16f)_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
}
static inline cn_v16f cn_lanes_coef_bf16(const float *p) { return (cn_v16f)_mm512_loadu_ps(p); }
typedef cn_v16f cn_step_bf16;
static inline __m256 cn_step_lo(cn_step_bf16 s) { return _mm512_castps512_ps256((__m512)s); }
static inline __m256 cn_step_hi(cn_step_bf16 s) { return _mm512_extractf32x8_ps((__m512)s, 1); }
#else
#define CN_LANES_bf16 8
typedef cn_v8f cn_lanes_bf16;
static inline cn_v8f cn_lanes_load_bf16(const uint16_t *p) { return cn_v8_bf16(p); }
static inline cn_v8f cn_lanes_coef_bf16(const float *p) { return cn_v8_f32(p); }
typedef struct { cn_v8f lo, hi; } cn_step_bf16;
static inline __m256 cn_step_lo(cn_step_bf16 s) { return (__m256)s.lo; }
static inline __m256 cn_step_hi(cn_step_bf16 s) { return (__m256)s.hi; }
#endif

/* *r = the bfloat16 of the step's 16 values, by the instruction (mode
 * CN_REGS_INSN) or as cn_round16_bf16_lanes; returns 1, leaving *r unset,
 * where the step needs the value-by-value rounding (a NaN), else 0.  daz:
 * the thread's denormals-are-zero flag (cn_daz_now) */
static inline int cn_round16_bf16_mode(__m256i *r, cn_step_bf16 s, int mode, int daz) {
#if CN_HAVE_BF16_REGS_INSN
    if (mode == CN_REGS_INSN && !cn_pack_odd((__m512)s, daz)) {
        *r = (__m256i)_mm512_cvtneps_pbh((__m512)s);
        return 0;
    }
#endif
    (void)mode;
    (void)daz;
    return cn_round16_bf16_lanes(r, cn_step_lo(s), cn_step_hi(s));
}

/* dst[0:16] = bfloat16 of the step's values, as cn_f32_to_bf16_bits */
static inline void cn_store16_bf16(uint16_t *dst, cn_step_bf16 s, int mode, int daz) {
    __m256i r;
    if (cn_round16_bf16_mode(&r, s, mode, daz)) {
        float f[16];
        memcpy(f, &s, sizeof f);
        cn_round_bf16(dst, f, 16);
        return;
    }
    _mm256_storeu_si256((__m256i *)dst, r);
}

/* cn_store16_bf16 as one streaming (non-temporal) store, dst 32-byte
 * aligned: a streamed output goes from the registers to memory, without a
 * block to copy from */
static inline void cn_stream16_bf16(uint16_t *dst, cn_step_bf16 s, int mode, int daz) {
    __m256i r;
    if (cn_round16_bf16_mode(&r, s, mode, daz)) {
        uint16_t h[16];
        cn_store16_bf16(h, s, CN_REGS_INT, 0);
        r = _mm256_loadu_si256((const __m256i *)h);
    }
    _mm256_stream_si256((__m256i *)dst, r);
}
#else
#define CN_HAVE_BF16_REGS 0
#define cn_bf16_regs_on() 0
#define cn_bf16_regs_mode() 0

#define CN_LANES_bf16 0
typedef float cn_lanes_bf16;
static inline float cn_lanes_load_bf16(const uint16_t *p) { return cn_bf16_bits_to_f32(*p); }
static inline float cn_lanes_coef_bf16(const float *p) { return *p; }
#endif

#endif
