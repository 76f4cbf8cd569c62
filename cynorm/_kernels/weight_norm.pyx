# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Weight-normalization kernels (every kernel of the op lives here).

The array is seen as (A, D, B): D is the kept axis, A the axes before it and
B the axes after it.  Two reduction shapes cover every dim:

* rows (B large, or A == 1): each (a, d) row of B contiguous elements is
  reduced in ROW_CHUNK pieces; with A == 1 and rows that fit in cache the
  norm, the scale and the store run while the row is hot ("fused").
* columns (B small, A > 1): the array is (A, C = D*B); fixed blocks of rows
  accumulate per-column float64 partials, blocks merge in order, and the B
  columns of each d fold in order.

Work splits into tasks whose boundaries depend on the shape only, and
partials merge in a fixed order, so results are bitwise identical at any
thread count.

This layer computes only: the Python layer (cynorm/weightnorm.py) has
validated shapes, dtypes and contiguity and allocated every output.
"""
from cython.parallel cimport prange
from libc.stdlib cimport malloc, free
from libc.float cimport FLT_MAX, FLT_MIN
from libc.math cimport sqrt, pow, fabs
cimport numpy as cnp

from cynorm._kernels.common cimport (
    storage_t, cn_bf16, cn_f16, cn_f32_to_bf16, cn_f32_to_f16, load, chunk_sumsq, chunk_dot,
    col_sumsq, col_dot, col_sumsq2, col_dot2, row_sumsq, row_dot, scale_row, scale_cols,
    axpby_row, axpby_cols, float32_sum_of_squares_ok, ROW_CHUNK,
)

from cynorm._kernels.entry cimport SERIAL_BELOW, data, threads_for

cnp.import_array()

cdef enum:
    OP_SUMSQ = 0
    OP_SUMABS = 1
    OP_MAXABS = 2
    OP_SUMPOW = 3
    OP_DOT = 4

cdef enum:
    # rows at least this long are reduced as rows even when A > 1
    ROW_MIN_B = 128
    # the column reduction uses at most this many row blocks (so partials
    # stay small) and at least this many rows per block
    COL_MAX_BLOCKS = 64
    COL_MIN_ROWS = 16
    # columns per column task: whole rows of common widths (sequential reads),
    # while a block's float64 partials (64 KiB) stay in L2
    COL_WIDTH = 8192
    # the fused path needs a row that stays in cache between its two passes
    # and enough rows to feed every thread
    FUSED_MAX_ROW = 262144
    FUSED_MIN_ROWS = 8

# outputs at least this large are written with streaming stores: they would
# not stay in cache anyway, and streaming saves reading every line before
# writing it.  cynorm/weightnorm.py sets it from the last-level cache size.
cdef Py_ssize_t STREAM_MIN_BYTES = 32 << 20

cdef inline bint use_rows(Py_ssize_t A, Py_ssize_t B) noexcept nogil:
    return A == 1 or B >= ROW_MIN_B


cdef inline bint use_fused(Py_ssize_t A, Py_ssize_t D, Py_ssize_t B) noexcept nogil:
    return A == 1 and B <= FUSED_MAX_ROW and D >= FUSED_MIN_ROWS


cdef inline double combine(int op, double acc, double part) noexcept nogil:
    if op == OP_MAXABS:
        # NaN propagates, as in torch.linalg.norm(ord=inf)
        if part > acc or part != part:
            return part
        return acc
    return acc + part


cdef inline double finish(int op, double r, double p) noexcept nogil:
    if op == OP_SUMSQ:
        return sqrt(r)
    if op == OP_SUMPOW:
        return pow(r, 1.0 / p)
    return r


cdef inline double chunk_reduce(int op, const storage_t* x, const storage_t* y,
                                Py_ssize_t n, double p) noexcept nogil:
    cdef Py_ssize_t j
    cdef double acc = 0.0
    if op == OP_SUMSQ:
        return chunk_sumsq(x, n)
    if op == OP_DOT:
        return chunk_dot(x, y, n)
    if op == OP_SUMABS:
        for j in range(n):
            acc += fabs(load(x[j]))
    elif op == OP_MAXABS:
        for j in range(n):
            acc = combine(OP_MAXABS, acc, fabs(load(x[j])))
    else:
        for j in range(n):
            acc += pow(fabs(load(x[j])), p)
    return acc


cdef inline void col_accumulate(int op, double* acc, const storage_t* x,
                                const storage_t* y, Py_ssize_t n, double p) noexcept nogil:
    cdef Py_ssize_t j
    cdef double t
    if op == OP_SUMSQ:
        col_sumsq(acc, x, n)
    elif op == OP_DOT:
        col_dot(acc, x, y, n)
    elif op == OP_SUMABS:
        for j in range(n):
            acc[j] += fabs(load(x[j]))
    elif op == OP_MAXABS:
        for j in range(n):
            acc[j] = combine(OP_MAXABS, acc[j], fabs(load(x[j])))
    else:
        for j in range(n):
            acc[j] += pow(fabs(load(x[j])), p)


cdef inline void col_block(int op, double* accp, const storage_t* x, const storage_t* y,
                           Py_ssize_t r0, Py_ssize_t r1, Py_ssize_t C, Py_ssize_t j0,
                           Py_ssize_t n, double p) noexcept nogil:
    """Rows [r0, r1) of columns [j0, j0 + n) into accp; sums of squares and
    dot products take the rows two at a time (the row pairing is fixed by r0,
    so it does not depend on the thread count)."""
    cdef Py_ssize_t r = r0, off, off1
    if op == OP_SUMSQ or op == OP_DOT:
        while r + 1 < r1:
            off = r * C + j0
            off1 = off + C
            if op == OP_SUMSQ:
                col_sumsq2(accp, x + off, x + off1, n)
            else:
                col_dot2(accp, x + off, y + off, x + off1, y + off1, n)
            r += 2
    while r < r1:
        off = r * C + j0
        col_accumulate(op, accp, x + off, y + off if y != NULL else NULL, n, p)
        r += 1


cdef inline void merge_blocks(int op, double* part, Py_ssize_t nblk, Py_ssize_t C,
                              Py_ssize_t j0, Py_ssize_t j1) noexcept nogil:
    """part[0, j] = the blocks' partials of column j combined in block order."""
    cdef Py_ssize_t j, blk
    cdef double acc
    for j in range(j0, j1):
        acc = part[j]
        for blk in range(1, nblk):
            acc = combine(op, acc, part[blk * C + j])
        part[j] = acc


cdef int reduce_over_d(int op, const storage_t* x, const storage_t* y,
                       Py_ssize_t A, Py_ssize_t D, Py_ssize_t B, double p,
                       double* result, int nt) noexcept nogil:
    """result[d] = op-reduction of x[:, d, :] (and y for OP_DOT), unfinished.

    Returns -1 when a work buffer cannot be allocated."""
    cdef Py_ssize_t t, d, c, a, j, b, blk, n, b0, j0, off
    cdef Py_ssize_t nchunk, ntask, C, rb, nblk, ncc, r0, r1
    cdef double acc
    cdef double* part
    cdef double* accp
    if D == 0:
        return 0
    if A == 0 or B == 0:
        for d in range(D):
            result[d] = 0.0
        return 0
    if use_rows(A, B):
        nchunk = (B + ROW_CHUNK - 1) // ROW_CHUNK
        ntask = D * nchunk
        part = <double*>malloc(ntask * sizeof(double))
        if part == NULL:
            return -1
        for t in prange(ntask, schedule='static', num_threads=nt):
            d = t // nchunk
            c = t - d * nchunk
            b0 = c * ROW_CHUNK
            n = min(<Py_ssize_t>ROW_CHUNK, B - b0)
            acc = 0.0
            for a in range(A):
                off = (a * D + d) * B + b0
                acc = combine(op, acc, chunk_reduce(op, x + off, y + off if y != NULL else NULL, n, p))
            part[t] = acc
        for d in range(D):
            acc = 0.0
            for c in range(nchunk):
                acc = combine(op, acc, part[d * nchunk + c])
            result[d] = acc
        free(part)
        return 0

    C = D * B
    rb = max(<Py_ssize_t>COL_MIN_ROWS, (A + COL_MAX_BLOCKS - 1) // COL_MAX_BLOCKS)
    nblk = (A + rb - 1) // rb
    ncc = (C + COL_WIDTH - 1) // COL_WIDTH
    part = <double*>malloc(nblk * C * sizeof(double))
    if part == NULL:
        return -1
    for t in prange(nblk * ncc, schedule='static', num_threads=nt):
        blk = t // ncc
        j0 = (t - blk * ncc) * COL_WIDTH
        n = min(<Py_ssize_t>COL_WIDTH, C - j0)
        accp = part + blk * C + j0
        for j in range(n):
            accp[j] = 0.0
        r0 = blk * rb
        r1 = min(A, r0 + rb)
        col_block(op, accp, x, y, r0, r1, C, j0, n, p)
    if nblk * C < SERIAL_BELOW:
        # small: a parallel region would cost more than the merge
        merge_blocks(op, part, nblk, C, 0, C)
    else:
        for t in prange(ncc, schedule='static', num_threads=nt):
            merge_blocks(op, part, nblk, C, t * COL_WIDTH, min(C, (t + 1) * COL_WIDTH))
    for d in range(D):
        acc = 0.0
        for b in range(B):
            acc = combine(op, acc, part[d * B + b])
        result[d] = acc
    free(part)
    return 0


cdef inline double sumsq_in_range(const storage_t* x, double s, Py_ssize_t A, Py_ssize_t D,
                                  Py_ssize_t B, Py_ssize_t d) noexcept nogil:
    """s, the sum of squares of x[:, d, :] formed in the math type, or, where
    float32 squares left float32's range (common.pxd), the sum again with
    float64 squares (exact_dot of x with itself)."""
    if storage_t is double or A * B == 0 or float32_sum_of_squares_ok(s, A * B):
        return s
    return exact_dot(x, x, A, D, B, d)


cdef int norms(int op, const storage_t* x, Py_ssize_t A, Py_ssize_t D, Py_ssize_t B, double p,
               double* result, int nt) noexcept nogil:
    """result[d] = the norm of x[:, d, :] (op: OP_SUMSQ, OP_SUMABS, OP_MAXABS
    or OP_SUMPOW); -1 when a work buffer cannot be allocated."""
    cdef Py_ssize_t d
    if reduce_over_d(op, x, <const storage_t*>NULL, A, D, B, p, result, nt) != 0:
        return -1
    for d in range(D):
        if op == OP_SUMSQ:
            result[d] = sumsq_in_range(x, result[d], A, D, B, d)
        result[d] = finish(op, result[d], p)
    return 0


cdef inline bint full_precision(float f, double operand) noexcept nogil:
    # f, computed from a factor or dividend `operand`, kept its 24 bits: a
    # finite normal float32, or a zero that is exact (operand zero), not an
    # underflow
    return FLT_MIN <= fabs(f) <= FLT_MAX or (f == 0.0 and operand == 0.0)


cdef inline (double, bint) forward_scale(const storage_t* tag, double sumsq, const void* g,
                                         void* norm, Py_ssize_t d) noexcept nogil:
    """Stores norm[d]; returns (g[d] / norm[d] computed in the math type,
    False), or, where that float32 scale is not a full-precision number
    (norms beyond float32's range, or below 1 / FLT_MAX), (the scale in
    float64, True).  (g is read before norm is written: a caller may pass
    g's own memory as the norm output.)"""
    cdef double nd, s
    cdef float nf, sf
    if storage_t is double:
        nd = sqrt(sumsq)
        s = (<const double*>g)[d] / nd
        (<double*>norm)[d] = nd
        return s, False
    nf = <float>sqrt(sumsq)
    sf = (<const float*>g)[d] / nf
    (<float*>norm)[d] = nf
    if full_precision(sf, (<const float*>g)[d]) and nf <= FLT_MAX:
        return <double>sf, False
    return (<const float*>g)[d] / sqrt(sumsq), True


cdef inline bint backward_coefs(const storage_t* tag, double s, Py_ssize_t n, const void* g,
                                const void* norm, void* grad_g, Py_ssize_t d, double* a,
                                double* b) noexcept nogil:
    """grad_g[d] = s / norm; a = g / norm; b = a * grad_g / norm (math type),
    for s the dot product of n elements.  Returns False when float32 math
    would lose them: s out of range (common.pxd), or a coefficient that is
    not a full-precision float32; exact_backward_coefs then redoes them.
    (Inputs are read before grad_g is written: it may share g's memory.)"""
    cdef double nd, gg
    cdef float nf, ggf, af, t
    if storage_t is double:
        nd = (<const double*>norm)[d]
        gg = s / nd
        a[0] = (<const double*>g)[d] / nd
        b[0] = a[0] * gg / nd
        (<double*>grad_g)[d] = gg
        return True
    nf = (<const float*>norm)[d]
    ggf = <float>s / nf
    af = (<const float*>g)[d] / nf
    t = af * ggf
    a[0] = af
    b[0] = <double>(t / nf)
    (<float*>grad_g)[d] = ggf
    return (n == 0 or float32_sum_of_squares_ok(fabs(s), n)) and full_precision(ggf, s) and \
        full_precision(af, (<const float*>g)[d]) and full_precision(t, af) and \
        full_precision(<float>b[0], t)


cdef inline void exact_backward_coefs(double s, const void* g, const void* norm, void* grad_g,
                                      Py_ssize_t d, double* a, double* b) noexcept nogil:
    # backward_coefs in float64, for float32-math storage (s: exact_dot)
    cdef double nd = (<const float*>norm)[d]
    cdef double gg = s / nd
    a[0] = (<const float*>g)[d] / nd
    b[0] = a[0] * gg / nd
    (<float*>grad_g)[d] = <float>gg


cdef double exact_dot(const storage_t* x, const storage_t* y, Py_ssize_t A, Py_ssize_t D,
                      Py_ssize_t B, Py_ssize_t d) noexcept nogil:
    # the dot product of x[:, d, :] and y[:, d, :] with float64 products (a
    # slow serial pass, for rare slices; y = x: the sum of squares)
    cdef Py_ssize_t a, j, i
    cdef double s = 0.0
    for a in range(A):
        for j in range(B):
            i = (a * D + d) * B + j
            s += load(x[i]) * load(y[i])
    return s


cdef void exact_slice(storage_t* out, const storage_t* x, const storage_t* y, Py_ssize_t A,
                      Py_ssize_t D, Py_ssize_t B, Py_ssize_t d, double ca,
                      double cb) noexcept nogil:
    """out = ca * x (y NULL) or ca * x - cb * y over [:, d, :] in float64
    math, rounded once (16-bit storage through float32, as ml_dtypes casts):
    the slices whose float32 coefficients would lose precision.  Each
    element is read before it is written (out may be x or y)."""
    cdef Py_ssize_t a, j, i
    cdef double r
    for a in range(A):
        for j in range(B):
            i = (a * D + d) * B + j
            r = ca * load(x[i])
            if y != NULL:
                r = r - cb * load(y[i])
            if storage_t is float:
                out[i] = <float>r
            elif storage_t is double:
                out[i] = r
            elif storage_t is cn_bf16:
                out[i] = cn_f32_to_bf16(<float>r)
            else:
                out[i] = cn_f32_to_f16(<float>r)


cdef inline void pack_cols(const storage_t* tag, const double* per_d, Py_ssize_t D, Py_ssize_t B,
                           double* cols) noexcept nogil:
    # expand a per-d coefficient to one per column, in the math type
    cdef Py_ssize_t d, b
    for d in range(D):
        for b in range(B):
            if storage_t is double:
                cols[d * B + b] = per_d[d]
            else:
                (<float*>cols)[d * B + b] = <float>per_d[d]


cdef inline const void* coef_ptr(const storage_t* tag, const double* cols,
                                Py_ssize_t j) noexcept nogil:
    # column coefficients are packed in the math type (see pack_cols)
    if storage_t is double:
        return cols + j
    return (<const float*>cols) + j


cdef int apply_rows_or_cols(storage_t* out, const storage_t* x, const storage_t* y,
                            Py_ssize_t A, Py_ssize_t D, Py_ssize_t B,
                            const double* coef_a, const double* coef_b, int nt) noexcept nogil:
    """out = a[d] * x (y == NULL), or a[d] * x - b[d] * y, over every (a, d, b).

    Tasks run last to first: the reduction pass just read x first to last, so
    its tail is the part most likely still in the last-level cache."""
    cdef Py_ssize_t t, q, d, c, n, b0, off, r, j0, nchunk, C, ncc, ntask
    cdef bint stream = A * D * B * <Py_ssize_t>sizeof(storage_t) >= STREAM_MIN_BYTES
    cdef double* ca
    cdef double* cb
    if A == 0 or D == 0 or B == 0:
        return 0
    if use_rows(A, B):
        nchunk = (B + ROW_CHUNK - 1) // ROW_CHUNK
        ntask = A * D * nchunk
        for t in prange(ntask, schedule='static', num_threads=nt):
            q = (ntask - 1 - t) // nchunk            # q = a * D + d
            c = (ntask - 1 - t) - q * nchunk
            d = q % D
            b0 = c * ROW_CHUNK
            n = min(<Py_ssize_t>ROW_CHUNK, B - b0)
            off = q * B + b0
            if y == NULL:
                scale_row(out + off, x + off, n, coef_a[d], stream)
            else:
                axpby_row(out + off, x + off, y + off, n, coef_a[d], coef_b[d], stream)
        return 0
    C = D * B
    ca = <double*>malloc(2 * C * sizeof(double))
    if ca == NULL:
        return -1
    cb = ca + C
    pack_cols(x, coef_a, D, B, ca)
    if y != NULL:
        pack_cols(x, coef_b, D, B, cb)
    ncc = (C + COL_WIDTH - 1) // COL_WIDTH
    ntask = A * ncc
    for t in prange(ntask, schedule='static', num_threads=nt):
        r = (ntask - 1 - t) // ncc
        j0 = ((ntask - 1 - t) - r * ncc) * COL_WIDTH
        n = min(<Py_ssize_t>COL_WIDTH, C - j0)
        off = r * C + j0
        if y == NULL:
            scale_cols(out + off, x + off, n, coef_ptr(x, ca, j0), stream)
        else:
            axpby_cols(out + off, x + off, y + off, n, coef_ptr(x, ca, j0), coef_ptr(x, cb, j0), stream)
    free(ca)
    return 0


cdef int apply_checked(storage_t* out, const storage_t* x, const storage_t* y,
                       Py_ssize_t A, Py_ssize_t D, Py_ssize_t B, const double* coef_a,
                       const double* coef_b, const bint* exact, bint any_exact,
                       int nt) noexcept nogil:
    """apply_rows_or_cols, where slices marked in `exact` take float64 math
    (exact_slice).  With any marked, the pass runs a row at a time (the
    column form packs every slice into each vector): a slow path, taken only
    for data beyond float32's range."""
    cdef Py_ssize_t q, d
    if not any_exact:
        return apply_rows_or_cols(out, x, y, A, D, B, coef_a, coef_b, nt)
    for q in prange(A * D, schedule='static', num_threads=nt):
        d = q % D
        if exact[d]:
            exact_slice(out + (q - d) * B, x + (q - d) * B,
                        y + (q - d) * B if y != NULL else NULL, 1, D, B, d,
                        coef_a[d], coef_b[d] if y != NULL else 0.0)
        elif y == NULL:
            scale_row(out + q * B, x + q * B, B, coef_a[d], False)
        else:
            axpby_row(out + q * B, x + q * B, y + q * B, B, coef_a[d], coef_b[d], False)
    return 0


cdef void forward_row_exactly(const storage_t* v, const void* g, storage_t* w, void* norm,
                              Py_ssize_t D, Py_ssize_t B, Py_ssize_t d) noexcept nogil:
    # one fused row whose float32 squares or scale left float32's range
    cdef double s
    cdef bint exact
    s, exact = forward_scale(w, exact_dot(v, v, 1, D, B, d), g, norm, d)
    exact_slice(w, v, <const storage_t*>NULL, 1, D, B, d, s, 0.0)


cdef int forward(const storage_t* v, const void* g, storage_t* w, void* norm,
                 Py_ssize_t A, Py_ssize_t D, Py_ssize_t B, int nt) noexcept nogil:
    cdef Py_ssize_t d
    cdef double s
    cdef double* work
    cdef bint* exact
    cdef bint any_exact = False, one_exact
    cdef int rc
    cdef bint stream = A * D * B * <Py_ssize_t>sizeof(storage_t) >= STREAM_MIN_BYTES
    if use_fused(A, D, B):
        # rows beyond float32's range are only marked here and done after,
        # serially: the slow paths kept out of the parallel loop keep it small
        # (inlined there, the bfloat16 row loop ran 7 % slower)
        exact = <bint*>malloc((D + 1) * sizeof(bint))
        if exact == NULL:
            return -1
        for d in prange(D, schedule='static', num_threads=nt):
            s = row_sumsq(v + d * B, B)
            one_exact = storage_t is not double and not float32_sum_of_squares_ok(s, B)
            if not one_exact:
                s, one_exact = forward_scale(w, s, g, norm, d)
            exact[d] = one_exact
            if not one_exact:
                scale_row(w + d * B, v + d * B, B, s, stream)
        for d in range(D):
            if exact[d]:
                forward_row_exactly(v, g, w, norm, D, B, d)
        free(exact)
        return 0
    work = <double*>malloc((D + 1) * sizeof(double))
    exact = <bint*>malloc((D + 1) * sizeof(bint))
    rc = -1
    if work != NULL and exact != NULL:
        rc = reduce_over_d(OP_SUMSQ, v, <const storage_t*>NULL, A, D, B, 0.0, work, nt)
    if rc == 0:
        for d in range(D):
            work[d], exact[d] = forward_scale(w, sumsq_in_range(v, work[d], A, D, B, d), g,
                                              norm, d)
            any_exact = any_exact or exact[d]
        rc = apply_checked(w, v, <const storage_t*>NULL, A, D, B, work, NULL, exact, any_exact,
                           nt)
    free(work)
    free(exact)
    return rc


cdef inline void backward_row(const storage_t* grad_w, const storage_t* v, const void* g,
                              const void* norm, storage_t* grad_v, void* grad_g,
                              Py_ssize_t d, Py_ssize_t n, bint stream) noexcept nogil:
    # one whole row while it is hot in cache; a and b are locals of this
    # call, so each OpenMP thread has its own
    cdef double a, b
    if backward_coefs(grad_v, row_dot(grad_w, v, n), n, g, norm, grad_g, d, &a, &b):
        axpby_row(grad_v, grad_w, v, n, a, b, stream)
    else:
        exact_backward_coefs(exact_dot(grad_w, v, 1, 1, n, 0), g, norm, grad_g, d, &a, &b)
        exact_slice(grad_v, grad_w, v, 1, 1, n, 0, a, b)


cdef int backward(const storage_t* grad_w, const storage_t* v, const void* g,
                  const void* norm, storage_t* grad_v, void* grad_g,
                  Py_ssize_t A, Py_ssize_t D, Py_ssize_t B, int nt) noexcept nogil:
    cdef Py_ssize_t d
    cdef double* work
    cdef bint* exact
    cdef bint any_exact = False
    cdef int rc
    cdef bint stream = A * D * B * <Py_ssize_t>sizeof(storage_t) >= STREAM_MIN_BYTES
    if use_fused(A, D, B):
        for d in prange(D, schedule='static', num_threads=nt):
            backward_row(grad_w + d * B, v + d * B, g, norm, grad_v + d * B, grad_g, d, B, stream)
        return 0
    work = <double*>malloc((2 * D + 1) * sizeof(double))
    exact = <bint*>malloc((D + 1) * sizeof(bint))
    rc = -1
    if work != NULL and exact != NULL:
        rc = reduce_over_d(OP_DOT, grad_w, v, A, D, B, 0.0, work, nt)
    if rc == 0:
        for d in range(D):
            exact[d] = not backward_coefs(grad_v, work[d], A * B, g, norm, grad_g, d, &work[d],
                                          &work[D + d])
            if exact[d]:
                exact_backward_coefs(exact_dot(grad_w, v, A, D, B, d), g, norm, grad_g, d,
                                     &work[d], &work[D + d])
                any_exact = True
        rc = apply_checked(grad_v, grad_w, v, A, D, B, work, work + D, exact, any_exact, nt)
    free(work)
    free(exact)
    return rc


def weight_norm_forward(cnp.ndarray v, cnp.ndarray g, cnp.ndarray w, cnp.ndarray norm,
                        Py_ssize_t A, Py_ssize_t D, Py_ssize_t B, int code, int n_threads):
    """w = v * g / ||v|| over (A, D, B); norm[d] = ||v[:, d, :]||.

    v, w: C-contiguous storage arrays (16-bit types viewed as uint16);
    g: contiguous math-type vector of length D; norm: contiguous stat-type
    vector of length D."""
    cdef void* pv = data(v)
    cdef void* pg = data(g)
    cdef void* pw = data(w)
    cdef void* pn = data(norm)
    cdef int nt = threads_for(A * D * B, n_threads)
    cdef int rc
    with nogil:
        if code == 0:
            rc = forward[float](<float*>pv, pg, <float*>pw, pn, A, D, B, nt)
        elif code == 1:
            rc = forward[double](<double*>pv, pg, <double*>pw, pn, A, D, B, nt)
        elif code == 2:
            rc = forward[cn_bf16](<cn_bf16*>pv, pg, <cn_bf16*>pw, pn, A, D, B, nt)
        else:
            rc = forward[cn_f16](<cn_f16*>pv, pg, <cn_f16*>pw, pn, A, D, B, nt)
    if rc != 0:
        raise MemoryError("weight_norm: could not allocate the reduction workspace")


def weight_norm_backward(cnp.ndarray grad_w, cnp.ndarray v, cnp.ndarray g, cnp.ndarray norm,
                         cnp.ndarray grad_v, cnp.ndarray grad_g,
                         Py_ssize_t A, Py_ssize_t D, Py_ssize_t B, int code, int n_threads):
    """grad_g = <grad_w, v> / norm; grad_v = (g/norm) grad_w - (g grad_g / norm^2) v.

    grad_g is a contiguous stat-type vector of length D; the rest as in
    weight_norm_forward."""
    cdef void* pgw = data(grad_w)
    cdef void* pv = data(v)
    cdef void* pg = data(g)
    cdef void* pn = data(norm)
    cdef void* pgv = data(grad_v)
    cdef void* pgg = data(grad_g)
    cdef int nt = threads_for(A * D * B, n_threads)
    cdef int rc
    with nogil:
        if code == 0:
            rc = backward[float](<float*>pgw, <float*>pv, pg, pn, <float*>pgv, pgg, A, D, B, nt)
        elif code == 1:
            rc = backward[double](<double*>pgw, <double*>pv, pg, pn, <double*>pgv, pgg, A, D, B, nt)
        elif code == 2:
            rc = backward[cn_bf16](<cn_bf16*>pgw, <cn_bf16*>pv, pg, pn, <cn_bf16*>pgv, pgg, A, D, B, nt)
        else:
            rc = backward[cn_f16](<cn_f16*>pgw, <cn_f16*>pv, pg, pn, <cn_f16*>pgv, pgg, A, D, B, nt)
    if rc != 0:
        raise MemoryError("weight_norm_backward: could not allocate the reduction workspace")


def norm_except_dim(cnp.ndarray v, cnp.ndarray out, int kind, double p,
                    Py_ssize_t A, Py_ssize_t D, Py_ssize_t B, int code, int n_threads):
    """out[d] (float64) = p-norm of v[:, d, :]; kind 0: p=2, 1: p=1, 2: inf, 3: other p."""
    cdef void* pv = data(v)
    cdef double* po = <double*>data(out)
    cdef int nt = threads_for(A * D * B, n_threads)
    cdef int op = (OP_SUMSQ, OP_SUMABS, OP_MAXABS, OP_SUMPOW)[kind]
    cdef int rc
    with nogil:
        if code == 0:
            rc = norms[float](op, <float*>pv, A, D, B, p, po, nt)
        elif code == 1:
            rc = norms[double](op, <double*>pv, A, D, B, p, po, nt)
        elif code == 2:
            rc = norms[cn_bf16](op, <cn_bf16*>pv, A, D, B, p, po, nt)
        else:
            rc = norms[cn_f16](op, <cn_f16*>pv, A, D, B, p, po, nt)
    if rc != 0:
        raise MemoryError("norm_except_dim: could not allocate the reduction workspace")


def set_stream_min_bytes(Py_ssize_t nbytes):
    """Outputs of at least nbytes use streaming stores; returns the old value.
    (Tuning and tests: 0 streams every output, a huge value none.)"""
    global STREAM_MIN_BYTES
    old = STREAM_MIN_BYTES
    STREAM_MIN_BYTES = nbytes
    return old
