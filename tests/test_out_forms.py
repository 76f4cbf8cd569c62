"""The two forms of out= the README promises: a function with one output takes
an array or a tuple of one; a function with several outputs takes a tuple with
one entry (array or None) per output.  In-place calls (out= an input) give
the fresh call's values."""
import numpy as np
import pytest

import cynorm as cn


def data(seed=0):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((6, 5))
    g = rng.uniform(0.5, 2.0, (6, 1))
    return v, g


def weight_norm_ref(v, g):
    return v * g / np.sqrt(np.sum(v * v, axis=1, keepdims=True))


@pytest.mark.parametrize("wrap", [lambda a: a, lambda a: (a,)], ids=["array", "tuple"])
def test_weight_norm_out_forms_and_in_place(wrap):
    v, g = data()
    want = weight_norm_ref(v, g)
    buf = np.empty_like(v)
    got = cn.weight_norm(v, g, 0, out=wrap(buf))
    assert got is buf
    np.testing.assert_allclose(buf, want, rtol=1e-14)
    inplace = v.copy()
    got = cn.weight_norm(inplace, g, 0, out=wrap(inplace))
    assert got is inplace
    np.testing.assert_allclose(inplace, want, rtol=1e-14)


@pytest.mark.parametrize("wrap", [lambda a: a, lambda a: (a,)], ids=["array", "tuple"])
def test_norm_except_dim_out_forms(wrap):
    v, _ = data(1)
    buf = np.empty((6, 1))
    got = cn.norm_except_dim(v, 2, 0, out=wrap(buf))
    assert got is buf
    np.testing.assert_allclose(buf, np.sqrt(np.sum(v * v, axis=1, keepdims=True)), rtol=1e-14)


def test_single_output_none_in_a_tuple_allocates():
    v, g = data(2)
    np.testing.assert_array_equal(cn.weight_norm(v, g, 0, out=(None,)), cn.weight_norm(v, g, 0))


@pytest.mark.parametrize("wrap", [lambda a: a, lambda a: (a,)], ids=["array", "tuple"])
def test_batch_norm_elemt_in_place(wrap):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, 5))
    w, b = rng.standard_normal(3), rng.standard_normal(3)
    mean, invstd = rng.standard_normal(3), rng.uniform(0.5, 2.0, 3)
    want = (x - mean[:, None]) * (invstd * w)[:, None] + b[:, None]
    inplace = x.copy()
    got = cn.batch_norm_elemt(inplace, w, b, mean, invstd, out=wrap(inplace))
    assert got is inplace
    np.testing.assert_allclose(inplace, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("wrap", [lambda a: a, lambda a: (a,)], ids=["array", "tuple"])
def test_batch_norm_backward_elemt_out_forms(wrap):
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal((4, 3, 5)), rng.standard_normal((4, 3, 5))
    w = rng.standard_normal(3)
    mean, invstd = x.mean(axis=(0, 2)), 1 / x.std(axis=(0, 2))
    sum_dy, sum_dy_xmu = dy.sum(axis=(0, 2)), (dy * (x - mean[:, None])).sum(axis=(0, 2))
    fresh = cn.batch_norm_backward_elemt(dy, x, mean, invstd, w, sum_dy, sum_dy_xmu, 20)
    buf = np.empty_like(x)
    got = cn.batch_norm_backward_elemt(dy, x, mean, invstd, w, sum_dy, sum_dy_xmu, 20, out=wrap(buf))
    assert got is buf
    np.testing.assert_array_equal(buf, fresh)


def test_multi_output_functions_take_a_tuple_with_none_entries():
    v, g = data(5)
    wbuf = np.empty_like(v)
    w, norm = cn.weight_norm_interface(v, g, 0, out=(wbuf, None))
    assert w is wbuf and norm.shape == (6, 1)
    np.testing.assert_allclose(w, weight_norm_ref(v, g), rtol=1e-14)


def test_wrong_out_forms_are_refused_with_the_expected_form():
    v, g = data(6)
    buf = np.empty_like(v)
    with pytest.raises(TypeError, match="tuple of one array/None, got a tuple of length 2"):
        cn.weight_norm(v, g, 0, out=(buf, buf))
    with pytest.raises(TypeError, match=r"tuple of 2 arrays/None \(w, norm\), got ndarray"):
        cn.weight_norm_interface(v, g, 0, out=buf)
    with pytest.raises(TypeError,
                       match="out must be a NumPy array, a writable DLPack tensor or None, got list"):
        cn.weight_norm(v, g, 0, out=[buf])


def _placed(shape, dtype, offset):
    # an out= array starting `offset` elements past a 64-byte line
    n = int(np.prod(shape))
    buf = np.empty(n + 128, dtype)
    start = (-buf.ctypes.data % 64) // buf.itemsize + offset
    return buf[start:start + n].reshape(shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("C", [64, 100, 3])
@pytest.mark.parametrize("offset", [0, 1, 4])
def test_streamed_channels_last_outputs_at_any_alignment(dtype, C, offset):
    # streamed outputs of a column pass over contiguous rows whose lines do
    # not all start a row (cn_cols_blocks: the rows run together) have the
    # bits of outputs stored through the cache, out= at any alignment
    from cynorm._kernels import _runtime
    rng = np.random.default_rng(C + offset)
    x = rng.standard_normal((4, 7, 5, C)).astype(dtype)
    w, b = rng.uniform(0.5, 2, C).astype(dtype), rng.standard_normal(C).astype(dtype)
    rm, rv = rng.standard_normal(C).astype(dtype), rng.uniform(0.5, 2, C).astype(dtype)

    def calls():
        outs = [_placed(x.shape, dtype, offset) for _ in range(3)]
        cn.batch_norm(x, w, b, rm, rv, training=False, axis=-1, out=(outs[0], None, None))
        cn.batch_norm(x, w, b, rm.copy(), rv.copy(), training=True, axis=-1,
                      out=(outs[1], None, None))
        cn.group_norm(x, 1, w, b, axis=-1, out=(outs[2], None, None))
        return outs

    old = _runtime.set_stream_min_bytes(0)
    try:
        streamed = calls()
        _runtime.set_stream_min_bytes(1 << 62)
        cached = calls()
    finally:
        _runtime.set_stream_min_bytes(old)
    for s, c in zip(streamed, cached):
        np.testing.assert_array_equal(s, c)
    want = (x - rm) / np.sqrt(rv.astype(np.float64) + 1e-5) * w + b
    np.testing.assert_allclose(streamed[0], want, rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)
