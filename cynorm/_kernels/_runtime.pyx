# cython: language_level=3
"""OpenMP thread control and the facts of this build (compiler, SIMD, OpenMP)."""

cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    static int cn_get_max_threads(void) { return omp_get_max_threads(); }
    static void cn_set_num_threads(int n) { omp_set_num_threads(n); }
    static int cn_num_procs(void) { return omp_get_num_procs(); }
    #else
    static int cn_get_max_threads(void) { return 1; }
    static void cn_set_num_threads(int n) { (void)n; }
    static int cn_num_procs(void) { return 1; }
    #endif
    """
    int cn_get_max_threads() nogil
    void cn_set_num_threads(int n) nogil
    int cn_num_procs() nogil

cdef extern from "cn_cpu.h":
    int cn_cpu_level() nogil

from cynorm._kernels.common cimport CN_SIMD_LEVEL, CN_COMPILER, CN_F16_IMPL, CN_OPENMP


def cpu_level():
    """The highest x86-64 level this CPU runs: 4 (AVX-512), 3 (AVX2) or 1."""
    return cn_cpu_level()


def get_num_threads():
    return cn_get_max_threads()


def set_num_threads(int n):
    cn_set_num_threads(n)


def build_info():
    return {
        "compiler": CN_COMPILER.decode(),
        "simd": CN_SIMD_LEVEL.decode(),
        "float16_conversion": CN_F16_IMPL.decode(),
        "openmp": int(CN_OPENMP),
        "num_procs": cn_num_procs(),
    }
