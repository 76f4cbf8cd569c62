/* The calling thread's floating-point overflow flag, for the backward
 * passes' rare-case check: a pass that forms float32 terms clears the flag,
 * runs, and tests it; only when some operation overflowed (a term beyond
 * float32's range, though the exact result may be finite) does it look for
 * the outputs that came out infinite or NaN and recompute those in float64.
 * The flag is sticky and per thread, and costs a read of the control
 * register per pass, not per element.
 *
 * The compiler barriers keep the pass's loads and stores between the clear
 * and the test (the arithmetic in between feeds those stores).
 */
#ifndef CN_FPFLAGS_H
#define CN_FPFLAGS_H

#if defined(__GNUC__) || defined(__clang__)
#define CN_FP_BARRIER() __asm__ __volatile__("" ::: "memory")
#elif defined(_MSC_VER)
#include <intrin.h>
#define CN_FP_BARRIER() _ReadWriteBarrier()
#else
#define CN_FP_BARRIER() ((void)0)
#endif

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))

/* the SSE control and status register's overflow flag (OE, bit 3); x86-64
 * does its float and double arithmetic in SSE registers, never the x87 */
#define CN_MXCSR_OVERFLOW 0x8u

static inline void cn_overflow_clear(void) {
    unsigned int csr;
    __asm__ __volatile__("stmxcsr %0" : "=m"(csr) : : "memory");
    if (csr & CN_MXCSR_OVERFLOW) {      /* writing the register costs more than reading it */
        csr &= ~CN_MXCSR_OVERFLOW;
        __asm__ __volatile__("ldmxcsr %0" : : "m"(csr) : "memory");
    }
}

static inline int cn_overflow_raised(void) {
    unsigned int csr;
    __asm__ __volatile__("stmxcsr %0" : "=m"(csr) : : "memory");
    return (csr & CN_MXCSR_OVERFLOW) != 0;
}

#else

#include <fenv.h>

static inline void cn_overflow_clear(void) {
    CN_FP_BARRIER();
    feclearexcept(FE_OVERFLOW);
    CN_FP_BARRIER();
}

static inline int cn_overflow_raised(void) {
    CN_FP_BARRIER();
    return fetestexcept(FE_OVERFLOW) != 0;
}

#endif

#endif
