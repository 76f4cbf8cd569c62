# Typed declarations of cn_stats.h: the hot loops of layer norm and batch
# norm, dispatched in C by the storage code (0 float32, 1 float64,
# 2 bfloat16, 3 float16).  Scalars are passed as double and rounded once to
# the math type; coefficient arrays hold the math type (double for code 1,
# float otherwise); sums accumulate in float64.

cdef extern from "cn_stats.h" nogil:
    size_t cn_itemsize(int code)
    double cn_load_any(int code, const void* x, Py_ssize_t i)
    void cn_store_math(int code, void* m, Py_ssize_t i, double v)
    # row kernels: `rows` rows of n elements, `ld` elements apart
    void cn_row_moments(int code, const void* x, Py_ssize_t n, Py_ssize_t rows, Py_ssize_t ld,
                        double k, double* s)
    void cn_row_centered_dot(int code, const void* dy, const void* x, const void* w,
                             Py_ssize_t n, Py_ssize_t rows, Py_ssize_t ld, double mu, double* s)
    # one row into float64 lanes carried between calls (CN_LANE_WORDS
    # doubles, zeroed first); cn_lanes_add folds them: s[0], s[1] += the sums
    enum: CN_LANE_WORDS
    void cn_lane_moments(int code, const void* x, Py_ssize_t n, double k, double* L)
    void cn_lane_centered_dot(int code, const void* dy, const void* x, Py_ssize_t n, double mu,
                              double* L)
    void cn_lanes_add(const double* L, double* s)
    # column kernels: `rows` rows of n columns, `ld` elements apart.  The
    # moments and centred dot keep column j's float64 partial (and read its
    # shift or mean) at cn_col_slot(code, j, n) of the n columns
    Py_ssize_t cn_col_slot(int code, Py_ssize_t j, Py_ssize_t n)
    void cn_col_moments(int code, double* a1, double* a2, const void* x, const void* k,
                        Py_ssize_t n, Py_ssize_t rows, Py_ssize_t ld)
    void cn_col_centered_dot(int code, double* a1, double* a2, const void* dy, const void* x,
                             const void* mu, Py_ssize_t n, Py_ssize_t rows, Py_ssize_t ld)
    void cn_col_scaled_dot(int code, double* a1, double* a2, const void* dy, const void* x,
                           double mu, double r, Py_ssize_t n)
    void cn_col_scaled_dot2(int code, double* a1, double* a2, const void* dy0, const void* x0,
                            double mu0, double r0, const void* dy1, const void* x1, double mu1,
                            double r1, Py_ssize_t n)
    void cn_grad_rows_acc(int code, void* out0, void* out1, double* a1, double* a2,
                          const void* dy0, const void* x0, const void* dy1, const void* x1,
                          const void* w, Py_ssize_t n, const double* coef)
    void cn_norm_row(int code, void* out, const void* x, Py_ssize_t n, Py_ssize_t rows,
                     Py_ssize_t ld, double mu, double s, double t, const void* w, const void* b,
                     int stream)
    void cn_norm_cols(int code, void* out, const void* x, Py_ssize_t n, const void* mu,
                      const void* s, const void* t, Py_ssize_t rows, Py_ssize_t ld, int stream)
    void cn_grad_row(int code, void* out, const void* dy, const void* x, const void* w,
                     Py_ssize_t n, Py_ssize_t rows, Py_ssize_t ld, double p, double mu, double q,
                     double a, int stream)
    void cn_grad_cols(int code, void* out, const void* dy, const void* x, Py_ssize_t n,
                      const void* p, const void* mu, const void* q, const void* a,
                      Py_ssize_t rows, Py_ssize_t ld, int stream)


cdef inline size_t math_size(int code) noexcept nogil:
    # bytes of one math-type value: float64 storage computes in float64,
    # every other storage in float32
    return 8 if code == 1 else 4


cdef inline double load_stat(int code, const void* a, Py_ssize_t i) noexcept nogil:
    # saved statistics (mean, rstd, invstd) have the math type too
    if code == 1:
        return (<const double*>a)[i]
    return (<const float*>a)[i]


cdef inline double store_stat(int code, void* a, Py_ssize_t i, double v) noexcept nogil:
    # stores a statistic in the math type; returns the stored (rounded) value,
    # which the elementwise pass then uses, as the backward will
    if code == 1:
        (<double*>a)[i] = v
        return v
    (<float*>a)[i] = <float>v
    return <float>v


cdef inline void sum_blocks(double* out, const double* p, Py_ssize_t nblk, Py_ssize_t stride,
                            Py_ssize_t n) noexcept nogil:
    # out[j] = p[j] + p[stride + j] + ... (nblk terms, in that order, from
    # zero: -0.0 terms give +0.0), for the float64 partials of fixed row
    # blocks.  A block at a time over contiguous columns, so it vectorizes;
    # a column at a time across the blocks it was a scalar loop (13 % of
    # layer-norm backward at (64, 16384)).  out may be p itself.
    cdef Py_ssize_t j, blk
    cdef const double* q
    for j in range(n):
        out[j] = 0.0 + p[j]
    for blk in range(1, nblk):
        q = p + blk * stride
        for j in range(n):
            out[j] = out[j] + q[j]


cdef inline void exact_moments(int code, const char* x, Py_ssize_t rows, Py_ssize_t n,
                               Py_ssize_t ld, double* mean, double* var) noexcept nogil:
    # mean and biased variance of `rows` rows of n elements, `ld` elements
    # apart, in two float64 passes with every square formed in float64: the
    # slow path for the rare row or channel whose float32 squares left
    # float32's range (see float32_squares_ok in common.pxd)
    cdef Py_ssize_t r, j
    cdef double s = 0.0, q = 0.0, d
    for r in range(rows):
        for j in range(n):
            s += cn_load_any(code, x, r * ld + j)
    s = s / (rows * n)
    for r in range(rows):
        for j in range(n):
            d = cn_load_any(code, x, r * ld + j) - s
            q += d * d
    mean[0] = s
    var[0] = q / (rows * n)
