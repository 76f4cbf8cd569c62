"""Thread count of the OpenMP kernels.

cynorm's kernels run on the OpenMP runtime they were built with, and use
omp_get_max_threads() threads: OMP_NUM_THREADS at start-up, then whatever
cynorm.set_num_threads or threadpoolctl's threadpool_limits set.  Like
omp_set_num_threads, the setting belongs to the calling thread.  How many
of them a call wakes depends on the bytes it moves (the thresholds per
kernel family: get_thread_thresholds, set_thread_thresholds, tune_threads).
"""
from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from typing import Optional

from cynorm._kernels import _runtime
from cynorm._validation import check_bool, check_int, check_threads

# Whether the user chose a thread count (OMP_NUM_THREADS, set_num_threads),
# and the count cynorm.distributed set itself (share_node_cores), if any:
# ranks on one node share its cores only where nobody chose.
_DEFAULT_THREADS = _runtime.get_num_threads()
# whether the kernels were compiled with OpenMP (else every call runs on one thread)
_OPENMP = bool(_runtime.build_info()["openmp"])
_chosen = bool(os.environ.get("OMP_NUM_THREADS", "").strip())
_rank_share: Optional[int] = None


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

    Results are bitwise identical at any thread count.  A build without
    OpenMP (``cynorm.config()["openmp"]`` says "no (serial build)") runs
    every kernel on one thread: there n > 1 has no effect, with a warning.

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

    Warns
    -----
    RuntimeWarning
        On a serial build, for n > 1: get_num_threads() stays 1.
    """
    global _chosen
    n = check_threads(n)
    if n > 1 and not _OPENMP:
        warnings.warn(f"set_num_threads({n}) has no effect: this cynorm was built without "
                      "OpenMP (a serial build; cynorm.config()['openmp']), so its kernels "
                      "run on one thread", RuntimeWarning, stacklevel=2)
    _runtime.set_num_threads(n)
    _chosen = True


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

    The defaults were measured on Intel Sapphire Rapids (row_grads and
    columns on AMD EPYC); `tune_threads` measures them on this machine.

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


def get_team_policy() -> str:
    """How kernel calls size their thread team when other work holds the cores.

    Returns
    -------
    str
        ``"adaptive"`` (the default where the build supports it): every
        parallel region is timed, and when a worker thread starts more than
        100 µs after the fork and more than an eighth of the region's time
        after it (the OS had not scheduled it: other processes hold the
        cores, or its idle vCPU had to be woken first), the team is halved
        for a while (10 ms, doubled by each further late region up to
        1.28 s), then calls try the next size up.  A call then never waits
        long for a thread
        the OS is not running, and returns to the full team once the cores
        are free.  ``"fixed"``: every call gets the team it asks for
        (`get_num_threads`, above its family's threshold), as plain OpenMP
        does; the default where the build cannot time its regions (builds
        other than GCC with OpenMP on Linux), or when the environment sets
        ``CYNORM_TEAM_POLICY=fixed`` at import.  Either way the bits are
        the same.
    """
    return _runtime.get_team_policy()


def set_team_policy(policy: str) -> str:
    """Set the thread-team policy for the whole process (`get_team_policy`).

    Parameters
    ----------
    policy : {"adaptive", "fixed"}
        The team cap and its hold start afresh either way.

    Returns
    -------
    str
        The policy before the call.

    Raises
    ------
    TypeError
        If policy is not a str.
    ValueError
        If policy is not one of the two, or is "adaptive" in a build that
        cannot time its parallel regions (`thread_team_info`'s "available").
    """
    if not isinstance(policy, str):
        raise TypeError(f"policy must be a str ('adaptive' or 'fixed'), got {type(policy).__name__}")
    if policy not in _runtime.TEAM_POLICIES:
        raise ValueError(f"policy must be 'adaptive' or 'fixed', got {policy!r}")
    if policy == "adaptive" and not _runtime.team_adaptive_available():
        raise ValueError("policy 'adaptive' needs a build that times its parallel regions "
                         "(GCC with OpenMP on Linux); this build's teams are always fixed")
    return _runtime.set_team_policy(policy)


def thread_team_info() -> dict[str, object]:
    """What the thread-team policy sees and does now.

    Returns
    -------
    dict
        ``policy``: `get_team_policy`; ``available``: whether this build can
        time its parallel regions (the adaptive policy needs it); ``cap``:
        the most threads a team gets now (0: no cap); ``held_for_s``: how
        much longer the cap holds before a call tries a larger team;
        ``regions``: parallel regions timed since import; ``late_regions``:
        of those, how many had a worker start late (a sign that other work
        held the cores).
    """
    info: dict[str, object] = dict(_runtime.team_info())
    info["available"] = _runtime.team_adaptive_available()
    return info


def share_node_cores(ranks_on_node: int) -> None:
    """Give this process its share of the node's cores, as one of
    `ranks_on_node` MPI ranks there (cynorm.distributed, at a communicator's
    first use): cores // ranks_on_node threads, at least 1, for kernel calls
    from the calling thread.  Nothing changes where the user chose a count
    (OMP_NUM_THREADS, set_num_threads, a threadpoolctl limit in force) or
    where the launcher already bound this process to fewer cores than the
    node has; a second communicator never raises the share."""
    global _rank_share
    current = _runtime.get_num_threads()
    ours = _rank_share if _rank_share is not None else _DEFAULT_THREADS
    if ranks_on_node <= 1 or _chosen or current != ours:
        return
    cores = os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) < cores:
        return
    share = max(1, cores // ranks_on_node)
    if share < current:
        _runtime.set_num_threads(share)
        _rank_share = share
