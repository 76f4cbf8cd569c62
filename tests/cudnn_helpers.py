"""Shared pieces of the cudnn_bind tests: finding the NVIDIA wheels' files,
and skipping (or, in CI, failing) when they are missing."""
import glob
import os
import site
import sys

import pytest

# CI sets this: a missing wheel must fail the run, not skip the tests
REQUIRE = os.environ.get("CUDNN_BIND_REQUIRE_LIBRARY") == "1"


def nvidia_dirs():
    dirs = []
    for base in list(sys.path) + site.getsitepackages():
        d = os.path.join(base, "nvidia")
        if os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    return dirs


def find(pattern):
    """The first file matching nvidia/<pattern> in site-packages, or None."""
    for d in nvidia_dirs():
        hits = sorted(glob.glob(os.path.join(d, pattern)))
        if hits:
            return hits[0]
    return None


def missing(what):
    """Skip with `what` as the reason, or fail when CI requires the library."""
    if REQUIRE:
        pytest.fail(f"{what} (CUDNN_BIND_REQUIRE_LIBRARY=1: the install step is broken)")
    pytest.skip(what)


def header_dirs():
    """Include directories for cudnn.h and cuda_runtime_api.h (and crt/host_defines.h)."""
    cudnn_h = find("cudnn/include/cudnn.h")
    runtime_h = find("cuda_runtime/include/cuda_runtime_api.h")
    crt = find("cuda_nvcc/include/crt/host_defines.h")
    if not (cudnn_h and runtime_h and crt):
        return None
    return [os.path.dirname(cudnn_h), os.path.dirname(runtime_h),
            os.path.dirname(os.path.dirname(crt))]
