/* Scalar storage conversions shared by every kernel family.
 *
 * 16-bit floats travel through the kernels as distinct one-member structs so
 * that Cython fused types can tell bfloat16 from float16 (both are uint16 on
 * the NumPy side).  All arithmetic on them happens in float32.
 *
 * Stores round to nearest even and must match ml_dtypes / NumPy casts of the
 * same float32 value bit for bit; tests/test_convert.py checks every pattern.
 */
#ifndef CN_SCALAR_H
#define CN_SCALAR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct { uint16_t bits; } cn_bf16;
typedef struct { uint16_t bits; } cn_f16;

static inline uint32_t cn_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float cn_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
/* c ? a : b as mask arithmetic: compilers if-convert (and vectorize) this
 * where a chain of ternaries stays a branch */
static inline uint32_t cn_sel(int c, uint32_t a, uint32_t b) {
    uint32_t m = 0u - (uint32_t)(c != 0);
    return (a & m) | (b & ~m);
}

/* The NaN the kernels store where a statistic, a coefficient or a value
 * computed from one is NaN: NumPy's np.nan (quiet, sign clear, no payload).
 * Where two NaNs meet in an add or a multiply, x86 and Arm return the first
 * operand's, and compilers order the operands of those as they like (clang
 * differently in each loop), so the arithmetic's own NaN would depend on the
 * compiler and the SIMD level; this one does not.  Stored to 16 bits it is
 * 0x7fc0 (bfloat16) and 0x7e00 (float16). */
static inline float cn_nan_float(void) { return cn_bits_f32(0x7fc00000u); }
static inline double cn_nan_double(void) {
    uint64_t u = 0x7ff8000000000000ull;
    double d;
    memcpy(&d, &u, 8);
    return d;
}
/* v, or the canonical NaN where v is NaN (statistics and sums, as stored).
 * On the bits: clang folds a floating-point "v is NaN ? NaN : v" into v
 * (LLVM gives a NaN no particular bits). */
static inline double cn_canonical(double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    if ((u << 1) > (0x7ff0000000000000ull << 1))
        u = 0x7ff8000000000000ull;
    memcpy(&v, &u, 8);
    return v;
}
/* cn_canonical over a[0:n], in place */
static inline void cn_canonical_run(double *a, ptrdiff_t n) {
    for (ptrdiff_t j = 0; j < n; j++)
        a[j] = cn_canonical(a[j]);
}

/* -v, negated after v is computed: clang moves a negation into the product
 * or quotient that made v (-(a * b) / c as ((-a) * b) / c), which flips no
 * NaN the multiply or divide produced or passed on (nll_loss's gradient
 * -(w * g) / total).  The empty asm hides v's origin from clang; GCC keeps
 * the order anyway. */
static inline double cn_negate(double v) {
#if defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
    __asm__("" : "+x"(v));
#elif defined(__clang__) && defined(__aarch64__)
    __asm__("" : "+w"(v));
#elif defined(__clang__)
    __asm__("" : "+m"(v));
#endif
    return -v;
}

/* ---- bfloat16: the upper half of a float32 ---------------------------- */
/* The conversions work on raw bits (uint16_t): GCC vectorizes loops over
 * uint16_t arrays, and the struct types are only for Cython's fused types. */
static inline float cn_bf16_bits_to_f32(uint16_t h) { return cn_bits_f32((uint32_t)h << 16); }

static inline uint16_t cn_f32_to_bf16_bits(float f) {
    uint32_t u = cn_f32_bits(f);
    /* round to nearest, ties to even: add 0x7fff plus the lsb kept */
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    /* ml_dtypes squashes every NaN to a quiet NaN that keeps the sign.  A
     * plain ternary on 32-bit lanes becomes one masked blend; the mask
     * arithmetic of cn_sel was narrowed to 16 bits first (3 extra permutes
     * per 32 values). */
    uint32_t nan = ((u >> 16) & 0x8000u) | 0x7fc0u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

static inline float cn_bf16_to_f32(cn_bf16 h) { return cn_bf16_bits_to_f32(h.bits); }
static inline cn_bf16 cn_f32_to_bf16(float f) { cn_bf16 r; r.bits = cn_f32_to_bf16_bits(f); return r; }
/* The first (lower address) and second bfloat16 of a 32-bit word loaded
 * from a pair (cn_load_pair), as float32: one mask or one shift. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
static inline float cn_bf16_first(uint32_t w) { return cn_bits_f32(w & 0xffff0000u); }
static inline float cn_bf16_second(uint32_t w) { return cn_bits_f32(w << 16); }
#else
static inline float cn_bf16_first(uint32_t w) { return cn_bits_f32(w << 16); }
static inline float cn_bf16_second(uint32_t w) { return cn_bits_f32(w & 0xffff0000u); }
#endif

/* ---- float16 (IEEE binary16) ------------------------------------------- */
/* Integer and float32 operations only, every case chosen by selects rather
 * than branches, so the compiler vectorizes loops over them at any target
 * (a compiler's _Float16 does not vectorize without F16C, and GCC 12 does not
 * vectorize it even with).  No step touches a float32 subnormal, so a
 * flush-to-zero mode set by another library cannot change the result. */
#define CN_F16_IMPL "integer bit operations (vectorizable)"

static inline float cn_f16_bits_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;                       /* exponent and mantissa */
    uint32_t normal = (em << 13) + (112u << 23);           /* rebias 15 -> 127 */
    /* exponent 31 -> 255: inf, NaN; a NaN comes out quiet (IEEE 754's
     * conversion, and the hardware's: Arm's FCVT, x86's VCVTPH2PS), the
     * payload kept */
    uint32_t special = (normal + (112u << 23)) | cn_sel(em > 0x7c00u, 0x00400000u, 0u);
    uint32_t sub = cn_f32_bits((float)(int32_t)em * 5.9604644775390625e-08f);  /* em * 2^-24, exact */
    uint32_t r = cn_sel(em < 0x400u, sub, cn_sel(em >= 0x7c00u, special, normal));
    return cn_bits_f32(r | sign);
}

static inline uint16_t cn_f32_to_f16_bits(float f) {
    uint32_t u = cn_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    /* normal half: rebias the exponent, round to nearest even at bit 13 (a
     * mantissa carry correctly bumps the exponent) */
    uint32_t n = a - (112u << 23);
    n = (n + 0xfffu + ((n >> 13) & 1u)) >> 13;
    /* subnormal half: in [0.5, 1) a float32 ulp is 2^-24, the half subnormal
     * step, so adding 0.5 lets the FPU round the value to nearest even */
    uint32_t s = cn_f32_bits(cn_bits_f32(a) + 0.5f) - 0x3f000000u;
    uint32_t r = cn_sel(a < 0x38800000u, s, n);
    r = cn_sel(a >= 0x477ff000u, 0x7c00u, r);                   /* rounds to >= 65520: inf */
    r = cn_sel(a > 0x7f800000u, 0x7e00u | ((a >> 13) & 0x3ffu), r);   /* NaN: quiet, top payload */
    return (uint16_t)(r | sign);
}

static inline float cn_f16_to_f32(cn_f16 h) { return cn_f16_bits_to_f32(h.bits); }
static inline cn_f16 cn_f32_to_f16(float f) { cn_f16 r; r.bits = cn_f32_to_f16_bits(f); return r; }

/* ---- per storage suffix: an element to the math type and back ------------
 * float32 and float64 compute in their own type; the 16-bit types in
 * float32.  The kernels name them by suffix (load_f32, store_bf16, ...). */
static inline float cn_load_f32(float v) { return v; }
static inline float cn_store_f32(float v) { return v; }
static inline double cn_load_f64(double v) { return v; }
static inline double cn_store_f64(double v) { return v; }
static inline float cn_load_bf16(uint16_t v) { return cn_bf16_bits_to_f32(v); }
static inline uint16_t cn_store_bf16(float v) { return cn_f32_to_bf16_bits(v); }
static inline float cn_load_f16(uint16_t v) { return cn_f16_bits_to_f32(v); }
static inline uint16_t cn_store_f16(float v) { return cn_f32_to_f16_bits(v); }

/* What the build used, for show_config(). */
#if defined(__AVX512F__)
#define CN_SIMD_LEVEL "AVX-512"
#elif defined(__AVX2__) && (defined(__FMA__) || defined(_MSC_VER))
/* MSVC's /arch:AVX2 enables FMA and F16C but defines no __FMA__ */
#define CN_SIMD_LEVEL "AVX2+FMA"
#elif defined(__AVX__)
#define CN_SIMD_LEVEL "AVX"
#elif defined(__SSE2__) || defined(_M_X64)
#define CN_SIMD_LEVEL "SSE2 (x86-64 baseline)"
#elif defined(__ARM_NEON)
#define CN_SIMD_LEVEL "NEON"
#else
#define CN_SIMD_LEVEL "scalar"
#endif

#if defined(__clang__)
#define CN_COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define CN_COMPILER "gcc " __VERSION__
#elif defined(_MSC_VER)
#define CN_COMPILER "msvc"
#else
#define CN_COMPILER "unknown"
#endif

#ifdef _OPENMP
#define CN_OPENMP _OPENMP
#else
#define CN_OPENMP 0
#endif

#endif
