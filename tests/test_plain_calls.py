"""The plain-case entries (cynorm/_kernels/_plain.pyx): a call whose
arguments are already what the kernels take skips the Python layer.  Each
case here is such a call: it must take the plain entry (checked), and give
the same bits as the Python layer, reached with the same data as an
ndarray subclass (which the plain entries leave to Python)."""
import ml_dtypes
import numpy as np
import pytest

import cynorm
from cynorm import layernorm

DTYPES = [np.float32, np.float64, ml_dtypes.bfloat16, np.float16]


class NotPlain(np.ndarray):
    """Same data, not an exact ndarray: the plain entries return None."""


def via_python(a):
    return a.view(NotPlain) if isinstance(a, np.ndarray) else a


def math_dtype(dtype):
    return np.float64 if dtype == np.float64 else np.float32


# (x's dtype, the parameters' form): "math", the math type's dtype; for
# 16-bit x also "own", x's dtype (a model cast to bfloat16), and "mixed",
# weight in x's dtype and the rest in float32
DTYPE_PARAMS = [(d, "math") for d in DTYPES] + [
    (d, form) for d in (ml_dtypes.bfloat16, np.float16) for form in ("own", "mixed")]


# with the parameters present or not (absent ones have no dtype to vary)
AFFINE_FORMS = [(d, form, affine) for d, form in DTYPE_PARAMS for affine in (True, False)
                if affine or form == "math"]


def param_dtype(dtype, form, first=True):
    """The dtype of a parameter of x of dtype under form (first: the weight)."""
    return dtype if form == "own" or (form == "mixed" and first) else math_dtype(dtype)


def data(shape, dtype, seed=0, mean=0.5):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 2 + mean).astype(dtype)


def same_bits(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if w is None:
            assert g is None
            continue
        assert type(g) is np.ndarray and type(w) in (np.ndarray, NotPlain)
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.flags.c_contiguous
        np.testing.assert_array_equal(g.reshape(-1).view(np.uint8),
                                      np.asarray(w).reshape(-1).view(np.uint8))


LN_SHAPES = [((2, 4), (4,)), ((3, 5, 7), (5, 7)), ((6, 300), 300), ((1, 1), (1,)),
             ((40, 2000), (2000,))]


@pytest.mark.parametrize("shape,ns", LN_SHAPES)
@pytest.mark.parametrize("dtype,form,affine", AFFINE_FORMS)
def test_layer_norm(dtype, form, shape, ns, affine, threads):
    x = data(shape, dtype, mean=1e4 if dtype == np.float32 else 0.5)
    nsh = (ns,) if isinstance(ns, int) else ns
    w = data(nsh, param_dtype(dtype, form), 1) if affine else None
    b = data(nsh, param_dtype(dtype, form, False), 2) if affine else None
    assert layernorm._k.forward_plain(x, ns, w, b, 1e-5) is not None
    got = cynorm.layer_norm(x, ns, w, b, 1e-5)
    same_bits(got, cynorm.layer_norm(via_python(x), ns, w, b, 1e-5))

    dy = data(shape, dtype, 3)
    _, mean, rstd = got
    for mask in [(True, True, True), (True, False, False), (False, True, True),
                 (False, False, True)]:
        args = (dy, x, ns, mean, rstd, w, b, mask)
        assert layernorm._k.backward_plain(*args) is not None
        same_bits(cynorm.layer_norm_backward(*args),
                  cynorm.layer_norm_backward(via_python(dy), *args[1:]))
    flat = (mean.reshape(-1), rstd.reshape(-1))       # saved statistics as (M,)
    same_bits(cynorm.layer_norm_backward(dy, x, ns, *flat, w, b),
              cynorm.layer_norm_backward(via_python(dy), x, ns, *flat, w, b))


def rows_elsewhere(dy, how):
    """dy's values, each row (last axis) contiguous, the rows in another
    order than C's (or repeated): how the plain backward reads grad_out in place."""
    if how == "transposed":         # a batch_first attention's gradient
        return np.ascontiguousarray(dy.transpose(1, 0, 2)).transpose(1, 0, 2)
    if how == "flipped":            # negative strides
        return np.ascontiguousarray(dy[::-1, :, :])[::-1, :, :]
    if how == "sliced":             # every other row of a larger array
        big = np.zeros((dy.shape[0], 2 * dy.shape[1], dy.shape[2]), dy.dtype)
        big[:, ::2] = dy
        return big[:, ::2]
    return np.broadcast_to(dy[:1], dy.shape)       # "broadcast": one row block, stride 0


@pytest.mark.parametrize("how", ["transposed", "flipped", "sliced", "broadcast"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_row_norm_backward_reads_grad_out_rows_where_they_lie(dtype, how, threads):
    # the plain entries take grad_out with contiguous rows in any order, read
    # in place: the bits of its C-contiguous copy, and of the Python layer's
    from cynorm import rmsnorm
    shape, ns = (5, 67, 48), (48,)
    x = data(shape, dtype)
    dy = rows_elsewhere(data(shape, dtype, 3), how)
    assert not dy.flags.c_contiguous
    w, b = data(48, math_dtype(dtype), 1), data(48, math_dtype(dtype), 2)
    _, mean, rstd = cynorm.layer_norm(x, ns, w, b, 1e-5)
    args = (dy, x, ns, mean, rstd, w, b, (True, True, True))
    got = layernorm._k.backward_plain(*args)
    assert got is not None
    same_bits(got, cynorm.layer_norm_backward(np.ascontiguousarray(dy), *args[1:]))
    same_bits(got, cynorm.layer_norm_backward(via_python(dy), *args[1:]))
    _, r = cynorm.rms_norm(x, ns, w)
    got = rmsnorm._k.row_grads_plain(dy, None, x, ns, None, r, w, None, (True, True), False)
    assert got is not None
    same_bits(got, cynorm.rms_norm_backward(np.ascontiguousarray(dy), x, ns, r, w))
    h, hres = x, data(shape, dtype, 5)
    _, _, m2, r2 = cynorm.add_layer_norm(h, hres, ns, w, b)
    got = rmsnorm._k.row_grads_plain(dy, hres, h, ns, m2, r2, w, b, (True, True, True), True)
    assert got is not None
    same_bits(got, cynorm.add_layer_norm_backward(np.ascontiguousarray(dy), hres, h, ns, m2, r2,
                                                  w, b))


@pytest.mark.parametrize("call", [
    lambda x, w: layernorm._k.forward_plain(x, (4,), w, w, 1),         # eps an int
    lambda x, w: layernorm._k.forward_plain(x, (4,), w, w, float("nan")),
    lambda x, w: layernorm._k.forward_plain(x, (True,), w, w, 1e-5),   # a bool in the shape
    lambda x, w: layernorm._k.forward_plain(x, (3,), w, w, 1e-5),      # not x's trailing axes
    lambda x, w: layernorm._k.forward_plain(x[:, ::2], (2,), None, None, 1e-5),
    lambda x, w: layernorm._k.forward_plain(x.astype(">f4"), (4,), w, w, 1e-5),
    lambda x, w: layernorm._k.forward_plain(x, (4,), w.astype(np.float64), w, 1e-5),
    lambda x, w: layernorm._k.forward_plain(x[:0], (4,), w, w, 1e-5),  # no rows
    lambda x, w: layernorm._k.forward_plain(x.tolist(), (4,), w, w, 1e-5),
    lambda x, w: layernorm._k.backward_plain(x, x, (4,), x[:1, :1], x[:, :1], w, w, None),
    lambda x, w: layernorm._k.backward_plain(x, x, (4,), x[:, :1], x[:, :1], w, w, [True] * 2),
    lambda x, w: layernorm._k.backward_plain(x, x, (4,), x[:, :1], x[:, :1], w, w,
                                             [True, 1, True]),          # an int in the mask
    lambda x, w: layernorm._k.backward_plain(x, x, (4,), x[:, :1], x[:, :1], w, w,
                                             np.ones(3, bool)),         # an array mask
    lambda x, w: layernorm._k.forward_plain(x, [4.0], w, w, 1e-5),     # a float in the shape
    lambda x, w: layernorm._k.forward_plain(x, (4,), w, w, np.float32(1e-5)),   # not a float
    # grad_out's rows not contiguous (the in-place reading takes contiguous rows)
    lambda x, w: layernorm._k.backward_plain(np.repeat(x, 2, 1)[:, ::2], x, (4,), x[:, :1],
                                             x[:, :1], w, w, (True,) * 3),
    lambda x, w: layernorm._k.backward_plain(np.asfortranarray(x), x, (4,), x[:, :1], x[:, :1],
                                             w, w, (True,) * 3),
])
def test_layer_norm_leaves_the_rest_to_python(call):
    x = data((2, 4), np.float32)
    w = data(4, np.float32, 1)
    assert call(x, w) is None


@pytest.mark.parametrize("shape,ns", LN_SHAPES[:3])
@pytest.mark.parametrize("dtype,form", DTYPE_PARAMS)
@pytest.mark.parametrize("given", ["weight", "bias"])
def test_layer_norm_with_one_parameter(dtype, form, shape, ns, given, threads):
    """A weight without a bias (torch's LayerNorm(bias=False)), or a bias
    without a weight: the plain entries give the missing one as ones or
    zeros, as the Python layer does."""
    from cynorm import rmsnorm
    x = data(shape, dtype, mean=1e4 if dtype == np.float32 else 0.5)
    r = data(shape, dtype, 4)
    nsh = (ns,) if isinstance(ns, int) else ns
    p = data(nsh, param_dtype(dtype, form, given == "weight"), 1)
    w, b = (p, None) if given == "weight" else (None, p)
    assert layernorm._k.forward_plain(x, ns, w, b, 1e-5) is not None
    same_bits(cynorm.layer_norm(x, ns, w, b, 1e-5),
              cynorm.layer_norm(via_python(x), ns, w, b, 1e-5))
    assert rmsnorm._k.rows_plain(x, r, ns, w, b, 1e-5, None, True) is not None
    same_bits(cynorm.add_layer_norm(x, r, ns, w, b, 1e-5),
              cynorm.add_layer_norm(via_python(x), r, ns, w, b, 1e-5))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_torch_style_arguments_take_the_plain_entries(dtype):
    """Lists where torch's signatures take them (output masks, the
    normalized shape) and NumPy float64 scalars as eps run the plain
    entries, with the bits of the tuple forms."""
    from cynorm import groupnorm, rmsnorm
    x, dy, r = data((6, 8), dtype), data((6, 8), dtype, 3), data((6, 8), dtype, 4)
    w, b = data(8, np.float32, 1), data(8, np.float32, 2)
    assert layernorm._k.forward_plain(x, [8], w, b, np.float64(1e-5)) is not None
    y, mean, rstd = cynorm.layer_norm(x, (8,), w, b, 1e-5)
    same_bits(cynorm.layer_norm(x, [8], w, b, np.float64(1e-5)), (y, mean, rstd))
    for mask in ([True, True, True], [True, False, True], [False, False, False]):
        args = (dy, x, [8], mean, rstd, w, b, mask)
        assert layernorm._k.backward_plain(*args) is not None
        same_bits(cynorm.layer_norm_backward(*args),
                  cynorm.layer_norm_backward(dy, x, (8,), mean, rstd, w, b, tuple(mask)))
    _, rr = cynorm.rms_norm(x, [8], w)
    assert rmsnorm._k.row_grads_plain(dy, None, x, [8], None, rr, w, None, [True, False],
                                      False) is not None
    same_bits(cynorm.rms_norm_backward(dy, x, [8], rr, w, [True, False]),
              cynorm.rms_norm_backward(dy, x, (8,), rr, w, (True, False)))
    _, h, m2, r2 = cynorm.add_layer_norm(x, r, [8], w, b)
    same_bits(cynorm.add_layer_norm_backward(dy, dy, h, [8], m2, r2, w, b, [True, True, False]),
              cynorm.add_layer_norm_backward(dy, dy, h, (8,), m2, r2, w, b,
                                             (True, True, False)))
    xg, dyg = data((2, 4, 3, 3), dtype), data((2, 4, 3, 3), dtype, 3)
    wg = data(4, np.float32, 1)
    _, gm, gr = cynorm.group_norm(xg, 2, wg)
    assert groupnorm._k.group_backward_plain(dyg, xg, gm, gr, wg, 2, [True] * 3, 1) is not None
    same_bits(cynorm.group_norm_backward(dyg, xg, gm, gr, wg, 2, [True, False, True]),
              cynorm.group_norm_backward(dyg, xg, gm, gr, wg, 2, (True, False, True)))
    _, im, ir = cynorm.instance_norm(xg, wg)
    assert groupnorm._k.instance_backward_plain(dyg, xg, im, ir, wg, True, [True] * 3,
                                                1) is not None
    _, sm, si = cynorm.batch_norm(xg, wg)
    args = (dyg, xg, wg, None, None, sm, si, True, 1e-5)
    assert __import__("cynorm._channels")._channels.plain_batch_norm_backward(
        *args, [True] * 3, 1) is not None
    same_bits(cynorm.batch_norm_backward(*args, [False, True, True]),
              cynorm.batch_norm_backward(*args, (False, True, True)))


@pytest.mark.parametrize("shape,ns", LN_SHAPES)
@pytest.mark.parametrize("dtype,form,affine", AFFINE_FORMS)
@pytest.mark.parametrize("eps", [None, 1e-6])
def test_rms_norm(dtype, form, shape, ns, affine, eps, threads):
    from cynorm import rmsnorm
    x = data(shape, dtype, mean=0.5)
    nsh = (ns,) if isinstance(ns, int) else ns
    w = data(nsh, param_dtype(dtype, form), 1) if affine else None
    assert rmsnorm._k.rows_plain(x, None, ns, w, None, eps, None, False) is not None
    got = cynorm.rms_norm(x, ns, w, eps)
    same_bits(got, cynorm.rms_norm(via_python(x), ns, w, eps))
    dy = data(shape, dtype, 3)
    _, rstd = got
    for mask in [(True, True), (True, False), (False, True)]:
        for r in (rstd, rstd.reshape(-1)):          # saved rstd as returned or (M,)
            args = (dy, x, ns, r, w, mask)
            assert rmsnorm._k.row_grads_plain(dy, None, x, ns, None, r, w, None, mask,
                                              False) is not None
            same_bits(cynorm.rms_norm_backward(*args),
                      cynorm.rms_norm_backward(via_python(dy), *args[1:]))


@pytest.mark.parametrize("shape,ns", LN_SHAPES)
@pytest.mark.parametrize("dtype,form,affine", AFFINE_FORMS)
@pytest.mark.parametrize("centered", [True, False])
def test_add_norms(dtype, form, shape, ns, affine, centered, threads):
    from cynorm import rmsnorm
    x, res, dy, dh = (data(shape, dtype, seed) for seed in (0, 4, 3, 5))
    nsh = (ns,) if isinstance(ns, int) else ns
    p = (data(nsh, param_dtype(dtype, form), 1),) if affine else ()
    if centered and affine:
        p += (data(nsh, param_dtype(dtype, form, False), 2),)
    fwd = cynorm.add_layer_norm if centered else cynorm.add_rms_norm
    bwd = cynorm.add_layer_norm_backward if centered else cynorm.add_rms_norm_backward
    pw, pb = (p + (None, None))[:2]
    assert rmsnorm._k.rows_plain(x, res, ns, pw, pb, 1e-5, None, centered) is not None
    got = fwd(x, res, ns, *p, eps=1e-5)
    same_bits(got, fwd(via_python(x), res, ns, *p, eps=1e-5))
    _, h, *stats = got
    mean, rstd = (stats if centered else [None] + stats)
    for g in (dh, None):
        assert rmsnorm._k.row_grads_plain(dy, g, h, ns, mean, rstd, pw, pb,
                                          (True,) * (2 + centered), centered) is not None
        same_bits(bwd(dy, g, h, ns, *stats, *p), bwd(via_python(dy), g, h, ns, *stats, *p))


@pytest.mark.parametrize("call", [
    lambda x, w, k: k.rows_plain(x, None, (4,), w, None, 1, None, False),   # eps an int
    lambda x, w, k: k.rows_plain(x, None, (4,), w, None, -1.0, None, False),
    lambda x, w, k: k.rows_plain(x, None, (4,), w, None, 1e-5, (None,), False),  # out= of one
    lambda x, w, k: k.rows_plain(x.astype(">f4"), None, (4,), w, None, None, None, False),
    lambda x, w, k: k.rows_plain(x.tolist(), None, (4,), w, None, None, None, False),
    lambda x, w, k: k.rows_plain(x, x[:1], (4,), w, None, None, None, False),   # residual's shape
    lambda x, w, k: k.rows_plain(x, x.astype(np.float64), (4,), w, None, None, None, False),
    lambda x, w, k: k.rows_plain(x, x, (4,), w, w, 1e-5, (x, None, None, None), True),  # y is x
    lambda x, w, k: k.row_grads_plain(x, None, x, (4,), None, x[:, :1], w, None,
                                      (True, True, True), False),
    lambda x, w, k: k.row_grads_plain(x, x[:1], x, (4,), None, x[:, :1], w, None, (True, True),
                                      False),                                # grad_h's shape
])
def test_rms_norm_leaves_the_rest_to_python(call):
    from cynorm import rmsnorm
    x = data((2, 4), np.float32)
    w = data(4, np.float32, 1)
    assert call(x, w, rmsnorm._k) is None


BN_SHAPES = [((2, 4, 1, 1), 1), ((2, 16, 32, 32), 1), ((3, 5, 200), 1), ((4, 6, 7, 3), -1),
             ((64, 10), 1), ((5, 9), -1), ((3, 70, 2), 1), ((2, 3, 20, 20), 1)]


@pytest.mark.parametrize("dtype,form", DTYPE_PARAMS)
@pytest.mark.parametrize("shape,axis", BN_SHAPES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("params", ["all", "none", "no running"])
def test_batch_norm(dtype, form, shape, axis, training, params, threads):
    from cynorm import _channels
    x = data(shape, dtype, mean=1e4 if dtype == np.float32 else 0.5)
    C = shape[axis]
    pw, pd = param_dtype(dtype, form), param_dtype(dtype, form, False)
    w = data(C, pw, 1) if params == "all" else None
    b = data(C, pd, 2) if params == "all" else None
    if params == "no running" and not training:
        return
    rm = (data(C, np.float32, 3) * 0.1).astype(pd) if params != "no running" else None
    rv = (np.abs(data(C, np.float32, 4)) + 0.5).astype(pd) if params != "no running" else None

    def run(xx, plain):
        rm2 = None if rm is None else rm.copy()
        rv2 = None if rv is None else rv.copy()
        if plain:
            assert _channels.plain_batch_norm(xx, w, b, rm2, rv2, training, 0.1, 1e-5,
                                              axis) is not None
            rm2 = None if rm is None else rm.copy()
            rv2 = None if rv is None else rv.copy()
        out = cynorm.batch_norm(xx, w, b, rm2, rv2, training, 0.1, 1e-5, axis)
        return out + tuple(a for a in (rm2, rv2) if a is not None)

    same_bits(run(x, True), run(via_python(x), False))


WN_CASES = [((4, 3), 0), ((4, 3), 1), ((4, 3), None), ((64, 100), 0), ((64, 100), -1),
            ((5, 6, 7), 1), ((3, 300, 2), 2), ((200, 40), 1), ((2, 3), -2)]


def kept(shape, dim):
    return tuple(1 for _ in shape) if dim is None else tuple(
        s if i == dim % len(shape) else 1 for i, s in enumerate(shape))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", WN_CASES)
@pytest.mark.parametrize("g_form", ["keepdims", "flat", "v's dtype"])
def test_weight_norm(dtype, shape, dim, g_form, threads):
    from cynorm import weightnorm
    v = data(shape, dtype)
    gshape = kept(shape, dim)
    if g_form == "flat":
        gshape = (1,) if dim is None else (shape[dim],)
    # g in the math dtype, or (16-bit v) in v's own dtype, as torch keeps it
    g = (np.abs(data(gshape, math_dtype(dtype), 1)) + 0.5).astype(
        dtype if g_form == "v's dtype" else math_dtype(dtype))
    assert weightnorm._k.forward_plain(v, g, dim) is not None
    fwd = cynorm.weight_norm_interface(v, g, dim)
    same_bits(fwd, cynorm.weight_norm_interface(via_python(v), g, dim))
    same_bits(cynorm.weight_norm(v, g, dim), cynorm.weight_norm(via_python(v), g, dim))
    gw = data(shape, dtype, 2)
    norm = fwd[1]
    assert weightnorm._k.backward_plain(gw, v, g, norm, dim) is not None
    same_bits(cynorm.weight_norm_backward(gw, v, g, norm, dim),
              cynorm.weight_norm_backward(via_python(gw), v, g, norm, dim))
    for pw in (2, 1, float("inf"), 3, 2.5, 0.5):
        assert weightnorm._k.norm_plain(v, pw, dim) is not None
        same_bits(cynorm.norm_except_dim(v, pw, dim),
                  cynorm.norm_except_dim(via_python(v), pw, dim))


@pytest.mark.parametrize("call", [
    lambda v, g: __import__("cynorm.weightnorm").weightnorm._k.forward_plain(v, g, 2),
    lambda v, g: __import__("cynorm.weightnorm").weightnorm._k.forward_plain(v, g, True),
    lambda v, g: __import__("cynorm.weightnorm").weightnorm._k.forward_plain(v, g[:2], 0),
    lambda v, g: __import__("cynorm.weightnorm").weightnorm._k.forward_plain(
        v, g.astype(np.float64), 0),
    lambda v, g: __import__("cynorm.weightnorm").weightnorm._k.forward_plain(
        v, g.astype(ml_dtypes.bfloat16), 0),             # 16-bit g for float32 v
    lambda v, g: __import__("cynorm.weightnorm").weightnorm._k.forward_plain(
        v.astype(ml_dtypes.bfloat16), g.astype(np.float16), 0),   # another 16-bit type
    lambda v, g: __import__("cynorm.weightnorm").weightnorm._k.backward_plain(
        v.astype(np.float16), v.astype(np.float16), g.astype(ml_dtypes.bfloat16),
        g, 0),
    lambda v, g: __import__("cynorm.weightnorm").weightnorm._k.forward_plain(v[:0], g[:0], 0),
    lambda v, g: __import__("cynorm.weightnorm").weightnorm._k.norm_plain(v, 0, 0),
    lambda v, g: __import__("cynorm.weightnorm").weightnorm._k.norm_plain(v, -1.0, 0),
    lambda v, g: __import__("cynorm.weightnorm").weightnorm._k.norm_plain(v, float("nan"), 0),
    lambda v, g: __import__("cynorm.weightnorm").weightnorm._k.norm_plain(v, True, 0),
    lambda v, g: __import__("cynorm.weightnorm").weightnorm._k.norm_plain(v, 10**400, 0),
    lambda v, g: __import__("cynorm.weightnorm").weightnorm._k.backward_plain(v, v, g, g, 1),
])
def test_weight_norm_leaves_the_rest_to_python(call):
    v = data((4, 3), np.float32)
    g = np.abs(data((4, 1), np.float32, 1)) + 0.5
    assert call(v, g) is None


@pytest.mark.parametrize("dtype,form", DTYPE_PARAMS)
@pytest.mark.parametrize("shape,axis", BN_SHAPES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
def test_batch_norm_backward(dtype, form, shape, axis, training, weighted, threads):
    from cynorm import _channels
    x = data(shape, dtype, mean=1e4 if dtype == np.float32 else 0.5)
    dy = data(shape, dtype, 5)
    C = shape[axis]
    pw, pd = param_dtype(dtype, form), param_dtype(dtype, form, False)
    w = data(C, pw, 1) if weighted else None
    rm = (data(C, np.float32, 3) * 0.1).astype(pd)
    rv = (np.abs(data(C, np.float32, 4)) + 0.5).astype(pd)
    _, sm, si = cynorm.batch_norm(x, w, None, None, None, True, 0.1, 1e-5, axis)
    if form == "own":       # saved statistics in x's dtype too (any float dtype is taken)
        sm, si = sm.astype(dtype), si.astype(dtype)
    for mask in [(True, True, True), (True, False, False), (False, True, False),
                 (False, False, True), (False, False, False)]:
        args = (dy, x, w, rm, rv, sm, si, training, 1e-5, mask, axis)
        assert _channels.plain_batch_norm_backward(*args) is not None
        same_bits(cynorm.batch_norm_backward(*args),
                  cynorm.batch_norm_backward(via_python(dy), *args[1:]))


# (channels-first shape, axis) of data held in the other channel order: a torch
# channels_last tensor's view (axis 1), or channels-last axes over
# channels-first memory (axis -1)
BN_MOVED = [((2, 16, 8, 8), 1), ((3, 5, 20), 1), ((2, 3, 4, 5, 6), 1), ((4, 3, 6, 7), -1),
            ((3, 5, 20), -1)]


@pytest.mark.parametrize("dtype,form", DTYPE_PARAMS)
@pytest.mark.parametrize("shape,axis", BN_MOVED)
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_in_the_other_channel_order(dtype, form, shape, axis, training, threads):
    """Read in place by the plain entries, as the Python layer reads it:
    the same bits, and results in x's memory order."""
    from cynorm import _channels
    x = gn_layout(data(shape, dtype, mean=1e4 if dtype == np.float32 else 0.5), axis, True)
    dy = gn_layout(data(shape, dtype, 5), axis, True)
    assert not x.flags.c_contiguous and not dy.flags.c_contiguous
    C = shape[1]
    pw, pd = param_dtype(dtype, form), param_dtype(dtype, form, False)
    w, b = data(C, pw, 1), data(C, pd, 2)
    rm = (data(C, np.float32, 3) * 0.1).astype(pd)
    rv = (np.abs(data(C, np.float32, 4)) + 0.5).astype(pd)

    def forward(xx):
        rm2, rv2 = rm.copy(), rv.copy()
        return cynorm.batch_norm(xx, w, b, rm2, rv2, training, 0.1, 1e-5, axis) + (rm2, rv2)

    assert _channels.plain_batch_norm(x, w, b, rm.copy(), rv.copy(), training, 0.1, 1e-5,
                                      axis) is not None
    got, want = forward(x), forward(via_python(x))
    assert got[0].strides == want[0].strides
    same_bits(tuple(np.ascontiguousarray(a) for a in got),
              tuple(np.ascontiguousarray(a) for a in want))
    _, sm, si = got[:3]
    for mask in [(True, True, True), (True, False, False), (False, True, True)]:
        args = (dy, x, w, rm, rv, sm, si, training, 1e-5, mask, axis)
        assert _channels.plain_batch_norm_backward(*args) is not None
        g1 = cynorm.batch_norm_backward(*args)
        g2 = cynorm.batch_norm_backward(via_python(dy), *args[1:])
        if mask[0]:
            assert g1[0].strides == g2[0].strides
        same_bits(tuple(None if a is None else np.ascontiguousarray(a) for a in g1),
                  tuple(None if a is None else np.ascontiguousarray(a) for a in g2))
    # grad_out in another order than x's: left to the Python layer
    dyc = np.ascontiguousarray(dy)
    args = (dyc, x, w, rm, rv, sm, si, training, 1e-5, (True,) * 3, axis)
    assert _channels.plain_batch_norm_backward(*args) is None
    same_bits(tuple(np.ascontiguousarray(a) for a in cynorm.batch_norm_backward(*args)),
              tuple(np.ascontiguousarray(a) for a in cynorm.batch_norm_backward(
                  via_python(dyc), *args[1:])))


@pytest.mark.parametrize("shape,axis", [((2, 3, 1, 5), -1), ((2, 3, 1, 5), 1), ((1, 3, 4, 5), 1),
                                        ((2, 16, 64, 1), 1)])
def test_batch_norm_other_order_with_an_axis_of_one(shape, axis):
    """An axis of length 1 leaves the memory order to its stride, which
    the Python layer reads: the plain entries leave such data to it (the
    same strides and bits either way)."""
    from cynorm import _channels
    x = gn_layout(data(shape, np.float32), axis, True)
    dy = gn_layout(data(shape, np.float32, 5), axis, True)
    if dy.ndim == 4 and dy.shape[-1] == 1:     # a stride NumPy leaves at 0
        dy = np.lib.stride_tricks.as_strided(dy, strides=dy.strides[:-1] + (0,))
    w = data(shape[1], np.float32, 1)
    assert _channels.plain_batch_norm(x, w, None, None, None, True, 0.1, 1e-5, axis) is None
    got, want = (cynorm.batch_norm(a, w, None, None, None, True, 0.1, 1e-5, axis)
                 for a in (x, via_python(x)))
    assert got[0].strides == want[0].strides
    same_bits(tuple(np.ascontiguousarray(a) for a in got),
              tuple(np.ascontiguousarray(a) for a in want))
    args = (x, w, None, None, got[1], got[2], True, 1e-5, (True,) * 3, axis)
    g1, g2 = cynorm.batch_norm_backward(dy, *args), cynorm.batch_norm_backward(via_python(dy),
                                                                                *args)
    assert g1[0].strides == g2[0].strides
    same_bits(tuple(np.ascontiguousarray(a) for a in g1),
              tuple(np.ascontiguousarray(a) for a in g2))


@pytest.mark.parametrize("call", [
    lambda x, v: __import__("cynorm._channels")._channels.plain_batch_norm(
        x, v, v, v, v, 1, 0.1, 1e-5, 1),                       # training an int
    lambda x, v: __import__("cynorm._channels")._channels.plain_batch_norm(
        x, v, v, v, v, True, 0.1, 0.0, 1),                     # eps 0 in training
    lambda x, v: __import__("cynorm._channels")._channels.plain_batch_norm(
        x, v, v, v, v, True, float("nan"), 1e-5, 1),
    lambda x, v: __import__("cynorm._channels")._channels.plain_batch_norm(
        x, v, v, v, v.copy(), True, 0.1, 1e-5, 1),             # running_mean is weight
    lambda x, v: __import__("cynorm._channels")._channels.plain_batch_norm(
        x, None, None, v, v, True, 0.1, 1e-5, 1),              # both running stats one array
    lambda x, v: __import__("cynorm._channels")._channels.plain_batch_norm(
        x, None, None, None, v, False, 0.1, 1e-5, 1),          # inference without running_mean
    lambda x, v: __import__("cynorm._channels")._channels.plain_batch_norm(
        x[:1, :, :1, :1], None, None, None, None, True, 0.1, 1e-5, 1),   # one value per channel
    lambda x, v: __import__("cynorm._channels")._channels.plain_batch_norm(
        x, None, None, None, None, True, 0.1, 1e-5, 4),
    lambda x, v: __import__("cynorm._channels")._channels.plain_batch_norm(
        x, v[:2], None, None, None, True, 0.1, 1e-5, 1),
    lambda x, v: __import__("cynorm._channels")._channels.plain_batch_norm(
        x, None, None, np.frombuffer(v.tobytes(), np.float32), None, True, 0.1, 1e-5, 1),
    lambda x, v: __import__("cynorm._channels")._channels.plain_batch_norm_backward(
        x, x, v, v, v, v, v, True, 1e-5, (True, True, 1), 1),
    lambda x, v: __import__("cynorm._channels")._channels.plain_batch_norm_backward(
        x, x, v, v, v, None, v, True, 1e-5, (True, True, True), 1),
])
def test_batch_norm_leaves_the_rest_to_python(call):
    x = data((2, 4, 3, 3), np.float32)
    v = np.abs(data(4, np.float32, 1)) + 0.5
    rv = v.copy()
    assert call(x, rv) is None


# (channels-first shape, groups): each of the kernels' shapes, short and long rows
GN_SHAPES = [((2, 6, 3, 4), 3), ((3, 8, 50), 2), ((6, 64, 7, 7), 64), ((2, 4, 200, 400), 1),
             ((5, 4), 2), ((2, 48, 40, 30), 3)]


def gn_layout(a, axis, moved):
    """a (channels first) as the caller holds it: channels last for axis -1;
    moved: the memory in the other channel order (a torch channels_last view)."""
    if axis == -1:
        return np.moveaxis(np.ascontiguousarray(a), 1, -1) if moved else \
            np.ascontiguousarray(np.moveaxis(a, 1, -1))
    return np.moveaxis(np.ascontiguousarray(np.moveaxis(a, 1, -1)), -1, 1) if moved else a


@pytest.mark.parametrize("shape,G", GN_SHAPES)
@pytest.mark.parametrize("dtype,form,affine", AFFINE_FORMS)
@pytest.mark.parametrize("axis,moved", [(1, False), (-1, False), (1, True), (-1, True)])
def test_group_norm(dtype, form, shape, G, affine, axis, moved, threads):
    from cynorm import groupnorm
    if moved and len(shape) == 2:
        pytest.skip("(N, C): one memory order")
    C = shape[1]
    x = gn_layout(data(shape, dtype, mean=1e4 if dtype == np.float32 else 0.5), axis, moved)
    w = data(C, param_dtype(dtype, form), 1) if affine else None
    b = data(C, param_dtype(dtype, form, False), 2) if affine else None
    assert groupnorm._k.group_forward_plain(x, G, w, b, 1e-5, axis) is not None
    got = cynorm.group_norm(x, G, w, b, 1e-5, axis)
    want = cynorm.group_norm(via_python(x), G, w, b, 1e-5, axis)
    assert got[0].strides == want[0].strides
    same_bits(tuple(np.ascontiguousarray(a) for a in got),
              tuple(np.ascontiguousarray(a) for a in want))
    dy = gn_layout(data(shape, dtype, 3), axis, moved)
    _, mean, rstd = got
    for mask in [(True, True, True), (True, False, False), (False, True, True)]:
        for m, r in ((mean, rstd), (mean.reshape(-1), rstd.reshape(-1))):
            args = (dy, x, m, r, w, G, mask, axis)
            assert groupnorm._k.group_backward_plain(*args) is not None
            g1 = cynorm.group_norm_backward(*args)
            g2 = cynorm.group_norm_backward(via_python(dy), *args[1:])
            same_bits(tuple(None if a is None else np.ascontiguousarray(a) for a in g1),
                      tuple(None if a is None else np.ascontiguousarray(a) for a in g2))
    # instance norm: a group per channel, its own statistics
    assert groupnorm._k.instance_forward_plain(x, w, b, 1e-5, axis) is not None
    got = cynorm.instance_norm(x, w, b, eps=1e-5, axis=axis)
    same_bits(tuple(np.ascontiguousarray(a) for a in got),
              tuple(np.ascontiguousarray(a) for a in cynorm.instance_norm(
                  via_python(x), w, b, eps=1e-5, axis=axis)))
    for use in (True, False):
        args = (dy, x, got[1], got[2], w, use, (True, True, True), axis)
        assert groupnorm._k.instance_backward_plain(*args) is not None
        same_bits(tuple(np.ascontiguousarray(a) for a in cynorm.instance_norm_backward(*args)),
                  tuple(np.ascontiguousarray(a) for a in cynorm.instance_norm_backward(
                      via_python(dy), *args[1:])))


@pytest.mark.parametrize("call", [
    lambda k, x, w: k.group_forward_plain(x, 2, w, w, 1, 1),            # eps an int
    lambda k, x, w: k.group_forward_plain(x, 2.0, w, w, 1e-5, 1),       # num_groups a float
    lambda k, x, w: k.group_forward_plain(x, True, w, w, 1e-5, 1),
    lambda k, x, w: k.group_forward_plain(x, 3, w, w, 1e-5, 1),         # not dividing C
    lambda k, x, w: k.group_forward_plain(x, 0, w, w, 1e-5, 1),
    lambda k, x, w: k.group_forward_plain(x, 10 ** 30, w, w, 1e-5, 1),
    lambda k, x, w: k.group_forward_plain(x, 2, w, w, 1e-5, 2),         # not a channel axis
    lambda k, x, w: k.group_forward_plain(x, 2, w, w, 1e-5, 10 ** 30),
    lambda k, x, w: k.group_forward_plain(x, 2, w, w, 1e-5, 1.0),
    lambda k, x, w: k.group_forward_plain(x[:, :, ::2], 2, w, w, 1e-5, 1),   # strided
    lambda k, x, w: k.group_forward_plain(x.astype(">f4"), 2, w, w, 1e-5, 1),
    lambda k, x, w: k.group_forward_plain(x, 2, w.astype(np.float64), w, 1e-5, 1),
    lambda k, x, w: k.group_forward_plain(x[:0], 2, w, w, 1e-5, 1),    # no sample
    lambda k, x, w: k.group_forward_plain(x.tolist(), 2, w, w, 1e-5, 1),
    lambda k, x, w: k.group_backward_plain(x, x, x[:, :2, 0], x[:, :2, 0], w, 2,
                                           [True] * 3, 1),
    lambda k, x, w: k.group_backward_plain(x, x[:1], x[:1, :2, 0], x[:1, :2, 0], w, 2,
                                           (True,) * 3, 1),
    lambda k, x, w: k.group_backward_plain(x, x, x[:, :2, 0].astype(np.float64),
                                           x[:, :2, 0], w, 2, (True,) * 3, 1),
    lambda k, x, w: k.instance_backward_plain(x, x, x[:, :, 0], x[:, :, 0], w, 1,
                                              (True,) * 3, 1),
])
def test_group_norm_leaves_the_rest_to_python(call):
    from cynorm import groupnorm
    x = data((2, 4, 6), np.float32)
    w = data(4, np.float32, 1)
    assert call(groupnorm._k, x, w) is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [1, -1])
def test_group_norm_out(dtype, axis, threads):
    from cynorm import groupnorm
    x = gn_layout(data((3, 8, 5, 6), dtype), axis, False)
    w, b = data(8, math_dtype(dtype), 1), data(8, math_dtype(dtype), 2)
    want = cynorm.group_norm(via_python(x), 4, w, b, 1e-5, axis)
    sd = math_dtype(dtype)
    for keep in [(True, True, True), (True, False, False), (False, True, True)]:
        outs = tuple(np.full(s, 7, d) if k else None
                     for k, s, d in zip(keep, (x.shape, (3, 4), (3, 4)), (dtype, sd, sd)))
        assert groupnorm._k.group_forward_plain(x, 4, w, b, 1e-5, axis, outs) is not None
        got = cynorm.group_norm(x, 4, w, b, 1e-5, axis, out=outs)
        for g, o in zip(got, outs):
            assert o is None or g is o
        same_bits(got, want)
    # out=x (in place) and outputs over the inputs: the Python layer's
    assert groupnorm._k.group_forward_plain(x, 4, w, b, 1e-5, axis, (x, None, None)) is None
