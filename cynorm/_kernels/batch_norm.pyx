# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Batch-norm kernels (every kernel of the op and its split-statistics pieces).

x is seen as (A, C, B): C channels, A the axes before the channel axis
(the batch), B the axes after it (spatial; B == 1 for channels-last).

Two per-channel reductions: moments (sum of x - k and (x - k)^2 for a shift
k[c], the channel's first element) and centred gradient sums (sum dy and
sum dy*(x - mean[c])).  Two shapes cover every layout:

* rows (B >= ROW_MIN_B and 1 KiB): rows of B contiguous elements.  Tasks are
  (channel, block of the batch, chunk of the row); with few channels the
  batch is split too, so C = 3 still feeds every thread.
* columns (B small: channels-last, (N, C), small spatial): the array is
  (A, C*B); fixed blocks of rows accumulate per-column float64 partials,
  blocks merge in block order, and each channel folds its B columns in order.

Two elementwise passes: normalize (x - m[c]) * s[c] + t[c], and the gradient
(dy - p[c] - (x - m[c]) * q[c]) * a[c].  Every per-channel coefficient is
computed by the Python layer (cynorm/batchnorm.py) and arrives in the math
type.  Task boundaries and merge orders depend on the shape only: results
are bitwise identical at any thread count.
"""
from cython.parallel cimport prange
from libc.stdlib cimport calloc, malloc, free
from libc.math cimport sqrt
cimport numpy as cnp

from cynorm._kernels.stats cimport (
    cn_itemsize, cn_load_any, cn_store_math, cn_row_moments, cn_row_centered_dot,
    cn_col_moments, cn_col_centered_dot, cn_col_slot, cn_norm_row, cn_norm_cols, cn_grad_row,
    cn_grad_cols, cn_lane_moments, cn_lane_centered_dot, cn_lanes_add, CN_LANE_WORDS,
    exact_moments, math_size, load_stat, store_stat, sum_blocks,
)

from cynorm._kernels.entry cimport data, data_or_null, threads_for
# the row chunk of the determinism rule, shared with weight norm
from cynorm._kernels.common cimport ROW_CHUNK, float32_squares_ok

cnp.import_array()

cdef enum:
    # rows at least this long (elements and bytes) are reduced as rows.
    # Shorter rows are read in memory order as columns: per channel, rows of
    # 14x14 float32 ran 1.2x (backward) slower channel by channel, one short
    # strided row after another, than as columns
    ROW_MIN_B = 128
    ROW_MIN_BYTES = 1024
    # the row reduction splits the batch until there are this many tasks
    ROW_TASKS = 64
    # the column reduction: at most COL_MAX_BLOCKS row blocks of at least
    # COL_MIN_ROWS rows, COL_WIDTH columns per task, and at most
    # COL_PARTIAL_BYTES of partials (beyond that, the row shape is used)
    COL_MAX_BLOCKS = 64
    COL_MIN_ROWS = 16
    COL_WIDTH = 8192
    COL_MAX_COLUMNS = 1 << 22
    # bytes of one elementwise task in the column shape
    APPLY_TASK_BYTES = 65536
    # short rows of at least SEG_MIN_B elements are reduced as segments: in
    # memory order, each channel's row of a sample into the channel's lanes
    # (per-column partials cost a load and a store per element, and the
    # partials as much memory as a third of the input at 14x14 bfloat16);
    # SEG_BLOCKS blocks of the batch, SEG_TASKS tasks at least
    SEG_MIN_B = 64
    SEG_BLOCKS = 16
    SEG_TASKS = 16

cdef Py_ssize_t COL_PARTIAL_BYTES = 64 << 20

cdef enum:
    # training passes run channel by channel ("fused": the channel's
    # statistics, then its elementwise pass while it is still in L2) when
    # there are enough channels to share out and a channel fits in L2
    FUSED_MIN_CHANNELS = 16
    FUSED_MAX_CHANNEL_BYTES = 1 << 20

cdef enum:
    OP_MOMENTS = 0
    OP_GRAD_SUMS = 1

cdef Py_ssize_t STREAM_MIN_BYTES = 32 << 20


cdef inline bint use_columns(Py_ssize_t C, Py_ssize_t B, int code) noexcept nogil:
    return ((B < ROW_MIN_B or B * <Py_ssize_t>cn_itemsize(code) < ROW_MIN_BYTES)
            and C * B <= COL_MAX_COLUMNS)


cdef inline bint use_segments(Py_ssize_t C, Py_ssize_t B, int code) noexcept nogil:
    return B >= SEG_MIN_B and use_columns(C, B, code)


cdef int reduce_rows(int op, int code, const char* x, const char* dy, const double* center,
                     double* s1, double* s2, Py_ssize_t A, Py_ssize_t C, Py_ssize_t B,
                     int nt) noexcept nogil:
    cdef size_t isz = cn_itemsize(code)
    cdef Py_ssize_t nbc = (B + ROW_CHUNK - 1) // ROW_CHUNK
    cdef Py_ssize_t nab, rb, per_c, ntask, t, c, rem, ab, bc, a, off, n, b0
    cdef double* part
    nab = min(A, max(<Py_ssize_t>1, (ROW_TASKS + C * nbc - 1) // (C * nbc)))
    rb = (A + nab - 1) // nab
    nab = (A + rb - 1) // rb
    per_c = nab * nbc
    ntask = C * per_c
    part = <double*>calloc(2 * ntask, sizeof(double))
    if part == NULL:
        return -1
    for t in prange(ntask, schedule='static', num_threads=nt):
        c = t // per_c
        rem = t - c * per_c
        ab = rem // nbc
        bc = rem - ab * nbc
        b0 = bc * ROW_CHUNK
        n = min(<Py_ssize_t>ROW_CHUNK, B - b0)
        # the block's rows of this chunk in one call (rows C*B apart)
        a = ab * rb
        off = (a * C + c) * B + b0
        if op == OP_MOMENTS:
            cn_row_moments(code, x + off * isz, n, min(rb, A - a), C * B, center[c], part + 2 * t)
        else:
            cn_row_centered_dot(code, dy + off * isz, x + off * isz, NULL, n, min(rb, A - a),
                                C * B, center[c], part + 2 * t)
    for c in range(C):
        s1[c] = 0.0
        s2[c] = 0.0
        for t in range(c * per_c, (c + 1) * per_c):
            s1[c] += part[2 * t]
            s2[c] += part[2 * t + 1]
    free(part)
    return 0


cdef void* pack_columns(int code, const double* per_channel, Py_ssize_t C,
                        Py_ssize_t B, bint slots=False) noexcept nogil:
    """per_channel[c] repeated B times, in the math type (NULL if out of memory);
    slots: in the column reductions' order (cn_col_slot)."""
    cdef void* cols = malloc(C * B * math_size(code) + 1)
    cdef Py_ssize_t c, b, j
    if cols != NULL:
        for c in range(C):
            for b in range(B):
                j = c * B + b
                cn_store_math(code, cols, cn_col_slot(code, j, C * B) if slots else j,
                              per_channel[c])
    return cols


cdef int reduce_columns(int op, int code, const char* x, const char* dy, const double* center,
                        double* s1, double* s2, Py_ssize_t A, Py_ssize_t C, Py_ssize_t B,
                        int nt) noexcept nogil:
    cdef size_t isz = cn_itemsize(code)
    cdef size_t msz = math_size(code)
    cdef Py_ssize_t CB = C * B
    cdef Py_ssize_t rb, nblk, ncc, t, blk, j0, n, r, off, c, b, j
    cdef double* part
    cdef double* p1
    cdef double* p2
    cdef char* kcols
    rb = max(<Py_ssize_t>COL_MIN_ROWS, (A + COL_MAX_BLOCKS - 1) // COL_MAX_BLOCKS)
    nblk = (A + rb - 1) // rb
    if nblk > 1 and 16 * nblk * CB > COL_PARTIAL_BYTES:
        nblk = max(<Py_ssize_t>1, COL_PARTIAL_BYTES // (16 * CB))
        rb = (A + nblk - 1) // nblk
        nblk = (A + rb - 1) // rb
    ncc = (CB + COL_WIDTH - 1) // COL_WIDTH
    kcols = <char*>pack_columns(code, center, C, B, True)
    if kcols == NULL:
        return -1
    part = <double*>calloc(2 * nblk * CB + 1, sizeof(double))
    if part == NULL:
        free(kcols)
        return -1
    for t in prange(nblk * ncc, schedule='static', num_threads=nt):
        blk = t // ncc
        j0 = (t - blk * ncc) * COL_WIDTH
        n = min(<Py_ssize_t>COL_WIDTH, CB - j0)
        r = blk * rb
        off = r * CB + j0
        if op == OP_MOMENTS:
            cn_col_moments(code, part + 2 * blk * CB + j0, part + (2 * blk + 1) * CB + j0,
                           x + off * isz, kcols + j0 * msz, n, min(rb, A - r), CB)
        else:
            cn_col_centered_dot(code, part + 2 * blk * CB + j0, part + (2 * blk + 1) * CB + j0,
                                dy + off * isz, x + off * isz, kcols + j0 * msz, n,
                                min(rb, A - r), CB)
    # blocks merge in block order into block 0 (a block's two partial rows
    # are contiguous), then each channel folds its columns in order (from
    # their slots)
    for j0 in prange(0, 2 * CB, COL_WIDTH, schedule='static', num_threads=nt):
        sum_blocks(part + j0, part + j0, nblk, 2 * CB, min(<Py_ssize_t>COL_WIDTH, 2 * CB - j0))
    for c in range(C):
        s1[c] = 0.0
        s2[c] = 0.0
        for b in range(B):
            j = cn_col_slot(code, c * B + b, CB)
            s1[c] += part[j]
            s2[c] += part[CB + j]
    free(part)
    free(kcols)
    return 0


cdef int reduce_segments(int op, int code, const char* x, const char* dy,
                         const double* center, double* s1, double* s2, Py_ssize_t A,
                         Py_ssize_t C, Py_ssize_t B, int nt) noexcept nogil:
    cdef size_t isz = cn_itemsize(code)
    cdef Py_ssize_t nblk, rb, ncc, cw, t, blk, cc, a, c, c1, off
    cdef double* lanes
    cdef double* L
    cdef double s[2]
    nblk = min(A, <Py_ssize_t>SEG_BLOCKS)
    rb = (A + nblk - 1) // nblk
    nblk = (A + rb - 1) // rb
    ncc = min(C, max(<Py_ssize_t>1, (SEG_TASKS + nblk - 1) // nblk))
    cw = (C + ncc - 1) // ncc
    ncc = (C + cw - 1) // cw
    lanes = <double*>calloc(nblk * C * CN_LANE_WORDS, sizeof(double))
    if lanes == NULL:
        return -1
    for t in prange(nblk * ncc, schedule='static', num_threads=nt):
        blk = t // ncc
        cc = t - blk * ncc
        c1 = min(C, (cc + 1) * cw)
        for a in range(blk * rb, min(A, (blk + 1) * rb)):
            for c in range(cc * cw, c1):
                off = (a * C + c) * B * isz
                L = lanes + (blk * C + c) * CN_LANE_WORDS
                if op == OP_MOMENTS:
                    cn_lane_moments(code, x + off, B, center[c], L)
                else:
                    cn_lane_centered_dot(code, dy + off, x + off, B, center[c], L)
    # blocks fold in block order
    for c in range(C):
        s[0] = 0.0
        s[1] = 0.0
        for blk in range(nblk):
            cn_lanes_add(lanes + (blk * C + c) * CN_LANE_WORDS, s)
        s1[c] = s[0]
        s2[c] = s[1]
    free(lanes)
    return 0


cdef int reduce_channels(int op, int code, const char* x, const char* dy, const double* center,
                         double* s1, double* s2, Py_ssize_t A, Py_ssize_t C, Py_ssize_t B,
                         int nt) noexcept nogil:
    cdef Py_ssize_t c
    if A == 0 or B == 0 or C == 0:
        for c in range(C):
            s1[c] = 0.0
            s2[c] = 0.0
        return 0
    if use_segments(C, B, code):
        return reduce_segments(op, code, x, dy, center, s1, s2, A, C, B, nt)
    if use_columns(C, B, code):
        return reduce_columns(op, code, x, dy, center, s1, s2, A, C, B, nt)
    return reduce_rows(op, code, x, dy, center, s1, s2, A, C, B, nt)


cdef inline double math_at(int code, const void* a, Py_ssize_t i, double default) noexcept nogil:
    # a per-channel parameter in the math type, or `default` when absent
    if a == NULL:
        return default
    return load_stat(code, a, i)


def fused_training(Py_ssize_t A, Py_ssize_t C, Py_ssize_t B, int code):
    """Whether the training passes for this shape run channel by channel.
    (The choice depends on the shape only, never on the thread count.)"""
    return (not use_columns(C, B, code) and C >= FUSED_MIN_CHANNELS
            and A * B * <Py_ssize_t>cn_itemsize(code) <= FUSED_MAX_CHANNEL_BYTES)


cdef void forward_channel(int code, const char* x, char* y, const void* w, const void* b,
                          void* save_mean, void* save_invstd, double* mean64, double* var64,
                          Py_ssize_t A, Py_ssize_t C, Py_ssize_t B, Py_ssize_t c, double eps,
                          bint stream) noexcept nogil:
    cdef double s[2]
    cdef double k, d, var, m, inv
    cdef Py_ssize_t a, b0, off
    cdef size_t isz = cn_itemsize(code)
    cdef Py_ssize_t n = A * B
    s[0] = 0.0
    s[1] = 0.0
    k = cn_load_any(code, x, c * B)
    # each chunk of the channel's rows in one call (rows C*B apart)
    b0 = 0
    while b0 < B:
        cn_row_moments(code, x + (c * B + b0) * isz, min(<Py_ssize_t>ROW_CHUNK, B - b0), A,
                       C * B, k, s)
        b0 += ROW_CHUNK
    d = s[0] / n
    var = s[1] / n - d * d
    if var < 0.0:
        var = 0.0
    m = k + d
    if code != 1 and not float32_squares_ok(var + eps):
        exact_moments(code, x + c * B * isz, A, B, C * B, &m, &var)
    mean64[c] = m
    var64[c] = var
    m = store_stat(code, save_mean, c, m)
    inv = store_stat(code, save_invstd, c, 1.0 / sqrt(var + eps))
    b0 = 0
    while b0 < B:
        off = (c * B + b0) * isz
        cn_norm_row(code, y + off, x + off, min(<Py_ssize_t>ROW_CHUNK, B - b0), A, C * B, m,
                    inv * math_at(code, w, c, 1.0), math_at(code, b, c, 0.0), NULL, NULL, stream)
        b0 += ROW_CHUNK


def training_forward(cnp.ndarray x, cnp.ndarray y, object w, object b, cnp.ndarray save_mean,
                     cnp.ndarray save_invstd, cnp.ndarray mean64, cnp.ndarray var64,
                     Py_ssize_t A, Py_ssize_t C, Py_ssize_t B, double eps, int code,
                     int n_threads):
    """The fused training forward (see fused_training): per channel, the
    batch mean and biased variance (float64, into mean64/var64), save_mean
    and save_invstd (math type), and y = (x - mean) * invstd * w + b.
    w, b: None or math-type vectors of length C."""
    cdef const char* px = <const char*>data(x)
    cdef char* py = <char*>data(y)
    cdef void* pw = data_or_null(w)
    cdef void* pb = data_or_null(b)
    cdef void* psm = data(save_mean)
    cdef void* psi = data(save_invstd)
    cdef double* pm64 = <double*>data(mean64)
    cdef double* pv64 = <double*>data(var64)
    cdef int nt = threads_for(A * C * B, n_threads)
    cdef bint stream = A * C * B * <Py_ssize_t>cn_itemsize(code) >= STREAM_MIN_BYTES
    cdef Py_ssize_t c
    with nogil:
        for c in prange(C, schedule='static', num_threads=nt):
            forward_channel(code, px, py, pw, pb, psm, psi, pm64, pv64, A, C, B, c, eps, stream)


cdef void backward_channel(int code, const char* dy, const char* x, char* gx, const void* w,
                           const void* mean, const void* invstd, double* sum_dy,
                           double* sum_dy_xmu, Py_ssize_t A, Py_ssize_t C, Py_ssize_t B,
                           Py_ssize_t c, bint stream) noexcept nogil:
    cdef double s[2]
    cdef double m = load_stat(code, mean, c)
    cdef double inv = load_stat(code, invstd, c)
    cdef Py_ssize_t a, b0, off
    cdef size_t isz = cn_itemsize(code)
    cdef Py_ssize_t n = A * B
    s[0] = 0.0
    s[1] = 0.0
    b0 = 0
    while b0 < B:
        off = (c * B + b0) * isz
        cn_row_centered_dot(code, dy + off, x + off, NULL, min(<Py_ssize_t>ROW_CHUNK, B - b0), A,
                            C * B, m, s)
        b0 += ROW_CHUNK
    sum_dy[c] = s[0]
    sum_dy_xmu[c] = s[1]
    if gx == NULL:
        return
    b0 = 0
    while b0 < B:
        off = (c * B + b0) * isz
        cn_grad_row(code, gx + off, dy + off, x + off, NULL, min(<Py_ssize_t>ROW_CHUNK, B - b0), A,
                    C * B, s[0] / n, m, s[1] / n * inv * inv, inv * math_at(code, w, c, 1.0),
                    stream)
        b0 += ROW_CHUNK


def training_backward(cnp.ndarray dy, cnp.ndarray x, object gx, object w, cnp.ndarray mean,
                      cnp.ndarray invstd, cnp.ndarray sum_dy, cnp.ndarray sum_dy_xmu,
                      Py_ssize_t A, Py_ssize_t C, Py_ssize_t B, int code, int n_threads):
    """The fused training backward (see fused_training): per channel,
    sum_dy and sum_dy_xmu (float64), then (gx not None) grad_x.
    mean, invstd: math-type vectors; w: None or a math-type vector."""
    cdef const char* pdy = <const char*>data(dy)
    cdef const char* px = <const char*>data(x)
    cdef char* pgx = <char*>data_or_null(gx)
    cdef void* pw = data_or_null(w)
    cdef void* pm = data(mean)
    cdef void* pi = data(invstd)
    cdef double* p1 = <double*>data(sum_dy)
    cdef double* p2 = <double*>data(sum_dy_xmu)
    cdef int nt = threads_for(A * C * B, n_threads)
    cdef bint stream = A * C * B * <Py_ssize_t>cn_itemsize(code) >= STREAM_MIN_BYTES
    cdef Py_ssize_t c
    with nogil:
        for c in prange(C, schedule='static', num_threads=nt):
            backward_channel(code, pdy, px, pgx, pw, pm, pi, p1, p2, A, C, B, c, stream)


def channel_moments(cnp.ndarray x, cnp.ndarray mean, cnp.ndarray var, Py_ssize_t A,
                    Py_ssize_t C, Py_ssize_t B, double eps, int code, int n_threads):
    """mean[c] and biased var[c] (float64 vectors of length C) of channel c,
    from the sums of x - k and (x - k)^2 for the shift k = x[0, c, 0]; a
    channel whose float32 squares left float32's range (var + eps tells) is
    recomputed with float64 squares.

    x: C-contiguous storage array.  Needs A * B > 0."""
    cdef const char* px = <const char*>data(x)
    cdef double* pm = <double*>data(mean)
    cdef double* pv = <double*>data(var)
    cdef int nt = threads_for(A * C * B, n_threads)
    cdef Py_ssize_t c
    cdef Py_ssize_t n = A * B
    cdef size_t isz = cn_itemsize(code)
    cdef double d, v
    cdef double* sums
    cdef int rc = -1
    with nogil:
        sums = <double*>malloc((2 * C + 1) * sizeof(double))
        if sums != NULL:
            for c in range(C):
                pm[c] = cn_load_any(code, px, c * B)      # the shifts
            rc = reduce_channels(OP_MOMENTS, code, px, NULL, pm, sums, sums + C, A, C, B, nt)
        if rc == 0:
            for c in range(C):
                d = sums[c] / n
                v = sums[C + c] / n - d * d
                if v < 0.0:
                    v = 0.0
                pm[c] = pm[c] + d
                if code != 1 and not float32_squares_ok(v + eps):
                    exact_moments(code, px + c * B * isz, A, B, C * B, &pm[c], &v)
                pv[c] = v
        free(sums)
    if rc != 0:
        raise MemoryError("batch norm: could not allocate the reduction workspace")


def channel_grad_sums(cnp.ndarray dy, cnp.ndarray x, cnp.ndarray mean, cnp.ndarray s1,
                      cnp.ndarray s2, Py_ssize_t A, Py_ssize_t C, Py_ssize_t B, int code,
                      int n_threads):
    """s1[c] = sum(dy), s2[c] = sum(dy * (x - mean[c])).

    mean: float64 vector holding math-type values; s1, s2: float64 vectors."""
    cdef const char* pdy = <const char*>data(dy)
    cdef const char* px = <const char*>data(x)
    cdef int nt = threads_for(A * C * B, n_threads)
    cdef double* pm = <double*>data(mean)
    cdef double* p1 = <double*>data(s1)
    cdef double* p2 = <double*>data(s2)
    cdef int rc
    with nogil:
        rc = reduce_channels(OP_GRAD_SUMS, code, px, pdy, pm, p1, p2, A, C, B, nt)
    if rc != 0:
        raise MemoryError("batch norm: could not allocate the reduction workspace")


cdef int apply(int code, char* out, const char* x, const char* dy, const double* cm,
               const double* cs, const double* ct, const double* ca,
               Py_ssize_t A, Py_ssize_t C, Py_ssize_t B, int nt) noexcept nogil:
    """dy == NULL: out = (x - m) * s + t with (cm, cs, ct);
    else: out = (dy - p - (x - m) * q) * a with (p, m, q, a) = (cm, cs, ct, ca)."""
    cdef size_t isz = cn_itemsize(code)
    cdef size_t msz = math_size(code)
    cdef bint stream = A * C * B * <Py_ssize_t>isz >= STREAM_MIN_BYTES
    cdef Py_ssize_t nbc, ntask, t, q, c, bc, b0, n, off, CB, ncc, r, j0, rb, nrb
    cdef char* k0
    cdef char* k1
    cdef char* k2
    cdef char* k3
    if A == 0 or C == 0 or B == 0:
        return 0
    if not use_columns(C, B, code) or use_segments(C, B, code):
        # tasks in memory order, one row chunk each: strided blocks of rows
        # measured 1.8x slower here (the prefetchers follow one stream)
        nbc = (B + ROW_CHUNK - 1) // ROW_CHUNK
        ntask = A * C * nbc
        for t in prange(ntask, schedule='static', num_threads=nt):
            q = t // nbc                       # q = a * C + c
            bc = t - q * nbc
            c = q % C
            b0 = bc * ROW_CHUNK
            n = min(<Py_ssize_t>ROW_CHUNK, B - b0)
            off = (q * B + b0) * isz
            if dy == NULL:
                cn_norm_row(code, out + off, x + off, n, 1, 0, cm[c], cs[c], ct[c], NULL, NULL,
                            stream)
            else:
                cn_grad_row(code, out + off, dy + off, x + off, NULL, n, 1, 0, cm[c], cs[c], ct[c],
                            ca[c], stream)
        return 0
    CB = C * B
    k0 = <char*>pack_columns(code, cm, C, B)
    k1 = <char*>pack_columns(code, cs, C, B)
    k2 = <char*>pack_columns(code, ct, C, B)
    k3 = <char*>pack_columns(code, ca, C, B) if dy != NULL else NULL
    if k0 == NULL or k1 == NULL or k2 == NULL or (dy != NULL and k3 == NULL):
        free(k0)
        free(k1)
        free(k2)
        free(k3)
        return -1
    ncc = (CB + COL_WIDTH - 1) // COL_WIDTH
    # a task is a block of rows of one column chunk: about APPLY_TASK_BYTES
    rb = max(<Py_ssize_t>1, APPLY_TASK_BYTES // (min(CB, <Py_ssize_t>COL_WIDTH) * <Py_ssize_t>isz))
    nrb = (A + rb - 1) // rb
    ntask = nrb * ncc
    for t in prange(ntask, schedule='static', num_threads=nt):
        r = (t // ncc) * rb
        j0 = (t % ncc) * COL_WIDTH
        n = min(<Py_ssize_t>COL_WIDTH, CB - j0)
        off = (r * CB + j0) * isz
        if dy == NULL:
            cn_norm_cols(code, out + off, x + off, n, k0 + j0 * msz, k1 + j0 * msz,
                         k2 + j0 * msz, min(rb, A - r), CB, stream)
        else:
            cn_grad_cols(code, out + off, dy + off, x + off, n, k0 + j0 * msz, k1 + j0 * msz,
                         k2 + j0 * msz, k3 + j0 * msz, min(rb, A - r), CB, stream)
    free(k0)
    free(k1)
    free(k2)
    free(k3)
    return 0


def channel_normalize(cnp.ndarray x, cnp.ndarray y, cnp.ndarray m, cnp.ndarray s,
                      cnp.ndarray t, Py_ssize_t A, Py_ssize_t C, Py_ssize_t B, int code,
                      int n_threads):
    """y = (x - m[c]) * s[c] + t[c] in the math type.

    m, s, t: float64 vectors of length C (rounded to the math type here)."""
    cdef int nt = threads_for(A * C * B, n_threads)
    cdef char* py = <char*>data(y)
    cdef const char* px = <const char*>data(x)
    cdef double* pm = <double*>data(m)
    cdef double* ps = <double*>data(s)
    cdef double* pt = <double*>data(t)
    cdef int rc
    with nogil:
        rc = apply(code, py, px, NULL, pm, ps, pt, NULL, A, C, B, nt)
    if rc != 0:
        raise MemoryError("batch norm: could not allocate the coefficient workspace")


def channel_grad_input(cnp.ndarray dy, cnp.ndarray x, cnp.ndarray gx, cnp.ndarray p,
                       cnp.ndarray m, cnp.ndarray q, cnp.ndarray a, Py_ssize_t A,
                       Py_ssize_t C, Py_ssize_t B, int code, int n_threads):
    """gx = (dy - p[c] - (x - m[c]) * q[c]) * a[c] in the math type.

    p, m, q, a: float64 vectors of length C (rounded to the math type here)."""
    cdef int nt = threads_for(A * C * B, n_threads)
    cdef char* pgx = <char*>data(gx)
    cdef const char* px = <const char*>data(x)
    cdef const char* pdy = <const char*>data(dy)
    cdef double* pp = <double*>data(p)
    cdef double* pm = <double*>data(m)
    cdef double* pq = <double*>data(q)
    cdef double* pa = <double*>data(a)
    cdef int rc
    with nogil:
        rc = apply(code, pgx, px, pdy, pp, pm, pq, pa, A, C, B, nt)
    if rc != 0:
        raise MemoryError("batch norm: could not allocate the coefficient workspace")


def set_stream_min_bytes(Py_ssize_t nbytes):
    """Outputs of at least nbytes use streaming stores; returns the old value."""
    global STREAM_MIN_BYTES
    old = STREAM_MIN_BYTES
    STREAM_MIN_BYTES = nbytes
    return old
