# Output allocation for the kernel modules' plain-case entries (_plain.pxd):
# the same arrays `empty()` makes, without a Python call.
cimport numpy as cnp

cdef object new_array(int nd, cnp.npy_intp* dims, int typenum, Py_ssize_t nbytes)
