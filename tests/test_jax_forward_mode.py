"""cynorm.jax in forward mode: jax.jvp / jax.linearize of every op against
the jax.numpy formulas' (float32) and against cynorm.jvp's in float64,
under jit and vmap; reverse mode still on cynorm's backward kernels (it is
the transpose of the same rule); second derivatives refused."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
cj = pytest.importorskip("cynorm.jax")

import ml_dtypes  # noqa: E402

import cynorm  # noqa: E402


def rand(shape, seed, dt=np.float32, scale=1.0, shift=0.0):
    a = np.random.default_rng(seed).standard_normal(shape) * scale + shift
    return a.astype(dt)


def ln_ref(x, w, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * w + b


def rms_ref(x, w, eps=None):
    eps = float(np.finfo(np.float32).eps) if eps is None else eps
    return x / jnp.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w


def bn_ref(x, w, b, rm, rv, training, axis, eps=1e-5):
    axes = tuple(i for i in range(x.ndim) if i != axis % x.ndim)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    if training:
        m = x.mean(axes, keepdims=True)
        v = ((x - m) ** 2).mean(axes, keepdims=True)
    else:
        m, v = rm.reshape(shape), rv.reshape(shape)
    return (x - m) / jnp.sqrt(v + eps) * w.reshape(shape) + b.reshape(shape)


def gn_ref(x, G, w, b, axis, eps=1e-5):
    if axis == -1:                      # channels last: as channels first, and back
        return jnp.moveaxis(gn_ref(jnp.moveaxis(x, -1, 1), G, w, b, 1, eps), 1, -1)
    N, C = x.shape[:2]
    g = x.reshape(N, G, -1)
    m = g.mean(-1, keepdims=True)
    y = ((g - m) / jnp.sqrt(((g - m) ** 2).mean(-1, keepdims=True) + eps)).reshape(x.shape)
    shape = (1, C) + (1,) * (x.ndim - 2)
    return y * w.reshape(shape) + b.reshape(shape)


def wn_ref(v, g, dim):
    axes = tuple(i for i in range(v.ndim) if i != dim % v.ndim)
    shape = [1] * v.ndim
    shape[dim] = v.shape[dim]
    return v * g.reshape(shape) / jnp.sqrt((v * v).sum(axes, keepdims=True))


RM, RV = rand(6, 9), np.abs(rand(6, 10)) + 0.5


def bn_op(training):
    """OPS' entry of batch norm on (N, C, L) with running statistics."""
    return (lambda x, w, b: cj.batch_norm(x, w, b, RM, RV, training)[0],
            lambda x, w, b: bn_ref(x, w, b, RM, RV, training, 1),
            lambda x, w, b, t: cynorm.jvp(cynorm.batch_norm,
                                          (x, w, b, RM.astype(w.dtype), RV.astype(w.dtype),
                                           training),
                                          (t[0], t[1], t[2], None, None, None)),
            (4, 6, 5), (6,))


# name -> (cynorm.jax call, jnp formula, cynorm.jvp call for the host bits,
#          x's shape, parameter shape); f(x, w, b) with w, b differentiable
OPS = {
    "layer_norm": (lambda x, w, b: cj.layer_norm(x, 16, w, b), ln_ref,
                   lambda x, w, b, t: cynorm.jvp(cynorm.layer_norm, (x, (16,), w, b, 1e-5),
                                                 (t[0], None, t[1], t[2], None)),
                   (3, 5, 16), (16,)),
    "rms_norm": (lambda x, w, b: cj.rms_norm(x, 16, w), lambda x, w, b: rms_ref(x, w),
                 lambda x, w, b, t: cynorm.jvp(cynorm.rms_norm, (x, (16,), w, None),
                                               (t[0], None, t[1], None)),
                 (3, 5, 16), (16,)),
    "batch_norm_training": bn_op(True),
    "batch_norm_eval": bn_op(False),
    "batch_norm_channels_last": (
        lambda x, w, b: cj.batch_norm(x, w, b, training=True, axis=-1)[0],
        lambda x, w, b: bn_ref(x, w, b, None, None, True, -1),
        lambda x, w, b, t: cynorm.jvp(cynorm.batch_norm, (x, w, b, None, None, True, 0.1, 1e-5,
                                                          -1),
                                      (t[0], t[1], t[2], None, None, None, None, None, None)),
        (4, 5, 6), (6,)),
    "group_norm": (lambda x, w, b: cj.group_norm(x, 3, w, b), lambda x, w, b: gn_ref(x, 3, w, b, 1),
                   lambda x, w, b, t: cynorm.jvp(cynorm.group_norm, (x, 3, w, b),
                                                 (t[0], None, t[1], t[2])),
                   (2, 6, 7), (6,)),
    "group_norm_channels_last": (
        lambda x, w, b: cj.group_norm(x, 3, w, b, axis=-1),
        lambda x, w, b: gn_ref(x, 3, w, b, -1),
        lambda x, w, b, t: cynorm.jvp(cynorm.group_norm, (x, 3, w, b, 1e-5, -1),
                                      (t[0], None, t[1], t[2], None, None)),
        (2, 7, 6), (6,)),
    # instance norm: group norm with a group per channel, or (without
    # use_input_stats) the running statistics' affine map
    "instance_norm": (lambda x, w, b: cj.instance_norm(x, w, b)[0],
                      lambda x, w, b: gn_ref(x, 6, w, b, 1),
                      lambda x, w, b, t: cynorm.jvp(cynorm.instance_norm, (x, w, b),
                                                    (t[0], t[1], t[2])),
                      (2, 6, 7), (6,)),
    "instance_norm_channels_last": (
        lambda x, w, b: cj.instance_norm(x, w, b, axis=-1)[0],
        lambda x, w, b: gn_ref(x, 6, w, b, -1),
        lambda x, w, b, t: cynorm.jvp(cynorm.instance_norm, (x, w, b, None, None, True, 0.1,
                                                             1e-5, -1),
                                      (t[0], t[1], t[2], None, None, None, None, None, None)),
        (2, 4, 3, 6), (6,)),
    "instance_norm_eval": (
        lambda x, w, b: cj.instance_norm(x, w, b, RM, RV, use_input_stats=False)[0],
        lambda x, w, b: bn_ref(x, w, b, RM, RV, False, 1),
        lambda x, w, b, t: cynorm.jvp(cynorm.instance_norm,
                                      (x, w, b, RM.astype(w.dtype), RV.astype(w.dtype), False),
                                      (t[0], t[1], t[2], None, None, None)),
        (2, 6, 7), (6,)),
    # weight norm: w = g * v / ||v|| (b unused), the norm over every axis but dim
    "weight_norm": (lambda x, w, b: cj.weight_norm(x, w, 0), lambda x, w, b: wn_ref(x, w, 0),
                    lambda x, w, b, t: (None, (cynorm.jvp(cynorm.weight_norm, (x, w, 0),
                                                          (t[0], t[1], None))[1],)),
                    (6, 5, 4), (6,)),
    "weight_norm_last_dim": (
        lambda x, w, b: cj.weight_norm(x, w, -1), lambda x, w, b: wn_ref(x, w, -1),
        lambda x, w, b, t: (None, (cynorm.jvp(cynorm.weight_norm, (x, w, -1),
                                              (t[0], t[1], None))[1],)),
        (4, 5, 6), (6,)),
}


def args(name, dt=np.float32, seed=0):
    _, _, _, xs, ps = OPS[name]
    pdt = np.float64 if dt == np.float64 else np.float32
    x, w, b = rand(xs, seed, dt, 2.0, 1.0), rand(ps, seed + 1, pdt), rand(ps, seed + 2, pdt)
    t = (rand(xs, seed + 3, dt), rand(ps, seed + 4, pdt), rand(ps, seed + 5, pdt))
    return (x, w, b), t


def close(a, b, tol=1e-4):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape
    assert np.abs(a - b).max() <= tol * max(1.0, np.abs(b).max())


@pytest.mark.parametrize("name", OPS)
def test_jvp_matches_the_formulas_jvp(name):
    f, ref = OPS[name][:2]
    primals, tangents = args(name)
    y, ty = jax.jvp(f, primals, tangents)
    y_ref, ty_ref = jax.jvp(ref, primals, tangents)
    close(y, y_ref)
    close(ty, ty_ref)
    # under jit, and through jax.linearize's linear function
    _, ty_jit = jax.jit(lambda p, t: jax.jvp(f, p, t))(primals, tangents)
    assert np.array_equal(np.asarray(ty_jit), np.asarray(ty))
    _, lin = jax.linearize(f, *primals)
    assert np.array_equal(np.asarray(lin(*tangents)), np.asarray(ty))


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("name", OPS)
def test_the_tangent_is_cynorm_jvps_to_rounding(name, dt):
    # cynorm.jvp's tangent of the same values in float64, within dt's
    # rounding (16-bit x: float32 parameters and tangents, as cynorm's ops
    # take them).  The FFI route's tangent is the backward kernel's
    # (float64 sums) plus XLA's fused arithmetic; the callback route's is
    # cynorm.jvp's on the same arrays, bit for bit
    f, _, host = OPS[name][:3]
    primals, tangents = args(name, dt, seed=4)
    _, ty = jax.jvp(f, primals, tangents)
    assert ty.dtype == dt
    if not cj.route.startswith("xla_ffi"):
        assert np.array_equal(np.asarray(ty), host(*primals, tangents)[1][0])
        return
    f64 = [np.asarray(a, np.float64) for a in primals + tangents]
    want = np.asarray(host(*f64[:3], f64[3:])[1][0])
    got = np.asarray(ty, np.float64)
    tol = (float(ml_dtypes.finfo(dt).eps) * np.abs(want)
           + 8 * float(np.finfo(np.float32).eps) * np.abs(want).max())
    assert np.all(np.abs(got - want) <= tol)


@pytest.mark.parametrize("name", ["layer_norm", "batch_norm_eval", "group_norm",
                                  "instance_norm", "instance_norm_eval", "weight_norm"])
def test_without_the_traced_rule_the_tangent_is_cynorm_jvps_bits(name, monkeypatch):
    # the route JAX without the XLA FFI takes: cynorm.jvp on the host
    from cynorm import _jax_forward
    for op, rule in list(_jax_forward._RULES.items()):
        monkeypatch.setitem(_jax_forward._RULES, op, rule._replace(traced=None))
    f, _, host = OPS[name][:3]
    primals, tangents = args(name, seed=6)
    _, ty = jax.jvp(f, primals, tangents)
    assert np.array_equal(np.asarray(ty), host(*primals, tangents)[1][0])


@pytest.mark.parametrize("name", OPS)
def test_jvp_under_vmap(name):
    f = OPS[name][0]
    batch = [args(name, seed=s) for s in (0, 10)]
    stack = [jnp.stack([np.asarray(b[k][i]) for b in batch]) for k in range(2) for i in range(3)]
    _, ty = jax.vmap(lambda *a: jax.jvp(f, a[:3], a[3:]))(*stack)
    for i, (p, t) in enumerate(batch):
        assert np.array_equal(np.asarray(ty[i]), np.asarray(jax.jvp(f, p, t)[1]))


@pytest.mark.parametrize("name", OPS)
def test_reverse_mode_is_the_transpose_on_the_backward_kernels(name):
    f, ref = OPS[name][:2]
    primals, _ = args(name, seed=2)

    def loss(g):
        return lambda *a: (g(*a) ** 3).sum()
    got = jax.grad(loss(f), (0, 1, 2))(*primals)
    want = jax.grad(loss(ref), (0, 1, 2))(*primals)
    for g, r in zip(got, want):
        close(g, r)
    if cj.route.startswith("xla_ffi"):
        text = str(jax.make_jaxpr(jax.grad(loss(f)))(*primals))
        assert "_backward" in text and "cynorm_tangent" not in text


def test_jvp_without_parameters_and_with_some_tangents_only():
    x, t = rand((3, 8), 1), rand((3, 8), 2)
    w = rand(8, 3)
    close(jax.jvp(lambda x: cj.layer_norm(x, 8), (x,), (t,))[1],
          jax.jvp(lambda x: ln_ref(x, 1.0, 0.0), (x,), (t,))[1])
    # the weight's tangent only
    tw = rand(8, 4)
    close(jax.jvp(lambda w: cj.rms_norm(x, 8, w), (w,), (tw,))[1],
          jax.jvp(lambda w: rms_ref(x, w), (w,), (tw,))[1])


def test_batch_norm_running_statistics_carry_no_tangent():
    (x, w, b), (tx, tw, tb) = args("batch_norm_training")
    _, (ty, trm, trv) = jax.jvp(lambda x: cj.batch_norm(x, w, b, RM, RV, True), (x,), (tx,))
    assert np.all(np.asarray(trm) == 0) and np.all(np.asarray(trv) == 0)
    assert trm.shape == RM.shape and ty.shape == x.shape


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "batch_norm_training", "group_norm",
                                  "instance_norm", "weight_norm"])
def test_second_derivatives_are_refused(name):
    f = OPS[name][0]
    primals, tangents = args(name)
    op = name.split("_training")[0]

    def loss(x):
        return (f(x, *primals[1:]) ** 2).sum()
    for second in (lambda: jax.hessian(loss)(primals[0]),
                   lambda: jax.jvp(jax.grad(loss), (primals[0],), (tangents[0],)),
                   lambda: jax.jvp(lambda x: jax.jvp(lambda x: f(x, *primals[1:]), (x,),
                                                     (tangents[0],))[1],
                                   (primals[0],), (tangents[0],))):
        with pytest.raises(NotImplementedError, match=f"cynorm.jax.{op}: a derivative of a "
                                                      "derivative"):
            second()
