/* Rounding float32 blocks to bfloat16: the block pack of the bfloat16 stores.
 *
 * The integer round-to-nearest-even of cn_scalar.h, compiled per value, costs
 * about 20 vector operations per 8 values on AVX2 (its NaN select is most of
 * it).  The kernels' bfloat16 passes therefore compute a block of float32
 * values and round the block here, by one of two packs (the elementwise
 * passes on AVX2, and in modules compiled for AVX512-BF16, round their
 * values in registers instead, with this file's cn_round16_bf16_lanes or
 * the instruction and cn_pack_odd: cn_bf16_regs.h):
 *
 * - AVX512-BF16 (VCVTNE2PS2BF16), one instruction per 32 values.  It agrees
 *   with ml_dtypes on every float32 except two classes: it reads subnormal
 *   inputs as zero, and it keeps a NaN's payload where ml_dtypes returns the
 *   canonical quiet NaN.  A vector holding either takes the integer path, so
 *   the bits never differ, also under a denormals-are-zero mode another
 *   library may have set (cn_pack_odd).  Only modules built for AVX-512
 *   (x86-64-v4, or -march=native on an AVX-512 CPU) carry it, and each tests
 *   the CPU when it loads: AVX512-BF16 is not part of x86-64-v4 (Sapphire
 *   Rapids and Zen 4 have it, Ice Lake and Skylake-X do not).
 *   CYNORM_NO_AVX512BF16=1 in the environment before import turns it off.
 * - AVX2 integer blocks: cn_scalar.h's rounding on 16 values at a time, and a
 *   block holding a NaN rounded value by value (one FP compare finds it), so
 *   the common block pays no NaN select.  Integer operations: exact under
 *   any MXCSR mode.  Every module built for AVX2 (x86-64-v3 and up, or
 *   -march=native on an AVX2 CPU) carries it; the AVX-512 modules use it where
 *   the CPU lacks AVX512-BF16.
 *
 * CYNORM_NO_BF16_PACK=1 turns both off (every value rounded on its own), for
 * tests and comparisons.  Streamed (non-temporal) outputs are packed too
 * (cn_store_paths.h); cn_pack_bf16_stream packs straight into streamed
 * lines by the instruction.
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

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && defined(__AVX2__)
#define CN_HAVE_AVX2_PACK 1
#endif

/* the integer rounding of cn_scalar.h over n values: the path without a
 * pack, and the fallback of vectors a pack would round differently */
static inline void cn_round_bf16(uint16_t *dst, const float *src, ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i++)
        dst[i] = cn_f32_to_bf16_bits(src[i]);
}

#if defined(CN_HAVE_AVX2_PACK)
#include <immintrin.h>

static inline int cn_env_set(const char *name) {
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' && !(v[0] == '0' && v[1] == '\0');
}

/* *r = the bfloat16 of a's lanes, then b's, as cn_f32_to_bf16_bits:
 * (u + 0x7fff + ((u >> 16) & 1)) >> 16 in 32-bit lanes, packed to 16 bits
 * (the values fit: no NaN, so u <= 0xff800000).  Returns 1, leaving *r
 * unset, where a lane is a NaN (ml_dtypes' canonical quiet NaN: the caller
 * rounds those 16 value by value), else 0. */
static inline int cn_round16_bf16_lanes(__m256i *r, __m256 a, __m256 b) {
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    __m256 nan = _mm256_or_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    if (!_mm256_testz_ps(nan, nan))
        return 1;
    __m256i ua = _mm256_castps_si256(a), ub = _mm256_castps_si256(b);
    __m256i ra = _mm256_add_epi32(_mm256_add_epi32(ua, bias),
                                  _mm256_and_si256(_mm256_srli_epi32(ua, 16), one));
    __m256i rb = _mm256_add_epi32(_mm256_add_epi32(ub, bias),
                                  _mm256_and_si256(_mm256_srli_epi32(ub, 16), one));
    /* packus interleaves the 128-bit halves: permute them back in order */
    __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(ra, 16), _mm256_srli_epi32(rb, 16));
    *r = _mm256_permute4x64_epi64(packed, 0xd8);
    return 0;
}

/* dst[k] = bfloat16 of lane k of a (k < 8) and of b (k >= 8); returns 1,
 * storing nothing, where a lane is a NaN (cn_round16_bf16_lanes), else 0 */
static inline int cn_round16_bf16_avx2(uint16_t *dst, __m256 a, __m256 b) {
    __m256i r;
    if (cn_round16_bf16_lanes(&r, a, b))
        return 1;
    _mm256_storeu_si256((__m256i *)dst, r);
    return 0;
}

/* dst[k] = bfloat16(src[k]) for k < 16 */
static inline void cn_pack16_bf16_avx2(uint16_t *dst, const float *src) {
    if (cn_round16_bf16_avx2(dst, _mm256_loadu_ps(src), _mm256_loadu_ps(src + 8)))
        cn_round_bf16(dst, src, 16);
}

/* dst[i] = bfloat16(src[i]) for i < n, 16 values a step; a tail of a run of
 * 16 or more takes one more step over the last 16 values (src is the float32
 * block, not dst: storing a value twice stores the same bits), so a 196-value
 * row pays no value-by-value tail */
static inline void cn_pack_bf16_avx2(uint16_t *dst, const float *src, ptrdiff_t n) {
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16)
        cn_pack16_bf16_avx2(dst + i, src + i);
    if (i == n)
        return;
    if (n >= 16)
        cn_pack16_bf16_avx2(dst + n - 16, src + n - 16);
    else
        cn_round_bf16(dst, src, n);
}
#endif

#if defined(CN_HAVE_BF16_PACK)
#include "cn_cpu.h"

/* 1 where a block pack runs (AVX2 or the instruction); 1 in cn_bf16_insn
 * once the load-time probe found AVX512-BF16 (neither turned off) */
static int cn_bf16_pack_ok = 0;
static int cn_bf16_insn = 0;

__attribute__((constructor)) static void cn_bf16_pack_probe(void) {
    if (cn_env_set("CYNORM_NO_BF16_PACK"))
        return;
    cn_bf16_pack_ok = 1;            /* this module runs AVX-512 code: AVX2 at least */
    if (cn_env_set("CYNORM_NO_AVX512BF16"))
        return;
    /* this module runs AVX-512 code already, so the OS saves ZMM state */
    cn_bf16_insn = cn_cpu_avx512bf16();
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
 * the loop per DAZ state, so the class test is fixed inside it.  stream:
 * each 32 values go out as streamed (non-temporal) stores, two 32-byte stores
 * to the 64-byte line (one 64-byte store measured no faster on Zen 4); dst
 * is then 64-byte aligned and n a multiple of 32.  A vector the instruction
 * would round differently is rounded value by value through the cache. */
__attribute__((target("avx512bf16"), always_inline, unused))
static inline void cn_pack_bf16_loop(uint16_t *dst, const float *src, ptrdiff_t n, int daz,
                                     int stream) {
    ptrdiff_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 lo = _mm512_loadu_ps(src + i), hi = _mm512_loadu_ps(src + i + 16);
        if (cn_pack_odd(lo, daz) | cn_pack_odd(hi, daz)) {
            cn_round_bf16(dst + i, src + i, 32);
            continue;
        }
        __m512i r = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
        if (stream) {
            _mm256_stream_si256((__m256i *)(dst + i), _mm512_castsi512_si256(r));
            _mm256_stream_si256((__m256i *)(dst + i + 16), _mm512_extracti64x4_epi64(r, 1));
        } else {
            _mm512_storeu_si512((void *)(dst + i), r);
        }
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

/* cn_pack_bf16 by the instruction: only where the CPU has it (stream: as
 * cn_pack_bf16_loop) */
__attribute__((target("avx512bf16"), noinline, unused))
static void cn_pack_bf16_insn(uint16_t *dst, const float *src, ptrdiff_t n, int daz,
                              int stream) {
    if (stream && daz)
        cn_pack_bf16_loop(dst, src, n, 1, 1);
    else if (stream)
        cn_pack_bf16_loop(dst, src, n, 0, 1);
    else if (daz)
        cn_pack_bf16_loop(dst, src, n, 1, 0);
    else
        cn_pack_bf16_loop(dst, src, n, 0, 0);
}

/* dst[i] = bfloat16(src[i]) for i < n, as cn_f32_to_bf16_bits; daz: the
 * calling thread's cn_daz_now() */
__attribute__((noinline, unused))
static void cn_pack_bf16(uint16_t *dst, const float *src, ptrdiff_t n, int daz) {
    if (cn_bf16_insn)
        cn_pack_bf16_insn(dst, src, n, daz, 0);
    else
        cn_pack_bf16_avx2(dst, src, n);
}

/* cn_pack_bf16 with streamed stores where the instruction packs (dst 64-byte
 * aligned, n a multiple of 32); through the cache otherwise.  The streamed
 * lines wait on the caller's cn_stream_fence. */
__attribute__((noinline, unused))
static void cn_pack_bf16_stream(uint16_t *dst, const float *src, ptrdiff_t n, int daz) {
    if (cn_bf16_insn)
        cn_pack_bf16_insn(dst, src, n, daz, 1);
    else
        cn_pack_bf16_avx2(dst, src, n);
}
#elif defined(CN_HAVE_AVX2_PACK)
#define CN_HAVE_BF16_PACK 1
#define cn_bf16_insn 0
/* 1 unless CYNORM_NO_BF16_PACK turned the pack off before import */
static int cn_bf16_pack_ok = 0;

__attribute__((constructor)) static void cn_bf16_pack_probe(void) {
    cn_bf16_pack_ok = !cn_env_set("CYNORM_NO_BF16_PACK");
}

#define cn_daz_now() 0              /* integer rounding: exact in any mode */

__attribute__((noinline, unused))
static void cn_pack_bf16(uint16_t *dst, const float *src, ptrdiff_t n, int daz) {
    (void)daz;
    cn_pack_bf16_avx2(dst, src, n);
}
#define cn_pack_bf16_stream(dst, src, n, daz) cn_pack_bf16(dst, src, n, daz)
#else
#define CN_HAVE_BF16_PACK 0
#define cn_bf16_pack_ok 0
#define cn_bf16_insn 0
#define cn_daz_now() 0
/* (daz read and dropped: integer rounding is exact in any mode) */
#define cn_pack_bf16(dst, src, n, daz) ((void)(daz), cn_round_bf16(dst, src, n))
#define cn_pack_bf16_stream(dst, src, n, daz) ((void)(daz), cn_round_bf16(dst, src, n))
#endif

/* dst[i] = bfloat16(src[i]) on whichever path this module and CPU run */
static inline void cn_f32_to_bf16_array(uint16_t *dst, const float *src, ptrdiff_t n) {
    if (cn_bf16_pack_ok)
        cn_pack_bf16(dst, src, n, cn_daz_now());
    else
        cn_round_bf16(dst, src, n);
}

static inline const char *cn_bf16_store_path(void) {
    if (!cn_bf16_pack_ok)
        return "integer round-to-nearest-even";
#if defined(__AVX512BF16__)
    if (cn_bf16_insn)
        return "AVX512-BF16 (VCVTNE2PS2BF16, in registers; subnormals and NaNs: integer)";
#endif
    return cn_bf16_insn ? "AVX512-BF16 (VCVTNE2PS2BF16; subnormals and NaNs: integer)"
                        : "AVX2 integer rounding, in registers or blocks (round-to-nearest-even; "
                          "NaN steps: per value)";
}

/* which storage suffixes (the kernels' _f32, _f64, _bf16, _f16) the packed path serves */
#define CN_PACKS_f32 0
#define CN_PACKS_f64 0
#define CN_PACKS_f16 0
#define CN_PACKS_bf16 CN_HAVE_BF16_PACK
/* values per packed block: computed in float32 into a 1 KiB stack block, then
 * rounded by cn_pack_bf16 */
#define CN_PACK_BLOCK 256

#endif
