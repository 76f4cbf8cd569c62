"""What this build is and what it runs on: show_config() and config(); and
set_alloc_cache_limit, the output-block cache's one setting."""
import platform
import sys

import numpy as np

from cynorm._dtypes import SUPPORTED_DTYPES
from cynorm import _kernels
from cynorm._kernels import _alloc
from cynorm._kernels._runtime import build_info, get_num_threads
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


def config():
    """The build configuration as a dict (show_config prints it)."""
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
        "cpus": info["num_procs"],
        "simd_compiled": info["simd"],
        "simd_dispatch": _dispatch(info["simd"]),
        "cpu_features": ", ".join(_cpu_features()) or "unknown",
        "float16_conversion": info["float16_conversion"],
        "bfloat16_stores": _kernels.load("_convert").bf16_store_path(),
        "dtypes": ", ".join(str(d) for d in SUPPORTED_DTYPES),
        "cudnn": cudnn_bind.describe(),
    }


def show_config():
    """Print the build configuration."""
    cfg = config()
    width = max(map(len, cfg))
    for key, value in cfg.items():
        print(f"  {key:<{width}}  {value}")


def set_alloc_cache_limit(limit):
    """Keep at most `limit` bytes (an int >= 0) of freed output blocks; 0
    turns the cache off."""
    _alloc.set_cache_limit(check_byte_count(limit))
