# An ndarray over memory another object owns (a torch tensor's storage, a
# DLPack producer's buffer), kept alive by that object: the one place
# _views.pyx and _dlpack.pyx make one.
cimport numpy as cnp
from cpython.ref cimport Py_INCREF

cdef extern from "numpy/arrayobject.h":
    # (commented out in NumPy's .pxd); steals a reference to descr
    object PyArray_NewFromDescr(void* subtype, void* descr, int nd, cnp.npy_intp* dims,
                                cnp.npy_intp* strides, void* data, int flags, void* obj)


cdef inline object array_over(cnp.dtype dtype, int nd, cnp.npy_intp* dims,
                              cnp.npy_intp* strides, void* data, bint writable, object owner):
    # an ndarray of dtype, shape dims and byte strides at data, writable or
    # not, whose base is owner (the caller has checked the memory is there)
    Py_INCREF(dtype)            # PyArray_NewFromDescr steals the dtype's reference
    a = PyArray_NewFromDescr(<void*>cnp.ndarray, <void*>dtype, nd, dims, strides, data,
                             cnp.NPY_ARRAY_WRITEABLE if writable else 0, NULL)
    cnp.set_array_base(a, owner)
    return a
