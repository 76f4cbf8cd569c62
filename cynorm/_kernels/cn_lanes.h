/* Vector lanes for the elementwise passes (cn_elementwise.h).
 *
 * GCC and clang vector extensions, so that a pass's vector arithmetic reads
 * as its scalar arithmetic does (a - b * c, scalars broadcast); each lane
 * computes the scalar loop's float32 or float64 operations in the same
 * order, so the bits are the same.  Used by the streamed float32/float64
 * runs (stored from the registers, without a block to copy from) and by the
 * bfloat16 register passes (cn_bf16_regs.h).
 *
 * Per storage suffix (float32 and float64 here, float16 too, bfloat16 in
 * cn_bf16_regs.h), what a pass's lanes are: cn_lanes_<sfx>, the vector of
 * math values; cn_lanes_load_<sfx>, storage elements p[0:width] into it;
 * cn_lanes_coef_<sfx>, math-type coefficients into it; CN_LANES_<sfx>, the
 * width, 0 where the module has no vector lanes for the type; and for
 * float32 and float64 with lanes, cn_lanes_stream_<sfx>, one streaming
 * store of them (p 32-byte aligned).  Without them
 * the three are over one value, so that every pass's vector function still
 * compiles; nothing calls it then.
 */
#ifndef CN_LANES_H
#define CN_LANES_H

#include <stdint.h>
#include "cn_scalar.h"

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

#define CN_LANES_f32 8
typedef cn_v8f cn_lanes_f32;
static inline cn_v8f cn_lanes_load_f32(const float *p) { return cn_v8_f32(p); }
static inline cn_v8f cn_lanes_coef_f32(const float *p) { return cn_v8_f32(p); }
static inline void cn_lanes_stream_f32(float *p, cn_v8f v) { cn_stream_v8f(p, v); }
#define CN_LANES_f64 4
typedef cn_v4d cn_lanes_f64;
static inline cn_v4d cn_lanes_load_f64(const double *p) { return cn_v4_f64(p); }
static inline cn_v4d cn_lanes_coef_f64(const double *p) { return cn_v4_f64(p); }
static inline void cn_lanes_stream_f64(double *p, cn_v4d v) { cn_stream_v4d(p, v); }
#else
#define CN_HAVE_LANES 0

#define CN_LANES_f32 0
typedef float cn_lanes_f32;
static inline float cn_lanes_load_f32(const float *p) { return *p; }
static inline float cn_lanes_coef_f32(const float *p) { return *p; }
#define CN_LANES_f64 0
typedef double cn_lanes_f64;
static inline double cn_lanes_load_f64(const double *p) { return *p; }
static inline double cn_lanes_coef_f64(const double *p) { return *p; }
#endif

/* float16: value by value on every target (its conversions vectorize in
 * the plain loops) */
#define CN_LANES_f16 0
typedef float cn_lanes_f16;
static inline float cn_lanes_load_f16(const uint16_t *p) { return cn_f16_bits_to_f32(*p); }
static inline float cn_lanes_coef_f16(const float *p) { return *p; }

#endif
