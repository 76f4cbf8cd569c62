"""NestedArray: a batch of arrays of one dtype and ndim whose shapes differ,
stored back to back in one contiguous 1-D buffer, without padding.

Component i is buffer[offsets[i] : offsets[i] + prod(sizes[i])] in C order,
of shape sizes[i].  In nested coordinates dim 0 indexes the components and
dim d >= 1 is the components' dim d - 1, as in PyTorch's nested tensors.
"""
import numpy as np

from cynorm._dtypes import SUPPORTED_DTYPES
from cynorm._validation import as_array, as_dtype, as_float_array, int_tuple, real_number


class NestedArray:
    """A variable-shape batch: `buffer` (1-D, contiguous), `sizes` (int64,
    ntensors x component ndim) and `offsets` (int64, ntensors).

    Construct with `nested_array(list_of_arrays)` or `from_padded(padded,
    sizes)`; `NestedArray(buffer, sizes)` wraps an existing buffer (no copy)
    whose components lie back to back in order.
    """

    __slots__ = ("_buffer", "_sizes", "_offsets", "_numels")

    def __init__(self, buffer, sizes):
        if not isinstance(buffer, np.ndarray):
            raise TypeError(f"buffer must be a NumPy array, got {type(buffer).__name__}")
        if buffer.ndim != 1 or not buffer.flags.c_contiguous:
            raise ValueError(f"buffer must be a contiguous 1-D array, got shape {buffer.shape}"
                             + ("" if buffer.flags.c_contiguous else " (not contiguous)"))
        if buffer.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"buffer must have a floating dtype "
                            f"({', '.join(map(str, SUPPORTED_DTYPES))}), got {buffer.dtype}")
        sizes = as_array(sizes, "sizes")
        if sizes.ndim != 2 or (sizes.size and sizes.dtype.kind not in "iu"):
            raise ValueError(f"sizes must be a 2-D integer array (ntensors x component ndim), "
                             f"got shape {sizes.shape} dtype {sizes.dtype}")
        sizes = sizes.astype(np.int64)
        if np.any(sizes < 0):
            raise ValueError("sizes must be non-negative")
        if np.any(np.prod(sizes, axis=1, dtype=np.float64) >= 2.0**63):  # int64 would wrap
            raise ValueError("sizes describe a component of 2**63 elements or more")
        numels = np.prod(sizes, axis=1, dtype=np.int64)
        if int(numels.sum()) != buffer.size:
            raise ValueError(f"sizes describe {int(numels.sum())} elements but buffer holds "
                             f"{buffer.size}")
        sizes.setflags(write=False)
        self._buffer, self._sizes, self._numels = buffer, sizes, numels
        self._offsets = np.concatenate(([0], np.cumsum(numels)[:-1])).astype(np.int64) \
            if len(numels) else np.zeros(0, np.int64)
        self._offsets.setflags(write=False)

    # ------------------------------------------------------------ properties
    @property
    def buffer(self):
        return self._buffer

    @property
    def sizes(self):
        """int64 (ntensors, component ndim), read-only."""
        return self._sizes

    @property
    def offsets(self):
        """int64 start of each component in the buffer, read-only."""
        return self._offsets

    @property
    def numels(self):
        return self._numels

    @property
    def dtype(self):
        return self._buffer.dtype

    @property
    def ndim(self):
        """Component ndim + 1: dim 0 indexes the components."""
        return self._sizes.shape[1] + 1

    def __len__(self):
        return self._sizes.shape[0]

    def component_shape(self, i):
        return tuple(int(s) for s in self._sizes[i])

    def __getitem__(self, i):
        """Component i as a view into the buffer."""
        n = len(self)
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"NestedArray index must be an int, got {type(i).__name__}")
        if not -n <= i < n:
            raise IndexError(f"component index {i} out of range for {n} components")
        i = int(i) % n
        start = int(self._offsets[i])
        return self._buffer[start:start + int(self._numels[i])].reshape(self.component_shape(i))

    def unbind(self):
        """The components as a list of views into the buffer."""
        return [self[i] for i in range(len(self))]

    def __iter__(self):
        return iter(self.unbind())

    def max_sizes(self):
        """The largest size along each component dim (0 for no components)."""
        return tuple(int(s) for s in self._sizes.max(axis=0)) if len(self) else (0,) * (self.ndim - 1)

    def uniform_size(self, cdim):
        """Component dim cdim's size if every component has the same one, else None."""
        col = self._sizes[:, cdim]
        return int(col[0]) if len(col) and np.all(col == col[0]) else (0 if not len(col) else None)

    def to_padded(self, fill=0.0, output_size=None):
        """A dense (ntensors, *max sizes) array, components in the leading
        corner of each slot and `fill` elsewhere.  output_size (the full
        shape, ntensors first) may be larger than needed."""
        fill = real_number(fill, "fill")
        shape = (len(self),) + self.max_sizes()
        if output_size is not None:
            output_size = int_tuple(output_size, "output_size", "a tuple of ints (the shape)")
            if len(output_size) != len(shape) or any(o < s for o, s in zip(output_size, shape)):
                raise ValueError(f"output_size {output_size} must have {len(shape)} dims, each at "
                                 f"least {shape}")
            shape = output_size
        out = np.full(shape, fill, dtype=self.dtype)
        for i, comp in enumerate(self.unbind()):      # one copy per component: shapes differ
            out[(i,) + tuple(slice(0, s) for s in comp.shape)] = comp
        return out

    def like(self, buffer):
        """A NestedArray with this one's structure around `buffer`."""
        return NestedArray(buffer, self._sizes)

    def same_structure(self, other):
        return isinstance(other, NestedArray) and np.array_equal(self._sizes, other._sizes)

    def __repr__(self):
        shapes = [self.component_shape(i) for i in range(min(len(self), 4))]
        more = ", ..." if len(self) > 4 else ""
        return (f"NestedArray(ntensors={len(self)}, dtype={self.dtype}, "
                f"shapes=[{', '.join(map(str, shapes))}{more}])")


def _native(dtype):
    """dtype in native byte order (NestedArray buffers are native)."""
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def nested_array(arrays, dtype=None):
    """A NestedArray holding copies of `arrays` (a list of array-likes of one
    ndim).  Their dtypes must agree unless `dtype` is given."""
    if isinstance(arrays, np.ndarray) or not isinstance(arrays, (list, tuple)):
        raise TypeError(f"arrays must be a list or tuple of arrays, got {type(arrays).__name__}")
    comps = [as_array(a, f"arrays[{i}]") for i, a in enumerate(arrays)]
    what = "dtype"
    if dtype is not None:
        dtype = _native(as_dtype(dtype, "dtype"))
    elif comps:
        # non-native byte order is converted, as every op converts its inputs
        dtypes = {_native(c.dtype) for c in comps}
        if len(dtypes) > 1:
            raise TypeError(f"the arrays have different dtypes ({', '.join(sorted(map(str, dtypes)))}); "
                            "pass dtype= to convert them")
        dtype, what = _native(comps[0].dtype), "the arrays' dtype"
        if dtype.kind in "iub":
            dtype = np.dtype(np.float64)
    else:
        dtype = np.dtype(np.float64)
    ndims = {c.ndim for c in comps}
    if len(ndims) > 1:
        raise ValueError(f"the arrays must all have the same ndim, got ndims {sorted(ndims)}")
    ndim = ndims.pop() if ndims else 0
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{what} must be floating ({', '.join(map(str, SUPPORTED_DTYPES))}), got {dtype}")
    sizes = np.array([c.shape for c in comps], dtype=np.int64).reshape(len(comps), ndim)
    buffer = np.empty(int(np.prod(sizes, axis=1).sum()), dtype)
    start = 0
    for c in comps:
        buffer[start:start + c.size] = c.reshape(-1)
        start += c.size
    return NestedArray(buffer, sizes)


def from_padded(padded, sizes):
    """A NestedArray of the leading corners of `padded`'s slots: component i
    is padded[i][:sizes[i][0], :sizes[i][1], ...]."""
    padded, _ = as_float_array(padded, "padded")
    if padded.ndim == 0:
        raise ValueError("padded must have at least 1 dimension (the components), got a 0-d array")
    sizes = as_array(sizes, "sizes")
    if sizes.size and sizes.dtype.kind not in "iu":
        raise TypeError(f"sizes must be integers, got dtype {sizes.dtype}")
    if np.any(sizes < 0):
        raise ValueError("sizes must be non-negative")
    if sizes.ndim != 2 or sizes.shape[0] != padded.shape[0] or sizes.shape[1] != padded.ndim - 1:
        raise ValueError(f"sizes must have shape ({padded.shape[0]}, {padded.ndim - 1}) for padded of "
                         f"shape {padded.shape}, got {sizes.shape}")
    if len(sizes) and np.any(sizes > np.array(padded.shape[1:])):
        raise ValueError(f"sizes exceed the padded shape {padded.shape[1:]}")
    if not len(sizes):     # no components: keep the component ndim (padded's dims but the first)
        return NestedArray(np.empty(0, padded.dtype), np.zeros((0, padded.ndim - 1), np.int64))
    comps = [padded[(i,) + tuple(slice(0, int(s)) for s in row)] for i, row in enumerate(sizes)]
    return nested_array(comps, dtype=padded.dtype)
