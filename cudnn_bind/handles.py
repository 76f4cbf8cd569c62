"""cuDNN handles, one per (device, thread), and each handle's workspace.

A handle is created on first use by a thread for a device, cached, and
destroyed at exit (or by `release_all`, which `cudnn_bind.load` calls before
switching libraries).  Its workspace is one device buffer grown only when a
call needs more than it holds, and freed with the handle: cuDNN calls on one
handle are serialized on its stream, so one buffer per handle is enough.
"""
import atexit
import ctypes
import threading

from cudnn_bind import _lib
from cudnn_bind.errors import CudaError, CudnnError
from cudnn_bind.memory import scratch

__all__ = ["Handle", "handle_for", "release_all"]

_local = threading.local()
_all = []
_all_lock = threading.Lock()


class Handle:
    def __init__(self, lib, device):
        self.lib = lib
        self.device = device
        self.ptr = ctypes.c_void_p()
        # with no driver or GPU, cudnnCreate's own error (NOT_INITIALIZED and
        # its detail) says more than cudaSetDevice's: it is the one raised
        try:
            lib.cuda("cudaSetDevice", device)
        except CudaError as exc:
            status = lib.cudnn.cudnnCreate(ctypes.byref(self.ptr))
            if status != 0:
                try:
                    lib.check(status, "cudnnCreate")
                except CudnnError as err:
                    raise err from exc
            self.destroy()
            raise
        lib.call("cudnnCreate", ctypes.byref(self.ptr))
        self.workspace_ptr = 0
        self.workspace_size = 0
        self._workspace_owner = None

    def set_stream(self, stream):
        self.lib.call("cudnnSetStream", self.ptr, ctypes.c_void_p(stream or None))

    def workspace(self, nbytes, ref):
        """A pointer to at least nbytes of workspace (grown, never shrunk)."""
        if nbytes > self.workspace_size:
            self._workspace_owner = None  # free the old buffer first
            self.workspace_ptr, self._workspace_owner = scratch(ref, nbytes)
            self.workspace_size = nbytes
        return self.workspace_ptr

    def destroy(self):
        ptr, self.ptr = self.ptr, None
        self._workspace_owner = None
        self.workspace_ptr = self.workspace_size = 0
        if ptr is not None and ptr.value:
            self.lib.check(self.lib.cudnn.cudnnDestroy(ptr), "cudnnDestroy")


def handle_for(device, lib=None):
    """This thread's handle for `device` (created on first use)."""
    lib = lib or _lib.get()
    cache = getattr(_local, "handles", None)
    if cache is None or getattr(_local, "lib", None) is not lib:
        cache = _local.handles = {}
        _local.lib = lib
    h = cache.get(device)
    if h is None or h.ptr is None:
        h = cache[device] = Handle(lib, device)
        with _all_lock:
            _all.append(h)
    return h


def release_all():
    """Destroy every handle (of every thread) and its workspace."""
    with _all_lock:
        handles, _all[:] = list(_all), []
    for h in handles:
        try:
            h.destroy()
        except Exception:
            pass


atexit.register(release_all)
