"""cudnn_bind on a real GPU, against cynorm's CPU batch norm: every dtype
(float32, float64, float16, bfloat16), N,C,... and channels-last, 2-D to
5-D, training, inference and backward; the fused ReLU / add+ReLU where
cuDNN has them; DeviceArray, CuPy and PyTorch inputs; a side stream with a
pending producer (right without the caller synchronizing); two threads; a
failing cudaMalloc; a second device.  Every test skips, with the reason,
where there is no GPU (CI has none): `.ci/gpu_run` runs them on one, with
CUDNN_BIND_REQUIRE_GPU=1, under which "no GPU" fails them instead (a GPU
run that skipped them all would pass having checked nothing).
tests/test_cudnn_gpu_switch.py checks that switch on a machine without one."""
import ctypes
import os
import threading
import time

import ml_dtypes
import numpy as np
import pytest

import cudnn_bind
import cynorm
from cudnn_helpers import run_fused_case, to_device

BF16 = np.dtype(ml_dtypes.bfloat16)

# .ci/gpu_run sets this: there a missing GPU or driver fails these tests
REQUIRE_GPU_VARIABLE = "CUDNN_BIND_REQUIRE_GPU"


def _reason():
    try:
        return cudnn_bind.unavailable_reason()
    except Exception as exc:  # a broken install must not break collection
        return f"cudnn_bind failed to load: {exc}"


def gpu_or_skip(reason, require):
    """Nothing when `reason` is '' (a GPU is usable); else skip with it, or
    fail when `require` (the run must have a GPU)."""
    if not reason:
        return
    if require:
        pytest.fail(f"no usable GPU: {reason} ({REQUIRE_GPU_VARIABLE}=1: this run must have "
                    "one, so the GPU tests fail instead of skipping)", pytrace=False)
    pytest.skip(f"no usable GPU: {reason}")


REASON = _reason()


@pytest.fixture
def needs_gpu():
    """Every test here uses it: skip without a GPU, or fail under CUDNN_BIND_REQUIRE_GPU=1."""
    gpu_or_skip(REASON, os.environ.get(REQUIRE_GPU_VARIABLE) == "1")


pytestmark = [pytest.mark.cudnn, pytest.mark.gpu, pytest.mark.usefixtures("needs_gpu")]

# cuDNN's kernels reduce in float32 in their own order: tolerances relative
# to the largest reference value
TOL = {"float32": 2e-4, "float64": 1e-10, "float16": 6e-3, "bfloat16": 4e-2}


def close(got, want, dtype, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    err = float(np.max(np.abs(got - want))) / scale if want.size else 0.0
    assert err <= TOL[dtype], f"{what}: max error {err:.3g} > {TOL[dtype]:.0e}"


def make(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 1.5 + 0.3).astype(np.float32)
    pdt = np.float64 if dtype == "float64" else np.float32
    w = rng.standard_normal(shape[1]).astype(pdt)
    b = rng.standard_normal(shape[1]).astype(pdt)
    return x.astype(BF16 if dtype == "bfloat16" else dtype), w, b


CASES = [((64, 5), "contiguous"), ((4, 3, 10), "contiguous"), ((4, 3, 5, 6), "contiguous"),
         ((4, 3, 5, 6), "channels_last"), ((2, 3, 4, 5, 6), "contiguous"),
         ((2, 3, 4, 5, 6), "channels_last"), ((8, 64, 14, 14), "channels_last")]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,layout", CASES, ids=[f"{s}-{l}" for s, l in CASES])
def test_training_inference_backward_match_cynorm(shape, layout, dtype):
    x, w, b = make(shape, dtype)
    c = shape[1]
    pdt = w.dtype
    rm, rv = np.full(c, 0.2, pdt), np.full(c, 1.3, pdt)
    gx, gw, gb, grm, grv = (to_device(x, layout), to_device(w), to_device(b), to_device(rm),
                            to_device(rv))
    y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(gx, gw, gb, grm, grv, 0.1, 1e-5)
    assert y.strides == gx.strides
    rm_ref, rv_ref = rm.copy(), rv.copy()
    y_ref, m_ref, i_ref = cynorm.batch_norm(x, w, b, rm_ref, rv_ref, True, 0.1, 1e-5)
    pd = "float64" if dtype == "float64" else "float32"
    close(y.to_numpy(), y_ref, dtype, "y")
    close(sm.to_numpy(), m_ref, pd, "save_mean")
    close(si.to_numpy(), i_ref, pd, "save_invstd")
    close(grm.to_numpy(), rm_ref, pd, "running_mean")
    close(grv.to_numpy(), rv_ref, pd, "running_var")

    dy = make(shape, dtype, seed=1)[0]
    dx, dw, db = cudnn_bind.batch_norm_backward(gx, to_device(dy, layout), gw, sm, si, 1e-5, reserve)
    ref = cynorm.batch_norm_backward(dy, x, w, None, None, m_ref, i_ref, True)
    count = x.size // c
    close(dx.to_numpy(), ref[0], dtype, "dx")
    close(dw.to_numpy() / count, ref[1] / count, pd, "dweight")
    close(db.to_numpy() / count, ref[2] / count, pd, "dbias")

    ye = cudnn_bind.batch_norm_forward_inference(gx, gw, gb, grm, grv, 1e-5)
    close(ye.to_numpy(), cynorm.batch_norm(x, w, b, rm_ref, rv_ref, False, eps=1e-5)[0], dtype,
          "y (inference)")


@pytest.mark.parametrize("shape", [(8, 8, 7, 9), (2, 16, 3, 4, 5), (4, 6, 5, 5)])
@pytest.mark.parametrize("with_z", [False, True])
def test_fused_relu_and_add_relu_where_cudnn_has_them(shape, with_z):
    if with_z and shape[1] % 4:
        with pytest.raises(cudnn_bind.UnsupportedError, match="C % 4 == 0"):
            cudnn_bind.batch_norm_forward_training(*(to_device(a, layout) for a, layout in zip(
                make(shape, "float16"), ("channels_last", "contiguous", "contiguous"))),
                z=to_device(make(shape, "float16")[0], "channels_last"), activation="relu")
        return
    run_fused_case(shape, with_z, make, to_device, close)


def test_inference_over_65535_runs_in_chunks():
    shape = (cudnn_bind.INFERENCE_MAX_BATCH + 7, 3, 2, 2)
    x, w, b = make(shape, "float32")
    rm = np.array([0.1, -0.2, 0.3], np.float32)
    rv = np.array([1.5, 0.5, 2.0], np.float32)
    y = cudnn_bind.batch_norm_forward_inference(*(to_device(a) for a in (x, w, b, rm, rv)))
    close(y.to_numpy(), cynorm.batch_norm(x, w, b, rm.copy(), rv.copy(), False)[0], "float32", "y")


def _torch_cuda():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch build has no CUDA")
    return torch


# cudaHostFn_t: void (*)(void *userData), run by the driver in stream order
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
STALL_SECONDS = 0.05
# holds the producer stream back on the host: nothing queued after it starts before it returns
STALL = HOST_FN(lambda user_data: time.sleep(STALL_SECONDS))
CUDA_STREAM_NON_BLOCKING = 1


def _runtime(lib):
    """The loaded CUDA runtime with the few calls this test needs declared on
    function objects of its own (cudnn_bind's declarations stay as they are)."""
    rt = ctypes.CDLL(lib.cudart_path)
    vp = ctypes.c_void_p
    rt.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(vp), ctypes.c_uint]
    rt.cudaStreamDestroy.argtypes = [vp]
    rt.cudaLaunchHostFunc.argtypes = [vp, HOST_FN, vp]
    rt.cudaMemsetAsync.argtypes = [vp, ctypes.c_int, ctypes.c_size_t, vp]
    rt.cudaMemcpyAsync.argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_int, vp]
    for name in ("cudaStreamCreateWithFlags", "cudaStreamDestroy", "cudaLaunchHostFunc",
                 "cudaMemsetAsync", "cudaMemcpyAsync"):
        getattr(rt, name).restype = ctypes.c_int
    return rt


def _ok(code, what):
    assert code == 0, f"{what} returned cudaError {code}"


def test_a_pending_producer_on_a_side_stream_is_waited_for():
    """x is still being written on one stream when the call runs on another;
    no one synchronizes, and the result is still right.  The producer is the
    CUDA runtime itself (no PyTorch or CuPy needed, so on a GPU this test
    cannot skip): x is NaN, then the producer stream stalls on the host for
    50 ms, then the real data is copied in; the call is queued at once on a
    second stream and must wait for that copy (an event), not read the NaNs."""
    lib = cudnn_bind._lib.get()
    rt = _runtime(lib)
    streams = []
    for _ in range(2):
        s = ctypes.c_void_p()
        _ok(rt.cudaStreamCreateWithFlags(ctypes.byref(s), CUDA_STREAM_NON_BLOCKING),
            "cudaStreamCreateWithFlags")
        streams.append(s.value)
    producer, consumer = streams
    x, w, b = make((16, 32, 32, 32), "float32")
    ref = cynorm.batch_norm(x, w, b, training=True)[0]
    src, gw, gb = to_device(x), to_device(w), to_device(b)  # ready: from_numpy waits
    try:
        # once with a ready producer: handle, plan, event, workspace and the
        # consumer's pool blocks exist before anything is timed
        ready = cudnn_bind.DeviceArray.from_pointer(src.ptr, x.shape, "float32", owner=src,
                                                    stream=producer)
        cudnn_bind.batch_norm_forward_training(ready, gw, gb, stream=consumer)[0].to_numpy()
        for attempt in range(3):
            dst = cudnn_bind.DeviceArray(x.shape, "float32", stream=producer)
            _ok(rt.cudaMemsetAsync(dst.ptr, 0xFF, dst.nbytes, producer), "cudaMemsetAsync")
            _ok(rt.cudaLaunchHostFunc(producer, STALL, None), "cudaLaunchHostFunc")
            _ok(rt.cudaMemcpyAsync(dst.ptr, src.ptr, dst.nbytes, 3, producer), "cudaMemcpyAsync")
            queued = time.perf_counter()
            y = cudnn_bind.batch_norm_forward_training(dst, gw, gb, stream=consumer)[0]
            # the call itself must not have waited on the host for the producer
            assert time.perf_counter() - queued < STALL_SECONDS, "the call blocked the host"
            assert y.stream == consumer
            close(y.to_numpy(), ref, "float32", f"y (try {attempt})")  # waits for consumer only
    finally:
        lib.cuda("cudaDeviceSynchronize")
        for s in streams:
            rt.cudaStreamDestroy(s)


def test_cupy_inputs_on_a_side_stream_and_their_stream_key():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    x, w, b = make((4, 3, 5, 6), "float32")
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        gx, gw, gb = cupy.asarray(x), cupy.asarray(w), cupy.asarray(b)
        y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(gx, gw, gb)
        dx = cudnn_bind.batch_norm_backward(gx, y, gw, sm, si, 1e-5, reserve)[0]
        stream.synchronize()
    assert isinstance(y, cupy.ndarray) and isinstance(dx, cupy.ndarray)
    close(cupy.asnumpy(y), cynorm.batch_norm(x, w, b, training=True)[0], "float32", "y")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_tensors_channels_last_against_torch(dtype):
    torch = _torch_cuda()
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    x, w, b = make((4, 8, 5, 6), "float32")
    tx = torch.from_numpy(x).cuda().to(tdt).to(memory_format=torch.channels_last)
    tw, tb = torch.from_numpy(w).cuda(), torch.from_numpy(b).cuda()
    y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(tx, tw, tb)
    assert y.is_contiguous(memory_format=torch.channels_last) and y.dtype == tdt
    ty = torch.nn.functional.batch_norm(tx.float(), None, None, tw, tb, training=True)
    close(y.float().cpu().numpy(), ty.cpu().numpy(), dtype, "y vs torch")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # outputs allocated for the side stream
        y2 = cudnn_bind.batch_norm_forward_training(tx, tw, tb)[0]
    side.synchronize()
    close(y2.float().cpu().numpy(), ty.cpu().numpy(), dtype, "y on a side stream")


@pytest.mark.parametrize("private_query", [True, False], ids=["raw query", "public API"])
def test_torch_current_stream_as_the_binding_reads_it(private_query, monkeypatch):
    """The binding reads PyTorch's current stream with torch._C's raw query
    where there is one (else torch.cuda.current_stream): both must name the
    stream torch.cuda.current_stream names, on the default and a side stream,
    and a call under a side stream must run there."""
    torch = _torch_cuda()
    from cudnn_bind import memory
    t = memory._torch()
    if not private_query:
        monkeypatch.setattr(t, "_raw_stream", None)
    elif t._raw_stream is None:
        pytest.skip("this PyTorch has no torch._C._cuda_getCurrentRawStream")
    side = torch.cuda.Stream()
    x, w, b = make((4, 8, 5, 6), "float32")
    tx, tw, tb = (torch.from_numpy(a).cuda() for a in (x, w, b))
    torch.cuda.synchronize()
    for s in (torch.cuda.default_stream(), side):
        with torch.cuda.stream(s):
            assert t.current_stream(0) == s.cuda_stream
            assert memory.as_view(tx, "x").stream == s.cuda_stream
            y = cudnn_bind.batch_norm_forward_training(tx, tw, tb)[0]
        s.synchronize()
        close(y.cpu().numpy(), cynorm.batch_norm(x, w, b, training=True)[0], "float32", "y")


def test_two_threads_each_on_its_per_thread_default_stream():
    """Stream value 2 (cudaStreamPerThread) is a different stream in each
    thread: pooled memory must not move between them."""
    x, w, b = make((8, 16, 9, 9), "float32")
    ref = cynorm.batch_norm(x, w, b, training=True)[0]
    errors = []

    def work():
        try:
            gx, gw, gb = to_device(x), to_device(w), to_device(b)
            for _ in range(50):
                y = cudnn_bind.batch_norm_forward_training(gx, gw, gb, stream=2)[0]
            close(y.to_numpy(), ref, "float32", "y")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_an_impossible_allocation_is_a_clean_error():
    with pytest.raises(cudnn_bind.CudaError, match="cudaErrorMemoryAllocation"):
        cudnn_bind.DeviceArray((1 << 50,), "uint8")
    x, w, b = make((4, 3, 5, 6), "float32")
    y = cudnn_bind.batch_norm_forward_training(to_device(x), to_device(w), to_device(b))[0]
    close(y.to_numpy(), cynorm.batch_norm(x, w, b, training=True)[0], "float32", "y after")


def test_a_second_device_is_made_current_and_restored():
    if cudnn_bind.device_count() < 2:
        pytest.skip("one GPU: no second device to test")
    import ctypes
    lib = cudnn_bind._lib.get()
    x, w, b = make((4, 3, 5, 6), "float32")
    lib.cuda("cudaSetDevice", 1)
    arrays = [to_device(a) for a in (x, w, b)]
    lib.cuda("cudaSetDevice", 0)
    y = cudnn_bind.batch_norm_forward_training(*arrays)[0]
    current = ctypes.c_int()
    lib.cuda("cudaGetDevice", ctypes.byref(current))
    assert y.device == 1 and current.value == 0
    close(y.to_numpy(), cynorm.batch_norm(x, w, b, training=True)[0], "float32", "y")
