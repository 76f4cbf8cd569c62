"""cynorm.jax inside jax.jit against XLA's own fused formula, side by side
in one process.

    python benchmarks/bench_jax_adapter.py [--threads 1] [--repeats 41] [--passes fwd,grad,jvp]
        [--ops layer_norm,rms_norm,add_layer_norm,add_rms_norm,batch_norm,group_norm,
               instance_norm,weight_norm]

For layer norm and RMS norm (with weight, and bias for layer norm) over
float32 and bfloat16 rows, their residual-fused forms (against XLA's
``h = x + r`` then the formula; the gradient and the tangent in x and the
parameters, through y and h), and batch norm in training (weight, bias and
running statistics; channels first and channels last), group norm (32
groups, both layouts), instance norm (both layouts, and a 3-D volume) and
weight norm (a linear and a convolution weight, dim 0), it times a jitted
forward, a jitted value-and-gradient (with respect to x and the
parameters) and a jitted jax.jvp (tangents for x and the parameters) of
each, and
prints the medians and XLA's time / cynorm.jax's (> 1: cynorm.jax faster).
The thread count is set for both (XLA: its intra-op pool, before JAX loads).
cynorm.jax.route says whether the calls are XLA FFI custom calls or
callbacks.

    python benchmarks/bench_jax_adapter.py --vmap [--passes fwd,grad,pex] [--ops ...]

times the same under jax.vmap, over batches of small elements (VMAPPED):
the vmapped forward, the value and gradient of a vmapped model's loss (in x
and the parameters, shared by the batch but for weight norm's) and
per-example gradients (jax.vmap of jax.grad), each also as cynorm.jax once
per element (jax.lax.map: a custom call per element, as a call that is not
batched runs) and as XLA's formula under the same transform.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

ROWS = [(8, 64), (512, 768), (4096, 768), (2048, 4096)]
# (shape, channel axis)
CHANNELS = [((8, 64, 14, 14), 1), ((32, 64, 28, 28), 1), ((32, 28, 28, 64), -1)]
GROUPS = [((2, 320, 32, 32), 1), ((2, 32, 32, 320), -1)]
INSTANCES = [((8, 64, 64, 64), 1), ((8, 64, 64, 64), -1), ((1, 32, 32, 64, 64), 1)]
WEIGHTS = [(4096, 1024), (256, 128, 3, 3)]
# --vmap: (op, batch size, an element's shape, channel axis)
VMAPPED = [("layer_norm", 64, (16, 768), -1), ("layer_norm", 16, (128, 768), -1),
           ("batch_norm", 8, (8, 64, 14, 14), 1), ("group_norm", 16, (1, 64, 32, 32), 1),
           ("group_norm", 16, (1, 32, 32, 64), -1), ("instance_norm", 16, (1, 32, 32, 32), 1),
           ("weight_norm", 8, (256, 128, 3, 3), 0)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--passes", default=None,
                    help="comma-separated: fwd, grad (forward and gradient), jvp; with --vmap "
                         "fwd, grad (of a vmapped model), pex (per-example gradients) "
                         "(default: all)")
    ap.add_argument("--vmap", action="store_true",
                    help="the ops under jax.vmap over batches of small elements")
    ap.add_argument("--ops", default="",
                    help="comma-separated op names (default: all); add_layer_norm, "
                         "add_rms_norm, batch_norm, group_norm, instance_norm, layer_norm, "
                         "rms_norm, weight_norm")
    args = ap.parse_args()
    known = ["fwd", "grad", "pex"] if args.vmap else ["fwd", "grad", "jvp"]
    passes = args.passes.split(",") if args.passes else known
    if not set(passes) <= set(known):
        ap.error(f"--passes takes {', '.join(known)}")
    if args.threads < 1:
        ap.error("--threads must be at least 1")
    # XLA reads its pool size once, when it loads
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_cpu_multi_thread_eigen={'true' if args.threads > 1 else 'false'}"
                               + f" intra_op_parallelism_threads={args.threads}")
    import jax
    import jax.numpy as jnp
    import numpy as np

    import cynorm
    import cynorm.jax as cj
    from _common import median_ms, time_interleaved

    cynorm.set_num_threads(args.threads)

    def ln_xla(x, w, b):
        x32 = x.astype(jnp.float32)
        m = x32.mean(-1, keepdims=True)
        r = jax.lax.rsqrt(jnp.square(x32 - m).mean(-1, keepdims=True) + 1e-5)
        return ((x32 - m) * r * w + b).astype(x.dtype)

    def rms_xla(x, w, b):
        x32 = x.astype(jnp.float32)
        r = jax.lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + 1.1920929e-07)
        return (x32 * r * w).astype(x.dtype)

    def add_xla(norm):
        def f(x, w, b, r):
            h = x + r
            return norm(h, w, b), h
        return f

    def bn_xla(axis):
        # training: the batch's statistics, and the running ones updated
        def f(x, w, b, rm, rv):
            ax = axis % x.ndim
            axes = tuple(i for i in range(x.ndim) if i != ax)
            shape = [1] * x.ndim
            shape[ax] = x.shape[ax]
            x32 = x.astype(jnp.float32)
            m = x32.mean(axes)
            v = jnp.square(x32 - m.reshape(shape)).mean(axes)
            y = (x32 - m.reshape(shape)) * jax.lax.rsqrt(v + 1e-5).reshape(shape)
            n = x.size // x.shape[ax]
            return ((y * w.reshape(shape) + b.reshape(shape)).astype(x.dtype),
                    0.9 * rm + 0.1 * m, 0.9 * rv + 0.1 * v * (n / (n - 1)))
        return f

    def bn_ours(axis):
        return lambda x, w, b, rm, rv: cj.batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5, axis)

    def gn_xla(axis):
        def f(x, w, b):
            x32 = x.astype(jnp.float32)
            if axis == -1:
                x32 = jnp.moveaxis(x32, -1, 1)
            g = x32.reshape(x.shape[0], 32, -1)
            m = g.mean(-1, keepdims=True)
            r = jax.lax.rsqrt(jnp.square(g - m).mean(-1, keepdims=True) + 1e-5)
            shape = (1, -1) + (1,) * (x.ndim - 2)
            y = ((g - m) * r).reshape(x32.shape) * w.reshape(shape) + b.reshape(shape)
            return (jnp.moveaxis(y, 1, -1) if axis == -1 else y).astype(x.dtype)
        return f

    def gn_ours(axis):
        return lambda x, w, b: cj.group_norm(x, 32, w, b, 1e-5, axis)

    def in_xla(axis):
        def f(x, w, b):
            x32 = x.astype(jnp.float32)
            axes = tuple(range(1, x.ndim - 1)) if axis == -1 else tuple(range(2, x.ndim))
            shape = (-1,) if axis == -1 else (-1,) + (1,) * (x.ndim - 2)
            m = x32.mean(axes, keepdims=True)
            r = jax.lax.rsqrt(jnp.square(x32 - m).mean(axes, keepdims=True) + 1e-5)
            return ((x32 - m) * r * w.reshape(shape) + b.reshape(shape)).astype(x.dtype)
        return f

    def in_ours(axis):
        return lambda x, w, b: cj.instance_norm(x, w, b, axis=axis)[0]

    def wn_xla(v, g, _):
        v32 = v.astype(jnp.float32)
        shape = (-1,) + (1,) * (v.ndim - 1)
        n = jnp.sqrt(jnp.square(v32).sum(tuple(range(1, v.ndim)), keepdims=True))
        return (v32 * (g.reshape(shape) / n)).astype(v.dtype)

    cases = []      # (op, ours, theirs, shape, channel axis)
    for shape in ROWS:
        cases.append(("layer_norm", lambda x, w, b: cj.layer_norm(x, x.shape[-1], w, b), ln_xla,
                      shape, -1))
    for shape in ROWS:
        cases.append(("rms_norm", lambda x, w, b: cj.rms_norm(x, x.shape[-1], w), rms_xla,
                      shape, -1))
    for shape in ROWS:
        cases.append(("add_layer_norm",
                      lambda x, w, b, r: cj.add_layer_norm(x, r, x.shape[-1], w, b),
                      add_xla(ln_xla), shape, -1))
    for shape in ROWS:
        cases.append(("add_rms_norm", lambda x, w, b, r: cj.add_rms_norm(x, r, x.shape[-1], w),
                      add_xla(rms_xla), shape, -1))
    for shape, axis in CHANNELS:
        cases.append(("batch_norm" + (" (channels last)" if axis == -1 else ""), bn_ours(axis),
                      bn_xla(axis), shape, axis))
    for shape, axis in GROUPS:
        cases.append(("group_norm" + (" (channels last)" if axis == -1 else ""), gn_ours(axis),
                      gn_xla(axis), shape, axis))

    for shape, axis in INSTANCES:
        cases.append(("instance_norm" + (" (channels last)" if axis == -1 else ""),
                      in_ours(axis), in_xla(axis), shape, axis))
    for shape in WEIGHTS:
        cases.append(("weight_norm", lambda v, g, _: cj.weight_norm(v, g, 0), wn_xla, shape, 0))

    if args.ops:
        wanted = set(args.ops.split(","))
        cases = [c for c in cases if c[0].split(" ")[0] in wanted]

    def first(f):
        # y (batch norm also returns its running statistics, the fused forms h)
        return lambda *a: (lambda r: r[0] if isinstance(r, tuple) else r)(f(*a))

    def loss(name, f):
        # the gradient's loss: of y, and for the fused forms of h too (the
        # next block's residual), so that both gradients flow back
        def of_y(*a):
            return (first(f)(*a).astype(jnp.float32) ** 2).sum()

        def of_y_and_h(*a):
            y, h = f(*a)
            return (y.astype(jnp.float32) ** 2).sum() + (h.astype(jnp.float32) ** 2).sum()
        return of_y_and_h if name.startswith("add_") else of_y

    def jvp_of(f):
        # y and its tangent, with x and the parameters as their own tangents
        def g(x, w, b, *rest):
            return jax.jvp(lambda x, w, b: first(f)(x, w, b, *rest), (x, w, b), (x, w, b))
        return jax.jit(g)

    if args.vmap:
        by_op = {c[0]: c for c in cases}
        vmapped(args, passes, by_op, loss, jax, jnp, np, cj, time_interleaved, median_ms)
        return
    print(f"# cynorm.jax vs XLA's formula, {args.threads} thread(s), JAX {jax.__version__}, "
          f"medians of {args.repeats}")
    print(f"# route: {cj.route}")
    print("| op | dtype | shape | pass | cynorm.jax µs | XLA µs | XLA / cynorm.jax |")
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for dtype in (jnp.float32, jnp.bfloat16):
        for name, ours, theirs, shape, axis in cases:
            x = jnp.asarray(rng.standard_normal(shape, np.float32)).astype(dtype)
            C = shape[axis]
            params = [jnp.asarray(rng.standard_normal(C, np.float32)) for _ in range(2)]
            if name.startswith("batch_norm"):
                params += [jnp.zeros(C, jnp.float32), jnp.ones(C, jnp.float32)]
            if name.startswith("add_"):
                params.append(jnp.asarray(rng.standard_normal(shape, np.float32)).astype(dtype))
            makers = {"fwd": ("fwd", jax.jit),
                      "grad": ("fwd+grad", lambda f: jax.jit(jax.value_and_grad(
                          loss(name, f), (0, 1, 2)))),
                      "jvp": ("jvp", jvp_of)}
            for label, make in (makers[p] for p in passes):
                fa, fb = make(ours), make(theirs)
                fns = {"cynorm": lambda: jax.block_until_ready(fa(x, *params)),
                       "xla": lambda: jax.block_until_ready(fb(x, *params))}
                inner = max(1, int(2e5 // x.size))
                t = time_interleaved(fns, args.repeats, inner=inner, warmup=3)
                a, c = median_ms(t["cynorm"]) * 1e3, median_ms(t["xla"]) * 1e3
                print(f"| {name} | {jnp.dtype(dtype).name} | {shape} | {label} | {a:.1f} | "
                      f"{c:.1f} | {c / a:.2f} |", flush=True)


def per_element(jax, f, axes):
    """f once per batch element (jax.lax.map: a custom call each, as a call
    that is not batched runs): the arguments with axis 0 sliced, the others
    (axis None) shared."""
    def run(*args):
        def body(elements):
            it = iter(elements)
            return f(*[next(it) if d == 0 else a for a, d in zip(args, axes)])
        return jax.lax.map(body, tuple(a for a, d in zip(args, axes) if d == 0))
    return run


def vmapped(args, passes, by_op, loss, jax, jnp, np, cj, time_interleaved, median_ms):
    """--vmap: each VMAPPED case as cynorm.jax under jax.vmap, cynorm.jax
    once per element (jax.lax.map) and XLA's formula under jax.vmap."""
    print(f"# cynorm.jax under jax.vmap: one call over the batch, a call per element "
          f"(lax.map), XLA's formula; {args.threads} thread(s), JAX {jax.__version__}, "
          f"medians of {args.repeats}")
    print(f"# route: {cj.route}")
    print("| op | dtype | batch x element | pass | vmap µs | per element µs | XLA µs | "
          "per element / vmap | XLA / vmap |")
    print("|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    wanted = set(args.ops.split(",")) if args.ops else None
    for dtype in (jnp.float32, jnp.bfloat16):
        for op, B, shape, axis in VMAPPED:
            if wanted is not None and op not in wanted:
                continue
            name = op + (" (channels last)" if axis == -1 and op != "layer_norm" else "")
            _, ours, theirs, _, _ = by_op[name]
            x = jnp.asarray(rng.standard_normal((B,) + shape, np.float32)).astype(dtype)
            C = shape[axis]
            # the parameters the batch shares; weight norm's g is each element's own
            params = [jnp.asarray(rng.standard_normal((B, C) if op == "weight_norm" else C,
                                                      np.float32)) for _ in range(2)]
            if op == "batch_norm":
                params += [jnp.zeros(C, jnp.float32), jnp.ones(C, jnp.float32)]
            axes = (0,) + ((0,) if op == "weight_norm" else (None,)) * len(params)
            argnums = (0, 1) if op == "weight_norm" else (0, 1, 2)

            def over_batch(transform, f, axes=axes):
                return jax.vmap(f, axes) if transform == "vmap" else per_element(jax, f, axes)

            makers = {
                "fwd": lambda t, f: jax.jit(over_batch(t, f)),
                "grad": lambda t, f: jax.jit(jax.value_and_grad(loss(op, over_batch(t, f)),
                                                                argnums)),
                "pex": lambda t, f: jax.jit(over_batch(t, jax.grad(loss(op, f), argnums))),
            }
            for label in passes:
                make = makers[label]
                fv, fm, fx = make("vmap", ours), make("map", ours), make("vmap", theirs)
                fns = {"vmap": lambda: jax.block_until_ready(fv(x, *params)),
                       "map": lambda: jax.block_until_ready(fm(x, *params)),
                       "xla": lambda: jax.block_until_ready(fx(x, *params))}
                inner = max(1, int(2e5 // x.size))
                t = time_interleaved(fns, args.repeats, inner=inner, warmup=3)
                v, m, c = (median_ms(t[k]) * 1e3 for k in ("vmap", "map", "xla"))
                print(f"| {name} | {jnp.dtype(dtype).name} | {B} x {shape} | {label} | "
                      f"{v:.1f} | {m:.1f} | {c:.1f} | {m / v:.2f} | {c / v:.2f} |", flush=True)


if __name__ == "__main__":
    main()
