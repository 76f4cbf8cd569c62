# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Segmented kernels: softmax, its backward, and sums over the rows of a
buffer whose rows have different lengths (the last dim of a nested array's
components).  Row r is x[starts[r] : starts[r] + lengths[r]]; rows are
independent, so they run in parallel, each in one thread (results do not
depend on the thread count).  float32/float64; 16-bit data is converted to
float32 by the Python layer.  Sums accumulate in float64.  The row loops
are in cn_segments.h (vectorizable exp for float32, fixed-lane reductions).
"""
from cython cimport floating
from cython.parallel cimport prange
cimport numpy as cnp

from cynorm._kernels.entry cimport data, threads_for

cnp.import_array()


cdef extern from "cn_segments.h" nogil:
    void cn_seg_softmax_f32(const float* x, float* y, Py_ssize_t n)
    void cn_seg_softmax_f64(const double* x, double* y, Py_ssize_t n)
    void cn_seg_softmax_backward_f32(const float* g, const float* y, float* out, Py_ssize_t n)
    void cn_seg_softmax_backward_f64(const double* g, const double* y, double* out, Py_ssize_t n)
    double cn_seg_sum_f32(const float* x, Py_ssize_t n)
    double cn_seg_sum_f64(const double* x, Py_ssize_t n)


cdef void rows_softmax(const floating* x, floating* y, const cnp.int64_t* starts,
                       const cnp.int64_t* lengths, Py_ssize_t R, int nt) noexcept nogil:
    cdef Py_ssize_t r
    for r in prange(R, schedule='static', num_threads=nt):
        if floating is double:
            cn_seg_softmax_f64(x + starts[r], y + starts[r], lengths[r])
        else:
            cn_seg_softmax_f32(x + starts[r], y + starts[r], lengths[r])


cdef void rows_softmax_backward(const floating* g, const floating* y, floating* out,
                                const cnp.int64_t* starts, const cnp.int64_t* lengths,
                                Py_ssize_t R, int nt) noexcept nogil:
    cdef Py_ssize_t r
    for r in prange(R, schedule='static', num_threads=nt):
        if floating is double:
            cn_seg_softmax_backward_f64(g + starts[r], y + starts[r], out + starts[r], lengths[r])
        else:
            cn_seg_softmax_backward_f32(g + starts[r], y + starts[r], out + starts[r], lengths[r])


cdef void rows_sum(const floating* x, double* out, const cnp.int64_t* starts,
                   const cnp.int64_t* lengths, Py_ssize_t R, int nt) noexcept nogil:
    cdef Py_ssize_t r
    for r in prange(R, schedule='static', num_threads=nt):
        if floating is double:
            out[r] = cn_seg_sum_f64(x + starts[r], lengths[r])
        else:
            out[r] = cn_seg_sum_f32(x + starts[r], lengths[r])


def softmax(cnp.ndarray x, cnp.ndarray y, cnp.ndarray starts, cnp.ndarray lengths, int n_threads):
    """y = softmax of every row; x, y contiguous float32/float64 of one dtype;
    starts, lengths int64 (R,)."""
    cdef Py_ssize_t R = lengths.shape[0]
    cdef int nt = threads_for(x.size, n_threads)
    cdef void* px = data(x)
    cdef void* py = data(y)
    cdef const cnp.int64_t* ps = <const cnp.int64_t*>data(starts)
    cdef const cnp.int64_t* pl = <const cnp.int64_t*>data(lengths)
    cdef bint f64 = x.descr.type_num == cnp.NPY_DOUBLE
    with nogil:
        if f64:
            rows_softmax(<const double*>px, <double*>py, ps, pl, R, nt)
        else:
            rows_softmax(<const float*>px, <float*>py, ps, pl, R, nt)


def softmax_backward(cnp.ndarray g, cnp.ndarray y, cnp.ndarray out, cnp.ndarray starts,
                     cnp.ndarray lengths, int n_threads):
    """out = y * (g - sum(g * y)) per row."""
    cdef Py_ssize_t R = lengths.shape[0]
    cdef int nt = threads_for(y.size, n_threads)
    cdef void* pg = data(g)
    cdef void* py = data(y)
    cdef void* po = data(out)
    cdef const cnp.int64_t* ps = <const cnp.int64_t*>data(starts)
    cdef const cnp.int64_t* pl = <const cnp.int64_t*>data(lengths)
    cdef bint f64 = y.descr.type_num == cnp.NPY_DOUBLE
    with nogil:
        if f64:
            rows_softmax_backward(<const double*>pg, <const double*>py, <double*>po, ps, pl, R, nt)
        else:
            rows_softmax_backward(<const float*>pg, <const float*>py, <float*>po, ps, pl, R, nt)


def row_sums(cnp.ndarray x, cnp.ndarray out, cnp.ndarray starts, cnp.ndarray lengths,
             int n_threads):
    """out[r] = sum of row r (out: float64 (R,))."""
    cdef Py_ssize_t R = lengths.shape[0]
    cdef int nt = threads_for(x.size, n_threads)
    cdef void* px = data(x)
    cdef double* po = <double*>data(out)
    cdef const cnp.int64_t* ps = <const cnp.int64_t*>data(starts)
    cdef const cnp.int64_t* pl = <const cnp.int64_t*>data(lengths)
    cdef bint f64 = x.descr.type_num == cnp.NPY_DOUBLE
    with nogil:
        if f64:
            rows_sum(<const double*>px, po, ps, pl, R, nt)
        else:
            rows_sum(<const float*>px, po, ps, pl, R, nt)
