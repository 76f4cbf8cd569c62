"""Finding and loading libcudnn and the CUDA runtime, and their prototypes.

Libraries are opened by absolute path where one is known, in this order:

1. ``cudnn_bind.load(path)`` or ``$CUDNN_BIND_LIBRARY`` (and, for the runtime,
   ``load(cudart=...)`` or ``$CUDNN_BIND_CUDART``);
2. the NVIDIA wheels in site-packages (``nvidia/cudnn/lib`` from
   nvidia-cudnn-cu12/-cu13, ``nvidia/cuda_runtime/lib`` from
   nvidia-cuda-runtime-cu12, ``nvidia/cu13/lib`` from the CUDA 13 wheels);
3. the system loader by soname: libcudnn.so.9, then libcudnn.so.8.

The runtime is looked up *after* cuDNN, by the major version cuDNN reports
from cudnnGetCudartVersion: ``ctypes.util.find_library('cudart')`` may hand
back a runtime of another major version than cuDNN was built against.

Every function used is declared with argtypes/restype copied from the real
prototypes (cudnn_graph.h / cudnn_ops.h in cuDNN 9, cudnn_ops_infer.h /
cudnn_ops_train.h in 8; cuda_runtime_api.h).  The tests compile a stand-in
against the real headers and drive this table through it.
"""
from __future__ import annotations

import ctypes
import glob
import os
import site
import sys
import threading
from typing import Any, Callable, Iterator, Optional, TypedDict, TypeVar

from cudnn_bind._typing import LibraryPath
from cudnn_bind.errors import (
    CudaError, CudnnBindError, CudnnError, CudnnUnavailableError, status_name)
from cudnn_bind.graph import GRAPH_FUNCTIONS
from cudnn_bind.pool import Pool

__all__ = ["Library", "get", "load", "reset", "CUDNN_FUNCTIONS", "CUDART_FUNCTIONS"]

c_int, c_size_t, c_double, c_void_p, c_char_p = (
    ctypes.c_int, ctypes.c_size_t, ctypes.c_double, ctypes.c_void_p, ctypes.c_char_p)
P = ctypes.POINTER
# opaque handles and descriptors are pointers; enums are int
HANDLE = DESC = STREAM = EVENT = c_void_p

# name: (restype, argtypes).  cudnnStatus_t and cudaError_t are int.
FunctionTable = dict[str, tuple[Any, list[Any]]]
CUDNN_FUNCTIONS: FunctionTable = {
    "cudnnGetVersion": (c_size_t, []),
    "cudnnGetCudartVersion": (c_size_t, []),
    "cudnnGetErrorString": (c_char_p, [c_int]),
    "cudnnCreate": (c_int, [P(HANDLE)]),
    "cudnnDestroy": (c_int, [HANDLE]),
    "cudnnSetStream": (c_int, [HANDLE, STREAM]),
    "cudnnGetStream": (c_int, [HANDLE, P(STREAM)]),
    "cudnnCreateTensorDescriptor": (c_int, [P(DESC)]),
    "cudnnSetTensorNdDescriptor": (c_int, [DESC, c_int, c_int, P(c_int), P(c_int)]),
    "cudnnGetTensorNdDescriptor": (c_int, [DESC, c_int, P(c_int), P(c_int), P(c_int), P(c_int)]),
    "cudnnDestroyTensorDescriptor": (c_int, [DESC]),
    "cudnnDeriveBNTensorDescriptor": (c_int, [DESC, DESC, c_int]),
    "cudnnCreateActivationDescriptor": (c_int, [P(DESC)]),
    "cudnnSetActivationDescriptor": (c_int, [DESC, c_int, c_int, c_double]),
    "cudnnDestroyActivationDescriptor": (c_int, [DESC]),
    "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize": (
        c_int, [HANDLE, c_int, c_int, DESC, DESC, DESC, DESC, DESC, P(c_size_t)]),
    "cudnnGetBatchNormalizationBackwardExWorkspaceSize": (
        c_int, [HANDLE, c_int, c_int, DESC, DESC, DESC, DESC, DESC, DESC, DESC, P(c_size_t)]),
    "cudnnGetBatchNormalizationTrainingExReserveSpaceSize": (
        c_int, [HANDLE, c_int, c_int, DESC, DESC, P(c_size_t)]),
    "cudnnBatchNormalizationForwardTrainingEx": (
        c_int, [HANDLE, c_int, c_int, c_void_p, c_void_p,       # handle, mode, ops, alpha, beta
                DESC, c_void_p, DESC, c_void_p, DESC, c_void_p,  # x, z, y
                DESC, c_void_p, c_void_p,                        # scale/bias desc, scale, bias
                c_double, c_void_p, c_void_p,                    # factor, running mean, var
                c_double, c_void_p, c_void_p,                    # eps, save mean, save invvar
                DESC, c_void_p, c_size_t, c_void_p, c_size_t]),  # act, workspace, reserve
    "cudnnBatchNormalizationForwardInference": (
        c_int, [HANDLE, c_int, c_void_p, c_void_p, DESC, c_void_p, DESC, c_void_p,
                DESC, c_void_p, c_void_p, c_void_p, c_void_p, c_double]),
    "cudnnBatchNormalizationBackwardEx": (
        c_int, [HANDLE, c_int, c_int, c_void_p, c_void_p, c_void_p, c_void_p,
                DESC, c_void_p, DESC, c_void_p, DESC, c_void_p,  # x, y, dy
                DESC, c_void_p, DESC, c_void_p,                  # dz, dx
                DESC, c_void_p, c_void_p, c_void_p, c_void_p,    # dparam desc, scale, bias, dscale, dbias
                c_double, c_void_p, c_void_p,                    # eps, saved mean, saved invvar
                DESC, c_void_p, c_size_t, c_void_p, c_size_t]),  # act, workspace, reserve
}
# cuDNN 9 only
CUDNN9_FUNCTIONS: FunctionTable = {
    "cudnnGetLastErrorString": (None, [c_char_p, c_size_t]),
}


class PointerAttributes(ctypes.Structure):
    """struct cudaPointerAttributes of CUDA 11 and 12 (24 bytes)."""
    _fields_ = [("type", c_int), ("device", c_int), ("devicePointer", c_void_p),
                ("hostPointer", c_void_p)]


class PointerAttributes13(ctypes.Structure):
    """struct cudaPointerAttributes of CUDA 13: the same fields, then
    reserved words the runtime writes too (88 bytes)."""
    _fields_ = PointerAttributes._fields_ + [("reserved", ctypes.c_long * 8)]


def pointer_attributes_type(runtime_version: int) -> type[ctypes.Structure]:
    """The ctypes struct matching cudaPointerAttributes of a runtime version
    (cudaRuntimeGetVersion: 12090 for 12.9)."""
    return PointerAttributes13 if runtime_version >= 13000 else PointerAttributes


CUDART_FUNCTIONS: FunctionTable = {
    "cudaRuntimeGetVersion": (c_int, [P(c_int)]),
    "cudaDriverGetVersion": (c_int, [P(c_int)]),
    "cudaGetDeviceCount": (c_int, [P(c_int)]),
    "cudaGetDevice": (c_int, [P(c_int)]),
    "cudaSetDevice": (c_int, [c_int]),
    "cudaMalloc": (c_int, [P(c_void_p), c_size_t]),
    "cudaFree": (c_int, [c_void_p]),
    "cudaMemcpy": (c_int, [c_void_p, c_void_p, c_size_t, c_int]),
    "cudaMemcpyAsync": (c_int, [c_void_p, c_void_p, c_size_t, c_int, STREAM]),
    "cudaEventCreateWithFlags": (c_int, [P(EVENT), ctypes.c_uint]),
    "cudaEventRecord": (c_int, [EVENT, STREAM]),
    "cudaEventDestroy": (c_int, [EVENT]),
    "cudaStreamWaitEvent": (c_int, [STREAM, EVENT, ctypes.c_uint]),
    "cudaMemset": (c_int, [c_void_p, c_int, c_size_t]),
    "cudaDeviceSynchronize": (c_int, []),
    "cudaStreamSynchronize": (c_int, [STREAM]),
    # the struct's size depends on the runtime's version: declared per Library
    "cudaPointerGetAttributes": (c_int, [c_void_p, c_void_p]),
    "cudaGetErrorString": (c_char_p, [c_int]),
    "cudaGetErrorName": (c_char_p, [c_int]),
    "cudaGetLastError": (c_int, []),
}

# CUDNN_BN_MIN_EPSILON, the smallest eps batch norm takes, by cuDNN major version
BN_MIN_EPSILON = {
    8: 0.0,  # cudnn_ops_infer.h of cuDNN 8 (1e-5 was cuDNN 5's and 6's cudnn.h)
    9: 0.0,  # cudnn_ops.h of cuDNN 9 (tests/test_cudnn_structs.py reads the installed header)
}

CUDA_MEMCPY_HOST_TO_DEVICE = 1
CUDA_MEMCPY_DEVICE_TO_HOST = 2
CUDA_MEMCPY_DEVICE_TO_DEVICE = 3
CUDA_MEMORY_TYPE_DEVICE = 2
CUDA_MEMORY_TYPE_MANAGED = 3
CUDA_EVENT_DISABLE_TIMING = 2


def _site_dirs() -> list[str]:
    dirs = list(sys.path)
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # virtualenv's old site module
        pass
    seen: list[str] = []
    for d in dirs:
        if d and os.path.isdir(d) and d not in seen:
            seen.append(d)
    return seen


def _wheel_files(patterns: list[str]) -> Iterator[str]:
    for base in _site_dirs():
        for pattern in patterns:
            yield from sorted(glob.glob(os.path.join(base, "nvidia", pattern)), reverse=True)


def _named(path: Optional[str], variable: str) -> Optional[str]:
    """The library the caller named: `path`, else $variable (None or empty: none)."""
    return path or os.environ.get(variable)


def cudnn_candidates(path: Optional[str] = None) -> list[str]:
    """Where libcudnn is looked for, in order (absolute paths first).  A
    library named by `path` or $CUDNN_BIND_LIBRARY is the only candidate: a
    user who names one must get that one or an error, not another."""
    explicit = _named(path, "CUDNN_BIND_LIBRARY")
    if explicit:
        return [explicit]
    wheel = list(_wheel_files(["cudnn/lib/libcudnn.so.9", "cu13/lib/libcudnn.so.9",
                               "cudnn/lib/libcudnn.so.8"]))
    return wheel + ["libcudnn.so.9", "libcudnn.so.8"]


def cudart_candidates(major: int, path: Optional[str] = None) -> list[str]:
    """Where the CUDA runtime of major version `major` is looked for, in order
    (`path` or $CUDNN_BIND_CUDART alone when given)."""
    explicit = _named(path, "CUDNN_BIND_CUDART")
    if explicit:
        return [explicit]
    wheel = list(_wheel_files([f"cuda_runtime/lib/libcudart.so.{major}",
                               f"cu{major}/lib/libcudart.so.{major}"]))
    system = [f"libcudart.so.{major}"] + (["libcudart.so.11.0"] if major == 11 else [])
    return wheel + system


# what to do about a library that is not there, by the variable that names one
INSTALL_HINT = {
    "CUDNN_BIND_LIBRARY": "install cuDNN 9 and the CUDA 12 runtime from PyPI with `pip install "
                          "--no-deps nvidia-cudnn-cu12 nvidia-cuda-runtime-cu12`, or name a "
                          "libcudnn.so in $CUDNN_BIND_LIBRARY (or cudnn_bind.load(path))",
    "CUDNN_BIND_CUDART": "install the CUDA runtime cuDNN was built for from PyPI (`pip install "
                         "--no-deps nvidia-cuda-runtime-cu12` for CUDA 12), or name a "
                         "libcudart.so in $CUDNN_BIND_CUDART (or cudnn_bind.load(path, cudart))",
}


def _open(candidates: list[str], what: str, variable: str,
          explicit: bool) -> tuple[ctypes.CDLL, str]:
    """The first candidate that loads; CudnnUnavailableError naming every
    failure and, when the library was searched for, how to get one."""
    errors = []
    for name in candidates:
        try:
            return ctypes.CDLL(name), name
        except OSError as exc:
            errors.append(str(exc) if name in str(exc) else f"{name}: {exc}")
    more = f"; and {len(errors) - 4} more" if len(errors) > 4 else ""
    hint = "check the path given" if explicit else INSTALL_HINT[variable]
    raise CudnnUnavailableError(f"no {what} could be loaded ({'; '.join(errors[:4])}{more}): {hint}")


def _declare(lib: ctypes.CDLL, table: FunctionTable, path: str, what: str) -> None:
    for name, (restype, argtypes) in table.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise CudnnUnavailableError(f"{path} has no symbol {name}: it is not a {what} "
                                        "cudnn_bind can use") from None
        fn.restype = restype
        fn.argtypes = argtypes


class Library:
    """libcudnn and the matching CUDA runtime, loaded and declared.

    Attributes: cudnn, cudart (ctypes.CDLL), cudnn_path, cudart_path,
    version (e.g. 92800), major (8 or 9), cudart_version (as cuDNN reports it).
    """

    def __init__(self, path: Optional[str] = None, cudart: Optional[str] = None) -> None:
        self.cudnn, self.cudnn_path = _open(
            cudnn_candidates(path), "cuDNN library (libcudnn)", "CUDNN_BIND_LIBRARY",
            bool(_named(path, "CUDNN_BIND_LIBRARY")))
        _declare(self.cudnn, {name: CUDNN_FUNCTIONS[name] for name in
                              ("cudnnGetVersion", "cudnnGetCudartVersion")},
                 self.cudnn_path, "cuDNN library")
        self.version = int(self.cudnn.cudnnGetVersion())
        self.major = self.version // 10000 if self.version >= 10000 else self.version // 1000
        if self.major not in (8, 9):
            raise CudnnUnavailableError(f"{self.cudnn_path} is cuDNN {self.version}; "
                                        "cudnn_bind supports cuDNN 8 and 9")
        _declare(self.cudnn, CUDNN_FUNCTIONS, self.cudnn_path, "cuDNN library")
        if self.major >= 9:
            _declare(self.cudnn, CUDNN9_FUNCTIONS, self.cudnn_path, "cuDNN library")
        # the graph API (cudnn_bind.graph): used where declared, else the legacy calls
        try:
            _declare(self.cudnn, GRAPH_FUNCTIONS, self.cudnn_path, "cuDNN library")
            self.has_graph = True
        except CudnnUnavailableError:
            self.has_graph = False
        self.cudart_version = int(self.cudnn.cudnnGetCudartVersion())
        cuda_major = self.cudart_version // 1000
        self.cudart, self.cudart_path = _open(
            cudart_candidates(cuda_major, cudart), f"CUDA {cuda_major} runtime (libcudart)",
            "CUDNN_BIND_CUDART", bool(_named(cudart, "CUDNN_BIND_CUDART")))
        _declare(self.cudart, CUDART_FUNCTIONS, self.cudart_path, "CUDA runtime library")
        runtime = c_int()
        self.cuda("cudaRuntimeGetVersion", ctypes.byref(runtime))
        self.runtime_version = runtime.value
        self.PointerAttributes = pointer_attributes_type(self.runtime_version)
        self.cudart.cudaPointerGetAttributes.argtypes = [P(self.PointerAttributes), c_void_p]
        self.pool = Pool(self)
        # descriptors and sizes per call signature (batch_norm.py's plans)
        self.plans: dict[tuple[Any, ...], Any] = {}
        # graph-API execution plans per call signature and device (None: no engine)
        self.graphs: dict[tuple[Any, ...], Any] = {}
        # the device of each live __cuda_array_interface__ exporter's pointer (memory._cai_device)
        self.cai_devices: dict[tuple[int, int], Any] = {}
        self.min_epsilon = BN_MIN_EPSILON[self.major]

    # -- errors -----------------------------------------------------------
    def last_error_detail(self) -> str:
        """cudnnGetLastErrorString's message (cuDNN 9; '' for 8)."""
        if self.major < 9:
            return ""
        buf = ctypes.create_string_buffer(1024)
        self.cudnn.cudnnGetLastErrorString(buf, len(buf))
        return buf.value.decode(errors="replace")

    def check(self, status: int, function: str) -> None:
        """Raise CudnnError unless `status` is CUDNN_STATUS_SUCCESS."""
        if status != 0:
            message = self.cudnn.cudnnGetErrorString(status)
            raise CudnnError(function, status, status_name(status, self.major),
                             message.decode(errors="replace") if message else "",
                             self.last_error_detail())

    def call(self, function: str, *args: Any) -> None:
        """Call a cuDNN function by name and check its status."""
        self.check(getattr(self.cudnn, function)(*args), function)

    def cuda(self, function: str, *args: Any) -> None:
        """Call a CUDA runtime function by name; raise CudaError on failure."""
        code = getattr(self.cudart, function)(*args)
        if code != 0:
            self.cudart.cudaGetLastError()  # clear the sticky-free error state
            name = self.cudart.cudaGetErrorName(code)
            text = self.cudart.cudaGetErrorString(code)
            raise CudaError(function, code, name.decode() if name else f"cudaError {code}",
                            text.decode() if text else "")


_LOCK = threading.RLock()


class _State(TypedDict):
    lib: Optional[Library]
    error: Optional[CudnnUnavailableError]
    path: Optional[str]
    cudart: Optional[str]


_STATE: _State = {"lib": None, "error": None, "path": None, "cudart": None}
# called before the library is replaced or forgotten: whatever belongs to it
# (handles.py registers the release of every handle) goes first
_BEFORE_UNLOAD: list[Callable[[], object]] = []
_Hook = TypeVar("_Hook", bound=Callable[[], object])


def before_unload(fn: _Hook) -> _Hook:
    """Register fn() to run before load() or reset() drops the library."""
    _BEFORE_UNLOAD.append(fn)
    return fn


def _unload_hooks() -> None:
    for fn in _BEFORE_UNLOAD:
        fn()
    lib = _STATE["lib"]
    if lib is not None:
        lib.plans.clear()  # their descriptors are destroyed with them
        lib.graphs.clear()
        try:  # last: the hooks above hand their blocks back first
            lib.pool.close()
        except CudnnBindError:
            pass  # a failing device must not keep the old library installed


def _path_arg(value: object, name: str) -> Optional[str]:
    """None, or a library path or name (str, bytes or os.PathLike) as a str."""
    if value is None:
        return None
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError(f"{name} must be a library path (str, bytes or os.PathLike) or None, "
                        f"got {type(value).__name__}")
    value = os.fsdecode(value)
    if not value or "\0" in value:
        raise ValueError(f"{name} must be a non-empty library path without NUL characters, "
                         f"got {value!r}")
    return value


def load(path: Optional[LibraryPath] = None, cudart: Optional[LibraryPath] = None) -> Library:
    """Load (or reload) cuDNN from `path` (and the runtime from `cudart`).

    Without arguments the search order of the module docstring applies.
    Returns the Library; raises CudnnUnavailableError if nothing loads, and
    then nothing is loaded and the paths are forgotten: the next use searches
    as if load had not been called.  Every handle of the previous library is
    destroyed: do not call this while other threads are running batch norm."""
    path, cudart = _path_arg(path, "path"), _path_arg(cudart, "cudart")
    with _LOCK:
        _unload_hooks()
        _STATE.update({"lib": None, "error": None, "path": None, "cudart": None})
        lib = Library(path, cudart)
        _STATE.update({"lib": lib, "path": path, "cudart": cudart})
        return lib


def get() -> Library:
    """The loaded Library (loading it on first use); CudnnUnavailableError if none."""
    lib = _STATE["lib"]
    if lib is not None:
        return lib
    with _LOCK:  # one thread loads; the others wait and reuse it
        if _STATE["lib"] is not None:
            return _STATE["lib"]
        if _STATE["error"] is not None:
            raise _STATE["error"]
        try:
            lib = _STATE["lib"] = Library(_STATE["path"], _STATE["cudart"])
        except CudnnUnavailableError as exc:
            _STATE["error"] = exc
            raise
        return lib


def reset() -> None:
    """Forget the loaded library (the next use searches again)."""
    with _LOCK:
        _unload_hooks()
        _STATE.update({"lib": None, "error": None, "path": None, "cudart": None})
