/* Which x86-64 micro-architecture level this CPU, and the OS, can run:
 * 3 = x86-64-v3 (AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE), 4 = x86-64-v4
 * (AVX-512 F/BW/CD/DQ/VL), 5 = x86-64-v4 with AVX512-BF16 (Sapphire Rapids,
 * Zen 4: not a psABI level, the dispatching build's fourth), else 1.  The
 * dispatching build picks its kernel modules by it
 * (cynorm/_kernels/__init__.py).
 *
 * Read from CPUID directly rather than with GCC's __builtin_cpu_supports, so
 * that MSVC (Windows wheels) and GCC/clang share one definition.  The OS part
 * matters: a CPU with AVX-512 under an OS (or hypervisor) that does not save
 * the ZMM registers on a context switch must not run AVX-512 code, which is
 * what the XCR0 bits say.
 */
#ifndef CN_CPU_H
#define CN_CPU_H

#if defined(_MSC_VER) && !defined(__clang__) && (defined(_M_X64) || defined(_M_IX86))
#include <intrin.h>
#define CN_CPU_X86 1
static void cn_cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
    int v[4];
    __cpuidex(v, (int)leaf, (int)sub);
    r[0] = (unsigned)v[0]; r[1] = (unsigned)v[1]; r[2] = (unsigned)v[2]; r[3] = (unsigned)v[3];
}
static unsigned long long cn_xcr0(void) { return _xgetbv(0); }
#elif (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#define CN_CPU_X86 1
static void cn_cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}
static unsigned long long cn_xcr0(void) {
    /* the xgetbv instruction by its bytes: assemblers older than AVX lack the mnemonic */
    unsigned lo, hi;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#else
#define CN_CPU_X86 0
#endif

#define CN_BIT(word, bit) (((word) >> (bit)) & 1u)

/* whether the CPU has AVX512-BF16 (CPUID leaf 7, subleaf 1, EAX bit 5); the
 * caller knows the OS saves the ZMM state (cn_cpu_level's v4, or a module
 * already running AVX-512 code: cn_pack.h) */
static int cn_cpu_avx512bf16(void) {
#if CN_CPU_X86
    unsigned top[4], r7[4], r71[4];
    cn_cpuid(0, 0, top);
    if (top[0] < 7) return 0;
    cn_cpuid(7, 0, r7);
    if (r7[0] < 1) return 0;                        /* subleaf 1 not reported */
    cn_cpuid(7, 1, r71);
    return (int)CN_BIT(r71[0], 5);
#else
    return 0;
#endif
}

static int cn_cpu_level(void) {
#if CN_CPU_X86
    unsigned r1[4], r7[4] = {0, 0, 0, 0}, rx[4] = {0, 0, 0, 0}, top[4];
    cn_cpuid(0, 0, top);
    if (top[0] < 1) return 1;
    cn_cpuid(1, 0, r1);
    if (top[0] >= 7) cn_cpuid(7, 0, r7);
    cn_cpuid(0x80000000u, 0, top);
    if (top[0] >= 0x80000001u) cn_cpuid(0x80000001u, 0, rx);
    unsigned ecx1 = r1[2], ebx7 = r7[1], ecxx = rx[2];
    /* OSXSAVE first: xgetbv faults without it */
    if (!CN_BIT(ecx1, 27)) return 1;
    unsigned long long xcr0 = cn_xcr0();
    int os_avx = (xcr0 & 0x6) == 0x6;              /* XMM and YMM state */
    int os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM0-15 upper, ZMM16-31 */
    int v2 = CN_BIT(ecx1, 0) && CN_BIT(ecx1, 9) && CN_BIT(ecx1, 13) && CN_BIT(ecx1, 19)
          && CN_BIT(ecx1, 20) && CN_BIT(ecx1, 23);  /* SSE3 SSSE3 CX16 SSE4.1 SSE4.2 POPCNT */
    int v3 = v2 && os_avx
          && CN_BIT(ecx1, 28) && CN_BIT(ecx1, 12) && CN_BIT(ecx1, 29) && CN_BIT(ecx1, 22)
             /* AVX FMA F16C MOVBE */
          && CN_BIT(ebx7, 5) && CN_BIT(ebx7, 3) && CN_BIT(ebx7, 8)   /* AVX2 BMI1 BMI2 */
          && CN_BIT(ecxx, 5);                                        /* LZCNT */
    int v4 = v3 && os_avx512
          && CN_BIT(ebx7, 16) && CN_BIT(ebx7, 17) && CN_BIT(ebx7, 28)
          && CN_BIT(ebx7, 30) && CN_BIT(ebx7, 31);   /* AVX512 F DQ CD BW VL */
    return v4 && cn_cpu_avx512bf16() ? 5 : v4 ? 4 : v3 ? 3 : 1;
#else
    return 1;
#endif
}

#undef CN_BIT
#endif /* CN_CPU_H */
