# cython: language_level=3
"""The plain case of an op's arguments, recognized at C cost.

Most calls pass what the kernels work on already: exact ndarrays (no
subclass) of a supported dtype in native byte order, C-contiguous and
aligned, and no out= arrays.  For those, a kernel module's `*_plain` entry
checks exactly that, allocates the outputs and runs the kernels, at a
fraction of the Python layer's cost.  For anything else it returns None
and the Python layer takes the call: it converts, validates and raises the
errors.  Both paths run the same kernels on the same arrays, so they give
the same bits (tests/test_plain_calls.py).
"""
import numpy as np
cimport numpy as cnp
from cpython.object cimport PyObject
from libc.string cimport memcpy

from cynorm._kernels.common cimport (
    cn_bf16, cn_f16, cn_bf16_to_f32, cn_f16_to_f32, cn_f32_to_bf16, cn_f32_to_f16,
)

cnp.import_array()

from cynorm._dtype_table import STORAGE_TYPES
from cynorm import _dtypes

# Per storage code, from the dtype table (cynorm/_dtype_table.py): the
# NumPy descriptor, its type number, the element size and the math type's code
# (DESCR: borrowed pointers, held by the DESCRS list, compared by address
# at C cost on every plain call).  bfloat16's descriptor is NULL (None, type
# number -1) until cynorm._dtypes registers the type: no array can have it
# before ml_dtypes is imported, and the first one met registers it.
cdef list DESCRS = [None] * N_STORAGE
cdef PyObject* DESCR[N_STORAGE]
cdef int TYPENUM[N_STORAGE]
cdef Py_ssize_t ITEMSIZE[N_STORAGE]
cdef int MATH_STORAGE[N_STORAGE]


def _set_descr(int code, object dtype):
    """Storage code `code` is dtype from now on (dtype None: no dtype yet)."""
    DESCRS[code] = dtype
    DESCR[code] = <PyObject*>dtype if dtype is not None else NULL
    TYPENUM[code] = dtype.num if dtype is not None else -1


for _code, _row in enumerate(STORAGE_TYPES):
    _set_descr(_code, None if _row[1] == "bfloat16" else np.dtype(_row[1]))
    ITEMSIZE[_code] = _row[2]
    MATH_STORAGE[_code] = [r[1] for r in STORAGE_TYPES].index(_row[5])
_dtypes.on_bfloat16(lambda dtype: _set_descr(STORAGE_BF16, dtype))


cdef int storage_of(object a) noexcept:
    """a's storage type (STORAGE_*) if a is a plain array, else NOT_PLAIN."""
    if type(a) is not cnp.ndarray or not cnp.PyArray_CHKFLAGS(
            <cnp.ndarray>a, cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_ALIGNED):
        return NOT_PLAIN
    return storage_of_descr(<cnp.ndarray>a)


cdef int storage_of_any_layout(object a) noexcept:
    """storage_of for an exact, aligned ndarray of any strides."""
    if type(a) is not cnp.ndarray or not cnp.PyArray_CHKFLAGS(<cnp.ndarray>a, cnp.NPY_ARRAY_ALIGNED):
        return NOT_PLAIN
    return storage_of_descr(<cnp.ndarray>a)


cdef int kernel_storage(object a) noexcept:
    """The storage of an array the Python layer hands to an op's composition:
    any ndarray (a subclass too) that is C-contiguous and of a supported
    dtype in native byte order; else NOT_PLAIN."""
    if not cnp.PyArray_Check(a) or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a):
        return NOT_PLAIN
    cdef int s = storage_of_descr(<cnp.ndarray>a)
    if s != NOT_PLAIN:
        return s
    d = <object>cnp.PyArray_DESCR(<cnp.ndarray>a)     # an equal, distinct descriptor
    for s in range(N_STORAGE):
        if d == DESCRS[s]:
            return s
    return NOT_PLAIN


cdef int storage_of_dtype(object d) noexcept:
    """The storage of a dtype argument: one of the supported dtypes or its
    scalar type (np.float32, ml_dtypes.bfloat16 ...), else NOT_PLAIN."""
    cdef int s
    for s in range(N_STORAGE):
        if DESCRS[s] is not None and (d is DESCRS[s] or d is DESCRS[s].type):
            return s
    return NOT_PLAIN


cdef int storage_of_descr(cnp.ndarray a) noexcept:
    # NumPy's descriptors of native built-in types are singletons (ml_dtypes'
    # too): an equal but distinct one (unpickled, say) is left to Python
    cdef PyObject* d = <PyObject*>cnp.PyArray_DESCR(a)
    cdef int s
    for s in range(N_STORAGE):
        if d == DESCR[s]:
            return s
    return NOT_PLAIN


cdef int math_storage(int storage) noexcept nogil:
    """The dtype of per-channel parameters and statistics for a storage type."""
    return MATH_STORAGE[storage] if 0 <= storage < N_STORAGE else NOT_PLAIN


cdef int typenum(int storage) noexcept:
    return TYPENUM[storage] if 0 <= storage < N_STORAGE else -1


cdef Py_ssize_t itemsize(int storage) noexcept nogil:
    # 0 for NOT_PLAIN (callers may ask before they check the storage)
    return ITEMSIZE[storage] if 0 <= storage < N_STORAGE else 0


cdef bint plain_eps(object eps) noexcept:
    """eps is a float >= 0 (not NaN): a Python float or a subclass of it,
    such as NumPy's float64."""
    return isinstance(eps, float) and <double>eps >= 0.0


cdef bint disjoint(object a, object b) noexcept:
    """Two plain arrays' memory does not overlap (None, and an empty array,
    overlap nothing)."""
    if a is None or b is None:
        return True
    cdef char* pa = <char*>cnp.PyArray_DATA(<cnp.ndarray>a)
    cdef char* pb = <char*>cnp.PyArray_DATA(<cnp.ndarray>b)
    cdef Py_ssize_t na = cnp.PyArray_NBYTES(<cnp.ndarray>a), nb = cnp.PyArray_NBYTES(<cnp.ndarray>b)
    return na == 0 or nb == 0 or pa + na <= pb or pb + nb <= pa


cdef bint plain_out_form(object out, Py_ssize_t n) noexcept:
    """out is an out= form of an op with n outputs the plain case takes:
    None, or a tuple of n entries (each checked by plain_out)."""
    return out is None or (type(out) is tuple and len(<tuple>out) == n)


cdef object out_entry(object out, Py_ssize_t i):
    """Entry i of a plain out= form (None for out=None)."""
    return None if out is None else (<tuple>out)[i]


cdef bint plain_out(object a, int storage, int nd, const cnp.npy_intp* dims) noexcept:
    """a, an out= entry, is one the plain case takes: None (the op allocates
    it), or a plain, writeable array of `storage` with shape dims[:nd]."""
    return a is None or (plain_with_shape(a, storage, nd, dims)
                         and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>a))


cdef bint written_apart(tuple written, tuple read) noexcept:
    """The arrays an op writes (plain arrays or None) overlap neither each
    other nor any array it reads.  The plain case takes only such calls;
    the Python layer copies an input an output overlaps (out=x included),
    and refuses outputs that overlap each other."""
    cdef Py_ssize_t i, j
    for i in range(len(written)):
        for j in range(i + 1, len(written)):
            if not disjoint(written[i], written[j]):
                return False
        for j in range(len(read)):
            if not disjoint(written[i], read[j]):
                return False
    return True


cdef bint plain_with_shape(object a, int storage, int nd, const cnp.npy_intp* dims) noexcept:
    """a is a plain array of `storage` with shape dims[:nd]."""
    return storage_of(a) == storage and shaped(<cnp.ndarray>a, nd, dims)


cdef bint shaped(cnp.ndarray a, int nd, const cnp.npy_intp* dims) noexcept:
    # a's shape is dims[:nd]
    if cnp.PyArray_NDIM(a) != nd:
        return False
    cdef const cnp.npy_intp* own = cnp.PyArray_DIMS(a)
    cdef int i
    for i in range(nd):
        if own[i] != dims[i]:
            return False
    return True


cdef bint plain_rows_with_shape(object a, int storage, int nd, const cnp.npy_intp* dims,
                               int k) noexcept:
    """a is an exact, aligned ndarray of `storage` with shape dims[:nd]
    whose rows (its last k axes) are each contiguous, wherever they lie (a
    C-contiguous array's, or a transposed array's, in another order than
    C's): the rows a row kernel reads in place, at row_offsets."""
    if storage_of_any_layout(a) != storage or not shaped(<cnp.ndarray>a, nd, dims):
        return False
    cdef const cnp.npy_intp* own = cnp.PyArray_DIMS(<cnp.ndarray>a)
    cdef const cnp.npy_intp* strides = cnp.PyArray_STRIDES(<cnp.ndarray>a)
    cdef Py_ssize_t step = ITEMSIZE[storage]
    cdef int i
    for i in range(nd - 1, -1, -1):
        if i >= nd - k:
            # a row's axes: C order (an axis of length 1 has no step)
            if own[i] != 1 and strides[i] != step:
                return False
            step *= own[i]
        elif strides[i] % ITEMSIZE[storage] != 0:
            return False
    return True


cdef void row_offsets(object a, int k, Py_ssize_t* offsets) noexcept:
    """The offset (in elements, from a's first element) of each row of a
    plain_rows_with_shape array, in C order of its leading axes."""
    cdef int lead = cnp.PyArray_NDIM(<cnp.ndarray>a) - k, j
    cdef const cnp.npy_intp* dims = cnp.PyArray_DIMS(<cnp.ndarray>a)
    cdef const cnp.npy_intp* strides = cnp.PyArray_STRIDES(<cnp.ndarray>a)
    cdef Py_ssize_t isz = cnp.PyArray_ITEMSIZE(<cnp.ndarray>a), r, off = 0, m = 1
    cdef cnp.npy_intp idx[cnp.NPY_MAXDIMS]
    for j in range(lead):
        idx[j] = 0
        m *= dims[j]
    for r in range(m):
        offsets[r] = off
        # the next index, the last axis fastest
        j = lead - 1
        while j >= 0:
            idx[j] += 1
            off += strides[j] // isz
            if idx[j] < dims[j]:
                break
            off -= dims[j] * (strides[j] // isz)
            idx[j] = 0
            j -= 1


cdef bint plain_param(object a, int storage, int nd, const cnp.npy_intp* dims) noexcept:
    """a is None or a plain per-channel (per-column) parameter or statistic
    for data of `storage`, with shape dims[:nd]: of the math type's storage,
    or of the data's own when that is 16-bit (the dtype policy's
    coefficients: a model cast to bfloat16 holds bfloat16 weights)."""
    return a is None or plain_with_shape(a, math_storage(storage), nd, dims) or (
        itemsize(storage) == 2 and plain_with_shape(a, storage, nd, dims))


cdef int param_storage(object a, int storage) noexcept:
    """The storage of a plain_param `a`; for None, the math type's (the
    dtype of a gradient the op returns for a missing parameter)."""
    return math_storage(storage) if a is None else kernel_storage(a)


cdef void* math_values(object a, float* scratch) noexcept:
    """A plain_param's values in the math type: its data, or (16-bit) its
    values widened into scratch, exactly; NULL for None."""
    if a is None:
        return NULL
    return <void*>param_values(data(a), kernel_storage(a), cnp.PyArray_SIZE(<cnp.ndarray>a),
                               scratch)


cdef const void* param_values(const void* p, int storage, Py_ssize_t n,
                              float* scratch) noexcept nogil:
    """n parameter values of `storage` in the math type: p itself (float32,
    float64), or (16-bit) widened into scratch, exactly; NULL for NULL."""
    if p == NULL or storage == STORAGE_F32 or storage == STORAGE_F64:
        return p
    return floats_from(p, storage, n, scratch)


cdef int trailing_axes(cnp.ndarray x, object shape) noexcept:
    """How many trailing axes of x `shape` (an int, or a tuple or list of
    ints) names and matches; 0 when it is anything else."""
    cdef int nd = cnp.PyArray_NDIM(x)
    cdef const cnp.npy_intp* dims = cnp.PyArray_DIMS(x)
    cdef int k, i
    if type(shape) is int:
        return 1 if nd >= 1 and shape == dims[nd - 1] else 0
    if not isinstance(shape, (tuple, list)):
        return 0
    k = len(shape)
    if k == 0 or k > nd:
        return 0
    for i in range(k):
        item = shape[i]
        if type(item) is not int or item != dims[nd - k + i]:
            return 0
    return k


cdef void* data(object a) noexcept:
    """A plain array's data, or NULL for None."""
    return NULL if a is None else cnp.PyArray_DATA(<cnp.ndarray>a)


cdef object doubles_as(const double* s, int storage, int nd, const cnp.npy_intp* dims):
    """A new array of `storage` and shape dims[:nd] holding the float64 values
    s, rounded as _dtypes.from_float64 rounds them (16-bit: through float32)."""
    return doubles_into(s, storage, cnp.PyArray_EMPTY(nd, <cnp.npy_intp*>dims, TYPENUM[storage], 0))


cdef object doubles_into(const double* s, int storage, object out):
    """out (a plain array of `storage`) holding the float64 values s, rounded
    as doubles_as rounds them; returns out."""
    store_doubles(cnp.PyArray_DATA(<cnp.ndarray>out), storage,
                  cnp.PyArray_SIZE(<cnp.ndarray>out), s)
    return out


cdef void store_doubles(void* p, int storage, Py_ssize_t n, const double* s) noexcept nogil:
    """p[:n] (a `storage` buffer) = the float64 values s, rounded as
    store_value rounds them."""
    cdef Py_ssize_t i
    # (float64 and float32, the usual statistics and parameter gradients, in
    # loops that vectorize, as doubles_from's)
    if storage == STORAGE_F64:
        memcpy(p, s, n * sizeof(double))
    elif storage == STORAGE_F32:
        for i in range(n):
            (<float*>p)[i] = <float>s[i]
    else:
        for i in range(n):
            store_value(p, storage, i, s[i])


cdef bint doubles_from(object a, Py_ssize_t n, double* dst) noexcept:
    """dst[:n] = a as float64, if a is a plain 1-D array of length n of any
    storage type; False (dst untouched) otherwise."""
    cdef int storage = storage_of(a)
    if (storage == NOT_PLAIN or cnp.PyArray_NDIM(<cnp.ndarray>a) != 1
            or cnp.PyArray_DIMS(<cnp.ndarray>a)[0] != n):
        return False
    cdef const void* p = cnp.PyArray_DATA(<cnp.ndarray>a)
    cdef Py_ssize_t i
    # float64 and float32 (the usual parameters) in loops that vectorize,
    # not a value_at call per value
    if storage == STORAGE_F64:
        memcpy(dst, p, n * sizeof(double))
    elif storage == STORAGE_F32:
        for i in range(n):
            dst[i] = (<const float*>p)[i]
    else:
        for i in range(n):
            dst[i] = value_at(p, storage, i)
    return True


cdef double value_at(const void* p, int storage, Py_ssize_t i) noexcept nogil:
    """Element i of a `storage` buffer as float64 (exact, as NumPy's astype)."""
    if storage == STORAGE_F64:
        return (<const double*>p)[i]
    if storage == STORAGE_F32:
        return (<const float*>p)[i]
    if storage == STORAGE_BF16:
        return cn_bf16_to_f32((<const cn_bf16*>p)[i])
    return cn_f16_to_f32((<const cn_f16*>p)[i])


cdef void store_value(void* p, int storage, Py_ssize_t i, double v) noexcept nogil:
    """Stores v into element i of a `storage` buffer, rounded as
    _dtypes.from_float64 rounds it (16-bit: through float32)."""
    if storage == STORAGE_F64:
        (<double*>p)[i] = v
    elif storage == STORAGE_F32:
        (<float*>p)[i] = <float>v
    elif storage == STORAGE_BF16:
        (<cn_bf16*>p)[i] = cn_f32_to_bf16(<float>v)
    else:
        (<cn_f16*>p)[i] = cn_f32_to_f16(<float>v)


cdef float* floats_from(const void* p, int storage, Py_ssize_t n, float* dst) noexcept nogil:
    """dst[:n] = n values of a float32 or 16-bit `storage` buffer (exact);
    returns dst."""
    cdef Py_ssize_t i
    if storage == STORAGE_F32:
        memcpy(dst, p, n * sizeof(float))
    elif storage == STORAGE_BF16:
        for i in range(n):
            dst[i] = cn_bf16_to_f32((<const cn_bf16*>p)[i])
    else:
        for i in range(n):
            dst[i] = cn_f16_to_f32((<const cn_f16*>p)[i])
    return dst


cdef void floats_into(void* p, int storage, Py_ssize_t n, const float* src) noexcept nogil:
    """n float32 values into a float32 or 16-bit `storage` buffer (16-bit:
    rounded as store_value rounds them)."""
    cdef Py_ssize_t i
    if storage == STORAGE_F32:
        memcpy(p, src, n * sizeof(float))
    elif storage == STORAGE_BF16:
        for i in range(n):
            (<cn_bf16*>p)[i] = cn_f32_to_bf16(src[i])
    else:
        for i in range(n):
            (<cn_f16*>p)[i] = cn_f32_to_f16(src[i])


cdef object plain_mask(object mask, Py_ssize_t n):
    """An output_mask of n bools, a tuple or a list (torch's ops take
    either), as a tuple; None when it is anything else."""
    cdef Py_ssize_t i
    if type(mask) is list:
        mask = tuple(<list>mask)
    elif type(mask) is not tuple:
        return None
    if len(<tuple>mask) != n:
        return None
    for i in range(n):
        if type((<tuple>mask)[i]) is not bool:
            return None
    return mask


cdef bint split_at(cnp.ndarray a, object axis, Py_ssize_t* dims3) noexcept:
    """(A, D, B): the products of a's axes before `axis`, its length, and the
    product after; axis an int in range, or None: the whole array as one
    slice.  False if axis is anything else."""
    cdef int nd = cnp.PyArray_NDIM(a), i, d
    cdef cnp.npy_intp* dims = cnp.PyArray_DIMS(a)
    if axis is None:
        dims3[0] = dims3[1] = 1
        dims3[2] = cnp.PyArray_SIZE(a)
        return True
    if type(axis) is not int or not -nd <= axis < nd:
        return False
    d = axis
    d = d + nd if d < 0 else d
    dims3[0] = dims3[2] = 1
    dims3[1] = dims[d]
    for i in range(nd):
        if i < d:
            dims3[0] *= dims[i]
        elif i > d:
            dims3[2] *= dims[i]
    return True
