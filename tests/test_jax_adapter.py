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
