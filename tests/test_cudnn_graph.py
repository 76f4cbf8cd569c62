"""The graph-API code's host-side parts, without a GPU: every number of
cudnn_bind.graph against the installed cudnn_graph.h, backend descriptors
made and set through the real libcudnn, the variant pack's ordering, the
addresses the graphs refuse, the backend choice's refusals, and the
layer-norm / RMSNorm calls' argument checks on the host stand-in (which has
no graph API: valid calls end in UnsupportedError saying so).
tests/test_cudnn_graph_gpu.py runs the graphs on a GPU."""
import shutil
import subprocess

import numpy as np
import pytest

import cudnn_bind
from cudnn_bind import _lib
from cudnn_bind import graph as G
from cudnn_bind.batch_norm_graph import check_backend, graph_refusal
from cudnn_helpers import build_standin, find, header_dirs, missing

pytestmark = pytest.mark.cudnn


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    out = build_standin(tmp_path_factory.mktemp("standin_graph"))
    yield cudnn_bind.load(out, cudart=out)
    cudnn_bind.reset()


@pytest.fixture
def real_library():
    path = find("cudnn/lib/libcudnn.so.9")
    if path is None:
        missing("nvidia-cudnn-cu12 is not installed (pip install --no-deps nvidia-cudnn-cu12)")
    state = dict(_lib._STATE)
    lib = cudnn_bind.load(path)
    yield lib
    cudnn_bind.reset()
    _lib._STATE.update(state)


def test_every_constant_matches_cudnn_graph_h(tmp_path):
    dirs = header_dirs()
    if dirs is None:
        missing("the cuDNN/CUDA headers are not installed (pip install --no-deps "
                "nvidia-cudnn-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12)")
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        missing("no C compiler to read cudnn_graph.h")
    lines = [f'printf("{name} %d\\n", (int){name});' for name in G.CONSTANTS]
    src = tmp_path / "constants.c"
    src.write_text("#include <stdio.h>\n#include <cudnn_graph.h>\nint main(void)\n{\n"
                   + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = tmp_path / "constants"
    proc = subprocess.run([cc, *[f"-I{d}" for d in dirs], str(src), "-o", str(exe)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    header = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
    assert header == G.CONSTANTS
    # the attribute tables the nodes are built from are among them
    for name, value in G.NORM_FWD_ATTRS.items():
        assert value in header.values(), name
    assert len(G.CONSTANTS) >= 80


def test_the_real_library_declares_the_graph_functions(real_library):
    assert real_library.has_graph
    assert G.graph_unavailable(real_library) == ""
    for name, (restype, argtypes) in G.GRAPH_FUNCTIONS.items():
        fn = getattr(real_library.cudnn, name)
        assert fn.restype is restype and fn.argtypes == argtypes


def test_descriptors_are_made_and_set_through_the_real_library(real_library):
    t = G.Descriptor(real_library, G.TENSOR_DESCRIPTOR)
    assert t.ptr.value
    t.set(G.ATTR_TENSOR_DATA_TYPE, G.TYPE_DATA_TYPE, [G.DATA_TYPES["bfloat16"]])
    t.set(G.ATTR_TENSOR_DIMENSIONS, G.TYPE_INT64, [8, 64, 1, 1])
    t.set(G.ATTR_TENSOR_STRIDES, G.TYPE_INT64, [64, 1, 64, 64])
    t.set(G.ATTR_TENSOR_UNIQUE_ID, G.TYPE_INT64, [3])
    t.set(G.ATTR_TENSOR_IS_BY_VALUE, G.TYPE_BOOLEAN, [True])
    op = G.Descriptor(real_library, G.OPERATION_NORM_FORWARD_DESCRIPTOR)
    op.set(G.NORM_FWD_ATTRS["mode"], G.TYPE_NORM_MODE, [G.RMS_NORM])
    op.set(G.NORM_FWD_ATTRS["x"], G.TYPE_BACKEND_DESCRIPTOR, [t])
    assert op.keep == [t]  # what it references outlives it
    # a value of the wrong attribute type is cuDNN's error, raised as CudnnError
    with pytest.raises(cudnn_bind.CudnnError, match="cudnnBackendSetAttribute failed"):
        t.set(G.ATTR_TENSOR_DIMENSIONS, G.TYPE_BACKEND_DESCRIPTOR, [op])
    t.close()
    t.close()  # twice is harmless
    assert not t.ptr


def test_finalizing_without_a_gpu_is_a_clean_error_or_works(real_library):
    """Finalizing a tensor loads cuDNN's engine libraries, which need libcuda:
    without a driver that is CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED, raised
    as CudnnError; with one it succeeds."""
    try:
        t = G.tensor(real_library, 1, "float32", (2, 3, 1, 1), (3, 1, 3, 3))
    except cudnn_bind.CudnnError as exc:
        assert "cudnnBackendFinalize" in str(exc)
        assert cudnn_bind.unavailable_reason() != ""
    else:
        assert t.uid == 1


def test_variant_pack_order_follows_the_uids():
    """Graph.execute gets addresses in the order of Graph.uids: the calls
    build them from a mapping, so a graph's own order is what counts."""
    class Lib:
        cudnn = type("C", (), {name: None for name in G.GRAPH_FUNCTIONS})()
    g = G.Graph(Lib(), None, 0, -1, [7, 2, 5], [])
    by_uid = {2: 20, 5: 50, 7: 70}
    assert [by_uid[u] for u in g.uids] == [70, 20, 50]
    assert list(g._uid_array) == [7, 2, 5]


@pytest.mark.parametrize("pointers,expected", [
    ((0x1000, 0x2010), []), ((0x1008,), ["a"]), ((0x1000, 0x1004), ["b"]),
    ((0x1002, 0x1001), ["a", "b"]), ((0, 0x1000), []), ((), [])])
def test_misaligned_names_the_addresses_off_16_bytes(pointers, expected):
    assert G.ALIGNMENT == 16
    assert G.misaligned(list(zip("ab", pointers))) == expected


def test_misaligned_addresses_keep_batch_norm_off_the_graph():
    """cuDNN's graph kernels fault on addresses off 16 bytes whatever the
    graph declares (seen on an H200): such a call takes the legacy call, and
    the refusal names the arguments."""
    class Lib:
        major, version, has_graph, cudnn_path = 9, 91900, True, "x"

    class Plan:
        double = empty = False
    aligned = [("x", 0x1000), ("weight", 0x2000), ("bias", 0x2100)]
    assert graph_refusal(Lib(), Plan(), None, None, aligned) == ""
    why = graph_refusal(Lib(), Plan(), None, None,
                        [("x", 0x1000), ("weight", 0x2004), ("bias", 0x2104)])
    assert why.startswith("weight, bias are not 16-byte aligned")
    why = graph_refusal(Lib(), Plan(), None, None, [("x", 0x1002)])
    assert why.startswith("x is not 16-byte aligned")


def test_graph_unavailable_names_why():
    class Old:
        major, version, has_graph, cudnn_path = 8, 8906, True, "x"
    class NoSymbols:
        major, version, has_graph, cudnn_path = 9, 92800, False, "/lib/libcudnn.so.9"
    assert "older than 9" in G.graph_unavailable(Old())
    assert "lacks the backend-descriptor functions" in G.graph_unavailable(NoSymbols())


@pytest.mark.parametrize("bad", ["cudnn", "", None, 1, "Graph"])
def test_backend_argument_is_checked(bad):
    with pytest.raises(ValueError, match="backend must be 'auto', 'graph' or 'legacy'"):
        check_backend(bad)


def test_batch_norm_backend_on_a_library_without_the_graph_api(standin):
    assert not standin.has_graph
    x = cudnn_bind.DeviceArray.from_numpy(np.ones((4, 8, 3, 3), np.float32))
    backend, why = cudnn_bind.batch_norm_backend(x)
    assert backend == "legacy" and "lacks the backend-descriptor functions" in why
    w = cudnn_bind.DeviceArray.from_numpy(np.ones(8, np.float32))
    with pytest.raises(ValueError, match="backend must be"):
        cudnn_bind.batch_norm_forward_training(x, w, w, backend="fast")
    with pytest.raises(cudnn_bind.UnsupportedError, match="no graph path"):
        cudnn_bind.batch_norm_forward_training(x, w, w, backend="graph")


def _dev(a):
    return cudnn_bind.DeviceArray.from_numpy(np.asarray(a))


@pytest.mark.parametrize("call,error,match", [
    (lambda x, w: cudnn_bind.layer_norm_forward(x, (8,), w, w), ValueError,
     r"normalized_shape \(8,\) must be the trailing dimensions of x"),
    (lambda x, w: cudnn_bind.layer_norm_forward(x, 16, w, None), ValueError,
     "bias is required for layer norm"),
    (lambda x, w: cudnn_bind.rms_norm_forward(x, 16, None), ValueError, "weight is required"),
    (lambda x, w: cudnn_bind.layer_norm_forward(_dev(np.ones((4, 16))), 16, w, w), TypeError,
     "x must be float32, float16 or bfloat16"),
    (lambda x, w: cudnn_bind.rms_norm_forward(x, 16, _dev(np.ones(8, np.float32))), ValueError,
     "weight must have 16 elements"),
    (lambda x, w: cudnn_bind.rms_norm_forward(x, 16, _dev(np.ones(16, np.float16))), TypeError,
     "weight must be float32, got float16"),
    (lambda x, w: cudnn_bind.rms_norm_forward(x, 16, w, -1.0), ValueError, "eps must be >= 0"),
    (lambda x, w: cudnn_bind.rms_norm_forward(x, 16, w, "1e-5"), TypeError, "eps must be"),
    (lambda x, w: cudnn_bind.layer_norm_forward(_dev(np.ones((0, 16), np.float32)), 16, w, w),
     ValueError, "x must not be empty"),
    (lambda x, w: cudnn_bind.layer_norm_forward(np.ones((4, 16), np.float32), 16, w, w),
     TypeError, "host memory"),
    (lambda x, w: cudnn_bind.rms_norm_backward(_dev(np.ones((4, 16), np.float16)), x, 16,
                                               _dev(np.ones(4, np.float32)), w), TypeError,
     "dy must have x's dtype float32"),
    (lambda x, w: cudnn_bind.layer_norm_backward(x, x, 16, _dev(np.ones(3, np.float32)),
                                                 _dev(np.ones(4, np.float32)), w), ValueError,
     "mean must have 4 elements"),
    (lambda x, w: cudnn_bind.rms_norm_backward(x, x, 16, _dev(np.ones(4)), w), TypeError,
     "invstd must be float32, got float64"),
])
def test_norm_arguments_are_checked_before_any_graph(standin, call, error, match):
    x = _dev(np.ones((4, 16), np.float32))
    w = _dev(np.ones(16, np.float32))
    with pytest.raises(error, match=match):
        call(x, w)


def test_valid_norm_calls_without_the_graph_api_say_so(standin):
    x = _dev(np.ones((2, 3, 16), np.float32))
    w = _dev(np.ones(16, np.float32))
    for call in (lambda: cudnn_bind.layer_norm_forward(x, 16, w, w),
                 lambda: cudnn_bind.rms_norm_forward(x, (16,), w),
                 lambda: cudnn_bind.rms_norm_backward(x, x, 16, _dev(np.ones(6, np.float32)), w)):
        with pytest.raises(cudnn_bind.UnsupportedError, match="no graph API") as info:
            call()
        assert info.value.rule == "graph_engine"


def test_norm_nodes_set_every_attribute_through_the_real_library(real_library):
    """norm_forward / norm_backward set each tensor under its attribute (an
    unknown name would be a KeyError here); finalizing the node needs a GPU,
    so without one it ends in cuDNN's error."""
    def unfinalized(uid):
        t = G.Descriptor(real_library, G.TENSOR_DESCRIPTOR)
        t.uid = uid
        return t
    fwd = {name: unfinalized(i) for i, name in enumerate(
        ("x", "y", "scale", "bias", "epsilon", "mean", "inv_variance", "momentum",
         "running_mean_in", "running_var_in", "running_mean_out", "running_var_out"), 1)}
    bwd = {name: unfinalized(i) for i, name in enumerate(
        ("x", "dy", "scale", "mean", "inv_variance", "dx", "dscale", "dbias"), 1)}
    for build in (lambda: G.norm_forward(real_library, G.BATCH_NORM, True, fwd),
                  lambda: G.norm_backward(real_library, G.LAYER_NORM, bwd)):
        try:
            op = build()
        except cudnn_bind.CudnnError as exc:
            assert "cudnnBackendFinalize" in str(exc)
        else:
            assert op.ptr.value


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_rms_norm_default_eps_is_the_machine_epsilon(dtype):
    """eps None is x's dtype's epsilon, as PyTorch's rms_norm takes it (no
    NumPy finfo: NumPy 2.5's refuses bfloat16)."""
    import ml_dtypes
    from cudnn_bind.layer_norm import _eps
    want = ml_dtypes.finfo(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)).eps
    assert _eps(None, dtype) == float(want)
    assert _eps(1e-3, dtype) == 1e-3
