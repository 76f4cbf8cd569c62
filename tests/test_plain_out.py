"""out= on the plain path: a call whose out= arrays are exact, C-contiguous,
writeable ndarrays of the outputs' shapes and dtypes, overlapping no input
and no other output, takes the plain entry (no Python layer), writes into
those arrays, allocates the None entries, and gives the same bits as the
Python layer given the same out= forms.  Anything else (an output that
overlaps an input or another output, a read-only, F-ordered or subclassed
output, a wrong shape or dtype) is left to the Python layer, which copies,
converts or raises as before."""
import ml_dtypes
import numpy as np
import pytest

import cynorm
from cynorm import _channels, layernorm, weightnorm
from test_plain_calls import DTYPES, NotPlain, data, math_dtype, same_bits, via_python


def fresh_like(outs, keep):
    """New arrays like `outs` where keep[i], else None (the op allocates it)."""
    return tuple(np.full_like(o, 7) if k else None for o, k in zip(outs, keep))


def check_given(result, out):
    """The returned outputs are the given out= arrays where one was given."""
    for r, o in zip(result, out):
        if o is not None:
            assert r is o


KEEPS = [(True, True, True), (True, False, False), (False, True, True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("keep", KEEPS)
def test_layer_norm(dtype, keep, threads):
    x = data((6, 5, 7), dtype)
    w, b = data((5, 7), math_dtype(dtype), 1), data((5, 7), math_dtype(dtype), 2)
    want = cynorm.layer_norm(x, (5, 7), w, b)
    out = fresh_like(want, keep)
    assert layernorm._k.forward_plain(x, (5, 7), w, b, 1e-5, fresh_like(want, keep)) is not None
    got = cynorm.layer_norm(x, (5, 7), w, b, out=out)
    check_given(got, out)
    same_bits(got, want)
    same_bits(got, cynorm.layer_norm(via_python(x), (5, 7), w, b, out=fresh_like(want, keep)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape,axis", [((4, 6, 5, 5), 1), ((4, 5, 5, 6), -1), ((64, 6), 1)])
@pytest.mark.parametrize("keep", KEEPS)
def test_batch_norm(dtype, training, shape, axis, keep, threads):
    C, md = shape[axis], math_dtype(dtype)
    x = data(shape, dtype)
    w, b = data(C, md, 1), data(C, md, 2)
    rm0, rv0 = data(C, md, 3) * 0.1, np.abs(data(C, md, 4)) + 0.5

    def run(xx, out):
        rm, rv = rm0.copy(), rv0.copy()
        return cynorm.batch_norm(xx, w, b, rm, rv, training, 0.1, 1e-5, axis, out=out) + (rm, rv)

    want = run(x, None)
    out = fresh_like(want[:3], keep)
    assert _channels.plain_batch_norm(x, w, b, rm0.copy(), rv0.copy(), training, 0.1, 1e-5, axis,
                                      fresh_like(want[:3], keep)) is not None
    got = run(x, out)
    check_given(got, out)
    same_bits(got, want)
    same_bits(got, run(via_python(x), fresh_like(want[:3], keep)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((6, 5), 0), ((6, 5), 1), ((6, 5), None), ((3, 4, 5), 1)])
@pytest.mark.parametrize("keep", [(True, True), (True, False), (False, True)])
def test_weight_norm(dtype, shape, dim, keep, threads):
    v = data(shape, dtype)
    gshape = tuple(1 for _ in shape) if dim is None else tuple(
        s if i == dim else 1 for i, s in enumerate(shape))
    g = np.abs(data(gshape, math_dtype(dtype), 1)) + 0.5
    want = cynorm.weight_norm_interface(v, g, dim)
    assert weightnorm._k.forward_plain(v, g, dim, fresh_like(want, keep)) is not None
    out = fresh_like(want, keep)
    got = cynorm.weight_norm_interface(v, g, dim, out=out)
    check_given(got, out)
    same_bits(got, want)
    same_bits(got, cynorm.weight_norm_interface(via_python(v), g, dim, out=fresh_like(want, keep)))
    w_out = np.empty_like(v)
    assert cynorm.weight_norm(v, g, dim, out=w_out) is w_out
    same_bits(w_out, want[0])
    gw = data(shape, dtype, 2)
    gwant = cynorm.weight_norm_backward(gw, v, g, want[1], dim)
    assert weightnorm._k.backward_plain(gw, v, g, want[1], dim, fresh_like(gwant, keep)) is not None
    out = fresh_like(gwant, keep)
    got = cynorm.weight_norm_backward(gw, v, g, want[1], dim, out=out)
    check_given(got, out)
    same_bits(got, gwant)
    same_bits(got, cynorm.weight_norm_backward(via_python(gw), v, g, want[1], dim,
                                               out=fresh_like(gwant, keep)))
    nwant = cynorm.norm_except_dim(v, 2, dim)
    n_out = np.empty_like(nwant)
    assert weightnorm._k.norm_plain(v, 2, dim, np.empty_like(nwant)) is not None
    assert cynorm.norm_except_dim(v, 2, dim, out=n_out) is n_out
    same_bits(n_out, nwant)


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_statistics_ops(dtype, threads):
    x, dy = data((4, 6, 5), dtype), data((4, 6, 5), dtype, 1)
    md = math_dtype(dtype)
    w, b = data(6, md, 2), data(6, md, 3)
    mean, invstd = cynorm.batch_norm_stats(x, 1e-5)
    want = cynorm.batch_norm_elemt(x, w, b, mean, invstd, 1e-5)
    out = np.empty_like(want)
    assert _channels.plain_elemt(x, w, b, mean, invstd, 1e-5, 1, np.empty_like(want)) is not None
    assert cynorm.batch_norm_elemt(x, w, b, mean, invstd, 1e-5, out=out) is out
    same_bits(out, want)
    sum_dy, sum_dy_xmu, _, _ = cynorm.batch_norm_backward_reduce(dy, x, mean, invstd, w)
    count = np.array([20.0])
    gwant = cynorm.batch_norm_backward_elemt(dy, x, mean, invstd, w, sum_dy, sum_dy_xmu, count)
    out = np.empty_like(gwant)
    assert _channels.plain_backward_elemt(dy, x, mean, invstd, w, sum_dy, sum_dy_xmu, count, 1,
                                          np.empty_like(gwant)) is not None
    assert cynorm.batch_norm_backward_elemt(dy, x, mean, invstd, w, sum_dy, sum_dy_xmu, count,
                                            out=out) is out
    same_bits(out, gwant)


def test_the_rest_is_left_to_python():
    """Outputs the plain case does not take: the plain entry returns None
    (and the public call still gives the Python layer's answer or error)."""
    x = data((4, 6), np.float32)
    w, b = data(6, np.float32, 1), data(6, np.float32, 2)
    y, mean, rstd = cynorm.layer_norm(x, 6, w, b)
    read_only = np.empty_like(y)
    read_only.flags.writeable = False
    both = np.empty(2 * y.size, np.float32)
    for out in [(x, None, None),                           # in place: the Python layer copies x
                (y.copy(), w.reshape(6, 1)[:4], None),     # an output overlapping weight
                (both[:y.size].reshape(y.shape), None, both[y.size - 4:y.size]),   # each other
                (read_only, None, None),
                (np.asfortranarray(np.empty((4, 6), np.float32)), None, None),
                (np.empty_like(y).view(NotPlain), None, None),
                (np.empty((4, 6), np.float64), None, None),
                (np.empty_like(y), None),                  # two entries for three outputs
                [np.empty_like(y), None, None]]:           # a list
        assert layernorm._k.forward_plain(x, 6, w, b, 1e-5, out) is None
    x2 = x.copy()
    got = cynorm.layer_norm(x2, 6, w, b, out=(x2, None, None))
    assert got[0] is x2
    np.testing.assert_array_equal(got[0], y)
    with pytest.raises(ValueError, match="read-only"):
        cynorm.layer_norm(x, 6, w, b, out=(read_only, None, None))
    with pytest.raises(TypeError, match="out must be None or a tuple of 3"):
        cynorm.layer_norm(x, 6, w, b, out=[np.empty_like(y), None, None])
    # batch norm: an output overlapping a running statistic (training) or
    # x; weight norm: w over v (in place)
    x4 = data((2, 3, 4, 4), np.float32)
    rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
    for out in [(None, rm, None), (x4, None, None)]:
        assert _channels.plain_batch_norm(x4, None, None, rm, rv, True, 0.1, 1e-5, 1, out) is None
    assert _channels.plain_batch_norm(x4, None, None, rm, rv, False, 0.1, 1e-5, 1,
                                      (None, np.empty(3, np.float32), None)) is None  # (0,) in eval
    v = data((4, 3), ml_dtypes.bfloat16)
    g = np.ones((4, 1), np.float32)
    assert weightnorm._k.forward_plain(v, g, 0, (v, None)) is None
    assert weightnorm._k.norm_plain(v, 2, 0, np.empty((4, 1), np.float32)) is None   # v's dtype
