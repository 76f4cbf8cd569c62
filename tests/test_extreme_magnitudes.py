"""float32 and bfloat16 data far from 1: norms, variances and the weight-norm
gradient keep float64's range.

The kernels form squares and products in float32 (the math type of 32- and
16-bit data).  Beyond about 1e19 a square overflows and below about 1e-19 it
leaves float32's normal range; the rows, channels and slices where that
happens are recomputed with float64 squares and float64 coefficients
(common.pxd: float32_squares_ok).  Every result here is checked against the
float64 reference of the same (rounded) input, and the rows of ordinary
magnitude next to an extreme one must keep their bits.
"""
import ml_dtypes
import numpy as np
import pytest

import cynorm
from cynorm import reference as R
from cynorm._kernels import load

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), BF16]
SCALES = [1e20, 1e30, 1e37, 1e-20, 1e-30]
# relative tolerance of a result that is rounded to the storage type once
# (bfloat16: 8 bits) after float32 math
RTOL = {np.dtype(np.float32): 2e-6, BF16: 1.6e-2}


def close(got, want, dtype, what, rtol=None):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64).reshape(got.shape)
    rtol = RTOL[np.dtype(dtype)] if rtol is None else rtol
    scale = np.max(np.abs(want))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=what)


def data(shape, scale, dtype, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape) * scale
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_issue_examples(dtype):
    v = np.array([[3e20, 4e20]], dtype)
    norm = cynorm.norm_except_dim(v, 2, 0)
    close(norm, np.sqrt(np.sum(v.astype(np.float64) ** 2)), dtype, "norm of [3e20, 4e20]")
    w = cynorm.weight_norm(v, np.ones((1, 1), np.float32), 0)
    close(w, v.astype(np.float64) / float(norm[0, 0]), dtype, "weight_norm of [3e20, 4e20]")
    y, mean, rstd = cynorm.layer_norm(v, 2)
    close(y, [[-1, 1]], dtype, "layer_norm of [3e20, 4e20]", rtol=RTOL[np.dtype(dtype)] * 4)
    assert rstd[0, 0] > 0
    tiny = np.array([[3e-30, 4e-30]], dtype)
    close(cynorm.norm_except_dim(tiny, 2, 0),
          np.sqrt(np.sum(tiny.astype(np.float64) ** 2)), dtype, "norm of [3e-30, 4e-30]")


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,dim", [((40, 300), 0), ((300, 40), 1), ((3, 5, 7), 1),
                                       ((6, 5), None)])
def test_weight_norm(shape, dim, dtype, scale):
    v = data(shape, scale, dtype)
    D = 1 if dim is None else shape[dim]
    g = np.random.default_rng(1).uniform(0.5, 2, D).astype(np.float32)
    if dim is None:
        g = g.reshape(())
    gw = data(shape, 1.0, dtype, seed=2)
    norm_ref = R.norm_except_dim(v, 2.0, dim)
    close(cynorm.norm_except_dim(v, 2, dim), norm_ref, dtype, "norm_except_dim (v's dtype)")
    w, norm = cynorm.weight_norm_interface(v, g, dim)
    close(norm, norm_ref, np.float32, "norm", rtol=1e-6)
    w_ref, _ = R.weight_norm(v, g, dim)
    close(w, w_ref, dtype, "w")
    # the gradient from the norm as the forward returned it (float32)
    g64, n64 = np.asarray(g, np.float64), np.asarray(norm, np.float64)
    grad_v, grad_g = cynorm.weight_norm_backward(gw, v, g, norm, dim)
    s = np.sum(R._rows(gw.astype(np.float64) * v.astype(np.float64), dim), axis=1)
    kshape = R.keep_shape(shape, dim) if dim is not None else ()
    n_k, g_k, s_k = n64.reshape(kshape), g64.reshape(kshape), s.reshape(kshape)
    gv_ref = g_k / n_k * gw.astype(np.float64) - g_k * s_k / n_k ** 3 * v.astype(np.float64)
    close(grad_v, gv_ref, dtype, "grad_v", rtol=RTOL[np.dtype(dtype)] * 4)
    close(grad_g, (s_k / n_k).reshape(np.shape(grad_g)), np.float32, "grad_g", rtol=1e-5)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(6, 300), (3, 4, 2)])
def test_layer_norm(shape, dtype, scale):
    x = data(shape, scale, dtype) + np.asarray(3 * scale, dtype)   # a mean 3x the spread
    eps = 0.0 if scale < 1 else 1e-5
    y, mean, rstd = cynorm.layer_norm(x, shape[-1], eps=eps)
    y_ref, mean_ref, rstd_ref = R.layer_norm(x, shape[-1], eps=eps)
    close(mean, mean_ref, np.float32, "mean", rtol=1e-6)
    close(rstd, rstd_ref, np.float32, "rstd", rtol=1e-5)
    close(y, y_ref, dtype, "y", rtol=RTOL[np.dtype(dtype)] * 4)


def _fused(x, axis):
    """Whether batch norm training takes the one-pass-per-channel kernel."""
    from cynorm._arrays import kernel_dims
    A, C, B = kernel_dims(x.shape, axis % x.ndim, None)
    return load("batch_norm").fused_training(A, C, B, x.dtype.itemsize)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,axis", [((2, 16, 600), 1), ((8, 3, 2000), 1), ((50, 7), 1),
                                        ((4, 5, 6, 16), -1)])
def test_batch_norm(shape, axis, dtype, scale):
    x = data(shape, scale, dtype) + np.asarray(2 * scale, dtype)
    eps = 1e-300 if scale < 1 else 1e-5     # training needs eps > 0 (as in PyTorch)
    C = shape[axis]
    y, save_mean, save_invstd = cynorm.batch_norm(x, None, None, None, None, True, 0.1, eps,
                                                  axis)
    mean_ref, invstd_ref = R.batch_norm_stats(x, eps, axis)
    close(save_mean, mean_ref, np.float32, "save_mean", rtol=1e-6)
    close(save_invstd, invstd_ref, np.float32, "save_invstd", rtol=1e-5)
    close(y, R.batch_norm_elemt(x, None, None, mean_ref, invstd_ref, axis), dtype, "y",
          rtol=RTOL[np.dtype(dtype)] * 4)
    mean, invstd = cynorm.batch_norm_stats(x, eps, axis)
    close(mean, mean_ref, np.float32, "batch_norm_stats mean", rtol=1e-6)
    close(invstd, invstd_ref, np.float32, "batch_norm_stats invstd", rtol=1e-5)
    assert save_mean.shape == (C,)


def test_batch_norm_cases_cover_both_kernels():
    """The cases above reach both the fused and the two-pass training kernel."""
    kinds = {_fused(np.empty(s, np.float32), a)
             for s, a in [((2, 16, 600), 1), ((8, 3, 2000), 1)]}
    assert kinds == {True, False}
    assert _fused(np.empty((2, 16, 600), BF16), 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ordinary_rows_keep_their_bits_next_to_an_extreme_one(dtype):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 500)).astype(dtype)
    extreme = x.copy()
    extreme[3] = (rng.standard_normal(500) * 1e25).astype(dtype)
    ordinary = [0, 1, 2, 4, 5, 6, 7]
    # layer norm rows
    for a, b in zip(cynorm.layer_norm(x, 500), cynorm.layer_norm(extreme, 500)):
        np.testing.assert_array_equal(a[ordinary], b[ordinary])
    # weight norm slices, both kernel shapes
    for dim, arr, ext in ((0, x, extreme), (1, x.T.copy(), extreme.T.copy())):
        g = np.ones(8, np.float32)
        for a, b in zip(cynorm.weight_norm_interface(arr, g, dim),
                        cynorm.weight_norm_interface(ext, g, dim)):
            axis = dim if a.ndim > 1 else 0
            np.testing.assert_array_equal(np.take(a, ordinary, axis), np.take(b, ordinary, axis))
    # batch norm channels
    for a, b in zip(cynorm.batch_norm(x.T.copy(), axis=1), cynorm.batch_norm(extreme.T.copy(),
                                                                             axis=1)):
        np.testing.assert_array_equal(np.take(a, ordinary, -1), np.take(b, ordinary, -1))


def test_float16_range_is_its_own():
    """float16 squares never leave float32's range; a float16 norm above 65504
    is inf, as in PyTorch."""
    v = np.full((1, 4), 60000, np.float16)
    assert np.isinf(cynorm.norm_except_dim(v, 2, 0)).all()
    w = cynorm.weight_norm(v, np.ones((1, 1), np.float32), 0)
    np.testing.assert_allclose(w.astype(np.float64), 0.5, rtol=1e-3)


def test_slow_path_rows_are_thread_private(restore_threads):
    """Rows of subnormal data (their float32 scale g / norm overflows: float64
    path) between ordinary rows, split over threads: each row takes its own
    path, with the same bits at any thread count."""
    rng = np.random.default_rng(6)
    v = rng.standard_normal((512, 300)).astype(np.float32)
    v[1::2] *= np.float32(1e-41)
    g = np.ones(512, np.float32)
    results = []
    for n in (1, 2, 4):
        cynorm.set_num_threads(n)
        results.append(cynorm.weight_norm_interface(v, g, 0))
    for w, norm in results[1:]:
        np.testing.assert_array_equal(w, results[0][0])
        np.testing.assert_array_equal(norm, results[0][1])
    w_ref, _ = R.weight_norm(v, g, 0)
    close(results[0][0], w_ref, np.float32, "w", rtol=1e-5)


# ---------------------------------------------------------------- backward sums
#
# The backward reductions form their terms (dy, dy * (x - mean), dy * xhat) in
# float32 and add a few of them in float32 before each float64 add.  With
# |grad_out| near float32's largest value a term or a partial sum overflows
# although the float64 sum need not: the channel, row or column whose sums
# came out inf or NaN is recomputed with float64 terms (common.pxd:
# float32_sums_finite).  A sum whose exact value is beyond float32's range
# is +-inf in a float32 output, as rounding it would give.

GRAD_SCALES = [1e37, 1e38, 3e38]
# batch-norm shapes that take each reduction: columns, fused channels,
# columns with many channels, rows, segments
BN_SHAPES = [(4, 3, 5, 7), (2, 16, 130), (3, 70, 40), (2, 4, 2000), (8, 4, 100)]
LN_SHAPES = [(5, 35), (8, 130), (3, 2000), (4, 3, 64)]


def close_sum(got, want, terms, what):
    """got (any float dtype) against the float64 sums want of terms whose
    magnitudes sum to terms: within float32's partial sums (2^-21 of the
    terms) and the output's own rounding, or +-inf where want is beyond the
    output's range."""
    got = np.asarray(got)
    fmax = float(ml_dtypes.finfo(got.dtype).max)
    eps = float(ml_dtypes.finfo(got.dtype).eps)
    got = got.astype(np.float64)
    want = np.asarray(want, np.float64).reshape(got.shape)
    terms = np.broadcast_to(np.asarray(terms, np.float64), got.shape)
    beyond = np.abs(want) > fmax * (1 + eps)
    assert np.array_equal(got[beyond], np.sign(want[beyond]) * np.inf), what
    inside = ~beyond & (np.abs(want) < fmax * (1 - eps))
    assert np.all(np.isfinite(got[inside])), f"{what}: inf or NaN where the exact sum is finite"
    err = np.abs(got[inside] - want[inside])
    tol = 2.0 ** -21 * terms[inside] + eps * np.abs(want[inside])
    assert np.all(err <= tol), f"{what}: off by {np.max(err - tol):.3g} beyond the bound"


def huge_grad(shape, scale, dtype, seed):
    return (np.random.default_rng(seed).uniform(-1, 1, shape) * scale).astype(dtype)


@pytest.mark.parametrize("scale", GRAD_SCALES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
def test_batch_norm_backward_sums_keep_float64_range(shape, dtype, scale):
    x = data(shape, 1.0, dtype, seed=3) + np.asarray(0.5, dtype)
    dy = huge_grad(shape, scale, dtype, seed=4)
    C = shape[1]
    w = np.random.default_rng(5).uniform(0.5, 1.5, C).astype(np.float32)
    mean, invstd = cynorm.batch_norm_stats(x, 1e-5)
    rows = np.moveaxis(x.astype(np.float64), 1, 0).reshape(C, -1)
    g = np.moveaxis(dy.astype(np.float64), 1, 0).reshape(C, -1)
    xmu = rows - np.asarray(mean, np.float64)[:, None]
    inv = np.asarray(invstd, np.float64)
    sum_dy, sum_dy_xmu = g.sum(1), (g * xmu).sum(1)
    abs_dy, abs_dy_xmu = np.abs(g).sum(1), np.abs(g * xmu).sum(1)

    got = cynorm.batch_norm_backward_reduce(dy, x, mean, invstd, w)
    close_sum(got[0], sum_dy, abs_dy, "backward_reduce sum_dy")
    close_sum(got[1], sum_dy_xmu, abs_dy_xmu, "backward_reduce sum_dy_xmu")
    close_sum(got[2], sum_dy_xmu * inv, abs_dy_xmu * inv, "backward_reduce grad_weight")
    close_sum(got[3], sum_dy, abs_dy, "backward_reduce grad_bias")
    # the fused training backward (and the adapters over it): grad_weight, grad_bias
    for name, (gw, gb) in {
        "batch_norm_backward": cynorm.batch_norm_backward(
            dy, x, w, None, None, mean, invstd, True, 1e-5, (False, True, True))[1:],
        "aten.batch_norm_backward": cynorm.aten.batch_norm_backward(
            dy, x, w, None, None, mean, invstd, True, 1e-5, (False, True, True))[1:],
        "miopen_batch_norm_backward": cynorm.miopen_batch_norm_backward(
            x, dy, w, None, None, mean, invstd, 1e-5)[1:],
        "cudnn_batch_norm_backward": cynorm.cudnn_batch_norm_backward(
            x, dy, w, None, None, mean, invstd, 1e-5, np.empty(0, np.uint8))[1:],
    }.items():
        close_sum(gw, sum_dy_xmu * inv, abs_dy_xmu * inv, f"{name} grad_weight")
        close_sum(gb, sum_dy, abs_dy, f"{name} grad_bias")


def layer_norm_with_huge_grad(shape, dtype, scale, seed):
    """x of ordinary magnitude, dy of magnitude scale, weight in [0.5, 1.5]
    over the last dim, and the forward's mean and rstd."""
    N = shape[-1]
    x = data(shape, 1.0, dtype, seed=seed)
    dy = huge_grad(shape, scale, dtype, seed=seed + 1)
    w = np.random.default_rng(seed + 2).uniform(0.5, 1.5, N).astype(np.float32)
    _, mean, rstd = cynorm.layer_norm(x, N, w)
    return x, dy, w, mean, rstd


@pytest.mark.parametrize("scale", GRAD_SCALES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", LN_SHAPES, ids=str)
def test_layer_norm_backward_sums_keep_float64_range(shape, dtype, scale):
    N = shape[-1]
    x, dy, w, mean, rstd = layer_norm_with_huge_grad(shape, dtype, scale, seed=6)
    xhat = ((x.astype(np.float64).reshape(-1, N) - np.asarray(mean, np.float64).reshape(-1, 1))
            * np.asarray(rstd, np.float64).reshape(-1, 1))
    g = dy.astype(np.float64).reshape(-1, N)
    for mask in [(True, True, True), (False, True, True)]:
        _, gw, gb = cynorm.layer_norm_backward(dy, x, N, mean, rstd, w, None, mask)
        close_sum(gw, (g * xhat).sum(0), np.abs(g * xhat).sum(0), f"grad_weight {mask}")
        close_sum(gb, g.sum(0), np.abs(g).sum(0), f"grad_bias {mask}")


@pytest.mark.parametrize("scale", [3e38, 1e38])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", LN_SHAPES, ids=str)
def test_layer_norm_grad_x_where_dy_times_weight_leaves_float32(shape, dtype, scale):
    # g = dy * w beyond float32's largest value, grad_x = rstd (g - mean g -
    # xhat mean(g xhat)) inside it: the row is recomputed in float64
    N = shape[-1]
    x, dy, w, mean, rstd = layer_norm_with_huge_grad(shape, dtype, scale, seed=9)
    want = R.layer_norm_backward(dy, x, N, mean, rstd, w)[0]
    g = np.abs(dy.astype(np.float64).reshape(-1, N) * w.astype(np.float64))
    terms = (3 * g.max(axis=1, keepdims=True) * np.asarray(rstd, np.float64).reshape(-1, 1))
    for mask in [(True, True, True), (True, False, False)]:
        gx = cynorm.layer_norm_backward(dy, x, N, mean, rstd, w, None, mask)[0]
        close_sum(gx.reshape(-1, N), want.reshape(-1, N), np.broadcast_to(terms, g.shape),
                  f"grad_x {mask}")


@pytest.mark.parametrize("scale", [1e-30, 1e-38, 1e-42])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", LN_SHAPES + [(3, 5, 7)], ids=str)
def test_layer_norm_of_tiny_data_is_as_precise_as_of_normal_data(shape, dtype, scale):
    # data near or below float32's normal range: a mean below 2**-100 does
    # not split into float32 parts (its low part would flush to zero), so
    # the row is normalized in float64.  y is then as close to the float64
    # result as for data of ordinary magnitude: a few roundings of the row's
    # scale (the largest |y|), plus a subnormal step where y is subnormal
    N = shape[-1]
    x = (data(shape, scale, np.float64, seed=12) + 0.3 * scale).astype(dtype)
    w = np.random.default_rng(13).uniform(0.5, 1.5, N).astype(np.float32)
    b = np.random.default_rng(14).uniform(-1, 1, N).astype(np.float32) * np.float32(scale)
    for wb in [(None, None), (w, None), (w, b)]:
        y, mean, rstd = cynorm.layer_norm(x, N, *wb)
        want = R.layer_norm(x, N, *wb)[0]
        eps = float(ml_dtypes.finfo(y.dtype).eps)
        tiny = float(ml_dtypes.finfo(y.dtype).smallest_subnormal)
        err = np.abs(y.astype(np.float64) - want).reshape(-1, N)
        rows = np.max(np.abs(want).reshape(-1, N), axis=1, keepdims=True)
        assert np.all(err <= 4 * eps * rows + tiny), (
            f"y off by up to {np.max(err / (rows + tiny)):.3g} of its row's scale, "
            f"affine {wb[0] is not None}")


ROW_NORMS = {
    "layer_norm": lambda x, N, w, eps: cynorm.layer_norm(x, N, w, None, eps)[::2],
    "rms_norm": lambda x, N, w, eps: cynorm.rms_norm(x, N, w, eps),
    "add_layer_norm": lambda x, N, w, eps: cynorm.add_layer_norm(
        x, np.zeros_like(x), N, w, None, eps)[::3],
    "add_rms_norm": lambda x, N, w, eps: cynorm.add_rms_norm(x, np.zeros_like(x), N, w, eps)[::2],
}


def row_norm_reference(op, x, N, w, eps):
    """(y, rstd) of the float64 reference for a ROW_NORMS op."""
    if "layer" in op:
        y, _, rstd = R.layer_norm(x, N, w, None, eps)
    else:
        y, rstd = R.rms_norm(x, N, w, eps)
    return y, rstd


@pytest.mark.parametrize("op", sorted(ROW_NORMS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rstd_beyond_float32_leaves_y_exact(op, dtype):
    # eps 0 and data near or under float32's smallest normal: the row's rstd
    # is beyond float32's range.  y is still formed with the float64 rstd
    # (within a few roundings of the reference); the returned rstd is inf,
    # as it rounds.  The ordinary row beside them keeps its bits.
    N = 37
    rng = np.random.default_rng(21)
    # (scale, mean / scale) of each row; bfloat16's subnormals stop at 9e-41
    tiny = [(1e-39, 0.3), (1e-42, 0.0), (3e-44, 2.0)] if dtype == np.float32 else [
        (1.5e-39, 0.3), (1e-39, 0.0), (3e-40, 2.0)]
    rows = [rng.standard_normal(N) * s + m * s for s, m in tiny]
    rows.append(np.r_[2e-40, -2e-40, np.zeros(N - 2)])      # mean exactly 0
    rows.append(np.r_[2e-40, 3e-40, np.zeros(N - 2)])
    rows.append(rng.standard_normal(N) + 0.5)                # an ordinary row, last
    x = np.array(rows).astype(dtype)
    w = rng.uniform(0.5, 1.5, N).astype(np.float32)
    for wt in [None, w]:
        y, rstd = ROW_NORMS[op](x, N, wt, 0.0)
        want, rstd_want = row_norm_reference(op, x, N, wt, 0.0)
        assert np.all(np.isfinite(y)), f"{op}: y not finite"
        close_to_output(y, want, f"{op} y, weight {wt is not None}", rows=(-1, N))
        over = rstd_want.reshape(-1) > 3.4028235677973366e38
        assert over[:-1].all() and not over[-1], "the case, as meant"
        assert np.all(np.isinf(rstd.reshape(-1)[over]))
        ordinary, _ = ROW_NORMS[op](x[-1:], N, wt, 0.0)
        np.testing.assert_array_equal(y[-1:].view(np.uint8), ordinary.view(np.uint8))


def close_to_output(got, want, what, rows=None):
    """got within a few roundings of its storage type of want, relative to
    the scale of its row or channel (rows: an axis layout (-1, n) to take
    the scale over, or None for the whole output), plus one subnormal step
    where got is itself subnormal."""
    got = np.asarray(got)
    eps = float(ml_dtypes.finfo(got.dtype).eps)
    tiny = float(ml_dtypes.finfo(got.dtype).smallest_subnormal)
    g = got.astype(np.float64)
    want = np.asarray(want, np.float64).reshape(g.shape)
    err = np.abs(g - want)
    if rows is None:
        scale = np.max(np.abs(want))
    else:
        scale = np.max(np.abs(want).reshape(rows), axis=1, keepdims=True)
        err = err.reshape(rows)
    assert np.all(err <= 4 * eps * scale + tiny), (
        f"{what}: off by up to {np.max(err / (scale + tiny)):.3g} of its scale")


@pytest.mark.parametrize("scale", [1e-30, 1e-38, 1e-42])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
def test_batch_norm_of_tiny_data_is_as_precise_as_of_normal_data(shape, dtype, scale):
    # the training forward (fused channels and the statistics-then-normalize
    # form), and the backward sums of dy * (x - mean), whose float32
    # products fall under float32's normal range: float64 for such channels
    C = shape[1]
    x = (data(shape, scale, np.float64, seed=15) + 0.3 * scale).astype(dtype)
    dy = data(shape, 1.0, dtype, seed=16)
    w = np.random.default_rng(17).uniform(0.5, 1.5, C).astype(np.float32)
    b = (np.random.default_rng(18).uniform(-1, 1, C) * scale).astype(np.float32)
    chan = (C, -1)
    for wb in [(None, None), (w, b)]:
        y = cynorm.batch_norm(x, *wb, None, None, True, 0.1, 1e-5)[0]
        want = R.batch_norm(x, *wb, None, None, True, 0.1, 1e-5)[0]
        close_to_output(np.moveaxis(y, 1, 0), np.moveaxis(want, 1, 0), "y", chan)
    mean, invstd = cynorm.batch_norm_stats(x, 1e-5)
    got = cynorm.batch_norm_backward_reduce(dy, x, mean, invstd, w)
    want = R.batch_norm_backward_reduce(dy, x, mean, invstd, w)
    for name, g, r in zip(("sum_dy", "sum_dy_xmu", "grad_weight", "grad_bias"), got, want):
        close_to_output(g, r, name)
    gw = cynorm.batch_norm_backward(dy, x, w, None, None, mean, invstd, True, 1e-5)[1]
    close_to_output(gw, want[2], "batch_norm_backward grad_weight")


@pytest.mark.parametrize("shape", [(4, 3, 5, 7), (6, 5, 8)], ids=str)
def test_tiny_channels_normalized_in_place(shape):
    # batch_norm_elemt with a float64 mean that float32 cannot split (data far
    # below float32's normal range), written over its own input (out=x): the
    # float64 channels are formed from x before the pass writes over it
    C = shape[1]
    x = (data(shape, 1e-42, np.float64, seed=19) + 3e-43).astype(np.float32)
    x64 = np.moveaxis(x.astype(np.float64), 1, 0).reshape(C, -1)
    mean = x64.mean(axis=1)
    invstd = 1 / np.sqrt(x64.var(axis=1) + 1e-5)
    b = np.full(C, 1e-42, np.float32)
    want = R.batch_norm_elemt(x, None, b, mean, invstd)
    y = cynorm.batch_norm_elemt(x, None, b, mean, invstd, 1e-5, out=x)
    assert y is x
    close_to_output(np.moveaxis(y, 1, 0), np.moveaxis(want, 1, 0), "y in place", (C, -1))


# ------------------------------------------------ grad_x's float32 terms
#
# grad_x = a * (dy - p - (x - mean) * q), p the mean of dy, a = invstd *
# weight (or rstd), is formed in float32.  With dy near float32's largest
# value and p of the other sign, dy - p leaves float32's range although
# grad_x need not (a < 1): the pass raises the thread's overflow flag, and
# the elements that came out infinite or NaN are recomputed in float64
# (cn_fpflags.h).  So are those of a coefficient beyond float32's range.

def dy_off_its_mean(shape, dtype, seed):
    """x of spread 1.5 (invstd about 2/3), half of it near 0; where it is,
    dy is +3.3e38 (a fifth) or -3e38, elsewhere small: the mean of dy is
    near -0.9e38, and dy * (x - mean) stays in float32's range, so only the
    elementwise pass leaves it."""
    rng = np.random.default_rng(seed)
    near = rng.uniform(size=shape) < 0.5
    x = np.where(near, 0.1, 2.1) * rng.choice([-1.0, 1.0], size=shape)
    dy = np.where(near, np.where(rng.uniform(size=shape) < 0.2, 3.3e38, -3.0e38),
                  rng.uniform(-1e36, 1e36, size=shape))
    return x.astype(dtype), dy.astype(dtype)


def grad_x_terms(g, xmu, a):
    """Per element, the magnitudes grad_x = a (g - p - xmu q) adds up,
    |a| (|g| + |p| + |xmu q|), with p = mean(g) and q = mean(g xmu) a**2:
    g and xmu (float64) of shape (n, groups), reduced over axis 0; a the
    groups' invstd or rstd (batch norm's weight multiplies the result)."""
    p = g.mean(axis=0)
    q = (g * xmu).mean(axis=0) * a * a
    return np.abs(a) * (np.abs(g) + np.abs(p) + np.abs(xmu * q))


BN_GRAD_X_CASES = [((4, 3, 5, 7), 1), ((2, 16, 130), 1), ((3, 70, 40), 1), ((2, 4, 2000), 1),
                   ((8, 4, 100), 1), ((64, 512), 1), ((4, 5, 6, 16), -1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,axis", BN_GRAD_X_CASES, ids=str)
def test_batch_norm_grad_x_where_dy_minus_its_mean_leaves_float32(shape, axis, dtype, threads):
    x, dy = dy_off_its_mean(shape, dtype, seed=21)
    C = shape[axis]
    w = np.random.default_rng(22).uniform(0.5, 1.0, C).astype(np.float32)
    mean, invstd = cynorm.batch_norm_stats(x, 1e-5, axis)
    want = R.batch_norm_backward(dy, x, w, None, None, mean, invstd, True, 1e-5, axis)[0]
    g = np.moveaxis(dy.astype(np.float64), axis, -1)
    xmu = np.moveaxis(x.astype(np.float64), axis, -1) - np.asarray(mean, np.float64)
    inv = np.asarray(invstd, np.float64)
    terms = grad_x_terms(g.reshape(-1, C), xmu.reshape(-1, C), inv) * w    # a = invstd * w
    terms = np.moveaxis(terms.reshape(g.shape), -1, axis)
    assert np.all(np.isfinite(want)) and np.max(terms) > 3.4e38 / 2   # the case, as meant
    got = {
        "batch_norm_backward": cynorm.batch_norm_backward(
            dy, x, w, None, None, mean, invstd, True, 1e-5, (True, True, True), axis)[0],
        "batch_norm_backward grad_x only": cynorm.batch_norm_backward(
            dy, x, w, None, None, mean, invstd, True, 1e-5, (True, False, False), axis)[0]}
    if axis == 1:
        got["miopen_batch_norm_backward"] = cynorm.miopen_batch_norm_backward(
            x, dy, w, None, None, mean, invstd, 1e-5)[0]
        got["cudnn_batch_norm_backward"] = cynorm.cudnn_batch_norm_backward(
            x, dy, w, None, None, mean, invstd, 1e-5, np.empty(0, np.uint8))[0]
    for name, gx in got.items():
        close_sum(gx, want, terms, name)
    # the same bits at the other thread count
    cynorm.set_num_threads(3 - threads)
    again = cynorm.batch_norm_backward(dy, x, w, None, None, mean, invstd, True, 1e-5,
                                       (True, True, True), axis)[0]
    np.testing.assert_array_equal(again, got["batch_norm_backward"])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,axis", BN_GRAD_X_CASES, ids=str)
def test_batch_norm_backward_elemt_with_a_slope_beyond_float32(shape, axis, dtype, threads):
    # x of spread 1e-3 (invstd 1e3) and dy up to 3e38 along x - mean (plus a
    # little noise): the sums are in float32's range, the slope sum_dy_xmu /
    # n * invstd^2 about 1e41 is not, and grad_x (weight 1e-4) is again
    x = data(shape, 1e-3, dtype, seed=23)
    C = shape[axis]
    mean, invstd = cynorm.batch_norm_stats(x, 1e-12, axis)
    xmu = np.moveaxis(x.astype(np.float64), axis, -1) - np.asarray(mean, np.float64)
    noise = np.random.default_rng(24).uniform(-1e36, 1e36, xmu.shape)
    dy = np.moveaxis(xmu / np.max(np.abs(xmu)) * 3e38 + noise, -1, axis).astype(dtype)
    w = np.full(C, 1e-4, np.float32)
    sums = cynorm.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, False, False,
                                             axis)[:2]
    count = np.full(1, x.size // C, np.int64)
    want = R.batch_norm_backward_elemt(dy, x, mean, invstd, w, *sums, count, axis)
    got = cynorm.batch_norm_backward_elemt(dy, x, mean, invstd, w, *sums, count, axis)
    slope = np.asarray(sums[1], np.float64) / count[0] * np.asarray(invstd, np.float64) ** 2
    assert np.all(np.isfinite(want)) and np.all(np.abs(slope) > 3.4e38)    # the case, as meant
    close_to_output(np.moveaxis(got, axis, 0), np.moveaxis(want, axis, 0), "grad_x", (C, -1))
    cynorm.set_num_threads(3 - threads)
    np.testing.assert_array_equal(
        cynorm.batch_norm_backward_elemt(dy, x, mean, invstd, w, *sums, count, axis), got)


@pytest.mark.parametrize("streamed", [False, True], ids=["cached", "streamed"])
@pytest.mark.parametrize("weighted", [False, True], ids=["no weight", "weight"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", LN_SHAPES, ids=str)
def test_layer_norm_grad_x_where_dy_minus_its_mean_leaves_float32(shape, dtype, weighted,
                                                                  streamed, threads):
    from cynorm._kernels import _runtime
    N = shape[-1]
    x, dy = dy_off_its_mean(shape, dtype, seed=24)
    w = np.random.default_rng(25).uniform(0.5, 1.0, N).astype(np.float32) if weighted else None
    _, mean, rstd = cynorm.layer_norm(x, N, w)
    want = R.layer_norm_backward(dy, x, N, mean, rstd, w)[0].reshape(-1, N)
    g = dy.astype(np.float64).reshape(-1, N) * (1.0 if w is None else w.astype(np.float64))
    xmu = x.astype(np.float64).reshape(-1, N) - np.asarray(mean, np.float64).reshape(-1, 1)
    terms = grad_x_terms(g.T, xmu.T, np.asarray(rstd, np.float64).reshape(-1)).T
    assert np.all(np.isfinite(want)) and np.max(terms) > 3.4e38 / 2   # the case, as meant
    old = _runtime.set_stream_min_bytes(0 if streamed else 1 << 62)
    try:
        for mask in [(True, True, True), (True, False, False)]:
            gx = cynorm.layer_norm_backward(dy, x, N, mean, rstd, w, None, mask)[0]
            close_sum(gx.reshape(-1, N), want, terms, f"grad_x {mask}")
    finally:
        _runtime.set_stream_min_bytes(old)


@pytest.mark.parametrize("aliased", ["x", "grad_out"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=str)
def test_backward_elemt_into_its_own_input_keeps_the_recompute(aliased, dtype):
    # grad_x written over x or grad_out (out=): the elements a float32 term
    # overflowed are recomputed from grad_out and x, which must still be there
    rng = np.random.default_rng(31)
    x = rng.standard_normal((4, 3, 50)).astype(dtype)
    dy = (rng.standard_normal((4, 3, 50)) * 3e38).clip(-3.3e38, 3.3e38).astype(dtype)
    w = rng.uniform(0.5, 1.0, 3).astype(np.float32)
    mean, invstd = cynorm.batch_norm_stats(x)
    sdy, sdx, _, _ = cynorm.batch_norm_backward_reduce(dy, x, mean, invstd, w)
    want = cynorm.batch_norm_backward_elemt(dy, x, mean, invstd, w, sdy, sdx, [200])
    args = {"x": x.copy(), "grad_out": dy.copy()}
    out = args[aliased]
    got = cynorm.batch_norm_backward_elemt(args["grad_out"], args["x"], mean, invstd, w, sdy, sdx,
                                           [200], out=out)
    assert got is out
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
