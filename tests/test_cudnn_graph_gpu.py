"""cudnn_bind's graph-API path on a real GPU: layer norm and RMSNorm forward
and backward against a float64 NumPy reference (and PyTorch's functions on
PyTorch tensors), batch norm on the graph path against the legacy path and
cynorm, the automatic choice between them, and the plan cache.  Skipped
without a GPU (CI has none); `.ci/gpu_run` runs them with
CUDNN_BIND_REQUIRE_GPU=1, where "no GPU" fails them."""
import os

import ml_dtypes
import numpy as np
import pytest

import cudnn_bind
import cynorm
from cudnn_helpers import to_device
from test_cudnn_gpu import REASON, REQUIRE_GPU_VARIABLE, gpu_or_skip

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture
def needs_gpu():
    gpu_or_skip(REASON, os.environ.get(REQUIRE_GPU_VARIABLE) == "1")


pytestmark = [pytest.mark.cudnn, pytest.mark.gpu, pytest.mark.usefixtures("needs_gpu")]

# relative to the largest reference value; the 16-bit types round y and dx
TOL = {"float32": 3e-4, "float16": 8e-3, "bfloat16": 5e-2}


def close(got, want, dtype, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.max(np.abs(want))))
    err = float(np.max(np.abs(got - want))) / scale
    assert err <= TOL[dtype], f"{what}: max error {err:.3g} > {TOL[dtype]:.0e}"


def host(dtype):
    return BF16 if dtype == "bfloat16" else np.dtype(dtype)


def data(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 1.7 + 0.4).astype(np.float32).astype(host(dtype))


def ln_reference(x, w, b, cols, eps, rms):
    """(y, mean, invstd) in float64, per row of `cols` values."""
    x2 = np.asarray(x, np.float64).reshape(-1, cols)
    mean = np.zeros((x2.shape[0], 1)) if rms else x2.mean(1, keepdims=True)
    var = (x2 ** 2).mean(1, keepdims=True) if rms else ((x2 - mean) ** 2).mean(1, keepdims=True)
    invstd = 1.0 / np.sqrt(var + eps)
    y = (x2 - mean) * invstd * np.asarray(w, np.float64)
    if b is not None:
        y = y + np.asarray(b, np.float64)
    return y.reshape(x.shape), mean[:, 0], invstd[:, 0]


def ln_backward_reference(dy, x, w, mean, invstd, cols, rms):
    x2 = np.asarray(x, np.float64).reshape(-1, cols)
    g = np.asarray(dy, np.float64).reshape(-1, cols)
    xhat = (x2 - mean[:, None]) * invstd[:, None]
    dxhat = g * np.asarray(w, np.float64)
    proj = (dxhat * xhat).mean(1, keepdims=True)
    centre = 0.0 if rms else dxhat.mean(1, keepdims=True)
    dx = invstd[:, None] * (dxhat - centre - xhat * proj)
    return dx.reshape(x.shape), (g * xhat).sum(0), g.sum(0)


LN_SHAPES = [((8, 64), (64,)), ((4, 7, 96), (96,)), ((32, 1024), (1024,)),
             ((2, 3, 4, 16), (4, 16)), ((512, 768), (768,))]


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("wdtype", ["x", "float32"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,norm", LN_SHAPES, ids=[str(s) for s, _ in LN_SHAPES])
def test_norm_forward_and_backward_against_float64(shape, norm, dtype, wdtype, rms):
    cols = int(np.prod(norm))
    wd = dtype if wdtype == "x" else "float32"
    x, dy = data(shape, dtype, 0), data(shape, dtype, 1)
    w = data((cols,), wd, 2)
    b = data((cols,), wd, 3)
    eps = 1e-5
    gx, gw, gb = to_device(x), to_device(w), to_device(b)
    if rms:
        y, invstd = cudnn_bind.rms_norm_forward(gx, norm, gw, eps)
        y_ref, mean_ref, inv_ref = ln_reference(x, w, None, cols, eps, True)
    else:
        y, mean, invstd = cudnn_bind.layer_norm_forward(gx, norm, gw, gb, eps)
        y_ref, mean_ref, inv_ref = ln_reference(x, w, b, cols, eps, False)
        close(mean.to_numpy().ravel(), mean_ref, "float32", "mean")
        assert mean.shape == shape[:len(shape) - len(norm)] + (1,) * len(norm)
    assert y.shape == x.shape and y.dtype == dtype
    close(y.to_numpy(), y_ref, dtype, "y")
    close(invstd.to_numpy().ravel() / inv_ref.max(), inv_ref / inv_ref.max(), "float32", "invstd")

    if rms:
        dx, dw = cudnn_bind.rms_norm_backward(to_device(dy), gx, norm, invstd, gw)
    else:
        dx, dw, db = cudnn_bind.layer_norm_backward(to_device(dy), gx, norm, mean, invstd, gw)
    dx_ref, dw_ref, db_ref = ln_backward_reference(dy, x, w, mean_ref, inv_ref, cols, rms)
    rows = x.size // cols
    close(dx.to_numpy(), dx_ref, dtype, "dx")
    close(dw.to_numpy() / rows, dw_ref / rows, wd if wd != "float32" else dtype, "dweight")
    if not rms:
        close(db.to_numpy() / rows, db_ref / rows, wd if wd != "float32" else dtype, "dbias")

    ye = cudnn_bind.rms_norm_forward(gx, norm, gw, eps, training=False) if rms else \
        cudnn_bind.layer_norm_forward(gx, norm, gw, gb, eps, training=False)
    assert len(ye) == 1
    close(ye[0].to_numpy(), y_ref, dtype, "y (inference)")


def test_rms_norm_with_bias_and_its_gradient():
    x, dy = data((16, 256), "float32", 0), data((16, 256), "float32", 1)
    w, b = data((256,), "float32", 2), data((256,), "float32", 3)
    y, invstd = cudnn_bind.rms_norm_forward(to_device(x), 256, to_device(w), 1e-6,
                                            bias=to_device(b))
    y_ref, _, inv_ref = ln_reference(x, w, b, 256, 1e-6, True)
    close(y.to_numpy(), y_ref, "float32", "y")
    dx, dw, db = cudnn_bind.rms_norm_backward(to_device(dy), to_device(x), 256, invstd,
                                              to_device(w), with_dbias=True)
    dx_ref, dw_ref, db_ref = ln_backward_reference(dy, x, w, np.zeros(16), inv_ref, 256, True)
    close(dx.to_numpy(), dx_ref, "float32", "dx")
    close(db.to_numpy() / 16, db_ref / 16, "float32", "dbias")


def test_rms_norm_default_eps_is_the_dtype_epsilon():
    x, w = data((4, 32), "float16", 0), data((32,), "float16", 1)
    y, _ = cudnn_bind.rms_norm_forward(to_device(x), (32,), to_device(w))
    close(y.to_numpy(), ln_reference(x, w, None, 32, float(np.finfo(np.float16).eps), True)[0],
          "float16", "y")


def test_torch_tensors_match_torch_functions():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        name = str(dtype).split(".")[1]
        x = torch.randn(64, 512, device="cuda", dtype=dtype, requires_grad=False)
        w = torch.randn(512, device="cuda", dtype=dtype)
        b = torch.randn(512, device="cuda", dtype=dtype)
        y, mean, invstd = cudnn_bind.layer_norm_forward(x, (512,), w, b, 1e-5)
        assert isinstance(y, torch.Tensor) and y.dtype == dtype
        close(y.float().cpu().numpy(), F.layer_norm(x.float(), (512,), w.float(), b.float(),
                                                    1e-5).cpu().numpy(), name, "layer_norm")
        yr, _ = cudnn_bind.rms_norm_forward(x, (512,), w, 1e-6)
        close(yr.float().cpu().numpy(), F.rms_norm(x.float(), (512,), w.float(),
                                                   1e-6).cpu().numpy(), name, "rms_norm")


BN_CASES = [((4, 3, 5, 6), "contiguous"), ((4, 3, 5, 6), "channels_last"),
            ((8, 64, 14, 14), "channels_last"), ((8, 64, 14, 14), "contiguous"),
            ((2, 3, 4, 5, 6), "channels_last"), ((64, 5), "contiguous"),
            ((32, 64, 56, 56), "channels_last")]


def _bn_make(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 1.5 + 0.3).astype(np.float32).astype(host(dtype))
    c = shape[1]
    return x, rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,layout", BN_CASES, ids=[f"{s}-{l}" for s, l in BN_CASES])
def test_batch_norm_graph_matches_legacy_and_cynorm(shape, layout, dtype):
    x, w, b = _bn_make(shape, dtype)
    dy = _bn_make(shape, dtype, 1)[0]
    c = shape[1]
    gx = to_device(x, layout)
    backend, why = cudnn_bind.batch_norm_backend(gx, training=True)
    print(f"training {shape} {layout} {dtype}: {backend} {why}")
    results = {}
    for chosen in ("legacy", "auto"):
        rm, rv = to_device(np.full(c, 0.2, np.float32)), to_device(np.full(c, 1.3, np.float32))
        gw, gb = to_device(w), to_device(b)
        y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(
            gx, gw, gb, rm, rv, 0.1, 1e-5, backend=chosen)
        assert y.strides == gx.strides
        dx, dw, db = cudnn_bind.batch_norm_backward(gx, to_device(dy, layout), gw, sm, si, 1e-5,
                                                    reserve, backend=chosen)
        ye = cudnn_bind.batch_norm_forward_inference(gx, gw, gb, rm, rv, 1e-5, backend=chosen)
        results[chosen] = [a.to_numpy() for a in (y, sm, si, rm, rv, dx, dw, db, ye)]
    rm_ref, rv_ref = np.full(c, 0.2, np.float32), np.full(c, 1.3, np.float32)
    y_ref, m_ref, i_ref = cynorm.batch_norm(x, w, b, rm_ref, rv_ref, True, 0.1, 1e-5)
    d_ref = cynorm.batch_norm_backward(dy, x, w, None, None, m_ref, i_ref, True)
    ye_ref = cynorm.batch_norm(x, w, b, rm_ref, rv_ref, False, eps=1e-5)[0]
    count = x.size // c
    refs = [y_ref, m_ref, i_ref, rm_ref, rv_ref, d_ref[0], d_ref[1] / count, d_ref[2] / count,
            ye_ref]
    names = ["y", "save_mean", "save_invstd", "running_mean", "running_var", "dx", "dweight",
             "dbias", "y (inference)"]
    for chosen, got in results.items():
        got[6], got[7] = got[6] / count, got[7] / count
        for g, r, n in zip(got, refs, names):
            close(g, r, dtype if n in ("y", "dx", "y (inference)") else "float32",
                  f"{n} ({chosen})")


def test_backend_argument_is_checked_and_graph_is_forced_or_refused():
    x, w, b = _bn_make((4, 8, 6, 6), "float32")
    gx, gw, gb = to_device(x), to_device(w), to_device(b)
    with pytest.raises(ValueError, match="backend must be"):
        cudnn_bind.batch_norm_forward_training(gx, gw, gb, backend="cudnn")
    xd = to_device(x.astype(np.float64))
    with pytest.raises(cudnn_bind.UnsupportedError, match="float64"):
        cudnn_bind.batch_norm_forward_training(xd, to_device(w.astype(np.float64)),
                                               to_device(b.astype(np.float64)), backend="graph")
    assert cudnn_bind.batch_norm_backend(xd)[0] == "legacy"


def test_plans_are_cached_per_signature():
    lib = cudnn_bind._lib.get()
    x, w, b = data((16, 128), "float32", 0), data((128,), "float32", 1), data((128,), "float32", 2)
    gx, gw, gb = to_device(x), to_device(w), to_device(b)
    cudnn_bind.layer_norm_forward(gx, 128, gw, gb)
    n = len(lib.graphs)
    for _ in range(3):
        cudnn_bind.layer_norm_forward(gx, 128, gw, gb)
    assert len(lib.graphs) == n
    cudnn_bind.layer_norm_forward(to_device(data((17, 128), "float32", 0)), 128, gw, gb)
    assert len(lib.graphs) == n + 1


def test_ln_bad_arguments_are_clean_errors():
    x = to_device(data((4, 16), "float32", 0))
    w = to_device(data((16,), "float32", 1))
    with pytest.raises(ValueError, match="trailing dimensions"):
        cudnn_bind.layer_norm_forward(x, (8,), w, w)
    with pytest.raises(ValueError, match="bias is required"):
        cudnn_bind.layer_norm_forward(x, 16, w, None)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        cudnn_bind.layer_norm_forward(to_device(np.ones((4, 16))), 16, w, w)
    with pytest.raises(ValueError, match="16 elements"):
        cudnn_bind.rms_norm_forward(x, 16, to_device(np.ones(8, np.float32)))
    with pytest.raises(TypeError, match="dy must have"):
        cudnn_bind.rms_norm_backward(to_device(np.ones((4, 16), np.float16)), x, 16,
                                     to_device(np.ones(4, np.float32)), w)


def test_auto_takes_the_graph_path_where_cudnn_has_engines():
    """What cuDNN 9.19 on an H200 had engines for: batch-norm training with
    64 channels in both layouts and every 16/32-bit dtype; none with 3
    channels (the legacy call runs them)."""
    if cudnn_bind.version() < 91900:
        pytest.skip(f"engine coverage was measured on cuDNN 9.19; this is {cudnn_bind.version()}")
    for dtype in ("float32", "float16", "bfloat16"):
        for layout in ("contiguous", "channels_last"):
            x = to_device(_bn_make((8, 64, 14, 14), dtype)[0], layout)
            assert cudnn_bind.batch_norm_backend(x, training=True) == ("graph", ""), (dtype, layout)
        small = to_device(_bn_make((4, 3, 5, 6), dtype)[0])
        backend, why = cudnn_bind.batch_norm_backend(small, training=True)
        assert backend == "legacy" and "no engine" in why


def test_graph_layer_norm_under_a_torch_side_stream():
    torch = pytest.importorskip("torch")
    side = torch.cuda.Stream()
    x = torch.randn(256, 1024, device="cuda")
    w, b = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        x2 = x * 2.0  # produced on the side stream: the call runs there, after it
        y, _, _ = cudnn_bind.layer_norm_forward(x2, 1024, w, b)
    side.synchronize()
    want = torch.nn.functional.layer_norm(x * 2.0, (1024,), w, b)
    close(y.cpu().numpy(), want.cpu().numpy(), "float32", "y")


def test_batch_norm_views_off_16_bytes_take_the_legacy_call():
    """Weights and running statistics may be views at any float offset (a
    slice of a parameter buffer).  cuDNN's graph kernels fault on addresses
    off 16 bytes whatever the graph declares, spoiling the CUDA context, so
    such a call takes the legacy call ("graph" refuses it, naming them)."""
    torch = pytest.importorskip("torch")
    x = torch.randn(8, 64, 14, 14, device="cuda")
    buf = torch.randn(6 * 64 + 1, device="cuda")
    w, b, rm, rv = (buf[1 + i * 64:1 + (i + 1) * 64] for i in range(4))   # 4-byte aligned
    rv.abs_().add_(0.5)
    rm2, rv2 = rm.clone(), rv.clone()
    with pytest.raises(cudnn_bind.UnsupportedError,
                       match="weight, bias, running_mean, running_var are not 16-byte aligned"):
        cudnn_bind.batch_norm_forward_training(x, w, b, rm, rv, 0.1, 1e-5, backend="graph")
    assert rm.equal(rm2)                           # refused before any work
    y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(x, w, b, rm, rv, 0.1, 1e-5)
    want = torch.nn.functional.batch_norm(x, rm2, rv2, w, b, training=True)
    close(y.cpu().numpy(), want.cpu().numpy(), "float32", "y")
    close(rm.cpu().numpy(), rm2.cpu().numpy(), "float32", "running_mean")
    close(rv.cpu().numpy(), rv2.cpu().numpy(), "float32", "running_var")
    dx, dw, db = cudnn_bind.batch_norm_backward(x, torch.ones_like(x), w, sm, si, 1e-5, reserve)
    assert torch.isfinite(dx).all() and db.allclose(torch.full_like(db, 8 * 14 * 14.0))
    y_eval = cudnn_bind.batch_norm_forward_inference(x, w, b, rm, rv, 1e-5)
    want = torch.nn.functional.batch_norm(x, rm, rv, w, b, training=False)
    close(y_eval.cpu().numpy(), want.cpu().numpy(), "float32", "inference y")
    torch.cuda.synchronize()                       # a fault would surface here


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_norm_views_off_16_bytes_are_read_through_aligned_copies(dtype):
    """Layer norm and RMSNorm have no legacy call: x, dy, weights and saved
    statistics at any element offset reach the graph as aligned copies, and
    the results are those of the aligned arrays."""
    torch = pytest.importorskip("torch")
    td = getattr(torch, dtype)
    rows, cols = 32, 256
    xbuf = torch.randn(2 * rows * cols + 1, device="cuda", dtype=td)
    x, dy = xbuf[1:1 + rows * cols].view(rows, cols), xbuf[1 + rows * cols:].view(rows, cols)
    pbuf = torch.randn(2 * cols + 1, device="cuda", dtype=td)
    w, b = pbuf[1:cols + 1], pbuf[cols + 1:]
    copies = [t.clone() for t in (x, dy, w, b)]
    got = cudnn_bind.layer_norm_forward(x, cols, w, b)
    want = cudnn_bind.layer_norm_forward(copies[0], cols, copies[2], copies[3])
    for g, r, what in zip(got, want, ("y", "mean", "invstd")):
        assert g.equal(r), what
    mean, invstd = want[1], want[2]
    sbuf = torch.empty(2 * rows + 1, device="cuda")
    m_view, i_view = sbuf[1:rows + 1], sbuf[rows + 1:]
    m_view.copy_(mean.ravel())
    i_view.copy_(invstd.ravel())
    got = cudnn_bind.layer_norm_backward(dy, x, cols, m_view, i_view, w)
    want = cudnn_bind.layer_norm_backward(copies[1], copies[0], cols, mean, invstd, copies[2])
    for g, r, what in zip(got, want, ("dx", "dweight", "dbias")):
        assert g.equal(r), what
    got = cudnn_bind.rms_norm_forward(x, cols, w)
    want = cudnn_bind.rms_norm_forward(copies[0], cols, copies[2])
    assert got[0].equal(want[0]) and got[1].equal(want[1])
    i_view.copy_(want[1].ravel())
    got = cudnn_bind.rms_norm_backward(dy, x, cols, i_view, w)
    want = cudnn_bind.rms_norm_backward(copies[1], copies[0], cols, want[1], copies[2])
    assert got[0].equal(want[0]) and got[1].equal(want[1])
    for t, c in zip((x, dy, w, b), copies):        # inputs untouched
        assert t.equal(c)
    torch.cuda.synchronize()
