# cython: language_level=3
"""The 1-D views the kernels' typed memoryviews take, made without the
Python-level method calls (a few hundred ns per array on every op)."""
cimport numpy as cnp
import numpy as np

cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    # steals a reference to the dtype; subtype NULL: an ndarray
    object PyArray_View(cnp.ndarray, cnp.dtype, void*)

from cpython.ref cimport Py_INCREF

cdef cnp.dtype UINT16 = np.dtype(np.uint16)


def kernel_flat(a):
    """a C-contiguous ndarray as the 1-D array a kernel's typed memoryview
    takes: 16-bit floats as their uint16 bits (the buffer protocol has no
    bfloat16).  A view: the callers made every kernel array C-contiguous, so
    ravel never copies.  None (an absent optional array) stays None."""
    if a is None:
        return None
    cdef cnp.ndarray arr = <cnp.ndarray?>a
    if cnp.PyArray_NDIM(arr) != 1:
        arr = cnp.PyArray_Ravel(arr, cnp.NPY_CORDER)
    if cnp.PyArray_ITEMSIZE(arr) == 2:
        Py_INCREF(UINT16)
        return PyArray_View(arr, UINT16, NULL)
    return arr


from cynorm._kernels._foreign cimport array_over


def tensor_view(t, cnp.dtype dtype):
    """A dense-strided CPU tensor t (torch's, or any object with data_ptr(),
    shape and stride() in elements) as a writable ndarray of dtype over its
    memory, kept alive by t.  Where Tensor.numpy() dispatches four operators
    (detach, to, resolve_conj, resolve_neg), this reads three attributes.
    The caller has checked t is a plain CPU tensor of dtype's item size,
    with no conjugate or negative bit.  None where t has no element (its
    data pointer may be NULL): the caller takes the general path."""
    cdef object shape = t.shape
    cdef object stride = t.stride()
    cdef Py_ssize_t nd = len(shape), i, item = dtype.itemsize
    cdef cnp.npy_intp dims[64]
    cdef cnp.npy_intp strides[64]
    if nd > 64:
        return None
    for i in range(nd):
        dims[i] = shape[i]
        if dims[i] == 0:
            return None
        strides[i] = stride[i] * item
    cdef size_t ptr = t.data_ptr()
    return array_over(dtype, <int>nd, dims, strides, <void*>ptr, True, t)
