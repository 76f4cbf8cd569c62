# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Pointwise activation kernels (GELU exact and tanh, SiLU) and their
backward, over contiguous 1-D float32/float64 arrays.

NumPy has no erf, and composing these from ufuncs costs 5-10 passes over the
data; here each is one pass with libm's erf/tanh/exp, parallel over
elements.  16-bit data is converted to float32 by the Python layer.  The
formulas follow ATen's CPU kernels (GeluKernel / SiLU), in double for
float64 and float for float32.
"""
from cython cimport floating
from cython.parallel cimport prange
from libc.math cimport erf, erff, exp, expf, tanh, tanhf
cimport numpy as cnp

from cynorm._kernels.entry cimport data, threads_for

cnp.import_array()

cdef double SQRT1_2 = 0.70710678118654752440        # 1 / sqrt(2)
cdef double INV_SQRT_2PI = 0.39894228040143267794   # 1 / sqrt(2 pi)
cdef double TANH_BETA = 0.79788456080286535588      # sqrt(2 / pi)
cdef double TANH_KAPPA = 0.044715


cdef inline floating f_erf(floating v) noexcept nogil:
    return erf(v) if floating is double else erff(v)


cdef inline floating f_tanh(floating v) noexcept nogil:
    return tanh(v) if floating is double else tanhf(v)


cdef inline floating f_exp(floating v) noexcept nogil:
    return exp(v) if floating is double else expf(v)


cdef void gelu_fw(const floating* x, floating* y, Py_ssize_t n, bint approx_tanh,
                  int nt) noexcept nogil:
    cdef Py_ssize_t i
    cdef floating v, inner
    if approx_tanh:
        for i in prange(n, schedule='static', num_threads=nt):
            v = x[i]
            inner = <floating>TANH_BETA * (v + <floating>TANH_KAPPA * v * v * v)
            y[i] = <floating>0.5 * v * (<floating>1 + f_tanh(inner))
    else:
        for i in prange(n, schedule='static', num_threads=nt):
            v = x[i]
            y[i] = v * <floating>0.5 * (<floating>1 + f_erf(v * <floating>SQRT1_2))


cdef void gelu_bw(const floating* g, const floating* x, floating* out, Py_ssize_t n,
                  bint approx_tanh, int nt) noexcept nogil:
    cdef Py_ssize_t i
    cdef floating v, inner, t, cdf, pdf
    if approx_tanh:
        for i in prange(n, schedule='static', num_threads=nt):
            v = x[i]
            inner = <floating>TANH_BETA * (v + <floating>TANH_KAPPA * v * v * v)
            t = f_tanh(inner)
            out[i] = g[i] * (<floating>0.5 * (<floating>1 + t)
                             + <floating>0.5 * v * (<floating>1 - t * t) * <floating>TANH_BETA
                             * (<floating>1 + <floating>3 * <floating>TANH_KAPPA * v * v))
    else:
        for i in prange(n, schedule='static', num_threads=nt):
            v = x[i]
            cdf = <floating>0.5 * (<floating>1 + f_erf(v * <floating>SQRT1_2))
            pdf = <floating>INV_SQRT_2PI * f_exp(<floating>-0.5 * v * v)
            out[i] = g[i] * (cdf + v * pdf)


cdef void silu_fw(const floating* x, floating* y, Py_ssize_t n, int nt) noexcept nogil:
    cdef Py_ssize_t i
    cdef floating v
    for i in prange(n, schedule='static', num_threads=nt):
        v = x[i]
        y[i] = v / (<floating>1 + f_exp(-v))


cdef void silu_bw(const floating* g, const floating* x, floating* out, Py_ssize_t n,
                  int nt) noexcept nogil:
    cdef Py_ssize_t i
    cdef floating v, s
    for i in prange(n, schedule='static', num_threads=nt):
        v = x[i]
        s = <floating>1 / (<floating>1 + f_exp(-v))
        out[i] = g[i] * s * (<floating>1 + v * (<floating>1 - s))


cdef enum:
    GELU = 0
    SILU = 1


def forward(int kind, cnp.ndarray x, cnp.ndarray y, bint approx_tanh, int n_threads):
    """y = act(x), act = GELU (approx_tanh: its tanh form) or SILU; x, y
    contiguous, one dtype (float32 or float64), one size."""
    cdef Py_ssize_t n = x.size
    cdef int nt = threads_for(n, n_threads)
    cdef void* px = data(x)
    cdef void* py = data(y)
    cdef bint f64 = x.descr.type_num == cnp.NPY_DOUBLE
    with nogil:
        if kind == GELU and f64:
            gelu_fw(<const double*>px, <double*>py, n, approx_tanh, nt)
        elif kind == GELU:
            gelu_fw(<const float*>px, <float*>py, n, approx_tanh, nt)
        elif f64:
            silu_fw(<const double*>px, <double*>py, n, nt)
        else:
            silu_fw(<const float*>px, <float*>py, n, nt)


def backward(int kind, cnp.ndarray g, cnp.ndarray x, cnp.ndarray out, bint approx_tanh,
             int n_threads):
    """out = g * act'(x) (see forward)."""
    cdef Py_ssize_t n = x.size
    cdef int nt = threads_for(n, n_threads)
    cdef void* pg = data(g)
    cdef void* px = data(x)
    cdef void* po = data(out)
    cdef bint f64 = x.descr.type_num == cnp.NPY_DOUBLE
    with nogil:
        if kind == GELU and f64:
            gelu_bw(<const double*>pg, <const double*>px, <double*>po, n, approx_tanh, nt)
        elif kind == GELU:
            gelu_bw(<const float*>pg, <const float*>px, <float*>po, n, approx_tanh, nt)
        elif f64:
            silu_bw(<const double*>pg, <const double*>px, <double*>po, n, nt)
        else:
            silu_bw(<const float*>pg, <const float*>px, <float*>po, n, nt)
