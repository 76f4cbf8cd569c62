"""cudnn_bind: cuDNN's normalizations on device buffers, through ctypes.

Pure Python: no compiler and no CUDA toolkit at install time.  The libraries
are found at first use (see `cudnn_bind._lib` for the search order) or
named with `load(path)`.  Arrays may be CuPy arrays, PyTorch CUDA tensors,
anything with `__cuda_array_interface__` or DLPack, or `DeviceArray`.

    y, save_mean, save_invstd, reserve = batch_norm_forward_training(x, w, b, rm, rv)
    dx, dw, db = batch_norm_backward(x, dy, w, save_mean, save_invstd, 1e-5, reserve)
    y = batch_norm_forward_inference(x, w, b, rm, rv)

    y, mean, invstd = layer_norm_forward(x, normalized_shape, w, b)
    y, invstd = rms_norm_forward(x, normalized_shape, w)

Batch norm runs on cuDNN's graph API where cuDNN has an engine for the call
and on its legacy batch-norm API (deprecated in cuDNN 9, what PyTorch calls)
otherwise (`batch_norm_backend` says which); layer norm and RMSNorm run on
the graph API.
"""
from __future__ import annotations

import ctypes
from typing import Optional

from cudnn_bind import _lib
from cudnn_bind._typing import LibraryPath
from cudnn_bind.batch_norm import (
    INFERENCE_MAX_BATCH, TRAINING_MAX_BATCH, batch_norm_backend, batch_norm_backward,
    batch_norm_forward_inference, batch_norm_forward_training, can_use_cudnn, choose_mode)
from cudnn_bind.descriptors import (
    PER_ACTIVATION, SPATIAL, SPATIAL_PERSISTENT, ActivationDescriptor, TensorDescriptor,
    derive_bn_descriptor)
from cudnn_bind.errors import (
    CudaError, CudnnBindError, CudnnError, CudnnUnavailableError, UnsupportedError)
from cudnn_bind.handles import Handle, handle_for
from cudnn_bind.layer_norm import (
    layer_norm_backward, layer_norm_forward, rms_norm_backward, rms_norm_forward)
from cudnn_bind.memory import DeviceArray, DeviceBuffer

__all__ = [
    "load", "reset", "version", "is_available", "unavailable_reason", "describe", "device_count",
    "batch_norm_forward_training", "batch_norm_forward_inference", "batch_norm_backward",
    "batch_norm_backend", "layer_norm_forward", "layer_norm_backward", "rms_norm_forward",
    "rms_norm_backward", "can_use_cudnn", "choose_mode", "DeviceArray", "DeviceBuffer", "Handle", "handle_for",
    "TensorDescriptor", "ActivationDescriptor", "derive_bn_descriptor", "PER_ACTIVATION",
    "SPATIAL", "SPATIAL_PERSISTENT", "TRAINING_MAX_BATCH", "INFERENCE_MAX_BATCH",
    "CudnnBindError", "CudnnError", "CudaError", "CudnnUnavailableError", "UnsupportedError",
    "empty_cache", "memory_info",
]


def load(path: Optional[LibraryPath] = None,
         cudart: Optional[LibraryPath] = None) -> _lib.Library:
    """Load cuDNN (and the CUDA runtime), replacing any library loaded before.

    cuDNN comes from `path` and the runtime from `cudart` when given.
    Without arguments the search order of `cudnn_bind._lib` applies
    ($CUDNN_BIND_LIBRARY / $CUDNN_BIND_CUDART, the NVIDIA wheels in
    site-packages, the system loader).  A library named (here or by the
    variable) is the only candidate: that one or an error.  The runtime is
    the one of the CUDA major version cuDNN was built for (unless named).
    The previous library's handles (those `handle_for` made, in every
    thread) are destroyed, its plans dropped and its pool's cached memory
    handed back: do not call this while other threads are running batch
    norm.

    Parameters
    ----------
    path : str, bytes or os.PathLike, optional
        The libcudnn to load: a path or a soname (``"libcudnn.so.9"``).
        None (the default) searches.
    cudart : str, bytes or os.PathLike, optional
        The CUDA runtime (libcudart) to load; None (the default) searches.

    Returns
    -------
    cudnn_bind._lib.Library
        The loaded library object (``.version``, ``.cudnn_path``,
        ``.cudart_path``, ...).

    Raises
    ------
    TypeError
        If path or cudart is not a str, bytes, os.PathLike or None.
    ValueError
        If path or cudart is empty or contains a NUL character.
    CudnnUnavailableError
        If nothing loads, the library lacks a symbol cudnn_bind uses, or it
        is not cuDNN 8 or 9.  Then nothing is loaded and the paths are
        forgotten: the next use searches as if load had not been called.
    """
    return _lib.load(path, cudart)


def reset() -> None:
    """Forget the loaded library; the next call searches again.

    The library's handles (those `handle_for` made, in every thread) are
    destroyed first, its plans dropped and its pool's cached memory handed
    back to CUDA.
    """
    _lib.reset()


def version() -> int:
    """cuDNN's version number (cudnnGetVersion), loading the library on first use.

    Returns
    -------
    int
        The version, e.g. 92800 for 9.28.0.

    Raises
    ------
    CudnnUnavailableError
        If no cuDNN library loads.
    """
    return _lib.get().version


def empty_cache() -> None:
    """Hand the device memory cached by cudnn_bind's pool back to CUDA.

    The pool (`cudnn_bind.pool`) keeps freed blocks for reuse on their
    stream; this cudaFrees them.  Each device holding cached blocks is
    synchronized first (queued work may still use them).  Memory still
    owned by arrays is untouched.

    Raises
    ------
    CudnnUnavailableError
        If no cuDNN library loads.
    CudaError
        If synchronizing or freeing fails.
    """
    _lib.get().pool.empty_cache()


def memory_info() -> dict[str, int]:
    """The device memory held by cudnn_bind's pool, in bytes.

    Returns
    -------
    dict of str to int
        ``{'live_bytes': ..., 'cached_bytes': ...}``: memory owned by
        DeviceArrays, DeviceBuffers and workspaces (allocated from the pool,
        not from PyTorch's or CuPy's allocators), and memory kept for reuse.

    Raises
    ------
    CudnnUnavailableError
        If no cuDNN library loads.
    """
    pool = _lib.get().pool
    return {"live_bytes": pool.live_bytes, "cached_bytes": pool.cached_bytes}


def device_count() -> int:
    """The number of CUDA devices (cudaGetDeviceCount).

    Returns
    -------
    int
        The number of devices the CUDA runtime sees.

    Raises
    ------
    CudnnUnavailableError
        If no cuDNN library loads.
    CudaError
        Without a driver (cudaErrorInsufficientDriver) or a device
        (cudaErrorNoDevice), or if the runtime fails otherwise.
    """
    lib = _lib.get()
    n = ctypes.c_int()
    lib.cuda("cudaGetDeviceCount", ctypes.byref(n))
    return n.value


def unavailable_reason() -> str:
    """Why cuDNN batch norm cannot run here, in one sentence ('' when it can).

    Never raises for a missing library, driver or GPU: it says so.

    Returns
    -------
    str
        '' when cuDNN batch norm can run here, else one sentence saying
        why: no library, no driver or no GPU (or the CUDA runtime's error).
    """
    try:
        lib = _lib.get()
    except CudnnUnavailableError as exc:
        text = str(exc)
        return text if text.startswith("no ") else f"no usable cuDNN library: {text}"
    try:
        n = device_count()
    except CudaError as exc:
        if exc.name in ("cudaErrorInsufficientDriver", "cudaErrorNoDevice"):
            what = "no NVIDIA driver" if exc.name == "cudaErrorInsufficientDriver" else "no GPU"
            return f"{what}: cudaGetDeviceCount returned {exc.name} (cuDNN {lib.version} loaded from {lib.cudnn_path})"
        return f"the CUDA runtime failed: {exc}"
    if n == 0:
        return f"no GPU: cudaGetDeviceCount found 0 devices (cuDNN {lib.version} loaded)"
    return ""


def is_available() -> bool:
    """Whether cuDNN, the CUDA runtime, a driver and a GPU are all present.

    Returns
    -------
    bool
        True when `unavailable_reason` is ''.
    """
    return unavailable_reason() == ""


def describe() -> str:
    """One line for ``python -m cynorm``: the libraries found and whether they can run.

    Returns
    -------
    str
        The cuDNN version and path, the CUDA runtime's path and "available"
        or "unavailable: <reason>"; or "cuDNN unavailable: <reason>" when
        no library loads.
    """
    try:
        lib = _lib.get()
    except CudnnUnavailableError:
        return f"cuDNN unavailable: {unavailable_reason()}"
    reason = unavailable_reason()
    state = "available" if not reason else f"unavailable: {reason}"
    return f"cuDNN {lib.version} from {lib.cudnn_path}, CUDA runtime {lib.cudart_path}; {state}"
