"""The type aliases of cudnn_bind's public signatures (PEP 484).

cudnn_bind takes device memory from several array libraries, none of which
it depends on, so the aliases for arrays and streams are broad (``Any``):
their comments, and the numpydoc ``Parameters`` of each function, say
exactly what is accepted.  cudnn_bind does not import cynorm: these are its
own.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, SupportsFloat, SupportsIndex, Union

__all__ = ["DeviceArrayLike", "StreamLike", "ModeLike", "DTypeLike", "Int", "Ints", "Real",
           "LibraryPath"]

#: a device array argument: a CuPy array, a PyTorch CUDA tensor, a
#: `cudnn_bind.DeviceArray`, any object with ``__cuda_array_interface__``
#: (Numba, ...), an object with ``__dlpack__`` or a "dltensor" DLPack
#: capsule (see `cudnn_bind.memory.as_view`).  Also what the calls return:
#: arrays of x's kind (PyTorch tensors, CuPy arrays or DeviceArrays).
DeviceArrayLike = Any

#: a CUDA stream: None (the legacy default stream, 0), an int
#: ``cudaStream_t``, or a stream object with ``.cuda_stream`` (PyTorch),
#: ``.ptr`` (CuPy) or ``.handle`` (Numba)
StreamLike = Any

#: a ``cudnnBatchNormMode_t`` (``PER_ACTIVATION``, ``SPATIAL``,
#: ``SPATIAL_PERSISTENT``: 0, 1, 2) or its name (``"per_activation"``,
#: ``"spatial"``, ``"spatial_persistent"``, any case)
ModeLike = Union[str, SupportsIndex]

#: a dtype: a name ("float32", "float64", "float16", "bfloat16", "uint8";
#: "float" and "half" too), a NumPy dtype or type, or a PyTorch dtype
DTypeLike = Any

#: an int argument: a Python int or a NumPy integer (anything with
#: ``__index__``); bools are refused at run time
Int = SupportsIndex

#: a shape or strides: a sequence of ints (tuple, list, 1-D NumPy integer array)
Ints = Iterable[SupportsIndex]

#: a real scalar (eps, exponential_average_factor, coef): a Python or NumPy
#: number, anything ``float()`` takes except bools and strings
Real = Union[SupportsFloat, SupportsIndex]

#: a library path or soname: str, bytes or os.PathLike
LibraryPath = Union[str, bytes, os.PathLike[str], os.PathLike[bytes]]
