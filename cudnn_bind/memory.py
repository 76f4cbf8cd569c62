"""Device buffers: what the binding accepts, and where its outputs come from.

Accepted as arrays (all end up as a `View`: pointer, shape, element strides,
dtype name, device, and the library that owns the memory):

* `DeviceArray` (this module): cudaMalloc-backed, for users with no array
  library, or a non-owning view of a raw pointer (`DeviceArray.from_pointer`);
* PyTorch CUDA tensors (read directly: their `__cuda_array_interface__`
  refuses bfloat16);
* anything with `__cuda_array_interface__` (CuPy, Numba, ...);
* DLPack: objects with `__dlpack__` or a "dltensor" capsule.

Outputs, workspace and reserve space come from the inputs' own library when
there is one (CuPy's memory pool, PyTorch's caching allocator), else cudaMalloc.
"""
import ctypes
import math

import numpy as np

from cudnn_bind import _lib
from cudnn_bind._args import UINT64_MAX, integer, integers, show

__all__ = ["DeviceArray", "DeviceBuffer", "View", "as_view", "DTYPE_SIZES"]

DTYPE_SIZES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "uint8": 1}
_TYPESTR = {"f4": "float32", "f8": "float64", "f2": "float16", "u1": "uint8"}


def _numpy_dtype(name):
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - ml_dtypes is a dependency of cynorm
            raise TypeError("bfloat16 host arrays need ml_dtypes") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def dtype_name(dtype):
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


def c_strides(shape):
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(st))


class DeviceBuffer:
    """Untyped device memory from cudaMalloc, freed by free()/with/GC."""

    def __init__(self, nbytes, lib=None):
        self._lib = lib or _lib.get()
        self.nbytes = integer(nbytes, "nbytes", 0, UINT64_MAX)
        self._ptr = ctypes.c_void_p()
        if self.nbytes:
            self._lib.cuda("cudaMalloc", ctypes.byref(self._ptr), self.nbytes)
        self.ptr = self._ptr.value or 0
        self._owner = True

    def free(self):
        if self._owner and self.ptr:
            ptr, self.ptr = self.ptr, 0
            self._lib.cuda("cudaFree", ctypes.c_void_p(ptr))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass


class DeviceArray:
    """A typed N-d array in device memory, for use without any array library.

    `DeviceArray(shape, dtype)` allocates (cudaMalloc, C order unless
    `strides` in elements are given); `from_numpy`/`to_numpy` copy with
    cudaMemcpy; `from_pointer` wraps memory someone else owns.  Freed by
    `free()`, by a `with` block, or when garbage collected.
    """

    def __init__(self, shape, dtype="float32", strides=None, *, _ptr=None, _owner=None):
        self.shape = integers(shape, "shape", 0)
        self.dtype = dtype_name(dtype)
        self.itemsize = DTYPE_SIZES[self.dtype]
        self.strides = (integers(strides, "strides", 0) if strides is not None
                        else c_strides(self.shape))
        if len(self.strides) != len(self.shape):
            raise ValueError(f"strides {show(self.strides)} do not match shape {show(self.shape)}")
        span = 1 + sum((d - 1) * s for d, s in zip(self.shape, self.strides)) if all(self.shape) else 0
        self.nbytes = span * self.itemsize
        if self.nbytes > UINT64_MAX:
            raise ValueError(f"shape {show(self.shape)} with strides {show(self.strides)} spans "
                             f"{show(self.nbytes)} bytes, more than a size_t holds")
        if _ptr is None:
            self._buffer = DeviceBuffer(self.nbytes)
            self.ptr = self._buffer.ptr
        else:
            self._buffer = _owner
            self.ptr = int(_ptr)
        lib = _lib.get()
        self.device = _pointer_device(lib, self.ptr) if self.ptr else _current_device(lib)

    @classmethod
    def from_pointer(cls, ptr, shape, dtype, strides=None, owner=None):
        """A view of device memory at integer address `ptr` (not freed by us;
        `owner` is kept alive with the view)."""
        ptr = integer(ptr, "ptr (a device address)", 0, UINT64_MAX)
        return cls(shape, dtype, strides, _ptr=ptr, _owner=owner)

    @classmethod
    def from_numpy(cls, array):
        host = np.ascontiguousarray(array)
        if not host.dtype.isnative:
            host = host.astype(host.dtype.newbyteorder("="))
        out = cls(host.shape, host.dtype if host.dtype.name != "bfloat16" else "bfloat16")
        if out.nbytes:
            _lib.get().cuda("cudaMemcpy", ctypes.c_void_p(out.ptr), host.ctypes.data_as(ctypes.c_void_p),
                            host.nbytes, _lib.CUDA_MEMCPY_HOST_TO_DEVICE)
        return out

    def to_numpy(self):
        """A host copy (strided arrays come back with the same strides)."""
        raw = np.empty(self.nbytes // self.itemsize, dtype=_numpy_dtype(self.dtype))
        if self.nbytes:
            _lib.get().cuda("cudaMemcpy", raw.ctypes.data_as(ctypes.c_void_p), ctypes.c_void_p(self.ptr),
                            self.nbytes, _lib.CUDA_MEMCPY_DEVICE_TO_HOST)
        return np.lib.stride_tricks.as_strided(
            raw, self.shape, tuple(s * self.itemsize for s in self.strides)).copy()

    def free(self):
        if isinstance(self._buffer, DeviceBuffer):
            self._buffer.free()
        self._buffer = None
        self.ptr = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    @property
    def __cuda_array_interface__(self):
        if self.dtype == "bfloat16":
            raise TypeError("__cuda_array_interface__ has no bfloat16 type")
        return {"shape": self.shape, "typestr": _numpy_dtype(self.dtype).str,
                "data": (self.ptr, False), "version": 3,
                "strides": tuple(s * self.itemsize for s in self.strides)}

    def __repr__(self):
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.device})"


class View:
    """What the binding needs of an array argument."""
    __slots__ = ("ptr", "shape", "strides", "dtype", "device", "kind", "obj", "read_only")

    def __init__(self, ptr, shape, strides, dtype, device, kind, obj, read_only=False):
        self.ptr, self.shape, self.strides = int(ptr), tuple(shape), tuple(strides)
        self.dtype, self.device, self.kind, self.obj = dtype, device, kind, obj
        self.read_only = read_only

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return math.prod(self.shape)  # exact: np.prod would wrap at 2**63


def _current_device(lib):
    dev = ctypes.c_int()
    lib.cuda("cudaGetDevice", ctypes.byref(dev))
    return dev.value


def _pointer_device(lib, ptr):
    """The device that owns `ptr`, or None for host/unregistered memory."""
    attrs = _lib.PointerAttributes()
    lib.cuda("cudaPointerGetAttributes", ctypes.byref(attrs), ctypes.c_void_p(ptr))
    if attrs.type in (_lib.CUDA_MEMORY_TYPE_DEVICE, _lib.CUDA_MEMORY_TYPE_MANAGED):
        return attrs.device
    return None


def _is_torch_tensor(obj):
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _from_cai(obj, name, lib):
    cai = obj.__cuda_array_interface__
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
    kind = "cupy" if type(obj).__module__.startswith("cupy") else "cai"
    device = _pointer_device(lib, ptr) if ptr else None
    return View(ptr, shape, strides, dtype, device, kind, obj, read_only=bool(data[1]))


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
_DL_VERSIONED_OFFSET = 8 + 8 + 8 + 8
_DL_FLAG_READ_ONLY = 1
_capsule_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def _dlpack_capsule(obj, name):
    if not hasattr(obj, "__dlpack__"):
        return obj
    try:  # ask for DLPack 1.x; older producers do not take max_version
        return obj.__dlpack__(max_version=(1, 0))
    except TypeError:
        pass
    try:
        return obj.__dlpack__()
    except (TypeError, BufferError) as exc:
        raise TypeError(f"{name}: its __dlpack__() failed: {exc}") from exc


def _from_dlpack(obj, name):
    capsule = _dlpack_capsule(obj, name)
    if _capsule_valid(capsule, b"dltensor_versioned"):
        base = _capsule_pointer(capsule, b"dltensor_versioned")
        major = ctypes.c_uint32.from_address(base).value
        if major != 1:
            raise TypeError(f"{name}: DLPack version {major}.x is not supported (1.x is)")
        flags = ctypes.c_uint64.from_address(base + 24).value
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
    view = View(ptr, shape, strides, dtype, t.device.device_id, "dlpack", (obj, capsule))
    view.read_only = read_only
    return view


def as_view(obj, name, lib=None):
    """A View of an array argument, or TypeError naming `name`."""
    lib = lib or _lib.get()
    if isinstance(obj, DeviceArray):
        if not obj.ptr and obj.nbytes:
            raise ValueError(f"{name}: the DeviceArray has been freed")
        return View(obj.ptr, obj.shape, obj.strides, obj.dtype, obj.device, "device_array", obj)
    if _is_torch_tensor(obj):
        if not obj.is_cuda:
            raise ValueError(f"{name}: expected a CUDA tensor, got one on {obj.device}")
        return View(obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()), dtype_name(obj.dtype),
                    obj.device.index, "torch", obj)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj, name, lib)
    if isinstance(obj, np.ndarray):
        raise TypeError(f"{name}: a NumPy array is host memory; copy it to the device first "
                        "(cudnn_bind.DeviceArray.from_numpy) or use cynorm.batch_norm on the CPU")
    if hasattr(obj, "__dlpack__") or type(obj).__name__ == "PyCapsule":
        return _from_dlpack(obj, name)
    if isinstance(obj, int):
        raise TypeError(f"{name}: a raw pointer needs its shape and dtype: wrap it with "
                        "cudnn_bind.DeviceArray.from_pointer(ptr, shape, dtype)")
    raise TypeError(f"{name}: expected a device array (CuPy, PyTorch CUDA tensor, "
                    f"__cuda_array_interface__, DLPack or cudnn_bind.DeviceArray), "
                    f"got {type(obj).__name__}")


def empty_like_layout(ref, shape, strides, dtype):
    """A new device array of `shape`/`strides`/`dtype` from ref's library."""
    if ref.kind == "torch":
        import torch
        tdtype = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                  "bfloat16": torch.bfloat16, "uint8": torch.uint8}[dtype]
        return torch.empty_strided(shape, strides, dtype=tdtype, device=f"cuda:{ref.device}")
    if ref.kind == "cupy" and dtype != "bfloat16":
        import cupy
        with cupy.cuda.Device(ref.device):
            size = DTYPE_SIZES[dtype]
            base = cupy.empty(max(1, sum((d - 1) * s for d, s in zip(shape, strides)) + 1)
                              if all(shape) else 0, dtype=dtype)
            return cupy.lib.stride_tricks.as_strided(base, shape, tuple(s * size for s in strides))
    return DeviceArray(shape, dtype, strides)


def scratch(ref, nbytes):
    """(pointer, owner) of nbytes of device scratch memory from ref's library."""
    if nbytes == 0:
        return 0, None
    if ref.kind in ("torch", "cupy"):
        arr = empty_like_layout(ref, (nbytes,), (1,), "uint8")
        return (arr.data_ptr() if ref.kind == "torch" else arr.data.ptr), arr
    buf = DeviceBuffer(nbytes)
    return buf.ptr, buf
