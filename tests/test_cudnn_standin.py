"""cudnn_bind end to end through a host-memory stand-in for libcudnn and the
CUDA runtime (tests/cudnn_standin/standin.c, compiled here against the real
cuDNN and CUDA headers, so every prototype it implements is the real one).
Device pointers are host pointers there, so every path can be compared with
cynorm's CPU batch norm: marshalling, argument order, descriptors and mode
choice, workspace caching and reserve plumbing."""
import ctypes
import gc
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import cudnn_bind
import cynorm
from cudnn_bind import _lib
from cudnn_helpers import build_standin, run_fused_case, standin_hooks

pytestmark = pytest.mark.cudnn

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    out = build_standin(tmp_path_factory.mktemp("standin"))
    lib = cudnn_bind.load(out, cudart=out)
    yield lib, standin_hooks(out), out
    cudnn_bind.reset()


def calls(hooks, name):
    return hooks.standin_calls(name.encode())


def take_log(hooks):
    """The stand-in's stream log since the last take: one line per call that
    takes a stream ("record E on S", "wait S for E", "<cuDNN call> on S mode M")."""
    buf = ctypes.create_string_buffer(8192)
    hooks.standin_take_log(buf, len(buf))
    return buf.value.decode().splitlines()


def stream_of(line):
    """The stream of a log line, as an int (0 for the legacy default stream)."""
    text = line.split(" on ")[1].split()[0]
    return 0 if text in ("(nil)", "0") else int(text, 16)


def modes(hooks):
    return [int(line.rsplit(" ", 1)[1]) for line in take_log(hooks) if " mode " in line]


dev = cudnn_bind.DeviceArray.from_numpy


def channels_last(a):
    """A DeviceArray holding `a` (N, C, ...) in channels-last memory order."""
    nd = a.ndim
    perm = (0,) + tuple(range(2, nd)) + (1,)
    host = np.ascontiguousarray(a.transpose(perm))
    base = dev(host)
    st = [0] * nd
    st[1] = 1
    acc = a.shape[1]
    for i in range(nd - 1, 1, -1):
        st[i] = acc
        acc *= a.shape[i]
    st[0] = acc
    return cudnn_bind.DeviceArray.from_pointer(base.ptr, a.shape, base.dtype, st, owner=base)


TOL = {"float32": 2e-5, "float64": 1e-12, "float16": 4e-3, "bfloat16": 3e-2}


def close(got, want, dtype, what):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    err = float(np.max(np.abs(got - want))) / scale if want.size else 0.0
    assert err <= TOL[dtype], f"{what}: max error {err:.3g} > {TOL[dtype]:.0e}"


def make(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 1.5 + 0.3).astype(np.float32)
    c = shape[1]
    pdt = np.float64 if dtype == "float64" else np.float32
    w = rng.standard_normal(c).astype(pdt)
    b = rng.standard_normal(c).astype(pdt)
    xd = x.astype(BF16 if dtype == "bfloat16" else dtype)
    return xd, w, b


CASES = [((8, 5), "contiguous"), ((4, 3, 10), "contiguous"), ((4, 3, 5, 6), "contiguous"),
         ((4, 3, 5, 6), "channels_last"), ((2, 3, 4, 5, 6), "contiguous"),
         ((2, 3, 4, 5, 6), "channels_last")]


def upload(a, layout="contiguous"):
    return channels_last(a) if layout == "channels_last" else dev(a)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,layout", CASES, ids=[f"{s}-{l}" for s, l in CASES])
def test_training_inference_backward_match_cynorm(standin, shape, layout, dtype):
    lib, hooks, _ = standin
    x, w, b = make(shape, dtype)
    c = shape[1]
    pdt = w.dtype
    rm, rv = np.full(c, 0.2, pdt), np.full(c, 1.3, pdt)
    gx, gw, gb, grm, grv = upload(x, layout), dev(w), dev(b), dev(rm), dev(rv)
    y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(gx, gw, gb, grm, grv, 0.1, 1e-5)
    assert y.strides == gx.strides  # the output keeps x's layout
    rm_ref, rv_ref = rm.copy(), rv.copy()
    y_ref, m_ref, i_ref = cynorm.batch_norm(x, w, b, rm_ref, rv_ref, True, 0.1, 1e-5)
    close(y.to_numpy(), y_ref.astype(np.float64), dtype, "y")
    close(sm.to_numpy(), m_ref, "float32" if dtype != "float64" else dtype, "save_mean")
    close(si.to_numpy(), i_ref, "float32" if dtype != "float64" else dtype, "save_invstd")
    close(grm.to_numpy(), rm_ref, "float32" if dtype != "float64" else dtype, "running_mean")
    close(grv.to_numpy(), rv_ref, "float32" if dtype != "float64" else dtype, "running_var")
    np.testing.assert_array_equal(gx.to_numpy(), x)  # input untouched

    dy = make(shape, dtype, seed=1)[0]
    gdy = upload(dy, layout)
    dx, dw, db = cudnn_bind.batch_norm_backward(gx, gdy, gw, sm, si, 1e-5, reserve)
    ref = cynorm.batch_norm_backward(dy, x, w, None, None, m_ref, i_ref, True)
    close(dx.to_numpy(), ref[0].astype(np.float64), dtype, "dx")
    pd = "float32" if dtype != "float64" else dtype
    close(dw.to_numpy() / max(1, x.size // c), ref[1] / max(1, x.size // c), pd, "dweight")
    close(db.to_numpy() / max(1, x.size // c), ref[2] / max(1, x.size // c), pd, "dbias")

    ye = cudnn_bind.batch_norm_forward_inference(gx, gw, gb, grm, grv, 1e-5)
    ye_ref, _, _ = cynorm.batch_norm(x, w, b, rm_ref, rv_ref, False, eps=1e-5)
    close(ye.to_numpy(), ye_ref.astype(np.float64), dtype, "y (inference)")


@pytest.mark.parametrize("shape,layout,training,expected", [
    ((8, 5), "contiguous", True, cudnn_bind.SPATIAL),  # 2-D: as (N, C, 1, 1), not PER_ACTIVATION
    ((8, 5), "contiguous", False, cudnn_bind.SPATIAL),
    ((4, 3, 5, 6), "contiguous", True, cudnn_bind.SPATIAL),
    ((4, 3, 5, 6), "channels_last", True, cudnn_bind.SPATIAL_PERSISTENT),
    ((4, 3, 5, 6), "channels_last", False, cudnn_bind.SPATIAL),
    ((2, 3, 4, 5, 6), "channels_last", True, cudnn_bind.SPATIAL_PERSISTENT),
    # packed both ways: the strides of the size-1 dims decide, as in PyTorch
    ((4, 1, 5, 6), "channels_last", True, cudnn_bind.SPATIAL_PERSISTENT),
    ((4, 1, 5, 6), "contiguous", True, cudnn_bind.SPATIAL),
    ((4, 3, 1, 1), "channels_last", True, cudnn_bind.SPATIAL_PERSISTENT),
    ((4, 3, 1, 1), "contiguous", True, cudnn_bind.SPATIAL),
])
def test_mode_reaches_cudnn(standin, shape, layout, training, expected):
    lib, hooks, _ = standin
    x, w, b = make(shape, "float32")
    args = [upload(x, layout), dev(w), dev(b), dev(np.zeros(shape[1], np.float32)),
            dev(np.ones(shape[1], np.float32))]
    take_log(hooks)
    if training:
        y = cudnn_bind.batch_norm_forward_training(*args)[0]
    else:
        y = cudnn_bind.batch_norm_forward_inference(*args)
    assert modes(hooks) == [expected]
    ref = cynorm.batch_norm(x, w, b, np.zeros(shape[1], np.float32),
                            np.ones(shape[1], np.float32), training)[0]
    close(y.to_numpy(), ref, "float32", "y")
    ok, why = cudnn_bind.can_use_cudnn(*args, training=training)
    assert ok == (len(shape) > 2), why


def test_torch_layout_rule_for_ambiguous_strides():
    from cudnn_bind.rules import layout_of
    # ATen's suggest_memory_format examples: N1H1 and 1C1W permutations
    assert layout_of((2, 1, 3, 1), (3, 1, 1, 1)) == "channels_last"
    assert layout_of((2, 1, 3, 1), (3, 3, 1, 1)) == "contiguous"
    assert layout_of((5, 1, 1, 1), (1, 1, 1, 1)) == "contiguous"
    assert layout_of((1, 4, 1, 3), (12, 1, 12, 4)) == "channels_last"
    assert layout_of((2, 3, 4, 5), (60, 1, 15, 3)) == "channels_last"
    with pytest.raises(ValueError, match="contiguous in N,C,... order or channels-last"):
        layout_of((2, 3, 4, 5), (60, 20, 1, 4))


def test_per_activation_override_normalizes_each_position_over_the_batch(standin):
    shape = (6, 2, 3, 4)
    x, _, _ = make(shape, "float32")
    feat = 2 * 3 * 4
    rng = np.random.default_rng(3)
    w = rng.standard_normal(feat).astype(np.float32)
    b = rng.standard_normal(feat).astype(np.float32)
    y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(dev(x), dev(w), dev(b),
                                                                mode="per_activation")
    ref, m, i = cynorm.batch_norm(x.reshape(6, feat), w, b, training=True)
    close(y.to_numpy().reshape(6, feat), ref, "float32", "y")
    close(sm.to_numpy(), m, "float32", "save_mean")
    with pytest.raises(ValueError, match="24 elements"):
        cudnn_bind.batch_norm_forward_training(dev(x), dev(w[:2]), dev(b[:2]), mode="per_activation")


@pytest.mark.parametrize("shape", [(4, 4, 5, 6), (2, 8, 3, 4, 5)])
@pytest.mark.parametrize("with_z", [False, True])
def test_fused_relu_and_add_relu(standin, shape, with_z):
    lib, hooks, _ = standin
    take_log(hooks)
    run_fused_case(shape, with_z, make, upload, close)
    assert modes(hooks)[:1] == [cudnn_bind.SPATIAL_PERSISTENT]


@pytest.mark.parametrize("dtype,layout,shape,kwargs,needs", [
    ("float32", "channels_last", (4, 4, 5, 6), {}, "float16 data (x is float32)"),
    ("float16", "contiguous", (4, 4, 5, 6), {}, "channels-last 4-D or 5-D x"),
    ("float16", "contiguous", (4, 4, 5), {}, "channels-last 4-D or 5-D x (x is N,C,... 3-D)"),
    ("float16", "channels_last", (4, 6, 5, 6), {"z": True}, "divisible by 4 (C = 6)"),
    ("float16", "channels_last", (4, 4, 5, 6), {"mode": "spatial"},
     "mode SPATIAL_PERSISTENT (mode= asked for SPATIAL)"),
])
def test_fused_ops_outside_cudnns_rule_are_refused_before_cudnn(standin, dtype, layout, shape,
                                                                kwargs, needs):
    lib, hooks, _ = standin
    x, w, b = make(shape, dtype)
    gx, gw, gb = upload(x, layout), dev(w), dev(b)
    z = upload(x, layout) if kwargs.pop("z", False) else None
    before = (calls(hooks, "cudnnBatchNormalizationForwardTrainingEx"),
              calls(hooks, "cudnnBatchNormalizationBackwardEx"))
    with pytest.raises(cudnn_bind.UnsupportedError, match="cuDNN fuses") as info:
        cudnn_bind.batch_norm_forward_training(gx, gw, gb, z=z, activation="relu", **kwargs)
    assert needs in str(info.value) and info.value.rule == "fused_activation"
    assert isinstance(info.value, ValueError)
    with pytest.raises(cudnn_bind.UnsupportedError, match="cuDNN fuses"):
        cudnn_bind.batch_norm_backward(gx, gx, gw, gw, gw, 1e-5, None, y=gx, z=z, bias=gb,
                                       activation="relu", **kwargs)
    ok, why = cudnn_bind.can_use_cudnn(gx, gw, gb, z=z, activation="relu", **kwargs)
    assert not ok and why == str(info.value)
    assert before == (calls(hooks, "cudnnBatchNormalizationForwardTrainingEx"),
                      calls(hooks, "cudnnBatchNormalizationBackwardEx"))


def test_fused_relu_without_z_needs_no_channel_multiple_of_4(standin):
    x, w, b = make((4, 6, 3, 2), "float16")
    y = cudnn_bind.batch_norm_forward_training(upload(x, "channels_last"), dev(w), dev(b),
                                               activation="relu")[0]
    ref = cynorm.batch_norm(x, w, b, training=True)[0]
    close(y.to_numpy(), np.maximum(ref.astype(np.float64), 0), "float16", "y")


def test_workspace_is_cached_per_handle_and_only_grows(standin):
    lib, hooks, _ = standin
    cudnn_bind._lib.get()  # same library
    x, w, b = make((4, 3, 5, 6), "float32")
    args = [dev(x), dev(w), dev(b)]
    cudnn_bind.batch_norm_forward_training(*args)
    before = calls(hooks, "cudaMalloc")
    cudnn_bind.batch_norm_forward_training(*args)
    # outputs come back from the pool, the workspace is the handle's: no cudaMalloc
    assert calls(hooks, "cudaMalloc") - before == 0
    h = cudnn_bind.handle_for(0)
    assert h.workspace_size >= hooks.standin_last_size(b"workspace") > 0
    big = make((4, 300, 5, 6), "float32")
    size0 = h.workspace_size
    cudnn_bind.batch_norm_forward_training(dev(big[0]), dev(big[1]), dev(big[2]))
    assert h.workspace_size > size0  # grown for the bigger call
    size1 = h.workspace_size
    before = calls(hooks, "cudaMalloc")
    cudnn_bind.batch_norm_forward_training(*args)
    assert h.workspace_size == size1 and calls(hooks, "cudaMalloc") - before == 0


def test_reserve_is_checked_and_passed_through(standin):
    x, w, b = make((4, 3, 5, 6), "float32")
    gx, gw, gb = dev(x), dev(w), dev(b)
    y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(gx, gw, gb)
    dy = dev(make((4, 3, 5, 6), "float32", seed=2)[0])
    other = cudnn_bind.batch_norm_forward_training(dev(make((4, 3, 5, 7), "float32")[0]),
                                                   gw, gb)[3]
    if other.nbytes != reserve.nbytes:
        with pytest.raises(ValueError, match="reserve has"):
            cudnn_bind.batch_norm_backward(gx, dy, gw, sm, si, 1e-5, other)
    with pytest.raises(ValueError, match="reserve has 0 bytes"):
        cudnn_bind.batch_norm_backward(gx, dy, gw, sm, si, 1e-5, None)
    # right size, never written by a forward call: only the library can tell
    blank = dev(np.zeros(reserve.nbytes, np.uint8))
    with pytest.raises(cudnn_bind.CudnnError) as info:
        cudnn_bind.batch_norm_backward(gx, dy, gw, sm, si, 1e-5, blank)
    assert info.value.name == "CUDNN_STATUS_BAD_PARAM" and "reserve" in info.value.detail


def test_inference_over_65535_runs_in_chunks(standin):
    lib, hooks, _ = standin
    n = cudnn_bind.INFERENCE_MAX_BATCH + 7
    x, w, b = make((n, 3, 1, 2), "float32")
    rm, rv = np.array([0.1, -0.2, 0.3], np.float32), np.array([1.5, 0.5, 2.0], np.float32)
    before = calls(hooks, "cudnnBatchNormalizationForwardInference")
    y = cudnn_bind.batch_norm_forward_inference(dev(x), dev(w), dev(b), dev(rm), dev(rv))
    assert calls(hooks, "cudnnBatchNormalizationForwardInference") - before == 2
    ref, _, _ = cynorm.batch_norm(x, w, b, rm.copy(), rv.copy(), False)
    close(y.to_numpy(), ref, "float32", "y")


def test_out_stream_and_array_protocols(standin):
    lib, hooks, _ = standin
    x, w, b = make((4, 3, 5, 6), "float32")
    gx, gw, gb = dev(x), dev(w), dev(b)
    out = cudnn_bind.DeviceArray(x.shape, "float32")

    class Stream:
        ptr = 0x1234

    class CAI:  # any __cuda_array_interface__ exporter
        def __init__(self, a):
            self.__cuda_array_interface__ = a.__cuda_array_interface__

    y, *_ = cudnn_bind.batch_norm_forward_training(CAI(gx), CAI(gw), CAI(gb), out=out, stream=Stream())
    assert y is out
    ref, _, _ = cynorm.batch_norm(x, w, b, training=True)
    close(out.to_numpy(), ref, "float32", "out")
    s = ctypes.c_void_p()
    lib.call("cudnnGetStream", cudnn_bind.handle_for(0).ptr, ctypes.byref(s))
    assert s.value == 0x1234
    with pytest.raises(TypeError, match="stream"):
        cudnn_bind.batch_norm_forward_training(gx, gw, gb, stream="default")


def test_bad_input_is_refused_before_cudnn(standin):
    lib, hooks, _ = standin
    x, w, b = make((4, 3, 5, 6), "float32")
    gx, gw, gb = dev(x), dev(w), dev(b)
    before = calls(hooks, "cudnnBatchNormalizationForwardTrainingEx")
    with pytest.raises(TypeError, match="x: a NumPy array is host memory"):
        cudnn_bind.batch_norm_forward_training(x, gw, gb)
    with pytest.raises(TypeError, match="DeviceArray.from_pointer"):
        cudnn_bind.batch_norm_forward_training(gx.ptr, gw, gb)
    with pytest.raises(ValueError, match="weight must have 3 elements"):
        cudnn_bind.batch_norm_forward_training(gx, dev(np.ones(4, np.float32)), gb)
    with pytest.raises(TypeError, match="weight must be float32"):
        cudnn_bind.batch_norm_forward_training(gx, dev(w.astype(np.float64)), gb)
    with pytest.raises(TypeError, match="weight must be float32"):
        cudnn_bind.batch_norm_forward_training(dev(x.astype(np.float16)), dev(w.astype(np.float16)),
                                               dev(b.astype(np.float16)))
    with pytest.raises(ValueError, match="bias is required"):
        cudnn_bind.batch_norm_forward_training(gx, gw, None)
    with pytest.raises(ValueError, match="2 to 5 dimensions"):
        cudnn_bind.batch_norm_forward_training(dev(np.ones(4, np.float32)), gw, gb)
    with pytest.raises(ValueError, match="2 to 5 dimensions"):
        cudnn_bind.batch_norm_forward_training(dev(np.ones((2, 3, 1, 1, 1, 2), np.float32)), gw, gb)
    strided = cudnn_bind.DeviceArray.from_pointer(gx.ptr, (4, 3, 5, 3), "float32", (90, 30, 6, 2),
                                                  owner=gx)
    with pytest.raises(ValueError, match="contiguous in N,C,... order or channels-last"):
        cudnn_bind.batch_norm_forward_training(strided, gw, gb)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        cudnn_bind.batch_norm_forward_training(dev(np.ones((1, 3), np.float32)), gw, gb)
    with pytest.raises(ValueError, match="together"):
        cudnn_bind.batch_norm_forward_training(gx, gw, gb, running_mean=dev(np.zeros(3, np.float32)))
    with pytest.raises(ValueError, match="eps must be >="):
        cudnn_bind.batch_norm_forward_training(gx, gw, gb, eps=-1.0)
    with pytest.raises(ValueError, match="activation must be"):
        cudnn_bind.batch_norm_forward_training(gx, gw, gb, activation="gelu")
    with pytest.raises(ValueError, match="needs activation='relu'"):
        cudnn_bind.batch_norm_forward_training(gx, gw, gb, z=gx)
    with pytest.raises(ValueError, match="mode must be"):
        cudnn_bind.batch_norm_forward_training(gx, gw, gb, mode="fast")
    with pytest.raises(ValueError, match="out must have x's shape"):
        cudnn_bind.batch_norm_forward_training(gx, gw, gb, out=dev(np.ones((4, 3), np.float32)))
    huge = cudnn_bind.DeviceArray.from_pointer(gx.ptr, (cudnn_bind.TRAINING_MAX_BATCH + 1, 1, 1, 1),
                                               "float32", owner=gx)
    with pytest.raises(ValueError, match="880801"):
        cudnn_bind.batch_norm_forward_training(huge, dev(w[:1]), dev(b[:1]))
    with pytest.raises(ValueError, match="not device memory"):
        host = np.ones(3, np.float32)
        fake = cudnn_bind.DeviceArray.from_pointer(host.ctypes.data, (3,), "float32", owner=host)
        cudnn_bind.batch_norm_forward_training(gx, fake, gb)
    with pytest.raises(ValueError, match="running_mean"):
        cudnn_bind.batch_norm_forward_inference(gx, gw, gb, None, dev(np.ones(3, np.float32)))
    assert calls(hooks, "cudnnBatchNormalizationForwardTrainingEx") == before


def test_host_memory_alone_is_refused(standin):
    """Every array a view of host memory (no device array beside it to
    compare with): refused as not device memory, before any cuDNN call,
    not run on the current device with host pointers."""
    _, hooks, _ = standin
    x = np.random.default_rng(5).standard_normal((4, 3, 5, 5)).astype(np.float32)
    host = [x, np.ones(3, np.float32), np.zeros(3, np.float32), np.zeros(3, np.float32),
            np.ones(3, np.float32)]
    gx, gw, gb, grm, grv = (cudnn_bind.DeviceArray.from_pointer(a.ctypes.data, a.shape, "float32",
                                                                owner=a) for a in host)
    assert gx.device is None
    before = (calls(hooks, "cudnnBatchNormalizationForwardInference"),
              calls(hooks, "cudnnBatchNormalizationForwardTrainingEx"))
    with pytest.raises(ValueError, match="bias, running_mean, running_var, weight, x: not device "
                                         "memory"):
        cudnn_bind.batch_norm_forward_inference(gx, gw, gb, grm, grv)
    with pytest.raises(ValueError, match="bias, weight, x: not device memory"):
        cudnn_bind.batch_norm_forward_training(gx, gw, gb)
    assert (calls(hooks, "cudnnBatchNormalizationForwardInference"),
            calls(hooks, "cudnnBatchNormalizationForwardTrainingEx")) == before


def test_device_array_round_trip_and_free(standin):
    lib, hooks, _ = standin
    cudnn_bind.empty_cache()
    live = hooks.standin_live_allocations()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with dev(a) as d:
        assert hooks.standin_live_allocations() == live + 1
        np.testing.assert_array_equal(d.to_numpy(), a)
        assert d.__cuda_array_interface__["shape"] == (3, 4)
        assert d.__cuda_array_interface__["stream"] == 1  # the legacy default stream
    assert d.ptr == 0 and cudnn_bind.memory_info()["cached_bytes"] >= 48  # kept for reuse
    assert hooks.standin_live_allocations() == live + 1
    cudnn_bind.empty_cache()
    assert hooks.standin_live_allocations() == live
    with pytest.raises(ValueError, match="freed"):
        cudnn_bind.batch_norm_forward_training(d, d, d)
    bf = dev(a.astype(BF16))
    np.testing.assert_array_equal(bf.to_numpy(), a.astype(BF16))
    with pytest.raises(TypeError, match="bfloat16"):
        bf.__cuda_array_interface__


def test_can_use_cudnn_names_the_first_failing_condition(standin):
    x, w, b = make((4, 3, 5, 6), "float32")
    gx, gw, gb = dev(x), dev(w), dev(b)
    assert cudnn_bind.can_use_cudnn(gx, gw, gb, training=True) == (True, "")
    ok, why = cudnn_bind.can_use_cudnn(dev(x[:, :, 0, 0]), gw, gb)
    assert not ok and "at least 3 dimensions" in why
    ok, why = cudnn_bind.can_use_cudnn(gx, gw, None)
    assert not ok and why == "bias is required (cuDNN batch norm has no default for it)"
    ok, why = cudnn_bind.can_use_cudnn(gx, gw, gb, training=False)
    assert not ok and "running_mean" in why
    ok, why = cudnn_bind.can_use_cudnn(dev(x.astype(BF16)), gw, gb)
    assert not ok and "bfloat16" in why
    ok, why = cudnn_bind.can_use_cudnn(x, gw, gb)
    assert not ok and "not a CUDA array" in why


def test_no_gpu_handle_error_through_the_standin(standin):
    _, _, path = standin
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import cudnn_bind
        cudnn_bind.load({path!r}, cudart={path!r})
        try:
            cudnn_bind.handle_for(0)
        except cudnn_bind.CudnnError as e:
            print(e.status, e.name, "|", e.detail)
    """)], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, CUDNN_STANDIN_NO_GPU="1"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("1001 CUDNN_STATUS_NOT_INITIALIZED |")


def test_descriptors_are_made_once_per_signature_and_go_with_the_library(standin):
    lib, hooks, path = standin
    live = hooks.standin_live_objects
    x, w, b = make((4, 4, 5, 6), "float16")
    gx, gw, gb = upload(x, "channels_last"), dev(w), dev(b)
    cudnn_bind.handle_for(0)

    def step():
        y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(gx, gw, gb, activation="relu")
        cudnn_bind.batch_norm_backward(gx, gx, gw, sm, si, 1e-5, reserve, y=y, bias=gb,
                                       activation="relu")
        cudnn_bind.batch_norm_forward_inference(gx, gw, gb, gw, gw)
    step()
    counts = (live(b"tensor"), live(b"activation"), live(b"handle"))
    created = calls(hooks, "cudnnCreateTensorDescriptor")
    for _ in range(3):
        step()
    with pytest.raises(ValueError):
        cudnn_bind.batch_norm_forward_training(gx, dev(w[:2]), gb, activation="relu")
    assert (live(b"tensor"), live(b"activation"), live(b"handle")) == counts
    assert calls(hooks, "cudnnCreateTensorDescriptor") == created
    # reset() drops the plans, their descriptors and the handles
    cudnn_bind.load(path, cudart=path)
    gc.collect()  # tracebacks of earlier failures hold frames that hold plans
    assert (live(b"tensor"), live(b"activation"), live(b"handle")) == (0, 0, 0)


def test_dlpack_exporters_of_host_memory_are_refused():
    class HostExporter:  # a DLPack producer that is not a NumPy array
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, **kwargs):
            return self._a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    with pytest.raises(ValueError, match="x: DLPack device type 1 is not CUDA memory"):
        cudnn_bind.memory.as_view(HostExporter(np.ones((2, 3), np.float32)), "x", lib=object())


def test_size_one_dims_get_aten_strides_whatever_they_held():
    from cudnn_bind.descriptors import padded_geometry
    # unsqueeze/slicing leave any stride on a size-1 dimension; ATen's
    # fixSizeOneDimStride gives it the product of the sizes inside it
    assert padded_geometry((8, 3, 1, 5), (15, 5, 999, 1)) == ([8, 3, 1, 5], [15, 5, 5, 1])
    assert padded_geometry((2, 3, 1, 5), (15, 1, 999, 3), channels_last=True) == \
        ([2, 3, 1, 5], [15, 1, 15, 3])
    assert padded_geometry((2, 3), (3, 1)) == ([2, 3, 1, 1], [3, 1, 1, 1])
    assert padded_geometry((4, 3, 7), (21, 7, 1)) == ([4, 3, 7, 1], [21, 7, 1, 1])


def test_destroyed_or_foreign_handles_are_refused(standin):
    x, w, b = make((4, 3, 5, 6), "float32")
    gx, gw, gb = dev(x), dev(w), dev(b)
    h = cudnn_bind.Handle(_lib.get(), 0)
    y, *_ = cudnn_bind.batch_norm_forward_training(gx, gw, gb, handle=h)
    h.destroy()
    with pytest.raises(ValueError, match="handle has been destroyed"):
        cudnn_bind.batch_norm_forward_training(gx, gw, gb, handle=h)
    with pytest.raises(TypeError, match="handle must be"):
        cudnn_bind.batch_norm_forward_training(gx, gw, gb, handle=12345)


def test_one_workspace_per_stream(standin):
    x, w, b = make((4, 3, 5, 6), "float32")
    gx, gw, gb = dev(x), dev(w), dev(b)
    h = cudnn_bind.handle_for(0)
    cudnn_bind.batch_norm_forward_training(gx, gw, gb, stream=0)
    cudnn_bind.batch_norm_forward_training(gx, gw, gb, stream=0x77)
    cudnn_bind.batch_norm_forward_training(gx, gw, gb, stream=0x77)
    assert {0, 0x77} <= set(h._workspaces) and h._workspaces[0][0] != h._workspaces[0x77][0]


def test_empty_batch_inference_and_read_only_outputs(standin):
    x, w, b = make((4, 3, 5, 6), "float32")
    gw, gb = dev(w), dev(b)
    rm, rv = dev(np.zeros(3, np.float32)), dev(np.ones(3, np.float32))
    empty = dev(np.ones((0, 3, 5, 6), np.float32))
    y = cudnn_bind.batch_norm_forward_inference(empty, gw, gb, rm, rv)
    assert y.shape == (0, 3, 5, 6)

    class ReadOnly:
        def __init__(self, a):
            cai = dict(a.__cuda_array_interface__)
            cai["data"] = (a.ptr, True)
            self.__cuda_array_interface__ = cai

    with pytest.raises(ValueError, match="running_mean is read-only"):
        cudnn_bind.batch_norm_forward_training(dev(x), gw, gb, ReadOnly(rm), rv)
    with pytest.raises(ValueError, match="out is read-only"):
        cudnn_bind.batch_norm_forward_inference(dev(x), gw, gb, rm, rv, out=ReadOnly(dev(x)))


def test_can_use_cudnn_reports_bad_arguments_instead_of_raising(standin):
    x, w, b = make((4, 3, 5, 6), "float32")
    ok, why = cudnn_bind.can_use_cudnn(dev(x), w, dev(b))
    assert not ok and "weight" in why and "host memory" in why


@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_eps_down_to_cudnn_9s_floor_is_accepted(standin, eps):
    """cuDNN 9's CUDNN_BN_MIN_EPSILON is 0.0 (the stand-in is built from its
    header, and refuses less): eps = 0 and 1e-6 reach cuDNN in all three
    calls and give the results of that eps (a float64 NumPy reference)."""
    lib, hooks, _ = standin
    assert lib.major == 9 and lib.min_epsilon == 0.0
    x, w, b = make((4, 3, 5, 6), "float32")
    rm, rv = np.full(3, 0.2, np.float32), np.full(3, 1.3, np.float32)
    gx, gw, gb, grm, grv = dev(x), dev(w), dev(b), dev(rm), dev(rv)
    before = calls(hooks, "cudnnBatchNormalizationForwardTrainingEx")
    y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(gx, gw, gb, grm, grv, 0.1, eps)
    assert calls(hooks, "cudnnBatchNormalizationForwardTrainingEx") == before + 1
    # the reference in float64 NumPy: cynorm itself refuses eps = 0 in training
    xd, per = x.astype(np.float64), (None, slice(None), None, None)
    mean, var = xd.mean((0, 2, 3)), xd.var((0, 2, 3))
    invstd = 1 / np.sqrt(var + eps)
    close(y.to_numpy(), (xd - mean[per]) * (invstd * w)[per] + b[per], "float32", "y")
    close(si.to_numpy(), invstd, "float32", "save_invstd")
    n = x.size // 3
    rm_ref, rv_ref = 0.9 * rm + 0.1 * mean, 0.9 * rv + 0.1 * var * n / (n - 1)
    close(grv.to_numpy(), rv_ref, "float32", "running_var")
    dy = make((4, 3, 5, 6), "float32", seed=1)[0]
    dx = cudnn_bind.batch_norm_backward(gx, dev(dy), gw, sm, si, eps, reserve)[0]
    ref = cynorm.batch_norm_backward(dy, x, w, None, None, mean.astype(np.float32),
                                     invstd.astype(np.float32), True)[0]
    close(dx.to_numpy(), ref, "float32", "dx")
    ye = cudnn_bind.batch_norm_forward_inference(gx, gw, gb, grm, grv, eps)
    close(ye.to_numpy(), (xd - rm_ref[per]) / np.sqrt(rv_ref[per] + eps) * w[per] + b[per],
          "float32", "y (inference)")
    assert cudnn_bind.can_use_cudnn(gx, gw, gb, grm, grv, eps=eps) == (True, "")
    with pytest.raises(ValueError, match=r"eps must be >= 0.0 \(CUDNN_BN_MIN_EPSILON of cuDNN 9\)"):
        cudnn_bind.batch_norm_forward_inference(gx, gw, gb, grm, grv, -1e-12)
