"""cuDNN's graph API (backend descriptors) through ctypes.

A graph is built from backend descriptors: tensors (each with a unique id),
operation nodes (normalization forward and backward here), an operation
graph over a handle; cuDNN's heuristics rank the engine configurations that
can run it, and the first whose execution plan finalizes is kept.  A call
then hands the plan a variant pack (each tensor id's device address, the
workspace) and executes it on the handle's stream.

`Graph` holds one finalized plan and everything it references; the callers
(`cudnn_bind.batch_norm`, `cudnn_bind.layer_norm`) cache one per call
signature and device.  cuDNN 9 is needed (the norm nodes' engines and the
statuses named here are 9's); `graph_unavailable` says why not otherwise.

The numbers below are the values of cudnn_graph.h (cuDNN 9);
tests/test_cudnn_structs.py compiles them against the installed header.
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional, Sequence

from cudnn_bind.errors import CudnnError, UnsupportedError

__all__ = ["Descriptor", "Graph", "GRAPH_FUNCTIONS", "CONSTANTS", "graph_unavailable",
           "tensor", "norm_forward", "norm_backward", "pointwise", "build_graph", "misaligned",
           "ALIGNMENT"]

c_int, c_int64, c_void_p = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
P = ctypes.POINTER

GRAPH_FUNCTIONS: dict[str, tuple[Any, list[Any]]] = {
    "cudnnBackendCreateDescriptor": (c_int, [c_int, P(c_void_p)]),
    "cudnnBackendDestroyDescriptor": (c_int, [c_void_p]),
    "cudnnBackendFinalize": (c_int, [c_void_p]),
    "cudnnBackendSetAttribute": (c_int, [c_void_p, c_int, c_int, c_int64, c_void_p]),
    "cudnnBackendGetAttribute": (c_int, [c_void_p, c_int, c_int, c_int64, P(c_int64),
                                         c_void_p]),
    "cudnnBackendExecute": (c_int, [c_void_p, c_void_p, c_void_p]),
}

# cudnnBackendAttributeType_t
TYPE_HANDLE, TYPE_DATA_TYPE, TYPE_BOOLEAN, TYPE_INT64 = 0, 1, 2, 3
TYPE_FLOAT, TYPE_DOUBLE, TYPE_VOID_PTR = 4, 5, 6
TYPE_HEUR_MODE, TYPE_BACKEND_DESCRIPTOR = 8, 15
TYPE_NORM_MODE, TYPE_NORM_FWD_PHASE = 27, 28
TYPE_POINTWISE_MODE = 14
# cudnnBackendDescriptorType_t
ENGINE_DESCRIPTOR, ENGINECFG_DESCRIPTOR, ENGINEHEUR_DESCRIPTOR = 2, 3, 4
EXECUTION_PLAN_DESCRIPTOR, OPERATIONGRAPH_DESCRIPTOR = 5, 15
VARIANT_PACK_DESCRIPTOR, TENSOR_DESCRIPTOR = 16, 17
OPERATION_NORM_FORWARD_DESCRIPTOR, OPERATION_NORM_BACKWARD_DESCRIPTOR = 29, 30
POINTWISE_DESCRIPTOR, OPERATION_POINTWISE_DESCRIPTOR = 0, 13
# cudnnBackendAttributeName_t
ATTR_ENGINEHEUR_MODE, ATTR_ENGINEHEUR_OPERATION_GRAPH, ATTR_ENGINEHEUR_RESULTS = 200, 201, 202
ATTR_EXECUTION_PLAN_HANDLE, ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 400, 401
ATTR_EXECUTION_PLAN_WORKSPACE_SIZE = 402
ATTR_OPERATIONGRAPH_HANDLE, ATTR_OPERATIONGRAPH_OPS = 800, 801
ATTR_TENSOR_BYTE_ALIGNMENT, ATTR_TENSOR_DATA_TYPE = 900, 901
ATTR_TENSOR_DIMENSIONS, ATTR_TENSOR_STRIDES = 902, 903
ATTR_TENSOR_UNIQUE_ID, ATTR_TENSOR_IS_VIRTUAL, ATTR_TENSOR_IS_BY_VALUE = 906, 907, 908
ATTR_VARIANT_PACK_UNIQUE_IDS, ATTR_VARIANT_PACK_DATA_POINTERS = 1000, 1001
ATTR_VARIANT_PACK_WORKSPACE = 1003
ATTR_ENGINE_GLOBAL_INDEX = 1301
ATTR_ENGINECFG_ENGINE = 300
ATTR_POINTWISE_MODE, ATTR_POINTWISE_MATH_PREC = 0, 1
ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, ATTR_OPERATION_POINTWISE_XDESC = 750, 751
ATTR_OPERATION_POINTWISE_BDESC, ATTR_OPERATION_POINTWISE_YDESC = 752, 753
# cudnnPointwiseMode_t
POINTWISE_ADD, POINTWISE_RSQRT, POINTWISE_IDENTITY = 0, 17, 21
# the norm nodes' attributes: (the name norm_forward / norm_backward take,
# the suffix of cudnn_graph.h's CUDNN_ATTR_OPERATION_NORM_FWD_/_BWD_ name, value)
_NORM_FWD = (("mode", "MODE", 2000), ("phase", "PHASE", 2001), ("x", "XDESC", 2002),
             ("mean", "MEAN_DESC", 2003), ("inv_variance", "INV_VARIANCE_DESC", 2004),
             ("scale", "SCALE_DESC", 2005), ("bias", "BIAS_DESC", 2006),
             ("epsilon", "EPSILON_DESC", 2007), ("momentum", "EXP_AVG_FACTOR_DESC", 2008),
             ("running_mean_in", "INPUT_RUNNING_MEAN_DESC", 2009),
             ("running_var_in", "INPUT_RUNNING_VAR_DESC", 2010),
             ("running_mean_out", "OUTPUT_RUNNING_MEAN_DESC", 2011),
             ("running_var_out", "OUTPUT_RUNNING_VAR_DESC", 2012), ("y", "YDESC", 2013))
_NORM_BWD = (("mode", "MODE", 2100), ("x", "XDESC", 2101), ("mean", "MEAN_DESC", 2102),
             ("inv_variance", "INV_VARIANCE_DESC", 2103), ("dy", "DYDESC", 2104),
             ("scale", "SCALE_DESC", 2105), ("epsilon", "EPSILON_DESC", 2106),
             ("dscale", "DSCALE_DESC", 2107), ("dbias", "DBIAS_DESC", 2108),
             ("dx", "DXDESC", 2109))
NORM_FWD_ATTRS = {name: value for name, _, value in _NORM_FWD}
NORM_BWD_ATTRS = {name: value for name, _, value in _NORM_BWD}
# cudnnBackendNormMode_t, cudnnBackendNormFwdPhase_t, cudnnBackendHeurMode_t
LAYER_NORM, INSTANCE_NORM, BATCH_NORM, RMS_NORM = 0, 1, 2, 4
NORM_FWD_INFERENCE, NORM_FWD_TRAINING = 0, 1
HEUR_MODE_FALLBACK, HEUR_MODE_A = 2, 3
# cudnnDataType_t
DATA_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 9}
STATUS_NOT_SUPPORTED = 3000

# every number above with its name in cudnn_graph.h, for the header test
CONSTANTS: dict[str, int] = {
    "CUDNN_TYPE_HANDLE": TYPE_HANDLE, "CUDNN_TYPE_DATA_TYPE": TYPE_DATA_TYPE,
    "CUDNN_TYPE_BOOLEAN": TYPE_BOOLEAN, "CUDNN_TYPE_INT64": TYPE_INT64,
    "CUDNN_TYPE_FLOAT": TYPE_FLOAT, "CUDNN_TYPE_DOUBLE": TYPE_DOUBLE,
    "CUDNN_TYPE_VOID_PTR": TYPE_VOID_PTR, "CUDNN_TYPE_HEUR_MODE": TYPE_HEUR_MODE,
    "CUDNN_TYPE_BACKEND_DESCRIPTOR": TYPE_BACKEND_DESCRIPTOR,
    "CUDNN_TYPE_NORM_MODE": TYPE_NORM_MODE, "CUDNN_TYPE_NORM_FWD_PHASE": TYPE_NORM_FWD_PHASE,
    "CUDNN_BACKEND_ENGINE_DESCRIPTOR": ENGINE_DESCRIPTOR,
    "CUDNN_BACKEND_ENGINECFG_DESCRIPTOR": ENGINECFG_DESCRIPTOR,
    "CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR": ENGINEHEUR_DESCRIPTOR,
    "CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR": EXECUTION_PLAN_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR": OPERATIONGRAPH_DESCRIPTOR,
    "CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR": VARIANT_PACK_DESCRIPTOR,
    "CUDNN_BACKEND_TENSOR_DESCRIPTOR": TENSOR_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR": OPERATION_NORM_FORWARD_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR": OPERATION_NORM_BACKWARD_DESCRIPTOR,
    "CUDNN_ATTR_ENGINEHEUR_MODE": ATTR_ENGINEHEUR_MODE,
    "CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH": ATTR_ENGINEHEUR_OPERATION_GRAPH,
    "CUDNN_ATTR_ENGINEHEUR_RESULTS": ATTR_ENGINEHEUR_RESULTS,
    "CUDNN_ATTR_EXECUTION_PLAN_HANDLE": ATTR_EXECUTION_PLAN_HANDLE,
    "CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG": ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
    "CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE": ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
    "CUDNN_ATTR_OPERATIONGRAPH_HANDLE": ATTR_OPERATIONGRAPH_HANDLE,
    "CUDNN_ATTR_OPERATIONGRAPH_OPS": ATTR_OPERATIONGRAPH_OPS,
    "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT": ATTR_TENSOR_BYTE_ALIGNMENT,
    "CUDNN_ATTR_TENSOR_DATA_TYPE": ATTR_TENSOR_DATA_TYPE,
    "CUDNN_ATTR_TENSOR_DIMENSIONS": ATTR_TENSOR_DIMENSIONS,
    "CUDNN_ATTR_TENSOR_STRIDES": ATTR_TENSOR_STRIDES,
    "CUDNN_ATTR_TENSOR_UNIQUE_ID": ATTR_TENSOR_UNIQUE_ID,
    "CUDNN_ATTR_TENSOR_IS_VIRTUAL": ATTR_TENSOR_IS_VIRTUAL,
    "CUDNN_ATTR_TENSOR_IS_BY_VALUE": ATTR_TENSOR_IS_BY_VALUE,
    "CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS": ATTR_VARIANT_PACK_UNIQUE_IDS,
    "CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS": ATTR_VARIANT_PACK_DATA_POINTERS,
    "CUDNN_ATTR_VARIANT_PACK_WORKSPACE": ATTR_VARIANT_PACK_WORKSPACE,
    "CUDNN_ATTR_ENGINE_GLOBAL_INDEX": ATTR_ENGINE_GLOBAL_INDEX,
    "CUDNN_LAYER_NORM": LAYER_NORM, "CUDNN_INSTANCE_NORM": INSTANCE_NORM,
    "CUDNN_BATCH_NORM": BATCH_NORM, "CUDNN_RMS_NORM": RMS_NORM,
    "CUDNN_NORM_FWD_INFERENCE": NORM_FWD_INFERENCE, "CUDNN_NORM_FWD_TRAINING": NORM_FWD_TRAINING,
    "CUDNN_HEUR_MODE_FALLBACK": HEUR_MODE_FALLBACK, "CUDNN_HEUR_MODE_A": HEUR_MODE_A,
    "CUDNN_DATA_FLOAT": DATA_TYPES["float32"], "CUDNN_DATA_DOUBLE": DATA_TYPES["float64"],
    "CUDNN_DATA_HALF": DATA_TYPES["float16"], "CUDNN_DATA_BFLOAT16": DATA_TYPES["bfloat16"],
    "CUDNN_STATUS_NOT_SUPPORTED": STATUS_NOT_SUPPORTED,
    "CUDNN_TYPE_POINTWISE_MODE": TYPE_POINTWISE_MODE,
    "CUDNN_BACKEND_POINTWISE_DESCRIPTOR": POINTWISE_DESCRIPTOR,
    "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR": OPERATION_POINTWISE_DESCRIPTOR,
    "CUDNN_ATTR_ENGINECFG_ENGINE": ATTR_ENGINECFG_ENGINE,
    "CUDNN_ATTR_POINTWISE_MODE": ATTR_POINTWISE_MODE,
    "CUDNN_ATTR_POINTWISE_MATH_PREC": ATTR_POINTWISE_MATH_PREC,
    "CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR": ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
    "CUDNN_ATTR_OPERATION_POINTWISE_XDESC": ATTR_OPERATION_POINTWISE_XDESC,
    "CUDNN_ATTR_OPERATION_POINTWISE_BDESC": ATTR_OPERATION_POINTWISE_BDESC,
    "CUDNN_ATTR_OPERATION_POINTWISE_YDESC": ATTR_OPERATION_POINTWISE_YDESC,
    "CUDNN_POINTWISE_ADD": POINTWISE_ADD, "CUDNN_POINTWISE_RSQRT": POINTWISE_RSQRT,
    "CUDNN_POINTWISE_IDENTITY": POINTWISE_IDENTITY,
}
CONSTANTS.update({f"CUDNN_ATTR_OPERATION_NORM_FWD_{suffix}": value
                  for _, suffix, value in _NORM_FWD})
CONSTANTS.update({f"CUDNN_ATTR_OPERATION_NORM_BWD_{suffix}": value
                  for _, suffix, value in _NORM_BWD})

# the ctypes element type of each attribute type set here
_ELEMENT = {TYPE_HANDLE: c_void_p, TYPE_DATA_TYPE: c_int, TYPE_BOOLEAN: ctypes.c_bool,
            TYPE_INT64: c_int64, TYPE_FLOAT: ctypes.c_float, TYPE_DOUBLE: ctypes.c_double,
            TYPE_VOID_PTR: c_void_p, TYPE_HEUR_MODE: c_int, TYPE_BACKEND_DESCRIPTOR: c_void_p,
            TYPE_NORM_MODE: c_int, TYPE_NORM_FWD_PHASE: c_int, TYPE_POINTWISE_MODE: c_int}


def graph_unavailable(lib: Any) -> str:
    """Why the graph path cannot be used with `lib` ('' when it can)."""
    if lib.major < 9:
        return f"cuDNN {lib.version} is older than 9 (its norm graphs are not used)"
    if not getattr(lib, "has_graph", False):
        return f"{lib.cudnn_path} lacks the backend-descriptor functions"
    return ""


class Descriptor:
    """One backend descriptor (cudnnBackendCreateDescriptor), destroyed with
    the object.  `keep` holds what it references (descriptors set as its
    attributes), so they outlive it."""

    __slots__ = ("lib", "ptr", "keep", "uid", "__weakref__")

    def __init__(self, lib: Any, kind: int) -> None:
        self.lib = lib
        self.uid = 0  # a tensor's unique id
        self.ptr = c_void_p()
        self.keep: list[Any] = []
        lib.call("cudnnBackendCreateDescriptor", kind, ctypes.byref(self.ptr))

    def set(self, attr: int, atype: int, values: Sequence[Any]) -> None:
        """cudnnBackendSetAttribute(attr) with `values` of type `atype`
        (Descriptors for TYPE_BACKEND_DESCRIPTOR)."""
        if atype == TYPE_BACKEND_DESCRIPTOR:
            self.keep.extend(values)
            values = [d.ptr.value for d in values]
        array = (_ELEMENT[atype] * len(values))(*values)
        self.lib.call("cudnnBackendSetAttribute", self.ptr, attr, atype, len(values),
                      ctypes.cast(array, c_void_p))

    def get_int64(self, attr: int) -> int:
        out, count = c_int64(), c_int64()
        self.lib.call("cudnnBackendGetAttribute", self.ptr, attr, TYPE_INT64, 1,
                      ctypes.byref(count), ctypes.byref(out))
        return out.value

    def finalize(self) -> None:
        self.lib.call("cudnnBackendFinalize", self.ptr)

    def close(self) -> None:
        ptr, self.ptr = self.ptr, c_void_p()
        if ptr:
            try:
                self.lib.cudnn.cudnnBackendDestroyDescriptor(ptr)
            except Exception:  # interpreter shutdown: the library may be gone
                pass
        self.keep = []

    def __del__(self) -> None:
        self.close()


# The byte alignment of every address a graph is given.  cuDNN's norm
# kernels load 16 bytes at a time whatever a tensor's BYTE_ALIGNMENT says
# (cuDNN 9.19 on an H200: float32 weights at a 4-byte offset, declared
# 4-byte aligned, faulted with "misaligned address", which spoils the CUDA
# context for the whole process), so every tensor promises 16 and the calls
# keep other addresses away from the graphs.
ALIGNMENT = 16


def tensor(lib: Any, uid: int, dtype: str, dims: Sequence[int], strides: Sequence[int],
           virtual: bool = False, by_value: bool = False) -> Descriptor:
    """A finalized tensor descriptor: id `uid`, cuDNN's type for `dtype`
    (float32, float64, float16, bfloat16), dims and strides in elements,
    addresses ALIGNMENT-aligned; a by-value tensor is a host scalar (eps,
    the momentum)."""
    t = Descriptor(lib, TENSOR_DESCRIPTOR)
    t.uid = uid
    t.set(ATTR_TENSOR_DATA_TYPE, TYPE_DATA_TYPE, [DATA_TYPES[dtype]])
    t.set(ATTR_TENSOR_DIMENSIONS, TYPE_INT64, list(dims))
    t.set(ATTR_TENSOR_STRIDES, TYPE_INT64, list(strides))
    t.set(ATTR_TENSOR_UNIQUE_ID, TYPE_INT64, [uid])
    t.set(ATTR_TENSOR_BYTE_ALIGNMENT, TYPE_INT64, [ALIGNMENT])
    if virtual:
        t.set(ATTR_TENSOR_IS_VIRTUAL, TYPE_BOOLEAN, [True])
    if by_value:
        t.set(ATTR_TENSOR_IS_BY_VALUE, TYPE_BOOLEAN, [True])
    t.finalize()
    return t


def _node(lib: Any, kind: int, attrs: dict[str, int], mode: int,
          tensors: dict[str, Descriptor], extra: Sequence[tuple[int, int, int]] = ()) -> Descriptor:
    op = Descriptor(lib, kind)
    op.set(attrs["mode"], TYPE_NORM_MODE, [mode])
    for attr, atype, value in extra:
        op.set(attr, atype, [value])
    for name, t in tensors.items():
        op.set(attrs[name], TYPE_BACKEND_DESCRIPTOR, [t])
    op.finalize()
    return op


def norm_forward(lib: Any, mode: int, training: bool,
                 tensors: dict[str, Descriptor]) -> Descriptor:
    """A finalized NORM_FORWARD node; `tensors` by the names of
    NORM_FWD_ATTRS (x, y, scale, bias, epsilon, mean, inv_variance, ...)."""
    phase = NORM_FWD_TRAINING if training else NORM_FWD_INFERENCE
    return _node(lib, OPERATION_NORM_FORWARD_DESCRIPTOR, NORM_FWD_ATTRS, mode, tensors,
                 [(NORM_FWD_ATTRS["phase"], TYPE_NORM_FWD_PHASE, phase)])


def norm_backward(lib: Any, mode: int, tensors: dict[str, Descriptor]) -> Descriptor:
    """A finalized NORM_BACKWARD node; `tensors` by the names of
    NORM_BWD_ATTRS (x, dy, scale, mean, inv_variance, dx, dscale, dbias)."""
    return _node(lib, OPERATION_NORM_BACKWARD_DESCRIPTOR, NORM_BWD_ATTRS, mode, tensors)


def pointwise(lib: Any, mode: int, x: Descriptor, y: Descriptor,
              b: Optional[Descriptor] = None) -> Descriptor:
    """A finalized pointwise node y = mode(x[, b]), computed in float32."""
    pw = Descriptor(lib, POINTWISE_DESCRIPTOR)
    pw.set(ATTR_POINTWISE_MODE, TYPE_POINTWISE_MODE, [mode])
    pw.set(ATTR_POINTWISE_MATH_PREC, TYPE_DATA_TYPE, [DATA_TYPES["float32"]])
    pw.finalize()
    op = Descriptor(lib, OPERATION_POINTWISE_DESCRIPTOR)
    op.set(ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, TYPE_BACKEND_DESCRIPTOR, [pw])
    op.set(ATTR_OPERATION_POINTWISE_XDESC, TYPE_BACKEND_DESCRIPTOR, [x])
    if b is not None:
        op.set(ATTR_OPERATION_POINTWISE_BDESC, TYPE_BACKEND_DESCRIPTOR, [b])
    op.set(ATTR_OPERATION_POINTWISE_YDESC, TYPE_BACKEND_DESCRIPTOR, [y])
    op.finalize()
    return op


class Graph:
    """A finalized execution plan for one operation on one handle's device.

    `uids` are the tensor ids in the order `execute` takes their addresses.
    `workspace` is the plan's workspace size in bytes; `engine` the global
    index of the engine cuDNN's heuristics chose."""

    __slots__ = ("lib", "plan", "workspace", "engine", "uids", "n", "_keep", "_exec",
                 "_create", "_set", "_finalize", "_destroy", "_uid_array", "_pointers")

    def __init__(self, lib: Any, plan: Descriptor, workspace: int, engine: int,
                 uids: Sequence[int], keep: Sequence[Any]) -> None:
        self.lib, self.plan, self.workspace, self.engine = lib, plan, workspace, engine
        self.n = len(uids)
        self.uids = tuple(uids)
        self._uid_array = (c_int64 * self.n)(*uids)
        self._pointers = c_void_p * self.n
        self._keep = list(keep)
        cudnn = lib.cudnn
        self._exec, self._create = cudnn.cudnnBackendExecute, cudnn.cudnnBackendCreateDescriptor
        self._set, self._finalize = cudnn.cudnnBackendSetAttribute, cudnn.cudnnBackendFinalize
        self._destroy = cudnn.cudnnBackendDestroyDescriptor

    def execute(self, handle_ptr: Any, pointers: Sequence[Any], workspace: int) -> None:
        """Run the plan on the handle's stream: `pointers` are the device
        (or, for by-value tensors, host) addresses of `uids`, in order.  A
        variant pack is made per call: cuDNN refuses new addresses in a
        finalized one."""
        vp = c_void_p()
        status = self._create(VARIANT_PACK_DESCRIPTOR, ctypes.byref(vp))
        if status:
            self.lib.check(status, "cudnnBackendCreateDescriptor")
        try:
            ws = c_void_p(workspace or None)
            # ctypes arrays go to the c_void_p parameters as their addresses
            status = (self._set(vp, ATTR_VARIANT_PACK_UNIQUE_IDS, TYPE_INT64, self.n,
                                self._uid_array)
                      or self._set(vp, ATTR_VARIANT_PACK_DATA_POINTERS, TYPE_VOID_PTR, self.n,
                                   self._pointers(*pointers))
                      or self._set(vp, ATTR_VARIANT_PACK_WORKSPACE, TYPE_VOID_PTR, 1,
                                   ctypes.byref(ws))
                      or self._finalize(vp))
            if status:
                self.lib.check(status, "cudnnBackendSetAttribute (variant pack)")
            status = self._exec(handle_ptr, self.plan.ptr, vp)
            if status:
                self.lib.check(status, "cudnnBackendExecute")
        finally:
            self._destroy(vp)


def _engine_configs(lib: Any, graph: Descriptor, heur_mode: int) -> list[Descriptor]:
    heur = Descriptor(lib, ENGINEHEUR_DESCRIPTOR)
    heur.set(ATTR_ENGINEHEUR_OPERATION_GRAPH, TYPE_BACKEND_DESCRIPTOR, [graph])
    heur.set(ATTR_ENGINEHEUR_MODE, TYPE_HEUR_MODE, [heur_mode])
    heur.finalize()
    count = c_int64()
    lib.call("cudnnBackendGetAttribute", heur.ptr, ATTR_ENGINEHEUR_RESULTS,
             TYPE_BACKEND_DESCRIPTOR, 0, ctypes.byref(count), None)
    configs = [Descriptor(lib, ENGINECFG_DESCRIPTOR) for _ in range(count.value)]
    if not configs:
        return []
    array = (c_void_p * len(configs))(*[c.ptr.value for c in configs])
    got = c_int64()
    lib.call("cudnnBackendGetAttribute", heur.ptr, ATTR_ENGINEHEUR_RESULTS,
             TYPE_BACKEND_DESCRIPTOR, len(configs), ctypes.byref(got), array)
    return configs[:got.value]


def _engine_index(lib: Any, config: Descriptor) -> int:
    engine = Descriptor(lib, ENGINE_DESCRIPTOR)
    arr = (c_void_p * 1)(engine.ptr.value)
    got = c_int64()
    try:
        lib.call("cudnnBackendGetAttribute", config.ptr, ATTR_ENGINECFG_ENGINE,
                 TYPE_BACKEND_DESCRIPTOR, 1, ctypes.byref(got), arr)
        return engine.get_int64(ATTR_ENGINE_GLOBAL_INDEX)
    except CudnnError:
        return -1


def build_graph(lib: Any, handle_ptr: Any, ops: Sequence[Descriptor], uids: Sequence[int],
                what: str) -> Graph:
    """The execution plan of the graph of `ops` on the handle: the first
    engine configuration of cuDNN's heuristics (mode A, then the fallback
    list) whose plan finalizes.  UnsupportedError (rule "graph_engine")
    when none does, with cuDNN's last words."""
    graph = Descriptor(lib, OPERATIONGRAPH_DESCRIPTOR)
    graph.set(ATTR_OPERATIONGRAPH_HANDLE, TYPE_HANDLE, [handle_ptr.value])
    graph.set(ATTR_OPERATIONGRAPH_OPS, TYPE_BACKEND_DESCRIPTOR, list(ops))
    try:
        graph.finalize()
    except CudnnError as exc:
        raise UnsupportedError("graph_engine", f"cuDNN cannot build the graph of {what}: "
                                               f"{exc}") from None
    last = ""
    for heur_mode in (HEUR_MODE_A, HEUR_MODE_FALLBACK):
        try:
            configs = _engine_configs(lib, graph, heur_mode)
        except CudnnError as exc:
            last = str(exc)
            continue
        for config in configs:
            plan = Descriptor(lib, EXECUTION_PLAN_DESCRIPTOR)
            try:
                plan.set(ATTR_EXECUTION_PLAN_HANDLE, TYPE_HANDLE, [handle_ptr.value])
                plan.set(ATTR_EXECUTION_PLAN_ENGINE_CONFIG, TYPE_BACKEND_DESCRIPTOR, [config])
                plan.finalize()
            except CudnnError as exc:
                last = str(exc)
                continue
            workspace = plan.get_int64(ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)
            return Graph(lib, plan, workspace, _engine_index(lib, config), uids, [graph])
    raise UnsupportedError("graph_engine", f"cuDNN has no engine for {what}"
                                           + (f" ({last})" if last else ""))


def misaligned(named: Sequence[tuple[str, Optional[int]]]) -> list[str]:
    """The names of the (name, address) pairs whose nonzero address is not
    ALIGNMENT-aligned."""
    return [name for name, p in named if p and p % ALIGNMENT]
