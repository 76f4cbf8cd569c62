"""cudnn_bind on a real GPU, against cynorm's CPU batch norm: every dtype
(float32, float64, float16, bfloat16), N,C,... and channels-last, 2-D to
5-D, training, inference and backward; the fused ReLU / add+ReLU where
cuDNN has them; DeviceArray, CuPy and PyTorch inputs; a side stream with a
pending producer (right without the caller synchronizing); two threads; a
failing cudaMalloc; a second device.  Every test skips, with the reason,
where there is no GPU (CI has none): `.ci/gpu_run` runs them on one."""
import threading

import ml_dtypes
import numpy as np
import pytest

import cudnn_bind
import cynorm
from cudnn_helpers import run_fused_case

pytestmark = [pytest.mark.cudnn, pytest.mark.gpu]

BF16 = np.dtype(ml_dtypes.bfloat16)


def _reason():
    try:
        return cudnn_bind.unavailable_reason()
    except Exception as exc:  # a broken install must not break collection
        return f"cudnn_bind failed to load: {exc}"


REASON = _reason()
needs_gpu = pytest.mark.skipif(bool(REASON), reason=f"no usable GPU: {REASON}")

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


def to_device(a, layout="contiguous", stream=None):
    """A DeviceArray holding `a` (N, C, ...) in the given memory layout."""
    if layout == "contiguous":
        return cudnn_bind.DeviceArray.from_numpy(a, stream=stream)
    nd = a.ndim
    host = np.ascontiguousarray(a.transpose((0,) + tuple(range(2, nd)) + (1,)))
    base = cudnn_bind.DeviceArray.from_numpy(host, stream=stream)
    st, acc = [0] * nd, a.shape[1]
    st[1] = 1
    for i in range(nd - 1, 1, -1):
        st[i] = acc
        acc *= a.shape[i]
    st[0] = acc
    return cudnn_bind.DeviceArray.from_pointer(base.ptr, a.shape, base.dtype, st, owner=base,
                                               stream=stream)


CASES = [((64, 5), "contiguous"), ((4, 3, 10), "contiguous"), ((4, 3, 5, 6), "contiguous"),
         ((4, 3, 5, 6), "channels_last"), ((2, 3, 4, 5, 6), "contiguous"),
         ((2, 3, 4, 5, 6), "channels_last"), ((8, 64, 14, 14), "channels_last")]


@needs_gpu
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


@needs_gpu
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


@needs_gpu
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


@needs_gpu
def test_a_pending_producer_on_a_side_stream_is_waited_for():
    """x is still being written on one stream when the call runs on another;
    no one synchronizes, and the result is still right."""
    torch = _torch_cuda()
    x, w, b = make((16, 32, 32, 32), "float32")
    src = torch.from_numpy(x).cuda()
    torch.cuda.synchronize()
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    for attempt in range(3):  # the sleep makes the race certain, not likely
        dst = torch.full_like(src, float("nan"))
        torch.cuda.synchronize()
        with torch.cuda.stream(producer):
            torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time before the copy
            dst.copy_(src)
        gx = cudnn_bind.DeviceArray.from_pointer(dst.data_ptr(), x.shape, "float32", owner=dst,
                                                 stream=producer.cuda_stream)
        gw, gb = to_device(w), to_device(b)
        y = cudnn_bind.batch_norm_forward_training(gx, gw, gb, stream=consumer.cuda_stream)[0]
        assert y.stream == consumer.cuda_stream
        got = y.to_numpy()  # waits for the consumer stream only
        close(got, cynorm.batch_norm(x, w, b, training=True)[0], "float32", f"y (try {attempt})")


@needs_gpu
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


@needs_gpu
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


@needs_gpu
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


@needs_gpu
def test_an_impossible_allocation_is_a_clean_error():
    with pytest.raises(cudnn_bind.CudaError, match="cudaErrorMemoryAllocation"):
        cudnn_bind.DeviceArray((1 << 50,), "uint8")
    x, w, b = make((4, 3, 5, 6), "float32")
    y = cudnn_bind.batch_norm_forward_training(to_device(x), to_device(w), to_device(b))[0]
    close(y.to_numpy(), cynorm.batch_norm(x, w, b, training=True)[0], "float32", "y after")


@needs_gpu
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
