"""Peers that bench_norms.py times next to cynorm and torch on the forward
cases:

* ONNX Runtime's CPU execution provider running a one-node model built with
  onnx.helper (LayerNormalization; RMSNormalization; BatchNormalization in
  inference mode),
  one session per thread count (intra_op_num_threads);
* JAX: the formulas, jit-compiled for the CPU, on arrays already on the
  device; each call waits for its result (block_until_ready).  XLA sizes
  its thread pool once, from the CPUs the process may run on: bench_norms.py
  runs one child per thread count, pinned to that many CPUs
  (os.sched_setaffinity) before anything imports JAX.

A builder returns (make, None), where make(threads) gives the callable to
time (make(None): at any thread count, for the accuracy check), or (None, why) when the peer cannot run the case: not installed, a
dtype its CPU kernels lack, or a layout its op does not take.
"""
import os

import numpy as np

OPSET = 17          # LayerNormalization is in the default domain from opset 17


def _onnx():
    try:
        import onnx
        import onnxruntime
    except ImportError as e:
        return None, None, f"not installed ({e.name}; pip install '.[bench]')"
    return onnx, onnxruntime, None


def _model(onnx, node, inputs, outputs, opset=OPSET):
    """A one-node model: inputs/outputs are (name, float32 shape) pairs; a
    node of ONNX Runtime's com.microsoft domain gets that domain's opset."""
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [node], node.op_type,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs])
    opsets = [helper.make_opsetid("", opset)]
    if node.domain:
        opsets.append(helper.make_opsetid(node.domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _maker(ort, model, feed):
    """make(threads): a session at that thread count and its run() on feed
    (sessions cached per thread count)."""
    sessions = {}

    def make(threads):
        threads = threads or 1
        if threads not in sessions:
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            # idle pool threads sleep: spinning, they would take the cores
            # from the libraries timed between ORT's calls
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            sessions[threads] = lambda: sess.run(None, feed)
        return sessions[threads]
    make(1)()                          # builds and runs once: a failure shows here
    return make


def ort_layer_norm(x, w, b, eps):
    """y, mean, 1/std over the last axis of x (float32), as torch.native_layer_norm."""
    onnx, ort, why = _onnx()
    if onnx is None:
        return None, why
    if x.dtype != np.float32:
        return None, f"{x.dtype}: the one-node models here are float32"
    from onnx import helper
    M, D = x.shape
    node = helper.make_node("LayerNormalization", ["X", "W", "B"], ["Y", "Mean", "InvStdDev"],
                            axis=-1, epsilon=float(eps))
    model = _model(onnx, node, [("X", (M, D)), ("W", (D,)), ("B", (D,))],
                   [("Y", (M, D)), ("Mean", (M, 1)), ("InvStdDev", (M, 1))])
    try:
        return _maker(ort, model, {"X": x, "W": w, "B": b}), None
    except Exception as e:  # noqa: BLE001 - the peer cannot run this case
        return None, f"{type(e).__name__}: {e}"


def ort_rms_norm(x, w, eps):
    """y = x / sqrt(mean(x^2) + eps) * w over the last axis (float32): ONNX's
    RMSNormalization (opset 23)."""
    onnx, ort, why = _onnx()
    if onnx is None:
        return None, why
    if x.dtype != np.float32:
        return None, f"{x.dtype}: the one-node models here are float32"
    from onnx import helper
    M, D = x.shape
    node = helper.make_node("RMSNormalization", ["X", "W"], ["Y"], axis=-1, epsilon=float(eps))
    model = _model(onnx, node, [("X", (M, D)), ("W", (D,))], [("Y", (M, D))], opset=23)
    try:
        return _maker(ort, model, {"X": x, "W": w}), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def ort_add_norm(x, res, w, b, eps):
    """(y, h): h = x + res and its layer norm (b given) or RMS norm (b None)
    over the last axis (float32): ONNX Runtime's SkipLayerNormalization /
    SkipSimplifiedLayerNormalization (com.microsoft)."""
    onnx, ort, why = _onnx()
    if onnx is None:
        return None, why
    if x.dtype != np.float32:
        return None, f"{x.dtype}: the one-node models here are float32"
    from onnx import helper
    M, D = x.shape
    op = "SkipLayerNormalization" if b is not None else "SkipSimplifiedLayerNormalization"
    ins = ["X", "S", "W"] + (["B"] if b is not None else [])
    node = helper.make_node(op, ins, ["Y", "", "", "H"], domain="com.microsoft",
                            epsilon=float(eps))
    feed = {"X": x, "S": res, "W": w, **({"B": b} if b is not None else {})}
    model = _model(onnx, node, [(n, a.shape) for n, a in feed.items()],
                   [("Y", (M, D)), ("H", (M, D))])
    try:
        return _maker(ort, model, feed), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def ort_group_norm(x, w, b, groups, eps):
    """y of group norm over N,C,... x (float32): ONNX's InstanceNormalization
    where each channel is a group, else GroupNormalization (opset 21, its
    scale and bias per channel)."""
    onnx, ort, why = _onnx()
    if onnx is None:
        return None, why
    if x.dtype != np.float32:
        return None, f"{x.dtype}: the one-node models here are float32"
    from onnx import helper
    C = x.shape[1]
    if groups == C:
        node = helper.make_node("InstanceNormalization", ["X", "scale", "B"], ["Y"],
                                epsilon=float(eps))
        opset = OPSET
    else:
        node = helper.make_node("GroupNormalization", ["X", "scale", "B"], ["Y"],
                                epsilon=float(eps), num_groups=int(groups))
        opset = 21
    model = _model(onnx, node, [("X", x.shape), ("scale", (C,)), ("B", (C,))], [("Y", x.shape)],
                   opset=opset)
    try:
        return _maker(ort, model, {"X": x, "scale": w, "B": b}), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


def ort_batch_norm_eval(x, w, b, rm, rv, eps, channels_last):
    """y = (x - rm) / sqrt(rv + eps) * w + b per channel (axis 1), float32."""
    onnx, ort, why = _onnx()
    if onnx is None:
        return None, why
    if channels_last:
        return None, "ONNX BatchNormalization takes the channels on axis 1 (N,H,W,C needs a transpose)"
    if x.dtype != np.float32:
        return None, f"{x.dtype}: the one-node models here are float32"
    from onnx import helper
    C = x.shape[1]
    node = helper.make_node("BatchNormalization", ["X", "scale", "B", "mean", "var"], ["Y"],
                            epsilon=float(eps))
    model = _model(onnx, node, [("X", x.shape)] + [(n, (C,)) for n in ("scale", "B", "mean", "var")],
                   [("Y", x.shape)])
    try:
        return _maker(ort, model, {"X": x, "scale": w, "B": b, "mean": rm, "var": rv}), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def _jax():
    try:
        import jax
    except ImportError as e:
        return None, f"not installed ({e.name}; pip install '.[bench]')"
    return jax, None


def _jax_maker(jax, f, args):
    """make(threads): f jitted on args (on the device), waiting for the
    result; refused when XLA's pool would not have `threads` threads."""
    dev_args = [jax.device_put(a) for a in args]
    jax.block_until_ready(f(*dev_args))          # compiles once

    def make(threads):
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        if threads is not None and cpus != threads:
            raise RuntimeError(f"JAX at {threads} thread(s) needs a process pinned to as many CPUs "
                               f"(this one may use {cpus})")
        return lambda: jax.block_until_ready(f(*dev_args))
    return make


def jax_layer_norm(x, w, b, eps):
    """(y, mean, rstd) over the last axis; 16-bit x computed in float32 and
    y rounded back, as torch does."""
    jax, why = _jax()
    if jax is None:
        return None, why
    import jax.numpy as jnp

    @jax.jit
    def f(x, w, b):
        x32 = x.astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        rstd = jax.lax.rsqrt(jnp.square(x32 - mean).mean(-1, keepdims=True) + eps)
        y = (x32 - mean) * rstd * w.astype(jnp.float32) + b.astype(jnp.float32)
        return y.astype(x.dtype), mean, rstd
    return _jax_maker(jax, f, (x, w, b)), None


def jax_rms_norm(x, w, eps):
    """(y, rstd) over the last axis; 16-bit x computed in float32 and y
    rounded back, as torch does."""
    jax, why = _jax()
    if jax is None:
        return None, why
    import jax.numpy as jnp

    @jax.jit
    def f(x, w):
        x32 = x.astype(jnp.float32)
        rstd = jax.lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + eps)
        return (x32 * rstd * w.astype(jnp.float32)).astype(x.dtype), rstd
    return _jax_maker(jax, f, (x, w)), None


def jax_add_norm(x, res, w, b, eps):
    """(y, h): h = x + res (rounded to x's dtype) and its layer norm (b
    given) or RMS norm (b None) over the last axis, in float32."""
    jax, why = _jax()
    if jax is None:
        return None, why
    import jax.numpy as jnp

    @jax.jit
    def f(x, res, w, *b):
        h = x + res
        h32 = h.astype(jnp.float32)
        if b:
            h32 = h32 - h32.mean(-1, keepdims=True)
        y = h32 * jax.lax.rsqrt(jnp.square(h32).mean(-1, keepdims=True) + eps) * w
        return (y + b[0] if b else y).astype(x.dtype), h
    return _jax_maker(jax, f, (x, res, w) + ((b,) if b is not None else ())), None


def jax_batch_norm(x, w, b, rm, rv, eps, momentum, axis, training):
    """Batch norm over every axis but `axis`: training returns (y, mean,
    invstd, new running mean, new running var), inference y; 16-bit x
    computed in float32."""
    jax, why = _jax()
    if jax is None:
        return None, why
    import jax.numpy as jnp
    caxis = axis % x.ndim
    axes = tuple(i for i in range(x.ndim) if i != caxis)
    bshape = tuple(x.shape[caxis] if i == caxis else 1 for i in range(x.ndim))
    n = x.size // x.shape[caxis]

    @jax.jit
    def train(x, w, b, rm, rv):
        x32 = x.astype(jnp.float32)
        mean = x32.mean(axes)
        var = jnp.square(x32 - mean.reshape(bshape)).mean(axes)
        invstd = jax.lax.rsqrt(var + eps)
        y = (x32 - mean.reshape(bshape)) * (invstd * w).reshape(bshape) + b.reshape(bshape)
        return (y.astype(x.dtype), mean, invstd, (1 - momentum) * rm + momentum * mean,
                (1 - momentum) * rv + momentum * var * (n / (n - 1)))

    @jax.jit
    def infer(x, w, b, rm, rv):
        scale = jax.lax.rsqrt(rv + eps) * w
        y = x.astype(jnp.float32) * scale.reshape(bshape) + (b - rm * scale).reshape(bshape)
        return y.astype(x.dtype)
    return _jax_maker(jax, train if training else infer, (x, w, b, rm, rv)), None


def jax_group_norm(x, w, b, groups, eps, channels_last):
    """(y, mean, rstd) of group norm (channels on axis 1, or last); 16-bit x
    computed in float32 and y rounded back."""
    jax, why = _jax()
    if jax is None:
        return None, why
    import jax.numpy as jnp
    N = x.shape[0]
    C = x.shape[-1] if channels_last else x.shape[1]

    @jax.jit
    def f(x, w, b):
        x32 = x.astype(jnp.float32)
        if channels_last:
            g = x32.reshape(N, -1, groups, C // groups)
            axes = (1, 3)
        else:
            g = x32.reshape(N, groups, -1)
            axes = (2,)
        mean = g.mean(axes, keepdims=True)
        rstd = jax.lax.rsqrt(jnp.square(g - mean).mean(axes, keepdims=True) + eps)
        xhat = ((g - mean) * rstd).reshape(x.shape)
        pshape = (C,) if channels_last else (C,) + (1,) * (x.ndim - 2)
        y = xhat * w.astype(jnp.float32).reshape(pshape) + b.astype(jnp.float32).reshape(pshape)
        return y.astype(x.dtype), mean.reshape(N, groups), rstd.reshape(N, groups)
    return _jax_maker(jax, f, (x, w, b)), None
