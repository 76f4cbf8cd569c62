"""cudnn_bind: cuDNN batch normalization on device buffers, through ctypes.

Pure Python: no compiler and no CUDA toolkit at install time.  The libraries
are found at first use (see `cudnn_bind._lib` for the search order) or
named with `load(path)`.  Arrays may be CuPy arrays, PyTorch CUDA tensors,
anything with `__cuda_array_interface__` or DLPack, or `DeviceArray`.

    y, save_mean, save_invstd, reserve = batch_norm_forward_training(x, w, b, rm, rv)
    dx, dw, db = batch_norm_backward(x, dy, w, save_mean, save_invstd, 1e-5, reserve)
    y = batch_norm_forward_inference(x, w, b, rm, rv)

cuDNN 9 marks this legacy batch-norm API deprecated; it still works and is
what PyTorch calls.
"""
from cudnn_bind import _lib
from cudnn_bind.batch_norm import (
    INFERENCE_MAX_BATCH, TRAINING_MAX_BATCH, batch_norm_backward, batch_norm_forward_inference,
    batch_norm_forward_training, can_use_cudnn, choose_mode)
from cudnn_bind.descriptors import (
    PER_ACTIVATION, SPATIAL, SPATIAL_PERSISTENT, ActivationDescriptor, TensorDescriptor,
    derive_bn_descriptor)
from cudnn_bind.errors import (
    CudaError, CudnnBindError, CudnnError, CudnnUnavailableError, UnsupportedError)
from cudnn_bind.handles import Handle, handle_for
from cudnn_bind.memory import DeviceArray, DeviceBuffer

__all__ = [
    "load", "reset", "version", "is_available", "unavailable_reason", "describe", "device_count",
    "batch_norm_forward_training", "batch_norm_forward_inference", "batch_norm_backward",
    "can_use_cudnn", "choose_mode", "DeviceArray", "DeviceBuffer", "Handle", "handle_for",
    "TensorDescriptor", "ActivationDescriptor", "derive_bn_descriptor", "PER_ACTIVATION",
    "SPATIAL", "SPATIAL_PERSISTENT", "TRAINING_MAX_BATCH", "INFERENCE_MAX_BATCH",
    "CudnnBindError", "CudnnError", "CudaError", "CudnnUnavailableError", "UnsupportedError",
    "empty_cache", "memory_info",
]


def load(path=None, cudart=None):
    """Load cuDNN from `path` (and the CUDA runtime from `cudart`), replacing
    any library loaded before; returns the loaded library object."""
    return _lib.load(path, cudart)


def reset():
    """Forget the loaded library; the next call searches again."""
    _lib.reset()


def version():
    """cuDNN's version number (e.g. 92800 for 9.28.0); CudnnUnavailableError if none loads."""
    return _lib.get().version


def empty_cache():
    """Hand the device memory cached by cudnn_bind's pool (cudnn_bind.pool)
    back to CUDA; each device holding cached blocks is synchronized first."""
    _lib.get().pool.empty_cache()


def memory_info():
    """{'live_bytes': ..., 'cached_bytes': ...} of cudnn_bind's pool: memory
    owned by DeviceArrays, DeviceBuffers and workspaces, and memory kept
    for reuse."""
    pool = _lib.get().pool
    return {"live_bytes": pool.live_bytes, "cached_bytes": pool.cached_bytes}


def device_count():
    """The number of CUDA devices (raises CudaError without a driver)."""
    import ctypes
    lib = _lib.get()
    n = ctypes.c_int()
    lib.cuda("cudaGetDeviceCount", ctypes.byref(n))
    return n.value


def unavailable_reason():
    """'' when cuDNN batch norm can run here, else one sentence saying why:
    no library, no driver or no GPU."""
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


def is_available():
    """Whether cuDNN, the CUDA runtime, a driver and a GPU are all present."""
    return unavailable_reason() == ""


def describe():
    """One line for `python -m cynorm`."""
    try:
        lib = _lib.get()
    except CudnnUnavailableError:
        return f"cuDNN unavailable: {unavailable_reason()}"
    reason = unavailable_reason()
    state = "available" if not reason else f"unavailable: {reason}"
    return f"cuDNN {lib.version} from {lib.cudnn_path}, CUDA runtime {lib.cudart_path}; {state}"
