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
from __future__ import annotations

import atexit
import contextlib
import ctypes
import threading
import weakref
from typing import Any, Iterator, Optional

from cudnn_bind import _lib
from cudnn_bind._args import C_INT_MAX, UINT64_MAX, integer
from cudnn_bind._typing import Int
from cudnn_bind.errors import CudaError, CudnnError
from cudnn_bind.memory import scratch

__all__ = ["Handle", "handle_for", "cached_handle", "release_all", "device_guard", "MAX_STREAMS"]

MAX_STREAMS = 8

_local = threading.local()
_all: weakref.WeakSet[Handle] = weakref.WeakSet()
_all_lock = threading.Lock()


@contextlib.contextmanager
def device_guard(lib: _lib.Library, device: int) -> Iterator[None]:
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
    """A cudnnHandle_t for one device, with its per-stream workspaces.

    The handle is created (cudnnCreate) with `device` current, the
    caller's device restored afterwards; it runs on the legacy default
    stream until `set_stream`.  It is destroyed by `destroy` or by garbage
    collection; the handles `handle_for` made are also destroyed when their
    library is unloaded (`cudnn_bind.load`, `cudnn_bind.reset`) and at
    exit.  The batch-norm calls use `handle_for`'s per-thread handles
    unless given one (``handle=``).

    Parameters
    ----------
    lib : cudnn_bind._lib.Library
        The loaded library (`cudnn_bind.load`, or ``cudnn_bind._lib.get()``).
    device : int
        The CUDA device, 0 to 2**31 - 1.

    Attributes
    ----------
    lib : cudnn_bind._lib.Library
        The library the handle belongs to.
    device : int
        Its device.
    ptr : ctypes.c_void_p or None
        The cudnnHandle_t; None once destroyed.

    Raises
    ------
    TypeError
        If lib is not a Library or device is not an int.
    ValueError
        If device is out of range.
    CudnnError
        If cudnnCreate fails (CUDNN_STATUS_NOT_INITIALIZED without a driver
        or a GPU, with cuDNN's detail: raised rather than the CUDA error that
        making the device current gave).
    CudaError
        If the device cannot be made current and cudnnCreate succeeds anyway.
    """

    lib: _lib.Library
    device: int
    ptr: Optional[ctypes.c_void_p]

    def __init__(self, lib: _lib.Library, device: Int) -> None:
        if not isinstance(lib, _lib.Library):
            raise TypeError(f"lib must be a cudnn_bind Library (cudnn_bind.load()), "
                            f"got {type(lib).__name__}")
        self.lib = lib
        self.device = integer(device, "device", 0, C_INT_MAX)
        self.ptr = ctypes.c_void_p()
        # stream -> (pointer, bytes, owner, allocator)
        self._workspaces: dict[int, tuple[int, int, Any, str]] = {}
        self._event: Optional[ctypes.c_void_p] = None
        self._stream = 0  # a new handle runs on the legacy default stream
        # with no driver or GPU, cudnnCreate's own error (NOT_INITIALIZED and
        # its detail) says more than cudaSetDevice's: it is the one raised
        try:
            guard = device_guard(lib, self.device)
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
    def alive(self) -> bool:
        """Whether the handle exists (not destroyed, and created)."""
        return self.ptr is not None and bool(self.ptr.value)

    def set_stream(self, stream: Optional[Int]) -> None:
        """Run this handle's calls on `stream` (cudnnSetStream).

        Parameters
        ----------
        stream : int or None
            A ``cudaStream_t`` as an int, 0 to 2**64 - 1; None is 0, the
            legacy default stream.

        Raises
        ------
        TypeError
            If stream is not an int or None.
        ValueError
            If stream is out of range, or the handle has been destroyed.
        CudnnError
            If cudnnSetStream fails.
        """
        stream = integer(0 if stream is None else stream, "stream (a cudaStream_t)", 0, UINT64_MAX)
        if not self.alive:    # the real library would dereference the NULL handle
            raise ValueError("this Handle has been destroyed: use cudnn_bind.handle_for(device)")
        self.use_stream(stream)

    def use_stream(self, stream: int) -> None:
        """`set_stream` for a checked int, skipping cudnnSetStream when it is set already.

        Parameters
        ----------
        stream : int
            A ``cudaStream_t`` as an int (0: the legacy default stream),
            not checked.
        """
        if stream != self._stream:
            self.lib.call("cudnnSetStream", self.ptr, ctypes.c_void_p(stream or None))
            self._stream = stream

    def wait_for(self, producer: int, stream: int) -> None:
        """Make `stream` wait for the work queued so far on `producer`.

        An event (the handle's own, created on first use) is recorded on
        `producer` and waited for on `stream` on the device: the host does
        not block.

        Parameters
        ----------
        producer : int
            The ``cudaStream_t`` whose queued work to wait for (0: the
            legacy default stream).
        stream : int
            The ``cudaStream_t`` that waits.

        Raises
        ------
        CudaError
            If creating, recording or waiting for the event fails.
        """
        if self._event is None:
            event = ctypes.c_void_p()
            self.lib.cuda("cudaEventCreateWithFlags", ctypes.byref(event),
                          _lib.CUDA_EVENT_DISABLE_TIMING)
            self._event = event
        self.lib.cuda("cudaEventRecord", self._event, ctypes.c_void_p(producer or None))
        self.lib.cuda("cudaStreamWaitEvent", ctypes.c_void_p(stream or None), self._event, 0)

    def workspace(self, nbytes: int, kind: str, stream: int = 0) -> int:
        """A pointer to at least `nbytes` of workspace for `stream`.

        The workspace of a stream is grown, never shrunk (it is replaced
        when another allocator is asked for); the handle keeps those of
        its `MAX_STREAMS` most recently used streams, an older one going
        back to its allocator for its own stream.

        Parameters
        ----------
        nbytes : int
            The bytes needed.
        kind : str
            The kind of the call's arrays, which picks the allocator:
            "torch" (PyTorch's caching allocator), "cupy" (CuPy's pool),
            anything else the binding's pool.
        stream : int, optional
            The ``cudaStream_t`` the workspace is for (default 0, the legacy
            default stream).

        Returns
        -------
        int
            The device address (0 for an empty workspace).
        """
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
    def workspace_size(self) -> int:
        """The largest workspace this handle holds, in bytes (for tests and diagnostics)."""
        return max((entry[1] for entry in self._workspaces.values()), default=0)

    def destroy(self) -> None:
        """Destroy the cuDNN handle (cudnnDestroy), its workspaces and its event.

        Calling it again does nothing.  A destroyed handle is refused by
        the calls and by `set_stream`; `handle_for` makes a new one.

        Raises
        ------
        CudnnError
            If cudnnDestroy fails.
        """
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

    def __del__(self) -> None:
        try:
            self.destroy()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


def handle_for(device: Int, lib: Optional[_lib.Library] = None) -> Handle:
    """This thread's handle for `device` (created on first use).

    Handles are cached per thread and device, for the library given (a
    thread's cache is emptied when it asks for another library); a
    destroyed one is replaced by a new one.  This is the handle the batch-norm calls use
    without ``handle=``.

    Parameters
    ----------
    device : int
        The CUDA device, 0 to 2**31 - 1.
    lib : cudnn_bind._lib.Library, optional
        The loaded library (default: the one `cudnn_bind.load` loaded, or
        the default search finds).

    Returns
    -------
    Handle
        The calling thread's live handle for `device`.

    Raises
    ------
    TypeError
        If device is not an int.
    ValueError
        If device is out of range.
    CudnnUnavailableError
        If no cuDNN library loads.
    CudnnError
        If the handle has to be created and cudnnCreate fails.
    """
    lib = lib or _lib.get()
    device = integer(device, "device", 0, C_INT_MAX)
    return cached_handle(device, lib)


def cached_handle(device: int, lib: _lib.Library) -> Handle:
    """handle_for with checked arguments."""
    # (library, {device: handle}) of this thread: one thread-local lookup per call
    mine: Optional[tuple[_lib.Library, dict[int, Handle]]] = getattr(_local, "handles", None)
    if mine is None or mine[0] is not lib:
        mine = _local.handles = (lib, {})
    cache = mine[1]
    h = cache.get(device)
    if h is None or not h.alive:
        h = cache[device] = Handle(lib, device)
        with _all_lock:
            _all.add(h)
    return h


@_lib.before_unload     # handles belong to the library they came from
def release_all() -> None:
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
