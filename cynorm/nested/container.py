"""NestedArray: a batch of arrays of one dtype and ndim whose shapes differ,
stored back to back in one contiguous 1-D buffer, without padding.

Component i is buffer[offsets[i] : offsets[i] + prod(sizes[i])] in C order,
of shape sizes[i].  In nested coordinates dim 0 indexes the components and
dim d >= 1 is the components' dim d - 1, as in PyTorch's nested tensors.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np
from numpy.typing import NDArray

from cynorm._dtypes import SUPPORTED_NAMES, policy_of
from cynorm._typing import Array, ArrayLike, DTypeLike, Real
from cynorm._validation import (as_array, as_dtype, as_float_array, dlpack_array, int_tuple,
                                is_dlpack, real_number)


class NestedArray:
    """A variable-shape batch of arrays in one contiguous buffer.

    The components, of one dtype and ndim but of different shapes, lie back
    to back in order in `buffer` (1-D, contiguous), without padding;
    `sizes` (int64, ntensors x component ndim) holds their shapes and
    `offsets` (int64, ntensors) where each starts.

    Construct with `nested_array(list_of_arrays)` or `from_padded(padded,
    sizes)`; ``NestedArray(buffer, sizes)`` wraps an existing buffer (no
    copy) whose components lie back to back in order.

    Parameters
    ----------
    buffer : numpy.ndarray
        The components' elements, each in C order, one after the other: a
        1-D C-contiguous array of float64, float32, bfloat16 or float16.
        It is wrapped, not copied.
    sizes : array_like of int
        The components' shapes, one row each: shape (ntensors, component
        ndim).  Copied as int64 and made read-only.

    Raises
    ------
    TypeError
        If buffer is not a NumPy array or its dtype is not one of the
        floating dtypes above, or sizes cannot be converted to an array.
    ValueError
        If buffer is not 1-D and contiguous, sizes is not a 2-D integer
        array, has a negative entry, describes a component of 2**63
        elements or more, or describes another number of elements than
        buffer holds.

    See Also
    --------
    nested_array : A NestedArray holding copies of a list of arrays.
    from_padded : A NestedArray of the leading corners of a padded array.
    """

    # _derived: values computed from the structure alone (the row table of
    # nested._common, layer norm's row count), shared by the arrays like()
    # makes, as the structure is
    __slots__ = ("_buffer", "_sizes", "_offsets", "_numels", "_derived")

    def __init__(self, buffer: Array, sizes: ArrayLike) -> None:
        buffer = _check_buffer(buffer)
        sizes = as_array(sizes, "sizes")
        if sizes.ndim != 2 or (sizes.size and sizes.dtype.kind not in "iu"):
            raise ValueError(f"sizes must be a 2-D integer array (ntensors x component ndim), "
                             f"got shape {sizes.shape} dtype {sizes.dtype}")
        sizes = sizes.astype(np.int64)
        if sizes.size:
            if sizes.min() < 0:
                raise ValueError("sizes must be non-negative")
            # int64 products would wrap
            if np.multiply.reduce(sizes, axis=1, dtype=np.float64).max() >= 2.0**63:
                raise ValueError("sizes describe a component of 2**63 elements or more")
        structure = _structure(sizes, np.multiply.reduce(sizes, axis=1, dtype=np.int64))
        _check_count(_element_count(structure), buffer)
        self._buffer = buffer
        self._sizes, self._offsets, self._numels, self._derived = structure

    # ------------------------------------------------------------ properties
    @property
    def buffer(self) -> Array:
        """The 1-D contiguous array holding every component, back to back.

        The array itself, not a copy: writing into it changes the
        components.
        """
        return self._buffer

    @property
    def sizes(self) -> NDArray[np.int64]:
        """The components' shapes: int64 (ntensors, component ndim), read-only."""
        return self._sizes

    @property
    def offsets(self) -> NDArray[np.int64]:
        """The int64 start of each component in the buffer, read-only."""
        return self._offsets

    @property
    def numels(self) -> NDArray[np.int64]:
        """The number of elements of each component: int64 (ntensors,), read-only."""
        return self._numels

    @property
    def dtype(self) -> np.dtype[Any]:
        """The components' dtype: the buffer's."""
        return self._buffer.dtype

    @property
    def ndim(self) -> int:
        """Component ndim + 1: dim 0 indexes the components."""
        return self._sizes.shape[1] + 1

    def __len__(self) -> int:
        """The number of components.

        Returns
        -------
        int
            The number of components (ntensors): the rows of `sizes`.
        """
        return self._sizes.shape[0]

    def component_shape(self, i: int) -> tuple[int, ...]:
        """The shape of component i.

        Parameters
        ----------
        i : int
            The component's index; negative counts from the end.

        Returns
        -------
        tuple of int
            Its shape: row i of `sizes`.

        Raises
        ------
        IndexError
            If i is out of range.
        """
        return tuple(int(s) for s in self._sizes[i])

    def __getitem__(self, i: Union[int, np.integer[Any]]) -> Array:
        """Component i as a view into the buffer.

        Parameters
        ----------
        i : int
            The component's index; negative counts from the end.

        Returns
        -------
        numpy.ndarray
            Component i, of shape ``component_shape(i)`` and the buffer's
            dtype: a view, writing into it writes into the buffer.

        Raises
        ------
        TypeError
            If i is not an int (bools are refused).
        IndexError
            If i is out of range.
        """
        n = len(self)
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"NestedArray index must be an int, got {type(i).__name__}")
        if not -n <= i < n:
            raise IndexError(f"component index {i} out of range for {n} components")
        i = int(i) % n
        start = int(self._offsets[i])
        return self._buffer[start:start + int(self._numels[i])].reshape(self.component_shape(i))

    def unbind(self) -> list[Array]:
        """The components as a list of views into the buffer.

        Returns
        -------
        list of numpy.ndarray
            Component i at index i, as ``self[i]`` gives it.
        """
        return [self[i] for i in range(len(self))]

    def __iter__(self) -> Iterator[Array]:
        """Iterate over the components, as views into the buffer.

        Returns
        -------
        iterator of numpy.ndarray
            The components in order, as `unbind` lists them.
        """
        return iter(self.unbind())

    def max_sizes(self) -> tuple[int, ...]:
        """The largest size along each component dim.

        Returns
        -------
        tuple of int
            One entry per component dim: the largest size any component
            has there (0 for no components).
        """
        return tuple(int(s) for s in self._sizes.max(axis=0)) if len(self) else (0,) * (self.ndim - 1)

    def uniform_size(self, cdim: int) -> Optional[int]:
        """Component dim cdim's size if every component has the same one.

        Parameters
        ----------
        cdim : int
            A component dim (not a nested one: 0 is the components' first
            dim); negative counts from the end.

        Returns
        -------
        int or None
            The size all components share along cdim (0 when there are no
            components), or None when they differ.

        Raises
        ------
        IndexError
            If cdim is out of range.
        """
        col = self._sizes[:, cdim]
        return int(col[0]) if len(col) and np.all(col == col[0]) else (0 if not len(col) else None)

    def to_padded(self, fill: Real = 0.0,
                  output_size: Optional[Sequence[int]] = None) -> Array:
        """The components in a dense array, padded with `fill`.

        Parameters
        ----------
        fill : float, optional
            The value of the padding (default 0.0).
        output_size : sequence of int, optional
            The full shape of the result, ntensors first: at least
            ``(ntensors, *max_sizes())`` in every dim, and may be larger than
            needed.
            By default that smallest shape.

        Returns
        -------
        numpy.ndarray
            A new ``(ntensors, *max_sizes())`` array (or of shape output_size) in
            the components' dtype: component i in the leading corner of slot
            i, `fill` elsewhere.

        Raises
        ------
        TypeError
            If fill is not a real number (bools are refused), or output_size
            is not a sequence of ints (bools are refused).
        ValueError
            If fill is an int too large for a float, or output_size has
            another number of dims or is smaller than needed in one.
        """
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

    def like(self, buffer: Array) -> NestedArray:
        """A NestedArray with this one's structure around `buffer`.

        Parameters
        ----------
        buffer : numpy.ndarray
            A 1-D contiguous array of as many elements as this one's buffer,
            of a floating dtype (it may differ from this one's); wrapped,
            not copied.

        Returns
        -------
        NestedArray
            The elements of buffer with this array's component shapes.

        Raises
        ------
        TypeError
            If buffer is not a NumPy array of a supported floating dtype.
        ValueError
            If buffer is not 1-D and contiguous, or holds another number of
            elements.
        """
        buffer = _check_buffer(buffer)
        _check_count(self._buffer.size, buffer)
        # the structure is this one's, checked when it was made: shared, as
        # its arrays are read-only
        return _wrap(buffer, (self._sizes, self._offsets, self._numels, self._derived))

    def _derived_value(self, key: object, compute: Callable[[], Any]) -> Any:
        """compute(): a value of the structure alone, computed once per
        structure and kept with it (the arrays like() makes share it)."""
        try:
            return self._derived[key]
        except KeyError:
            value = self._derived[key] = compute()
            return value

    def _last_dim_as(self, n: Optional[int]) -> _Structure:
        """This structure with every component's last dim set to n (None:
        the last dim dropped), as the ops whose result changes only that
        dim make it: computed once per (structure, n), so repeated calls
        share it and what is derived from it.  Not checked again: a
        structure derived from a checked one, n the size of an array the
        caller holds."""
        def derive() -> _Structure:
            if n is not None and np.all(self._sizes[:, -1] == n):
                return self._sizes, self._offsets, self._numels, self._derived
            sizes = self._sizes[:, :-1].copy() if n is None else self._sizes.copy()
            if n is not None:
                sizes[:, -1] = n
            return _structure(sizes, np.multiply.reduce(sizes, axis=1, dtype=np.int64))
        return self._derived_value(("last dim as", n), derive)

    def same_structure(self, other: object) -> bool:
        """Whether other is a NestedArray of the same component shapes.

        Parameters
        ----------
        other : object
            What to compare with.

        Returns
        -------
        bool
            True if other is a NestedArray whose `sizes` equal this one's
            (dtypes are not compared).
        """
        return isinstance(other, NestedArray) and (self._sizes is other._sizes
                                                   or np.array_equal(self._sizes, other._sizes))

    def __repr__(self):
        shapes = [self.component_shape(i) for i in range(min(len(self), 4))]
        more = ", ..." if len(self) > 4 else ""
        return (f"NestedArray(ntensors={len(self)}, dtype={self.dtype}, "
                f"shapes=[{', '.join(map(str, shapes))}{more}])")


def _check_buffer(buffer: object) -> Array:
    """A NestedArray's buffer: a 1-D C-contiguous array of a supported dtype
    (a DLPack tensor's memory, read in place, included); returns it as an
    ndarray."""
    if is_dlpack(buffer):
        buffer = dlpack_array(buffer, "buffer")
    if not isinstance(buffer, np.ndarray):
        raise TypeError(f"buffer must be a NumPy array or a DLPack tensor, got "
                        f"{type(buffer).__name__}")
    if buffer.ndim != 1 or not buffer.flags.c_contiguous:
        raise ValueError(f"buffer must be a contiguous 1-D array, got shape {buffer.shape}"
                         + ("" if buffer.flags.c_contiguous else " (not contiguous)"))
    if policy_of(buffer.dtype) is None:
        raise TypeError(f"buffer must have a floating dtype "
                        f"({SUPPORTED_NAMES}), got {buffer.dtype}")
    return buffer


def _check_count(described: int, buffer: Array) -> None:
    if described != buffer.size:
        raise ValueError(f"sizes describe {described} elements but buffer holds {buffer.size}")


# (sizes, offsets, numels, derived) of a checked structure
_Structure = tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64], dict[object, Any]]


def _wrap(buffer: Array, structure: _Structure) -> NestedArray:
    """A NestedArray of `structure` around `buffer`, neither checked: for
    buffers the caller made to fit a structure that was checked (or derived
    from one)."""
    new = object.__new__(NestedArray)
    new._buffer = buffer
    new._sizes, new._offsets, new._numels, new._derived = structure
    return new


def _structure(sizes: NDArray[np.int64], numels: NDArray[np.int64]) -> _Structure:
    """The structure of components of shapes `sizes` (numels their element
    counts), back to back: its arrays made read-only, nothing derived yet."""
    offsets = np.cumsum(numels) - numels
    for a in (sizes, numels, offsets):
        a.setflags(write=False)
    return sizes, offsets, numels, {}


def _element_count(structure: _Structure) -> int:
    _, offsets, numels, _ = structure
    return int(offsets[-1] + numels[-1]) if len(numels) else 0


def wrap_checked(buffer: Array, structure: _Structure) -> NestedArray:
    """`_wrap` after the cheap checks of buffer: its type, layout, dtype and
    element count."""
    buffer = _check_buffer(buffer)
    _check_count(_element_count(structure), buffer)
    return _wrap(buffer, structure)


def _native(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """dtype in native byte order (NestedArray buffers are native)."""
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def nested_array(arrays: Sequence[ArrayLike], dtype: Optional[DTypeLike] = None) -> NestedArray:
    """A NestedArray holding copies of `arrays`.

    Parameters
    ----------
    arrays : list or tuple of array_like
        The components, all of one ndim, in order.  Their dtypes must agree
        unless `dtype` is given (non-native byte order counts as native).
    dtype : data-type, optional
        The NestedArray's dtype, the arrays converted to it: float64,
        float32, bfloat16 or float16.  By default the arrays' common dtype,
        or float64 when that is an integer or bool dtype, or when there are
        no arrays.

    Returns
    -------
    NestedArray
        Copies of the arrays, in native byte order, one component each (no
        arrays: no components, 0-d component ndim).

    Raises
    ------
    TypeError
        If arrays is not a list or tuple (a NumPy array is refused), an
        entry cannot be converted to an array, dtype is not a dtype, the
        arrays' dtypes differ and dtype is not given, or the resulting dtype
        is not one of the floating dtypes above.
    ValueError
        If the arrays differ in ndim, or an entry cannot be converted to an
        array (a ragged nested list, ...).

    See Also
    --------
    from_padded : A NestedArray of the leading corners of a padded array.
    """
    if isinstance(arrays, np.ndarray) or not isinstance(arrays, (list, tuple)):
        raise TypeError(f"arrays must be a list or tuple of arrays, got {type(arrays).__name__}")
    comps = [as_array(a, f"arrays[{i}]") for i, a in enumerate(arrays)]
    what = "dtype"
    dt: np.dtype[Any]      # the buffer's dtype
    if dtype is not None:
        dt = _native(as_dtype(dtype, "dtype"))
    elif comps:
        # non-native byte order is converted, as every op converts its inputs
        dtypes = {_native(c.dtype) for c in comps}
        if len(dtypes) > 1:
            raise TypeError(f"the arrays have different dtypes ({', '.join(sorted(map(str, dtypes)))}); "
                            "pass dtype= to convert them")
        dt, what = _native(comps[0].dtype), "the arrays' dtype"
        if dt.kind in "iub":
            dt = np.dtype(np.float64)
    else:
        dt = np.dtype(np.float64)
    ndims = {c.ndim for c in comps}
    if len(ndims) > 1:
        raise ValueError(f"the arrays must all have the same ndim, got ndims {sorted(ndims)}")
    ndim = ndims.pop() if ndims else 0
    if policy_of(dt) is None:
        raise TypeError(f"{what} must be floating ({SUPPORTED_NAMES}), got {dt}")
    # the structure of arrays that exist needs none of NestedArray's checks
    structure = _structure(np.array([c.shape for c in comps], dtype=np.int64).reshape(len(comps), ndim),
                           np.array([c.size for c in comps], dtype=np.int64))
    buffer = (np.concatenate([c.reshape(-1) for c in comps], dtype=dt, casting="unsafe")
              if comps else np.empty(0, dt))
    return _wrap(buffer, structure)


def from_padded(padded: ArrayLike, sizes: ArrayLike) -> NestedArray:
    """A NestedArray of the leading corners of `padded`'s slots.

    Component i is ``padded[i][:sizes[i][0], :sizes[i][1], ...]``: the
    inverse of `NestedArray.to_padded`.

    Parameters
    ----------
    padded : array_like
        The dense batch, slot i along dim 0: float64, float32, bfloat16 or
        float16, at least 1-D.
    sizes : array_like of int
        The components' shapes, one row each: shape (padded.shape[0],
        padded.ndim - 1), each row at most padded.shape[1:].

    Returns
    -------
    NestedArray
        Copies of the corners, in padded's dtype (native byte order); with
        padded.ndim - 1 component dims, also when there are no components.

    Raises
    ------
    TypeError
        If padded is not of a floating dtype above, or sizes does not hold
        integers.
    ValueError
        If padded is 0-d, sizes has a negative entry or the wrong shape, or
        a row of sizes exceeds the padded shape.
    """
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
