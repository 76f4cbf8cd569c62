"""Stream-ordered caching of device memory: the binding's own allocator.

Memory no array library owns comes from here: `DeviceArray` and
`DeviceBuffer`, and the outputs, workspace and reserve of calls whose x is
a `DeviceArray`, a raw `__cuda_array_interface__` or a DLPack capsule.  (For
PyTorch and CuPy inputs those come from the library's own allocator, under
the stream the kernels run on.)

A block is cudaMalloc'ed once.  When its owner is freed it goes back to a
free list of the (device, stream) it was allocated for, and only a later
allocation for that same stream takes it again.  Work on one stream runs in
order, so a kernel still using the block when its owner died finishes
before the next owner's kernels start: no synchronization and no CUDA call
on the steady path, and a block never changes streams while queued work
may still touch it (the rule PyTorch's caching allocator keeps).  Memory
that a caller uses on another stream than the one it was made for must
stay referenced until that use is done (synchronize first), as with
PyTorch tensors.

Stream 2 (cudaStreamPerThread) is a different stream in each thread: its
blocks are kept per thread.

Cached blocks are handed back to CUDA (a device synchronization, then
cudaFree) by `empty_cache()`, when cudaMalloc runs out of memory (then the
allocation is retried once), and when the library is unloaded.
"""
from __future__ import annotations

import ctypes
import itertools
import threading
from typing import Any, Hashable, Optional, Protocol

from cudnn_bind.errors import CudaError

__all__ = ["Pool", "Block", "ALIGNMENT"]

# every block is a multiple of this (cudaMalloc itself aligns to 256 bytes)
ALIGNMENT = 512


class _Runtime(Protocol):
    """What the pool needs of a cudnn_bind._lib.Library (which imports this
    module): its checked CUDA runtime calls."""

    def cuda(self, function: str, *args: Any) -> None: ...


def rounded(nbytes: int) -> int:
    """The size of the block an allocation of nbytes takes."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


PER_THREAD_STREAM = 2  # cudaStreamPerThread: a different stream in every thread


_thread_numbers = itertools.count()
_this_thread = threading.local()


def stream_key(stream: int) -> Hashable:
    """What identifies a stream across threads: the per-thread default
    stream's handle (2) names another stream in each thread (numbered here
    once per thread: thread idents are reused as soon as a thread ends)."""
    if stream != PER_THREAD_STREAM:
        return stream
    number = getattr(_this_thread, "number", None)
    if number is None:
        number = _this_thread.number = next(_thread_numbers)
    return (PER_THREAD_STREAM, number)


class Block:
    """`nbytes` (rounded) of device memory at `ptr` for (`device`, `stream`):
    back to its pool's free list when the last reference to it goes (the
    arrays carved from it hold it), or at release()."""
    __slots__ = ("ptr", "nbytes", "device", "key", "_pool")

    def __init__(self, pool: Pool, nbytes: int, device: int, stream: int) -> None:
        self.nbytes = size = -(-nbytes // ALIGNMENT) * ALIGNMENT  # rounded(nbytes)
        self.device = device
        self.key = key = stream if stream != PER_THREAD_STREAM else stream_key(stream)
        self.ptr = pool.take(size, device, key)
        self._pool: Optional[Pool] = pool

    def release(self) -> None:
        """Give the block back now (once); later users of ptr are the caller's bug."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.give(self.ptr, self.nbytes, self.device, self.key)

    def __del__(self) -> None:
        try:  # release(), inlined: every output of a call pays this
            pool, self._pool = self._pool, None
            if pool is not None:
                pool.give(self.ptr, self.nbytes, self.device, self.key)
        except Exception:  # take() failed in __init__, or interpreter shutdown
            pass


class Pool:
    """Free lists of device blocks keyed by (device, stream, size).

    The free lists change only under the lock; cudaMalloc and cudaFree run
    outside it.  Nothing under the lock creates a Python container (the one
    give() may need is made before), so no garbage collection, and no
    Block.__del__, can run there and ask for the lock again."""

    def __init__(self, lib: _Runtime) -> None:
        self._lib = lib
        self._lock = threading.Lock()
        self._free: dict[tuple[int, Hashable, int], list[int]] = {}
        self._closed = False
        self.reserved_bytes = 0  # cudaMalloc'ed and not yet cudaFree'd

    def take(self, size: int, device: int, stream: Hashable) -> int:
        """The address of `size` (a rounded(), > 0) bytes on `device` for
        `stream` (a stream_key()).  The caller has made `device` current."""
        key = (device, stream, size)  # made outside the lock (see the class docstring)
        with self._lock:
            if self._closed:
                raise ValueError("this library has been unloaded (cudnn_bind.load or reset): "
                                 "its memory pool is closed")
            free = self._free.get(key)
            if free:
                return free.pop()
        return self._cuda_malloc(size)

    def give(self, ptr: int, size: int, device: int, stream: Hashable) -> None:
        """Put a block from take() back on the free list of its stream."""
        key = (device, stream, size)
        with self._lock:
            if not self._closed:
                free = self._free.get(key)
                if free is not None:  # the steady case: that list exists already
                    free.append(ptr)
                    return
        spare: list[int] = []  # made outside the lock (see the class docstring)
        with self._lock:
            if not self._closed:
                self._free.setdefault(key, spare).append(ptr)
                return
        self._cuda_free(ptr, size)

    @property
    def cached_bytes(self) -> int:
        with self._lock:
            return sum(key[2] * len(ptrs) for key, ptrs in self._free.items())

    @property
    def live_bytes(self) -> int:
        return self.reserved_bytes - self.cached_bytes

    def _cuda_malloc(self, size: int) -> int:
        out = ctypes.c_void_p()
        try:
            self._lib.cuda("cudaMalloc", ctypes.byref(out), size)
        except CudaError as exc:
            if exc.name != "cudaErrorMemoryAllocation" or not self.cached_bytes:
                raise
            self.empty_cache()  # cached blocks of every stream go back; try once more
            self._lib.cuda("cudaMalloc", ctypes.byref(out), size)
        with self._lock:
            self.reserved_bytes += size
        return out.value or 0  # NULL only for size 0, which take() never asks for

    def _cuda_free(self, ptr: int, size: int) -> None:
        self._lib.cuda("cudaFree", ctypes.c_void_p(ptr))
        with self._lock:
            self.reserved_bytes -= size

    def empty_cache(self) -> None:
        """Free every cached (unowned) block: each device with cached blocks
        is synchronized first, since queued work may still use them."""
        with self._lock:  # detached whole: no other thread can reach these blocks
            taken, self._free = self._free, {}
        devices = sorted({device for device, _, _ in taken})
        if not devices:
            return
        current = ctypes.c_int()
        self._lib.cuda("cudaGetDevice", ctypes.byref(current))
        try:
            for device in devices:
                self._lib.cuda("cudaSetDevice", device)
                self._lib.cuda("cudaDeviceSynchronize")
                for (dev, _, size), ptrs in taken.items():
                    if dev == device:
                        for ptr in ptrs:
                            self._cuda_free(ptr, size)
        finally:
            self._lib.cuda("cudaSetDevice", current.value)

    def close(self) -> None:
        """Empty the cache; blocks still owned are freed as their owners die."""
        with self._lock:
            self._closed = True
        self.empty_cache()
