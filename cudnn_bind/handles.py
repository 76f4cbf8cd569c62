"""cuDNN handles, one per (device, thread), their workspaces, and the device guard.

A handle is created on first use by a thread for a device and cached in
that thread's storage: it is destroyed when the thread ends (the storage
goes, and the handle with it), at exit, or by `release_all`, which
`cudnn_bind.load` calls before switching libraries.

Workspace: one device buffer per (handle, stream), allocated for that
stream (see `cudnn_bind.memory.scratch`), grown only when a call needs more
than it holds.  Calls on one stream run in order, so they can share it;
calls on two streams could overlap, so they never do.  A handle keeps the
workspaces of its MAX_STREAMS most recently used streams: an older one goes
back to its allocator, for its own stream, which keeps that safe.
"""
import atexit
import contextlib
import ctypes
import threading
import weakref

from cudnn_bind import _lib
from cudnn_bind._args import C_INT_MAX, UINT64_MAX, integer
from cudnn_bind.errors import CudaError, CudnnError
from cudnn_bind.memory import scratch

__all__ = ["Handle", "handle_for", "cached_handle", "release_all", "device_guard", "MAX_STREAMS"]

MAX_STREAMS = 8

_local = threading.local()
_all = weakref.WeakSet()
_all_lock = threading.Lock()


@contextlib.contextmanager
def device_guard(lib, device):
    """Make `device` current for the block, then restore the caller's device
    (PyTorch and CuPy notice a changed current device)."""
    current = ctypes.c_int()
    lib.cuda("cudaGetDevice", ctypes.byref(current))
    if current.value == device:
        yield
        return
    lib.cuda("cudaSetDevice", device)
    try:
        yield
    finally:
        lib.cuda("cudaSetDevice", current.value)


class Handle:
    """A cudnnHandle_t for one device, with its per-stream workspaces."""

    def __init__(self, lib, device):
        if not isinstance(lib, _lib.Library):
            raise TypeError(f"lib must be a cudnn_bind Library (cudnn_bind.load()), "
                            f"got {type(lib).__name__}")
        self.lib = lib
        self.device = integer(device, "device", 0, C_INT_MAX)
        self.ptr = ctypes.c_void_p()
        self._workspaces = {}  # stream -> (pointer, bytes, owner, allocator)
        self._event = None
        self._stream = 0  # a new handle runs on the legacy default stream
        # with no driver or GPU, cudnnCreate's own error (NOT_INITIALIZED and
        # its detail) says more than cudaSetDevice's: it is the one raised
        try:
            guard = device_guard(lib, device)
            guard.__enter__()
        except CudaError as exc:
            status = lib.cudnn.cudnnCreate(ctypes.byref(self.ptr))
            if status != 0:
                try:
                    lib.check(status, "cudnnCreate")
                except CudnnError as err:
                    raise err from exc
            self.destroy()
            raise
        try:
            lib.call("cudnnCreate", ctypes.byref(self.ptr))
        finally:
            guard.__exit__(None, None, None)

    @property
    def alive(self):
        return self.ptr is not None and bool(self.ptr.value)

    def set_stream(self, stream):
        """Run this handle's calls on `stream` (a cudaStream_t as an int; None: 0)."""
        stream = integer(0 if stream is None else stream, "stream (a cudaStream_t)", 0, UINT64_MAX)
        if not self.alive:    # the real library would dereference the NULL handle
            raise ValueError("this Handle has been destroyed: use cudnn_bind.handle_for(device)")
        self.use_stream(stream)

    def use_stream(self, stream):
        """set_stream for a checked int, skipping cudnnSetStream when it is set already."""
        if stream != self._stream:
            self.lib.call("cudnnSetStream", self.ptr, ctypes.c_void_p(stream or None))
            self._stream = stream

    def wait_for(self, producer, stream):
        """Make `stream` wait for the work queued so far on `producer` (an
        event recorded there, waited for on the device: the host does not
        block)."""
        if self._event is None:
            event = ctypes.c_void_p()
            self.lib.cuda("cudaEventCreateWithFlags", ctypes.byref(event),
                          _lib.CUDA_EVENT_DISABLE_TIMING)
            self._event = event
        self.lib.cuda("cudaEventRecord", self._event, ctypes.c_void_p(producer or None))
        self.lib.cuda("cudaStreamWaitEvent", ctypes.c_void_p(stream or None), self._event, 0)

    def workspace(self, nbytes, kind, stream=0):
        """A pointer to at least nbytes of workspace for `stream` (grown,
        never shrunk), from the allocator of array kind `kind`."""
        spaces = self._workspaces
        allocator = kind if kind in ("torch", "cupy") else "pool"
        entry = spaces.pop(stream, None)  # re-inserted last: most recently used
        if entry is None or nbytes > entry[1] or entry[3] != allocator:
            entry = None  # the old buffer goes back (for its stream) before the new one
            ptr, owner = scratch(kind, self.device, stream, nbytes, self.lib)
            entry = (ptr, nbytes, owner, allocator)
            while len(spaces) >= MAX_STREAMS:
                spaces.pop(next(iter(spaces)))
        spaces[stream] = entry
        return entry[0]

    @property
    def workspace_size(self):
        """The largest workspace this handle holds (for tests and diagnostics)."""
        return max((entry[1] for entry in self._workspaces.values()), default=0)

    def destroy(self):
        ptr, self.ptr = self.ptr, None
        self._workspaces = {}
        event, self._event = self._event, None
        if event is not None:
            try:
                self.lib.cuda("cudaEventDestroy", event)
            except CudaError:
                pass
        if ptr is not None and ptr.value:
            self.lib.check(self.lib.cudnn.cudnnDestroy(ptr), "cudnnDestroy")

    def __del__(self):
        try:
            self.destroy()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


def handle_for(device, lib=None):
    """This thread's handle for `device` (created on first use)."""
    lib = lib or _lib.get()
    device = integer(device, "device", 0, C_INT_MAX)
    return cached_handle(device, lib)


def cached_handle(device, lib):
    """handle_for with checked arguments."""
    cache = getattr(_local, "handles", None)
    if cache is None or getattr(_local, "lib", None) is not lib:
        cache = _local.handles = {}
        _local.lib = lib
    h = cache.get(device)
    if h is None or not h.alive:
        h = cache[device] = Handle(lib, device)
        with _all_lock:
            _all.add(h)
    return h


@_lib.before_unload     # handles belong to the library they came from
def release_all():
    """Destroy every live handle (of every thread) and its workspaces."""
    with _all_lock:
        handles = list(_all)
        _all.clear()
    for h in handles:
        try:
            h.destroy()
        except Exception:
            pass


atexit.register(release_all)
