# cython: language_level=3
"""DLPack tensors (torch, JAX, any producer of ``__dlpack__``) read in place
as NumPy arrays, bfloat16 included.

NumPy's own ``np.from_dlpack`` refuses bfloat16 (DLPack's kDLBfloat has no
NumPy dtype); cynorm reads it as ml_dtypes.bfloat16, the dtype its kernels
take.  The array's base owns the producer's tensor and calls its deleter when
the last view of it goes.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cimport numpy as cnp
from cpython.pycapsule cimport (
    PyCapsule_Destructor, PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_New, PyCapsule_SetName,
)
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.stdlib cimport free, malloc

import numpy as np

cnp.import_array()

from cynorm import _dtypes

from cynorm._kernels._foreign cimport array_over


# dlpack.h (v1.0), as the producers lay it out
cdef struct DLDevice:
    int32_t device_type
    int32_t device_id

cdef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

cdef struct DLTensor:
    void* data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t* shape
    int64_t* strides
    uint64_t byte_offset

cdef struct DLManagedTensor:
    DLTensor dl_tensor
    void* manager_ctx
    void (*deleter)(DLManagedTensor*) noexcept

cdef struct DLPackVersion:
    uint32_t major
    uint32_t minor

cdef struct DLManagedTensorVersioned:
    DLPackVersion version
    void* manager_ctx
    void (*deleter)(DLManagedTensorVersioned*) noexcept
    uint64_t flags
    DLTensor dl_tensor

cdef enum:
    KDL_CPU = 1
    KDL_CUDA_HOST = 3           # pinned host memory: the CPU reads it
    FLAG_READ_ONLY = 1

# DLPack's device types, for the error on a tensor that is not in host memory
DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                9: "VPI", 10: "ROCm", 11: "ROCm host", 13: "CUDA managed", 14: "oneAPI",
                15: "WebGPU", 16: "Hexagon", 17: "MAIA"}
# DLPack's type codes: kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLComplex, kDLBool
_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}


cdef class _Producer:
    """The base of an array read from a DLPack tensor: it owns the managed
    tensor and hands it back (the producer's deleter) when freed."""
    cdef void* managed
    cdef bint versioned

    def __dealloc__(self):
        cdef DLManagedTensor* m
        cdef DLManagedTensorVersioned* v
        if self.managed == NULL:
            return
        if self.versioned:
            v = <DLManagedTensorVersioned*>self.managed
            if v.deleter != NULL:
                v.deleter(v)
        else:
            m = <DLManagedTensor*>self.managed
            if m.deleter != NULL:
                m.deleter(m)
        self.managed = NULL


def _dtype(int code, int bits, int lanes, str name):
    """The NumPy dtype of a DLPack element type."""
    if lanes == 1:
        if code == 4 and bits == 16:
            return _dtypes.bfloat16()       # (ml_dtypes imported here if need be)
        if code == 6 and bits == 8:
            return np.dtype(np.bool_)
        kind = {0: "i", 1: "u", 2: "f", 5: "c"}.get(code)
        if kind is not None and bits % 8 == 0:
            try:
                return np.dtype(f"{kind}{bits // 8}")
            except TypeError:
                pass
    raise TypeError(f"{name} has a DLPack element type that cynorm cannot read "
                    f"({_CODES.get(code, f'type code {code}')}, {bits} bits"
                    + (f", {lanes} lanes" if lanes != 1 else "") + ")")


def _capsule(obj, str name):
    """obj.__dlpack__()'s capsule, asked for DLPack 1.0 (a read-only flag)
    where the producer speaks it; the producer's refusal (a torch tensor that
    requires grad, say) as a TypeError naming the argument."""
    try:
        dev = obj.__dlpack_device__()
    except Exception:               # noqa: BLE001 - optional before DLPack 1.0 producers
        dev = None
    if dev is not None and int(dev[0]) not in (KDL_CPU, KDL_CUDA_HOST):
        raise TypeError(f"{name} is in {DEVICE_NAMES.get(int(dev[0]), f'device type {dev[0]}')} "
                        f"memory: cynorm's array functions read host (CPU) memory only "
                        f"(device buffers: cudnn_bind)")
    try:
        try:
            return obj.__dlpack__(max_version=(1, 0))
        except TypeError:           # a producer from before max_version
            return obj.__dlpack__()
    except Exception as e:          # noqa: BLE001 - the producer's own error, reworded
        hint = (f" (a torch tensor that requires grad: pass {name}.detach(); cynorm's "
                f"array functions do not record gradients)"
                if getattr(obj, "requires_grad", False) else "")
        raise TypeError(f"{name} could not be read through DLPack{hint}: {e}") from None


def from_dlpack(obj, str name="x"):
    """obj (an object with ``__dlpack__``) as an ndarray over its memory, and
    whether that memory may be written (False where the producer says it is
    read-only)."""
    cap = _capsule(obj, name)
    cdef bint versioned
    cdef void* p
    cdef DLTensor* t
    cdef uint64_t flags = 0
    cdef _Producer owner
    cdef int i, nd
    cdef cnp.npy_intp dims[64]
    cdef cnp.npy_intp strides[64]
    cdef Py_ssize_t size = 1
    if PyCapsule_IsValid(cap, b"dltensor_versioned"):
        versioned = True
        p = PyCapsule_GetPointer(cap, b"dltensor_versioned")
        if (<DLManagedTensorVersioned*>p).version.major != 1:
            raise TypeError(f"{name} came through DLPack version "
                            f"{(<DLManagedTensorVersioned*>p).version.major}: cynorm reads 1.x")
        t = &(<DLManagedTensorVersioned*>p).dl_tensor
        flags = (<DLManagedTensorVersioned*>p).flags
    elif PyCapsule_IsValid(cap, b"dltensor"):
        versioned = False
        p = PyCapsule_GetPointer(cap, b"dltensor")
        t = &(<DLManagedTensor*>p).dl_tensor
    else:
        raise TypeError(f"{name}.__dlpack__() did not return an unused DLPack capsule")
    # the tensor is ours from here: the capsule no longer frees it
    PyCapsule_SetName(cap, b"used_dltensor_versioned" if versioned else b"used_dltensor")
    owner = _Producer.__new__(_Producer)
    owner.managed = p
    owner.versioned = versioned
    if t.device.device_type not in (KDL_CPU, KDL_CUDA_HOST):
        raise TypeError(f"{name} is in {DEVICE_NAMES.get(t.device.device_type, 'device')} "
                        f"memory: cynorm's array functions read host (CPU) memory only")
    nd = t.ndim
    if nd < 0 or nd > 64:
        raise TypeError(f"{name} has {nd} dimensions through DLPack (NumPy takes 0 to 64)")
    dtype = _dtype(t.dtype.code, t.dtype.bits, t.dtype.lanes, name)
    for i in range(nd):
        dims[i] = <cnp.npy_intp>t.shape[i]
        size *= dims[i]
    if t.strides != NULL:
        for i in range(nd):
            strides[i] = <cnp.npy_intp>(t.strides[i] * dtype.itemsize)
    else:
        for i in range(nd - 1, -1, -1):
            strides[i] = dtype.itemsize if i == nd - 1 else strides[i + 1] * dims[i + 1]
    writable = not (flags & FLAG_READ_ONLY)
    if size == 0 or t.data == NULL:
        # no element to read (a NULL data pointer would have NumPy allocate)
        a = np.empty(tuple(dims[i] for i in range(nd)), dtype)
        if not writable:
            a.flags.writeable = False
        return a, writable
    return array_over(dtype, nd, dims, strides, <char*>t.data + t.byte_offset, writable,
                      owner), writable


# ---- the other way: an ndarray as a DLPack capsule ---------------------------

cdef struct _Exported:
    # an exported array's DLPack tensor and the shape and strides it points at
    DLManagedTensor managed
    int64_t shape[64]
    int64_t strides[64]


cdef void _release(DLManagedTensor* m) noexcept nogil:
    # the consumer's (or the unused capsule's) hand-back: the array's
    # reference dropped, under the GIL (a consumer may free from any thread)
    with gil:
        Py_DECREF(<object>m.manager_ctx)
    free(m)


cdef void _capsule_gone(object cap) noexcept:
    # a capsule no consumer took still owns its tensor
    if PyCapsule_IsValid(cap, b"dltensor"):
        _release(<DLManagedTensor*>PyCapsule_GetPointer(cap, b"dltensor"))


def to_dlpack(cnp.ndarray a):
    """An aligned ndarray of float64, float32, float16 or bfloat16, no
    stride negative, as an unversioned DLPack capsule over its memory (which
    it keeps alive), for a consumer such as torch's from_dlpack; bfloat16 as
    kDLBfloat, which NumPy's own __dlpack__ refuses."""
    cdef cnp.dtype dt = a.dtype
    cdef int nd = a.ndim, i, code
    if dt.kind == "f" and dt.byteorder in "=|":
        code = 2                    # kDLFloat
    elif _dtypes.policy_of(dt) is not None and dt == _dtypes.BFLOAT16:
        code = 4                    # kDLBfloat
    else:
        raise TypeError(f"to_dlpack: float64, float32, float16 or bfloat16 expected, got {dt}")
    if nd > 64 or not a.flags.aligned:
        raise ValueError("to_dlpack: an aligned array of at most 64 dimensions expected")
    for i in range(nd):
        # (torch cannot hold a negative stride)
        if a.strides[i] % dt.itemsize or a.strides[i] < 0:
            raise ValueError("to_dlpack: strides of whole elements, none negative, expected")
    cdef _Exported* e = <_Exported*>malloc(sizeof(_Exported))
    if e == NULL:
        raise MemoryError("to_dlpack: could not allocate the DLPack tensor")
    for i in range(nd):
        e.shape[i] = a.shape[i]
        e.strides[i] = a.strides[i] // dt.itemsize
    e.managed.dl_tensor.data = cnp.PyArray_DATA(a)
    e.managed.dl_tensor.device.device_type = KDL_CPU
    e.managed.dl_tensor.device.device_id = 0
    e.managed.dl_tensor.ndim = nd
    e.managed.dl_tensor.dtype.code = code
    e.managed.dl_tensor.dtype.bits = 8 * dt.itemsize
    e.managed.dl_tensor.dtype.lanes = 1
    e.managed.dl_tensor.shape = e.shape
    e.managed.dl_tensor.strides = e.strides
    e.managed.dl_tensor.byte_offset = 0
    Py_INCREF(a)
    e.managed.manager_ctx = <void*>a
    e.managed.deleter = _release
    return PyCapsule_New(<void*>&e.managed, b"dltensor", <PyCapsule_Destructor>_capsule_gone)
