/* Rounding float32 blocks to bfloat16 with AVX512-BF16 (VCVTNE2PS2BF16).
 *
 * The integer round-to-nearest-even of cn_scalar.h costs about eight vector
 * operations per 16 values; on CPUs with AVX512-BF16 one instruction rounds
 * 32.  The instruction agrees with ml_dtypes on every float32 except two
 * classes: it reads subnormal inputs as zero, and it keeps a NaN's payload
 * where ml_dtypes returns the canonical quiet NaN.  A vector holding either
 * (one VFPCLASSPS test) takes the integer path, so the bits never differ.
 *
 * Only modules built for AVX-512 (x86-64-v4, or -march=native on an AVX-512
 * CPU) carry it, and they test the CPU at load: AVX512-BF16 is not part of
 * x86-64-v4 (Sapphire Rapids and Zen 4 have it, Ice Lake and Skylake-X do
 * not).  CYNORM_NO_AVX512BF16=1 in the environment turns it off, for tests
 * and comparisons.
 */
#ifndef CN_PACK_H
#define CN_PACK_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include "cn_scalar.h"

#if ((defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10)                        \
     || (defined(__clang__) && __clang_major__ >= 9))                                     \
    && defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__)                \
    && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define CN_HAVE_BF16_PACK 1
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
    __cpuid_count(7, 1, a, b, c, d);
    (void)b; (void)c; (void)d;
    cn_bf16_pack_ok = (a >> 5) & 1u;
}

/* what the classes VFPCLASSPS tests: QNaN (0x01), denormal (0x20), SNaN (0x80) */
#define CN_PACK_ODD 0xa1

/* dst[i] = bfloat16(src[i]) for i < n, as cn_f32_to_bf16_bits */
__attribute__((target("avx512bf16"), noinline, unused))
static void cn_pack_bf16(uint16_t *dst, const float *src, ptrdiff_t n) {
    ptrdiff_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 lo = _mm512_loadu_ps(src + i), hi = _mm512_loadu_ps(src + i + 16);
        if (_mm512_fpclass_ps_mask(lo, CN_PACK_ODD) | _mm512_fpclass_ps_mask(hi, CN_PACK_ODD)) {
            for (int k = 0; k < 32; k++)
                dst[i + k] = cn_f32_to_bf16_bits(src[i + k]);
            continue;
        }
        __m512bh r = _mm512_cvtne2ps_pbh(hi, lo);
        _mm512_storeu_si512((void *)(dst + i), (__m512i)r);
    }
    for (; i < n; i += 16) {
        __mmask16 m = (__mmask16)(n - i >= 16 ? 0xffffu : (1u << (n - i)) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(m, src + i);
        if (_mm512_fpclass_ps_mask(v, CN_PACK_ODD)) {
            for (ptrdiff_t k = i; k < n && k < i + 16; k++)
                dst[k] = cn_f32_to_bf16_bits(src[k]);
            continue;
        }
        __m256bh r = _mm512_cvtneps_pbh(v);
        _mm256_mask_storeu_epi16((void *)(dst + i), m, (__m256i)r);
    }
}
#else
#define CN_HAVE_BF16_PACK 0
#define cn_bf16_pack_ok 0
static inline void cn_pack_bf16(uint16_t *dst, const float *src, ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i++)
        dst[i] = cn_f32_to_bf16_bits(src[i]);
}
#endif

/* dst[i] = bfloat16(src[i]) on whichever path this module and CPU run */
static inline void cn_f32_to_bf16_array(uint16_t *dst, const float *src, ptrdiff_t n) {
    if (cn_bf16_pack_ok) {
        cn_pack_bf16(dst, src, n);
        return;
    }
    for (ptrdiff_t i = 0; i < n; i++)
        dst[i] = cn_f32_to_bf16_bits(src[i]);
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
