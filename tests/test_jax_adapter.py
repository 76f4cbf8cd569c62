"""cynorm.jax: layer_norm and rms_norm under jax.jit, jax.grad and jax.vmap,
against the jax.numpy formulas."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
cj = pytest.importorskip("cynorm.jax")


def ln_ref(x, w=None, b=None, eps=1e-5, k=1):
    axes = tuple(range(x.ndim - k, x.ndim))
    m = x.mean(axes, keepdims=True)
    y = (x - m) / jnp.sqrt(((x - m) ** 2).mean(axes, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def rms_ref(x, w=None, eps=None):
    eps = float(np.finfo(np.float32).eps) if eps is None else eps
    return x / jnp.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * (1 if w is None else w)


def data(*shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def close(a, b, tol=2e-5):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape
    assert np.abs(a - b).max() <= tol * max(1.0, np.abs(b).max())


def test_forward_under_jit_matches_the_formula():
    x, w, b = data(4, 6, 16), data(16, seed=1), data(16, seed=2)
    close(jax.jit(lambda x, w, b: cj.layer_norm(x, 16, w, b))(x, w, b), ln_ref(x, w, b))
    close(jax.jit(lambda x: cj.layer_norm(x, (6, 16)))(x), ln_ref(x, k=2))
    close(jax.jit(lambda x, w: cj.rms_norm(x, 16, w))(x, w), rms_ref(x, w))
    close(cj.rms_norm(x, 16, eps=1e-3), rms_ref(x, eps=1e-3))


def test_gradients_match_the_formulas():
    x, w, b = data(3, 5, 32), data(32, seed=1), data(32, seed=2)

    def loss(f):
        return lambda *a: (f(*a) ** 3).sum()
    got = jax.jit(jax.grad(loss(lambda x, w, b: cj.layer_norm(x, 32, w, b)), (0, 1, 2)))(x, w, b)
    want = jax.grad(loss(ln_ref), (0, 1, 2))(x, w, b)
    for g, r in zip(got, want):
        close(g, r, 1e-4)
    got = jax.grad(loss(lambda x, w: cj.rms_norm(x, 32, w)), (0, 1))(x, w)
    want = jax.grad(loss(rms_ref), (0, 1))(x, w)
    for g, r in zip(got, want):
        close(g, r, 1e-4)
    close(jax.grad(lambda x: (cj.layer_norm(x, 32) * x).sum())(x),
          jax.grad(lambda x: (ln_ref(x) * x).sum())(x), 1e-4)


def test_vmap_and_bfloat16():
    x, w = data(4, 3, 16), data(16, seed=1)
    close(jax.vmap(lambda x: cj.layer_norm(x, 16, w))(x), ln_ref(x, w))
    close(jax.vmap(jax.grad(lambda x: cj.rms_norm(x, 16, w).sum() ** 2))(x),
          jax.vmap(jax.grad(lambda x: rms_ref(x, w).sum() ** 2))(x), 1e-4)
    xb = x.astype(jnp.bfloat16)
    y = cj.rms_norm(xb, 16, w)
    assert y.dtype == jnp.bfloat16
    close(y.astype(jnp.float32), rms_ref(xb.astype(jnp.float32), w), 1e-2)


# ---- the XLA FFI route: cynorm's kernels on XLA's buffers ----------------------

import ml_dtypes  # noqa: E402

import cynorm  # noqa: E402

ffi = pytest.mark.skipif(not cj.route.startswith("xla_ffi"),
                         reason=f"cynorm.jax runs through callbacks here ({cj.route})")

DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]


def host(a):
    return np.asarray(a)


def cases(seed=0):
    """(x, weight, bias) in every dtype and parameter form cynorm.layer_norm takes."""
    rng = np.random.default_rng(seed)
    for dt in DTYPES:
        x = (rng.standard_normal((5, 3, 24)) * 3 + 1).astype(dt)
        for pdt in sorted({np.dtype(dt), np.dtype(np.float32)}, key=str):
            w = rng.standard_normal(24).astype(pdt)
            b = rng.standard_normal(24).astype(pdt)
            yield x, w, b


@ffi
def test_route_reports_the_ffi():
    assert "XLA FFI API 0." in cj.route


@ffi
@pytest.mark.parametrize("params", ["wb", "w", "b", ""])
def test_ffi_layer_norm_gives_cynorms_bits(params):
    for x, w, b in cases():
        w = w if "w" in params else None
        b = b if "b" in params else None
        y, mean, rstd = cynorm.layer_norm(x, 24, w, b, 1e-5)
        got = jax.jit(lambda x, w, b: cj._ln_forward(x, None, w, b, (24,), 1e-5))(x, w, b)
        for g, r in zip(got, (y, mean, rstd)):
            assert g.dtype == r.dtype and np.array_equal(host(g), r, equal_nan=True)
        dy = np.random.default_rng(1).standard_normal(x.shape).astype(x.dtype)
        want = cynorm.layer_norm_backward(dy, x, 24, mean, rstd, w, b,
                                          (True, w is not None, b is not None))
        _, vjp = jax.vjp(lambda x, w, b: cj.layer_norm(x, 24, w, b), x, w, b)
        for g, r in zip(jax.jit(vjp)(dy), want):
            assert (g is None) == (r is None)
            if r is not None:
                assert g.dtype == r.dtype and np.array_equal(host(g), r)


@ffi
@pytest.mark.parametrize("weighted", [True, False])
def test_ffi_rms_norm_gives_cynorms_bits(weighted):
    for x, w, _ in cases(2):
        w = w if weighted else None
        for eps in (None, 1e-3):
            y, rstd = cynorm.rms_norm(x, (3, 24), None if w is None else np.tile(w, (3, 1)), eps)
            w2 = None if w is None else np.tile(w, (3, 1))
            got = jax.jit(lambda x, w: cj._rms_forward(x, None, w, (3, 24), eps))(x, w2)
            assert np.array_equal(host(got[0]), y) and np.array_equal(host(got[1]), rstd)
            dy = np.random.default_rng(3).standard_normal(x.shape).astype(x.dtype)
            want = cynorm.rms_norm_backward(dy, x, (3, 24), rstd, w2, (True, w is not None))
            _, vjp = jax.vjp(lambda x, w: cj.rms_norm(x, (3, 24), w, eps), x, w2)
            for g, r in zip(vjp(dy), want):
                if r is not None:
                    assert g.dtype == r.dtype and np.array_equal(host(g), r)


@ffi
def test_ffi_float64_under_x64():
    enable_x64 = getattr(jax, "enable_x64", None)
    if enable_x64 is None:      # older JAX
        from jax.experimental import enable_x64
    x = np.random.default_rng(4).standard_normal((7, 33)) * 1e4 + 1e8
    w = np.linspace(-1, 1, 33)
    with enable_x64():
        y = jax.jit(lambda x, w: cj.layer_norm(x, 33, w, w))(x, w)
        g = jax.grad(lambda x: (cj.rms_norm(x, 33, w) ** 2).sum())(x)
    assert host(y).dtype == np.float64
    assert np.array_equal(host(y), cynorm.layer_norm(x, 33, w, w)[0])
    y, rstd = cynorm.rms_norm(x, 33, w)
    assert np.array_equal(host(g), cynorm.rms_norm_backward(2 * y, x, 33, rstd, w)[0])
    # the channel norms and weight norm too: float64 statistics, x's float64 bits
    x4 = x[:6].reshape(2, 3, 33)
    rm, rv = np.zeros(3), np.ones(3)
    with enable_x64():
        inst = jax.jit(lambda x, rm, rv: cj.instance_norm(x, None, None, rm, rv))(x4, rm, rv)
        wn = jax.jit(lambda v, g: cj.weight_norm(v, g, 1))(x, w)
    want = cynorm.instance_norm(x4, None, None, rm, rv)[0]
    assert host(inst[0]).dtype == np.float64 and np.array_equal(host(inst[0]), want)
    assert np.array_equal(host(inst[1]), rm) and np.array_equal(host(inst[2]), rv)
    assert np.array_equal(host(wn), cynorm.weight_norm(x, w, 1))
    # the running statistics' batch averages summed in the same order (one
    # channel, many instances: where a pairwise sum would round otherwise)
    for shape in ((16, 1, 4), (1000, 1, 3), (9, 2, 5)):
        x = np.random.default_rng(1).standard_normal(shape) * 3 + 10
        C = shape[1]
        rm, rv = np.full(C, 0.25), np.full(C, 1.5)
        with enable_x64():
            _, rm_j, rv_j = jax.jit(lambda x, a, b: cj.instance_norm(x, None, None, a, b, True,
                                                                     0.37))(x, rm, rv)
        cynorm.instance_norm(x, None, None, rm, rv, True, 0.37)
        assert np.array_equal(host(rm_j), rm) and np.array_equal(host(rv_j), rv)


def test_the_callback_route_gives_the_same_bits(monkeypatch):
    x, w, b = next(cases(5))
    gy = np.ones(x.shape, x.dtype)
    runs = []
    for use_ffi in (True, False):
        monkeypatch.setattr(cj, "_FFI", use_ffi and cj._FFI)
        y, vjp = jax.vjp(lambda x, w, b: cj.layer_norm(x, 24, w, b), x, w, b)
        r, rvjp = jax.vjp(lambda x, w: cj.rms_norm(x, 24, w), x, w)
        runs.append([host(a) for a in (y, *vjp(gy), r, *rvjp(gy))])
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


@ffi
def test_ffi_under_vmap_with_batched_parameters():
    x = data(4, 3, 16)
    ws = data(4, 16, seed=1)
    got = jax.jit(jax.vmap(lambda x, w: cj.layer_norm(x, 16, w, w)))(x, ws)
    want = np.stack([cynorm.layer_norm(host(x[i]), 16, host(ws[i]), host(ws[i]))[0]
                     for i in range(4)])
    assert np.array_equal(host(got), want)
    gw = jax.vmap(jax.grad(lambda x, w: (cj.rms_norm(x, 16, w) ** 2).sum(), 1))(x, ws)
    assert gw.shape == (4, 16)


@ffi
def test_row_norms_under_vmap_run_once_over_the_batch():
    # one custom call over every batch element's rows (a parameter set per
    # element where the parameters are batched), with the bits of a cynorm
    # call per element; gradients of a vmapped model and per-example ones
    rng = np.random.default_rng(21)
    xs = rng.standard_normal((6, 5, 16)).astype(np.float32)
    w, b = (rng.standard_normal(16).astype(np.float32) for _ in range(2))
    ws = rng.standard_normal((6, 16)).astype(np.float32)
    per = [cynorm.layer_norm(xs[i], 16, w, b) for i in range(6)]
    f = jax.jit(jax.vmap(lambda x: cj.layer_norm(x, 16, w, b)))
    assert np.array_equal(host(f(xs)), np.stack([p[0] for p in per]))
    assert str(jax.make_jaxpr(f)(xs)).count("ffi_call") == 1
    got = jax.jit(jax.vmap(lambda x, w: cj.rms_norm(x, 16, w)))(xs, ws)
    assert np.array_equal(host(got), np.stack([cynorm.rms_norm(xs[i], 16, ws[i])[0]
                                               for i in range(6)]))
    # nested vmaps, the parameters batched in the inner one only
    got = jax.vmap(jax.vmap(lambda x, w: cj.layer_norm(x, 16, w, w), (0, 0)), (0, None))(
        xs.reshape(2, 3, 5, 16), ws[:3])
    want = [cynorm.layer_norm(xs[3 * i + j], 16, ws[j], ws[j])[0] for i in range(2)
            for j in range(3)]
    assert np.array_equal(host(got).reshape(6, 5, 16), np.stack(want))
    # per-example gradients: each element's own sums
    gx, gw = jax.jit(jax.vmap(jax.grad(lambda x, w: (cj.layer_norm(x, 16, w, b) ** 2).sum(),
                                       (0, 1)), (0, None)))(xs, w)
    for i in range(6):
        want = cynorm.layer_norm_backward(2 * per[i][0], xs[i], 16, per[i][1], per[i][2], w, b)
        assert np.array_equal(host(gx[i]), want[0]) and np.array_equal(host(gw[i]), want[1])
    # the gradient of a vmapped model: the backward kernel once over all the
    # rows, the parameters' sums over the batch
    flat = xs.reshape(30, 16)
    y, mean, rstd = cynorm.layer_norm(flat, 16, w, b)
    loss = lambda w, b: (jax.vmap(lambda x: cj.layer_norm(x, 16, w, b))(xs) ** 2).sum()  # noqa
    got = jax.jit(jax.grad(loss, (0, 1)))(w, b)
    want = cynorm.layer_norm_backward(2 * y, flat, 16, mean, rstd, w, b)
    assert np.array_equal(host(got[0]), want[1]) and np.array_equal(host(got[1]), want[2])
    # the fused form with x shared and the residuals batched, and its gradient
    y, h = jax.vmap(lambda r: cj.add_rms_norm(xs[0], r, 16, w))(xs)
    assert np.array_equal(host(h), xs[0][None] + xs)
    gw = jax.grad(lambda w: sum((a ** 2).sum() for a in jax.vmap(
        lambda r: cj.add_rms_norm(xs[0], r, 16, w))(xs)))(w)
    gw_ref = jax.grad(lambda w: sum((a ** 2).sum() for a in jax.vmap(
        lambda r: add_rms_ref(xs[0], r, w))(xs)))(w)
    close(gw, gw_ref, 1e-4)


def test_row_norm_jacobians_match_the_formulas():
    x, w, b = data(3, 8), data(8, seed=1), data(8, seed=2)
    for jac in (jax.jacfwd, jax.jacrev):
        close(jac(lambda x: cj.layer_norm(x, 8, w, b))(x), jac(lambda x: ln_ref(x, w, b))(x),
              1e-4)
        close(jac(lambda w: cj.rms_norm(x, 8, w))(w), jac(lambda w: rms_ref(x, w))(w), 1e-4)
        close(jac(lambda x: cj.add_layer_norm(x, x, 8, w, b)[0])(x),
              jac(lambda x: ln_ref(2 * x, w, b))(x), 1e-4)


def test_empty_rows_and_empty_batches():
    assert cj.layer_norm(jnp.zeros((0, 8)), 8).shape == (0, 8)
    y = cj.rms_norm(jnp.ones((2, 0)), 0)
    assert y.shape == (2, 0)


def test_bad_arguments_raise_when_traced():
    x = data(2, 8)
    with pytest.raises(TypeError, match="x: float64, float32, bfloat16 or float16"):
        cj.layer_norm(jnp.ones((2, 8), jnp.int32), 8)
    with pytest.raises(ValueError, match=r"normalized_shape \(4,\) is not the trailing shape"):
        cj.layer_norm(x, 4)
    with pytest.raises(ValueError, match=r"weight: shape \(8,\) expected, got \(2, 8\)"):
        jax.jit(lambda x: cj.rms_norm(x, 8, x))(x)
    with pytest.raises(TypeError, match="bias must have dtype float32, got float16"):
        cj.layer_norm(x, 8, jnp.ones(8), jnp.ones(8, jnp.float16))


@ffi
def test_a_malformed_call_is_refused_by_the_handler():
    x = data(2, 8)
    call = jax.ffi.ffi_call("cynorm_layer_norm", (jax.ShapeDtypeStruct(x.shape, x.dtype),) * 3)
    with pytest.raises(Exception, match="cynorm.jax.layer_norm: the call lacks an attribute"):
        jax.block_until_ready(call(x))
    with pytest.raises(Exception, match="cynorm.jax.layer_norm: the results"):
        jax.block_until_ready(call(x, eps=np.float64(1e-5), n=np.int64(8), residual=np.int64(0),
                                   weight=np.int64(0), bias=np.int64(0)))


# ---- the residual add fused into the row norms --------------------------------

def add_ln_ref(x, r, w, b):
    return ln_ref(x + r, w, b), x + r


def add_rms_ref(x, r, w):
    return rms_ref(x + r, w), x + r


def fused_loss(f):
    """A loss reaching h through y and on its own."""
    def loss(*a):
        y, h = f(*a)
        return (y * jnp.linspace(-1, 2, y.size).reshape(y.shape)).sum() + (h * h).sum()
    return loss


@ffi
def test_ffi_fused_norms_give_cynorms_bits():
    for x, w, b in cases(7):
        r = np.random.default_rng(8).standard_normal(x.shape).astype(x.dtype)
        want = cynorm.add_layer_norm(x, r, 24, w, b, 1e-5)
        got = jax.jit(lambda x, r, w, b: cj._ln_forward(x, r, w, b, (24,), 1e-5))(x, r, w, b)
        for g, a in zip(got, want):
            assert g.dtype == a.dtype and np.array_equal(host(g), a, equal_nan=True)
        y, h = jax.jit(lambda x, r: cj.add_layer_norm(x, r, 24, w, b))(x, r)
        assert np.array_equal(host(y), want[0]) and np.array_equal(host(h), want[1])
        want = cynorm.add_rms_norm(x, r, 24, w)
        y, h = jax.jit(lambda x, r: cj.add_rms_norm(x, r, 24, w))(x, r)
        assert np.array_equal(host(y), want[0]) and np.array_equal(host(h), want[1])


@pytest.mark.parametrize("use_ffi", [True, False])
def test_fused_norms_gradients_are_the_norms_backward_plus_hs(use_ffi, monkeypatch):
    # the gradients of y and h: the norm's backward at h (its bits), plus
    # h's own gradient (XLA's add), on both routes, every dtype and
    # parameter form; with y or h unused, the other's gradient alone
    if use_ffi and not cj._FFI:
        pytest.skip(f"cynorm.jax runs through callbacks here ({cj.route})")
    monkeypatch.setattr(cj, "_FFI", use_ffi)
    rng = np.random.default_rng(9)
    for x, w, b in cases(3):
        r, gy, gh = (rng.standard_normal(x.shape).astype(x.dtype) for _ in range(3))
        y, h, mean, rstd = cynorm.add_layer_norm(x, r, 24, w, b)
        _, vjp = jax.vjp(lambda x, r, w, b: cj.add_layer_norm(x, r, 24, w, b), x, r, w, b)
        gx, gr, gw, gb = jax.jit(vjp)((gy, gh))
        want = cynorm.layer_norm_backward(gy, h, 24, mean, rstd, w, b)
        for got, ref in zip((gx, gr, gw, gb), (want[0] + gh, want[0] + gh, want[1], want[2])):
            assert got.dtype == ref.dtype and np.array_equal(host(got), ref)
        y, h, rstd = cynorm.add_rms_norm(x, r, 24, w)
        _, vjp = jax.vjp(lambda x, r, w: cj.add_rms_norm(x, r, 24, w), x, r, w)
        gx, gr, gw = jax.jit(vjp)((gy, gh))
        want = cynorm.rms_norm_backward(gy, h, 24, rstd, w)
        for got, ref in zip((gx, gr, gw), (want[0] + gh, want[0] + gh, want[1])):
            assert got.dtype == ref.dtype and np.array_equal(host(got), ref)
        # h unused: the norm's backward alone; y unused: h's gradient alone
        gx, _, gw = jax.grad(lambda x, r, w: (cj.add_rms_norm(x, r, 24, w)[0].astype(
            jnp.float32) * gy.astype(np.float32)).sum(), (0, 1, 2))(x, r, w)
        want = cynorm.rms_norm_backward(gy, h, 24, rstd, w)
        assert np.array_equal(host(gx), want[0]) and np.array_equal(host(gw), want[1])
        gx, _, gw = jax.grad(lambda x, r, w: cj.add_rms_norm(x, r, 24, w)[1].astype(
            jnp.float32).sum(), (0, 1, 2))(x, r, w)
        assert np.array_equal(host(gx), np.ones(x.shape, x.dtype))
        assert not np.any(host(gw))


def test_fused_norms_match_the_formulas_on_both_routes(monkeypatch):
    x, r, w, b = data(4, 6, 16), data(4, 6, 16, seed=1), data(16, seed=2), data(16, seed=3)
    tx, tr, tw, tb = (data(*a.shape, seed=10 + i) for i, a in enumerate((x, r, w, b)))
    for use_ffi in (True, False):
        monkeypatch.setattr(cj, "_FFI", use_ffi and cj._FFI)
        for ours, ref, primals, tangents in (
                (lambda x, r, w, b: cj.add_layer_norm(x, r, 16, w, b), add_ln_ref,
                 (x, r, w, b), (tx, tr, tw, tb)),
                (lambda x, r, w: cj.add_rms_norm(x, r, [16], w), add_rms_ref,
                 (x, r, w), (tx, tr, tw))):
            for g, want in zip(jax.jit(ours)(*primals), ref(*primals)):
                close(g, want)
            argnums = tuple(range(len(primals)))
            got = jax.jit(jax.grad(fused_loss(ours), argnums))(*primals)
            for g, want in zip(got, jax.grad(fused_loss(ref), argnums)(*primals)):
                close(g, want, 1e-4)
            out, tout = jax.jvp(ours, primals, tangents)
            rout, rtout = jax.jvp(ref, primals, tangents)
            for g, want in zip(tuple(out) + tuple(tout), tuple(rout) + tuple(rtout)):
                close(g, want, 1e-4)
            # under vmap, the parameters shared
            vy, vh = jax.vmap(ours, in_axes=(0, 0) + (None,) * (len(primals) - 2))(*primals)
            ry, rh = ref(*primals)
            close(vy, ry)
            close(vh, rh)


def test_fused_norms_without_parameters_and_in_bfloat16():
    x = data(3, 32).astype(jnp.bfloat16)
    r = data(3, 32, seed=1).astype(jnp.bfloat16)
    y, h = jax.jit(lambda x, r: cj.add_rms_norm(x, r, 32))(x, r)
    assert y.dtype == h.dtype == jnp.bfloat16
    assert np.array_equal(host(h), host(x + r))
    close(y, rms_ref((x + r).astype(jnp.float32)), 1e-2)
    y, h = cj.add_layer_norm(x, r, 32)
    close(y, ln_ref((x + r).astype(jnp.float32)), 2e-2)
    g = jax.grad(lambda x: cj.add_layer_norm(x, r, 32)[1].astype(jnp.float32).sum())(x)
    assert np.array_equal(host(g), np.ones(x.shape, np.float32))   # h's gradient alone


@pytest.mark.parametrize("name", ["add_rms_norm", "add_layer_norm"])
def test_fused_norms_refuse_second_derivatives_by_name(name):
    x, r = data(2, 8), data(2, 8, seed=1)

    def f(x):
        return getattr(cj, name)(x, r, 8)[0].sum()
    with pytest.raises(NotImplementedError, match=f"cynorm.jax.{name}: a derivative of a "):
        jax.hessian(f)(x)
    with pytest.raises(NotImplementedError, match=f"cynorm.jax.{name}: a derivative of a "):
        jax.jvp(jax.grad(f), (x,), (x,))


def test_fused_norms_bad_arguments_and_the_unfused_fallback():
    x = data(2, 8)
    with pytest.raises(ValueError, match="add_layer_norm: normalized_shape"):
        cj.add_layer_norm(x, x, 7)
    with pytest.raises(TypeError, match="add_rms_norm: x: float64, float32"):
        cj.add_rms_norm(x.astype(jnp.int32), x.astype(jnp.int32), 8)
    # a residual the kernel does not take (broadcast, another dtype): jax.numpy's
    # add, then the norm
    w = data(8, seed=1)
    for xi, r in ((x, data(1, 8, seed=2)), (x.astype(jnp.bfloat16), data(2, 8, seed=3))):
        y, h = jax.jit(lambda xi, r: cj.add_rms_norm(xi, r, 8, w))(xi, r)
        assert np.array_equal(host(h), host(xi + r))
        assert np.array_equal(host(y), host(cj.rms_norm(xi + r, 8, w)))
        y, h = cj.add_layer_norm(xi, r, 8, w, w)
        assert np.array_equal(host(y), host(cj.layer_norm(xi + r, 8, w, w)))


# ---- batch norm ------------------------------------------------------------------

BN_CASES = [(1, (4, 6, 5, 3)), (-1, (4, 5, 3, 6)), (1, (8, 6))]


def bn_args(dt, shape, axis, pdt=np.float32, seed=6):
    rng = np.random.default_rng(seed)
    C = shape[axis]
    x = (rng.standard_normal(shape) * 2 + 1).astype(dt)
    w, b, rm = (rng.standard_normal(C).astype(pdt) for _ in range(3))
    rv = (rng.random(C) + 0.5).astype(pdt)
    return x, w, b, rm, rv


def bn_ref(x, w, b, axis=1, eps=1e-5):
    axes = tuple(i for i in range(x.ndim) if i != axis % x.ndim)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    m = x.mean(axes, keepdims=True)
    y = (x - m) / jnp.sqrt(((x - m) ** 2).mean(axes, keepdims=True) + eps)
    return y * w.reshape(shape) + b.reshape(shape)


@ffi
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("axis,shape", BN_CASES)
@pytest.mark.parametrize("training", [True, False])
def test_ffi_batch_norm_gives_cynorms_bits(dt, axis, shape, training):
    for pdt in sorted({np.dtype(dt), np.dtype(np.float32)}, key=str):
        x, w, b, rm, rv = bn_args(dt, shape, axis, pdt)
        rm2, rv2 = rm.copy(), rv.copy()
        y, sm, si = cynorm.batch_norm(x, w, b, rm2, rv2, training, 0.1, 1e-5, axis)
        got = jax.jit(lambda *a: cj.batch_norm(*a, training, 0.1, 1e-5, axis))(x, w, b, rm, rv)
        for g, r in zip(got, (y, rm2, rv2)):
            assert g.dtype == r.dtype and np.array_equal(host(g), r)
        gy = np.random.default_rng(7).standard_normal(shape).astype(dt)
        want = cynorm.batch_norm_backward(gy, x, w, rm, rv, sm if training else None,
                                          si if training else None, training, 1e-5,
                                          (True, True, True), axis)
        _, vjp = jax.vjp(lambda x, w, b: cj.batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5,
                                                       axis)[0], x, w, b)
        for g, r in zip(jax.jit(vjp)(gy), want):
            assert g.dtype == r.dtype and np.array_equal(host(g), r)


def test_batch_norm_without_parameters_or_running_statistics(monkeypatch):
    x = data(6, 4, 5)
    for use_ffi in (True, False):
        monkeypatch.setattr(cj, "_FFI", use_ffi and cj._FFI)
        y, rm, rv = cj.batch_norm(x)
        assert rm is None and rv is None
        close(y, bn_ref(x, jnp.ones(4), jnp.zeros(4)))
        g = jax.grad(lambda x: (cj.batch_norm(x)[0] ** 3).sum())(x)
        close(g, jax.grad(lambda x: (bn_ref(x, jnp.ones(4), jnp.zeros(4)) ** 3).sum())(x), 1e-4)


def test_batch_norm_gradients_match_the_formula():
    x, w, b = data(5, 3, 7), data(3, seed=1), data(3, seed=2)

    def loss(f):
        return lambda x, w, b: (f(x, w, b) ** 3).sum()
    got = jax.jit(jax.grad(loss(lambda x, w, b: cj.batch_norm(x, w, b)[0]), (0, 1, 2)))(x, w, b)
    want = jax.grad(loss(bn_ref), (0, 1, 2))(x, w, b)
    for g, r in zip(got, want):
        close(g, r, 1e-4)


def test_batch_norm_callback_route_gives_the_same_bits(monkeypatch):
    x, w, b, rm, rv = bn_args(ml_dtypes.bfloat16, (4, 6, 5, 3), 1)
    gy = np.ones(x.shape, x.dtype)
    runs = []
    for use_ffi in (True, False):
        monkeypatch.setattr(cj, "_FFI", use_ffi and cj._FFI)
        out, vjp = jax.vjp(lambda x, w, b: cj.batch_norm(x, w, b, rm, rv), x, w, b)
        runs.append([host(a) for a in (*out, *vjp((gy, jnp.zeros(6), jnp.zeros(6))))])
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_batch_norm_under_vmap():
    x = data(3, 8, 4)
    got = jax.vmap(lambda x: cj.batch_norm(x)[0])(x)
    want = np.stack([cynorm.batch_norm(host(x[i]))[0] for i in range(3)])
    assert np.array_equal(host(got), want)


def test_batch_norm_bad_arguments_raise_when_traced():
    x = data(4, 3)
    with pytest.raises(ValueError, match="required when training=False"):
        cj.batch_norm(x, training=False)
    with pytest.raises(ValueError, match="expected more than 1 value per channel"):
        cj.batch_norm(data(1, 3))
    with pytest.raises(ValueError, match=r"running_var: shape \(3,\) expected"):
        cj.batch_norm(x, running_mean=jnp.zeros(3), running_var=jnp.ones(4))
    with pytest.raises(ValueError, match="pass running_mean and running_var together"):
        cj.batch_norm(x, running_mean=jnp.zeros(3))
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        cj.batch_norm(x, axis=2)
    with pytest.raises(TypeError, match="weight must have dtype float32, got float16"):
        cj.batch_norm(x, jnp.ones(3, jnp.float16))


# ---- group norm ------------------------------------------------------------------

GN_CASES = [(1, (2, 6, 5, 4)), (-1, (2, 5, 4, 6)), (1, (3, 6)), (-1, (2, 3, 3, 2, 6))]


@ffi
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("axis,shape", GN_CASES)
def test_ffi_group_norm_gives_cynorms_bits(dt, axis, shape):
    for pdt in sorted({np.dtype(dt), np.dtype(np.float32)}, key=str):
        x, w, b, _, _ = bn_args(dt, shape, axis, pdt, seed=8)
        y, mean, rstd = cynorm.group_norm(x, 3, w, b, 1e-5, axis)
        got = jax.jit(lambda x, w, b: cj._gn_forward(x, w, b, 3, 1e-5, axis))(x, w, b)
        for g, r in zip(got, (y, mean, rstd)):
            assert g.dtype == r.dtype and np.array_equal(host(g), r)
        gy = np.random.default_rng(9).standard_normal(shape).astype(dt)
        want = cynorm.group_norm_backward(gy, x, mean, rstd, w, 3, (True, True, True), axis)
        _, vjp = jax.vjp(lambda x, w, b: cj.group_norm(x, 3, w, b, 1e-5, axis), x, w, b)
        for g, r in zip(jax.jit(vjp)(gy), want):
            assert g.dtype == r.dtype and np.array_equal(host(g), r)


def gn_ref(x, G, w=None, b=None, eps=1e-5):
    N, C = x.shape[:2]
    g = x.reshape(N, G, -1)
    m = g.mean(-1, keepdims=True)
    y = ((g - m) / jnp.sqrt(((g - m) ** 2).mean(-1, keepdims=True) + eps)).reshape(x.shape)
    shape = (1, C) + (1,) * (x.ndim - 2)
    return y * (1 if w is None else w.reshape(shape)) + (0 if b is None else b.reshape(shape))


def test_group_norm_matches_the_formula_on_both_routes(monkeypatch):
    x, w, b = data(2, 6, 5), data(6, seed=1), data(6, seed=2)
    runs = []
    for use_ffi in (True, False):
        monkeypatch.setattr(cj, "_FFI", use_ffi and cj._FFI)
        y = jax.jit(lambda x, w, b: cj.group_norm(x, 2, w, b))(x, w, b)
        close(y, gn_ref(x, 2, w, b))
        loss = lambda f: lambda x, w, b: (f(x, w, b) ** 3).sum()     # noqa: E731
        got = jax.grad(loss(lambda x, w, b: cj.group_norm(x, 2, w, b)), (0, 1, 2))(x, w, b)
        want = jax.grad(loss(lambda x, w, b: gn_ref(x, 2, w, b)), (0, 1, 2))(x, w, b)
        for g, r in zip(got, want):
            close(g, r, 1e-4)
        close(cj.group_norm(x, 3), gn_ref(x, 3))
        runs.append([host(y)] + [host(g) for g in got])
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("axis", [-2, 2, -1])
def test_group_norm_axis_counts_from_either_end_as_numpys(axis):
    # (2, 5, 6): axis -2 is axis 1 (channels first); 2 and -1 are channels last
    x = data(2, 5, 6)
    want = cynorm.group_norm(np.asarray(x), 1, axis=axis)[0]
    got = jax.jit(lambda x: cj.group_norm(x, 1, axis=axis))(x)
    assert np.array_equal(host(got), want)


def test_group_norm_bad_arguments_raise_when_traced():
    x = data(2, 6, 5)
    # the messages of the NumPy op's checks
    with pytest.raises(ValueError, match=r"the channel count 6 must be divisible by num_groups \(4\)"):
        cj.group_norm(x, 4)
    with pytest.raises(ValueError, match="num_groups must be >= 1, got 0"):
        cj.group_norm(x, 0)
    for axis in (0, 3, -4):
        with pytest.raises(ValueError, match="axis must be 1 .channels first. or -1"):
            cj.group_norm(x, 2, axis=axis)
    with pytest.raises(ValueError, match=r"weight: shape \(6,\) expected, got \(5,\)"):
        cj.group_norm(x, 2, jnp.ones(5))


# ---- instance norm ---------------------------------------------------------------

IN_CASES = [(1, (2, 6, 5, 4)), (-1, (2, 5, 4, 6)), (1, (3, 6, 7)), (-1, (2, 3, 3, 2, 6))]


@ffi
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("axis,shape", IN_CASES)
@pytest.mark.parametrize("use_input_stats,running", [(True, False), (True, True),
                                                     (False, True)])
def test_ffi_instance_norm_gives_cynorms_bits(dt, axis, shape, use_input_stats, running):
    for pdt in sorted({np.dtype(dt), np.dtype(np.float32)}, key=str):
        x, w, b, rm, rv = bn_args(dt, shape, axis, pdt, seed=10)
        rm, rv = (rm, rv) if running else (None, None)
        rm2, rv2 = (None, None) if rm is None else (rm.copy(), rv.copy())
        y, mean, rstd = cynorm.instance_norm(x, w, b, rm2, rv2, use_input_stats, 0.3, 1e-5,
                                             axis)
        got = jax.jit(lambda *a: cj.instance_norm(*a, use_input_stats, 0.3, 1e-5, axis))(
            x, w, b, rm, rv)
        for g, r in zip(got, (y, rm2, rv2)):
            assert (g is None) == (r is None)
            if r is not None:
                assert g.dtype == r.dtype and np.array_equal(host(g), r)
        # the saved statistics, and the gradients from cynorm's backward kernels
        saved = jax.jit(lambda *a: cj._in_forward(*a, use_input_stats, 0.3, 1e-5, axis)[3:])(
            x, w, b, rm, rv)
        for g, r in zip(saved, (mean, rstd)):
            assert g.dtype == r.dtype and np.array_equal(host(g), r)
        gy = np.random.default_rng(11).standard_normal(shape).astype(dt)
        want = cynorm.instance_norm_backward(gy, x, mean, rstd, w, use_input_stats,
                                             (True, True, True), axis)
        _, vjp = jax.vjp(lambda x, w, b: cj.instance_norm(x, w, b, rm, rv, use_input_stats,
                                                          0.3, 1e-5, axis)[0], x, w, b)
        for g, r in zip(jax.jit(vjp)(gy), want):
            assert g.dtype == r.dtype and np.array_equal(host(g), r)


def test_instance_norm_matches_the_formulas_on_both_routes(monkeypatch):
    x, w, b = data(2, 6, 5), data(6, seed=1), data(6, seed=2)
    rm, rv = data(6, seed=3), jnp.abs(data(6, seed=4)) + 0.5
    ref = lambda x, w, b: gn_ref(x, 6, w, b)                             # noqa: E731
    eval_ref = lambda x, w, b: ((x - rm[:, None]) / jnp.sqrt(rv[:, None] + 1e-5)  # noqa
                                * w[:, None] + b[:, None])
    loss = lambda f: lambda x, w, b: (f(x, w, b) ** 3).sum()             # noqa: E731
    runs = []
    for use_ffi in (True, False):
        monkeypatch.setattr(cj, "_FFI", use_ffi and cj._FFI)
        run = []
        for use_input_stats, want_f in ((True, ref), (False, eval_ref)):
            f = lambda x, w, b: cj.instance_norm(x, w, b, rm, rv, use_input_stats)[0]  # noqa
            y = jax.jit(f)(x, w, b)
            close(y, want_f(x, w, b))
            got = jax.grad(loss(f), (0, 1, 2))(x, w, b)
            want = jax.grad(loss(want_f), (0, 1, 2))(x, w, b)
            for g, r in zip(got, want):
                close(g, r, 1e-4)
            run += [host(y)] + [host(g) for g in got]
        # the running statistics: the batch's average of the instances'
        # mean and unbiased variance, as torch
        _, new_rm, new_rv = cj.instance_norm(x, w, b, rm, rv, momentum=0.25)
        close(new_rm, 0.75 * rm + 0.25 * x.mean(2).mean(0))
        close(new_rv, 0.75 * rv + 0.25 * x.var(2, ddof=1).mean(0))
        y, none_m, none_v = cj.instance_norm(x)
        assert none_m is None and none_v is None
        close(y, gn_ref(x, 6))
        runs.append(run + [host(new_rm), host(new_rv), host(y)])
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_instance_norm_under_vmap_and_with_no_tangent_for_the_running_statistics():
    x = data(3, 2, 4, 5)
    got = jax.vmap(lambda x: cj.instance_norm(x)[0])(x)
    want = np.stack([cynorm.instance_norm(host(x[i]))[0] for i in range(3)])
    assert np.array_equal(host(got), want)
    rm, rv = jnp.zeros(4), jnp.ones(4)
    _, (ty, trm, trv) = jax.jvp(lambda x: cj.instance_norm(x[0], None, None, rm, rv), (x,),
                                (jnp.ones_like(x),))
    assert np.all(host(trm) == 0) and np.all(host(trv) == 0) and ty.shape == x.shape[1:]


def test_instance_norm_empty_and_bad_arguments():
    y, rm, rv = cj.instance_norm(jnp.zeros((0, 3, 4)), running_mean=jnp.zeros(3),
                                 running_var=jnp.ones(3))
    assert y.shape == (0, 3, 4) and np.array_equal(host(rv), np.ones(3, np.float32))
    x = data(2, 3, 4)
    with pytest.raises(ValueError, match="cynorm.jax.instance_norm: running_mean and "
                                         "running_var are required"):
        cj.instance_norm(x, use_input_stats=False)
    with pytest.raises(ValueError, match="pass running_mean and running_var together"):
        cj.instance_norm(x, running_var=jnp.ones(3))
    with pytest.raises(ValueError, match="more than 1 spatial position"):
        cj.instance_norm(data(2, 3, 1), running_mean=jnp.zeros(3), running_var=jnp.ones(3))
    with pytest.raises(ValueError, match=r"instance_norm: running_mean: shape \(3,\) expected"):
        cj.instance_norm(x, running_mean=jnp.zeros(4), running_var=jnp.ones(3))
    with pytest.raises(ValueError, match="cynorm.jax.instance_norm: axis must be 1"):
        cj.instance_norm(x, axis=0)
    with pytest.raises(TypeError, match="instance_norm: weight must have dtype float32"):
        cj.instance_norm(x, jnp.ones(3, jnp.float16))


# ---- weight norm -----------------------------------------------------------------

WN_CASES = [((6, 5, 4), 0), ((6, 5, 4), 1), ((6, 5, 4), -1), ((6, 5, 4), None),
            ((300, 7), 1), ((3, 2000), 0)]


@ffi
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape,dim", WN_CASES)
def test_ffi_weight_norm_gives_cynorms_bits(dt, shape, dim):
    rng = np.random.default_rng(12)
    v = rng.standard_normal(shape).astype(dt)
    D = 1 if dim is None else shape[dim]
    kept = [1] * len(shape) if dim is None else [D if i == dim % len(shape) else 1
                                                 for i in range(len(shape))]
    for pdt in sorted({np.dtype(dt), np.dtype(np.float32)}, key=str):
        for g in (rng.standard_normal(D).astype(pdt), rng.standard_normal(kept).astype(pdt)):
            w, norm = cynorm.weight_norm_interface(v, g, dim)
            got = jax.jit(lambda v, g: cj.weight_norm(v, g, dim))(v, g)
            assert got.dtype == w.dtype and np.array_equal(host(got), w)
            gw = rng.standard_normal(shape).astype(dt)
            want = cynorm.weight_norm_backward(gw, v, g, norm, dim)
            _, vjp = jax.vjp(lambda v, g: cj.weight_norm(v, g, dim), v, g)
            for a, r in zip(jax.jit(vjp)(gw), want):
                assert a.dtype == r.dtype and a.shape == r.shape
                assert np.array_equal(host(a), r)


def wn_ref(v, g, dim):
    axes = tuple(i for i in range(v.ndim) if i != dim % v.ndim)
    shape = [1] * v.ndim
    shape[dim] = v.shape[dim]
    return v * g.reshape(shape) / jnp.sqrt((v * v).sum(axes, keepdims=True))


def test_weight_norm_matches_the_formula_on_both_routes(monkeypatch):
    v, g = data(8, 3, 5), data(8, seed=1)
    loss = lambda f: lambda v, g: (f(v, g) ** 3).sum()        # noqa: E731
    runs = []
    for use_ffi in (True, False):
        monkeypatch.setattr(cj, "_FFI", use_ffi and cj._FFI)
        w = jax.jit(lambda v, g: cj.weight_norm(v, g))(v, g)
        close(w, wn_ref(v, g, 0))
        got = jax.grad(loss(cj.weight_norm), (0, 1))(v, g)
        want = jax.grad(loss(lambda v, g: wn_ref(v, g, 0)), (0, 1))(v, g)
        for a, r in zip(got, want):
            close(a, r, 1e-4)
        whole = cj.weight_norm(v, jnp.float32(2.0), None)
        close(whole, 2.0 * v / jnp.sqrt((v * v).sum()))
        runs.append([host(w), host(whole)] + [host(a) for a in got])
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_weight_norm_under_vmap_and_empty():
    v, g = data(3, 4, 6), data(3, 4, seed=1)
    got = jax.vmap(lambda v, g: cj.weight_norm(v, g, 0))(v, g)
    want = np.stack([cynorm.weight_norm(host(v[i]), host(g[i]), 0) for i in range(3)])
    assert np.array_equal(host(got), want)
    assert cj.weight_norm(jnp.zeros((4, 0)), jnp.ones(4)).shape == (4, 0)


def test_weight_norm_bad_arguments_raise_when_traced():
    v = data(4, 3)
    with pytest.raises(TypeError, match="cynorm.jax.weight_norm: v: float64, float32"):
        cj.weight_norm(jnp.ones((4, 3), jnp.int32), jnp.ones(4))
    with pytest.raises(ValueError, match="dim 2 is out of range for v of 2 dimensions"):
        cj.weight_norm(v, jnp.ones(4), 2)
    with pytest.raises(ValueError, match=r"g: one value per index of v's dim expected "
                                         r"\(shape \(4,\) or \(4, 1\)\), got \(3,\)"):
        cj.weight_norm(v, jnp.ones(3))
    with pytest.raises(ValueError, match=r"got \(2,\)"):
        cj.weight_norm(v, jnp.ones(2), None)
    with pytest.raises(TypeError, match="g must have dtype float32, got float16"):
        cj.weight_norm(v, jnp.ones(4, jnp.float16))


@ffi
def test_malformed_instance_and_weight_norm_calls_are_refused_by_the_handlers():
    x = data(2, 3, 4)
    s = jax.ShapeDtypeStruct
    attrs = dict(n=np.int64(2), c=np.int64(3), hw=np.int64(4), groups=np.int64(3),
                 last=np.int64(0), eps=np.float64(1e-5), weight=np.int64(0), bias=np.int64(0),
                 momentum=np.float64(0.1), running=np.int64(0))
    call = jax.ffi.ffi_call("cynorm_instance_norm", (s(x.shape, x.dtype), s((2, 3), x.dtype),
                                                     s((2, 3), x.dtype)))
    with pytest.raises(Exception, match="cynorm.jax.instance_norm: the call lacks an attribute"):
        jax.block_until_ready(call(x, **attrs))
    # normalizing with running statistics that were not passed
    with pytest.raises(Exception, match="its running statistics are missing"):
        jax.block_until_ready(call(x, use_input_stats=np.int64(0), **attrs))
    v = data(4, 3)
    call = jax.ffi.ffi_call("cynorm_weight_norm", (s(v.shape, v.dtype), s((4,), v.dtype)))
    with pytest.raises(Exception, match="cynorm.jax.weight_norm: the call lacks an attribute"):
        jax.block_until_ready(call(v, jnp.ones(4)))
    with pytest.raises(Exception, match="cynorm.jax.weight_norm: g and norm: d values"):
        jax.block_until_ready(call(v, jnp.ones(4, jnp.float16), a=np.int64(1), d=np.int64(4),
                                   b=np.int64(3)))


def test_static_arguments_are_checked_as_cynorm_checks_them():
    x = data(2, 3, 4)
    bad = [
        (lambda: cj.layer_norm(x, 4, eps=-1.0), ValueError, "layer_norm: eps must be >= 0"),
        (lambda: cj.layer_norm(x, 4.5), TypeError, "layer_norm: normalized_shape must be an int"),
        (lambda: cj.rms_norm(x, (4,), eps=float("nan")), ValueError, "rms_norm: eps must be"),
        (lambda: cj.add_rms_norm(x, x, 4, eps="a"), TypeError, "add_rms_norm: eps must be"),
        (lambda: cj.add_layer_norm(x, x, None), TypeError, "add_layer_norm: normalized_shape"),
        (lambda: cj.batch_norm(x, training=1), TypeError, "batch_norm: training must be a bool"),
        (lambda: cj.batch_norm(x, momentum=float("inf")), ValueError,
         "batch_norm: momentum must be finite"),
        (lambda: cj.group_norm(x, 1.5), TypeError, "group_norm: num_groups must be an int"),
        (lambda: cj.group_norm(x, 3, axis=1.0), TypeError, "group_norm: axis must be an int"),
        (lambda: cj.instance_norm(x, eps=-1.0), ValueError, "instance_norm: eps must be >= 0"),
        (lambda: cj.instance_norm(x, momentum=float("nan")), ValueError,
         "instance_norm: momentum must be finite"),
        (lambda: cj.instance_norm(x, use_input_stats="no"), TypeError,
         "instance_norm: use_input_stats must be a bool"),
        (lambda: cj.weight_norm(x, jnp.ones(3), 1.7), TypeError,
         "weight_norm: dim must be an int or None"),
        (lambda: cj.weight_norm(x, jnp.ones(3), True), TypeError, "weight_norm: dim must be"),
    ]
    for call, error, message in bad:
        with pytest.raises(error, match=message):
            call()
    # NumPy integers and bools are taken, as by cynorm's NumPy API
    cj.layer_norm(x, np.int64(4), eps=0)
    cj.instance_norm(x, use_input_stats=np.bool_(True), axis=np.int32(1))


@pytest.mark.parametrize("name", ["add_rms_norm", "add_layer_norm"])
def test_fused_16bit_tangents_are_the_same_eagerly_and_under_jit(name):
    # h's tangent tx + tr rounded to x's dtype under jit too (XLA would keep
    # a bfloat16 sum in float32 where it feeds y's float32 tangent)
    rng = np.random.default_rng(5)
    x, r, tx, tr = (jnp.asarray(rng.standard_normal((8, 8)).astype(np.float32)).astype(
        jnp.bfloat16) for _ in range(4))
    w = jnp.ones(8)

    def f(x, r):
        return getattr(cj, name)(x, r, 8, w)
    eager = jax.jvp(f, (x, r), (tx, tr))[1]
    jitted = jax.jit(lambda *a: jax.jvp(f, a[:2], a[2:])[1])(x, r, tx, tr)
    for a, b in zip(eager, jitted):
        assert np.array_equal(host(a), host(b))


@ffi
def test_a_shared_parameter_under_vmap_takes_one_kernel_call_over_the_rows():
    # vmap broadcasts a shared weight to every element; the handler sees
    # identical sets and runs one call: the bits of one call over all rows
    xs = data(8, 4, 16)
    w = data(16, seed=1)
    got = jax.jit(jax.vmap(lambda x: cj.rms_norm(x, 16, w)))(xs)
    flat = cynorm.rms_norm(host(xs).reshape(32, 16), 16, host(w))[0]
    assert np.array_equal(host(got).reshape(32, 16), flat)
    # sets that differ in one bit take a call each
    ws = jnp.tile(w, (8, 1)).at[3, 5].set(w[5] * 2)
    got = jax.vmap(lambda x, w: cj.rms_norm(x, 16, w))(xs, ws)
    assert np.array_equal(host(got[3]), cynorm.rms_norm(host(xs[3]), 16, host(ws[3]))[0])
    assert np.array_equal(host(got[2]), cynorm.rms_norm(host(xs[2]), 16, host(w))[0])


# ---- derivatives in the running statistics that normalize (eval) -----------

def _eval_ref(x, w, b, rm, rv, axis, eps=1e-5):
    shape = [1] * x.ndim
    shape[axis] = -1
    return ((x - rm.reshape(shape)) / jnp.sqrt(rv.reshape(shape) + eps) * w.reshape(shape)
            + b.reshape(shape))


@pytest.mark.parametrize("op", ["batch_norm", "instance_norm"])
@pytest.mark.parametrize("axis", [1, -1])
def test_eval_derivatives_in_the_running_statistics(op, axis):
    # y = (x - rm) / sqrt(rv + eps) * w + b depends on the running
    # statistics: their gradients and tangents are the formula's (they were
    # zeros); only the returned statistics carry none
    x = data(6, 4, 5) if axis == 1 else data(6, 5, 4)
    w, b = 1 + data(4, seed=1), data(4, seed=2)
    rm, rv = data(4, seed=3), 0.5 + jnp.abs(data(4, seed=4))
    g = 1 + data(*x.shape, seed=5)

    def y(x, w, b, rm, rv):
        if op == "batch_norm":
            return cj.batch_norm(x, w, b, rm, rv, training=False, axis=axis)[0]
        return cj.instance_norm(x, w, b, rm, rv, use_input_stats=False, axis=axis)[0]

    args = (x, w, b, rm, rv)
    def ref(*a):
        return _eval_ref(*a, axis % 3)

    want = jax.grad(lambda *a: (ref(*a) * g).sum(), argnums=range(5))(*args)
    for f in (y, jax.jit(y)):
        got = jax.grad(lambda *a: (f(*a) * g).sum(), argnums=range(5))(*args)
        for have, expected in zip(got, want):
            close(have, expected, 1e-5)
    # each statistic alone (the other's tangent a symbolic zero), forward mode
    close(jax.grad(lambda rm: (y(x, w, b, rm, rv) * g).sum())(rm), want[3], 1e-5)
    close(jax.grad(lambda rv: (y(x, w, b, rm, rv) * g).sum())(rv), want[4], 1e-5)
    tangents = tuple(data(*a.shape, seed=10 + i) for i, a in enumerate(args))
    close(jax.jvp(y, args, tangents)[1], jax.jvp(ref, args, tangents)[1], 1e-5)
    # per-example gradients in the statistics under vmap
    xs = jnp.stack([x, 2 * x])
    per = jax.vmap(jax.grad(lambda rv, x: (y(x, w, b, rm, rv) * g).sum()), in_axes=(None, 0))
    ref_per = jax.vmap(jax.grad(lambda rv, x: (ref(x, w, b, rm, rv) * g).sum()),
                       in_axes=(None, 0))
    close(per(rv, xs), ref_per(rv, xs), 1e-5)
    # the returned statistics carry no derivative
    if op == "batch_norm":
        f = lambda rm: cj.batch_norm(x, w, b, rm, rv, training=False, axis=axis)[1].sum()  # noqa: E731
    else:
        f = lambda rm: cj.instance_norm(x, w, b, rm, rv, use_input_stats=False,  # noqa: E731
                                        axis=axis)[1].sum()
    assert not np.any(np.asarray(jax.grad(f)(rm)))


def test_training_statistics_are_not_differentiated_in_the_running_ones():
    # in training y does not read the running statistics: zero gradient
    x, rm, rv = data(6, 4, 5), data(4, seed=3), 1 + jnp.abs(data(4, seed=4))
    gb = jax.grad(lambda rm: cj.batch_norm(x, None, None, rm, rv, training=True)[0].sum())(rm)
    gi = jax.grad(lambda rv: cj.instance_norm(x, None, None, rm, rv)[0].sum())(rv)
    assert not np.any(np.asarray(gb)) and not np.any(np.asarray(gi))


def test_adapter_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"add_layer_norm: residual of shape \(4, 7\) does not "
                                         r"broadcast with x of shape \(4, 8\)"):
        cj.add_layer_norm(jnp.ones((4, 8)), jnp.ones((4, 7)), 8)
    with pytest.raises(ValueError, match="add_rms_norm: residual of shape"):
        cj.add_rms_norm(jnp.ones((4, 8)), jnp.ones((3, 8)), 8)
    # an empty normalized shape, as the NumPy ops and torch
    for f in (lambda: cj.layer_norm(jnp.ones((4, 8)), ()), lambda: cj.rms_norm(jnp.ones(3), []),
              lambda: cj.add_rms_norm(jnp.ones(3), jnp.ones(3), ())):
        with pytest.raises(ValueError, match="normalized_shape must name at least one axis"):
            f()
    # a broadcast residual: jax.numpy's add, then the norm, in its shape
    y, h = cj.add_layer_norm(jnp.ones(8), data(3, 8), 8)
    assert y.shape == h.shape == (3, 8)
    # a traced static argument: the message says how to keep it static
    with pytest.raises(TypeError, match=r"num_groups is static: under jax.jit pass it as a "
                                        r"Python value, through static_argnames=\('num_groups',\)"):
        jax.jit(cj.group_norm)(data(2, 4, 3), 2)
    with pytest.raises(TypeError, match="training is static"):
        jax.jit(cj.batch_norm)(data(4, 3), None, None, jnp.zeros(3), jnp.ones(3), False)
    # (N, C) features for instance norm: torch.nn.functional's error
    for x in (data(2, 4), data(2, 4, 1), data(2, 1, 1, 4)):
        with pytest.raises(ValueError, match="more than 1 spatial position per instance with "
                                             "use_input_stats=True"):
            cj.instance_norm(x, axis=-1 if x.shape[-1] == 4 and x.ndim == 4 else 1)
    # with the running statistics, one position per instance normalizes
    y, _, _ = cj.instance_norm(data(2, 4, 1), None, None, jnp.zeros(4), jnp.ones(4),
                               use_input_stats=False)
    assert y.shape == (2, 4, 1)
