"""cuDNN tensor and activation descriptors, and the enums batch norm uses.

A descriptor owns a cuDNN object: it is destroyed by `close()`, by leaving a
`with` block, or when garbage collected.  Tensor descriptors follow ATen's
`TensorDescriptor{t, 4}`: fewer than 4 dimensions are padded with trailing
size-1 dimensions, and size-1 dimensions get the stride a packed tensor of
the same layout would have (cuDNN rejects some layouts otherwise).
"""
from __future__ import annotations

import ctypes
from typing import ClassVar, Optional, Sequence, TypeVar

from cudnn_bind import _lib
from cudnn_bind._args import C_INT_MAX, integer, integers, real, show
from cudnn_bind._typing import DTypeLike, Int, Ints, ModeLike, Real
from cudnn_bind.memory import c_strides, dtype_name

__all__ = ["DATA_FLOAT", "DATA_DOUBLE", "DATA_HALF", "DATA_BFLOAT16", "PER_ACTIVATION",
           "SPATIAL", "SPATIAL_PERSISTENT", "OPS_BN", "OPS_BN_ACTIVATION",
           "OPS_BN_ADD_ACTIVATION", "MODES", "TensorDescriptor", "ActivationDescriptor",
           "derive_bn_descriptor", "padded_geometry", "bn_mode"]

# cudnnDataType_t
DATA_FLOAT, DATA_DOUBLE, DATA_HALF, DATA_BFLOAT16 = 0, 1, 2, 9
DATA_TYPES = {"float32": DATA_FLOAT, "float64": DATA_DOUBLE, "float16": DATA_HALF,
              "bfloat16": DATA_BFLOAT16}
# cudnnBatchNormMode_t
PER_ACTIVATION, SPATIAL, SPATIAL_PERSISTENT = 0, 1, 2
MODES = {"per_activation": PER_ACTIVATION, "spatial": SPATIAL,
         "spatial_persistent": SPATIAL_PERSISTENT}
# cudnnBatchNormOps_t
OPS_BN, OPS_BN_ACTIVATION, OPS_BN_ADD_ACTIVATION = 0, 1, 2
# cudnnActivationMode_t / cudnnNanPropagation_t
ACTIVATION_RELU = 1
NOT_PROPAGATE_NAN = 0

MAX_DIMS = 8


def padded_geometry(shape: Sequence[int], strides: Sequence[int], pad: int = 4,
                    channels_last: bool = False) -> tuple[list[int], list[int]]:
    """(dims, strides) in elements as cuDNN gets them: padded to `pad`
    dimensions with trailing 1s; a size-1 dimension's stride (which may be
    anything, after unsqueeze or slicing) replaced by the product of the
    sizes inside it, visiting the dimensions innermost first in the layout's
    order (C last of all for N,C,..., first for channels-last)."""
    dims = list(shape) + [1] * max(0, pad - len(shape))
    st = list(strides) + [1] * max(0, pad - len(strides))
    nd = len(dims)
    order = list(range(nd - 1, 1, -1))
    order = ([1] + order if channels_last else order + [1]) + [0]
    inner = 1
    for d in order:
        if dims[d] == 1:
            st[d] = inner
        else:
            inner *= dims[d]
    return dims, st


_D = TypeVar("_D", bound="_Descriptor")


class _Descriptor:
    # the cuDNN functions that create and destroy one (set by each subclass)
    _create: ClassVar[str]
    _destroy: ClassVar[str]

    def __init__(self) -> None:
        self._lib = _lib.get()
        self._ptr: Optional[ctypes.c_void_p] = ctypes.c_void_p()
        self._lib.call(self._create, ctypes.byref(self._ptr))

    @property
    def value(self) -> ctypes.c_void_p:
        """The cuDNN descriptor pointer; ValueError when the descriptor is closed."""
        return self.value_of("this descriptor")

    def value_of(self, name: str) -> ctypes.c_void_p:
        """The cuDNN descriptor pointer, for an argument called `name`.

        The real library would dereference a NULL or freed descriptor
        instead of failing, so a closed one is refused here.

        Parameters
        ----------
        name : str
            What to call the descriptor in the error message.

        Returns
        -------
        ctypes.c_void_p
            The descriptor (a ``cudnnTensorDescriptor_t`` or
            ``cudnnActivationDescriptor_t``).

        Raises
        ------
        ValueError
            Naming `name`, if the descriptor is closed.
        """
        if self._ptr is None or not self._ptr.value:
            raise ValueError(f"{name} is a closed {type(self).__name__} (closed by close() or "
                             f"by leaving its with block): create a new one")
        return self._ptr

    def close(self) -> None:
        """Destroy the cuDNN descriptor (calling it again does nothing).

        Raises
        ------
        CudnnError
            If cuDNN's destroy function fails.
        """
        ptr, self._ptr = self._ptr, None
        if ptr is not None and ptr.value:
            self._lib.check(getattr(self._lib.cudnn, self._destroy)(ptr), self._destroy)

    def __enter__(self: _D) -> _D:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


class TensorDescriptor(_Descriptor):
    """cudnnTensorDescriptor_t for a shape, strides (in elements) and dtype name.

    Created empty when `shape` is None (as `derive_bn_descriptor` fills
    one), else described at once by `set` with these arguments (and
    destroyed again if that fails).

    Parameters
    ----------
    shape : sequence of int, optional
        The sizes, each 1 to 2**31 - 1, at most `MAX_DIMS` (8) of them;
        None (the default) leaves the descriptor unset.
    strides : sequence of int, optional
        The strides in elements, one per dimension; None (the default) is
        C order.
    dtype : str, numpy.dtype or torch.dtype, optional
        "float32" (the default), "float64", "float16" or "bfloat16" (a
        cuDNN data type).
    pad : int, optional
        Pad to this many dimensions with trailing size-1 dimensions, 0 to
        8 (default 4, as ATen's ``TensorDescriptor{t, 4}``).
    channels_last : bool, optional
        Whether the layout is channels-last, which orders the strides given
        to size-1 dimensions (default False: N,C,...).

    Raises
    ------
    TypeError
        If an argument has the wrong type (see `set`).
    ValueError
        If an argument is out of range (see `set`).
    CudnnUnavailableError
        If no cuDNN library loads.
    CudnnError
        If cuDNN refuses the description.
    """
    _create = "cudnnCreateTensorDescriptor"
    _destroy = "cudnnDestroyTensorDescriptor"

    def __init__(self, shape: Optional[Ints] = None, strides: Optional[Ints] = None,
                 dtype: DTypeLike = "float32", pad: Int = 4,
                 channels_last: bool = False) -> None:
        super().__init__()
        if shape is not None:
            try:
                self.set(shape, strides, dtype, pad, channels_last)
            except BaseException:
                self.close()
                raise

    def set(self, shape: Ints, strides: Optional[Ints] = None, dtype: DTypeLike = "float32",
            pad: Int = 4, channels_last: bool = False) -> None:
        """Describe a tensor of `shape` and `strides` (cudnnSetTensorNdDescriptor).

        cuDNN takes C ints: every size must be 1 to 2**31 - 1 (cuDNN has no
        empty tensors) and every stride, as `padded_geometry` gives it, 0 to
        2**31 - 1; at most `MAX_DIMS` dimensions.  Fewer than `pad`
        dimensions are padded with trailing size-1 dimensions, and size-1
        dimensions get the stride a packed tensor of the same layout would
        have (cuDNN rejects some layouts otherwise).

        Parameters
        ----------
        shape : sequence of int
            The sizes, each 1 to 2**31 - 1, at most 8 of them.
        strides : sequence of int, optional
            The strides in elements, one per dimension; None (the default)
            is C order.
        dtype : str, numpy.dtype or torch.dtype, optional
            "float32" (the default), "float64", "float16" or "bfloat16".
        pad : int, optional
            Pad to this many dimensions, 0 to 8 (default 4); `shape` and
            `pad` must give at least 2 dimensions (N, C).
        channels_last : bool, optional
            Whether the layout is channels-last (default False: N,C,...).

        Raises
        ------
        TypeError
            If dtype is not a cuDNN data type, or shape, strides or pad are
            not ints.
        ValueError
            If a size, a stride (as padded) or pad is out of range, there
            are more than 8 or fewer than 2 dimensions, strides do not have
            one entry per dimension, or the descriptor is closed.
        CudnnError
            If cudnnSetTensorNdDescriptor fails.
        """
        try:
            name = dtype_name(dtype)
        except TypeError:
            name = None
        if name not in DATA_TYPES:
            raise TypeError(f"dtype must be one of {sorted(DATA_TYPES)} (a cuDNN data type), "
                            f"got {show(dtype)}")
        shape = integers(shape, "shape", 1, C_INT_MAX)
        if len(shape) > MAX_DIMS:
            raise ValueError(f"cuDNN tensors have at most {MAX_DIMS} dimensions, got shape {shape}")
        strides = c_strides(shape) if strides is None else integers(strides, "strides")
        if len(strides) != len(shape):
            raise ValueError(f"strides {show(strides)} must have one entry per dimension of "
                             f"shape {shape}")
        pad = integer(pad, "pad", 0, MAX_DIMS)
        if max(len(shape), pad) < 2:
            raise ValueError(f"shape {shape} with pad={pad} has fewer than 2 dimensions (N, C): "
                             f"give at least 2, or pad to 2 to {MAX_DIMS}")
        dims, st = padded_geometry(shape, strides, pad, channels_last)
        for i, s in enumerate(st):
            if not 0 <= s <= C_INT_MAX:
                raise ValueError(f"strides[{i}] is {show(s)} as cuDNN gets it (shape {tuple(dims)}); "
                                 f"cuDNN takes a C int from 0 to {C_INT_MAX}")
        n = len(dims)
        self._lib.call("cudnnSetTensorNdDescriptor", self.value, DATA_TYPES[name], n,
                       (ctypes.c_int * n)(*dims), (ctypes.c_int * n)(*st))

    def get(self) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        """The description as cuDNN holds it (cudnnGetTensorNdDescriptor).

        Returns
        -------
        tuple of (int, tuple of int, tuple of int)
            The ``cudnnDataType_t`` code (0 float, 1 double, 2 half, 9
            bfloat16), the dims and the strides in elements, padded.

        Raises
        ------
        ValueError
            If the descriptor is closed.
        CudnnError
            If cudnnGetTensorNdDescriptor fails (an unset descriptor).
        """
        dt, nb = ctypes.c_int(), ctypes.c_int()
        dims, st = (ctypes.c_int * MAX_DIMS)(), (ctypes.c_int * MAX_DIMS)()
        self._lib.call("cudnnGetTensorNdDescriptor", self.value, MAX_DIMS, ctypes.byref(dt),
                       ctypes.byref(nb), dims, st)
        return dt.value, tuple(dims[:nb.value]), tuple(st[:nb.value])


class ActivationDescriptor(_Descriptor):
    """cudnnActivationDescriptor_t for ReLU (the only activation batch norm fuses).

    NaNs are not propagated (CUDNN_NOT_PROPAGATE_NAN).

    Parameters
    ----------
    mode : int, optional
        The ``cudnnActivationMode_t``, a C int (default 1,
        CUDNN_ACTIVATION_RELU).
    coef : float, optional
        The activation's coefficient (default 0.0; clipped ReLU's ceiling,
        ELU's alpha), finite.

    Raises
    ------
    TypeError
        If mode is not an int or coef not a real number.
    ValueError
        If mode does not fit a C int or coef is not finite.
    CudnnUnavailableError
        If no cuDNN library loads.
    CudnnError
        If cuDNN refuses the activation.
    """
    _create = "cudnnCreateActivationDescriptor"
    _destroy = "cudnnDestroyActivationDescriptor"

    def __init__(self, mode: Int = ACTIVATION_RELU, coef: Real = 0.0) -> None:
        mode = integer(mode, "mode (a cudnnActivationMode_t: 1 is CUDNN_ACTIVATION_RELU)",
                       -C_INT_MAX - 1, C_INT_MAX)
        coef = real(coef, "coef")
        super().__init__()
        self._lib.call("cudnnSetActivationDescriptor", self.value, mode, NOT_PROPAGATE_NAN, coef)


def bn_mode(mode: ModeLike) -> int:
    """A cudnnBatchNormMode_t from PER_ACTIVATION, SPATIAL, SPATIAL_PERSISTENT
    or their names in MODES; TypeError/ValueError otherwise."""
    expected = f"PER_ACTIVATION, SPATIAL, SPATIAL_PERSISTENT or one of {sorted(MODES)}"
    if isinstance(mode, str):
        if mode.lower() not in MODES:
            raise ValueError(f"mode must be {expected}, got {mode!r}")
        return MODES[mode.lower()]
    try:
        mode = integer(mode, "mode")
    except TypeError:
        raise TypeError(f"mode must be {expected}, got {type(mode).__name__}") from None
    if mode not in MODES.values():
        raise ValueError(f"mode must be {expected}, got {show(mode)}")
    return mode


def derive_bn_descriptor(x_desc: TensorDescriptor, mode: ModeLike) -> TensorDescriptor:
    """The weight/bias/statistics descriptor cuDNN derives from x's for `mode`.

    cudnnDeriveBNTensorDescriptor: (1, C, 1, ...) for the spatial modes,
    (1, C, spatial...) for PER_ACTIVATION.  The real library dereferences a
    NULL x descriptor instead of returning BAD_PARAM, so a closed or missing
    one is refused here first.

    Parameters
    ----------
    x_desc : TensorDescriptor
        The (set) descriptor of x.
    mode : int or str
        ``PER_ACTIVATION``, ``SPATIAL`` or ``SPATIAL_PERSISTENT`` (0, 1, 2),
        or their names "per_activation", "spatial", "spatial_persistent"
        (any case).

    Returns
    -------
    TensorDescriptor
        A new descriptor, in the data type cuDNN uses for the parameters
        (float for float, half and bfloat16 x; double for double).

    Raises
    ------
    TypeError
        If x_desc is not a TensorDescriptor or mode is not an int or str.
    ValueError
        If mode is not one of those above, or x_desc is closed.
    CudnnError
        If cudnnDeriveBNTensorDescriptor fails.
    """
    if not isinstance(x_desc, TensorDescriptor):
        raise TypeError(f"x_desc must be a TensorDescriptor, got {type(x_desc).__name__}")
    mode = bn_mode(mode)
    xd = x_desc.value_of("x_desc")  # raises, naming x_desc, if closed
    derived = TensorDescriptor()
    x_desc._lib.call("cudnnDeriveBNTensorDescriptor", derived.value, xd, mode)
    return derived
