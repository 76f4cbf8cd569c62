"""Thread count of the OpenMP kernels.

cynorm's kernels run on the OpenMP runtime they were built with, and use
omp_get_max_threads() threads: OMP_NUM_THREADS at start-up, then whatever
cynorm.set_num_threads or threadpoolctl's threadpool_limits set.  Like
omp_set_num_threads, the setting belongs to the calling thread.
"""
from cynorm._kernels import _runtime
from cynorm._validation import check_threads


def get_num_threads():
    """The number of threads the next kernel call from this thread will use."""
    return _runtime.get_num_threads()


def set_num_threads(n):
    """Use n threads (n >= 1) for kernel calls from this thread."""
    _runtime.set_num_threads(check_threads(n))
