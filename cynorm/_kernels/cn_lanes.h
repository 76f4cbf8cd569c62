/* Vector lanes for the passes rendered from elementwise.pxi.tp's table.
 *
 * GCC and clang vector extensions, so that a pass's arithmetic reads as it
 * does in the table (a - b * c, scalars broadcast); each lane computes the
 * scalar loop's float32 or float64 operations in the same order, so the
 * bits are the same.  Used by the streamed float32/float64 runs (stored
 * from the registers, without a block to copy from) and by the bfloat16
 * register passes (cn_bf16_regs.h).
 */
#ifndef CN_LANES_H
#define CN_LANES_H

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && defined(__AVX__)
#include <immintrin.h>
#define CN_HAVE_LANES 1

typedef float cn_v8f __attribute__((vector_size(32)));
typedef double cn_v4d __attribute__((vector_size(32)));

static inline cn_v8f cn_v8_f32(const float *p) { return (cn_v8f)_mm256_loadu_ps(p); }
static inline cn_v4d cn_v4_f64(const double *p) { return (cn_v4d)_mm256_loadu_pd(p); }

/* one streaming (non-temporal) store of the lanes, p 32-byte aligned */
static inline void cn_stream_v8f(float *p, cn_v8f v) { _mm256_stream_ps(p, (__m256)v); }
static inline void cn_stream_v4d(double *p, cn_v4d v) { _mm256_stream_pd(p, (__m256d)v); }
#else
#define CN_HAVE_LANES 0
#endif

#endif
