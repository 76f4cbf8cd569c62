"""Device buffers: what the binding accepts, and where its outputs come from.

Accepted as arrays (all end up as a `View`: pointer, shape, element strides,
dtype name, device, the library that owns the memory, and the stream its
producer queued it on):

* `DeviceArray` (this module): memory from the binding's stream-ordered pool
  (`cudnn_bind.pool`), for users with no array library, or a non-owning view
  of a raw pointer (`DeviceArray.from_pointer`);
* PyTorch CUDA tensors (read directly: their `__cuda_array_interface__`
  refuses bfloat16);
* anything with `__cuda_array_interface__` (CuPy, Numba, ...), whose
  optional "stream" key names the stream to wait for;
* DLPack: objects with `__dlpack__` (told the stream the call runs on) or a
  "dltensor" capsule.

Outputs, workspace and reserve space are allocated for the stream the
kernels run on: from PyTorch's caching allocator or CuPy's pool under that
stream when x comes from them, else from the binding's pool.
"""
from __future__ import annotations

import ctypes
import functools
import math
import threading
import weakref
from typing import Any, Optional, Sequence, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from cudnn_bind import _lib
from cudnn_bind._args import UINT64_MAX, integer, integers, show, stream_value
from cudnn_bind._typing import DeviceArrayLike, DTypeLike, Int, Ints, StreamLike
from cudnn_bind.pool import Block

__all__ = ["DeviceArray", "DeviceBuffer", "View", "as_view", "DTYPE_SIZES"]

DTYPE_SIZES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "uint8": 1}
_TYPESTR = {"f4": "float32", "f8": "float64", "f2": "float16", "u1": "uint8"}


def _numpy_dtype(name: str) -> np.dtype[Any]:
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - ml_dtypes is a dependency of cynorm
            raise TypeError("bfloat16 host arrays need ml_dtypes") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def dtype_name(dtype: DTypeLike) -> str:
    """'float32', 'float64', 'float16', 'bfloat16' or 'uint8' for a NumPy/torch dtype or name."""
    if dtype is None:  # np.dtype(None) is float64
        raise TypeError("dtype must be given: float32, float64, float16 or bfloat16, got None")
    text = str(dtype).replace("torch.", "")
    if text in DTYPE_SIZES:
        return text
    if text in ("float", "half"):
        return {"float": "float32", "half": "float16"}[text]
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, KeyError):
        raise TypeError(f"unsupported dtype {show(dtype)}") from None
    if dt.name in DTYPE_SIZES:
        return dt.name
    raise TypeError(f"unsupported dtype {show(dtype)}; expected float32, float64, float16 or bfloat16")


def c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(st))


@functools.lru_cache(maxsize=1024)
def _span(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Elements from the first to one past the last (0 for an empty array)."""
    if not all(shape):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(shape, strides))


# cudaGetDevice's output, one per thread: made once, not at every call
_device_out = threading.local()


def current_device(lib: _lib.Library) -> int:
    try:
        dev, ref = _device_out.pair
    except AttributeError:  # this thread's first call
        out = ctypes.c_int()
        dev, ref = _device_out.pair = (out, ctypes.byref(out))
    if lib.cudart.cudaGetDevice(ref):
        lib.cuda("cudaGetDevice", ref)  # raises, with the error's name
    return dev.value


def _copy_and_wait(lib: _lib.Library, dst: int, src: int, nbytes: int, kind: int,
                   stream: Optional[int]) -> None:
    """cudaMemcpyAsync on `stream`, then wait for that stream."""
    lib.cuda("cudaMemcpyAsync", ctypes.c_void_p(dst), ctypes.c_void_p(src), nbytes, kind,
             ctypes.c_void_p(stream or None))
    lib.cuda("cudaStreamSynchronize", ctypes.c_void_p(stream or None))


class DeviceBuffer:
    """Untyped device memory from the binding's stream-ordered pool.

    The memory comes from `cudnn_bind.pool`, for use on `stream`, on the
    current CUDA device; it is given back by `free`, by leaving a ``with``
    block or by garbage collection.

    Parameters
    ----------
    nbytes : int
        The size in bytes, 0 to 2**64 - 1 (0 allocates nothing: ``ptr`` is 0).
    lib : cudnn_bind._lib.Library, optional
        The loaded library whose pool to use (default: the one
        `cudnn_bind.load` loaded, or the default search finds).
    stream : int or stream object, optional
        The stream the memory is for: an int ``cudaStream_t`` or a stream
        object with ``.cuda_stream`` (PyTorch), ``.ptr`` (CuPy) or
        ``.handle`` (Numba).  None (the default) is the legacy default
        stream, 0.

    Attributes
    ----------
    nbytes : int
        The size asked for, in bytes.
    stream : int
        The ``cudaStream_t`` the memory is for.
    device : int
        The device that was current at construction.
    ptr : int
        The device address; 0 after `free` (and for ``nbytes=0``).

    Raises
    ------
    TypeError
        If nbytes is not an int or stream is not a stream.
    ValueError
        If nbytes or the stream handle is out of range, or lib has been
        unloaded (its pool is closed).
    CudnnUnavailableError
        If no cuDNN library loads.
    CudaError
        If the CUDA runtime fails (no device, out of memory).
    """

    nbytes: int
    stream: int
    device: int
    ptr: int

    def __init__(self, nbytes: Int, lib: Optional[_lib.Library] = None, *,
                 stream: StreamLike = None) -> None:
        self._lib = lib or _lib.get()
        self.nbytes = integer(nbytes, "nbytes", 0, UINT64_MAX)
        self.stream = stream_value(stream, "stream")
        self.device = current_device(self._lib)
        self._block = (Block(self._lib.pool, self.nbytes, self.device, self.stream)
                       if self.nbytes else None)
        self.ptr = self._block.ptr if self._block is not None else 0

    def free(self) -> None:
        """Give the memory back to the pool now (once) and set ``ptr`` to 0.

        The block goes to the free list of the buffer's stream; work queued
        on that stream finishes before a later owner's.
        """
        block, self._block = self._block, None
        self.ptr = 0
        if block is not None:
            block.release()

    def __enter__(self) -> DeviceBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()


class DeviceArray:
    """A typed N-d array in device memory, for use without any array library.

    ``DeviceArray(shape, dtype)`` allocates from the binding's
    stream-ordered pool (`cudnn_bind.pool`) for `stream`, on the current
    CUDA device (C order unless `strides` in elements are given);
    `from_numpy`/`to_numpy` copy on a stream and wait for it;
    `from_pointer` wraps memory someone else owns.  Memory goes back to
    the pool when the array (and any array sharing its block: a call's
    statistics and reserve share one) is freed or garbage collected.

    Parameters
    ----------
    shape : sequence of int
        The sizes of the dimensions, each >= 0.
    dtype : str, numpy.dtype or torch.dtype, optional
        "float32" (the default), "float64", "float16", "bfloat16" or
        "uint8" (also "float" and "half", NumPy dtypes and PyTorch dtypes
        of those).
    strides : sequence of int, optional
        The strides in elements (not bytes), each >= 0, one per dimension;
        None (the default) is C order.
    stream : int or stream object, optional
        The stream the memory is for and its contents are produced on: an
        int ``cudaStream_t`` or a stream object with ``.cuda_stream``
        (PyTorch), ``.ptr`` (CuPy) or ``.handle`` (Numba).  None (the
        default) is the legacy default stream, 0.

    Attributes
    ----------
    shape : tuple of int
        The sizes of the dimensions.
    strides : tuple of int
        The strides, in elements.
    dtype : str
        The dtype's name: "float32", "float64", "float16", "bfloat16" or
        "uint8".
    nbytes : int
        The bytes the array spans, from its first element to one past its
        last (0 for an empty array).
    device : int or None
        The CUDA device the memory is on (None for a `from_pointer` view of
        host or unregistered memory).
    stream : int or None
        The stream the array's contents are produced on (outputs of
        cudnn_bind's calls: the stream the call ran on).  A call on another
        stream waits for it first (an event, not a device synchronization),
        as for the ``stream`` key of ``__cuda_array_interface__``, which
        reports it.  None (`from_pointer`'s default) means nothing to wait
        for.
    ptr : int
        The device address of the first element; 0 after `free` (and for
        an empty array).

    Raises
    ------
    TypeError
        If shape or strides are not sequences of ints, or dtype is not one
        of those above.
    ValueError
        If a size or stride is negative, strides do not have one entry per
        dimension, the array spans more bytes than a size_t holds, or the
        stream handle is out of range.
    CudnnUnavailableError
        If no cuDNN library loads.
    CudaError
        If the CUDA runtime fails (no device, out of memory).
    """
    __slots__ = ("shape", "strides", "dtype", "nbytes", "device", "stream", "ptr", "_owner",
                 "__weakref__")
    # what the calls read of an array argument (see View): a DeviceArray is its own
    kind = "device_array"
    read_only = False

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    nbytes: int
    device: Optional[int]
    stream: Optional[int]
    ptr: int
    _owner: object

    def __init__(self, shape: Ints, dtype: DTypeLike = "float32",
                 strides: Optional[Ints] = None, *, stream: StreamLike = None) -> None:
        self._set_geometry(shape, dtype, strides)
        if self.nbytes > UINT64_MAX:
            raise ValueError(f"shape {show(self.shape)} with strides {show(self.strides)} spans "
                             f"{show(self.nbytes)} bytes, more than a size_t holds")
        stream = self.stream = stream_value(stream, "stream")
        lib = _lib.get()
        device = self.device = current_device(lib)
        owner = self._owner = Block(lib.pool, self.nbytes, device, stream) if self.nbytes else None
        self.ptr = owner.ptr if owner is not None else 0

    def _set_geometry(self, shape: Ints, dtype: DTypeLike, strides: Optional[Ints]) -> None:
        """shape, dtype, strides (elements; None: C order) and nbytes, checked."""
        self.shape = integers(shape, "shape", 0)
        self.dtype = dtype_name(dtype)
        self.strides = (integers(strides, "strides", 0) if strides is not None
                        else c_strides(self.shape))
        if len(self.strides) != len(self.shape):
            raise ValueError(f"strides {show(self.strides)} do not match shape {show(self.shape)}")
        self.nbytes = _span(self.shape, self.strides) * self.itemsize

    @property
    def obj(self) -> DeviceArray:
        """The array itself (what a call keeps alive while it uses the memory)."""
        return self

    @property
    def itemsize(self) -> int:
        """The size of one element in bytes (1, 2, 4 or 8)."""
        return DTYPE_SIZES[self.dtype]

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements (exact, a Python int)."""
        return math.prod(self.shape)

    @classmethod
    def from_pointer(cls, ptr: Int, shape: Ints, dtype: DTypeLike,
                     strides: Optional[Ints] = None, owner: object = None, *,
                     stream: StreamLike = None) -> DeviceArray:
        """A view of device memory someone else owns, at an integer address.

        The memory is not freed by cudnn_bind; `owner` is kept alive with
        the view.  The view's ``device`` is the device that owns `ptr`
        (cudaPointerGetAttributes; None for host or unregistered memory),
        or the current device for a NULL `ptr`.

        Parameters
        ----------
        ptr : int
            The device address of the first element, 0 to 2**64 - 1.
        shape : sequence of int
            The sizes of the dimensions, each >= 0.
        dtype : str, numpy.dtype or torch.dtype
            "float32", "float64", "float16", "bfloat16" or "uint8" (as for
            the constructor).
        strides : sequence of int, optional
            The strides in elements, each >= 0; None (the default) is C order.
        owner : object, optional
            Any object to keep alive as long as the view (the array that
            owns the memory, say).
        stream : int or stream object, optional
            Where the memory's contents are produced: an int
            ``cudaStream_t`` or a stream object (``.cuda_stream``, ``.ptr``
            or ``.handle``).  None (the default) means they are ready now:
            nothing to wait for.

        Returns
        -------
        DeviceArray
            The view, with ``stream`` None unless `stream` is given.

        Raises
        ------
        TypeError
            If ptr is not an int, shape or strides are not sequences of
            ints, dtype is not supported or stream is not a stream.
        ValueError
            If ptr, a size, a stride or the stream handle is out of range,
            strides do not match shape, or ptr plus the bytes the array
            spans overflows 64 bits.
        """
        ptr = integer(ptr, "ptr (a device address)", 0, UINT64_MAX)
        self = cls.__new__(cls)
        self._set_geometry(shape, dtype, strides)
        if ptr + self.nbytes > UINT64_MAX + 1:
            raise ValueError(f"ptr plus the {show(self.nbytes)} bytes of shape {show(self.shape)} "
                             "overflows 64 bits")
        self.stream = None if stream is None else stream_value(stream, "stream")
        lib = _lib.get()
        self.ptr, self._owner = ptr, owner
        self.device = _pointer_device(lib, ptr) if ptr else current_device(lib)
        return self

    @classmethod
    def from_numpy(cls, array: ArrayLike, *, stream: StreamLike = None) -> DeviceArray:
        """A device copy of a host array.

        The copy is made on `stream`, which is waited for before returning.
        The device array is C-contiguous, in the host array's dtype (in
        native byte order), on the current device.

        Parameters
        ----------
        array : array_like
            The host data: anything ``numpy.asarray`` takes, of dtype
            float32, float64, float16, bfloat16 (ml_dtypes) or uint8.
        stream : int or stream object, optional
            The stream to copy on, which the new array is for: an int
            ``cudaStream_t`` or a stream object (``.cuda_stream``, ``.ptr``
            or ``.handle``).  None (the default) is the legacy default
            stream, 0.

        Returns
        -------
        DeviceArray
            The copy, of the array's shape.

        Raises
        ------
        TypeError
            If the array's dtype is not one of those above.
        CudaError
            If the copy fails.
        """
        host = np.ascontiguousarray(array)
        if not host.dtype.isnative:
            host = host.astype(host.dtype.newbyteorder("="))
        out = cls(host.shape, host.dtype if host.dtype.name != "bfloat16" else "bfloat16",
                  stream=stream)
        if out.nbytes:
            _copy_and_wait(_lib.get(), out.ptr, host.ctypes.data, host.nbytes,
                           _lib.CUDA_MEMCPY_HOST_TO_DEVICE, out.stream)
        return out

    def to_numpy(self, *, stream: StreamLike = None) -> NDArray[Any]:
        """A host copy of the array.

        The copy is made on `stream` after the work queued there, and
        waited for; when the array's own ``stream`` is another one, that
        stream is synchronized first (its producer).  A strided array is
        read through its strides.

        Parameters
        ----------
        stream : int or stream object, optional
            The stream to copy on: an int ``cudaStream_t`` or a stream
            object (``.cuda_stream``, ``.ptr`` or ``.handle``).  None (the
            default) is the array's own stream, else the legacy default
            stream.

        Returns
        -------
        numpy.ndarray
            A new C-contiguous array of the same shape and dtype
            (ml_dtypes' bfloat16 for "bfloat16").

        Raises
        ------
        ValueError
            If the array has been freed (and is not empty).
        CudaError
            If the copy fails.
        """
        stream = (self.stream or 0) if stream is None else stream_value(stream, "stream")
        raw = np.empty(self.nbytes // self.itemsize, dtype=_numpy_dtype(self.dtype))
        if self.nbytes:
            if not self.ptr:
                raise ValueError("this DeviceArray has been freed")
            lib = _lib.get()
            if self.stream is not None and self.stream != stream:  # its producer first
                lib.cuda("cudaStreamSynchronize", ctypes.c_void_p(self.stream or None))
            _copy_and_wait(lib, raw.ctypes.data, self.ptr, self.nbytes,
                           _lib.CUDA_MEMCPY_DEVICE_TO_HOST, stream)
        return np.lib.stride_tricks.as_strided(
            raw, self.shape, tuple(s * self.itemsize for s in self.strides)).copy()

    def free(self) -> None:
        """Drop this array's memory and set ``ptr`` to 0.

        A block of the pool goes back once no other array holds it; a
        `from_pointer` view only forgets its owner.
        """
        self._owner = None
        self.ptr = 0

    def __enter__(self) -> DeviceArray:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA Array Interface (version 3) of the array.

        Strides in bytes; ``stream`` is the array's stream (1 for the legacy
        default stream, as the interface forbids 0) or None.  A bfloat16
        array has none (TypeError): the interface has no bfloat16 type.
        """
        if self.dtype == "bfloat16":
            raise TypeError("__cuda_array_interface__ has no bfloat16 type")
        cai: dict[str, Any] = {
            "shape": self.shape, "typestr": _numpy_dtype(self.dtype).str,
            "data": (self.ptr, False), "version": 3,
            "strides": tuple(s * self.itemsize for s in self.strides)}
        # the interface's "stream": 1 is the legacy default stream (0 is not allowed)
        cai["stream"] = None if self.stream is None else (self.stream or 1)
        return cai

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.device}, "
                f"stream={self.stream})")


class View:
    """What the binding needs of an array argument.  `stream`: the stream
    its producer queued it on (to wait for), or None."""
    __slots__ = ("ptr", "shape", "strides", "dtype", "device", "kind", "obj", "read_only",
                 "stream")

    def __init__(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: str,
                 device: Optional[int], kind: str, obj: Any, read_only: bool = False,
                 stream: Optional[int] = None) -> None:
        self.ptr, self.shape, self.strides = ptr, shape, strides
        self.dtype, self.device, self.kind, self.obj = dtype, device, kind, obj
        self.read_only, self.stream = read_only, stream

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # exact: np.prod would wrap at 2**63


def _pointer_device(lib: _lib.Library, ptr: int) -> Optional[int]:
    """The device that owns `ptr`, or None for host/unregistered memory."""
    attrs = lib.PointerAttributes()
    lib.cuda("cudaPointerGetAttributes", ctypes.byref(attrs), ctypes.c_void_p(ptr))
    if attrs.type in (_lib.CUDA_MEMORY_TYPE_DEVICE, _lib.CUDA_MEMORY_TYPE_MANAGED):
        return attrs.device
    return None


def _cai_device(lib: _lib.Library, obj: object, ptr: int) -> Optional[int]:
    """The device of `ptr`, which `obj` exports: asked of CUDA once per
    (exporter, pointer) while the exporter lives, not at every call.

    Safe because the CUDA Array Interface makes the exporter keep its memory
    alive for as long as the exporter itself lives: while it does, `ptr`
    cannot be freed and handed to another allocation, so its device cannot
    change.  The entry is keyed by the exporter's identity and the pointer,
    and a weak reference drops it the moment the exporter dies, before its
    id can be reused; a pointer freed and reused later comes with another
    exporter, which is asked about afresh.  Exporters that take no weak
    references are asked at every call."""
    cache = lib.cai_devices
    key = (id(obj), ptr)
    entry = cache.get(key)
    if entry is not None and entry[0]() is obj:
        return entry[1]
    device = _pointer_device(lib, ptr)
    try:
        ref = weakref.ref(obj, functools.partial(_forget_device, cache, key))
    except TypeError:  # no weak references to this exporter: ask every time
        return device
    cache[key] = (ref, device)
    return device


def _forget_device(cache: dict[tuple[int, int], Any], key: tuple[int, int],
                   ref: weakref.ref[Any]) -> None:
    """The weak reference's callback: the exporter died, its entry goes."""
    entry = cache.get(key)
    if entry is not None and entry[0] is ref:  # not a newer exporter's entry
        cache.pop(key, None)


def _is_torch_tensor(obj: object) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


# every typestr the interface may give for the dtypes taken (byte-order mark, code)
_CAI_TYPESTR = {order + code: name for code, name in _TYPESTR.items() for order in "<|="}


def _cai_plain(cai: Any) -> Optional[tuple[tuple[int, ...], tuple[int, ...], str, int, bool,
                                         Optional[int]]]:
    """(shape, strides in elements, dtype, pointer, read-only, stream) of an
    interface dict made of plain tuples and ints, as CuPy's and Numba's are,
    or None: then _from_cai checks it key by key and names what is wrong."""
    if type(cai) is not dict or cai.get("mask") is not None:
        return None
    shape, data, version = cai.get("shape"), cai.get("data"), cai.get("version")
    typestr, strides, stream = cai.get("typestr"), cai.get("strides"), cai.get("stream")
    dtype = _CAI_TYPESTR.get(typestr) if type(typestr) is str else None
    if (dtype is None or type(version) is not int or version < 0 or type(shape) is not tuple
            or not all(type(d) is int and d >= 0 for d in shape)
            or type(data) is not tuple or len(data) != 2 or type(data[0]) is not int
            or not 0 <= data[0] <= UINT64_MAX or type(data[1]) is not bool
            or not (stream is None or (type(stream) is int and 0 < stream <= UINT64_MAX))):
        return None
    size = DTYPE_SIZES[dtype]
    if strides is None:
        strides = c_strides(shape)
    elif (type(strides) is tuple and len(strides) == len(shape)
          and all(type(st) is int and st % size == 0 for st in strides)):
        strides = tuple(st // size for st in strides)
    else:
        return None
    # the interface's stream 1 is the legacy default stream, 0 here
    return shape, strides, dtype, data[0], data[1], (0 if stream == 1 else stream)


def _cai_view(obj: Any, lib: _lib.Library, shape: tuple[int, ...], strides: tuple[int, ...],
              dtype: str, ptr: int, read_only: bool, stream: Optional[int]) -> View:
    kind = "cupy" if type(obj).__module__.startswith("cupy") else "cai"
    device = _cai_device(lib, obj, ptr) if ptr else None
    return View(ptr, shape, strides, dtype, device, kind, obj, read_only, stream)


def _from_cai(obj: Any, name: str, lib: _lib.Library) -> View:
    cai = obj.__cuda_array_interface__
    plain = _cai_plain(cai)
    if plain is not None:  # the common case, checked in one pass
        return _cai_view(obj, lib, *plain)
    what = f"{name}.__cuda_array_interface__"
    if not isinstance(cai, dict):
        raise TypeError(f"{what} must be a dict, got {type(cai).__name__}")
    for key in ("shape", "typestr", "data", "version"):
        if key not in cai:
            raise TypeError(f"{what} has no {key!r} key (required by the CUDA Array Interface)")
    integer(cai["version"], f"{what}['version']", 0)
    if cai.get("mask") is not None:
        raise ValueError(f"{what} has a mask: masked arrays are not supported")
    shape = integers(cai["shape"], f"{what}['shape']", 0)
    typestr = cai["typestr"]
    dtype = _TYPESTR.get(typestr[1:]) if isinstance(typestr, str) else None
    if dtype is None or typestr[0] not in "<|=":
        raise TypeError(f"{what}['typestr'] must be one of '<f4', '<f8', '<f2' or '|u1', "
                        f"got {show(typestr)}")
    data = cai["data"]
    if (not isinstance(data, (tuple, list)) or len(data) != 2
            or not isinstance(data[1], (bool, np.bool_, int))):
        raise TypeError(f"{what}['data'] must be a (pointer, read_only) tuple, got {show(data)}")
    ptr = 0 if data[0] is None else integer(data[0], f"{what}['data'][0] (the pointer)", 0,
                                             UINT64_MAX)
    size = DTYPE_SIZES[dtype]
    if cai.get("strides") is None:
        strides = c_strides(shape)
    else:
        strides = integers(cai["strides"], f"{what}['strides']")
        if len(strides) != len(shape):
            raise ValueError(f"{what}['strides'] {show(strides)} must have one entry per "
                             f"dimension of shape {show(shape)}")
        if any(s % size for s in strides):
            raise ValueError(f"{what}['strides'] {show(strides)} are not multiples of the item "
                             f"size {size}")
        strides = tuple(s // size for s in strides)
    return _cai_view(obj, lib, shape, strides, dtype, ptr, bool(data[1]),
                     _cai_stream(cai.get("stream"), what))


def _cai_stream(value: object, what: str) -> Optional[int]:
    """The producer's stream from the interface's optional "stream" key (v3):
    None (nothing to wait for), 1 (the legacy default stream, 0 here), 2
    (the per-thread default stream) or a cudaStream_t; 0 is not allowed."""
    if value is None:
        return None
    value = integer(value, f"{what}['stream']", 0, UINT64_MAX)
    if value == 0:
        raise ValueError(f"{what}['stream'] is 0, which the CUDA Array Interface forbids "
                         "(ambiguous): 1 is the legacy default stream, None means no "
                         "synchronization is needed")
    return 0 if value == 1 else value


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_CUDA, _DL_CUDA_MANAGED = 2, 13
_DL_TYPES = {(2, 32): "float32", (2, 64): "float64", (2, 16): "float16", (4, 16): "bfloat16",
             (1, 8): "uint8"}
# DLManagedTensorVersioned (DLPack 1.x): version (2 x uint32), manager_ctx,
# deleter, flags (uint64), then the DLTensor
_DL_VERSIONED_FLAGS_OFFSET = 8 + 8 + 8
_DL_VERSIONED_OFFSET = 8 + 8 + 8 + 8
_DL_FLAG_READ_ONLY = 1
_capsule_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


class _Torch:
    """PyTorch and what the binding asks of it at every call, looked up once.

    The public ways to ask (``torch.cuda.current_stream``, a device given
    as a string) build Python objects at each call, and a forward call asks
    nine times."""

    def __init__(self) -> None:
        import torch
        self.torch = torch
        self.dtypes = {"float32": torch.float32, "float64": torch.float64,
                       "float16": torch.float16, "bfloat16": torch.bfloat16,
                       "uint8": torch.uint8}
        self.names = {value: key for key, value in self.dtypes.items()}
        self._devices: dict[int, Any] = {}
        # the query PyTorch's own generated code makes (torch._inductor's
        # get_raw_stream); private, so the public call stands in where it is gone
        self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

    def current_stream(self, device: int) -> int:
        """PyTorch's current ``cudaStream_t`` on `device` (an index)."""
        if self._raw_stream is not None:
            return int(self._raw_stream(device))
        return int(self.torch.cuda.current_stream(device).cuda_stream)

    def device(self, index: int) -> Any:
        """The torch.device of CUDA device `index`."""
        where = self._devices.get(index)
        if where is None:
            where = self._devices[index] = self.torch.device("cuda", index)
        return where


_TORCH: Optional[_Torch] = None


def _torch() -> _Torch:
    """The _Torch of the imported PyTorch (made on first use: the binding
    imports torch only once it meets a tensor)."""
    global _TORCH
    if _TORCH is None:
        _TORCH = _Torch()
    return _TORCH


def _dlpack_capsule(obj: Any, name: str, stream: Optional[int], lib: _lib.Library) -> Any:
    """obj's capsule; the producer is told the consumer's `stream` (DLPack:
    1 for the legacy default stream, as 0 is not allowed) and makes it wait
    for its own work."""
    if not hasattr(obj, "__dlpack__"):
        return obj
    # DLPack 1.x first; older producers lack it
    attempts: list[dict[str, object]] = [{"max_version": (1, 0)}, {}]
    if stream is not None:
        attempts = [dict(a, stream=stream or 1) for a in attempts] + [{}]
    for kwargs in attempts[:-1]:
        try:
            return obj.__dlpack__(**kwargs)
        except TypeError:  # an older producer: fewer keywords
            pass
        except BufferError as exc:
            raise TypeError(f"{name}: its __dlpack__() failed: {exc}") from exc
    try:
        capsule = obj.__dlpack__(**attempts[-1])
    except (TypeError, BufferError) as exc:
        raise TypeError(f"{name}: its __dlpack__() failed: {exc}") from exc
    if stream is not None:  # a producer that cannot be told the stream: wait for all work
        lib.cuda("cudaDeviceSynchronize")
    return capsule


def _from_dlpack(obj: Any, name: str, stream: Optional[int], lib: _lib.Library) -> View:
    capsule = _dlpack_capsule(obj, name, stream, lib)
    if _capsule_valid(capsule, b"dltensor_versioned"):
        base = _capsule_pointer(capsule, b"dltensor_versioned")
        major = ctypes.c_uint32.from_address(base).value
        if major != 1:
            raise TypeError(f"{name}: DLPack version {major}.x is not supported (1.x is)")
        flags = ctypes.c_uint64.from_address(base + _DL_VERSIONED_FLAGS_OFFSET).value
        t = _DLTensor.from_address(base + _DL_VERSIONED_OFFSET)
        read_only = bool(flags & _DL_FLAG_READ_ONLY)
    elif _capsule_valid(capsule, b"dltensor"):
        # DLManagedTensor starts with its DLTensor
        t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
        read_only = False
    else:
        raise TypeError(f"{name}: not an unconsumed DLPack capsule")
    if t.device.device_type not in (_DL_CUDA, _DL_CUDA_MANAGED):
        raise ValueError(f"{name}: DLPack device type {t.device.device_type} is not CUDA memory")
    dtype = _DL_TYPES.get((t.dtype.code, t.dtype.bits))
    if dtype is None or t.dtype.lanes != 1:
        raise TypeError(f"{name}: unsupported DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits)")
    if not 0 <= t.ndim <= 64 or (t.ndim and not t.shape):
        raise ValueError(f"{name}: malformed DLPack tensor (ndim {t.ndim}, shape "
                         f"{'NULL' if not t.shape else 'set'})")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if any(d < 0 for d in shape):
        raise ValueError(f"{name}: DLPack shape {shape} has a negative size")
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else c_strides(shape)
    ptr = (t.data or 0) + t.byte_offset
    if ptr > UINT64_MAX:
        raise ValueError(f"{name}: DLPack data pointer plus byte_offset overflows 64 bits")
    # the capsule keeps the memory alive as long as the view holds it (it is
    # read, never consumed, so its deleter still runs)
    return View(ptr, shape, strides, dtype, t.device.device_id, "dlpack", (obj, capsule),
                read_only)


def as_view(obj: DeviceArrayLike, name: str, lib: Optional[_lib.Library] = None,
            stream: Optional[int] = None) -> Union[View, DeviceArray]:
    """A View of an array argument, or TypeError naming `name`.  `stream`:
    the stream the caller will use it on (given to DLPack producers)."""
    if type(obj) is DeviceArray:
        if not obj.ptr and obj.nbytes:
            raise ValueError(f"{name}: the DeviceArray has been freed")
        return obj  # its own View
    lib = lib or _lib.get()
    if _is_torch_tensor(obj):
        if not obj.is_cuda:
            raise ValueError(f"{name}: expected a CUDA tensor, got one on {obj.device}")
        t = _torch()
        device = obj.get_device()
        # PyTorch queues work on its current stream: a call on another waits for it
        return View(obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()),
                    t.names.get(obj.dtype) or dtype_name(obj.dtype), device, "torch", obj, False,
                    t.current_stream(device))
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj, name, lib)
    if isinstance(obj, np.ndarray):
        raise TypeError(f"{name}: a NumPy array is host memory; copy it to the device first "
                        "(cudnn_bind.DeviceArray.from_numpy) or use cynorm.batch_norm on the CPU")
    if hasattr(obj, "__dlpack__") or type(obj).__name__ == "PyCapsule":
        return _from_dlpack(obj, name, stream, lib)
    if isinstance(obj, int):
        raise TypeError(f"{name}: a raw pointer needs its shape and dtype: wrap it with "
                        "cudnn_bind.DeviceArray.from_pointer(ptr, shape, dtype)")
    raise TypeError(f"{name}: expected a device array (CuPy, PyTorch CUDA tensor, "
                    f"__cuda_array_interface__, DLPack or cudnn_bind.DeviceArray), "
                    f"got {type(obj).__name__}")


_EXTERNAL_STREAMS: dict[tuple[str, int, int], Any] = {}


def _external_stream(module: Any, device: int, stream: int) -> Any:
    """PyTorch's or CuPy's stream object for a raw cudaStream_t (cached:
    creating one costs)."""
    key = (module.__name__, device, stream)
    s = _EXTERNAL_STREAMS.get(key)
    if s is None:
        if len(_EXTERNAL_STREAMS) >= 64:  # streams come and go: keep the recent ones
            _EXTERNAL_STREAMS.clear()
        if module.__name__ == "torch":
            s = module.cuda.ExternalStream(stream, device=device)
        else:
            with module.cuda.Device(device):
                s = module.cuda.ExternalStream(stream)
        _EXTERNAL_STREAMS[key] = s
    return s


# an array to allocate: (shape, strides in elements, dtype name)
Spec = tuple[tuple[int, ...], tuple[int, ...], str]
# an array carved from a block: (offset in bytes, shape, strides, dtype name, bytes)
Piece = tuple[int, tuple[int, ...], tuple[int, ...], str, int]
# the arrays of one block: (its bytes, the pieces)
Layout = tuple[int, tuple[Piece, ...]]


def block_layout(specs: Sequence[Spec]) -> Layout:
    """Where each array of `specs` goes in one block of the pool: each
    256-byte aligned, as cudaMalloc's.  A caller that allocates the same
    specs again keeps the result (batch_norm's plans do)."""
    pieces, total = [], 0
    for shape, strides, dtype in specs:
        nbytes = _span(shape, strides) * DTYPE_SIZES[dtype]
        pieces.append((total, shape, strides, dtype, nbytes))
        total += -(-nbytes // 256) * 256
    return total, tuple(pieces)


def new_arrays(kind: str, device: int, stream: int, specs: Sequence[Spec],
               lib: _lib.Library,
               layout: Optional[Layout] = None) -> tuple[Sequence[Any], Sequence[int]]:
    """New device arrays for use on `stream`, one per (shape, strides, dtype)
    in `specs`: from PyTorch's or CuPy's allocator (kind "torch"/"cupy")
    under that stream, so that freeing them is ordered after the work
    queued there; else DeviceArrays carved from one block of the binding's
    pool (they share it: it goes back when the last of them goes), placed
    as `layout` says (block_layout(specs) when None).
    Returns (arrays, device addresses)."""
    if kind == "torch" or (kind == "cupy" and all(dt != "bfloat16" for _, _, dt in specs)):
        arrays = [_framework_array(kind, device, stream, *spec) for spec in specs]
        return arrays, [data_ptr(a) for a in arrays]
    total, pieces = layout if layout is not None else block_layout(specs)
    block = Block(lib.pool, total, device, stream) if total else None
    base = block.ptr if block is not None else 0
    arrays, ptrs = [], []
    # built here, not by a helper per array (every output of a call pays it)
    for offset, shape, strides, dtype, nbytes in pieces:
        a = DeviceArray.__new__(DeviceArray)
        a.shape, a.strides, a.dtype = shape, strides, dtype
        a.nbytes, a.device, a.stream = nbytes, device, stream
        # an empty array holds no memory (ptr 0), as a zero-byte DeviceArray does
        if nbytes:
            a._owner, a.ptr = block, base + offset
        else:
            a._owner, a.ptr = None, 0
        arrays.append(a)
        ptrs.append(a.ptr)
    return arrays, ptrs


def _framework_array(kind: str, device: int, stream: int, shape: tuple[int, ...],
                     strides: tuple[int, ...], dtype: str) -> Any:
    if kind == "torch":
        t = _torch()
        where, torch_dtype = t.device(device), t.dtypes[dtype]
        if t.current_stream(device) == stream:
            return t.torch.empty_strided(shape, strides, dtype=torch_dtype, device=where)
        with t.torch.cuda.stream(_external_stream(t.torch, device, stream)):
            return t.torch.empty_strided(shape, strides, dtype=torch_dtype, device=where)
    import cupy
    with cupy.cuda.Device(device):
        if cupy.cuda.get_current_stream().ptr == stream:
            base = cupy.empty(_span(shape, strides), dtype=dtype)
        else:
            with _external_stream(cupy, device, stream):
                base = cupy.empty(_span(shape, strides), dtype=dtype)
        size = DTYPE_SIZES[dtype]
        return cupy.lib.stride_tricks.as_strided(base, shape, tuple(s * size for s in strides))


def data_ptr(array: Any) -> int:
    """The device address of an array new_arrays made."""
    if isinstance(array, DeviceArray):
        return array.ptr
    if hasattr(array, "data_ptr"):
        return array.data_ptr()
    return array.data.ptr


def scratch(kind: str, device: int, stream: int, nbytes: int,
            lib: _lib.Library) -> tuple[int, Any]:
    """(pointer, owner) of nbytes of device scratch memory for `stream`."""
    if nbytes == 0:
        return 0, None
    if kind in ("torch", "cupy"):
        arr = _framework_array(kind, device, stream, (nbytes,), (1,), "uint8")
        return data_ptr(arr), arr
    block = Block(lib.pool, nbytes, device, stream)
    return block.ptr, block
