"""Thread count of the OpenMP kernels.

cynorm's kernels run on the OpenMP runtime they were built with, and use
omp_get_max_threads() threads: OMP_NUM_THREADS at start-up, then whatever
cynorm.set_num_threads or threadpoolctl's threadpool_limits set.  Like
omp_set_num_threads, the setting belongs to the calling thread.  How many
of them a call wakes depends on the bytes it moves (the thresholds per
kernel family: get_thread_thresholds, set_thread_thresholds, tune_threads).
"""
from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Optional

from cynorm._kernels import _runtime
from cynorm._validation import check_bool, check_int, check_threads


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


def get_thread_thresholds() -> dict[str, int]:
    """Each kernel family's thread-team threshold now.

    A kernel call runs on one thread while it moves (reads and writes, over
    all its passes) fewer bytes than its family's threshold, and on
    get_num_threads() threads from it up: below it, waking the team costs
    more than the second thread saves.  16-bit elements count at float32's
    width.  The families:

    - ``rows``: layer norm's forward, weight norm over rows, the nested
      (jagged) row sums;
    - ``elementwise``: batch norm's normalize and input-gradient passes
      on their own (inference, batch_norm_elemt), nll_loss's backward;
    - ``channels``: batch norm's channel statistics and the passes that
      follow them (training forward, backward);
    - ``row_grads``: layer norm's backward;
    - ``columns``: weight norm over columns (the last dim);
    - ``exp``: softmax, log_softmax and their backward (nested ones too),
      log_sigmoid, gelu, silu (exp-bound).

    The defaults were measured on a Sapphire Rapids VM (benchmarks/README.md,
    "Threads by work"), row_grads and columns on two AMD EPYC VMs;
    `tune_threads` measures them on this machine.

    Returns
    -------
    dict
        {family: bytes}, in the order above.
    """
    return _runtime.get_family_min_bytes()


def set_thread_thresholds(thresholds: Optional[Mapping[str, int]]) -> dict[str, int]:
    """Set kernel families' thread-team thresholds, for the whole process.

    Thresholds change only how many threads a call uses, never its result
    (the bits are the same at any thread count).  To keep a machine's tuned
    values, save ``tune_threads()``'s dict (JSON, say) and pass it here at
    start-up.

    Parameters
    ----------
    thresholds : mapping or None
        {family: bytes} for any of `get_thread_thresholds`' families (the
        others keep theirs); bytes: an int, 0 <= bytes <= sys.maxsize (0:
        the team from the smallest call up).  None restores every family's default.

    Returns
    -------
    dict
        The thresholds before the call, as `get_thread_thresholds` gives them.

    Raises
    ------
    TypeError
        If thresholds is not a mapping or None, or a value is not an int.
    ValueError
        If a family is unknown (nothing is set then), or a value is out of
        range.
    """
    old = get_thread_thresholds()
    if thresholds is None:
        new = dict(zip(_runtime.FAMILIES, _runtime.DEFAULT_FAMILY_MIN_BYTES))
    elif isinstance(thresholds, Mapping):
        new = {}
        for family, nbytes in thresholds.items():
            if family not in _runtime.FAMILIES:
                raise ValueError(f"thresholds: unknown kernel family {family!r}; the "
                                 f"families are {', '.join(_runtime.FAMILIES)}")
            nbytes = check_int(nbytes, f"thresholds[{family!r}]", "an int (a number of bytes)")
            if not 0 <= nbytes <= sys.maxsize:
                raise ValueError(f"thresholds[{family!r}] must be >= 0 and at most "
                                 f"{sys.maxsize} bytes, got {nbytes}")
            new[family] = nbytes
    else:
        raise TypeError("thresholds must be a mapping of kernel family to bytes, or None, "
                        f"got {type(thresholds).__name__}")
    for family, nbytes in new.items():
        _runtime.set_family_min_bytes(_runtime.FAMILIES.index(family), nbytes)
    return old


def tune_threads(threads: Optional[int] = None, *, repeats: int = 15,
                 apply: bool = True) -> dict[str, int]:
    """Measure each kernel family's thread-team threshold on this machine.

    For each family (see `get_thread_thresholds`) one of its ops runs on
    float32 inputs from 2 Ki (batch norm: 3136) to 1 Mi elements, timed on one thread and on
    `threads` threads in turn (interleaved; the fastest of `repeats` samples).
    A family's threshold becomes the traffic of the smallest size at which
    the team was faster and from which it never fell more than 5 % behind;
    a family whose team never paid within the sweep keeps its default.
    Takes about a second on 2 cores; run it on an otherwise idle machine,
    at the thread count you will use.  On a shared VM the result varies by
    up to one size step (2x) between runs.  While it runs, kernel calls from
    other threads of the process wake the team whatever their size.

    Parameters
    ----------
    threads : int, optional
        The team's size; default get_num_threads().  With 1 there is no team
        to place: nothing is measured and the current thresholds return.
    repeats : int, default 15
        Timed samples per size and thread count, 1 <= repeats <= 1000.
    apply : bool, default True
        Set the measured thresholds (`set_thread_thresholds`); False only
        returns them.

    Returns
    -------
    dict
        {family: bytes}, the measured thresholds.
    """
    from cynorm._tune import measure_thresholds
    n = get_num_threads() if threads is None else check_threads(threads, "threads")
    repeats = check_int(repeats, "repeats", "an int")
    if not 1 <= repeats <= 1000:
        raise ValueError(f"repeats must be in 1..1000, got {repeats}")
    apply = check_bool(apply, "apply")
    if n < 2:
        return get_thread_thresholds()
    found = measure_thresholds(n, repeats)
    if apply:
        set_thread_thresholds(found)
    return found
