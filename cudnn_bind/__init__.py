"""cudnn_bind: cuDNN batch normalization on device buffers through ctypes.

This package is a placeholder until its issue lands: it can already tell
whether a cuDNN library is present on this machine (`find_library`,
`describe`), but running batch norm raises NotImplementedError.
"""
import ctypes
import glob
import os
import sys

__all__ = ["find_library", "describe", "is_available", "unavailable_reason",
           "version", "batch_norm_forward_training", "batch_norm_forward_inference",
           "batch_norm_backward"]

_SONAMES = ("libcudnn.so.9", "libcudnn.so.8")


def _wheel_candidates():
    for base in sys.path:
        for major in ("9", "8"):
            yield from glob.glob(os.path.join(base, "nvidia", "cudnn", "lib", f"libcudnn.so.{major}"))


def find_library():
    """The path (or loader name) of a loadable libcudnn, or None.

    Order: $CUDNN_BIND_LIBRARY, the nvidia-cudnn wheels in site-packages,
    then the system loader (libcudnn.so.9, then .so.8)."""
    env = os.environ.get("CUDNN_BIND_LIBRARY")
    candidates = ([env] if env else []) + list(_wheel_candidates()) + list(_SONAMES)
    for name in candidates:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return name
    return None


def describe():
    """One line for `python -m cynorm`: which cuDNN was found, if any."""
    path = find_library()
    if path is None:
        return "not found (no libcudnn.so.9/.so.8 on this machine)"
    return f"found: {path} (binding not implemented yet)"


def is_available():
    return False


def unavailable_reason():
    return "cudnn_bind is not implemented yet"


def version():
    raise NotImplementedError("cudnn_bind.version: the cuDNN binding is not implemented yet")


def _not_yet(name):
    def stub(*args, **kwargs):
        raise NotImplementedError(f"cudnn_bind.{name}: the cuDNN binding is not implemented yet")
    stub.__name__ = name
    return stub


batch_norm_forward_training = _not_yet("batch_norm_forward_training")
batch_norm_forward_inference = _not_yet("batch_norm_forward_inference")
batch_norm_backward = _not_yet("batch_norm_backward")
