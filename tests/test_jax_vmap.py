"""cynorm.jax under jax.vmap: one custom call for the whole batch, with each
element's bits.

The handlers take a set of every buffer per batch element; group and instance
norm with parameters the batch shares run one kernel call over all the
batch's samples, and their derivative rules fold the batch into the samples
too; the other derivative rules run vmapped (cynorm._jax_forward's levels).
(More of the row norms' vmap tests are in test_jax_adapter.py.)"""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
cj = pytest.importorskip("cynorm.jax")

import ml_dtypes  # noqa: E402

import cynorm  # noqa: E402

pytestmark = pytest.mark.skipif(not cj.route.startswith("xla_ffi"),
                                reason=f"cynorm.jax runs through callbacks here ({cj.route})")


def rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def same(a, b):
    a = np.asarray(a)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a, b, equal_nan=True)


def one_call(fn, *args):
    """fn's jaxpr runs the batch in custom calls of its own: none looped
    over the batch's elements (vmap_method=sequential lowers to a loop;
    lax.map is a scan)."""
    text = str(jax.make_jaxpr(fn)(*args))
    assert "ffi_call" in text and "sequential" not in text and "scan" not in text


def gn_ref(x, G, w, b, eps=1e-5):
    # the formula in float64, channels first
    x = np.asarray(x, np.float64)
    N, C = x.shape[:2]
    g = x.reshape(N, G, -1)
    m = g.mean(-1, keepdims=True)
    y = ((g - m) / np.sqrt(((g - m) ** 2).mean(-1, keepdims=True) + eps)).reshape(x.shape)
    shape = (1, C) + (1,) * (x.ndim - 2)
    return y * np.asarray(w, np.float64).reshape(shape) + np.asarray(b, np.float64).reshape(shape)


@pytest.mark.parametrize("axis", [1, -1])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_group_norm_under_vmap_is_one_call_over_the_batch(axis, dtype):
    B, N, C = 5, 2, 6
    shape = (B, N, C, 3, 4) if axis == 1 else (B, N, 3, 4, C)
    xs = rand(*shape, dtype=dtype)
    w, b = rand(C, seed=1), rand(C, seed=2)
    ws = rand(B, C, seed=3)

    def per(x, w):
        return cynorm.group_norm(x, 3, w, b, 1e-5, axis)

    fn = jax.jit(jax.vmap(lambda x: cj.group_norm(x, 3, w, b, axis=axis)))
    one_call(fn, xs)
    same(fn(xs), np.stack([per(xs[i], w)[0] for i in range(B)]))
    # a weight per element; the batch on another axis
    got = jax.vmap(lambda x, w: cj.group_norm(x, 3, w, b, axis=axis), (0, 0))(xs, ws)
    same(got, np.stack([per(xs[i], ws[i])[0] for i in range(B)]))
    got = jax.vmap(lambda x: cj.group_norm(x, 3, w, b, axis=axis), 1, 1)(np.moveaxis(xs, 0, 1))
    same(np.moveaxis(np.asarray(got), 1, 0), np.stack([per(xs[i], w)[0] for i in range(B)]))

    # per-example gradients: each element's own parameter sums
    def loss(x, w):
        return (cj.group_norm(x, 3, w, b, axis=axis).astype(jnp.float32) ** 2).sum()
    grads = jax.jit(jax.vmap(jax.grad(loss, (0, 1)), (0, None)))
    one_call(grads, xs, w)
    gx, gw = grads(xs, w)
    for i in range(B):
        y, mean, rstd = per(xs[i], w)
        gy = (2 * y.astype(np.float32)).astype(dtype)
        want = cynorm.group_norm_backward(gy, xs[i], mean, rstd, w, 3, (True, True, False), axis)
        same(gx[i], want[0])
        same(gw[i], want[1])

    # the gradient of a vmapped model: one backward call over every sample
    flat = xs.reshape((B * N,) + xs.shape[2:])
    y, mean, rstd = cynorm.group_norm(flat, 3, w, b, 1e-5, axis)
    model = lambda w, b: (jax.vmap(lambda x: cj.group_norm(x, 3, w, b, axis=axis))(xs)  # noqa
                          .astype(jnp.float32) ** 2).sum()
    one_call(jax.grad(model, (0, 1)), w, b)
    gw, gb = jax.jit(jax.grad(model, (0, 1)))(w, b)
    gy = (2 * y.astype(np.float32)).astype(dtype)
    want = cynorm.group_norm_backward(gy, flat, mean, rstd, w, 3, (False, True, True), axis)
    same(gw, want[1])
    same(gb, want[2])


def test_group_norm_jacobians_and_nested_vmaps():
    x, w, b = rand(2, 4, 3), rand(4, seed=1), rand(4, seed=2)
    f = lambda x: cj.group_norm(x, 2, w, b)  # noqa: E731
    eye = np.eye(x.size).reshape((x.size,) + x.shape)
    step = 1e-3
    # the Jacobian of the float64 formula by central differences
    ref = np.stack([(gn_ref(x + step * e, 2, w, b) - gn_ref(x - step * e, 2, w, b)) / (2 * step)
                    for e in eye], -1).reshape(x.shape + x.shape)
    for jac in (jax.jacfwd, jax.jacrev):
        got = np.asarray(jac(f)(x), np.float64)
        assert np.abs(got - ref).max() < 2e-3 * np.abs(ref).max()
    # nested vmaps, the weight batched by the inner one only
    xs, ws = rand(2, 3, 2, 4, 3, seed=3), rand(3, 4, seed=4)
    got = jax.vmap(jax.vmap(lambda x, w: cj.group_norm(x, 2, w, b), (0, 0)), (0, None))(xs, ws)
    for i in range(2):
        for j in range(3):
            same(got[i, j], cynorm.group_norm(xs[i, j], 2, ws[j], b)[0])


@pytest.mark.parametrize("axis", [1, -1])
def test_instance_norm_under_vmap_updates_each_elements_running_statistics(axis):
    B, N, C = 4, 3, 5
    xs = rand(B, N, C, 6, seed=5) if axis == 1 else rand(B, N, 6, C, seed=5)
    w, b = rand(C, seed=1), rand(C, seed=2)
    rm, rv = rand(C, seed=3), np.abs(rand(C, seed=4)) + 0.5
    rms = rand(B, C, seed=6)

    def per(x, rm, rv, use_input_stats=True):
        rm, rv = rm.copy(), rv.copy()
        y, mean, rstd = cynorm.instance_norm(x, w, b, rm, rv, use_input_stats, 0.1, 1e-5, axis)
        return y, rm, rv

    fn = jax.jit(jax.vmap(lambda x, rm: cj.instance_norm(x, w, b, rm, rv, axis=axis),
                          (0, None)))
    one_call(fn, xs, rm)
    y, new_rm, new_rv = fn(xs, rm)
    for i in range(B):
        want = per(xs[i], rm, rv)
        same(y[i], want[0])
        same(new_rm[i], want[1])
        same(new_rv[i], want[2])
    # running statistics per element; normalizing with them
    for use in (True, False):
        y, new_rm, _ = jax.vmap(lambda x, rm: cj.instance_norm(x, w, b, rm, rv, use,
                                                               axis=axis))(xs, rms)
        for i in range(B):
            want = per(xs[i], rms[i], rv, use)
            same(y[i], want[0])
            same(new_rm[i], want[1])
    # without running statistics: one call over the batch, and its gradients
    y = jax.vmap(lambda x: cj.instance_norm(x, w, b, axis=axis)[0])(xs)
    same(y, np.stack([per(xs[i], rm, rv)[0] for i in range(B)]))
    model = lambda w: (jax.vmap(lambda x: cj.instance_norm(x, w, b, axis=axis)[0])(xs) ** 2  # noqa
                       ).sum()
    flat = xs.reshape((B * N,) + xs.shape[2:])
    y, mean, rstd = cynorm.instance_norm(flat, w, b, None, None, True, 0.1, 1e-5, axis)
    want = cynorm.instance_norm_backward(2 * y, flat, mean, rstd, w, True, (False, True, False),
                                         axis)
    same(jax.jit(jax.grad(model))(w), want[1])


def test_batch_norm_under_vmap_runs_each_element_in_one_call():
    B = 4
    xs = rand(B, 6, 3, 5, seed=7)
    w, b = rand(3, seed=1), rand(3, seed=2)
    rm, rv = rand(3, seed=3), np.abs(rand(3, seed=4)) + 0.5
    fn = jax.jit(jax.vmap(lambda x: cj.batch_norm(x, w, b, rm, rv)))
    one_call(fn, xs)
    y, new_rm, new_rv = fn(xs)
    grads = jax.jit(jax.vmap(jax.grad(lambda x, w: (cj.batch_norm(x, w, b)[0] ** 2).sum(),
                                      (0, 1)), (0, None)))
    one_call(grads, xs, w)
    gx, gw = grads(xs, w)
    for i in range(B):
        r1, r2 = rm.copy(), rv.copy()
        want = cynorm.batch_norm(xs[i], w, b, r1, r2)
        same(y[i], want[0])
        same(new_rm[i], r1)
        same(new_rv[i], r2)
        sy, sm, si = cynorm.batch_norm(xs[i], w, b)
        back = cynorm.batch_norm_backward(2 * sy, xs[i], w, None, None, sm, si, True,
                                          output_mask=(True, True, False))
        same(gx[i], back[0])
        same(gw[i], back[1])
    # inference, the running statistics per element
    rms = rand(B, 3, seed=8)
    y = jax.vmap(lambda x, rm: cj.batch_norm(x, w, b, rm, rv, training=False)[0])(xs, rms)
    for i in range(B):
        same(y[i], cynorm.batch_norm(xs[i], w, b, rms[i].copy(), rv.copy(), False)[0])


@pytest.mark.parametrize("dim", [0, 1, None])
def test_weight_norm_under_vmap_runs_each_element_in_one_call(dim):
    B = 3
    vs = rand(B, 4, 5, seed=9)
    gs = rand(B, 1 if dim is None else vs.shape[1 + dim], seed=10).reshape(
        (B,) if dim is None else (B, -1))
    fn = jax.jit(jax.vmap(lambda v, g: cj.weight_norm(v, g, dim)))
    one_call(fn, vs, gs)
    got = fn(vs, gs)
    grads = jax.jit(jax.vmap(jax.grad(lambda v, g: (cj.weight_norm(v, g, dim) ** 2).sum(),
                                      (0, 1))))
    one_call(grads, vs, gs)
    gv, gg = grads(vs, gs)
    for i in range(B):
        w, norm = cynorm.weight_norm_interface(vs[i], gs[i], dim)
        same(got[i], w)
        back = cynorm.weight_norm_backward(2 * w, vs[i], gs[i], norm, dim)
        same(gv[i], back[0])
        same(gg[i], back[1].reshape(gs[i].shape))


def test_a_call_holding_no_whole_number_of_sets_is_refused():
    # the handlers infer the batch from x's size; a size that is no
    # multiple of one element's is a malformed call
    s = jax.ShapeDtypeStruct
    x = jnp.ones((5, 3, 4), jnp.float32)
    call = jax.ffi.ffi_call("cynorm_group_norm", (s(x.shape, x.dtype), s((5, 3), x.dtype),
                                                  s((5, 3), x.dtype)))
    with pytest.raises(Exception, match=r"group_norm: x: n \* c \* hw .*a set per batch"):
        jax.block_until_ready(call(x, n=np.int64(2), c=np.int64(3), hw=np.int64(4),
                                   groups=np.int64(3), last=np.int64(0), eps=np.float64(1e-5),
                                   weight=np.int64(0), bias=np.int64(0)))
    call = jax.ffi.ffi_call("cynorm_weight_norm", (s(x.shape, x.dtype), s((3,), x.dtype)))
    with pytest.raises(Exception, match=r"weight_norm: v: a \* d \* b .*a set per batch"):
        jax.block_until_ready(call(x, jnp.ones(3), a=np.int64(1), d=np.int64(3), b=np.int64(7)))


def test_derivative_rules_under_vmap_run_each_call_once_over_the_batch():
    # where nothing folds (batch norm's batch statistics, parameters batched
    # per element), the tangent's evaluation and transposition run vmapped:
    # one custom call per kernel for the whole batch
    B = 4
    xs = rand(B, 6, 3, 5, seed=11)
    w, b = rand(3, seed=1), rand(3, seed=2)

    def bn_model(w, b):
        return (jax.vmap(lambda x: cj.batch_norm(x, w, b)[0])(xs) ** 2).sum()
    grad = jax.jit(jax.grad(bn_model, (0, 1)))
    one_call(grad, w, b)
    gw, gb = grad(w, b)
    want = [0, 0]
    for i in range(B):
        y, sm, si = cynorm.batch_norm(xs[i], w, b)
        back = cynorm.batch_norm_backward(2 * y, xs[i], w, None, None, sm, si, True)
        want = [want[0] + back[1].astype(np.float64), want[1] + back[2].astype(np.float64)]
    np.testing.assert_allclose(np.asarray(gw), want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gb), want[1], rtol=1e-5, atol=1e-5)

    # an ensemble of weight-normed weights: its model's gradient per element
    vs, gs = rand(3, 4, 5, seed=12), rand(3, 4, seed=13)

    def wn_model(vs, gs):
        return (jax.vmap(lambda v, g: cj.weight_norm(v, g, 0))(vs, gs) ** 2).sum()
    grad = jax.jit(jax.grad(wn_model, (0, 1)))
    one_call(grad, vs, gs)
    gv, gg = grad(vs, gs)
    for i in range(3):
        wv, norm = cynorm.weight_norm_interface(vs[i], gs[i], 0)
        back = cynorm.weight_norm_backward(2 * wv, vs[i], gs[i], norm, 0)
        same(gv[i], back[0])
        same(gg[i], back[1])

    # jvp with the layer norm's weight batched per element, and nested
    xs, ws, t = rand(2, 3, 5, 8, seed=14), rand(2, 3, 8, seed=15), rand(2, 3, 5, 8, seed=16)

    def jvp(x, w, tx, tw):
        return jax.jvp(lambda x, w: cj.layer_norm(x, 8, w, w), (x, w), (tx, tw))[1]
    fn = jax.jit(jax.vmap(jax.vmap(jvp, (0, 0, 0, 0)), (0, None, 0, None)))
    one_call(fn, xs, ws[0], t, ws[1])
    got = fn(xs, ws[0], t, ws[1])
    for i in range(2):
        for j in range(3):
            np.testing.assert_allclose(np.asarray(got[i, j]),
                                       np.asarray(jvp(xs[i, j], ws[0, j], t[i, j], ws[1, j])),
                                       rtol=1e-5, atol=1e-5)
