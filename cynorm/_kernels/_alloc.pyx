# cython: language_level=3
"""Output allocation through a NumPy memory handler that reuses freed blocks.

See cn_alloc.h for why.  `empty()` allocates through the handler only when
the cache is on and the array is large; NumPy's default handler is restored
right after, so no other allocation in the process is affected.
"""
import os

import numpy as np

cimport numpy as cnp
from cpython.pycapsule cimport PyCapsule_New

cnp.import_array()

cdef extern from "cn_alloc.h":
    ctypedef struct cn_cache_t:
        size_t held
        size_t limit
        size_t min_size
        unsigned long long hits
        unsigned long long misses
    cn_cache_t cn_cache
    cnp.PyDataMem_Handler cn_handler
    int cn_cache_init(size_t limit, size_t min_size)
    void cn_cache_set_limit(size_t limit) nogil
    void cn_cache_trim(size_t limit) nogil
    int cn_cache_blocks() nogil
    int CN_CACHE_SLOTS
    int cn_outside_cache

DEFAULT_LIMIT = 512 << 20
MIN_SIZE = 1 << 20


def _limit_from_env():
    raw = os.environ.get("CYNORM_ALLOC_CACHE", "").strip().lower()
    if raw == "":
        return DEFAULT_LIMIT
    if raw in ("0", "off", "false", "no"):
        return 0
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"CYNORM_ALLOC_CACHE must be a byte count or 'off', got {raw!r}") from None
    if value < 0:
        raise ValueError(f"CYNORM_ALLOC_CACHE must be >= 0, got {value}")
    return value


if cn_cache_init(_limit_from_env(), MIN_SIZE) != 0:
    raise MemoryError("cynorm: could not create the allocation-cache lock")

cdef object _capsule = PyCapsule_New(<void*>&cn_handler, b"mem_handler", NULL)


cdef inline bint cached(Py_ssize_t nbytes) noexcept:
    # an output of nbytes goes through the block cache: it is on, the output
    # large, and no OutsideCache call is under way on this thread
    return (nbytes >= <Py_ssize_t>cn_cache.min_size and cn_cache.limit != 0
            and cn_outside_cache == 0)


cdef class OutsideCache:
    """A function whose calls take their outputs from NumPy's own allocator,
    not the block cache (on the calling thread, while the call runs).

    For cynorm.torch, whose outputs become PyTorch tensors: in a PyTorch
    model a block kept since the last step's backward is cold, where the
    allocator PyTorch's operators free into hands out memory they just used
    (and the cache's blocks are memory PyTorch's allocations cannot reuse).
    """
    cdef readonly object __wrapped__

    def __init__(self, fn):
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        global cn_outside_cache
        cn_outside_cache += 1
        try:
            return self.__wrapped__(*args, **kwargs)
        finally:
            cn_outside_cache -= 1


def empty(shape, dtype, Py_ssize_t nbytes):
    """np.empty(shape, dtype), through the block cache when nbytes is large."""
    if not cached(nbytes):
        return np.empty(shape, dtype)
    old = cnp.PyDataMem_SetHandler(_capsule)
    try:
        return np.empty(shape, dtype)
    finally:
        cnp.PyDataMem_SetHandler(old)


cdef object new_array(int nd, cnp.npy_intp* dims, int typenum, Py_ssize_t nbytes):
    """empty() for C callers: an nd-array of dims, C order, dtype number typenum."""
    if not cached(nbytes):
        return cnp.PyArray_EMPTY(nd, dims, typenum, 0)
    old = cnp.PyDataMem_SetHandler(_capsule)
    try:
        return cnp.PyArray_EMPTY(nd, dims, typenum, 0)
    finally:
        cnp.PyDataMem_SetHandler(old)


def set_cache_limit(limit):
    """Keep at most `limit` bytes of freed output blocks; 0 turns the cache off."""
    limit = int(limit)
    if limit < 0:
        raise ValueError(f"limit must be >= 0 bytes, got {limit}")
    cn_cache_set_limit(limit)


def clear_cache():
    """Return every kept block to the system (the cache stays on)."""
    cn_cache_trim(0)


def cache_info():
    """A dict: limit, held (bytes), blocks, slots, min_size, hits, misses."""
    return {
        "limit": cn_cache.limit,
        "held": cn_cache.held,
        "blocks": cn_cache_blocks(),
        "slots": CN_CACHE_SLOTS,
        "min_size": cn_cache.min_size,
        "hits": cn_cache.hits,
        "misses": cn_cache.misses,
    }
