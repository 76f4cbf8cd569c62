"""cudnn_bind on a real GPU: cuDNN against cynorm's CPU batch norm, with
DeviceArray, CuPy and PyTorch CUDA inputs, streams, and the chunked
inference of batches over 65535.  Every test skips, with the reason, where
there is no GPU (these machines and CI have none)."""
import numpy as np
import pytest

import cudnn_bind
import cynorm

pytestmark = [pytest.mark.cudnn, pytest.mark.gpu]


def _reason():
    try:
        return cudnn_bind.unavailable_reason()
    except Exception as exc:  # a broken install must not break collection
        return f"cudnn_bind failed to load: {exc}"


REASON = _reason()
needs_gpu = pytest.mark.skipif(bool(REASON), reason=f"no usable GPU: {REASON}")


def _data(shape, axis=1, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * 2 + 0.5
    c = shape[axis]
    w = rng.standard_normal(c).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    return x, w, b


@needs_gpu
@pytest.mark.parametrize("shape", [(8, 4), (4, 3, 10), (4, 3, 5, 6), (2, 3, 4, 5, 6)])
def test_training_forward_and_backward_match_cynorm(shape):
    x, w, b = _data(shape)
    rm, rv = np.zeros(shape[1], np.float32), np.ones(shape[1], np.float32)
    dx_ = cudnn_bind.DeviceArray.from_numpy
    with dx_(x) as gx, dx_(w) as gw, dx_(b) as gb, dx_(rm) as grm, dx_(rv) as grv:
        y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(gx, gw, gb, grm, grv, 0.1, 1e-5)
        ref_y, ref_m, ref_i = cynorm.batch_norm(x, w, b, rm, rv, training=True, momentum=0.1)
        np.testing.assert_allclose(y.to_numpy(), ref_y, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(sm.to_numpy(), ref_m, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(si.to_numpy(), ref_i, rtol=1e-4)
        np.testing.assert_allclose(grm.to_numpy(), rm, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grv.to_numpy(), rv, rtol=1e-5)
        dy = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        with dx_(dy) as gdy:
            dx, dw, db = cudnn_bind.batch_norm_backward(gx, gdy, gw, sm, si, 1e-5, reserve)
        ref = cynorm.batch_norm_backward(dy, x, w, None, None, ref_m, ref_i, True)
        for got, want in zip((dx, dw, db), ref):
            np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-3, atol=1e-4)


@needs_gpu
def test_inference_over_65535_runs_in_chunks():
    shape = (cudnn_bind.INFERENCE_MAX_BATCH + 7, 3, 2, 2)
    x, w, b = _data(shape)
    rm = np.array([0.1, -0.2, 0.3], np.float32)
    rv = np.array([1.5, 0.5, 2.0], np.float32)
    arrays = [cudnn_bind.DeviceArray.from_numpy(a) for a in (x, w, b, rm, rv)]
    y = cudnn_bind.batch_norm_forward_inference(*arrays)
    ref, _, _ = cynorm.batch_norm(x, w, b, rm.copy(), rv.copy(), training=False)
    np.testing.assert_allclose(y.to_numpy(), ref, rtol=1e-5, atol=1e-5)


@needs_gpu
def test_cupy_inputs_and_stream():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    x, w, b = _data((4, 3, 5, 6))
    stream = cupy.cuda.Stream()
    with stream:
        gx, gw, gb = cupy.asarray(x), cupy.asarray(w), cupy.asarray(b)
        y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(gx, gw, gb, stream=stream)
        stream.synchronize()
    assert isinstance(y, cupy.ndarray)
    ref, _, _ = cynorm.batch_norm(x, w, b, training=True)
    np.testing.assert_allclose(cupy.asnumpy(y), ref, rtol=1e-4, atol=1e-4)


@needs_gpu
def test_torch_cuda_tensors_channels_last():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch build has no CUDA")
    x, w, b = _data((4, 3, 5, 6))
    tx = torch.from_numpy(x).cuda().to(memory_format=torch.channels_last)
    tw, tb = torch.from_numpy(w).cuda(), torch.from_numpy(b).cuda()
    y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(
        tx, tw, tb, stream=torch.cuda.current_stream())
    assert y.is_contiguous(memory_format=torch.channels_last)
    ref, _, _ = cynorm.batch_norm(x, w, b, training=True)
    np.testing.assert_allclose(y.cpu().numpy(), ref, rtol=1e-4, atol=1e-4)
    ty = torch.nn.functional.batch_norm(tx, None, None, tw, tb, training=True)
    torch.testing.assert_close(y, ty, rtol=1e-4, atol=1e-4)
