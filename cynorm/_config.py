"""What this build is and what it runs on: show_config() and config(); and
set_alloc_cache_limit, alloc_cache_info and clear_alloc_cache, the
output-block cache's setting and state."""
from __future__ import annotations

import platform
import sys
from typing import Any

import numpy as np

from cynorm._dtypes import SUPPORTED_NAMES
from cynorm import _kernels
from cynorm._kernels import _alloc
from cynorm._kernels._runtime import build_info, get_num_threads
from cynorm._threads import get_team_policy, thread_team_info
from cynorm._validation import check_byte_count
from cynorm._version import __version__


def _cpu_features():
    """SIMD features the CPU reports (Linux /proc/cpuinfo; empty elsewhere)."""
    wanted = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
              "avx512_bf16", "avx512_fp16", "asimd")
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = set(line.split(":", 1)[1].split())
                    return [w for w in wanted if w in flags]
    except OSError:
        pass
    return []


def _openmp_runtime():
    """The OpenMP library loaded in this process, through threadpoolctl if present."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    for info in threadpool_info():
        if info.get("user_api") == "openmp":
            return f"{info.get('internal_api')} ({info.get('filepath')})"
    return None


def _dispatch(compiled):
    levels = _kernels.available_levels()
    if levels == ["baseline"] and not _kernels.has_variants():
        return f"off: one build of the kernels ({compiled})"
    return (f"{_kernels.SIMD_LEVEL} (available here: {', '.join(levels)}; "
            "CYNORM_SIMD forces a lower one)")


def _team_policy():
    if thread_team_info()["available"]:
        return f"{get_team_policy()} (teams give way under load)"
    return f"{get_team_policy()} (this build cannot time its teams)"


def config() -> dict[str, Any]:
    """The build configuration and what this machine offers it.

    Returns
    -------
    dict
        Keys: version, python, numpy, platform, compiler, openmp,
        openmp_runtime, threads (the next call's thread count),
        team_policy (get_team_policy, and whether the build can time its
        teams), cpus,
        simd_compiled, simd_dispatch (the SIMD level the kernels run at),
        cpu_features, float16_conversion, bfloat16_stores, dtypes and cudnn
        (cudnn_bind.describe()).  Values are str or int.

    See Also
    --------
    show_config : prints this dict.
    """
    import cudnn_bind

    info = build_info()
    omp = info["openmp"]
    return {
        "version": __version__,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "platform": f"{platform.system()} {platform.machine()}",
        "compiler": info["compiler"],
        "openmp": (f"yes (_OPENMP={omp})" if omp else "no (serial build)"),
        "openmp_runtime": _openmp_runtime() or ("libgomp/libomp (threadpoolctl not installed)" if omp else "none"),
        "threads": get_num_threads(),
        "team_policy": _team_policy(),
        "cpus": info["num_procs"],
        "simd_compiled": info["simd"],
        "simd_dispatch": _dispatch(info["simd"]),
        "cpu_features": ", ".join(_cpu_features()) or "unknown",
        "float16_conversion": info["float16_conversion"],
        "bfloat16_stores": _kernels.load("_convert").bf16_store_path(),
        "dtypes": SUPPORTED_NAMES,
        "cudnn": cudnn_bind.describe(),
    }


def show_config() -> None:
    """Print the build configuration (config()), one key per line."""
    cfg = config()
    width = max(map(len, cfg))
    for key, value in cfg.items():
        print(f"  {key:<{width}}  {value}")


def set_alloc_cache_limit(limit: int) -> None:
    """Keep at most `limit` bytes of freed output blocks.

    Large outputs are allocated through a small cache of freed blocks, so a
    training loop does not page-fault fresh memory at every call.

    Parameters
    ----------
    limit : int
        Bytes, 0 <= limit < 2**64.  Blocks held beyond it are freed at once;
        0 turns the cache off.  The limit at start-up is 512 MiB, or
        CYNORM_ALLOC_CACHE (a byte count, or off).

    Raises
    ------
    TypeError
        If limit is not an int.
    ValueError
        If limit is negative or not below 2**64.
    """
    _alloc.set_cache_limit(check_byte_count(limit))


def alloc_cache_info() -> dict[str, int]:
    """The state of the output-block cache.

    Returns
    -------
    dict
        limit (bytes it may hold), held (bytes it holds), blocks (how many),
        slots (how many blocks it can hold), min_size (outputs of at least
        this many bytes go through it), hits and misses (allocations served
        from it or not, since start-up).
    """
    return _alloc.cache_info()


def clear_alloc_cache() -> None:
    """Return every block the output-block cache holds to the system.

    The cache stays on with its limit (set_alloc_cache_limit(0) turns it off).
    """
    _alloc.clear_cache()
