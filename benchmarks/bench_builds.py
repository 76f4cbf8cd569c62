"""Two builds of cynorm's kernels on the benchmark cases, in one process: the
portable (dispatching) wheel build vs a -march=native build.

    python benchmarks/bench_builds.py                     # build both, compare
    python benchmarks/bench_builds.py --repeats 41 --dtypes bfloat16 --ops bn
    python benchmarks/bench_builds.py --packages A B --ops wn   # weight norm's cases only
    python benchmarks/bench_builds.py --dirs A B          # two existing `pip install --target` dirs
    python benchmarks/bench_builds.py --packages A B --threads 1
                                   # two whole installs, Python layers too: every case of
                                   # bench_norms.py and bench_weight_norm.py
    python benchmarks/bench_builds.py --packages A B --torch
                                   # ... and PyTorch's op interleaved with both
    python benchmarks/bench_builds.py --packages A B --cases cache
                                   # bench_norms.py's cache-resident cases instead

Without --dirs it installs this checkout twice with `pip install --target`
(no build isolation): CYNORM_MARCH=none (the wheels' build: baseline,
x86-64-v3 and x86-64-v4 kernels, one chosen at import) and CYNORM_MARCH=native.

The child imports cynorm from A, then loads B's kernel modules (layer_norm,
batch_norm) from their files under the same names, and times each case's
cynorm call with A's and with B's kernels in turn (the Python layer is A's
for both).  One process, interleaved calls: a shared VM drifts by 10-50 %
between processes, which swamps a 10 % target when the two builds run in
separate processes.  DRAM-bound cases start every call with cold caches, as
in bench_norms.py (--warm: without): otherwise B, run right after A on the
same input, finds part of it in the L3.

--packages compares two builds whose kernels differ in their interface (a
kernel rewrite, say): the child imports all of A's cynorm, sets its modules
aside, imports all of B's, and calls each package's own public functions
(cynorm imports nothing at call time, so each function keeps its own
package).  The cases are bench_norms.py's and bench_weight_norm.py's, every
dtype given.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import HERE, CacheEvictor, median_ms, run_child, time_interleaved  # noqa: E402

ROOT = os.path.dirname(HERE)
BUILDS = {"wheel": "none", "native": "native"}   # name -> CYNORM_MARCH
# the module of the Python layer that calls each kernel module (its _k, _kernel)
PY_MODULES = {"layer_norm": "cynorm.layernorm", "batch_norm": "cynorm._channels"}
def install(march, target):
    env = dict(os.environ, CYNORM_MARCH=march)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", target, "--upgrade", ROOT], env=env, check=True)


def kernel_file(target, name):
    """The kernel module of `name` that `target`'s build would load on this CPU."""
    code = (f"from cynorm import _kernels; m = _kernels.load({name!r}); "
            "import cynorm; print(m.__file__); print(cynorm.config()['simd_compiled'].replace(' ', '_') "
            "+ '/' + _kernels.SIMD_LEVEL)")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=target),
                         capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    path, level = out.stdout.split()
    return path, level


def load_as(name, path):
    """Load the extension at `path` as a fresh module object (not in sys.modules)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def child(args):
    import numpy as np

    import bench_norms as bn
    import cynorm
    from cynorm import _kernels
    kernels = {}
    for kname, pyname in PY_MODULES.items():
        py = importlib.import_module(pyname)
        path = args.other_files[kname]
        # B's modules read A's streaming threshold (one _runtime per process)
        other = load_as("cynorm._kernels." + os.path.basename(path).split(".")[0], path)
        kernels[pyname] = {"A": (py._k, py._kernel),
                           "B": (other, _kernels.by_storage(other, py._kernel.names))}

    def with_kernels(which, family, f):
        py = sys.modules[PY_MODULES[family]]
        mod, lookup = kernels[PY_MODULES[family]][which]

        def call():
            py._k, py._kernel = mod, lookup
            return f()
        return call

    rng = np.random.default_rng(0)
    cynorm.set_num_threads(args.threads)
    # B runs right after A on the same input: without eviction B finds part
    # of it in a large L3
    evict = None if args.warm else CacheEvictor(args.threads)
    rows = []
    for family, shape, layout in bn.CASES:
        ops = [op for op in args.ops if op.startswith(family)]
        if not ops:
            continue
        for dtype in args.dtypes:
            if family == "layer_norm":
                case = bn.layer_norm_case(cynorm, shape, dtype, ops, rng, False, "float32", False)
            else:
                case = bn.batch_norm_case(cynorm, shape, layout, dtype, ops, rng, False, False)
            for opname in ops:
                f = case[opname].fns["cynorm"]
                fns = {w: with_kernels(w, family, f) for w in ("A", "B")}
                small = case[opname].size_bytes < (8 << 20)
                samples = time_interleaved(fns, args.repeats * (4 if small else 1),
                                           before=bn.cold_caches(evict, case[opname]))
                rows.append({"op": opname, "dtype": dtype, "shape": list(shape), "layout": layout,
                             "ms": {w: median_ms(s) for w, s in samples.items()},
                             "ratios": [a / b for a, b in zip(samples["A"], samples["B"])]})
                print(f"  {bn.OP_LABEL[opname]:12s} {dtype:8s} {str(shape):18s} {layout:9s} A/B "
                      f"{rows[-1]['ms']['A'] / rows[-1]['ms']['B']:.3f}", file=sys.stderr, flush=True)
    json.dump(rows, sys.stdout)


def import_package(path):
    """All of the cynorm installed under `path`, as {module name: module},
    imported without disturbing (and then without staying in) sys.modules."""
    def ours(name):
        return name == "cynorm" or name.startswith("cynorm.")
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if ours(k)}
    sys.path.insert(0, path)
    try:
        import cynorm
        for sub in ("layernorm", "batchnorm", "weightnorm", "batchnorm_stats", "nested",
                    "forward_ad", "distributed", "aten"):
            importlib.import_module(f"cynorm.{sub}")
        if not os.path.abspath(cynorm.__file__).startswith(os.path.abspath(path)):
            raise RuntimeError(f"imported {cynorm.__file__}, not the package under {path}")
        mods = {k: v for k, v in sys.modules.items() if ours(k)}
    finally:
        sys.path.remove(path)
        for k in [k for k in sys.modules if ours(k)]:
            del sys.modules[k]
        sys.modules.update(saved)
    return mods


def weight_norm_cases(cn, dtype, rng):
    """(label, size_bytes, cynorm callable, torch callable, None) for
    bench_weight_norm.py's cases."""
    import ml_dtypes
    import numpy as np
    import torch

    import bench_weight_norm as bw
    npdt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    tdt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    tbwd = torch.ops.aten._weight_norm_interface_backward
    out = []
    for shape, dim in bw.CASES:
        gshape = tuple(s if i == dim else 1 for i, s in enumerate(shape))
        v = rng.standard_normal(shape).astype(npdt)
        gw = rng.standard_normal(shape).astype(npdt)
        g = (rng.random(gshape) + 0.5).astype(npdt)
        _, norm = cn.weight_norm_interface(v, g, dim)
        tv, tgw, tg = (torch.from_numpy(a.astype(np.float32)).to(tdt) for a in (v, gw, g))
        _, tnorm = torch._weight_norm_interface(tv, tg, dim)
        out.append((f"WN fwd {dtype} {shape} dim={dim}", v.nbytes,
                    lambda v=v, g=g, dim=dim: cn.weight_norm_interface(v, g, dim),
                    lambda tv=tv, tg=tg, dim=dim: torch._weight_norm_interface(tv, tg, dim), None))
        out.append((f"WN bwd {dtype} {shape} dim={dim}", v.nbytes,
                    lambda gw=gw, v=v, g=g, norm=norm, dim=dim:
                    cn.weight_norm_backward(gw, v, g, norm, dim),
                    lambda tgw=tgw, tv=tv, tg=tg, tnorm=tnorm, dim=dim: tbwd(tgw, tv, tg, tnorm, dim),
                    None))
    return out


def norms_cases(cn, dtype, ops, rng, evict, which="dram"):
    """(label, size_bytes, cynorm callable, torch callable, before) for
    bench_norms.py's cases (`which`: its --cases set)."""
    import bench_norms as bn
    out = []
    for family, shape, layout in bn.CASE_SETS[which]:
        fops = [op for op in ops if op.startswith(family)]
        if not fops:
            continue
        case = bn.family_case(cn, family, shape, layout, dtype, fops, rng, False, "float32", False)
        for op in fops:
            out.append((f"{bn.OP_LABEL[op]} {dtype} {shape} {layout}", case[op].size_bytes,
                        case[op].fns["cynorm"], case[op].fns["torch"],
                        bn.cold_caches(evict, case[op])))
    return out


def packages_child(args):
    import numpy as np

    pkgs = {role: import_package(path) for role, path in zip(("A", "B"), args.packages)}
    for role, mods in pkgs.items():
        print(f"{role}: {os.path.dirname(mods['cynorm'].__file__)}", file=sys.stderr)
        mods["cynorm"].set_num_threads(args.threads)
    if args.torch:
        import torch
        torch.set_num_threads(args.threads)
    evict = None if args.warm else CacheEvictor(args.threads)
    rows = []
    for dtype in args.dtypes:
        # the same inputs for both: each package's cases from the same seed
        cases = {}
        for role, mods in pkgs.items():
            cn = mods["cynorm"]
            cases[role] = ((weight_norm_cases(cn, dtype, np.random.default_rng(0))
                            if args.weight_norm else [])
                           + norms_cases(cn, dtype, args.ops, np.random.default_rng(1), evict,
                                         args.cases))
        for ca, cb in zip(cases["A"], cases["B"]):
            label, nbytes, fa, ftorch, before = ca
            fns = {"A": fa, "B": cb[2]}
            if args.torch:
                fns["torch"] = ftorch
            small = nbytes < (8 << 20)
            samples = time_interleaved(fns, args.repeats * (4 if small else 1), before=before)
            rows.append({"case": label, "ms": {w: median_ms(s) for w, s in samples.items()},
                         "ratios": [a / b for a, b in zip(samples["A"], samples["B"])]})
            print(f"  {label:52s} A/B {rows[-1]['ms']['A'] / rows[-1]['ms']['B']:.3f}",
                  file=sys.stderr, flush=True)
    json.dump(rows, sys.stdout)


def parse_ops(spec):
    """(weight norm's cases wanted, bench_norms.py's ops) from --ops."""
    import bench_norms
    if spec in ("", "all"):
        return True, list(bench_norms.OPS)
    tokens = [t.strip().lower() for t in spec.split(",")]
    rest = [t for t in tokens if t != "wn"]
    return "wn" in tokens, (bench_norms.parse_ops(",".join(rest)) if rest else [])


def ops_arg(args):
    """--ops for a child: what this process chose."""
    return ",".join(["wn"] * args.weight_norm + list(args.ops))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dirs", nargs=2, metavar=("A", "B"), help="two install dirs to compare (A/B)")
    p.add_argument("--packages", nargs=2, metavar=("A", "B"),
                   help="two install dirs whose whole packages (Python layer too) are compared")
    p.add_argument("--repeats", type=int, default=25, help="interleaved calls per case (default 25, "
                   "x4 for inputs under 8 MiB)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--ops", default="all", help="comma-separated: wn (weight norm, --packages "
                   "only), ln, bn or bench_norms.py's op names (default all)")
    p.add_argument("--cases", choices=("dram", "cache", "all"), default="dram",
                   help="with --packages: bench_norms.py's case set (default dram: its large shapes)")
    p.add_argument("--tolerance", type=float, default=0.10, help="target: A within this of B")
    p.add_argument("--warm", action="store_true", help="time DRAM-bound cases (bench_norms.py) "
                   "without evicting the caches before each call")
    p.add_argument("--torch", action="store_true", help="with --packages: time PyTorch's op too, "
                   "interleaved with A and B, and report torch/A and torch/B")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--other-files", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.weight_norm, args.ops = parse_ops(args.ops)
    args.dtypes = args.dtypes.split(",")
    if args.child and args.packages:
        return packages_child(args)
    if args.child:
        args.other_files = json.loads(args.other_files)
        return child(args)
    if args.packages:
        return packages_main(args)

    if args.dirs:
        dirs = dict(zip(("A", "B"), args.dirs))
    else:
        base = tempfile.mkdtemp(prefix="cynorm-builds-")
        dirs = {}
        for role, (name, march) in zip(("A", "B"), BUILDS.items()):
            dirs[role] = os.path.join(base, name)
            print(f"installing the {name} build (CYNORM_MARCH={march}) into {dirs[role]} ...",
                  file=sys.stderr, flush=True)
            install(march, dirs[role])
    files = {}
    for role, d in dirs.items():
        for k in PY_MODULES:
            files.setdefault(role, {})[k], level = kernel_file(d, k)
        print(f"{role}: {d} (SIMD level {level}; kernels {os.path.basename(files[role]['batch_norm'])})")
    os.environ["PYTHONPATH"] = dirs["A"]
    rows = run_child(__file__, "faultfree",
                     ["--repeats", str(args.repeats), "--threads", str(args.threads),
                      "--dtypes", ",".join(args.dtypes), "--ops", ops_arg(args),
                      "--other-files", json.dumps(files["B"])] + ["--warm"] * args.warm,
                     capture_stderr=False)
    print(f"\n{args.threads} threads, fault-free allocation; median of {args.repeats} interleaved calls "
          "(x4 for inputs under 8 MiB) in one process" + ("" if args.warm else "; DRAM-bound cases "
          "with cold caches") + "\n")
    ratios = ratio_table([(f"{LABEL[r['op']]} {r['dtype']} {tuple(r['shape'])} {r['layout']}", r)
                          for r in rows])
    within = sum(x <= 1 + args.tolerance for x in ratios)
    print(f"\nA within {100 * args.tolerance:.0f} % of B in {within} of {len(ratios)} cases; "
          f"median A/B {statistics.median(ratios):.3f}, worst {max(ratios):.2f}")


def ratio_table(labelled):
    """Print the markdown table of (label, row) pairs (with torch's time and
    torch/A, torch/B when the rows have it); return the A/B ratios."""
    torch = all("torch" in r["ms"] for _, r in labelled)
    extra = (" torch ms | torch/A | torch/B |", "---|---|---|") if torch else ("", "")
    print("| case | A ms | B ms | A/B | A/B, quartiles of per-call pairs |" + extra[0])
    print("|---|---|---|---|---|" + extra[1])
    ratios = []
    for label, r in labelled:
        a, b = r["ms"]["A"], r["ms"]["B"]
        q = statistics.quantiles(r["ratios"], n=4)
        ratios.append(a / b)
        t = r["ms"].get("torch")
        more = f" {t:.3f} | {t / a:.2f} | {t / b:.2f} |" if torch else ""
        print(f"| {label} | {a:.3f} | {b:.3f} | {a / b:.2f} | {q[0]:.2f}–{q[2]:.2f} |" + more)
    return ratios


def packages_main(args):
    rows = run_child(__file__, "faultfree",
                     ["--packages", *args.packages, "--repeats", str(args.repeats),
                      "--threads", str(args.threads), "--dtypes", ",".join(args.dtypes),
                      "--ops", ops_arg(args), "--cases", args.cases] + ["--warm"] * args.warm
                     + ["--torch"] * args.torch,
                     capture_stderr=False)
    print(f"\nA: {args.packages[0]}\nB: {args.packages[1]}\n{args.threads} threads, fault-free "
          f"allocation; median of {args.repeats} interleaved calls (x4 for inputs under 8 MiB) in "
          "one process" + ("" if args.warm else "; DRAM-bound cases with cold caches") + "\n")
    ratios = ratio_table([(r["case"], r) for r in rows])
    print(f"\nmedian A/B {statistics.median(ratios):.3f}, best {min(ratios):.2f}, "
          f"worst {max(ratios):.2f} ({len(ratios)} cases)")


if __name__ == "__main__":
    main()
