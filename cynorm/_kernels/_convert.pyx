# cython: language_level=3, boundscheck=False, wraparound=False
"""The kernels' 16-bit conversions over whole arrays, for the tests.

They run exactly the functions the kernels use, so tests can compare them
with ml_dtypes / NumPy casts bit for bit.  Built once per SIMD level like the
kernels (cynorm._kernels.load("_convert")): the bfloat16 block rounding
differs between levels (cn_pack.h).
"""
import numpy as np

from cynorm._kernels.common cimport (
    cn_bf16, cn_f16, cn_f32_to_bf16, cn_bf16_to_f32, cn_f32_to_f16, cn_f16_to_f32,
)

cdef extern from "cn_pack.h" nogil:
    void cn_f32_to_bf16_array(unsigned short* dst, const float* src, Py_ssize_t n)
    const char* cn_bf16_store_path()

cdef extern from *:
    """
    /* the MXCSR's denormals-are-zero flag, which other libraries may set */
    #if defined(__SSE__) || defined(_M_X64) || defined(_M_AMD64)
    #include <xmmintrin.h>
    #define CN_HAVE_MXCSR 1
    static unsigned cn_daz_on(void) { unsigned old = _mm_getcsr(); _mm_setcsr(old | 0x0040u); return old; }
    static void cn_csr_restore(unsigned old) { _mm_setcsr(old); }
    #else
    #define CN_HAVE_MXCSR 0
    static unsigned cn_daz_on(void) { return 0; }
    static void cn_csr_restore(unsigned old) { (void)old; }
    #endif
    """
    int CN_HAVE_MXCSR
    unsigned cn_daz_on() nogil
    void cn_csr_restore(unsigned old) nogil


def bf16_store_path():
    """How this module's kernels round float32 blocks to bfloat16."""
    return cn_bf16_store_path().decode()


def f32_to_bf16_blocks(const float[::1] x, bint daz=False):
    """bfloat16 bits of x through the kernels' block rounding (cn_pack.h);
    daz: with the MXCSR's denormals-are-zero flag set during the call (x86)."""
    out = np.empty(x.shape[0], np.uint16)
    cdef unsigned short[::1] o = out
    cdef unsigned csr = 0
    if daz and not CN_HAVE_MXCSR:
        raise NotImplementedError("daz=True needs an x86 CPU (MXCSR)")
    if x.shape[0]:
        with nogil:
            if daz:
                csr = cn_daz_on()
            cn_f32_to_bf16_array(&o[0], &x[0], x.shape[0])
            if daz:
                cn_csr_restore(csr)
    return out


def call_with_daz(fn):
    """fn()'s result, called with the MXCSR's denormals-are-zero flag set on
    this thread (x86): a kernel run on one thread sees the flag as another
    library may have left it."""
    cdef unsigned csr
    if not CN_HAVE_MXCSR:
        raise NotImplementedError("call_with_daz needs an x86 CPU (MXCSR)")
    csr = cn_daz_on()
    try:
        return fn()
    finally:
        cn_csr_restore(csr)


def f32_to_bf16(const float[::1] x):
    out = np.empty(x.shape[0], np.uint16)
    cdef unsigned short[::1] o = out
    cdef Py_ssize_t i
    with nogil:
        for i in range(x.shape[0]):
            o[i] = cn_f32_to_bf16(x[i]).bits
    return out


def bf16_to_f32(const unsigned short[::1] x):
    out = np.empty(x.shape[0], np.float32)
    cdef float[::1] o = out
    cdef cn_bf16 h
    cdef Py_ssize_t i
    with nogil:
        for i in range(x.shape[0]):
            h.bits = x[i]
            o[i] = cn_bf16_to_f32(h)
    return out


def f32_to_f16(const float[::1] x):
    out = np.empty(x.shape[0], np.uint16)
    cdef unsigned short[::1] o = out
    cdef Py_ssize_t i
    with nogil:
        for i in range(x.shape[0]):
            o[i] = cn_f32_to_f16(x[i]).bits
    return out


def f16_to_f32(const unsigned short[::1] x):
    out = np.empty(x.shape[0], np.float32)
    cdef float[::1] o = out
    cdef cn_f16 h
    cdef Py_ssize_t i
    with nogil:
        for i in range(x.shape[0]):
            h.bits = x[i]
            o[i] = cn_f16_to_f32(h)
    return out
