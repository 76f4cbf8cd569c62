/* Rounding float32 blocks to bfloat16 with AVX512-BF16 (VCVTNE2PS2BF16).
 *
 * The integer round-to-nearest-even of cn_scalar.h costs about eight vector
 * operations per 16 values; on CPUs with AVX512-BF16 one instruction rounds
 * 32.  The instruction agrees with ml_dtypes on every float32 except two
 * classes: it reads subnormal inputs as zero, and it keeps a NaN's payload
 * where ml_dtypes returns the canonical quiet NaN.  A vector holding either
 * takes the integer path, so the bits never differ, also under a
 * denormals-are-zero mode another library may have set (cn_pack_odd).
 *
 * Only modules built for AVX-512 (x86-64-v4, or -march=native on an AVX-512
 * CPU) carry it, and each tests the CPU when it loads: AVX512-BF16 is not part
 * of x86-64-v4 (Sapphire Rapids and Zen 4 have it, Ice Lake and Skylake-X do
 * not).  CYNORM_NO_AVX512BF16=1 in the environment before import turns it
 * off, for tests and comparisons.  Streamed (non-temporal) outputs keep the
 * integer path (cn_rows.h).
 */
#ifndef CN_PACK_H
#define CN_PACK_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include "cn_scalar.h"

/* the compiler must know the intrinsics (GCC >= 10, LLVM clang >= 9; Apple's
 * clang numbers its versions differently, so ask for the header) */
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)                      \
    && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)             \
    && defined(__AVX512VL__) && defined(__has_include)
#if __has_include(<avx512bf16intrin.h>)
#define CN_HAVE_BF16_PACK 1
#endif
#endif

/* the integer rounding of cn_scalar.h over n values: the path without the
 * instruction, and the fallback of vectors it would round differently */
static inline void cn_round_bf16(uint16_t *dst, const float *src, ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i++)
        dst[i] = cn_f32_to_bf16_bits(src[i]);
}

#if defined(CN_HAVE_BF16_PACK)
#include <immintrin.h>
#include <cpuid.h>

/* 1 once the load-time probe found AVX512-BF16 (and it is not turned off) */
static int cn_bf16_pack_ok = 0;

__attribute__((constructor)) static void cn_bf16_pack_probe(void) {
    unsigned a, b, c, d;
    const char *off = getenv("CYNORM_NO_AVX512BF16");
    if (off != NULL && off[0] != '\0' && !(off[0] == '0' && off[1] == '\0'))
        return;
    /* this module runs AVX-512 code already, so the OS saves ZMM state; the
     * feature bit is CPUID leaf 7, subleaf 1, EAX bit 5 */
    if (__get_cpuid_max(0, NULL) < 7)
        return;
    __cpuid_count(7, 0, a, b, c, d);
    if (a < 1)                      /* subleaf 1 not reported */
        return;
    __cpuid_count(7, 1, a, b, c, d);
    (void)b; (void)c; (void)d;
    cn_bf16_pack_ok = (a >> 5) & 1u;
}

/* lanes of v that hold a subnormal or a NaN.  VFPCLASSPS (classes QNaN 0x01,
 * denormal 0x20, SNaN 0x80) takes one instruction but reads subnormals as
 * zero while the MXCSR's denormals-are-zero flag is set; integer compares on
 * the bits do not care (a = |bits|: a - 1 below 0x7fffff, wrapping so that
 * zero is not, or a above infinity), at four times the cost, so they run
 * only under DAZ. */
__attribute__((target("avx512bf16"), always_inline, unused))
static inline __mmask16 cn_pack_odd(__m512 v, int daz) {
    if (!daz)
        return _mm512_fpclass_ps_mask(v, 0xa1);
    __m512i a = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
    __mmask16 sub = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(a, _mm512_set1_epi32(1)),
                                            _mm512_set1_epi32(0x7fffff));
    return sub | _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000));
}

/* dst[i] = bfloat16(src[i]) for i < n, as cn_f32_to_bf16_bits; one copy of
 * the loop per DAZ state, so the class test is fixed inside it */
__attribute__((target("avx512bf16"), always_inline, unused))
static inline void cn_pack_bf16_loop(uint16_t *dst, const float *src, ptrdiff_t n, int daz) {
    ptrdiff_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 lo = _mm512_loadu_ps(src + i), hi = _mm512_loadu_ps(src + i + 16);
        if (cn_pack_odd(lo, daz) | cn_pack_odd(hi, daz)) {
            cn_round_bf16(dst + i, src + i, 32);
            continue;
        }
        __m512bh r = _mm512_cvtne2ps_pbh(hi, lo);
        _mm512_storeu_si512((void *)(dst + i), (__m512i)r);
    }
    for (; i < n; i += 16) {
        __mmask16 m = (__mmask16)(n - i >= 16 ? 0xffffu : (1u << (n - i)) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(m, src + i);       /* zeros beyond n: not odd */
        if (cn_pack_odd(v, daz)) {
            cn_round_bf16(dst + i, src + i, n - i < 16 ? n - i : 16);
            continue;
        }
        __m256bh r = _mm512_cvtneps_pbh(v);
        _mm256_mask_storeu_epi16((void *)(dst + i), m, (__m256i)r);
    }
}

/* whether this thread's MXCSR has denormals-are-zero set, for cn_pack_bf16:
 * reading the MXCSR waits for the floating-point work in flight, so a pass
 * reads it once, not once per block */
static inline int cn_daz_now(void) {
    return (_mm_getcsr() & 0x0040u) != 0;
}

/* dst[i] = bfloat16(src[i]) for i < n, as cn_f32_to_bf16_bits; daz: the
 * calling thread's cn_daz_now() */
__attribute__((target("avx512bf16"), noinline, unused))
static void cn_pack_bf16(uint16_t *dst, const float *src, ptrdiff_t n, int daz) {
    if (daz)
        cn_pack_bf16_loop(dst, src, n, 1);
    else
        cn_pack_bf16_loop(dst, src, n, 0);
}
#else
#define CN_HAVE_BF16_PACK 0
#define cn_bf16_pack_ok 0
#define cn_daz_now() 0
#define cn_pack_bf16(dst, src, n, daz) cn_round_bf16(dst, src, n)
#endif

/* dst[i] = bfloat16(src[i]) on whichever path this module and CPU run */
static inline void cn_f32_to_bf16_array(uint16_t *dst, const float *src, ptrdiff_t n) {
    if (cn_bf16_pack_ok)
        cn_pack_bf16(dst, src, n, cn_daz_now());
    else
        cn_round_bf16(dst, src, n);
}

static inline const char *cn_bf16_store_path(void) {
    return cn_bf16_pack_ok ? "AVX512-BF16 (VCVTNE2PS2BF16; subnormals and NaNs: integer)"
                           : "integer round-to-nearest-even";
}

/* which storage suffixes (cn_rows.h) the packed path serves */
#define CN_PACKS_f32 0
#define CN_PACKS_f64 0
#define CN_PACKS_f16 0
#define CN_PACKS_bf16 CN_HAVE_BF16_PACK
/* values per packed block: computed in float32 into a 1 KiB stack block, then
 * rounded by cn_pack_bf16 */
#define CN_PACK_BLOCK 256

#endif
