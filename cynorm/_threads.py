"""Thread count of the OpenMP kernels.

cynorm's kernels run on the OpenMP runtime they were built with, and use
omp_get_max_threads() threads: OMP_NUM_THREADS at start-up, then whatever
cynorm.set_num_threads or threadpoolctl's threadpool_limits set.  Like
omp_set_num_threads, the setting belongs to the calling thread.
"""
from __future__ import annotations

from cynorm._kernels import _runtime
from cynorm._validation import check_threads


def get_num_threads() -> int:
    """The number of threads the next kernel call from this thread will use.

    Returns
    -------
    int
        omp_get_max_threads() of the calling thread.
    """
    return _runtime.get_num_threads()


def set_num_threads(n: int) -> None:
    """Use n threads for kernel calls from this thread.

    Results are bitwise identical at any thread count.

    Parameters
    ----------
    n : int
        1 <= n < 2**31.

    Raises
    ------
    TypeError
        If n is not an int.
    ValueError
        If n is out of range.
    """
    _runtime.set_num_threads(check_threads(n))
