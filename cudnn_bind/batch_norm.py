"""cuDNN batch normalization on device buffers: ATen's cudnn_batch_norm in Python.

Three calls of cuDNN's legacy batch-norm API (deprecated in cuDNN 9, still
supported): cudnnBatchNormalizationForwardTrainingEx, ...ForwardInference and
...BackwardEx.  Every argument is checked here before any of them runs: the
real library dereferences some NULL arguments instead of returning an error.
"""
import contextlib
import ctypes

from cudnn_bind import _lib
from cudnn_bind._args import UINT64_MAX, integer, real, show
from cudnn_bind.descriptors import (
    OPS_BN, OPS_BN_ACTIVATION, OPS_BN_ADD_ACTIVATION, PER_ACTIVATION, SPATIAL,
    SPATIAL_PERSISTENT, ActivationDescriptor, TensorDescriptor, bn_mode, derive_bn_descriptor)
from cudnn_bind.errors import CudnnBindError
from cudnn_bind.handles import Handle, device_guard, handle_for
from cudnn_bind.memory import DTYPE_SIZES, as_view, empty_like_layout

__all__ = ["batch_norm_forward_training", "batch_norm_forward_inference", "batch_norm_backward",
           "can_use_cudnn", "choose_mode", "TRAINING_MAX_BATCH", "INFERENCE_MAX_BATCH"]

# PyTorch's limits for the cuDNN path (aten/src/ATen/native/Normalization.cpp)
TRAINING_MAX_BATCH = 880801
INFERENCE_MAX_BATCH = 65535
_INT32_MAX = 2 ** 31 - 1


# ---- argument checks ---------------------------------------------------------

def _packed(v, order):
    """Whether v is densely packed with its dimensions, innermost first, in
    `order` (size-1 dimensions may have any stride)."""
    acc = 1
    for i in order:
        if v.shape[i] != 1 and v.strides[i] != acc:
            return False
        acc *= v.shape[i]
    return True


def _layout(v, name):
    """'contiguous' (N,C,...) or 'channels_last' (N,...,C), else ValueError."""
    nd = v.ndim
    if _packed(v, range(nd - 1, -1, -1)):
        return "contiguous"
    if nd in (4, 5) and _packed(v, [1] + list(range(nd - 1, 1, -1)) + [0]):
        return "channels_last"
    raise ValueError(f"{name} must be contiguous in N,C,... order or channels-last, "
                     f"got shape {v.shape} with strides {v.strides} (elements)")


def choose_mode(ndim, layout, training):
    """The cudnnBatchNormMode_t ATen picks (getCudnnBatchNormMode) for an
    input of `ndim` (2 to 5) dimensions in `layout` ('contiguous' or
    'channels_last')."""
    ndim = integer(ndim, "ndim", 2, 5)
    if not isinstance(layout, str) or layout not in ("contiguous", "channels_last"):
        raise ValueError(f"layout must be 'contiguous' or 'channels_last', got {show(layout)}")
    if ndim == 2:
        return PER_ACTIVATION
    if training and layout == "channels_last":
        return SPATIAL_PERSISTENT
    return SPATIAL


def _mode(mode, ndim, layout, training):
    if mode is None:
        return choose_mode(ndim, layout, training)
    return bn_mode(mode)


def _ops(activation, z):
    if activation is not None and not (isinstance(activation, str) and activation == "relu"):
        raise ValueError(f"activation must be None or 'relu', got {show(activation)}")
    if z is not None:
        if activation != "relu":
            raise ValueError("z (the residual added before the activation) needs activation='relu': "
                             "cuDNN fuses bn(x) + z only with an activation")
        return OPS_BN_ADD_ACTIVATION
    return OPS_BN_ACTIVATION if activation == "relu" else OPS_BN


def _param_dtype(x_dtype):
    # cuDNN keeps scale/bias/statistics in float for float/half/bfloat16 data
    return "float64" if x_dtype == "float64" else "float32"


def _check_x(x, name="x"):
    if x.dtype not in ("float32", "float64", "float16", "bfloat16"):
        raise TypeError(f"{name} must be float32, float64, float16 or bfloat16, got {x.dtype}")
    if not 2 <= x.ndim <= 5:
        raise ValueError(f"{name} must have 2 to 5 dimensions (N, C, ...), got shape {x.shape}")
    if x.shape[1] < 1:
        raise ValueError(f"{name} must have at least one channel, got shape {x.shape}")
    if x.size >= _INT32_MAX:
        raise ValueError(f"{name} has {x.size} elements; cuDNN batch norm indexes with 32 bits "
                         f"(at most {_INT32_MAX - 1})")
    return _layout(x, name)


def _check_like(v, x, name, layout):
    if v.shape != x.shape:
        raise ValueError(f"{name} must have x's shape {x.shape}, got {v.shape}")
    if v.dtype != x.dtype:
        raise TypeError(f"{name} must have x's dtype {x.dtype}, got {v.dtype}")
    if v.ndim >= 4 and v.size and _layout(v, name) != layout:
        raise ValueError(f"{name} must have x's memory layout ({layout})")
    if v.ndim < 4:
        _layout(v, name)


def _check_param(v, name, count, dtype):
    if v.dtype != dtype:
        data = "float64" if dtype == "float64" else "float32, float16 or bfloat16"
        raise TypeError(f"{name} must be {dtype} for {data} data (cuDNN's rule), got {v.dtype}")
    if v.size != count:
        raise ValueError(f"{name} must have {count} elements, got shape {v.shape}")
    if not _packed(v, range(v.ndim - 1, -1, -1)):
        raise ValueError(f"{name} must be contiguous, got strides {v.strides} (elements)")


def _same_device(views):
    # an empty array may have no memory (pointer 0) and so no device
    devices = {(n, v.device) for n, v in views if v is not None and (v.size or v.ptr)}
    known = {d for _, d in devices if d is not None}
    if len(known) > 1:
        where = ", ".join(f"{n} on {d}" for n, d in sorted(devices, key=str))
        raise ValueError(f"all arrays must be on the same device, got {where}")
    if not known:
        return None
    if None in {d for _, d in devices}:
        host = [n for n, d in devices if d is None]
        raise ValueError(f"{', '.join(host)}: not device memory (cudaPointerGetAttributes "
                         "reports host or unregistered memory)")
    return known.pop()


def _eps(eps, lib):
    eps = real(eps, "eps")
    if not eps >= lib.min_epsilon:
        raise ValueError(f"eps must be >= {lib.min_epsilon} (CUDNN_BN_MIN_EPSILON of cuDNN "
                         f"{lib.major}), got {eps}")
    return eps


def _stream(stream, ref):
    """The cudaStream_t to run on: `stream`, else the stream PyTorch or CuPy
    would use for ref's device (as ATen does), else the legacy default (0)."""
    if stream is None:
        if ref.kind == "torch":
            import torch
            return int(torch.cuda.current_stream(ref.device).cuda_stream)
        if ref.kind == "cupy":
            import cupy
            with cupy.cuda.Device(ref.device):
                return int(cupy.cuda.get_current_stream().ptr)
        return 0
    try:
        return integer(stream, "stream", 0, UINT64_MAX)
    except TypeError:  # not an int: a stream object
        pass
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if isinstance(value, ctypes.c_void_p):  # Numba's stream.handle
            value = value.value or 0
        if isinstance(value, int) and not isinstance(value, bool):
            return integer(value, f"stream.{attr}", 0, UINT64_MAX)
    raise TypeError(f"stream must be None, an int cudaStream_t or an object with .ptr / "
                    f".cuda_stream, got {type(stream).__name__}")


def _handle(handle, device, lib):
    if handle is None:
        return handle_for(device, lib)
    if not isinstance(handle, Handle):
        raise TypeError(f"handle must be None or a cudnn_bind Handle, got {type(handle).__name__}")
    # the real library dereferences a NULL or stale handle instead of failing
    if not handle.alive or handle.lib is not lib:
        raise ValueError("handle has been destroyed (or belongs to a library loaded before); "
                         "use cudnn_bind.handle_for(device)")
    if handle.device != device:
        raise ValueError(f"handle is for device {handle.device}, the arrays are on {device}")
    return handle


def _scalars(dtype):
    # alpha/beta point to double for double data, to float otherwise
    ctype = ctypes.c_double if dtype == "float64" else ctypes.c_float
    return ctypes.byref(ctype(1.0)), ctypes.byref(ctype(0.0))


def _new_like(x, ref_view, dtype=None):
    return empty_like_layout(ref_view, x.shape, x.strides, dtype or x.dtype)


def _out(out, x, name, layout):
    if out is None:
        return None, None
    v = as_view(out, name)
    _check_like(v, x, name, layout)
    _writable(v, name)
    return out, v


def _writable(v, name):
    if v is not None and v.read_only:
        raise ValueError(f"{name} is read-only (its exporter says so) but batch norm writes it")


class _Call:
    """Descriptors and checked views shared by the three entry points."""

    def __init__(self, x, training, mode, activation, z, lib):
        self.lib = lib
        self.x = as_view(x, "x", lib)
        self.layout = _check_x(self.x)
        self.mode = _mode(mode, self.x.ndim, self.layout, training)
        self.ops = _ops(activation, z)
        self.z = None
        if z is not None:
            self.z = as_view(z, "z", lib)
            _check_like(self.z, self.x, "z", self.layout)
        self.pdtype = _param_dtype(self.x.dtype)
        # cuDNN has no empty tensors: an empty x is described with its zero
        # sizes as 1 (only the parameter shapes are used then; no call runs)
        shape = tuple(max(d, 1) for d in self.x.shape) if self.x.size == 0 else self.x.shape
        self.xdesc = TensorDescriptor(shape, self.x.strides, self.x.dtype,
                                      channels_last=self.layout == "channels_last")
        self.bndesc = derive_bn_descriptor(self.xdesc, self.mode)
        self.nparam = 1
        for d in self.bndesc.get()[1]:
            self.nparam *= d
        self.act = ActivationDescriptor() if self.ops != OPS_BN else None
        self._guard = contextlib.ExitStack()

    def on_device(self, device, handle):
        """Make the arrays' device current until close(); return the handle
        to use and the stream set on it for this call."""
        if device is None:  # only empty arrays: the current device
            current = ctypes.c_int()
            self.lib.cuda("cudaGetDevice", ctypes.byref(current))
            device = current.value
        self._guard.enter_context(device_guard(self.lib, device))
        return _handle(handle, device, self.lib)

    @property
    def actdesc(self):
        return self.act.value if self.act is not None else None

    def close(self):
        for d in (self.xdesc, self.bndesc, self.act):
            if d is not None:
                d.close()
        self._guard.close()

    def new_param(self):
        return empty_like_layout(self.x, (self.nparam,), (1,), self.pdtype)

    def reserve_size(self, handle):
        size = ctypes.c_size_t()
        self.lib.call("cudnnGetBatchNormalizationTrainingExReserveSpaceSize", handle.ptr,
                      self.mode, self.ops, self.actdesc, self.xdesc.value, ctypes.byref(size))
        return size.value


def _params(call, named, required):
    views = {}
    for name, obj in named.items():
        if obj is None:
            if name in required:
                raise ValueError(f"{name} is required (cuDNN batch norm has no default for it)")
            views[name] = None
            continue
        v = as_view(obj, name, call.lib)
        _check_param(v, name, call.nparam, call.pdtype)
        views[name] = v
    return views


def _ptr(v):
    return v.ptr if v is not None else None


# ---- forward, training ---------------------------------------------------------

def batch_norm_forward_training(x, weight, bias, running_mean=None, running_var=None,
                                exponential_average_factor=0.1, eps=1e-5, *, out=None, z=None,
                                activation=None, mode=None, handle=None, stream=None):
    """Batch norm over a training batch (cudnnBatchNormalizationForwardTrainingEx).

    Returns (y, save_mean, save_invstd, reserve).  running_mean/running_var
    (both or neither) are updated in place: new = (1 - f) * old + f * batch,
    with the unbiased batch variance.  activation='relu' fuses a ReLU; z
    (x's shape) fuses y = relu(bn(x) + z).  `reserve` must be passed to the
    matching batch_norm_backward."""
    lib = _lib.get()
    eps = _eps(eps, lib)
    factor = real(exponential_average_factor, "exponential_average_factor")
    call = _Call(x, True, mode, activation, z, lib)
    try:
        xv = call.x
        if xv.shape[0] > TRAINING_MAX_BATCH:
            raise ValueError(f"x has a batch of {xv.shape[0]}; cuDNN batch-norm training is limited to "
                             f"N <= {TRAINING_MAX_BATCH} (PyTorch's limit): split the batch or use "
                             "cynorm's split-statistics ops")
        if xv.size // xv.shape[1] <= 1:
            raise ValueError("Expected more than 1 value per channel when training, got x of "
                             f"shape {xv.shape}")
        if (running_mean is None) != (running_var is None):
            raise ValueError("running_mean and running_var must be given together or not at all")
        p = _params(call, {"weight": weight, "bias": bias, "running_mean": running_mean,
                           "running_var": running_var}, required=("weight", "bias"))
        y, yv = _out(out, xv, "out", call.layout)
        _writable(p["running_mean"], "running_mean")  # updated in place
        _writable(p["running_var"], "running_var")
        device = _same_device([("x", xv), ("z", call.z), ("out", yv)] + list(p.items()))
        h = call.on_device(device, handle)
        st = _stream(stream, xv)
        h.set_stream(st)
        if y is None:
            y = _new_like(xv, xv)
            yv = as_view(y, "y", lib)
        save_mean, save_invstd = call.new_param(), call.new_param()
        sm, si = as_view(save_mean, "save_mean", lib), as_view(save_invstd, "save_invstd", lib)
        ws_size = ctypes.c_size_t()
        lib.call("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize", h.ptr, call.mode,
                 call.ops, call.xdesc.value, call.xdesc.value if call.z else None, call.xdesc.value,
                 call.bndesc.value, call.actdesc, ctypes.byref(ws_size))
        ws = h.workspace(ws_size.value, xv, st)
        rs_size = call.reserve_size(h)
        reserve = empty_like_layout(xv, (rs_size,), (1,), "uint8")
        rs = as_view(reserve, "reserve", lib)
        one, zero = _scalars(xv.dtype)
        lib.call("cudnnBatchNormalizationForwardTrainingEx", h.ptr, call.mode, call.ops, one, zero,
                 call.xdesc.value, xv.ptr, call.xdesc.value if call.z else None, _ptr(call.z),
                 call.xdesc.value, yv.ptr, call.bndesc.value, p["weight"].ptr, p["bias"].ptr,
                 factor, _ptr(p["running_mean"]),
                 _ptr(p["running_var"]), eps, sm.ptr, si.ptr, call.actdesc, ws or None,
                 ws_size.value, rs.ptr or None, rs_size)
        return y, save_mean, save_invstd, reserve
    finally:
        call.close()


# ---- forward, inference --------------------------------------------------------

def batch_norm_forward_inference(x, weight, bias, running_mean, running_var, eps=1e-5, *,
                                 out=None, mode=None, handle=None, stream=None):
    """Batch norm with running statistics (cudnnBatchNormalizationForwardInference).

    Batches over 65535 samples (PyTorch's limit for this call) run in chunks."""
    lib = _lib.get()
    eps = _eps(eps, lib)
    call = _Call(x, False, mode, None, None, lib)
    chunk_descs = []
    try:
        xv = call.x
        p = _params(call, {"weight": weight, "bias": bias, "running_mean": running_mean,
                           "running_var": running_var},
                    required=("weight", "bias", "running_mean", "running_var"))
        y, yv = _out(out, xv, "out", call.layout)
        device = _same_device([("x", xv), ("out", yv)] + list(p.items()))
        h = call.on_device(device, handle)
        h.set_stream(_stream(stream, xv))
        if y is None:
            y = _new_like(xv, xv)
            yv = as_view(y, "y", lib)
        if xv.size == 0:  # an empty batch: nothing for cuDNN to do
            return y
        one, zero = _scalars(xv.dtype)
        n = xv.shape[0]
        step = INFERENCE_MAX_BATCH
        isz = DTYPE_SIZES[xv.dtype]
        for n0 in range(0, n, step):
            rows = min(step, n - n0)
            if rows == n:
                desc = call.xdesc
            else:
                desc = TensorDescriptor((rows,) + xv.shape[1:], xv.strides, xv.dtype,
                                        channels_last=call.layout == "channels_last")
                chunk_descs.append(desc)
            offset = n0 * xv.strides[0] * isz
            lib.call("cudnnBatchNormalizationForwardInference", h.ptr, call.mode, one, zero,
                     desc.value, xv.ptr + offset, desc.value, yv.ptr + offset, call.bndesc.value,
                     p["weight"].ptr, p["bias"].ptr, p["running_mean"].ptr, p["running_var"].ptr,
                     eps)
        return y
    finally:
        for d in chunk_descs:
            d.close()
        call.close()


# ---- backward ---------------------------------------------------------------------

def batch_norm_backward(x, dy, weight, save_mean, save_invstd, eps, reserve, *, y=None, z=None,
                        bias=None, activation=None, mode=None, handle=None, stream=None):
    """Gradients of training-mode batch norm (cudnnBatchNormalizationBackwardEx).

    Returns (dx, dweight, dbias), and dz too when z is given.  save_mean,
    save_invstd and reserve come from the matching forward call, with the
    same eps, activation, z and mode.  With activation='relu' cuDNN also
    needs the forward's output y and bias."""
    lib = _lib.get()
    eps = _eps(eps, lib)
    call = _Call(x, True, mode, activation, z, lib)
    try:
        xv = call.x
        if xv.size // xv.shape[1] <= 1:
            raise ValueError("Expected more than 1 value per channel when training (batch norm "
                             f"backward uses training statistics), got x of shape {xv.shape}")
        dyv = as_view(dy, "dy", lib)
        _check_like(dyv, xv, "dy", call.layout)
        yv = None
        if call.ops != OPS_BN:
            if y is None or bias is None:
                raise ValueError("activation='relu' backward needs the forward output y and bias "
                                 "(cuDNN recomputes the activation's input from them)")
            yv = as_view(y, "y", lib)
            _check_like(yv, xv, "y", call.layout)
        p = _params(call, {"weight": weight, "bias": bias, "save_mean": save_mean,
                           "save_invstd": save_invstd},
                    required=("weight", "save_mean", "save_invstd"))
        rv = as_view(reserve, "reserve", lib) if reserve is not None else None
        device = _same_device([("x", xv), ("dy", dyv), ("y", yv), ("z", call.z)]
                              + list(p.items()) + ([("reserve", rv)] if rv is not None and rv.size else []))
        h = call.on_device(device, handle)
        st = _stream(stream, xv)
        h.set_stream(st)
        expected = call.reserve_size(h)
        got = 0 if rv is None else rv.size * DTYPE_SIZES[rv.dtype]
        if got != expected:
            raise ValueError(f"reserve has {got} bytes but cuDNN asks for {expected} for this shape, "
                             "mode and activation: pass the reserve returned by the matching "
                             "batch_norm_forward_training call")
        dx = _new_like(xv, xv)
        dxv = as_view(dx, "dx", lib)
        dz = _new_like(xv, xv) if call.z is not None else None
        dzv = as_view(dz, "dz", lib) if dz is not None else None
        dweight, dbias = call.new_param(), call.new_param()
        dwv, dbv = as_view(dweight, "dweight", lib), as_view(dbias, "dbias", lib)
        ws_size = ctypes.c_size_t()
        zdesc = call.xdesc.value if call.z is not None else None
        lib.call("cudnnGetBatchNormalizationBackwardExWorkspaceSize", h.ptr, call.mode, call.ops,
                 call.xdesc.value, call.xdesc.value if yv else None, call.xdesc.value, zdesc,
                 call.xdesc.value, call.bndesc.value, call.actdesc, ctypes.byref(ws_size))
        ws = h.workspace(ws_size.value, xv, st)
        one, zero = _scalars(xv.dtype)
        lib.call("cudnnBatchNormalizationBackwardEx", h.ptr, call.mode, call.ops, one, zero, one,
                 zero, call.xdesc.value, xv.ptr, call.xdesc.value if yv else None, _ptr(yv),
                 call.xdesc.value, dyv.ptr, zdesc, _ptr(dzv), call.xdesc.value, dxv.ptr,
                 call.bndesc.value, p["weight"].ptr, _ptr(p["bias"]), dwv.ptr, dbv.ptr, eps,
                 p["save_mean"].ptr, p["save_invstd"].ptr, call.actdesc, ws or None,
                 ws_size.value, (rv.ptr or None) if rv is not None else None, expected)
        return (dx, dweight, dbias, dz) if dz is not None else (dx, dweight, dbias)
    finally:
        call.close()


# ---- backend selection ----------------------------------------------------------

def can_use_cudnn(x, weight=None, bias=None, running_mean=None, running_var=None, training=True,
                  eps=1e-5):
    """(True, '') when PyTorch would run this batch norm with cuDNN, else
    (False, the first condition that fails).  PyTorch falls back to its own
    kernels silently; this says why."""
    try:
        lib = _lib.get()
    except CudnnBindError as exc:
        return False, f"cuDNN is not available: {exc}"
    try:
        xv = as_view(x, "x", lib)
    except (TypeError, ValueError, CudnnBindError) as exc:
        return False, f"x is not a CUDA array: {exc}"
    try:
        wd = as_view(weight, "weight", lib).dtype if weight is not None else None
        for name, obj in (("bias", bias), ("running_mean", running_mean),
                          ("running_var", running_var)):
            if obj is not None:
                as_view(obj, name, lib)
    except (TypeError, ValueError, CudnnBindError) as exc:
        return False, str(exc)
    if xv.dtype == "bfloat16" or wd == "bfloat16":
        return False, "bfloat16 input or weight: PyTorch uses its own kernels for bfloat16"
    if xv.dtype == "float16" and wd not in (None, "float32"):
        return False, f"float16 input needs float32 weight for cuDNN, got {wd}"
    if weight is None or bias is None:
        return False, "weight and bias must both be given"
    if not ((running_mean is not None and running_var is not None)
            or (running_mean is None and running_var is None and training)):
        return False, ("running_mean and running_var must both be given (or, in training, both "
                       "omitted)")
    if xv.ndim < 3:
        return False, f"input must have at least 3 dimensions, got {xv.ndim}"
    limit = TRAINING_MAX_BATCH if training else INFERENCE_MAX_BATCH
    if xv.shape[0] > limit:
        return False, f"batch of {xv.shape[0]} exceeds {limit} ({'training' if training else 'inference'})"
    try:
        eps = real(eps, "eps")
    except (TypeError, ValueError) as exc:
        return False, str(exc)
    if eps < lib.min_epsilon:
        return False, f"eps {eps} is below CUDNN_BN_MIN_EPSILON ({lib.min_epsilon})"
    if xv.size >= _INT32_MAX:
        return False, f"input has {xv.size} elements (32-bit indexing limit)"
    return True, ""
