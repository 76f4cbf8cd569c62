"""Peers that bench_norms.py times next to cynorm and torch on the forward
cases: ONNX Runtime's CPU execution provider running a one-node model built
with onnx.helper (LayerNormalization; BatchNormalization in inference mode),
one session per thread count (intra_op_num_threads).

A builder returns (make, None), where make(threads) gives the callable to
time, or (None, why) when the peer cannot run the case: not installed, a
dtype its CPU kernels lack, or a layout its op does not take.
"""
import numpy as np

OPSET = 17          # LayerNormalization is in the default domain from opset 17


def _onnx():
    try:
        import onnx
        import onnxruntime
    except ImportError as e:
        return None, None, f"not installed ({e.name}; pip install '.[bench]')"
    return onnx, onnxruntime, None


def _model(onnx, node, inputs, outputs):
    """A one-node model: inputs/outputs are (name, float32 shape) pairs."""
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [node], node.op_type,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _maker(ort, model, feed):
    """make(threads): a session at that thread count and its run() on feed
    (sessions cached per thread count)."""
    sessions = {}

    def make(threads):
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
