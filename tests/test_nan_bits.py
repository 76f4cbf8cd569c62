"""The bits of the NaNs the ops return (README, "Determinism"): a statistic
or sum that is NaN, and every value of a row, channel or group whose
coefficients are NaN, is NumPy's np.nan (quiet, sign clear, no payload),
whatever the signs of the NaNs in the input and however the compiler
ordered the operands of the additions that met them.  Every op family, every
dtype, 1 and 2 threads, rows short and long enough for the vector loops.

The same calls, and more, are in benchmarks/bit_grid.py's specials part,
which .ci/clang compares between the gcc and the clang build."""
import ml_dtypes
import numpy as np
import pytest

import cynorm
from conftest import DTYPES, DTYPE_IDS

# np.nan's bits in each storage type (float32 for the statistics of 16-bit x)
NAN_BITS = {"float64": 0x7FF8000000000000, "float32": 0x7FC00000, "bfloat16": 0x7FC0,
            "float16": 0x7E00}
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def math_dtype(dt):
    return np.float64 if np.dtype(dt) == np.float64 else np.float32


def assert_np_nan(a, what):
    """Every value of a is NaN, with np.nan's bits."""
    a = np.ascontiguousarray(a)
    assert a.size, what
    raw = a.reshape(-1).view(UINT[a.dtype.itemsize])
    want = NAN_BITS[a.dtype.name]
    bad = raw != want
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {raw.size} values are not np.nan's "
                           f"bits {want:#x}, e.g. {int(raw[bad][0]):#x}")


def assert_nans_are_np_nan(a, what):
    """Every NaN in a has np.nan's bits."""
    a = np.ascontiguousarray(a)
    nan = np.isnan(a.astype(np.float32) if a.dtype.itemsize == 2 else a)
    if nan.any():
        assert_np_nan(a[nan], what)


def rows_with_nans(M, N, dt, seed=0):
    """(M, N) data whose rows cycle through: clean; one NaN; NaNs of both
    signs, each order; +inf and -inf (their mean is NaN)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, N)) * 2 + 1
    for i in range(M):
        kind, a, b = i % 5, (3 * i) % N, (5 * i + 1) % N
        if kind == 1:
            x[i, a] = -np.nan
        elif kind == 2:
            x[i, a], x[i, b] = np.nan, -np.nan
        elif kind == 3:
            x[i, b], x[i, a] = np.nan, -np.nan
        elif kind == 4:
            x[i, a], x[i, b] = np.inf, -np.inf
    return x.astype(dt)


def nan_rows(M):
    return np.arange(M) % 5 != 0


SHAPES = [(10, 7), (10, 300), (5, 2100)]


@pytest.fixture(params=DTYPES, ids=DTYPE_IDS)
def dt(request):
    return request.param


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_layer_and_rms_norm_rows(dt, shape, threads):
    M, N = shape
    md = math_dtype(dt)
    x = rows_with_nans(M, N, dt)
    w, b = np.linspace(0.5, 1.5, N).astype(md), np.linspace(-1, 1, N).astype(md)
    bad = nan_rows(M)
    y, m, r = cynorm.layer_norm(x, N, w, b)
    assert_np_nan(m[bad], "layer_norm mean")
    assert_np_nan(r[bad], "layer_norm rstd")
    assert_np_nan(y[bad], "layer_norm y")
    assert np.isfinite(y[~bad].astype(np.float64)).all()
    # dy's NaNs in the clean rows; x's in the others
    dy = rows_with_nans(M, N, dt, seed=1)[::-1].copy()
    gx, gw, gb = cynorm.layer_norm_backward(dy, x, N, m, r, w, b)
    assert_np_nan(gx[bad | nan_rows(M)[::-1]], "layer_norm_backward grad_x")
    assert_np_nan(gw, "layer_norm_backward grad_weight")
    assert_nans_are_np_nan(gb, "layer_norm_backward grad_bias")
    # RMS norm: rows of +inf and -inf have rstd 0 (not NaN), so only the NaN rows
    nan_only = np.arange(M) % 5 % 4 != 0
    y, r = cynorm.rms_norm(x, N, w)
    assert_np_nan(r[nan_only], "rms_norm rstd")
    assert_np_nan(y[nan_only], "rms_norm y")
    gx, gw = cynorm.rms_norm_backward(dy, x, N, r, w)
    assert_np_nan(gx[nan_only], "rms_norm_backward grad_x")
    assert_np_nan(gw, "rms_norm_backward grad_weight")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_add_where_nans_of_both_signs_meet(dt, shape, threads):
    M, N = shape
    x = rows_with_nans(M, N, dt)
    res = (-x.astype(np.float64)).astype(dt)      # x's NaNs, their signs flipped
    bad = nan_rows(M)
    w = np.ones(N, math_dtype(dt))
    y, h, m, r = cynorm.add_layer_norm(x, res, N, w, w)
    assert_np_nan(h[bad][np.isnan(h[bad].astype(np.float32))], "add_layer_norm h")
    assert_np_nan(y[bad], "add_layer_norm y")
    assert_np_nan(m[bad], "add_layer_norm mean")
    y, h, r = cynorm.add_rms_norm(x, res, N, w)
    nan_only = np.arange(M) % 5 % 4 != 0
    assert_np_nan(h[nan_only][np.isnan(h[nan_only].astype(np.float32))], "add_rms_norm h")
    assert_np_nan(y[nan_only], "add_rms_norm y")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_a_nan_weight_and_bias_in_one_column(dt, shape, threads):
    M, N = shape
    md = math_dtype(dt)
    x = (np.random.default_rng(2).standard_normal((M, N)) + 3).astype(dt)
    w, b = np.ones(N, md), np.zeros(N, md)
    w[1], b[1], b[2] = np.nan, -np.nan, -np.nan
    y = cynorm.layer_norm(x, N, w, b)[0]
    assert_np_nan(y[:, 1:3], "layer_norm y")
    assert np.isfinite(np.delete(y, [1, 2], axis=1).astype(np.float64)).all()
    assert_np_nan(cynorm.rms_norm(x, N, w)[0][:, 1], "rms_norm y")


@pytest.mark.parametrize("shape, axis", [((4, 10, 5, 7), 1), ((4, 5, 7, 10), -1),
                                         ((300, 10), 1), ((2, 10, 2100), 1)], ids=str)
def test_batch_group_and_instance_norm_channels(dt, shape, axis, threads):
    md = math_dtype(dt)
    C = shape[axis]
    # x's NaNs and infinities by channel: channel c is as row c of rows_with_nans
    xc = np.moveaxis(np.zeros(shape), axis, 0)
    flat = rows_with_nans(C, xc[0].size, np.float64)
    x = np.ascontiguousarray(np.moveaxis(flat.reshape(xc.shape), 0, axis)).astype(dt)
    bad = nan_rows(C)
    w, b = np.ones(C, md), np.zeros(C, md)
    rm, rv = np.zeros(C, md), np.ones(C, md)
    y, sm, si = cynorm.batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5, axis)
    for a, what in ((sm, "save_mean"), (si, "save_invstd"), (rm, "running_mean"),
                    (rv, "running_var")):
        assert_np_nan(a[bad], f"batch_norm {what}")
    assert_np_nan(np.take(y, np.flatnonzero(bad), axis), "batch_norm y")
    dy = np.ones(shape, dt)
    gx, gw, gb = cynorm.batch_norm_backward(dy, x, w, rm, rv, sm, si, True, 1e-5,
                                            (True, True, True), axis)
    assert_np_nan(np.take(gx, np.flatnonzero(bad), axis), "batch_norm_backward grad_x")
    assert_np_nan(gw[bad], "batch_norm_backward grad_weight")
    if len(shape) != 4:
        return
    # group norm, a group per two channels, and instance norm: a group or
    # instance is NaN where its float64 mean is (NaNs, or +inf with -inf)
    G = C // 2
    xf = np.moveaxis(x.astype(np.float64), axis, 1).reshape(shape[0], C, -1)
    with np.errstate(invalid="ignore"):
        gbad = np.isnan(xf.reshape(shape[0], G, -1).mean(axis=2))       # (N, G)
        ibad = np.isnan(xf.mean(axis=2))                                   # (N, C)

    def values(a, bad_nc):        # a's values of the (n, c) marked in bad_nc
        return np.moveaxis(a, axis, 1).reshape(shape[0], C, -1)[bad_nc]

    y, m, r = cynorm.group_norm(x, G, w, b, axis=axis)
    assert_np_nan(m[gbad], "group_norm mean")
    assert_np_nan(r[gbad], "group_norm rstd")
    assert_np_nan(values(y, np.repeat(gbad, 2, axis=1)), "group_norm y")
    gx, gw, gb = cynorm.group_norm_backward(dy, x, m, r, w, G, axis=axis)
    assert_np_nan(values(gx, np.repeat(gbad, 2, axis=1)), "group_norm_backward grad_x")
    assert_np_nan(gw[np.repeat(gbad, 2, axis=1).any(axis=0)], "group_norm_backward grad_weight")
    rm, rv = np.zeros(C, md), np.ones(C, md)
    y, m, r = cynorm.instance_norm(x, w, b, rm, rv, True, 0.1, 1e-5, axis)
    assert_np_nan(m[ibad], "instance_norm mean")
    assert_np_nan(values(y, ibad), "instance_norm y")
    assert_np_nan(rm[ibad.any(axis=0)], "instance_norm running_mean")
    assert_np_nan(rv[ibad.any(axis=0)], "instance_norm running_var")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dim", [0, 1])
def test_weight_norm_slices(dt, shape, dim, threads):
    v = rows_with_nans(*shape, dt)
    if dim == 1:
        v = np.ascontiguousarray(v.T)
    md = math_dtype(dt)
    gshape = (v.shape[0], 1) if dim == 0 else (1, v.shape[1])
    g = np.full(gshape, 2.0, md)
    w, n = cynorm.weight_norm_interface(v, g, dim)
    # NaN rows (dim 0) or columns (dim 1); +inf with -inf: an infinite norm
    nan_only = np.arange(shape[0]) % 5 % 4 != 0
    pick = (lambda a: a[nan_only]) if dim == 0 else (lambda a: a[:, nan_only])
    assert_np_nan(pick(n), "weight_norm norm")
    assert_np_nan(pick(w), "weight_norm w")
    gw = np.ones(v.shape, dt)
    gv, gg = cynorm.weight_norm_backward(gw, v, g, n, dim)
    assert_np_nan(pick(gv), "weight_norm_backward grad_v")
    assert_np_nan(pick(gg), "weight_norm_backward grad_g")
    # a NaN g: that slice's w is NaN
    g2 = g.copy()
    g2.ravel()[0] = -np.nan
    w2 = cynorm.weight_norm_interface(v, g2, dim)[0]
    assert_np_nan(w2[0] if dim == 0 else w2[:, 0], "weight_norm w of a NaN g")
