"""Batch norm on cuDNN's graph API, and the choice between it and the legacy calls.

Three graphs per call signature (x's shape, strides and dtype):

- training forward: one NORM_FORWARD node (BATCH_NORM, TRAINING) writing y,
  the batch mean and 1/sqrt(var + eps), and, with running statistics, their
  update (read and written in place, as the legacy call does);
- backward: one NORM_BACKWARD node (dx, dweight, dbias from the saved
  statistics);
- inference: NORM_FORWARD (BATCH_NORM, INFERENCE) takes a mean and an
  inverse standard deviation of the same kind, so rsqrt(running_var + eps)
  is made by pointwise nodes: in the same graph, the running mean passed
  through an identity node so that both are virtual; where cuDNN has no
  engine for that, as a graph of its own writing a scratch vector the norm
  graph then reads.

`backend="auto"` (the calls' default) takes the graph path where cuDNN has
an engine for it and the legacy calls otherwise: cuDNN older than 9, float64
(no graph engine runs it), a fused ReLU or add+ReLU, an explicit `mode`, an
empty batch.  A training signature takes the graph path only when both its
forward and its backward have engines, so a forward and its backward agree.
"graph" raises `UnsupportedError` (rule "graph_engine") where the legacy call
would be used; "legacy" never builds a graph.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from cudnn_bind import graph as G
from cudnn_bind.descriptors import padded_geometry
from cudnn_bind.errors import CudnnError, UnsupportedError

__all__ = ["BACKENDS", "check_backend", "graph_refusal", "training_graphs", "inference_graph"]

BACKENDS = ("auto", "graph", "legacy")
# tensor ids of the batch-norm graphs
UID = {"x": 1, "y": 2, "scale": 3, "bias": 4, "epsilon": 5, "mean": 6, "inv_variance": 7,
       "momentum": 8, "running_mean": 9, "running_var": 10, "running_mean_out": 11,
       "running_var_out": 12, "dy": 13, "dx": 14, "dscale": 15, "dbias": 16,
       "var_eps": 17, "inv_running": 18, "mean_running": 19}


def check_backend(backend: Any) -> str:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto', 'graph' or 'legacy', got {backend!r}")
    return backend


def graph_refusal(lib: Any, plan: Any, mode: object, fused: Optional[str],
                  addresses: Sequence[tuple[str, Optional[int]]] = ()) -> str:
    """Why this call cannot take the graph path ('' when it may try);
    `addresses`: the call's (argument name, device address) pairs."""
    reason = G.graph_unavailable(lib)
    if reason:
        return reason
    if plan.double:
        return "float64 x: cuDNN's graph engines do not run batch norm in double"
    if fused is not None:
        return "a fused activation runs on the legacy call"
    if mode is not None:
        return "an explicit mode runs on the legacy call (the graph has no modes)"
    if plan.empty:
        return "an empty batch makes no cuDNN call"
    late = G.misaligned(addresses)
    if late:
        return (f"{', '.join(late)} {'is' if len(late) == 1 else 'are'} not "
                f"{G.ALIGNMENT}-byte aligned (cuDNN's graph kernels fault on other addresses)")
    return ""


def _geometry(plan: Any) -> tuple[list[int], list[int], list[int], list[int]]:
    """x's dims and strides as the graph gets them (2-D and 3-D padded to
    4-D), and the per-channel tensors' (1, C, 1, ...)."""
    dims, strides = padded_geometry(plan.shape, plan.strides, 4,
                                    plan.layout == "channels_last")
    c = dims[1]
    pdims = [1, c] + [1] * (len(dims) - 2)
    pstrides = [c, 1] + [c] * (len(dims) - 2)
    return dims, strides, pdims, pstrides


def _build(lib: Any, h: Any, plan: Any, which: str, has_running: bool) -> G.Graph:
    dims, strides, pdims, pstrides = _geometry(plan)
    dtype, p = plan.dtype, "float32"
    scalar = ([1] * len(dims), [1] * len(dims))

    def t(name: str, dt: str, d: list[int], s: list[int], **kw: Any) -> Any:
        return G.tensor(lib, UID[name], dt, d, s, **kw)

    what = f"batch norm {which} ({dtype} x of shape {tuple(plan.shape)}, {plan.layout})"
    if which == "forward":
        ts = {"x": t("x", dtype, dims, strides),
              "y": t("y", dtype, dims, strides),
              "scale": t("scale", p, pdims, pstrides), "bias": t("bias", p, pdims, pstrides),
              "epsilon": t("epsilon", p, *scalar, by_value=True),
              "mean": t("mean", p, pdims, pstrides),
              "inv_variance": t("inv_variance", p, pdims, pstrides)}
        if has_running:
            ts["momentum"] = t("momentum", p, *scalar, by_value=True)
            ts["running_mean_in"] = t("running_mean", p, pdims, pstrides)
            ts["running_var_in"] = t("running_var", p, pdims, pstrides)
            ts["running_mean_out"] = t("running_mean_out", p, pdims, pstrides)
            ts["running_var_out"] = t("running_var_out", p, pdims, pstrides)
        ops = [G.norm_forward(lib, G.BATCH_NORM, True, ts)]
        uids = [d.uid for d in ts.values()]
    elif which == "backward":
        ts = {"x": t("x", dtype, dims, strides),
              "dy": t("dy", dtype, dims, strides),
              "scale": t("scale", p, pdims, pstrides), "mean": t("mean", p, pdims, pstrides),
              "inv_variance": t("inv_variance", p, pdims, pstrides),
              "dx": t("dx", dtype, dims, strides),
              "dscale": t("dscale", p, pdims, pstrides), "dbias": t("dbias", p, pdims, pstrides)}
        ops = [G.norm_backward(lib, G.BATCH_NORM, ts)]
        uids = [d.uid for d in ts.values()]
    elif which == "inference":  # one graph: identity(mean), rsqrt(var + eps), the norm
        var = t("running_var", p, pdims, pstrides)
        eps = t("epsilon", p, *scalar, by_value=True)
        var_eps = t("var_eps", p, pdims, pstrides, virtual=True)
        inv = t("inv_running", p, pdims, pstrides, virtual=True)
        mean = t("running_mean", p, pdims, pstrides)
        mean_v = t("mean_running", p, pdims, pstrides, virtual=True)
        ts = {"x": t("x", dtype, dims, strides),
              "y": t("y", dtype, dims, strides),
              "scale": t("scale", p, pdims, pstrides), "bias": t("bias", p, pdims, pstrides),
              "mean": mean_v, "inv_variance": inv}
        ops = [G.pointwise(lib, G.POINTWISE_IDENTITY, mean, mean_v),
               G.pointwise(lib, G.POINTWISE_ADD, var, var_eps, eps),
               G.pointwise(lib, G.POINTWISE_RSQRT, var_eps, inv),
               G.norm_forward(lib, G.BATCH_NORM, False, ts)]
        uids = [UID[k] for k in ("x", "y", "scale", "bias", "running_mean", "running_var",
                                 "epsilon")]
    elif which == "invstd":  # rsqrt(running_var + eps) into a vector
        var = t("running_var", p, pdims, pstrides)
        eps = t("epsilon", p, *scalar, by_value=True)
        var_eps = t("var_eps", p, pdims, pstrides, virtual=True)
        inv = t("inv_running", p, pdims, pstrides)
        ops = [G.pointwise(lib, G.POINTWISE_ADD, var, var_eps, eps),
               G.pointwise(lib, G.POINTWISE_RSQRT, var_eps, inv)]
        uids = [UID[k] for k in ("running_var", "epsilon", "inv_running")]
    else:  # "normalize": the inference norm node over that vector
        ts = {"x": t("x", dtype, dims, strides),
              "y": t("y", dtype, dims, strides),
              "scale": t("scale", p, pdims, pstrides), "bias": t("bias", p, pdims, pstrides),
              "mean": t("running_mean", p, pdims, pstrides),
              "inv_variance": t("inv_running", p, pdims, pstrides)}
        ops = [G.norm_forward(lib, G.BATCH_NORM, False, ts)]
        uids = [d.uid for d in ts.values()]
    return G.build_graph(lib, h.ptr, ops, uids, what)


def _cached(lib: Any, h: Any, plan: Any, which: str, has_running: bool) -> Any:
    """The plan's graph `which` on h's device (an UnsupportedError when it has
    none), built on first use."""
    key = (which, has_running, h.device)
    found = plan.graphs.get(key)
    if found is None:
        if which == "inference":
            found = _build_inference(lib, h, plan)
        else:
            found = _build_or_refusal(lib, h, plan, which, has_running)
        plan.graphs[key] = found
    return found


def _build_or_refusal(lib: Any, h: Any, plan: Any, which: str, has_running: bool) -> Any:
    """The graph, or the UnsupportedError saying why cuDNN refuses it (a
    node it will not finalize is a refusal too)."""
    try:
        return _build(lib, h, plan, which, has_running)
    except UnsupportedError as exc:
        return exc
    except CudnnError as exc:
        return UnsupportedError("graph_engine", f"cuDNN refuses the batch norm {which} graph "
                                                f"for {plan.dtype} x of shape "
                                                f"{tuple(plan.shape)}: {exc}")


def _build_inference(lib: Any, h: Any, plan: Any) -> Any:
    """The one-graph inference, else the (invstd, normalize) pair, else the
    refusal naming both attempts."""
    one = _build_or_refusal(lib, h, plan, "inference", True)
    if not isinstance(one, UnsupportedError):
        return one
    first = _build_or_refusal(lib, h, plan, "invstd", True)
    second = _build_or_refusal(lib, h, plan, "normalize", True)
    for part in (first, second):
        if isinstance(part, UnsupportedError):
            return UnsupportedError("graph_engine", f"{one}; as two graphs: {part}")
    return (first, second)


def _pick(found: Any, backend: str) -> Any:
    if isinstance(found, UnsupportedError):
        if backend == "graph":
            raise UnsupportedError(found.rule, str(found))
        return None
    return found


def _legacy(backend: str, refusal: str) -> bool:
    """Whether the call takes the legacy path before any graph is looked at;
    UnsupportedError where "graph" was asked for and the call cannot have one."""
    if backend == "legacy":
        return True
    if refusal and backend == "graph":
        raise UnsupportedError("graph_engine", f"no graph path: {refusal}")
    return bool(refusal)


def training_graphs(lib: Any, h: Any, plan: Any, backend: str, refusal: str, which: str,
                    has_running: bool) -> Optional[G.Graph]:
    """The graph for a training call (`which` "forward" or "backward"), or
    None for the legacy call.  With backend "auto" a signature uses graphs
    only when its forward (without running statistics) and its backward both
    have engines."""
    if _legacy(backend, refusal):
        return None
    if backend == "auto":
        for other in ("forward", "backward"):
            if isinstance(_cached(lib, h, plan, other, False), UnsupportedError):
                return None
    return _pick(_cached(lib, h, plan, which, has_running), backend)


def inference_graph(lib: Any, h: Any, plan: Any, backend: str, refusal: str) -> Any:
    """The inference graph, or the (invstd, normalize) pair of graphs, or
    None for the legacy call."""
    if _legacy(backend, refusal):
        return None
    return _pick(_cached(lib, h, plan, "inference", True), backend)
