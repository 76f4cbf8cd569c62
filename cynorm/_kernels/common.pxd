# Shared scalar helpers for every kernel family: the storage types, their
# conversion to the math type, and typed entry points to the hot loops of
# cn_rows.h.
#
# Determinism rule: a row reduction is defined as ROW_CHUNK-element chunks,
# each reduced with 16 independent float64 accumulators merged by a fixed
# tree (cn_rows.h), chunk results then added left to right.  Every code path
# (fused or not, any thread count) computes exactly that expression.

from libc.math cimport INFINITY

cdef extern from "cn_scalar.h" nogil:
    ctypedef struct cn_bf16:
        unsigned short bits
    ctypedef struct cn_f16:
        unsigned short bits
    float cn_bf16_to_f32(cn_bf16 h)
    cn_bf16 cn_f32_to_bf16(float f)
    float cn_f16_to_f32(cn_f16 h)
    cn_f16 cn_f32_to_f16(float f)
    const char* CN_SIMD_LEVEL
    const char* CN_COMPILER
    const char* CN_F16_IMPL
    int CN_OPENMP

cdef extern from "cn_rows.h" nogil:
    double cn_sumsq_f32(const float* x, Py_ssize_t n)
    double cn_sumsq_f64(const double* x, Py_ssize_t n)
    double cn_sumsq_bf16(const cn_bf16* x, Py_ssize_t n)
    double cn_sumsq_f16(const cn_f16* x, Py_ssize_t n)
    double cn_dot_f32(const float* x, const float* y, Py_ssize_t n)
    double cn_dot_f64(const double* x, const double* y, Py_ssize_t n)
    double cn_dot_bf16(const cn_bf16* x, const cn_bf16* y, Py_ssize_t n)
    double cn_dot_f16(const cn_f16* x, const cn_f16* y, Py_ssize_t n)
    void cn_colsq_f32(double* acc, const float* x, Py_ssize_t n)
    void cn_colsq_f64(double* acc, const double* x, Py_ssize_t n)
    void cn_colsq_bf16(double* acc, const cn_bf16* x, Py_ssize_t n)
    void cn_colsq_f16(double* acc, const cn_f16* x, Py_ssize_t n)
    void cn_coldot_f32(double* acc, const float* x, const float* y, Py_ssize_t n)
    void cn_coldot_f64(double* acc, const double* x, const double* y, Py_ssize_t n)
    void cn_coldot_bf16(double* acc, const cn_bf16* x, const cn_bf16* y, Py_ssize_t n)
    void cn_coldot_f16(double* acc, const cn_f16* x, const cn_f16* y, Py_ssize_t n)
    void cn_colsq2_f32(double* acc, const float* x0, const float* x1, Py_ssize_t n)
    void cn_colsq2_f64(double* acc, const double* x0, const double* x1, Py_ssize_t n)
    void cn_colsq2_bf16(double* acc, const cn_bf16* x0, const cn_bf16* x1, Py_ssize_t n)
    void cn_colsq2_f16(double* acc, const cn_f16* x0, const cn_f16* x1, Py_ssize_t n)
    void cn_coldot2_f32(double* acc, const float* x0, const float* y0, const float* x1, const float* y1, Py_ssize_t n)
    void cn_coldot2_f64(double* acc, const double* x0, const double* y0, const double* x1, const double* y1, Py_ssize_t n)
    void cn_coldot2_bf16(double* acc, const cn_bf16* x0, const cn_bf16* y0, const cn_bf16* x1, const cn_bf16* y1, Py_ssize_t n)
    void cn_coldot2_f16(double* acc, const cn_f16* x0, const cn_f16* y0, const cn_f16* x1, const cn_f16* y1, Py_ssize_t n)
    void cn_scale_f32(float* out, const float* x, Py_ssize_t n, float s, int stream)
    void cn_scale_f64(double* out, const double* x, Py_ssize_t n, double s, int stream)
    void cn_scale_bf16(cn_bf16* out, const cn_bf16* x, Py_ssize_t n, float s, int stream)
    void cn_scale_f16(cn_f16* out, const cn_f16* x, Py_ssize_t n, float s, int stream)
    void cn_scalecols_f32(float* out, const float* x, Py_ssize_t n, const float* s, int stream)
    void cn_scalecols_f64(double* out, const double* x, Py_ssize_t n, const double* s, int stream)
    void cn_scalecols_bf16(cn_bf16* out, const cn_bf16* x, Py_ssize_t n, const float* s, int stream)
    void cn_scalecols_f16(cn_f16* out, const cn_f16* x, Py_ssize_t n, const float* s, int stream)
    void cn_axpby_f32(float* out, const float* x, const float* y, Py_ssize_t n, float a, float b, int stream)
    void cn_axpby_f64(double* out, const double* x, const double* y, Py_ssize_t n, double a, double b, int stream)
    void cn_axpby_bf16(cn_bf16* out, const cn_bf16* x, const cn_bf16* y, Py_ssize_t n, float a, float b, int stream)
    void cn_axpby_f16(cn_f16* out, const cn_f16* x, const cn_f16* y, Py_ssize_t n, float a, float b, int stream)
    void cn_axpbycols_f32(float* out, const float* x, const float* y, Py_ssize_t n, const float* a, const float* b, int stream)
    void cn_axpbycols_f64(double* out, const double* x, const double* y, Py_ssize_t n, const double* a, const double* b, int stream)
    void cn_axpbycols_bf16(cn_bf16* out, const cn_bf16* x, const cn_bf16* y, Py_ssize_t n, const float* a, const float* b, int stream)
    void cn_axpbycols_f16(cn_f16* out, const cn_f16* x, const cn_f16* y, Py_ssize_t n, const float* a, const float* b, int stream)

# float64 storage computes in float64; the other three compute in float32.
ctypedef fused storage_t:
    float
    double
    cn_bf16
    cn_f16

cdef enum:
    # Elements per row chunk: bounds the serial part of a long row and fixes
    # where partial sums meet, independently of the thread count.
    ROW_CHUNK = 32768


cdef inline bint float32_squares_ok(double mean_square) noexcept nogil:
    """Whether a mean of squares formed in float32 (a variance plus eps, or a
    sum of squares over its count) is as accurate as float64 squares would
    make it: finite (no square or shifted value overflowed) and at least
    2**-96 (a square below float32's normal range, 2**-126, is off by at most
    that much: 2**-30 of the result).  NaN is not ok.  Rows and channels that
    fail are recomputed with float64 squares: data beyond about 1e19 or
    below 1e-19 in magnitude."""
    return float32_sum_of_squares_ok(mean_square, 1)


cdef inline bint float32_sum_of_squares_ok(double s, Py_ssize_t n) noexcept nogil:
    # float32_squares_ok(s / n) for a sum s of n squares (or products), n > 0
    return s >= n * 1.2621774483536189e-29 and s < INFINITY     # n * 2**-96


cdef inline double load(storage_t x) noexcept nogil:
    if storage_t is cn_bf16:
        return cn_bf16_to_f32(x)
    elif storage_t is cn_f16:
        return cn_f16_to_f32(x)
    else:
        return x


cdef inline double chunk_sumsq(const storage_t* x, Py_ssize_t n) noexcept nogil:
    if storage_t is float:
        return cn_sumsq_f32(x, n)
    elif storage_t is double:
        return cn_sumsq_f64(x, n)
    elif storage_t is cn_bf16:
        return cn_sumsq_bf16(x, n)
    else:
        return cn_sumsq_f16(x, n)


cdef inline double chunk_dot(const storage_t* x, const storage_t* y, Py_ssize_t n) noexcept nogil:
    if storage_t is float:
        return cn_dot_f32(x, y, n)
    elif storage_t is double:
        return cn_dot_f64(x, y, n)
    elif storage_t is cn_bf16:
        return cn_dot_bf16(x, y, n)
    else:
        return cn_dot_f16(x, y, n)


cdef inline void col_sumsq(double* acc, const storage_t* x, Py_ssize_t n) noexcept nogil:
    if storage_t is float:
        cn_colsq_f32(acc, x, n)
    elif storage_t is double:
        cn_colsq_f64(acc, x, n)
    elif storage_t is cn_bf16:
        cn_colsq_bf16(acc, x, n)
    else:
        cn_colsq_f16(acc, x, n)


cdef inline void col_dot(double* acc, const storage_t* x, const storage_t* y, Py_ssize_t n) noexcept nogil:
    if storage_t is float:
        cn_coldot_f32(acc, x, y, n)
    elif storage_t is double:
        cn_coldot_f64(acc, x, y, n)
    elif storage_t is cn_bf16:
        cn_coldot_bf16(acc, x, y, n)
    else:
        cn_coldot_f16(acc, x, y, n)


cdef inline void col_sumsq2(double* acc, const storage_t* x0, const storage_t* x1,
                            Py_ssize_t n) noexcept nogil:
    if storage_t is float:
        cn_colsq2_f32(acc, x0, x1, n)
    elif storage_t is double:
        cn_colsq2_f64(acc, x0, x1, n)
    elif storage_t is cn_bf16:
        cn_colsq2_bf16(acc, x0, x1, n)
    else:
        cn_colsq2_f16(acc, x0, x1, n)


cdef inline void col_dot2(double* acc, const storage_t* x0, const storage_t* y0,
                          const storage_t* x1, const storage_t* y1, Py_ssize_t n) noexcept nogil:
    if storage_t is float:
        cn_coldot2_f32(acc, x0, y0, x1, y1, n)
    elif storage_t is double:
        cn_coldot2_f64(acc, x0, y0, x1, y1, n)
    elif storage_t is cn_bf16:
        cn_coldot2_bf16(acc, x0, y0, x1, y1, n)
    else:
        cn_coldot2_f16(acc, x0, y0, x1, y1, n)


cdef inline double row_sumsq(const storage_t* x, Py_ssize_t n) noexcept nogil:
    cdef double s = 0.0
    cdef Py_ssize_t c = 0
    while c < n:
        s += chunk_sumsq(x + c, min(<Py_ssize_t>ROW_CHUNK, n - c))
        c += ROW_CHUNK
    return s


cdef inline double row_dot(const storage_t* x, const storage_t* y, Py_ssize_t n) noexcept nogil:
    cdef double s = 0.0
    cdef Py_ssize_t c = 0
    while c < n:
        s += chunk_dot(x + c, y + c, min(<Py_ssize_t>ROW_CHUNK, n - c))
        c += ROW_CHUNK
    return s


cdef inline void scale_row(storage_t* out, const storage_t* x, Py_ssize_t n,
                           double s, bint stream) noexcept nogil:
    # out = x * s in the math type (for float32-math storages s already holds
    # a float32 value, so the cast is exact)
    if storage_t is float:
        cn_scale_f32(out, x, n, <float>s, stream)
    elif storage_t is double:
        cn_scale_f64(out, x, n, s, stream)
    elif storage_t is cn_bf16:
        cn_scale_bf16(out, x, n, <float>s, stream)
    else:
        cn_scale_f16(out, x, n, <float>s, stream)


cdef inline void scale_cols(storage_t* out, const storage_t* x, Py_ssize_t n,
                            const void* s, bint stream) noexcept nogil:
    # out[j] = x[j] * s[j]; s holds the math type
    if storage_t is float:
        cn_scalecols_f32(out, x, n, <const float*>s, stream)
    elif storage_t is double:
        cn_scalecols_f64(out, x, n, <const double*>s, stream)
    elif storage_t is cn_bf16:
        cn_scalecols_bf16(out, x, n, <const float*>s, stream)
    else:
        cn_scalecols_f16(out, x, n, <const float*>s, stream)


cdef inline void axpby_row(storage_t* out, const storage_t* x, const storage_t* y,
                           Py_ssize_t n, double a, double b, bint stream) noexcept nogil:
    # out = a * x - b * y in the math type
    if storage_t is float:
        cn_axpby_f32(out, x, y, n, <float>a, <float>b, stream)
    elif storage_t is double:
        cn_axpby_f64(out, x, y, n, a, b, stream)
    elif storage_t is cn_bf16:
        cn_axpby_bf16(out, x, y, n, <float>a, <float>b, stream)
    else:
        cn_axpby_f16(out, x, y, n, <float>a, <float>b, stream)


cdef inline void axpby_cols(storage_t* out, const storage_t* x, const storage_t* y,
                            Py_ssize_t n, const void* a, const void* b, bint stream) noexcept nogil:
    # out[j] = a[j] * x[j] - b[j] * y[j]; a, b hold the math type
    if storage_t is float:
        cn_axpbycols_f32(out, x, y, n, <const float*>a, <const float*>b, stream)
    elif storage_t is double:
        cn_axpbycols_f64(out, x, y, n, <const double*>a, <const double*>b, stream)
    elif storage_t is cn_bf16:
        cn_axpbycols_bf16(out, x, y, n, <const float*>a, <const float*>b, stream)
    else:
        cn_axpbycols_f16(out, x, y, n, <const float*>a, <const float*>b, stream)
