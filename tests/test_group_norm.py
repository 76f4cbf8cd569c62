"""Group norm and instance norm against the float64 reference
(cynorm.reference.group_norm ...): channels first and channels last, every
dtype, memory layouts (C order, a torch channels_last tensor's view,
strided), shapes that take each of the kernels' three shapes (groups,
samples, instances), weight None or given (float32 for 16-bit inputs too),
out=, output_mask, zero sizes, finite differences, extreme magnitudes, NaN
groups, thread-count determinism, running statistics; PyTorch parity where
it is installed."""
import itertools

import numpy as np
import pytest

import cynorm
from cynorm import reference as ref
from conftest import DTYPES, DTYPE_IDS, requires_torch
from helpers import BF16, F16, F32, F64, RTOL, assert_close, bits, stat_dtype
from norm_helpers import f64, make_affine, param_dtypes, some, stat_rtol

# (shape of the channels-first x, num_groups): the kernels' groups shape
# (a group up to 512 KiB), its short rows (HW = 1, 7x7) and long ones
# (HW > 32768, the row chunk), samples (channels last up to 512 KiB) and
# instances (larger groups and samples)
CASES = [
    ((2, 6, 3, 4), 3), ((1, 1, 1), 1), ((5, 4), 2), ((3, 8, 1), 8), ((4, 32, 8, 8), 8),
    ((3, 8, 50), 2), ((6, 64, 7, 7), 64), ((2, 12, 5, 4, 3), 4), ((2, 2, 40000), 2),
    ((2, 4, 200, 400), 1), ((2, 48, 96, 80), 3),
]
CASE_IDS = [f"{s}-G{g}" for s, g in CASES]
SLOW = {((2, 4, 200, 400), 1), ((2, 48, 96, 80), 3)}


def to_layout(x, axis, kind):
    """x (channels first, C order) as the caller passes it: axis -1 moves the
    channels last; kind 'C' (C order for that axis), 'other' (the memory of
    the other channel order: a torch channels_last tensor's view for axis
    1), 'strided' (neither)."""
    a = np.ascontiguousarray(np.moveaxis(x, 1, -1)) if axis == -1 else np.ascontiguousarray(x)
    if kind == "C":
        return a
    if kind == "other":
        if axis == -1:
            return np.moveaxis(np.ascontiguousarray(x), 1, -1)
        return np.moveaxis(np.ascontiguousarray(np.moveaxis(x, 1, -1)), -1, 1)
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def channels_first(a, axis):
    return np.moveaxis(a, -1, 1) if axis == -1 and a.ndim > 2 else a


def make_input(rng, shape, dtype, scale=2.0, offset=0.5):
    return (rng.standard_normal(shape) * scale + offset).astype(dtype)


def y_scale(x, G, mean, rstd, w, b, axis):
    """Per-group max of |xhat * w| + |b| (+ |w| |mean| rstd): y's rounding
    is relative to its group's size."""
    g, _ = ref._groups(x, G, axis)
    N, _, D, _ = g.shape
    m = f64(mean).reshape(N, G, 1, 1)
    r = f64(rstd).reshape(N, G, 1, 1)
    wv = np.ones((1, G, D, 1)) if w is None else f64(w).reshape(1, G, D, 1)
    bv = np.zeros((1, G, D, 1)) if b is None else f64(b).reshape(1, G, D, 1)
    s = (np.abs((g - m) * r * wv) + np.abs(bv)).max(axis=(2, 3), keepdims=True, initial=0.0)
    s = s + np.abs(wv).max(axis=2, keepdims=True) * np.abs(m) * r
    return ref._ungroup(np.broadcast_to(s, g.shape), np.shape(x), axis % np.ndim(x))


def gx_scale(dy, x, G, mean, rstd, w, axis):
    """Per-group size of the terms of grad_x = rstd (g - mean(g) - xhat
    mean(g xhat)), widened by (1 + |mean| rstd)."""
    g, _ = ref._groups(x, G, axis)
    d, _ = ref._groups(dy, G, axis)
    N, _, D, HW = g.shape
    m = f64(mean).reshape(N, G, 1, 1)
    r = f64(rstd).reshape(N, G, 1, 1)
    wv = np.ones((1, G, D, 1)) if w is None else f64(w).reshape(1, G, D, 1)
    gg = d * wv
    xhat = (g - m) * r
    t = (np.abs(gg).max(axis=(2, 3), keepdims=True, initial=0.0)
         + np.abs(xhat).max(axis=(2, 3), keepdims=True, initial=0.0)
         * np.abs((gg * xhat).sum(axis=(2, 3), keepdims=True)) / max(D * HW, 1))
    s = r * t * (1 + np.abs(m) * r)
    return ref._ungroup(np.broadcast_to(s, g.shape), np.shape(x), axis % np.ndim(x))


def check_forward(x, G, w, b, axis, eps=1e-5, what=""):
    before = [None if a is None else a.copy() for a in (x, w, b)]
    y, mean, rstd = cynorm.group_norm(x, G, w, b, eps, axis)
    for a, a0 in zip((x, w, b), before):
        if a is not None:
            np.testing.assert_array_equal(bits(a), bits(a0))
    y_ref, m_ref, r_ref = ref.group_norm(x, G, w, b, eps, axis)
    N = x.shape[0]
    assert y.shape == x.shape and y.dtype == x.dtype, what
    assert mean.shape == (N, G) and mean.dtype == stat_dtype(x.dtype), what
    assert rstd.shape == (N, G) and rstd.dtype == stat_dtype(x.dtype), what
    m_scale = np.abs(m_ref) + 1 / r_ref
    assert_close(mean, m_ref, stat_dtype(x.dtype), scale=m_scale, rtol=stat_rtol(x.dtype),
                 what=f"mean {what}")
    assert_close(rstd, r_ref, stat_dtype(x.dtype), rtol=stat_rtol(x.dtype), what=f"rstd {what}")
    assert_close(y, y_ref, x.dtype, scale=y_scale(x, G, m_ref, r_ref, w, b, axis),
                 what=f"y {what}")
    return y, mean, rstd


def check_backward(dy, x, mean, rstd, w, G, axis, what=""):
    inputs = [a for a in (dy, x, mean, rstd, w) if a is not None]
    before = [a.copy() for a in inputs]
    gx, gw, gb = cynorm.group_norm_backward(dy, x, mean, rstd, w, G, axis=axis)
    for a, a0 in zip(inputs, before):
        np.testing.assert_array_equal(bits(a), bits(a0))
    gx_ref, gw_ref, gb_ref = ref.group_norm_backward(dy, x, mean, rstd, w, G, axis)
    pdt = x.dtype if w is None else w.dtype
    assert gx.shape == x.shape and gx.dtype == x.dtype, what
    assert gw.shape == (x.shape[axis],) and gw.dtype == pdt, what
    assert gb.shape == (x.shape[axis],) and gb.dtype == pdt, what
    assert_close(gx, gx_ref, x.dtype, scale=gx_scale(dy, x, G, mean, rstd, w, axis),
                 what=f"grad_x {what}")
    g, _ = ref._groups(x, G, axis)
    d, _ = ref._groups(dy, G, axis)
    N, _, D, _ = g.shape
    xhat = (g - f64(mean).reshape(N, G, 1, 1)) * f64(rstd).reshape(N, G, 1, 1)
    gw_s = np.abs(d * xhat).sum(axis=(0, 3)).reshape(-1)
    gb_s = np.abs(d).sum(axis=(0, 3)).reshape(-1)
    assert_close(gw, gw_ref, pdt, scale=gw_s, rtol=2 * RTOL[np.dtype(pdt)],
                 what=f"grad_weight {what}")
    assert_close(gb, gb_ref, pdt, scale=gb_s, rtol=2 * RTOL[np.dtype(pdt)],
                 what=f"grad_bias {what}")
    return gx, gw, gb


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,G", [pytest.param(s, g, marks=pytest.mark.slow) if (s, g) in SLOW
                                     else (s, g) for s, g in CASES], ids=CASE_IDS)
def test_forward_and_backward_match_reference(shape, G, dtype, rng):
    C = shape[1]
    for ki, (axis, kind) in enumerate(itertools.product((1, -1), ("C", "other", "strided"))):
        for wdt in some([None] + param_dtypes(dtype), shape, ki):
            x = to_layout(make_input(rng, shape, dtype), axis, kind)
            dy = to_layout(make_input(rng, shape, dtype, 1.0, 0.0), axis, kind)
            w, b = (None, None) if wdt is None else make_affine(rng, C, wdt)
            what = f"axis={axis} {kind} w={wdt}"
            _, mean, rstd = check_forward(x, G, w, b, axis, what=what)
            check_backward(dy, x, mean, rstd, w, G, axis, what=what)


@pytest.mark.parametrize("shape,G,axis", [((4, 32, 8, 8), 8, 1), ((6, 64, 7, 7), 64, 1),
                                          ((3, 8, 50), 2, 1), ((4, 8, 8, 32), 8, -1),
                                          ((2, 4, 200, 40), 2, 1), ((2, 60, 50, 24), 3, -1),
                                          ((3, 7, 7, 64), 64, -1)])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bits_do_not_depend_on_thread_count(shape, G, axis, dtype, rng, team_always,
                                            restore_threads):
    C = shape[axis]
    x = make_input(rng, shape, dtype, 3.0, 10.0)
    dy = make_input(rng, shape, dtype, 1.0, 0.0)
    w, b = make_affine(rng, C, param_dtypes(dtype)[-1])
    got = []
    for n in (1, 2, 3):
        cynorm.set_num_threads(n)
        y, m, r = cynorm.group_norm(x, G, w, b, axis=axis)
        got.append((y, m, r) + cynorm.group_norm_backward(dy, x, m, r, w, G, axis=axis))
    for other in got[1:]:
        for a, c in zip(got[0], other):
            np.testing.assert_array_equal(bits(a), bits(c))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_either_entry_to_one_memory_layout_gives_the_same_bits(dtype, rng):
    # channels-last memory read as axis=-1 or, as a torch channels_last
    # tensor's view, as axis=1: the same kernel, the same bits, and y in
    # the same memory layout as x
    x = make_input(rng, (3, 16, 5, 6), dtype)
    dy = make_input(rng, x.shape, dtype)
    w, b = make_affine(rng, 16, dtype)
    xl = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    dyl = np.ascontiguousarray(np.moveaxis(dy, 1, -1))
    y1, m1, r1 = cynorm.group_norm(xl, 4, w, b, axis=-1)
    y2, m2, r2 = cynorm.group_norm(np.moveaxis(xl, -1, 1), 4, w, b)
    assert y1.flags.c_contiguous and np.moveaxis(y2, 1, -1).flags.c_contiguous
    np.testing.assert_array_equal(bits(y1), bits(np.moveaxis(y2, 1, -1)))
    np.testing.assert_array_equal(bits(m1), bits(m2))
    g1 = cynorm.group_norm_backward(dyl, xl, m1, r1, w, 4, axis=-1)
    g2 = cynorm.group_norm_backward(np.moveaxis(dyl, -1, 1), np.moveaxis(xl, -1, 1), m1, r1, w, 4)
    np.testing.assert_array_equal(bits(g1[0]), bits(np.moveaxis(g2[0], 1, -1)))
    for a, c in zip(g1[1:], g2[1:]):
        np.testing.assert_array_equal(bits(a), bits(c))


# (channels-first shape, num_groups): each pairs one of the kernels' shapes
# channels first (groups, instances) with one channels last (samples,
# instances); 80000 positions run past the row chunk; 7x7 and HW = 1 are
# short rows; 40 and 36 channels of 100 and 49 positions: channels last,
# whole steps of columns with their lanes in registers and the columns
# past them in the lane arrays (float32, cn_lane_sums.h), a four-term
# block, a two-term block and a tail; 2304 channels of 64 positions in one
# group (576 KiB in float32): the instances shape with short rows, their
# sums by row pairs channels first
LAYOUT_CASES = [((4, 24, 9, 10), 6), ((3, 8, 1), 8), ((6, 64, 7, 7), 64), ((2, 12, 5, 4, 3), 4),
                ((2, 64, 48, 48), 2), ((2, 4, 200, 400), 1), ((3, 40, 10, 10), 5),
                ((2, 36, 7, 7), 6), ((1, 2304, 8, 8), 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,G", LAYOUT_CASES, ids=[f"{s}-G{g}" for s, g in LAYOUT_CASES])
@pytest.mark.parametrize("scale", [1.0, 1e30], ids=["data", "1e30"])
def test_channels_last_and_first_give_the_same_bits(shape, G, scale, dtype, rng, team_always,
                                                     restore_threads):
    # the statistics are summed in one order in either layout: y, mean,
    # rstd and every gradient are the same bits channels first and last,
    # at any thread count; 1e30 data take the float64 squares and (with
    # dy of 1e30) the float64 gradient sums
    if scale > 1 and np.dtype(dtype).itemsize == 2:
        pytest.skip("beyond the dtype's range")
    C = shape[1]
    x = make_input(rng, shape, dtype, 3.0 * scale, 10.0 * scale)
    dy = make_input(rng, shape, dtype, scale, 0.0)
    w, b = make_affine(rng, C, param_dtypes(dtype)[-1])
    last = lambda a: np.ascontiguousarray(np.moveaxis(a, 1, -1))
    got = []
    for n in (1, 2):
        cynorm.set_num_threads(n)
        y, m, r = cynorm.group_norm(x, G, w, b)
        g = cynorm.group_norm_backward(dy, x, m, r, w, G)
        got.append((y, m, r) + g)
        y, m, r = cynorm.group_norm(last(x), G, w, b, axis=-1)
        g = cynorm.group_norm_backward(last(dy), last(x), m, r, w, G, axis=-1)
        got.append((channels_first(y, -1), m, r, channels_first(g[0], -1)) + g[1:])
    for other in got[1:]:
        for a, c in zip(got[0], other):
            np.testing.assert_array_equal(bits(np.ascontiguousarray(a)),
                                          bits(np.ascontiguousarray(c)))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_instance_norm_layouts_give_the_same_bits(dtype, rng):
    # instance norm, its running statistics and its backward, both layouts
    x = make_input(rng, (3, 16, 6, 7), dtype, 2.0, 5.0)
    dy = make_input(rng, x.shape, dtype)
    w, b = make_affine(rng, 16, param_dtypes(dtype)[-1])
    last = lambda a: np.ascontiguousarray(np.moveaxis(a, 1, -1))
    got = []
    for xx, dd, axis in ((x, dy, 1), (last(x), last(dy), -1)):
        rm, rv = np.zeros(16, w.dtype), np.ones(16, w.dtype)
        y, m, r = cynorm.instance_norm(xx, w, b, rm, rv, axis=axis)
        g = cynorm.instance_norm_backward(dd, xx, m, r, w, axis=axis)
        got.append((channels_first(y, axis), m, r, rm, rv, channels_first(g[0], axis)) + g[1:])
    for a, c in zip(*got):
        np.testing.assert_array_equal(bits(np.ascontiguousarray(a)), bits(np.ascontiguousarray(c)))


def test_finite_differences(rng):
    shape, G = (2, 6, 3, 5), 3
    x = rng.standard_normal(shape) * 2 + 1
    w, b = make_affine(rng, 6, F64)
    dy = rng.standard_normal(shape)
    h = 1e-6
    for axis in (1, -1):
        xa = np.ascontiguousarray(np.moveaxis(x, 1, -1)) if axis == -1 else x
        da = np.ascontiguousarray(np.moveaxis(dy, 1, -1)) if axis == -1 else dy
        _, m, r = cynorm.group_norm(xa, G, w, b, axis=axis)
        grads = cynorm.group_norm_backward(da, xa, m, r, w, G, axis=axis)
        args = [xa, w, b]
        for k, grad in enumerate(grads):
            num = np.empty(args[k].shape)
            for i in np.ndindex(args[k].shape):
                ends = []
                for step in (h, -h):
                    moved = [a.copy() for a in args]
                    moved[k][i] += step
                    ends.append(np.sum(cynorm.group_norm(moved[0], G, moved[1], moved[2],
                                                         axis=axis)[0] * da))
                num[i] = (ends[0] - ends[1]) / (2 * h)
            np.testing.assert_allclose(grad, num, rtol=1e-6, atol=1e-7,
                                       err_msg=f"argument {k}, axis {axis}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_output_mask(dtype, rng):
    x, dy = make_input(rng, (3, 8, 4, 5), dtype), make_input(rng, (3, 8, 4, 5), dtype)
    w, b = make_affine(rng, 8, param_dtypes(dtype)[-1])
    _, m, r = cynorm.group_norm(x, 2, w, b)
    full = cynorm.group_norm_backward(dy, x, m, r, w, 2)
    for mask in itertools.product((True, False), repeat=3):
        got = cynorm.group_norm_backward(dy, x, m, r, w, 2, output_mask=mask)
        for on, g, f in zip(mask, got, full):
            if on:
                np.testing.assert_array_equal(bits(g), bits(f))
            else:
                assert g is None
    got = cynorm.group_norm_backward(dy, x, m.reshape(-1), r.reshape(-1), w, 2)
    for g, f in zip(got, full):
        np.testing.assert_array_equal(bits(g), bits(f))
    # no weight: the gradients of an implicit weight of ones and bias of zeros
    _, m0, r0 = cynorm.group_norm(x, 2)
    gx0, gw0, gb0 = cynorm.group_norm_backward(dy, x, m0, r0, None, 2)
    assert gw0.dtype == dtype and gb0.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_out_argument(dtype, rng):
    shape = (4, 12, 3, 5)
    x = make_input(rng, shape, dtype)
    w, b = make_affine(rng, 12, dtype)
    want = cynorm.group_norm(x, 3, w, b)
    sd = stat_dtype(dtype)
    for keep in itertools.product((True, False), repeat=3):
        outs = tuple(np.full(s, 7, d) if k else None
                     for k, s, d in zip(keep, (shape, (4, 3), (4, 3)), (dtype, sd, sd)))
        got = cynorm.group_norm(x, 3, w, b, out=outs)
        for g, o, ww in zip(got, outs, want):
            if o is not None:
                assert g is o
            np.testing.assert_array_equal(bits(g), bits(ww))
    # an out= in another memory layout than x's is filled from the kernels' result
    yf = np.full(shape, 7, dtype, order="F")
    assert cynorm.group_norm(x, 3, w, b, out=(yf, None, None))[0] is yf
    np.testing.assert_array_equal(bits(yf), bits(want[0]))
    # in place over x, in either layout
    xc = x.copy()
    assert cynorm.group_norm(xc, 3, w, b, out=(xc, None, None))[0] is xc
    np.testing.assert_array_equal(bits(xc), bits(want[0]))
    xl = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    yl = cynorm.group_norm(xl, 3, w, b, axis=-1)[0]
    cynorm.group_norm(xl, 3, w, b, axis=-1, out=(xl, None, None))
    np.testing.assert_array_equal(bits(xl), bits(yl))
    with pytest.raises(TypeError, match=r"out must be None or a tuple of 3"):
        cynorm.group_norm(x, 3, w, b, out=(yf,))
    with pytest.raises(ValueError, match=r"out\[1\] \(mean\) must have shape \(4, 3\)"):
        cynorm.group_norm(x, 3, w, b, out=(None, np.empty(12, sd), None))
    with pytest.raises(ValueError, match=r"share memory"):
        m = np.empty((4, 3), sd)
        cynorm.group_norm(x, 3, w, b, out=(None, m, m))
    # a bad parameter beside out=: an error, not a read of its memory
    with pytest.raises(TypeError, match="bias must be a NumPy array"):
        cynorm.group_norm(x, 3, w, "abc", out=(np.empty_like(x), None, None))


def test_bad_arguments_name_the_argument(rng):
    x = rng.standard_normal((2, 6, 4))
    with pytest.raises(ValueError, match=r"channel count 6 must be divisible by num_groups \(4\)"):
        cynorm.group_norm(x, 4)
    with pytest.raises(ValueError, match="num_groups must be >= 1"):
        cynorm.group_norm(x, 0)
    with pytest.raises(TypeError, match="num_groups"):
        cynorm.group_norm(x, 2.0)
    with pytest.raises(ValueError, match=r"axis must be 1 \(channels first\) or -1"):
        cynorm.group_norm(np.ones((2, 3, 4, 5)), 1, axis=2)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        cynorm.group_norm(np.ones(4), 1)
    with pytest.raises(ValueError, match=r"weight must have shape \(6,\)"):
        cynorm.group_norm(x, 2, np.ones(4))
    with pytest.raises(TypeError, match="weight"):
        cynorm.group_norm(x, 2, np.ones(6, np.float32))
    with pytest.raises(ValueError, match="eps must be >= 0"):
        cynorm.group_norm(x, 2, eps=-1.0)
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        cynorm.group_norm(x.astype(np.int32), 2)
    _, m, r = cynorm.group_norm(x, 2)
    with pytest.raises(ValueError, match=r"mean must have shape \(2, 2\) \(as group_norm returns it\)"):
        cynorm.group_norm_backward(x, x, m[:1], r, None, 2)
    with pytest.raises(ValueError, match="mean is required"):
        cynorm.group_norm_backward(x, x, None, r, None, 2)
    with pytest.raises(ValueError, match="output_mask must have 3 entries"):
        cynorm.group_norm_backward(x, x, m, r, None, 2, output_mask=(True, True))
    with pytest.raises(TypeError, match="grad_out must have the dtype of x"):
        cynorm.group_norm_backward(x.astype(np.float32), x, m, r, None, 2)
    with pytest.raises(ValueError, match="grad_out must have the shape of x"):
        cynorm.group_norm_backward(x[:1], x, m, r, None, 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,axis", [((0, 6, 4), 1), ((2, 6, 0), 1), ((0, 4, 6), -1),
                                        ((2, 0, 6), -1), ((2, 0, 3), 1)])
def test_zero_sizes(shape, axis, dtype):
    x = np.ones(shape, dtype)
    C = shape[axis]
    G = 2 if C else 1
    y, m, r = cynorm.group_norm(x, G, axis=axis)
    assert y.shape == shape and m.shape == (shape[0], G) and r.shape == (shape[0], G)
    if m.size and 0 in shape[2:] + shape[1:-1]:
        # no value per group: mean 0 and rstd NaN, as torch
        assert (m == 0).all() and np.isnan(r).all()
    gx, gw, gb = cynorm.group_norm_backward(x, x, m, r, None, G, axis=axis)
    assert gx.shape == shape and gw.shape == (C,) and gb.shape == (C,)
    assert (gw == 0).all() and (gb == 0).all()


@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=str)
@pytest.mark.parametrize("scale", [1e-30, 1e30, 1e-150, 1e150])
@pytest.mark.parametrize("shape,axis", [((2, 8, 6, 7), 1), ((2, 6, 7, 8), -1),
                                        ((2, 4, 200, 400), 1)])
def test_extreme_magnitudes(scale, dtype, shape, axis, rng):
    # y and grad_x keep their precision where the data sit far from 1, as
    # far as the dtype holds them (float32 statistics, float64 sums)
    if np.dtype(dtype) != F64 and not 1e-37 < scale < 1e37:
        pytest.skip("beyond the dtype's range")
    G = 2
    C = shape[axis]
    x = (rng.standard_normal(shape) * scale + 3 * scale).astype(dtype)
    dy = (rng.standard_normal(shape) / scale).astype(dtype) if np.dtype(dtype) == F64 else \
        rng.standard_normal(shape).astype(dtype)
    w, b = make_affine(rng, C, dtype)
    y, m, r = check_forward(x, G, w, b, axis, what=f"scale {scale}")
    assert np.isfinite(np.asarray(y, np.float64)).all()
    gx = check_backward(dy, x, m, r, w, G, axis, what=f"scale {scale}")[0]
    assert np.isfinite(np.asarray(gx, np.float64)).all()


@pytest.mark.parametrize("shape", [(2, 8, 8, 8), (2, 12, 5, 5), (2, 8, 30, 30)])
@pytest.mark.parametrize("axis", [1, -1])
def test_one_channels_gradient_below_float32s_normal_range(shape, axis, rng):
    # float32 gradient terms of one channel under float32's normal range
    # (subnormal products lose bits): that channel's sums are taken again in
    # float64, its neighbours' in the same group and call are not
    G = 2
    C = shape[1]
    x = rng.standard_normal(shape).astype(F32)
    dy = rng.standard_normal(shape)
    dy[:, 1] *= 1e-41                           # the group's second channel
    dy = dy.astype(F32)
    if axis == -1:
        x, dy = (np.ascontiguousarray(np.moveaxis(a, 1, -1)) for a in (x, dy))
    w, b = make_affine(rng, C, F32)
    _, m, r = check_forward(x, G, w, b, axis)
    check_backward(dy, x, m, r, w, G, axis, what="a subnormal channel")


@pytest.mark.parametrize("dtype", [F64, F32, BF16], ids=str)
@pytest.mark.parametrize("shape", [(2, 8, 8, 8), (2, 6, 30, 30)])
@pytest.mark.parametrize("axis", [1, -1])
def test_channels_far_apart_within_a_group(dtype, shape, axis, rng):
    # a group's sums are shifted by its first value: channels whose means sit
    # far from it and from each other, and a first value far out in its
    # channel, keep the statistics' and y's precision
    G = 2
    C = shape[1]
    x = rng.standard_normal(shape) + 1e4 * (1 + np.arange(C) % 3).reshape(C, 1, 1)
    x[:, ::C // G, 0, 0] += 40.0                # each group's first value
    if axis == -1:
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    w, b = make_affine(rng, C, dtype)
    check_forward(x.astype(dtype), G, w, b, axis, what=f"axis {axis}")


@pytest.mark.parametrize("shape,axis", [((3, 8, 5, 6), 1), ((3, 5, 6, 8), -1),
                                        ((2, 8, 300, 300), 1), ((2, 300, 300, 8), -1)])
def test_a_nan_stays_in_its_group(shape, axis, rng):
    x = rng.standard_normal(shape).astype(F32)
    idx = (1, 5, 2, 3) if axis == 1 else (1, 2, 3, 5)     # sample 1, channel 5: group 2
    x[idx] = np.nan
    y, m, r = cynorm.group_norm(x, 4, axis=axis)
    nan = np.isnan(channels_first(y, axis))
    assert nan[1, 4:6].all() and nan.sum() == nan[1, 4:6].size
    assert np.isnan(m[1, 2]) and np.isnan(m).sum() == 1


# ---------------------------------------------------------------- instance norm

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(3, 4, 5, 6), (2, 6, 9), (2, 3, 4, 5, 6), (4, 64, 7, 7)])
@pytest.mark.parametrize("axis", [1, -1])
def test_instance_norm_matches_reference(shape, axis, dtype, rng):
    C = shape[1]
    pdt = param_dtypes(dtype)[-1]
    x = to_layout(make_input(rng, shape, dtype, 2.0, 3.0), axis, "C")
    dy = to_layout(make_input(rng, shape, dtype, 1.0, 0.0), axis, "C")
    w, b = make_affine(rng, C, pdt)
    rm0 = rng.standard_normal(C).astype(pdt)
    rv0 = (rng.random(C) + 0.5).astype(pdt)
    for use_input_stats in (True, False):
        rm, rv = rm0.copy(), rv0.copy()
        y, m, r = cynorm.instance_norm(x, w, b, rm, rv, use_input_stats, 0.3, 1e-5, axis)
        y_ref, m_ref, r_ref, rm_ref, rv_ref = ref.instance_norm(x, w, b, rm0, rv0,
                                                                use_input_stats, 0.3, 1e-5, axis)
        assert y.dtype == x.dtype and m.shape == (shape[0], C) and r.shape == (shape[0], C)
        assert_close(m, m_ref, stat_dtype(dtype), scale=np.abs(m_ref) + 1, rtol=stat_rtol(dtype))
        assert_close(r, r_ref, stat_dtype(dtype), rtol=stat_rtol(dtype))
        assert_close(y, y_ref, dtype, scale=y_scale(x, C, m_ref, r_ref, w, b, axis))
        assert_close(rm, rm_ref, pdt, scale=np.abs(rm_ref) + 1)
        assert_close(rv, rv_ref, pdt)
        gx, gw, gb = cynorm.instance_norm_backward(dy, x, m, r, w, use_input_stats, axis=axis)
        gx_ref, gw_ref, gb_ref = ref.instance_norm_backward(dy, x, m, r, w, use_input_stats,
                                                            axis)
        assert_close(gx, gx_ref, dtype, scale=gx_scale(dy, x, C, m, r, w, axis)
                     if use_input_stats else np.abs(gx_ref) + 1e-3)
        s = np.abs(np.asarray(dy, np.float64)).sum() * float(np.max(np.abs(f64(r)))) * 10
        assert_close(gw, gw_ref, pdt, scale=s, rtol=2 * RTOL[np.dtype(pdt)])
        assert_close(gb, gb_ref, pdt, scale=s, rtol=2 * RTOL[np.dtype(pdt)])


def test_instance_norm_arguments(rng):
    x = rng.standard_normal((2, 3, 4))
    with pytest.raises(ValueError, match="running_mean and running_var are required"):
        cynorm.instance_norm(x, use_input_stats=False)
    with pytest.raises(ValueError, match="x must have more than 1 spatial position"):
        cynorm.instance_norm(np.ones((2, 3, 1)), running_mean=np.zeros(3), running_var=np.ones(3))
    cynorm.instance_norm(np.ones((2, 3, 1)))        # without running stats: fine
    rm = np.zeros(3)
    rm.flags.writeable = False
    with pytest.raises(ValueError, match="running_mean is read-only"):
        cynorm.instance_norm(x, running_mean=rm)
    with pytest.raises(TypeError, match="use_input_stats must be a bool"):
        cynorm.instance_norm(x, use_input_stats=1)
    with pytest.raises(ValueError, match="momentum must be finite"):
        cynorm.instance_norm(x, momentum=np.inf)
    with pytest.raises(ValueError, match=r"running_var must have shape \(3,\)"):
        cynorm.instance_norm(x, running_var=np.ones(4))
    rv = np.ones(3)
    with pytest.raises(ValueError, match="share memory"):
        cynorm.instance_norm(x, running_mean=rv, running_var=rv)


# ---------------------------------------------------------------- torch

@requires_torch
@pytest.mark.parametrize("dtype", [F64, F32, BF16, F16], ids=str)
@pytest.mark.parametrize("shape,G", [((4, 32, 8, 8), 8), ((2, 12, 5, 4, 3), 4), ((6, 64, 7, 7), 64),
                                     ((3, 8, 50), 2)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_torch_native_group_norm(shape, G, dtype, channels_last, rng):
    import torch
    if channels_last and len(shape) < 4:
        pytest.skip("torch's channels_last needs 4 or 5 dimensions")
    tdt = {F64: torch.float64, F32: torch.float32, BF16: torch.bfloat16, F16: torch.float16}[
        np.dtype(dtype)]
    N, C = shape[:2]
    HW = int(np.prod(shape[2:]))
    x = make_input(rng, shape, F32, 2.0, 1.0)
    dy = make_input(rng, shape, F32, 1.0, 0.0)
    w, b = make_affine(rng, C, F32)
    pt = torch.float32 if tdt in (torch.bfloat16, torch.float16) else tdt
    xt = torch.from_numpy(x).to(tdt)
    dyt = torch.from_numpy(dy).to(tdt)
    if channels_last:
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        xt, dyt = xt.contiguous(memory_format=fmt), dyt.contiguous(memory_format=fmt)
    wt, bt = torch.from_numpy(w).to(pt), torch.from_numpy(b).to(pt)
    yt, mt, rt = torch.native_group_norm(xt, wt, bt, N, C, HW, G, 1e-5)
    gt = torch.ops.aten.native_group_norm_backward(dyt, xt, mt, rt, wt, N, C, HW, G, [True] * 3)

    def np_of(t):
        v = t.detach().float().numpy() if t.dtype in (torch.bfloat16, torch.float16) else t.numpy()
        return v.astype(dtype) if t.dtype in (torch.bfloat16, torch.float16) else v
    xc = np_of(xt)          # channels_last: NumPy sees the strides of torch's layout
    y, m, r = cynorm.group_norm(xc, G, np_of(wt), np_of(bt))
    assert y.strides == xc.strides
    _, m_ref, r_ref = ref.group_norm(xc, G, w, b)
    assert_close(y, np_of(yt), dtype, scale=2 * y_scale(xc, G, m_ref, r_ref, w, b, 1))
    assert_close(m, mt.double().numpy(), stat_dtype(dtype), scale=np.abs(m_ref) + 1 / r_ref,
                 rtol=max(stat_rtol(dtype), RTOL[np.dtype(dtype)]))
    gx, gw, gb = cynorm.group_norm_backward(np_of(dyt), xc, m, r, np_of(wt), G)
    assert_close(gx, np_of(gt[0]), dtype, scale=2 * gx_scale(np_of(dyt), xc, G, m, r, w, 1))
    s = np.abs(dy).sum(axis=tuple(i for i in range(dy.ndim) if i != 1)) * float(np.abs(r).max())
    assert_close(gw, np_of(gt[1]), gw.dtype, scale=4 * s, rtol=4 * RTOL[np.dtype(dtype)])
    assert_close(gb, np_of(gt[2]), gb.dtype, scale=4 * s, rtol=4 * RTOL[np.dtype(dtype)])


@requires_torch
@pytest.mark.parametrize("use_input_stats", [True, False])
def test_torch_instance_norm(use_input_stats, rng):
    import torch
    x = make_input(rng, (3, 4, 5, 6), F64)
    dy = make_input(rng, x.shape, F64)
    w, b = make_affine(rng, 4, F64)
    rm, rv = rng.standard_normal(4), rng.random(4) + 0.5
    rmt, rvt = torch.from_numpy(rm.copy()), torch.from_numpy(rv.copy())
    xt = torch.from_numpy(x).requires_grad_()
    wt, bt = torch.from_numpy(w).requires_grad_(), torch.from_numpy(b).requires_grad_()
    yt = torch.instance_norm(xt, wt, bt, rmt, rvt, use_input_stats, 0.2, 1e-5, False)
    yt.backward(torch.from_numpy(dy))
    rm1, rv1 = rm.copy(), rv.copy()
    y, m, r = cynorm.instance_norm(x, w, b, rm1, rv1, use_input_stats, 0.2, 1e-5)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(rm1, rmt.numpy(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(rv1, rvt.numpy(), rtol=1e-13, atol=1e-15)
    grads = cynorm.instance_norm_backward(dy, x, m, r, w, use_input_stats)
    for g, t in zip(grads, (xt, wt, bt)):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-11, atol=1e-12)
