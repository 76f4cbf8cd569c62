"""cuDNN batch normalization on device buffers: ATen's cudnn_batch_norm in Python.

Each call runs on cuDNN's graph API where cuDNN has an engine for it
(`cudnn_bind.batch_norm_graph` builds the graphs and makes the choice), else
on the legacy API (deprecated in cuDNN 9, still supported):
cudnnBatchNormalizationForwardTrainingEx, ...ForwardInference and
...BackwardEx.  Every argument is checked here before either runs: the
real library dereferences some NULL arguments instead of returning an error.

What depends only on a call's signature (x's shape, strides and dtype, the
mode asked for, the fused op) is a `_Plan`, built once per library and
reused: the layout and mode the rules (cudnn_bind.rules) chose (a call the
rules refuse gets no plan: UnsupportedError, naming the rule), the tensor,
derived and activation descriptors, cuDNN's workspace and reserve sizes per
device, and where the outputs go in a pool block.  A repeated call makes only
the CUDA and cuDNN calls that do work: no descriptor, cudaMalloc, cudaFree or
cudaPointerGetAttributes on the steady path, and cuDNN's functions are
called directly, not looked up by name.

Streams: a call runs on `stream=`, else PyTorch's or CuPy's current stream
for their arrays, else the stream x was produced on (a DeviceArray's
`stream`, the "stream" key of `__cuda_array_interface__`), else the legacy
default stream.  Inputs produced on another stream are waited for with an
event; outputs, workspace and reserve are allocated for the call's stream.
"""
from __future__ import annotations

import ctypes
import math
from typing import Optional, Union

from cudnn_bind import _lib
from cudnn_bind._args import integer, real, show, stream_value
from cudnn_bind._typing import DeviceArrayLike, Int, ModeLike, Real, StreamLike
from cudnn_bind.descriptors import (
    OPS_BN, OPS_BN_ACTIVATION, OPS_BN_ADD_ACTIVATION, PER_ACTIVATION, ActivationDescriptor,
    TensorDescriptor, bn_mode, derive_bn_descriptor)
from cudnn_bind.batch_norm_graph import (
    UID, check_backend, graph_refusal, inference_graph, training_graphs)
from cudnn_bind.errors import CudnnBindError, UnsupportedError
from cudnn_bind.handles import Handle, cached_handle
from cudnn_bind.memory import (
    DTYPE_SIZES, DeviceArray, as_view, block_layout, current_device, new_arrays)
from cudnn_bind.rules import (
    INFERENCE_MAX_BATCH, TRAINING_MAX_BATCH, check_call, layout_of, layout_order, packed,
    param_dtype, plan_mode)

__all__ = ["batch_norm_forward_training", "batch_norm_forward_inference", "batch_norm_backward",
           "batch_norm_backend", "can_use_cudnn", "choose_mode", "TRAINING_MAX_BATCH",
           "INFERENCE_MAX_BATCH"]

_INT32_MAX = 2 ** 31 - 1
# plans kept per library (the least recently built goes first)
MAX_PLANS = 256

# the arrays each call checks, by name, in the order the calls gather them
_FORWARD_NAMES = ("x", "z", "out", "weight", "bias", "running_mean", "running_var")
_INFERENCE_NAMES = ("x", "out", "weight", "bias", "running_mean", "running_var")
_BACKWARD_NAMES = ("x", "dy", "y", "z", "weight", "bias", "save_mean", "save_invstd", "reserve")

# alpha = 1, beta = 0: double for double data, float otherwise
_ONE_ZERO = {True: (ctypes.byref(ctypes.c_double(1.0)), ctypes.byref(ctypes.c_double(0.0))),
             False: (ctypes.byref(ctypes.c_float(1.0)), ctypes.byref(ctypes.c_float(0.0)))}


# ---- argument checks ---------------------------------------------------------

def choose_mode(ndim: Int, layout: str, training: bool) -> int:
    """The cudnnBatchNormMode_t cudnn_bind picks for an input without a fused op.

    ATen's choice (getCudnnBatchNormMode): SPATIAL_PERSISTENT for
    channels-last (4-D or 5-D) training and SPATIAL otherwise, except that
    2-D input runs in SPATIAL mode as (N, C, 1, 1) (see `cudnn_bind.rules`).

    Parameters
    ----------
    ndim : int
        The number of dimensions of x, 2 to 5.
    layout : str
        The layout of x: 'contiguous' (N,C,...) or 'channels_last'.
    training : bool
        Whether the call is a training one (forward or backward) rather
        than inference.

    Returns
    -------
    int
        ``SPATIAL`` (1) or ``SPATIAL_PERSISTENT`` (2).

    Raises
    ------
    TypeError
        If ndim is not an int.
    ValueError
        If ndim is not 2 to 5 or layout is not one of those above.
    """
    ndim = integer(ndim, "ndim", 2, 5)
    if not isinstance(layout, str) or layout not in ("contiguous", "channels_last"):
        raise ValueError(f"layout must be 'contiguous' or 'channels_last', got {show(layout)}")
    return plan_mode(ndim, layout, None, 0, bool(training))


def _fused(activation, z):
    if activation is not None and not (isinstance(activation, str) and activation == "relu"):
        raise ValueError(f"activation must be None or 'relu', got {show(activation)}")
    if z is not None:
        if activation != "relu":
            raise ValueError("z (the residual added before the activation) needs activation='relu': "
                             "cuDNN fuses bn(x) + z only with an activation")
        return "add_relu"
    return "relu" if activation == "relu" else None


_OPS = {None: OPS_BN, "relu": OPS_BN_ACTIVATION, "add_relu": OPS_BN_ADD_ACTIVATION}


def _check_x(x):
    if x.dtype not in ("float32", "float64", "float16", "bfloat16"):
        raise TypeError(f"x must be float32, float64, float16 or bfloat16, got {x.dtype}")
    if not 2 <= x.ndim <= 5:
        raise ValueError(f"x must have 2 to 5 dimensions (N, C, ...), got shape {x.shape}")
    if x.shape[1] < 1:
        raise ValueError(f"x must have at least one channel, got shape {x.shape}")
    if x.size >= _INT32_MAX:
        raise ValueError(f"x has {x.size} elements; cuDNN batch norm indexes with 32 bits "
                         f"(at most {_INT32_MAX - 1})")


def _check_like(v, x, name, layout):
    if v.shape != x.shape:
        raise ValueError(f"{name} must have x's shape {x.shape}, got {v.shape}")
    if v.dtype != x.dtype:
        raise TypeError(f"{name} must have x's dtype {x.dtype}, got {v.dtype}")
    if v.strides == x.strides or packed(v.shape, v.strides, layout_order(v.ndim, layout)):
        return  # packed as x is (size-1 dims may have any stride)
    layout_of(v.shape, v.strides, name)  # neither layout: that error
    if v.size:
        raise ValueError(f"{name} must have x's memory layout ({layout})")


def _check_param(v, name, count, dtype):
    if v.dtype == dtype and v.shape == (count,) and (v.strides == (1,) or count == 1):
        return  # the common case, decided at once
    if v.dtype != dtype:
        data = "float64" if dtype == "float64" else "float32, float16 or bfloat16"
        raise TypeError(f"{name} must be {dtype} for {data} data (cuDNN's rule), got {v.dtype}")
    if v.size != count:
        raise ValueError(f"{name} must have {count} elements, got shape {v.shape}")
    if not packed(v.shape, v.strides, range(v.ndim - 1, -1, -1)):
        raise ValueError(f"{name} must be contiguous, got strides {v.strides} (elements)")


def _same_device(names, views):
    """The device all views (named by `names`) are on, None if only empty
    arrays without memory; ValueError naming the arrays otherwise."""
    # an empty array may have no memory (pointer 0) and so no device
    present = {v.device for v in views if v is not None and (v.ptr or v.size)}
    if len(present) == 1 and None not in present:
        return present.pop()  # the common case
    devices = {(n, v.device) for n, v in zip(names, views)
               if v is not None and (v.ptr or v.size)}
    known = {d for _, d in devices if d is not None}
    if len(known) > 1:
        where = ", ".join(f"{n} on {d}" for n, d in sorted(devices, key=str))
        raise ValueError(f"all arrays must be on the same device, got {where}")
    if not devices:  # only empty arrays without memory
        return None
    # some (or all: then nothing to compare with) host or unregistered memory
    host = sorted(n for n, d in devices if d is None)
    raise ValueError(f"{', '.join(host)}: not device memory (cudaPointerGetAttributes "
                     "reports host or unregistered memory)")


def _named(names, views):
    """(name, address) of each view given: what graph_refusal checks the
    alignment of."""
    return [(n, v.ptr) for n, v in zip(names, views) if v is not None]


def _gather(names, views, stream):
    """(the device all views are on, the streams other than `stream` that
    produced them): _same_device's answer and errors, in one pass."""
    device = None
    found = mixed = False
    producers = ()
    for v in views:
        if v is None:
            continue
        s = v.stream
        if s is not None and s != stream and s not in producers:
            producers += (s,)
        if v.ptr or v.size:  # an empty array may have no memory and so no device
            if not found:
                device, found = v.device, True
            elif v.device != device:
                mixed = True
    if mixed or (found and device is None):
        _same_device(names, views)  # raises, naming the arrays
    return device, producers


def _eps(eps, lib):
    eps = real(eps, "eps")
    if not eps >= lib.min_epsilon:
        raise ValueError(f"eps must be >= {lib.min_epsilon} (CUDNN_BN_MIN_EPSILON of cuDNN "
                         f"{lib.major}), got {eps}")
    return eps


def _stream_and_x(stream, x, lib):
    """The cudaStream_t to run on (see the module docstring) and x's view.
    Without `stream=`, x's view says where x was produced: PyTorch's current
    stream, a DeviceArray's stream, the interface's "stream" key, nothing
    for DLPack (the legacy default stream then); for CuPy, its current
    stream."""
    if stream is None and type(x) is DeviceArray and x.ptr:
        return x.stream or 0, x  # a live DeviceArray is its own view: as_view's answer at once
    if stream is not None:
        st = stream_value(stream, "stream")
        return st, as_view(x, "x", lib, st)
    xv = as_view(x, "x", lib, 0)
    if xv.kind == "cupy":
        import cupy
        with x.device:
            return int(cupy.cuda.get_current_stream().ptr), xv
    return xv.stream or 0, xv


def _handle(handle, device, lib):
    if handle is None:
        return cached_handle(device, lib)
    if not isinstance(handle, Handle):
        raise TypeError(f"handle must be None or a cudnn_bind Handle, got {type(handle).__name__}")
    # the real library dereferences a NULL or stale handle instead of failing
    if not handle.alive or handle.lib is not lib:
        raise ValueError("handle has been destroyed (or belongs to a library loaded before); "
                         "use cudnn_bind.handle_for(device)")
    if handle.device != device:
        raise ValueError(f"handle is for device {handle.device}, the arrays are on {device}")
    return handle


def _writable(v, name):
    if v is not None and v.read_only:
        raise ValueError(f"{name} is read-only (its exporter says so) but batch norm writes it")


def _required(name):
    return ValueError(f"{name} is required (cuDNN batch norm has no default for it)")


def _param(obj, name, plan, lib, stream, required=False):
    """The checked view of parameter vector `obj` (None when not given, an
    error if `required`)."""
    if type(obj) is DeviceArray and obj.ptr:
        v = obj  # its own view: as_view's answer without the call
    elif obj is None:
        if required:
            raise _required(name)
        return None
    else:
        v = as_view(obj, name, lib, stream)
    if v.dtype != plan.pdtype or v.shape != plan.pshape or v.strides != (1,):
        _check_param(v, name, plan.nparam, plan.pdtype)
    return v


# ---- plans -------------------------------------------------------------------------

class _Plan:
    """Layout, mode, descriptors and sizes for one call signature."""

    def __init__(self, lib, x, mode, fused, training):
        self.lib = lib
        self.shape, self.strides, self.dtype = x.shape, x.strides, x.dtype
        # graph-API plans by (which, running statistics, alignment, device)
        self.graphs = {}
        self.layout = layout_of(x.shape, x.strides, "x")
        # the mode, and every rule of cudnn_bind.rules, refused here before any descriptor
        self.mode = check_call(x.shape, self.layout, x.dtype, training, mode, fused, lib.version)
        self.ops = _OPS[fused]
        self.pdtype = param_dtype(x.dtype)
        self.double = x.dtype == "float64"
        self.one, self.zero = _ONE_ZERO[self.double]
        # cudnnDeriveBNTensorDescriptor's shape: (1, C, 1, ...) or, per
        # activation, (1, C, spatial...)
        self.nparam = x.shape[1] * (math.prod(x.shape[2:]) if self.mode == PER_ACTIVATION else 1)
        self.pshape = (self.nparam,)
        self.param_spec = (self.pshape, (1,), self.pdtype)
        self.per_channel = x.size // x.shape[1]
        # outputs shaped like x, and the parameter gradients: where they go in a pool block
        self.like_x = [(x.shape, x.strides, x.dtype)]
        self.like_x_layout = block_layout(self.like_x)
        self.param_pair = [self.param_spec, self.param_spec]
        self.param_pair_layout = block_layout(self.param_pair)
        self.fn_forward = lib.cudnn.cudnnBatchNormalizationForwardTrainingEx
        self.fn_inference = lib.cudnn.cudnnBatchNormalizationForwardInference
        self.fn_backward = lib.cudnn.cudnnBatchNormalizationBackwardEx
        self.empty = x.size == 0
        channels_last = self.layout == "channels_last"
        # cuDNN has no empty tensors: an empty x is described with its zero
        # sizes as 1 (only the parameter shapes are used then; no call runs)
        shape = tuple(max(d, 1) for d in x.shape)
        self.xdesc = TensorDescriptor(shape, x.strides, x.dtype, channels_last=channels_last)
        self.bndesc = derive_bn_descriptor(self.xdesc, self.mode)
        self.act = ActivationDescriptor() if self.ops != OPS_BN else None
        self.actdesc = self.act.value if self.act is not None else None
        self.xd, self.bnd = self.xdesc.value, self.bndesc.value
        self.zd = self.xd if fused == "add_relu" else None
        self._sizes = {}
        # inference: batches over INFERENCE_MAX_BATCH run in chunks of it
        self.chunks = None
        if not training and x.shape[0] > INFERENCE_MAX_BATCH:
            n, step = x.shape[0], INFERENCE_MAX_BATCH
            full = TensorDescriptor((step,) + shape[1:], x.strides, x.dtype,
                                    channels_last=channels_last)
            rest = n % step
            last = (TensorDescriptor((rest,) + shape[1:], x.strides, x.dtype,
                                     channels_last=channels_last) if rest else None)
            self.chunks = [(n0, full if n0 + step <= n else last) for n0 in range(0, n, step)]

    def sizes(self, h, what):
        """cuDNN's byte count `what` ('forward', 'backward' workspace or
        'reserve') for this signature on h's device (asked once per device)."""
        key = (h.device, what)
        size = self._sizes.get(key)
        if size is None:
            out = ctypes.c_size_t()
            lib, xd = self.lib, self.xd
            # ATen, CuPy and TensorFlow pass x's descriptor for z, y, dy, dz
            # and dx in the size queries: never NULL
            if what == "forward":
                lib.call("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize", h.ptr,
                         self.mode, self.ops, xd, xd, xd, self.bnd, self.actdesc,
                         ctypes.byref(out))
            elif what == "backward":
                lib.call("cudnnGetBatchNormalizationBackwardExWorkspaceSize", h.ptr, self.mode,
                         self.ops, xd, xd, xd, xd, xd, self.bnd, self.actdesc, ctypes.byref(out))
            else:
                lib.call("cudnnGetBatchNormalizationTrainingExReserveSpaceSize", h.ptr,
                         self.mode, self.ops, self.actdesc, xd, ctypes.byref(out))
            size = self._sizes[key] = out.value
        return size

    def forward_sizes(self, h):
        """(workspace bytes, then saved_specs' answer) of the forward on h's
        device: one lookup per call (made once per device)."""
        key = (h.device, "forward_all")
        found = self._sizes.get(key)
        if found is None:
            found = self._sizes[key] = (self.sizes(h, "forward"),) + self.saved_specs(h)
        return found

    def backward_sizes(self, h):
        """(reserve bytes, workspace bytes) of the backward on h's device:
        one lookup per call (made once per device)."""
        key = (h.device, "backward_all")
        found = self._sizes.get(key)
        if found is None:
            found = self._sizes[key] = (self.sizes(h, "reserve"), self.sizes(h, "backward"))
        return found

    def saved_specs(self, h):
        """(specs, pool layout, reserve bytes) of the forward's save_mean,
        save_invstd and reserve on h's device, which share one block (made
        once per device)."""
        key = (h.device, "saved")
        saved = self._sizes.get(key)
        if saved is None:
            reserve = self.sizes(h, "reserve")
            specs = [self.param_spec, self.param_spec, ((reserve,), (1,), "uint8")]
            saved = self._sizes[key] = (specs, block_layout(specs), reserve)
        return saved


def _plan(lib, call, x, mode, fused):
    """The cached _Plan for this call's signature (built and checked on first use)."""
    if mode is not None:
        mode = bn_mode(mode)
    key = (call, x.shape, x.strides, x.dtype, mode, fused)
    plans = lib.plans
    plan = plans.get(key)
    if plan is None:
        _check_x(x)
        plan = _Plan(lib, x, mode, fused, call != "inference")
        if len(plans) >= MAX_PLANS:
            try:
                plans.pop(next(iter(plans)), None)
            except (RuntimeError, StopIteration):  # another thread changed the dict: skip
                pass
        plans[key] = plan
    return plan


def _enter_device(lib, device):
    """Make `device` current (None: keep the current one, for calls with only
    empty arrays); returns (device, the device to restore or None).  PyTorch
    and CuPy notice a changed current device, so the caller's comes back."""
    current = current_device(lib)
    if device is None or device == current:
        return current, None
    lib.cuda("cudaSetDevice", device)
    return device, current


def _leave_device(lib, previous):
    if previous is not None:
        lib.cuda("cudaSetDevice", previous)


def _start(h, stream, producers):
    """Point h at `stream` and make it wait for the inputs' producers."""
    h.use_stream(stream)
    for producer in producers:
        h.wait_for(producer, stream)


def _training_x(x, stream, mode, fused, lib):
    """(stream, x's view, plan) of a training-mode call (forward or backward);
    the plan has checked the rules (the batch limit among them)."""
    st, xv = _stream_and_x(stream, x, lib)
    return st, xv, _plan(lib, "training", xv, mode, fused)


# ---- forward, training ---------------------------------------------------------

def batch_norm_forward_training(
        x: DeviceArrayLike, weight: DeviceArrayLike, bias: DeviceArrayLike,
        running_mean: Optional[DeviceArrayLike] = None,
        running_var: Optional[DeviceArrayLike] = None, exponential_average_factor: Real = 0.1,
        eps: Real = 1e-5, *, out: Optional[DeviceArrayLike] = None,
        z: Optional[DeviceArrayLike] = None, activation: Optional[str] = None,
        mode: Optional[ModeLike] = None, handle: Optional[Handle] = None,
        stream: StreamLike = None, backend: str = "auto",
) -> tuple[DeviceArrayLike, DeviceArrayLike, DeviceArrayLike, DeviceArrayLike]:
    """Batch norm over a training batch (cudnnBatchNormalizationForwardTrainingEx).

    Normalizes x with its batch statistics per channel (per activation in
    PER_ACTIVATION mode): y = (x - mean) * invstd * weight + bias.
    running_mean/running_var (both or neither) are updated in place: new =
    (1 - f) * old + f * batch, with the unbiased batch variance.
    activation='relu' fuses a ReLU; z (x's shape) fuses y = relu(bn(x) + z);
    cuDNN has those kernels only for float16 channels-last x in
    SPATIAL_PERSISTENT mode, with C % 4 == 0 for z (and for ReLU alone
    before cuDNN 8.2): UnsupportedError otherwise.
    `reserve` must be passed to the matching `batch_norm_backward`.

    Parameters
    ----------
    x : device array
        The input, (N, C, ...) with 2 to 5 dimensions, float32, float64,
        float16 or bfloat16, packed in N,C,... order or (4-D and 5-D)
        channels-last, fewer than 2**31 - 1 elements: a CuPy array, a
        PyTorch CUDA tensor, a `DeviceArray`, or any object with
        ``__cuda_array_interface__`` or ``__dlpack__`` (or a DLPack
        capsule).  At most `TRAINING_MAX_BATCH` samples (131070 in
        PER_ACTIVATION mode), and more than one value per channel.
    weight : device array
        The scale: float64 for float64 x, else float32 (cuDNN's rule); C
        elements (C times the spatial sizes in PER_ACTIVATION mode),
        contiguous, on x's device.
    bias : device array
        The shift, as weight.
    running_mean : device array, optional
        The running mean, as weight, written in place (it must not be
        read-only); given together with running_var.
    running_var : device array, optional
        The running variance, as running_mean.
    exponential_average_factor : float, optional
        The factor f of the running-statistics update (default 0.1), finite.
    eps : float, optional
        Added to the variance (default 1e-5), >= CUDNN_BN_MIN_EPSILON (0.0).
    out : device array, optional
        Where to write y: x's shape, dtype and memory layout, writable, on
        x's device.  None (the default) allocates y.
    z : device array, optional
        The residual added before the ReLU: x's shape, dtype and layout;
        needs ``activation='relu'``.
    activation : str, optional
        None (the default) or 'relu'.
    mode : int or str, optional
        None (the default) picks the mode as ATen does (see `choose_mode`);
        else ``PER_ACTIVATION``, ``SPATIAL``, ``SPATIAL_PERSISTENT`` or
        their names ("per_activation", ...), used as given.
    handle : Handle, optional
        The cuDNN handle to use: live, of the loaded library, for the
        arrays' device.  None (the default) is this thread's handle for
        that device (`handle_for`).
    stream : int or stream object, optional
        The stream to run on: an int ``cudaStream_t`` or a stream object
        with ``.cuda_stream`` (PyTorch), ``.ptr`` (CuPy) or ``.handle``
        (Numba).  None (the default): PyTorch's or CuPy's current stream
        for their arrays, else the stream x was produced on (a
        DeviceArray's ``stream``, the ``stream`` key of
        ``__cuda_array_interface__``), else the legacy default stream.
    backend : str, optional
        "auto" (the default): cuDNN's graph API where it has engines for
        this signature's forward and backward, else the legacy call
        (`batch_norm_backend` says which, and why); "graph": the graph API
        or `UnsupportedError`; "legacy": the legacy call.  On the graph
        path the returned reserve is empty (the graph's backward needs
        none).

    Returns
    -------
    y : device array
        The output: `out` itself when given, else a new array with x's
        shape, strides and dtype.
    save_mean : device array
        The batch mean, (C,) (C times the spatial sizes in PER_ACTIVATION
        mode), float32 (float64 for float64 x).
    save_invstd : device array
        The batch's 1 / sqrt(var + eps), as save_mean.
    reserve : device array
        cuDNN's reserve space, uint8, of the size cuDNN asks for (possibly
        0 bytes).

        The new arrays are of x's kind: PyTorch tensors for a tensor x,
        CuPy arrays for a CuPy x, else `DeviceArray` (whose ``stream`` is
        the call's; save_mean, save_invstd and reserve then share one
        block of the pool).

    Raises
    ------
    TypeError
        If an array is not a device array (a NumPy array is host memory) or
        has the wrong dtype, or a scalar, mode or handle has the wrong type.
    ValueError
        If a shape, layout, device or size is wrong, x has only one value
        per channel, weight or bias is missing, only one running statistic
        is given, a written array is read-only, eps is below
        CUDNN_BN_MIN_EPSILON, z comes without activation='relu', the
        handle is destroyed or for another device, or backend is not
        "auto", "graph" or "legacy".
    UnsupportedError
        A ValueError: cuDNN has no kernel for the fused op (or the mode
        asked for) with this x (``.rule`` "fused_activation"), or cannot
        train on a batch this large in this mode (over TRAINING_MAX_BATCH,
        or 131070 in PER_ACTIVATION mode: "batch_limit"); with
        ``backend="graph"``, no graph engine for this call ("graph_engine").
    CudnnUnavailableError
        If no cuDNN library loads.
    CudnnError
        If a cuDNN call fails.
    CudaError
        If a CUDA runtime call fails (allocation, events, device).
    """
    lib = _lib.get()
    eps = _eps(eps, lib)
    factor = real(exponential_average_factor, "exponential_average_factor")
    backend = backend if backend == "auto" else check_backend(backend)
    # no fused op (the common case) needs no check
    fused = None if activation is None and z is None else _fused(activation, z)
    st, xv, plan = _training_x(x, stream, mode, fused, lib)
    if plan.per_channel <= 1:
        raise ValueError("Expected more than 1 value per channel when training, got x of "
                         f"shape {xv.shape}")
    if (running_mean is None) != (running_var is None):
        raise ValueError("running_mean and running_var must be given together or not at all")
    zv = None
    if z is not None:
        zv = as_view(z, "z", lib, st)
        _check_like(zv, xv, "z", plan.layout)
    wv = _param(weight, "weight", plan, lib, st, required=True)
    bv = _param(bias, "bias", plan, lib, st, required=True)
    rmv = _param(running_mean, "running_mean", plan, lib, st)
    rvv = _param(running_var, "running_var", plan, lib, st)
    yv = None
    if out is not None:
        yv = as_view(out, "out", lib, st)
        _check_like(yv, xv, "out", plan.layout)
        _writable(yv, "out")
    if rmv is not None and (rmv.read_only or rvv.read_only):  # updated in place
        _writable(rmv, "running_mean")
        _writable(rvv, "running_var")
    views = (xv, zv, yv, wv, bv, rmv, rvv)
    device, producers = _gather(_FORWARD_NAMES, views, st)
    device, previous = _enter_device(lib, device)
    try:
        h = cached_handle(device, lib) if handle is None else _handle(handle, device, lib)
        g = None if backend == "legacy" else training_graphs(
            lib, h, plan, backend, graph_refusal(
                lib, plan, mode, fused, _named(_FORWARD_NAMES, views)),
            "forward", rmv is not None)
        if g is not None:
            if st != h._stream or producers:
                _start(h, st, producers)
            return _graph_forward(lib, h, g, plan, st, xv, yv, out, wv, bv, rmv, rvv, eps,
                                  factor)
        ws_size, saved, saved_layout, rs_size = plan.forward_sizes(h)
        if st != h._stream or producers:  # else _start has nothing to do
            _start(h, st, producers)
        kind = xv.kind
        if yv is None:  # no out=
            (out,), (y_ptr,) = new_arrays(kind, device, st, plan.like_x, lib, plan.like_x_layout)
        else:
            y_ptr = yv.ptr
        # saved for backward together: one block
        (save_mean, save_invstd, reserve), (sm, si, rs) = new_arrays(
            kind, device, st, saved, lib, saved_layout)
        ws = h.workspace(ws_size, kind, st)
        xd = plan.xd
        status = plan.fn_forward(
            h.ptr, plan.mode, plan.ops, plan.one, plan.zero, xd, xv.ptr, plan.zd,
            zv.ptr if zv is not None else None, xd, y_ptr, plan.bnd, wv.ptr, bv.ptr, factor,
            rmv.ptr if rmv is not None else None, rvv.ptr if rvv is not None else None, eps,
            sm, si, plan.actdesc, ws or None, ws_size, rs or None, rs_size)
        if status:
            lib.check(status, "cudnnBatchNormalizationForwardTrainingEx")
    finally:
        if previous is not None:
            _leave_device(lib, previous)
    return out, save_mean, save_invstd, reserve


def _graph_forward(lib, h, g, plan, st, xv, yv, out, wv, bv, rmv, rvv, eps, factor):
    """The training forward on the graph path (cudnn_bind.batch_norm_graph):
    (y, save_mean, save_invstd, an empty reserve)."""
    specs = ([] if yv is not None else plan.like_x) + plan.param_pair + [((0,), (1,), "uint8")]
    arrays, ptrs = new_arrays(xv.kind, h.device, st, specs, lib)
    if yv is None:
        out, y_ptr = arrays[0], ptrs[0]
        arrays, ptrs = arrays[1:], ptrs[1:]
    else:
        y_ptr = yv.ptr
    eps_value, factor_value = ctypes.c_float(eps), ctypes.c_float(factor)
    by_uid = {UID["x"]: xv.ptr, UID["y"]: y_ptr, UID["scale"]: wv.ptr, UID["bias"]: bv.ptr,
              UID["epsilon"]: ctypes.addressof(eps_value), UID["mean"]: ptrs[0],
              UID["inv_variance"]: ptrs[1]}
    if rmv is not None:  # updated in place: the same address in and out
        by_uid.update({UID["momentum"]: ctypes.addressof(factor_value),
                       UID["running_mean"]: rmv.ptr, UID["running_var"]: rvv.ptr,
                       UID["running_mean_out"]: rmv.ptr, UID["running_var_out"]: rvv.ptr})
    g.execute(h.ptr, [by_uid[u] for u in g.uids], h.workspace(g.workspace, xv.kind, st))
    return out, arrays[0], arrays[1], arrays[2]


# ---- forward, inference --------------------------------------------------------

def batch_norm_forward_inference(
        x: DeviceArrayLike, weight: DeviceArrayLike, bias: DeviceArrayLike,
        running_mean: DeviceArrayLike, running_var: DeviceArrayLike, eps: Real = 1e-5, *,
        out: Optional[DeviceArrayLike] = None, mode: Optional[ModeLike] = None,
        handle: Optional[Handle] = None, stream: StreamLike = None,
        backend: str = "auto") -> DeviceArrayLike:
    """Batch norm with running statistics (cudnnBatchNormalizationForwardInference).

    y = (x - running_mean) / sqrt(running_var + eps) * weight + bias.
    Batches over 65535 samples (`INFERENCE_MAX_BATCH`, PyTorch's limit for
    this call) run in chunks; an empty batch makes no cuDNN call.

    Parameters
    ----------
    x : device array
        The input, (N, C, ...) with 2 to 5 dimensions, float32, float64,
        float16 or bfloat16, packed in N,C,... order or (4-D and 5-D)
        channels-last, fewer than 2**31 - 1 elements: a CuPy array, a
        PyTorch CUDA tensor, a `DeviceArray`, or any object with
        ``__cuda_array_interface__`` or ``__dlpack__`` (or a DLPack
        capsule).
    weight : device array
        The scale: float64 for float64 x, else float32 (cuDNN's rule); C
        elements (C times the spatial sizes in PER_ACTIVATION mode),
        contiguous, on x's device.
    bias : device array
        The shift, as weight.
    running_mean : device array
        The mean to normalize with, as weight.
    running_var : device array
        The variance to normalize with, as weight.
    eps : float, optional
        Added to the variance (default 1e-5), >= CUDNN_BN_MIN_EPSILON (0.0).
    out : device array, optional
        Where to write y: x's shape, dtype and memory layout, writable, on
        x's device.  None (the default) allocates y.
    mode : int or str, optional
        None (the default) picks the mode as ATen does (see `choose_mode`);
        else ``PER_ACTIVATION``, ``SPATIAL``, ``SPATIAL_PERSISTENT`` or
        their names ("per_activation", ...), used as given.
    handle : Handle, optional
        The cuDNN handle to use: live, of the loaded library, for the
        arrays' device.  None (the default) is this thread's handle for
        that device (`handle_for`).
    stream : int or stream object, optional
        The stream to run on: an int ``cudaStream_t`` or a stream object
        with ``.cuda_stream`` (PyTorch), ``.ptr`` (CuPy) or ``.handle``
        (Numba).  None (the default): PyTorch's or CuPy's current stream
        for their arrays, else the stream x was produced on (a
        DeviceArray's ``stream``, the ``stream`` key of
        ``__cuda_array_interface__``), else the legacy default stream.
    backend : str, optional
        "auto" (the default): cuDNN's graph API where it has an engine for
        this signature, else the legacy call; "graph": the graph API or
        `UnsupportedError`; "legacy": the legacy call.  cuDNN 9.19 has no
        engine for inference alone, so inference runs on the legacy call
        there (`batch_norm_backend` with ``training=False`` says so).

    Returns
    -------
    device array
        The output y: `out` itself when given, else a new array with x's
        shape, strides and dtype.  A new y is of x's kind: a PyTorch tensor
        for a tensor x, a CuPy array for a CuPy x, else a `DeviceArray`
        (whose ``stream`` is the call's).

    Raises
    ------
    TypeError
        If an array is not a device array (a NumPy array is host memory) or
        has the wrong dtype, or eps, mode or handle has the wrong type.
    ValueError
        If a shape, layout, device or size is wrong, a parameter is
        missing, out is read-only, eps is below CUDNN_BN_MIN_EPSILON, the
        handle is destroyed or for another device, or backend is not
        "auto", "graph" or "legacy".
    UnsupportedError
        A ValueError: with ``backend="graph"``, no graph engine for this
        call (``.rule`` "graph_engine").
    CudnnUnavailableError
        If no cuDNN library loads.
    CudnnError
        If a cuDNN call fails.
    CudaError
        If a CUDA runtime call fails (allocation, events, device).
    """
    lib = _lib.get()
    eps = _eps(eps, lib)
    backend = backend if backend == "auto" else check_backend(backend)
    st, xv = _stream_and_x(stream, x, lib)
    plan = _plan(lib, "inference", xv, mode, None)
    wv = _param(weight, "weight", plan, lib, st, required=True)
    bv = _param(bias, "bias", plan, lib, st, required=True)
    rmv = _param(running_mean, "running_mean", plan, lib, st, required=True)
    rvv = _param(running_var, "running_var", plan, lib, st, required=True)
    yv = None
    if out is not None:
        yv = as_view(out, "out", lib, st)
        _check_like(yv, xv, "out", plan.layout)
        _writable(yv, "out")
    views = (xv, yv, wv, bv, rmv, rvv)
    device, producers = _gather(_INFERENCE_NAMES, views, st)
    device, previous = _enter_device(lib, device)
    try:
        h = cached_handle(device, lib) if handle is None else _handle(handle, device, lib)
        if st != h._stream or producers:  # else _start has nothing to do
            _start(h, st, producers)
        if yv is None:  # no out=
            (out,), (y_ptr,) = new_arrays(xv.kind, device, st, plan.like_x, lib,
                                          plan.like_x_layout)
        else:
            y_ptr = yv.ptr
        if plan.empty:  # an empty batch: nothing for cuDNN to do
            return out
        g = None if backend == "legacy" else inference_graph(
            lib, h, plan, backend, graph_refusal(
                lib, plan, mode, None, _named(_INFERENCE_NAMES, views)))
        if g is not None:
            eps_value = ctypes.c_float(float(eps))
            by_uid = {UID["x"]: xv.ptr, UID["y"]: y_ptr, UID["scale"]: wv.ptr,
                      UID["bias"]: bv.ptr, UID["running_mean"]: rmv.ptr,
                      UID["running_var"]: rvv.ptr, UID["epsilon"]: ctypes.addressof(eps_value)}
            graphs = g if isinstance(g, tuple) else (g,)
            if len(graphs) == 2:  # rsqrt(var + eps) into a scratch vector first
                (inv,), (by_uid[UID["inv_running"]],) = new_arrays(
                    xv.kind, device, st, [plan.param_spec], lib)
            for part in graphs:
                part.execute(h.ptr, [by_uid[u] for u in part.uids],
                             h.workspace(part.workspace, xv.kind, st))
            return out
        fn, one, zero = plan.fn_inference, plan.one, plan.zero
        if plan.chunks is None:
            status = fn(h.ptr, plan.mode, one, zero, plan.xd, xv.ptr, plan.xd, y_ptr, plan.bnd,
                        wv.ptr, bv.ptr, rmv.ptr, rvv.ptr, eps)
            if status:
                lib.check(status, "cudnnBatchNormalizationForwardInference")
            return out
        args = (plan.bnd, wv.ptr, bv.ptr, rmv.ptr, rvv.ptr, eps)
        step = xv.strides[0] * DTYPE_SIZES[xv.dtype]
        for n0, desc in plan.chunks:
            status = fn(h.ptr, plan.mode, one, zero, desc.value, xv.ptr + n0 * step, desc.value,
                        y_ptr + n0 * step, *args)
            if status:  # cuDNN's functions are called directly: lib.check raises as lib.call would
                lib.check(status, "cudnnBatchNormalizationForwardInference")
    finally:
        if previous is not None:
            _leave_device(lib, previous)
    return out


# ---- backward ---------------------------------------------------------------------

def batch_norm_backward(
        x: DeviceArrayLike, dy: DeviceArrayLike, weight: DeviceArrayLike,
        save_mean: DeviceArrayLike, save_invstd: DeviceArrayLike, eps: Real,
        reserve: Optional[DeviceArrayLike], *, y: Optional[DeviceArrayLike] = None,
        z: Optional[DeviceArrayLike] = None, bias: Optional[DeviceArrayLike] = None,
        activation: Optional[str] = None, mode: Optional[ModeLike] = None,
        handle: Optional[Handle] = None, stream: StreamLike = None, backend: str = "auto",
) -> Union[tuple[DeviceArrayLike, DeviceArrayLike, DeviceArrayLike],
           tuple[DeviceArrayLike, DeviceArrayLike, DeviceArrayLike, DeviceArrayLike]]:
    """Gradients of training-mode batch norm (cudnnBatchNormalizationBackwardEx).

    save_mean, save_invstd and reserve come from the matching forward call
    (`batch_norm_forward_training`), with the same eps, activation, z and
    mode.  With activation='relu' cuDNN also needs the forward's output y
    and bias (it recomputes the activation's input from them).

    Parameters
    ----------
    x : device array
        The input, (N, C, ...) with 2 to 5 dimensions, float32, float64,
        float16 or bfloat16, packed in N,C,... order or (4-D and 5-D)
        channels-last, fewer than 2**31 - 1 elements: a CuPy array, a
        PyTorch CUDA tensor, a `DeviceArray`, or any object with
        ``__cuda_array_interface__`` or ``__dlpack__`` (or a DLPack
        capsule).  At most `TRAINING_MAX_BATCH` samples, and more than one
        value per channel.
    dy : device array
        The gradient of y: x's shape, dtype and memory layout.
    weight : device array
        The scale: float64 for float64 x, else float32 (cuDNN's rule); C
        elements (C times the spatial sizes in PER_ACTIVATION mode),
        contiguous, on x's device.
    save_mean : device array
        The forward's save_mean, as weight.
    save_invstd : device array
        The forward's save_invstd, as weight.
    eps : float
        The forward's eps, >= CUDNN_BN_MIN_EPSILON (0.0).
    reserve : device array or None
        The forward's reserve: contiguous, of exactly the bytes cuDNN asks
        for (None only where that is 0).
    y : device array, optional
        The forward's output (needed with activation='relu'): x's shape,
        dtype and layout.
    z : device array, optional
        The forward's residual (with activation='relu'): x's shape, dtype
        and layout; dz is computed.
    bias : device array, optional
        The forward's bias, as weight (needed with activation='relu').
    activation : str, optional
        None (the default) or 'relu', as in the forward.
    mode : int or str, optional
        None (the default) picks the mode as ATen does (see `choose_mode`);
        else ``PER_ACTIVATION``, ``SPATIAL``, ``SPATIAL_PERSISTENT`` or
        their names ("per_activation", ...), used as given.
    handle : Handle, optional
        The cuDNN handle to use: live, of the loaded library, for the
        arrays' device.  None (the default) is this thread's handle for
        that device (`handle_for`).
    stream : int or stream object, optional
        The stream to run on: an int ``cudaStream_t`` or a stream object
        with ``.cuda_stream`` (PyTorch), ``.ptr`` (CuPy) or ``.handle``
        (Numba).  None (the default): PyTorch's or CuPy's current stream
        for their arrays, else the stream x was produced on (a
        DeviceArray's ``stream``, the ``stream`` key of
        ``__cuda_array_interface__``), else the legacy default stream.
    backend : str, optional
        As for `batch_norm_forward_training`: a signature takes the graph
        path in its backward when it does in its forward.  The graph's
        backward reads neither reserve nor eps (it uses the saved
        statistics), so it also takes a legacy forward's reserve.

    Returns
    -------
    dx : device array
        The gradient of x, with x's shape, strides and dtype.
    dweight : device array
        The gradient of weight, (C,) (C times the spatial sizes in
        PER_ACTIVATION mode), float32 (float64 for float64 x).
    dbias : device array
        The gradient of bias, as dweight.
    dz : device array
        The gradient of z, as dx: only when z is given (the tuple then has
        four entries).

        The arrays are of x's kind: PyTorch tensors for a tensor x, CuPy
        arrays for a CuPy x, else `DeviceArray` (whose ``stream`` is the
        call's).

    Raises
    ------
    TypeError
        If an array is not a device array (a NumPy array is host memory) or
        has the wrong dtype, or eps, mode or handle has the wrong type.
    ValueError
        If a shape, layout, device or size is wrong, x has only one value
        per channel, a required array is missing, reserve is not contiguous
        or not of the size cuDNN asks for, eps is below
        CUDNN_BN_MIN_EPSILON, z comes without activation='relu', the
        handle is destroyed or for another device, or backend is not
        "auto", "graph" or "legacy".
    UnsupportedError
        A ValueError: cuDNN has no kernel for the fused op (or the mode
        asked for) with this x (``.rule`` "fused_activation"), or cannot
        train on a batch this large in this mode (over TRAINING_MAX_BATCH,
        or 131070 in PER_ACTIVATION mode: "batch_limit"); with
        ``backend="graph"``, no graph engine for this call ("graph_engine").
    CudnnUnavailableError
        If no cuDNN library loads.
    CudnnError
        If a cuDNN call fails.
    CudaError
        If a CUDA runtime call fails (allocation, events, device).
    """
    lib = _lib.get()
    eps = _eps(eps, lib)
    backend = backend if backend == "auto" else check_backend(backend)
    # no fused op (the common case) needs no check
    fused = None if activation is None and z is None else _fused(activation, z)
    st, xv, plan = _training_x(x, stream, mode, fused, lib)
    if plan.per_channel <= 1:
        raise ValueError("Expected more than 1 value per channel when training (batch norm "
                         f"backward uses training statistics), got x of shape {xv.shape}")
    dyv = as_view(dy, "dy", lib, st)
    _check_like(dyv, xv, "dy", plan.layout)
    zv = yv = None
    if z is not None:
        zv = as_view(z, "z", lib, st)
        _check_like(zv, xv, "z", plan.layout)
    if fused is not None:
        if y is None or bias is None:
            raise ValueError("activation='relu' backward needs the forward output y and bias "
                             "(cuDNN recomputes the activation's input from them)")
        yv = as_view(y, "y", lib, st)
        _check_like(yv, xv, "y", plan.layout)
    wv = _param(weight, "weight", plan, lib, st, required=True)
    bv = _param(bias, "bias", plan, lib, st) if bias is not None else None
    smv = _param(save_mean, "save_mean", plan, lib, st, required=True)
    siv = _param(save_invstd, "save_invstd", plan, lib, st, required=True)
    rv = as_view(reserve, "reserve", lib, st) if reserve is not None else None
    if (rv is not None and rv.strides != (1,)
            and not packed(rv.shape, rv.strides, range(rv.ndim - 1, -1, -1))):
        raise ValueError(f"reserve must be contiguous, got strides {rv.strides} (elements): pass "
                         "the reserve batch_norm_forward_training returned")
    device, producers = _gather(_BACKWARD_NAMES, (xv, dyv, yv, zv, wv, bv, smv, siv, rv), st)
    device, previous = _enter_device(lib, device)
    try:
        h = cached_handle(device, lib) if handle is None else _handle(handle, device, lib)
        g = None if backend == "legacy" else training_graphs(
            lib, h, plan, backend, graph_refusal(
                lib, plan, mode, fused, _named(("x", "dy", "weight", "save_mean", "save_invstd"),
                                               (xv, dyv, wv, smv, siv))),
            "backward", False)
        if g is not None:  # the graph needs no reserve (the legacy forward's is ignored)
            if st != h._stream or producers:
                _start(h, st, producers)
            (dx, dweight, dbias), (dx_ptr, dw, db) = new_arrays(
                xv.kind, device, st, plan.like_x + plan.param_pair, lib)
            by_uid = {UID["x"]: xv.ptr, UID["dy"]: dyv.ptr, UID["scale"]: wv.ptr,
                      UID["mean"]: smv.ptr, UID["inv_variance"]: siv.ptr, UID["dx"]: dx_ptr,
                      UID["dscale"]: dw, UID["dbias"]: db}
            g.execute(h.ptr, [by_uid[u] for u in g.uids], h.workspace(g.workspace, xv.kind, st))
            return dx, dweight, dbias
        expected, ws_size = plan.backward_sizes(h)
        got = 0 if rv is None else rv.size * DTYPE_SIZES[rv.dtype]
        if got != expected:
            raise ValueError(f"reserve has {got} bytes but cuDNN asks for {expected} for this shape, "
                             "mode and activation: pass the reserve returned by the matching "
                             "batch_norm_forward_training call")
        if st != h._stream or producers:  # else _start has nothing to do
            _start(h, st, producers)
        kind = xv.kind
        (dx,), (dx_ptr,) = new_arrays(kind, device, st, plan.like_x, lib, plan.like_x_layout)
        dz = dz_ptr = None
        if zv is not None:
            (dz,), (dz_ptr,) = new_arrays(kind, device, st, plan.like_x, lib, plan.like_x_layout)
        (dweight, dbias), (dw, db) = new_arrays(kind, device, st, plan.param_pair,
                                                lib, plan.param_pair_layout)
        ws = h.workspace(ws_size, kind, st)
        one, zero, xd = plan.one, plan.zero, plan.xd
        status = plan.fn_backward(
            h.ptr, plan.mode, plan.ops, one, zero, one, zero, xd, xv.ptr,
            xd if yv is not None else None, yv.ptr if yv is not None else None, xd, dyv.ptr,
            plan.zd, dz_ptr, xd, dx_ptr, plan.bnd, wv.ptr, bv.ptr if bv is not None else None,
            dw, db, eps, smv.ptr, siv.ptr, plan.actdesc, ws or None,
            ws_size, (rv.ptr or None) if rv is not None else None, expected)
        if status:
            lib.check(status, "cudnnBatchNormalizationBackwardEx")
    finally:
        if previous is not None:
            _leave_device(lib, previous)
    return (dx, dweight, dbias, dz) if dz is not None else (dx, dweight, dbias)


# ---- backend selection ----------------------------------------------------------

def batch_norm_backend(x: DeviceArrayLike, training: bool = True, *,
                       mode: Optional[ModeLike] = None, activation: Optional[str] = None,
                       z: Optional[DeviceArrayLike] = None) -> tuple[str, str]:
    """Which cuDNN API a batch norm of x runs on with ``backend="auto"``.

    The graph API (`cudnn_bind.batch_norm_graph`) where cuDNN has engines
    for the call (for training: its forward and its backward), else the
    legacy calls.  Builds (and caches) the graphs on x's device; runs
    nothing.

    Parameters
    ----------
    x : device array
        The input, as for `batch_norm_forward_training`.
    training : bool, optional
        A training signature (default True: forward and backward) or an
        inference one.
    mode : int or str, optional
        The mode the call would be given (None: ATen's choice).
    activation : str, optional
        None (the default) or 'relu'.
    z : device array, optional
        The residual of a fused add+ReLU.

    Returns
    -------
    backend : str
        "graph" or "legacy".
    reason : str
        '' for "graph", else why the legacy calls run (cuDNN's words where
        it has no engine).

    Raises
    ------
    TypeError, ValueError, UnsupportedError, CudnnUnavailableError, CudnnError, CudaError
        What the call itself would raise for x (its rules, its checks).
    """
    lib = _lib.get()
    fused = _fused(activation, z)
    st, xv = _stream_and_x(None, x, lib)
    training = bool(training)
    plan = _plan(lib, "training" if training else "inference", xv, mode, fused)
    refusal = graph_refusal(lib, plan, mode, fused, [("x", xv.ptr)])
    if refusal:
        return "legacy", refusal
    device, previous = _enter_device(lib, xv.device)
    try:
        h = cached_handle(device, lib)
        try:
            if training:
                for which in ("forward", "backward"):
                    training_graphs(lib, h, plan, "graph", "", which, False)
            else:
                inference_graph(lib, h, plan, "graph", "")
        except UnsupportedError as exc:
            return "legacy", str(exc)
    finally:
        if previous is not None:
            _leave_device(lib, previous)
    return "graph", ""


def can_use_cudnn(x: DeviceArrayLike, weight: Optional[DeviceArrayLike] = None,
                  bias: Optional[DeviceArrayLike] = None,
                  running_mean: Optional[DeviceArrayLike] = None,
                  running_var: Optional[DeviceArrayLike] = None, training: bool = True,
                  eps: Real = 1e-5, *, mode: Optional[ModeLike] = None,
                  activation: Optional[str] = None,
                  z: Optional[DeviceArrayLike] = None) -> tuple[bool, str]:
    """Whether PyTorch would run this batch norm with cuDNN, and cudnn_bind can.

    PyTorch falls back to its own kernels silently; this says why.  What
    the call itself would refuse (a rule of `cudnn_bind.rules`, a wrong
    dtype, shape, eps, missing array...) is reported with the very words of
    the call's error, checked in the call's order; then PyTorch's own
    conditions.  Nothing runs on the device, and bad arguments are
    reported, not raised.

    Parameters
    ----------
    x : device array
        The input, as for `batch_norm_forward_training` (a CuPy array, a
        PyTorch CUDA tensor, a `DeviceArray`, anything with
        ``__cuda_array_interface__`` or DLPack).
    weight : device array, optional
        The scale (checked as the call checks it: float64 for float64 x,
        else float32; C elements, C times the spatial sizes in
        PER_ACTIVATION mode).
    bias : device array, optional
        The shift.
    running_mean : device array, optional
        The running mean (given together with running_var; in inference
        both are needed).
    running_var : device array, optional
        The running variance.
    training : bool, optional
        A training call (default True) or an inference one.
    eps : float, optional
        The eps of the call (default 1e-5).
    mode : int or str, optional
        The mode the call would be given (None: ATen's choice).
    activation : str, optional
        None (the default) or 'relu'.
    z : device array, optional
        The residual of a fused add+ReLU.

    Returns
    -------
    ok : bool
        True when the batch norm would run on cuDNN.
    reason : str
        '' when ok, else the first condition that fails: no cuDNN, x not a
        CUDA array, then the call's own error (eps, a fused op in
        inference, x's dtype, rank or layout, a cuDNN rule, one value per
        channel, running statistics, z, a missing weight, bias or
        statistic, a parameter's dtype or size, read-only statistics,
        devices), then PyTorch's conditions: bfloat16 data, fewer than 3
        dimensions, a batch over its limit.
    """
    try:
        lib = _lib.get()
    except CudnnBindError as exc:
        return False, f"cuDNN is not available: {exc}"
    try:
        xv = as_view(x, "x", lib)
    except (TypeError, ValueError, CudnnBindError) as exc:
        return False, f"x is not a CUDA array: {exc}"
    training = bool(training)
    try:
        wv = _check_forward(lib, xv, weight, bias, running_mean, running_var, training, eps,
                            mode, activation, z)
    except (TypeError, ValueError, CudnnBindError) as exc:
        return False, str(exc)  # the call's own error (an UnsupportedError names its rule)
    # PyTorch's conditions for its cuDNN path (_select_batch_norm_backend), beyond the call's
    if xv.dtype == "bfloat16" or wv.dtype == "bfloat16":
        return False, "bfloat16 input or weight: PyTorch uses its own kernels for bfloat16"
    if xv.ndim < 3:
        return False, (f"input must have at least 3 dimensions, got {xv.ndim} (PyTorch runs 2-D "
                       "batch norm with its own kernels; cudnn_bind runs it as (N, C, 1, 1))")
    limit = TRAINING_MAX_BATCH if training else INFERENCE_MAX_BATCH
    if xv.shape[0] > limit:
        return False, f"batch of {xv.shape[0]} exceeds {limit} ({'training' if training else 'inference'})"
    return True, ""


def _check_forward(lib, xv, weight, bias, running_mean, running_var, training, eps, mode,
                   activation, z):
    """What batch_norm_forward_training (or, not training, _inference) checks
    before it touches the device, in its order and with its errors; the
    weight's view.  can_use_cudnn reports these, so it and the calls agree."""
    _eps(eps, lib)
    fused = _fused(activation, z)
    if fused is not None and not training:
        raise ValueError("activation and z fuse into training only: "
                         "cudnnBatchNormalizationForwardInference has no fused ops")
    _check_x(xv)
    layout = layout_of(xv.shape, xv.strides, "x")
    chosen = check_call(xv.shape, layout, xv.dtype, training, mode, fused, lib.version)
    if training and xv.size // xv.shape[1] <= 1:
        raise ValueError("Expected more than 1 value per channel when training, got x of "
                         f"shape {xv.shape}")
    if training and (running_mean is None) != (running_var is None):
        raise ValueError("running_mean and running_var must be given together or not at all")
    zv = None
    if z is not None:
        zv = as_view(z, "z", lib)
        _check_like(zv, xv, "z", layout)
    nparam = xv.shape[1] * (math.prod(xv.shape[2:]) if chosen == PER_ACTIVATION else 1)
    pdtype = param_dtype(xv.dtype)
    named = (("weight", weight), ("bias", bias), ("running_mean", running_mean),
             ("running_var", running_var))
    views = [xv, zv]
    for name, obj in named:
        if obj is None:
            if name in ("weight", "bias") or not training:
                raise _required(name)
            views.append(None)
            continue
        v = as_view(obj, name, lib)
        _check_param(v, name, nparam, pdtype)
        views.append(v)
    if training:
        _writable(views[4], "running_mean")
        _writable(views[5], "running_var")
    _same_device(("x", "z") + _INFERENCE_NAMES[2:], views)
    return views[2]
