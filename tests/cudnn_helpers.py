"""Shared pieces of the cudnn_bind tests: finding the NVIDIA wheels' files,
and skipping (or, in CI, failing) when they are missing."""
import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

import cudnn_bind
from cudnn_bind import _lib

# CI sets this: a missing wheel must fail the run, not skip the tests
REQUIRE = os.environ.get("CUDNN_BIND_REQUIRE_LIBRARY") == "1"


def find(pattern):
    """The first file matching nvidia/<pattern> in site-packages, or None
    (the binding's own wheel search)."""
    return next(_lib._wheel_files([pattern]), None)


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


STANDIN_SOURCE = os.path.join(os.path.dirname(__file__), "cudnn_standin", "standin.c")


def build_standin(directory):
    """Compile tests/cudnn_standin/standin.c against the real headers into
    `directory`; the path of the .so (skips, or fails in CI, without them)."""
    includes = header_dirs()
    if includes is None:
        missing("the cuDNN/CUDA headers are not installed (pip install --no-deps "
                "nvidia-cudnn-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12)")
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        missing("no C compiler for the stand-in")
    out = os.path.join(str(directory), "libstandin.so")
    cmd = [cc, "-O1", "-shared", "-fPIC", "-Wall", "-Werror=implicit-function-declaration",
           *[f"-I{d}" for d in includes], STANDIN_SOURCE, "-o", out, "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"stand-in does not compile against the real headers:\n{proc.stderr}"
    return out


def standin_hooks(path):
    """The stand-in library at `path`, its test hooks (standin.c's
    standin_* functions) given their argument and result types."""
    h = ctypes.CDLL(path)
    h.standin_calls.restype, h.standin_calls.argtypes = ctypes.c_long, [ctypes.c_char_p]
    h.standin_live_allocations.restype = ctypes.c_long
    h.standin_last_size.restype = ctypes.c_size_t
    h.standin_last_size.argtypes = [ctypes.c_char_p]
    h.standin_take_log.restype = ctypes.c_size_t
    h.standin_take_log.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    h.standin_fail_mallocs.argtypes = [ctypes.c_long]
    h.standin_live_objects.restype = ctypes.c_long
    h.standin_live_objects.argtypes = [ctypes.c_char_p]
    return h


def to_device(a, layout="contiguous", stream=None):
    """A DeviceArray holding `a` (N, C, ...) in the given memory layout
    ("contiguous" or "channels_last")."""
    if layout == "contiguous":
        return cudnn_bind.DeviceArray.from_numpy(a, stream=stream)
    nd = a.ndim
    host = np.ascontiguousarray(a.transpose((0,) + tuple(range(2, nd)) + (1,)))
    base = cudnn_bind.DeviceArray.from_numpy(host, stream=stream)
    st, acc = [0] * nd, a.shape[1]
    st[1] = 1
    for i in range(nd - 1, 1, -1):
        st[i] = acc
        acc *= a.shape[i]
    st[0] = acc
    return cudnn_bind.DeviceArray.from_pointer(base.ptr, a.shape, base.dtype, st, owner=base,
                                               stream=stream)


def run_fused_case(shape, with_z, make, to_device, close):
    """Fused ReLU (with_z: add+ReLU) forward and backward on float16
    channels-last x, against cynorm with the ReLU applied by hand.
    make(shape, dtype, seed) -> (x, w, b); to_device(array, layout);
    close(got, want, dtype, what) asserts."""
    import numpy as np

    import cudnn_bind
    import cynorm
    x, w, b = make(shape, "float16")
    z = make(shape, "float16", seed=7)[0]
    gx, gw, gb = to_device(x, "channels_last"), to_device(w, "contiguous"), to_device(b, "contiguous")
    gz = to_device(z, "channels_last") if with_z else None
    y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(gx, gw, gb, z=gz, activation="relu")
    pre, m, i = cynorm.batch_norm(x, w, b, training=True)
    pre = pre.astype(np.float64) + (z.astype(np.float64) if with_z else 0)
    close(y.to_numpy(), np.maximum(pre, 0), "float16", "y")
    dy = make(shape, "float16", seed=8)[0]
    out = cudnn_bind.batch_norm_backward(gx, to_device(dy, "channels_last"), gw, sm, si, 1e-5,
                                         reserve, y=y, z=gz, bias=gb, activation="relu")
    g = (dy.astype(np.float64) * (pre > 0)).astype(np.float32)
    ref = cynorm.batch_norm_backward(g, x.astype(np.float32), w, None, None, m, i, True)
    count = x.size // shape[1]
    close(out[0].to_numpy(), ref[0], "float16", "dx")
    close(out[1].to_numpy() / count, ref[1] / count, "float32", "dweight")
    close(out[2].to_numpy() / count, ref[2] / count, "float32", "dbias")
    assert len(out) == (4 if with_z else 3)
    if with_z:
        close(out[3].to_numpy(), g, "float16", "dz")
