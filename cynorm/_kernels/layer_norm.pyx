# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Layer-norm kernels (every kernel of the op lives here).

x is seen as M rows of N contiguous elements (N = the normalized size).

* forward: each row's moments (shifted by the row's first element, see
  cn_stats.h), then the normalized row, while the row is still in cache.
* backward: each row's two sums (sum g, sum g*(x - mean), g = dy*w), then
  grad_x of the row; grad_weight and grad_bias are column sums over rows,
  accumulated per fixed block of rows into float64 partials that merge in
  block order.
* backward JVP (forward-mode derivative of the backward, float32/float64):
  per row the recomputed mean, then seven row sums, then the tangent of
  grad_x, while the row is in cache; column tangents as in the backward.

Rows are reduced serially in ROW_CHUNK pieces and row blocks depend only on
the shape, so results are bitwise identical at any thread count.  This layer
computes only: cynorm/layernorm.py validated and allocated everything.
"""
from cython cimport floating
from cython.parallel cimport prange
from libc.stdlib cimport malloc, free
from libc.string cimport memset
from libc.math cimport sqrt
cimport numpy as cnp

from cynorm._kernels.stats cimport (
    cn_itemsize, cn_load_any, cn_row_moments, cn_row_centered_dot, cn_col_scaled_dot,
    cn_col_scaled_dot2, cn_grad_rows_acc, cn_norm_row, cn_grad_row, exact_moments, math_size,
    load_stat, store_stat, sum_blocks,
)

from cynorm._kernels.entry cimport data, data_or_null, threads_for
# the row chunk of the determinism rule, shared with weight norm
from cynorm._kernels.common cimport ROW_CHUNK, float32_squares_ok

cnp.import_array()

cdef enum:
    # grad_weight / grad_bias: at most MAX_BLOCKS row blocks of at least
    # MIN_BLOCK_ROWS rows, and at most PARTIAL_BYTES of float64 column partials
    MAX_BLOCKS = 16
    MIN_BLOCK_ROWS = 8
    PARTIAL_BYTES = 4 << 20
    MERGE_WIDTH = 4096

# Outputs of at least this many bytes are stored around the caches.  With the
# write prefetch in front of cached stores (cn_rows.h), cached stores won at
# every size measured (32 MiB float32 y: 7.2 vs 7.7 ms at 1 thread, 4.3 vs 4.5
# at 2), so only outputs far beyond the last-level cache stream.
cdef Py_ssize_t STREAM_MIN_BYTES = 256 << 20


cdef void forward_row(int code, const char* x, char* y, const void* w, const void* b,
                      Py_ssize_t N, double eps, void* mean, void* rstd, Py_ssize_t r,
                      bint stream) noexcept nogil:
    cdef double s[2]
    cdef double k, mu, var, m, rs
    cdef Py_ssize_t c = 0
    cdef size_t isz = cn_itemsize(code)
    s[0] = 0.0
    s[1] = 0.0
    k = cn_load_any(code, x, 0)
    while c < N:
        cn_row_moments(code, x + c * isz, min(<Py_ssize_t>ROW_CHUNK, N - c), 1, 0, k, s)
        c += ROW_CHUNK
    mu = s[0] / N
    var = s[1] / N - mu * mu
    if var < 0.0:
        var = 0.0
    m = k + mu
    if code != 1 and not float32_squares_ok(var + eps):
        exact_moments(code, x, 1, N, N, &m, &var)
    m = store_stat(code, mean, r, m)
    rs = store_stat(code, rstd, r, 1.0 / sqrt(var + eps))
    cn_norm_row(code, y, x, N, 1, 0, m, rs, 0.0, w, b, stream)


cdef void row_sums(int code, const char* dy, const char* x, const char* w, Py_ssize_t N,
                     double m, double* s) noexcept nogil:
    """s = (sum g, sum g * (x - m)) over a row, g = dy * w, in ROW_CHUNK pieces."""
    cdef Py_ssize_t c = 0
    cdef size_t isz = cn_itemsize(code)
    cdef size_t msz = math_size(code)
    s[0] = 0.0
    s[1] = 0.0
    while c < N:
        cn_row_centered_dot(code, dy + c * isz, x + c * isz, w + c * msz if w != NULL else NULL,
                            min(<Py_ssize_t>ROW_CHUNK, N - c), 1, 0, m, s)
        c += ROW_CHUNK


cdef void backward_row(int code, const char* dy, const char* x, char* gx, const char* w,
                       Py_ssize_t N, double m, double r, bint stream) noexcept nogil:
    cdef double s[2]
    row_sums(code, dy, x, w, N, m, s)
    # grad_x = r * (g - mean(g) - xhat * mean(g * xhat)), xhat = (x - m) * r
    cn_grad_row(code, gx, dy, x, w, N, 1, 0, s[0] / N, m, r * r * s[1] / N, r, stream)


cdef void backward_block(int code, const char* dy, const char* x, char* gx, const char* w,
                         const void* mean, const void* rstd, double* part, Py_ssize_t r0,
                         Py_ssize_t r1, Py_ssize_t N) noexcept nogil:
    """Rows [r0, r1): grad_x (gx not NULL) and the block's column partials
    part[0:N] = sum dy, part[N:2N] = sum dy * xhat.  Zeroed here, by the thread
    that fills them."""
    cdef double s[2]
    cdef double coef[8]
    cdef double m, r
    cdef int i
    cdef Py_ssize_t row = r0
    cdef size_t isz = cn_itemsize(code)
    memset(part, 0, 2 * N * sizeof(double))
    if gx != NULL:
        # grad_x and the column sums in one more pass over two (cached) rows;
        # the column sums pair rows exactly as the loop below does
        while row + 1 < r1:
            for i in range(2):
                m = load_stat(code, mean, row + i)
                r = load_stat(code, rstd, row + i)
                row_sums(code, dy + (row + i) * N * isz, x + (row + i) * N * isz, w, N, m, s)
                coef[4 * i] = s[0] / N
                coef[4 * i + 1] = m
                coef[4 * i + 2] = r * r * s[1] / N
                coef[4 * i + 3] = r
            cn_grad_rows_acc(code, gx + row * N * isz, gx + (row + 1) * N * isz, part, part + N,
                             dy + row * N * isz, x + row * N * isz, dy + (row + 1) * N * isz,
                             x + (row + 1) * N * isz, w, N, coef)
            row += 2
        if row < r1:
            backward_row(code, dy + row * N * isz, x + row * N * isz, gx + row * N * isz, w, N,
                         load_stat(code, mean, row), load_stat(code, rstd, row), False)
            cn_col_scaled_dot(code, part, part + N, dy + row * N * isz, x + row * N * isz,
                              load_stat(code, mean, row), load_stat(code, rstd, row), N)
        return
    while row + 1 < r1:
        cn_col_scaled_dot2(code, part, part + N, dy + row * N * isz, x + row * N * isz,
                           load_stat(code, mean, row), load_stat(code, rstd, row),
                           dy + (row + 1) * N * isz, x + (row + 1) * N * isz,
                           load_stat(code, mean, row + 1), load_stat(code, rstd, row + 1), N)
        row += 2
    if row < r1:
        cn_col_scaled_dot(code, part, part + N, dy + row * N * isz, x + row * N * isz,
                          load_stat(code, mean, row), load_stat(code, rstd, row), N)


cdef Py_ssize_t row_blocks(Py_ssize_t M, Py_ssize_t N, Py_ssize_t* rows_per_block) noexcept nogil:
    """The row blocks of the column sums, fixed by the shape (so results do
    not depend on the thread count): their number, and rows per block."""
    cdef Py_ssize_t nblk = min(max(<Py_ssize_t>1, M // MIN_BLOCK_ROWS),
                               min(<Py_ssize_t>MAX_BLOCKS, max(<Py_ssize_t>1, PARTIAL_BYTES // (16 * N))))
    cdef Py_ssize_t rb = (M + nblk - 1) // nblk
    rows_per_block[0] = rb
    return (M + rb - 1) // rb


cdef void merge_blocks(const double* part, Py_ssize_t nblk, Py_ssize_t N, double* first,
                       double* second, int nt) noexcept nogil:
    """first[j] = sum over blocks of part[blk][0][j], second[j] likewise for
    part[blk][1][j]: blocks in block order, columns in parallel (NULL: skipped)."""
    cdef Py_ssize_t j0
    for j0 in prange(0, N, MERGE_WIDTH, schedule='static', num_threads=nt):
        if first != NULL:
            sum_blocks(first + j0, part + j0, nblk, 2 * N, min(<Py_ssize_t>MERGE_WIDTH, N - j0))
        if second != NULL:
            sum_blocks(second + j0, part + N + j0, nblk, 2 * N, min(<Py_ssize_t>MERGE_WIDTH, N - j0))


def layer_norm_forward(cnp.ndarray x, object w, object b, cnp.ndarray y, cnp.ndarray mean,
                       cnp.ndarray rstd, Py_ssize_t M, Py_ssize_t N, double eps, int code,
                       int n_threads):
    """y = (x - mean) * rstd [* w + b] over M rows of N (N > 0).

    x, y: C-contiguous storage arrays; w, b: None or math-type vectors of
    length N (both or neither); mean, rstd: math-type vectors of length M."""
    cdef const char* px = <const char*>data(x)
    cdef char* py = <char*>data(y)
    cdef void* pw = data_or_null(w)
    cdef void* pb = data_or_null(b)
    cdef void* pm = data(mean)
    cdef void* pr = data(rstd)
    cdef size_t isz = cn_itemsize(code)
    cdef int nt = threads_for(M * N, n_threads)
    cdef bint stream = M * N * <Py_ssize_t>isz >= STREAM_MIN_BYTES
    cdef Py_ssize_t r
    with nogil:
        for r in prange(M, schedule='static', num_threads=nt):
            forward_row(code, px + r * N * isz, py + r * N * isz, pw, pb, N, eps, pm, pr, r, stream)


def layer_norm_backward(cnp.ndarray dy, cnp.ndarray x, cnp.ndarray mean, cnp.ndarray rstd,
                        object w, object gx, object gw, object gb,
                        Py_ssize_t M, Py_ssize_t N, int code, int n_threads):
    """grad_x (gx, storage type) and the column sums gw = sum dy * xhat,
    gb = sum dy (float64 vectors of length N), each skipped when None.

    w: None or a math-type vector of length N; mean, rstd: math-type
    vectors of length M."""
    cdef const char* pdy = <const char*>data(dy)
    cdef const char* px = <const char*>data(x)
    cdef const char* pw = <const char*>data_or_null(w)
    cdef char* pgx = <char*>data_or_null(gx)
    cdef double* pgw = <double*>data_or_null(gw)
    cdef double* pgb = <double*>data_or_null(gb)
    cdef void* pm = data(mean)
    cdef void* pr = data(rstd)
    cdef size_t isz = cn_itemsize(code)
    cdef int nt = threads_for(M * N, n_threads)
    cdef bint stream = M * N * <Py_ssize_t>isz >= STREAM_MIN_BYTES
    cdef bint want_cols = pgw != NULL or pgb != NULL
    cdef Py_ssize_t r, rb, nblk, blk
    cdef double* part = NULL
    if M == 0 or N == 0:
        return
    if not want_cols:
        with nogil:
            for r in prange(M, schedule='static', num_threads=nt):
                backward_row(code, pdy + r * N * isz, px + r * N * isz, pgx + r * N * isz, pw,
                             N, load_stat(code, pm, r), load_stat(code, pr, r), stream)
        return
    # row blocks fixed by the shape: partial column sums per block
    nblk = row_blocks(M, N, &rb)
    part = <double*>malloc(2 * nblk * N * sizeof(double))
    if part == NULL:
        raise MemoryError("layer_norm_backward: could not allocate the reduction workspace")
    with nogil:
        for blk in prange(nblk, schedule='static', num_threads=nt):
            backward_block(code, pdy, px, pgx, pw, pm, pr, part + 2 * blk * N,
                           blk * rb, min(M, blk * rb + rb), N)
        merge_blocks(part, nblk, N, pgb, pgw, nt)
    free(part)


cdef void jvp_block(const floating* dy, const floating* x, const floating* rstd,
                    const floating* w, const floating* tdy, const floating* tx,
                    const floating* tw, floating* tgx, double* part, Py_ssize_t r0,
                    Py_ssize_t r1, Py_ssize_t N) noexcept nogil:
    """Rows [r0, r1) of the backward's JVP.  With xhat = (x - mean) * r (mean
    recomputed from x, r the saved rstd), g = dy * w, tg = tdy * w + dy * tw:

        a = mean(xhat tx), tmean = mean(tx), t_xhat = r (tx - tmean - xhat a)
        t_gx = r (tg - mean(tg) - a r (g - mean(g) - xhat c) - t_xhat c - xhat dc)
        c = mean(g xhat), dc = mean(tg xhat) + mean(g t_xhat)

    and part[0:N] += tdy xhat + dy t_xhat, part[N:2N] += tdy (column
    partials, zeroed here; NULL: not wanted).  Any of w, tdy, tx, tw, tgx
    may be NULL."""
    cdef Py_ssize_t row, j
    cdef const floating* pdy
    cdef const floating* px
    cdef const floating* ptdy
    cdef const floating* ptx
    cdef floating* ptgx
    cdef double inv_n = 1.0 / N
    cdef double mu, r, xh, wj, g, tg, t, dxh
    cdef double sg, sgx, stx, sxtx, stg, stgx, sgtx
    cdef double a, tmu, c, gbar, tgbar, dc
    if part != NULL:
        memset(part, 0, 2 * N * sizeof(double))
    for row in range(r0, r1):
        pdy = dy + row * N
        px = x + row * N
        ptdy = tdy + row * N if tdy != NULL else NULL
        ptx = tx + row * N if tx != NULL else NULL
        ptgx = tgx + row * N if tgx != NULL else NULL
        mu = 0.0
        for j in range(N):
            mu = mu + px[j]
        mu = mu * inv_n
        r = rstd[row]
        sg = sgx = stx = sxtx = stg = stgx = sgtx = 0.0
        for j in range(N):
            xh = (px[j] - mu) * r
            wj = w[j] if w != NULL else 1.0
            g = pdy[j] * wj
            sg = sg + g
            sgx = sgx + g * xh
            tg = ptdy[j] * wj if ptdy != NULL else 0.0
            if tw != NULL:
                tg = tg + pdy[j] * tw[j]
            stg = stg + tg
            stgx = stgx + tg * xh
            if ptx != NULL:
                t = ptx[j]
                stx = stx + t
                sxtx = sxtx + xh * t
                sgtx = sgtx + g * t
        a = sxtx * inv_n
        tmu = stx * inv_n
        c = sgx * inv_n
        gbar = sg * inv_n
        tgbar = stg * inv_n
        dc = stgx * inv_n + r * (sgtx * inv_n - tmu * gbar - a * c)
        for j in range(N):
            xh = (px[j] - mu) * r
            dxh = r * (ptx[j] - tmu - xh * a) if ptx != NULL else 0.0
            if ptgx != NULL:
                wj = w[j] if w != NULL else 1.0
                g = pdy[j] * wj
                tg = ptdy[j] * wj if ptdy != NULL else 0.0
                if tw != NULL:
                    tg = tg + pdy[j] * tw[j]
                ptgx[j] = <floating>(r * (tg - tgbar - a * r * (g - gbar - xh * c)
                                          - dxh * c - xh * dc))
            if part != NULL:
                part[j] = part[j] + (ptdy[j] * xh if ptdy != NULL else 0.0) + pdy[j] * dxh
                if ptdy != NULL:
                    part[N + j] = part[N + j] + ptdy[j]


cdef void jvp_all(const floating* dy, const floating* x, const floating* rstd,
                  const floating* w, const floating* tdy, const floating* tx, const floating* tw,
                  floating* tgx, double* part, double* tgw, double* tgb, Py_ssize_t M,
                  Py_ssize_t N, Py_ssize_t nblk, Py_ssize_t rb, int nt) noexcept nogil:
    cdef Py_ssize_t blk
    for blk in prange(nblk, schedule='static', num_threads=nt):
        jvp_block(dy, x, rstd, w, tdy, tx, tw, tgx,
                  part + 2 * blk * N if part != NULL else NULL, blk * rb, min(M, blk * rb + rb), N)
    if part != NULL:
        merge_blocks(part, nblk, N, tgw, tgb, nt)


def layer_norm_backward_jvp(cnp.ndarray dy, cnp.ndarray x, cnp.ndarray rstd, object w,
                            object tdy, object tx, object tw, object tgx, object tgw, object tgb,
                            Py_ssize_t M, Py_ssize_t N, int n_threads):
    """Tangents of layer_norm_backward's (grad_x, grad_weight, grad_bias)
    (see jvp_block).  dy, x, tdy, tx, tgx: C-contiguous (M, N) arrays of one
    dtype, float32 or float64; rstd (M,), w, tw (N,) of that dtype; tgw, tgb
    float64 (N,).  Optional ones may be None (tgx, tgw, tgb: not wanted)."""
    cdef bint f64 = x.dtype.num == cnp.NPY_DOUBLE
    cdef int nt = threads_for(M * N, n_threads)
    cdef double* ptgw = <double*>data_or_null(tgw)
    cdef double* ptgb = <double*>data_or_null(tgb)
    cdef double* part = NULL
    cdef Py_ssize_t nblk, rb
    if M == 0 or N == 0:
        return
    nblk = row_blocks(M, N, &rb)
    if ptgw != NULL or ptgb != NULL:
        part = <double*>malloc(2 * nblk * N * sizeof(double))
        if part == NULL:
            raise MemoryError("layer_norm_backward_jvp: could not allocate the reduction workspace")
    cdef void* pdy = data(dy)
    cdef void* px = data(x)
    cdef void* pr = data(rstd)
    cdef void* pw = data_or_null(w)
    cdef void* ptdy = data_or_null(tdy)
    cdef void* ptx = data_or_null(tx)
    cdef void* ptw = data_or_null(tw)
    cdef void* ptgx = data_or_null(tgx)
    with nogil:
        if f64:
            jvp_all(<const double*>pdy, <const double*>px, <const double*>pr, <const double*>pw,
                    <const double*>ptdy, <const double*>ptx, <const double*>ptw, <double*>ptgx,
                    part, ptgw, ptgb, M, N, nblk, rb, nt)
        else:
            jvp_all(<const float*>pdy, <const float*>px, <const float*>pr, <const float*>pw,
                    <const float*>ptdy, <const float*>ptx, <const float*>ptw, <float*>ptgx,
                    part, ptgw, ptgb, M, N, nblk, rb, nt)
    free(part)


def set_stream_min_bytes(Py_ssize_t nbytes):
    """Outputs of at least nbytes use streaming stores; returns the old value."""
    global STREAM_MIN_BYTES
    old = STREAM_MIN_BYTES
    STREAM_MIN_BYTES = nbytes
    return old
