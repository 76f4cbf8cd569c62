"""Layer norm and RMSNorm on device buffers, through cuDNN's graph API.

Each call is one NORM_FORWARD or NORM_BACKWARD node (`cudnn_bind.graph`):
x is seen as rows of ``prod(normalized_shape)`` values, described to cuDNN
as (rows, cols, 1, 1); the statistics are float32, one per row.  The plan of
a call signature (rows, cols, dtypes, bias or not, device) is built once
and cached in the library; a signature cuDNN has no engine for raises
`UnsupportedError` (rule "graph_engine") and is remembered, so the next
such call raises at once.  An input whose address is not 16-byte aligned (a
view into a larger buffer) reaches the graph as an aligned copy queued on
the call's stream: cuDNN's kernels fault on other addresses.

Streams, devices and the arrays' kinds work as for batch norm
(`cudnn_bind.batch_norm`): outputs are of x's kind, allocated for the
call's stream.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any, Optional, Sequence

from cudnn_bind import _lib
from cudnn_bind import graph as G
from cudnn_bind._args import integers, real
from cudnn_bind._typing import DeviceArrayLike, Ints, Real, StreamLike
from cudnn_bind.batch_norm import (
    _enter_device, _gather, _handle, _leave_device, _start, _stream_and_x)
from cudnn_bind.errors import CudnnError, UnsupportedError
from cudnn_bind.handles import Handle, cached_handle
from cudnn_bind.memory import DTYPE_SIZES, as_view, c_strides, new_arrays, scratch
from cudnn_bind.rules import packed

__all__ = ["layer_norm_forward", "layer_norm_backward", "rms_norm_forward", "rms_norm_backward"]

# the tensors' unique ids in a graph (any distinct numbers do)
UID = {"x": 1, "y": 2, "scale": 3, "bias": 4, "epsilon": 5, "mean": 6, "inv_variance": 7,
       "dy": 8, "dx": 9, "dscale": 10, "dbias": 11}
_DATA = ("float32", "float16", "bfloat16")
# cuDNN graphs hold at most what fits its int64 dims; x must also fit its int32 kernels' indexing
_MAX_ELEMENTS = 2 ** 31 - 1


def _rows_cols(xv: Any, normalized_shape: Any) -> tuple[int, int, tuple[int, ...]]:
    norm = integers(normalized_shape, "normalized_shape", 1) if not isinstance(
        normalized_shape, int) else integers([normalized_shape], "normalized_shape", 1)
    k = len(norm)
    if k == 0 or k > xv.ndim or tuple(xv.shape[xv.ndim - k:]) != tuple(norm):
        raise ValueError(f"normalized_shape {tuple(norm)} must be the trailing dimensions of x, "
                         f"got x of shape {xv.shape}")
    cols = math.prod(norm)
    rows = math.prod(xv.shape[:xv.ndim - k])
    return rows, cols, xv.shape[:xv.ndim - k] + (1,) * k


def _check_x(xv: Any) -> None:
    if xv.dtype not in _DATA:
        raise TypeError(f"x must be float32, float16 or bfloat16 (cuDNN's norm engines), "
                        f"got {xv.dtype}")
    if xv.size == 0:
        raise ValueError(f"x must not be empty (cuDNN has no empty tensors), got shape {xv.shape}")
    if xv.size > _MAX_ELEMENTS:
        raise ValueError(f"x must have fewer than 2**31 elements, got {xv.size}")
    if not packed(xv.shape, xv.strides, range(xv.ndim - 1, -1, -1)):
        raise ValueError(f"x must be contiguous (C order), got strides {xv.strides} (elements)")


def _check_like(v: Any, xv: Any, name: str) -> None:
    if v.dtype != xv.dtype:
        raise TypeError(f"{name} must have x's dtype {xv.dtype}, got {v.dtype}")
    if v.shape != xv.shape:
        raise ValueError(f"{name} must have x's shape {xv.shape}, got {v.shape}")
    if not packed(v.shape, v.strides, range(v.ndim - 1, -1, -1)):
        raise ValueError(f"{name} must be contiguous (C order), got strides {v.strides} (elements)")


def _check_vector(v: Any, name: str, count: int, dtypes: Sequence[str]) -> None:
    if v.dtype not in dtypes:
        raise TypeError(f"{name} must be {' or '.join(dict.fromkeys(dtypes))}, got {v.dtype}")
    if v.size != count:
        raise ValueError(f"{name} must have {count} elements, got shape {v.shape}")
    if not packed(v.shape, v.strides, range(v.ndim - 1, -1, -1)):
        raise ValueError(f"{name} must be contiguous, got strides {v.strides} (elements)")


def _param(obj: Any, name: str, xv: Any, cols: int, lib: Any, st: int) -> Any:
    """The view of weight or bias: cols elements of x's dtype or float32."""
    v = as_view(obj, name, lib, st)
    _check_vector(v, name, cols, (xv.dtype, "float32"))
    return v


def _stats(obj: Any, name: str, rows: int, lib: Any, st: int) -> Any:
    v = as_view(obj, name, lib, st)
    _check_vector(v, name, rows, ("float32",))
    return v


# x's machine epsilons, written out: NumPy 2.5's finfo refuses ml_dtypes' bfloat16
_MACHINE_EPS = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}


def _eps(eps: Optional[Real], dtype: str) -> float:
    """eps as a float; None is x's machine epsilon (PyTorch's rms_norm default)."""
    if eps is None:
        return _MACHINE_EPS[dtype]
    value = real(eps, "eps")
    if not value >= 0.0:
        raise ValueError(f"eps must be >= 0, got {value}")
    return value


def _x_and_stream(x: Any, stream: StreamLike, lib: Any) -> tuple[int, Any]:
    st, xv = _stream_and_x(stream, x, lib)
    _check_x(xv)
    return st, xv


def _aligned(views: Sequence[Any], kind: str, device: int, st: int,
             lib: Any) -> tuple[list[Optional[int]], list[Any]]:
    """The addresses a graph gets for `views` (None stays None): a view's
    own where it is G.ALIGNMENT-aligned, else that of a copy queued on `st`;
    and the copies' owners, to keep until the graph is queued."""
    ptrs: list[Optional[int]] = []
    owners = []
    for v in views:
        if v is None or v.ptr % G.ALIGNMENT == 0:
            ptrs.append(None if v is None else v.ptr)
            continue
        nbytes = v.size * DTYPE_SIZES[v.dtype]   # the views are contiguous (checked)
        ptr, owner = scratch(kind, device, st, nbytes, lib)
        lib.cuda("cudaMemcpyAsync", ctypes.c_void_p(ptr), ctypes.c_void_p(v.ptr), nbytes,
                 _lib.CUDA_MEMCPY_DEVICE_TO_DEVICE, ctypes.c_void_p(st or None))
        ptrs.append(ptr)
        owners.append(owner)
    return ptrs, owners


def _graph(lib: Any, h: Handle, key: tuple[Any, ...], build: Any) -> G.Graph:
    """The cached plan of `key` on h's device; built by build() on first
    use.  A signature without an engine raises its UnsupportedError again."""
    key = key + (h.device,)
    found = lib.graphs.get(key)
    if found is None:
        reason = G.graph_unavailable(lib)
        if reason:
            raise UnsupportedError("graph_engine", f"no graph API: {reason}")
        try:
            found = build()
        except UnsupportedError as exc:
            found = exc
        except CudnnError as exc:  # a node cuDNN will not finalize: no engine either
            found = UnsupportedError("graph_engine", f"cuDNN refuses this graph: {exc}")
        lib.graphs[key] = found
    if isinstance(found, UnsupportedError):
        raise UnsupportedError(found.rule, str(found))
    return found


def _geometry(rows: int, cols: int) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """(dims, strides) of x (rows, cols, 1, 1), of the weight (1, cols, 1, 1)
    and of the per-row statistics (rows, 1, 1, 1), as the graph gets them."""
    return (((rows, cols, 1, 1), (cols, 1, cols, cols)),
            ((1, cols, 1, 1), (cols, 1, cols, cols)),
            ((rows, 1, 1, 1), (1, 1, 1, 1)))


def _forward_graph(lib: Any, h: Handle, mode: int, rows: int, cols: int, dtype: str,
                   wdtype: str, bdtype: Optional[str], training: bool) -> G.Graph:
    what = "layer norm" if mode == G.LAYER_NORM else "RMS norm"

    def build() -> G.Graph:
        (xs, xst), (ps, pst), (ss, sst) = _geometry(rows, cols)
        t = {"x": G.tensor(lib, UID["x"], dtype, xs, xst),
             "y": G.tensor(lib, UID["y"], dtype, xs, xst),
             "scale": G.tensor(lib, UID["scale"], wdtype, ps, pst),
             "epsilon": G.tensor(lib, UID["epsilon"], "float32", (1, 1, 1, 1), (1, 1, 1, 1),
                                 by_value=True)}
        if bdtype is not None:
            t["bias"] = G.tensor(lib, UID["bias"], bdtype, ps, pst)
        if training:
            if mode == G.LAYER_NORM:
                t["mean"] = G.tensor(lib, UID["mean"], "float32", ss, sst)
            t["inv_variance"] = G.tensor(lib, UID["inv_variance"], "float32", ss, sst)
        op = G.norm_forward(lib, mode, training, t)
        return G.build_graph(lib, h.ptr, [op], [d.uid for d in t.values()],
                             f"{what} forward ({dtype} x of {rows} rows of {cols}, "
                             f"{wdtype} weight)")

    return _graph(lib, h, ("fwd", mode, rows, cols, dtype, wdtype, bdtype, training), build)


def _backward_graph(lib: Any, h: Handle, mode: int, rows: int, cols: int, dtype: str,
                    wdtype: str, with_dbias: bool) -> G.Graph:
    what = "layer norm" if mode == G.LAYER_NORM else "RMS norm"

    def build() -> G.Graph:
        (xs, xst), (ps, pst), (ss, sst) = _geometry(rows, cols)
        t = {"x": G.tensor(lib, UID["x"], dtype, xs, xst),
             "dy": G.tensor(lib, UID["dy"], dtype, xs, xst),
             "scale": G.tensor(lib, UID["scale"], wdtype, ps, pst)}
        if mode == G.LAYER_NORM:
            t["mean"] = G.tensor(lib, UID["mean"], "float32", ss, sst)
        t["inv_variance"] = G.tensor(lib, UID["inv_variance"], "float32", ss, sst)
        t["dx"] = G.tensor(lib, UID["dx"], dtype, xs, xst)
        t["dscale"] = G.tensor(lib, UID["dscale"], wdtype, ps, pst)
        if with_dbias:
            t["dbias"] = G.tensor(lib, UID["dbias"], wdtype, ps, pst)
        op = G.norm_backward(lib, mode, t)
        return G.build_graph(lib, h.ptr, [op], [d.uid for d in t.values()],
                             f"{what} backward ({dtype} x of {rows} rows of {cols}, "
                             f"{wdtype} weight)")

    return _graph(lib, h, ("bwd", mode, rows, cols, dtype, wdtype, with_dbias), build)


def _norm_forward(mode: int, x: Any, normalized_shape: Any, weight: Any, bias: Any,
                  eps: Optional[Real], training: bool, handle: Optional[Handle],
                  stream: StreamLike) -> tuple[Any, ...]:
    lib = _lib.get()
    st, xv = _x_and_stream(x, stream, lib)
    rows, cols, stat_shape = _rows_cols(xv, normalized_shape)
    e = _eps(eps, xv.dtype)
    if weight is None:
        raise ValueError("weight is required (cuDNN's norm nodes always scale)")
    wv = _param(weight, "weight", xv, cols, lib, st)
    bv = _param(bias, "bias", xv, cols, lib, st) if bias is not None else None
    if mode == G.LAYER_NORM and bv is None:
        raise ValueError("bias is required for layer norm (cuDNN's layer norm node always "
                         "shifts)")
    device, producers = _gather(("x", "weight", "bias"), (xv, wv, bv), st)
    device, previous = _enter_device(lib, device)
    try:
        h = cached_handle(device, lib) if handle is None else _handle(handle, device, lib)
        g = _forward_graph(lib, h, mode, rows, cols, xv.dtype, wv.dtype,
                           bv.dtype if bv is not None else None, training)
        if st != h._stream or producers:
            _start(h, st, producers)
        (x_ptr, w_ptr, b_ptr), copies = _aligned((xv, wv, bv), xv.kind, device, st, lib)
        specs = [(xv.shape, xv.strides, xv.dtype)]
        if training:
            stat = (stat_shape, c_strides(stat_shape), "float32")
            specs += [stat] * (2 if mode == G.LAYER_NORM else 1)
        arrays, ptrs = new_arrays(xv.kind, device, st, specs, lib)
        # by-value eps: a host float the plan reads at execute
        eps_value = ctypes.c_float(e)
        by_uid = {UID["x"]: x_ptr, UID["y"]: ptrs[0], UID["scale"]: w_ptr,
                  UID["epsilon"]: ctypes.addressof(eps_value), UID["bias"]: b_ptr}
        if training:
            if mode == G.LAYER_NORM:
                by_uid[UID["mean"]], by_uid[UID["inv_variance"]] = ptrs[1], ptrs[2]
            else:
                by_uid[UID["inv_variance"]] = ptrs[1]
        ws = h.workspace(g.workspace, xv.kind, st)
        g.execute(h.ptr, [by_uid[u] for u in g.uids], ws)
        del copies   # their memory is reused only after the graph (stream order)
    finally:
        if previous is not None:
            _leave_device(lib, previous)
    return tuple(arrays)


def _norm_backward(mode: int, dy: Any, x: Any, normalized_shape: Any, mean: Any, invstd: Any,
                   weight: Any, with_dbias: bool, handle: Optional[Handle],
                   stream: StreamLike) -> tuple[Any, ...]:
    lib = _lib.get()
    st, xv = _x_and_stream(x, stream, lib)
    rows, cols, _ = _rows_cols(xv, normalized_shape)
    dyv = as_view(dy, "dy", lib, st)
    _check_like(dyv, xv, "dy")
    if weight is None:
        raise ValueError("weight is required (cuDNN's norm nodes always scale)")
    wv = _param(weight, "weight", xv, cols, lib, st)
    mv = _stats(mean, "mean", rows, lib, st) if mode == G.LAYER_NORM else None
    iv = _stats(invstd, "invstd", rows, lib, st)
    device, producers = _gather(("x", "dy", "weight", "mean", "invstd"),
                                (xv, dyv, wv, mv, iv), st)
    device, previous = _enter_device(lib, device)
    try:
        h = cached_handle(device, lib) if handle is None else _handle(handle, device, lib)
        g = _backward_graph(lib, h, mode, rows, cols, xv.dtype, wv.dtype, with_dbias)
        if st != h._stream or producers:
            _start(h, st, producers)
        (x_ptr, dy_ptr, w_ptr, m_ptr, i_ptr), copies = _aligned((xv, dyv, wv, mv, iv), xv.kind,
                                                                device, st, lib)
        pspec = ((cols,), (1,), wv.dtype)
        specs = [(xv.shape, xv.strides, xv.dtype), pspec] + ([pspec] if with_dbias else [])
        arrays, ptrs = new_arrays(xv.kind, device, st, specs, lib)
        by_uid = {UID["x"]: x_ptr, UID["dy"]: dy_ptr, UID["scale"]: w_ptr,
                  UID["inv_variance"]: i_ptr, UID["dx"]: ptrs[0], UID["dscale"]: ptrs[1]}
        if mv is not None:
            by_uid[UID["mean"]] = m_ptr
        if with_dbias:
            by_uid[UID["dbias"]] = ptrs[2]
        ws = h.workspace(g.workspace, xv.kind, st)
        g.execute(h.ptr, [by_uid[u] for u in g.uids], ws)
        del copies   # their memory is reused only after the graph (stream order)
    finally:
        if previous is not None:
            _leave_device(lib, previous)
    return tuple(arrays)


def layer_norm_forward(x: DeviceArrayLike, normalized_shape: Ints, weight: DeviceArrayLike,
                       bias: DeviceArrayLike, eps: Real = 1e-5, *, training: bool = True,
                       handle: Optional[Handle] = None,
                       stream: StreamLike = None) -> tuple[Any, ...]:
    """Layer norm over x's trailing `normalized_shape` (cuDNN's LAYER_NORM node).

    y = (x - mean) * invstd * weight + bias, with mean and the biased
    variance of each row of ``prod(normalized_shape)`` values: PyTorch's
    ``native_layer_norm``.

    Parameters
    ----------
    x : device array
        float32, float16 or bfloat16, contiguous (C order), not empty,
        fewer than 2**31 elements: a CuPy array, a PyTorch CUDA tensor, a
        `DeviceArray`, or any object with ``__cuda_array_interface__`` or
        DLPack.
    normalized_shape : int or sequence of int
        x's trailing dimensions to normalize over.
    weight, bias : device array
        ``prod(normalized_shape)`` elements each, contiguous, of x's dtype
        or float32, on x's device.  Both are required (cuDNN's node always
        scales and shifts).
    eps : float, optional
        Added to the variance (default 1e-5), >= 0.
    training : bool, optional
        True (the default) also returns the statistics backward needs;
        False runs cuDNN's inference phase and returns y alone (a 1-tuple).
    handle : Handle, optional
        As for `batch_norm_forward_training`.
    stream : int or stream object, optional
        As for `batch_norm_forward_training`.

    Returns
    -------
    y : device array
        x's shape and dtype, of x's kind.
    mean, invstd : device array
        Training only: float32, x's leading shape with the normalized
        dimensions as 1 (PyTorch's shape), 1 / sqrt(var + eps) for invstd.

    Raises
    ------
    TypeError
        If an array is not a device array or has a wrong dtype.
    ValueError
        If a shape, layout or device is wrong, x is empty, weight or bias
        is missing, or eps is negative.
    UnsupportedError
        A ValueError: cuDNN has no engine for this signature (rule
        "graph_engine"), or the loaded cuDNN has no graph API.
    CudnnUnavailableError, CudnnError, CudaError
        As for batch norm.
    """
    return _norm_forward(G.LAYER_NORM, x, normalized_shape, weight, bias, eps, bool(training),
                         handle, stream)


def layer_norm_backward(dy: DeviceArrayLike, x: DeviceArrayLike, normalized_shape: Ints,
                        mean: DeviceArrayLike, invstd: DeviceArrayLike,
                        weight: DeviceArrayLike, *, handle: Optional[Handle] = None,
                        stream: StreamLike = None) -> tuple[Any, Any, Any]:
    """The gradients of `layer_norm_forward` (cuDNN's LAYER_NORM backward node).

    Parameters
    ----------
    dy : device array
        The gradient of y: x's shape and dtype, contiguous.
    x : device array
        The forward's input.
    normalized_shape : int or sequence of int
        As in the forward.
    mean, invstd : device array
        The forward's saved statistics: float32, one per row, contiguous.
    weight : device array
        The forward's weight.
    handle : Handle, optional
        As for the forward.
    stream : int or stream object, optional
        As for the forward.

    Returns
    -------
    dx : device array
        x's shape and dtype.
    dweight, dbias : device array
        (prod(normalized_shape),), weight's dtype.

    Raises
    ------
    TypeError, ValueError, UnsupportedError, CudnnUnavailableError, CudnnError, CudaError
        As for the forward.
    """
    return _norm_backward(G.LAYER_NORM, dy, x, normalized_shape, mean, invstd, weight,
                          True, handle, stream)


def rms_norm_forward(x: DeviceArrayLike, normalized_shape: Ints, weight: DeviceArrayLike,
                     eps: Optional[Real] = None, *, bias: Optional[DeviceArrayLike] = None,
                     training: bool = True, handle: Optional[Handle] = None,
                     stream: StreamLike = None) -> tuple[Any, ...]:
    """RMSNorm over x's trailing `normalized_shape` (cuDNN's RMS_NORM node).

    y = x * invstd * weight (+ bias), invstd = 1 / sqrt(mean(x**2) + eps)
    per row: PyTorch's ``rms_norm`` (which has no bias).

    Parameters
    ----------
    x : device array
        As for `layer_norm_forward`.
    normalized_shape : int or sequence of int
        x's trailing dimensions to normalize over.
    weight : device array
        ``prod(normalized_shape)`` elements, contiguous, x's dtype or
        float32.  Required.
    eps : float, optional
        None (the default) is the machine epsilon of x's dtype, as in
        PyTorch; else >= 0.
    bias : device array, optional
        As weight; None (the default) for none.
    training : bool, optional
        True (the default) also returns invstd; False returns (y,).
    handle : Handle, optional
        As for `layer_norm_forward`.
    stream : int or stream object, optional
        As for `layer_norm_forward`.

    Returns
    -------
    y : device array
        x's shape and dtype.
    invstd : device array
        Training only: float32, x's leading shape with the normalized
        dimensions as 1.

    Raises
    ------
    TypeError, ValueError, UnsupportedError, CudnnUnavailableError, CudnnError, CudaError
        As for `layer_norm_forward`.
    """
    return _norm_forward(G.RMS_NORM, x, normalized_shape, weight, bias, eps, bool(training),
                         handle, stream)


def rms_norm_backward(dy: DeviceArrayLike, x: DeviceArrayLike, normalized_shape: Ints,
                      invstd: DeviceArrayLike, weight: DeviceArrayLike, *,
                      with_dbias: bool = False, handle: Optional[Handle] = None,
                      stream: StreamLike = None) -> tuple[Any, ...]:
    """The gradients of `rms_norm_forward` (cuDNN's RMS_NORM backward node).

    Parameters
    ----------
    dy, x : device array
        As for `layer_norm_backward`.
    normalized_shape : int or sequence of int
        As in the forward.
    invstd : device array
        The forward's saved statistic.
    weight : device array
        The forward's weight.
    with_dbias : bool, optional
        Also return the bias gradient (default False; for a forward with
        bias).
    handle : Handle, optional
        As for the forward.
    stream : int or stream object, optional
        As for the forward.

    Returns
    -------
    dx : device array
        x's shape and dtype.
    dweight : device array
        (prod(normalized_shape),), weight's dtype.
    dbias : device array
        As dweight, only with ``with_dbias=True``.

    Raises
    ------
    TypeError, ValueError, UnsupportedError, CudnnUnavailableError, CudnnError, CudaError
        As for `layer_norm_forward`.
    """
    return _norm_backward(G.RMS_NORM, dy, x, normalized_shape, None, invstd, weight,
                          bool(with_dbias), handle, stream)
