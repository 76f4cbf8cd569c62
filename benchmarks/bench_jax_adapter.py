"""cynorm.jax inside jax.jit against XLA's own fused formula, side by side
in one process.

    python benchmarks/bench_jax_adapter.py [--threads 1] [--repeats 41]

For layer norm and RMS norm (with weight, and bias for layer norm) over
float32 and bfloat16 rows, it times a jitted forward and a jitted
value-and-gradient (with respect to x and the parameters) of each, and
prints the medians and XLA's time / cynorm.jax's (> 1: cynorm.jax faster).
The thread count is set for both (XLA: its intra-op pool, before JAX loads).
cynorm.jax.route says whether the calls are XLA FFI custom calls or
callbacks.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

SHAPES = [(8, 64), (512, 768), (4096, 768), (2048, 4096)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=41)
    args = ap.parse_args()
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

    def rms_xla(x, w):
        x32 = x.astype(jnp.float32)
        r = jax.lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + 1.1920929e-07)
        return (x32 * r * w).astype(x.dtype)

    ops = {
        "layer_norm": (lambda x, w, b: cj.layer_norm(x, x.shape[-1], w, b), ln_xla, 3),
        "rms_norm": (lambda x, w, b: cj.rms_norm(x, x.shape[-1], w), lambda x, w, b: rms_xla(x, w), 3),
    }
    print(f"# cynorm.jax vs XLA's formula, {args.threads} thread(s), JAX {jax.__version__}, "
          f"medians of {args.repeats}")
    print(f"# route: {cj.route}")
    print("| op | dtype | shape | pass | cynorm.jax µs | XLA µs | XLA / cynorm.jax |")
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for name, (ours, theirs, nargs) in ops.items():
        for dtype in (jnp.float32, jnp.bfloat16):
            for shape in SHAPES:
                x = jnp.asarray(rng.standard_normal(shape, np.float32)).astype(dtype)
                w = jnp.asarray(rng.standard_normal(shape[-1], np.float32))
                b = jnp.asarray(rng.standard_normal(shape[-1], np.float32))
                for label, make in (("fwd", lambda f: jax.jit(f)),
                                    ("fwd+grad", lambda f: jax.jit(jax.value_and_grad(
                                        lambda x, w, b: (f(x, w, b).astype(jnp.float32) ** 2).sum(),
                                        (0, 1, 2))))):
                    fa, fb = make(ours), make(theirs)
                    fns = {"cynorm": lambda: jax.block_until_ready(fa(x, w, b)),
                           "xla": lambda: jax.block_until_ready(fb(x, w, b))}
                    inner = max(1, int(2e5 // (shape[0] * shape[1])))
                    t = time_interleaved(fns, args.repeats, inner=inner, warmup=3)
                    a, c = median_ms(t["cynorm"]) * 1e3, median_ms(t["xla"]) * 1e3
                    print(f"| {name} | {jnp.dtype(dtype).name} | {shape} | {label} | {a:.1f} | "
                          f"{c:.1f} | {c / a:.2f} |", flush=True)


if __name__ == "__main__":
    main()
