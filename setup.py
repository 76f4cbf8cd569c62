"""Build the Cython extensions with OpenMP.

Environment switches (all optional):
  CYNORM_NO_OPENMP=1   build serial extensions (correct, single-threaded).
                       Without it the build probes the compiler for OpenMP
                       (omp.h, -fopenmp, the runtime to link) and, where it
                       has none (Apple's clang without libomp), builds serial
                       extensions with one warning saying so.
  CYNORM_OPENMP=1      require OpenMP: a compiler without it is an error
                       (instead of the serial fallback)
  CYNORM_MARCH=<arch>  -march=<arch>.  A source build on x86-64 Linux defaults
                       to "native": it is tuned for, and runs on, the CPU that
                       builds it (the kernels are memory-bound only when the
                       16-bit conversions vectorize wide).  CYNORM_MARCH=none gives
                       the compiler's baseline, which runs on any CPU of the
                       architecture: use it to build for other machines.
  CYNORM_CFLAGS="..."  extra compiler flags, appended last
  CYNORM_TARGET_MACHINE=<arch>  the CPU architecture built for (x86_64,
                       aarch64, ...), which picks the flags above; default:
                       the C compiler's target (`$CC -dumpmachine`), so a
                       cross compiler gets its own target's flags, not the
                       build machine's
  CYNORM_NO_DISPATCH=1 with CYNORM_MARCH=none on x86-64 (or with MSVC on
                       Windows x64): build the baseline kernels only.
                       Otherwise such a build (the wheels') also compiles the
                       kernel modules for x86-64-v3 (AVX2, FMA, F16C),
                       x86-64-v4 (AVX-512) and x86-64-v4 with AVX512-BF16,
                       as <name>_v3 / <name>_v4 / <name>_v4bf16 (MSVC:
                       /arch:AVX2, /arch:AVX512; no AVX512-BF16 level), and
                       cynorm._kernels.load picks the best one the CPU runs
                       at import (CYNORM_SIMD forces a lower one).
  CYNORM_SANITIZE=<list>  -fsanitize=<list> on compile and link (GCC or
                       clang; CI uses GCC), e.g. "address,undefined"
                       (AddressSanitizer and UndefinedBehaviorSanitizer), with
                       -fno-sanitize-recover=all (every report is fatal),
                       -fno-omit-frame-pointer -g -O1, and -fno-wrapv (so
                       that signed overflow is checked: Python's CFLAGS have
                       -fwrapv).  cn_alloc.h's block cache stays on and
                       poisons its padding and the blocks it keeps.  CPython
                       is not instrumented: run it with the sanitizer runtime
                       preloaded, as .ci/sanitize does (its comments give the
                       settings).
"""
import glob
import os
import platform
import runpy
import shlex
import subprocess
import sys
import sysconfig

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


# the CPUs this build may use (affinity, where the OS has it)
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class build_ext_keyed(build_ext):
    """Recompile every module unless the last build in this build/ was made
    from the same sources with the same flags: the flags depend on the
    environment (CYNORM_MARCH, CYNORM_NO_OPENMP, ...), which setuptools'
    up-to-date check cannot see, so an in-tree build/ left by another
    configuration would otherwise be reused.  The build key (build_key) of
    the last build is kept in the build's temporary directory."""

    def finalize_options(self):
        super().finalize_options()
        self.force = True
        # compile the modules in parallel, one per CPU, unless -j says otherwise
        if self.parallel is None:
            self.parallel = CPUS

    def run(self):
        # A per-level module left by an earlier dispatching build (in build/lib
        # or, in place, in the package) would be picked up by this build's
        # install, and loaded in place of its own kernels: remove the levels
        # this build does not make.
        built = {ext.name for ext in self.extensions}
        for name in DISPATCHED:
            for level in LEVEL_FLAGS:
                stale = self.get_ext_fullpath(f"cynorm._kernels.{name}_{level}")
                if f"cynorm._kernels.{name}_{level}" not in built and os.path.exists(stale):
                    os.remove(stale)
        super().run()

    def build_extensions(self):
        if self.compiler.compiler_type == "unix":
            self._openmp_or_serial()
        # A loop function called from one place (a prange body) is otherwise
        # inlined into the OpenMP outlined function, where it runs slower;
        # GCC has the flag, clang (which does not inline this way) rejects
        # it, MSVC has neither.
        flags = ["-fno-inline-functions-called-once"]
        # The small fixed-size arrays the row loops zero (LANES float64
        # accumulators) in vector stores: GCC's tunings for AVX2 targets
        # (x86-64-v3, znver*) zero them with `rep stos`, whose start-up
        # costs more than a short row's loop; larger memsets call the C
        # library's.  x86 GCC only (clang rejects it).
        flags.append("-mmemset-strategy=vector_loop:1024:noalign,libcall:-1:noalign")
        # Loops start on a 64-byte line (GCC's default is 16), so that a hot
        # loop's speed does not depend on where unrelated code moved it
        flags.append("-falign-loops=64")
        if self.compiler.compiler_type == "unix":
            accepted = [flag for flag in flags if self._accepts(flag)]
            # a dispatching build's AVX512-BF16 level where the compiler
            # knows the flag (GCC >= 10, clang >= 9); its CPUs take the
            # x86-64-v4 modules otherwise
            bf16_level = any(ext.name.endswith("_v4bf16") for ext in self.extensions)
            if bf16_level and not self._accepts("-mavx512bf16"):
                for ext in self.extensions:
                    # (one left by another compiler's build must not load)
                    if ext.name.endswith("_v4bf16") and os.path.exists(
                            self.get_ext_fullpath(ext.name)):
                        os.remove(self.get_ext_fullpath(ext.name))
                self.extensions = [ext for ext in self.extensions
                                   if not ext.name.endswith("_v4bf16")]
            # Thread teams that give way under load (cn_team.h): GCC's fork
            # of each parallel region, GOMP_parallel, is wrapped by the
            # linker so that it can be timed.  GCC with OpenMP on Linux only
            # (clang forks through libomp's entry points instead).
            wrap = self._accepts(*self.extensions[0].extra_compile_args, source=TEAM_WRAP_PROBE)
            for ext in self.extensions:
                ext.extra_compile_args = list(ext.extra_compile_args) + accepted
                if wrap:
                    ext.define_macros = list(ext.define_macros) + [("CN_TEAM_WRAP", "1")]
                    ext.extra_link_args = list(ext.extra_link_args) + ["-Wl,--wrap=GOMP_parallel"]
        # the same build again (a second `pip install .`, the docs' install
        # after the tests'): the modules already built are kept (Cython has
        # written their C files again where pip's fresh build environment
        # gave NumPy's .pxd files a newer time, so the files' times cannot
        # tell)
        key = build_key(self.compiler, self.extensions)
        stamp = os.path.join(self.build_temp, "cynorm-build-key")
        if self._built_with(stamp, key):
            print("cynorm: the modules in build/ were built from these sources with these "
                  "flags: not compiled again")
            return
        # no key while the modules are rewritten (a build stopped half way
        # must not pass for the last one)
        if os.path.exists(stamp):
            os.remove(stamp)
        super().build_extensions()
        os.makedirs(self.build_temp, exist_ok=True)
        with open(stamp, "w", encoding="utf-8") as f:
            f.write(key)

    def _built_with(self, stamp, key):
        """Whether every module exists and stamp records key."""
        if not all(os.path.exists(self.get_ext_fullpath(ext.name)) for ext in self.extensions):
            return False
        try:
            with open(stamp, encoding="utf-8") as f:
                return f.read() == key
        except OSError:
            return False

    def _openmp_or_serial(self):
        """Keep the OpenMP flags if the compiler builds and links an OpenMP
        program with them; else drop them (a serial build) with one
        warning, or stop if CYNORM_OPENMP=1 asked for OpenMP."""
        first = self.extensions[0]
        if not any(flag in OPENMP_FLAGS for flag in first.extra_compile_args):
            return  # CYNORM_NO_OPENMP=1: serial already
        reason = self._links_openmp(first.extra_compile_args, first.extra_link_args)
        if not reason:
            return
        cc = " ".join(self.compiler.compiler_so[:1])
        if os.environ.get("CYNORM_OPENMP", "") not in ("", "0"):
            raise SystemExit(f"cynorm: CYNORM_OPENMP=1, but the C compiler ({cc}) cannot build "
                             f"OpenMP code (an OpenMP program failed: {reason}). Install an OpenMP runtime (macOS: "
                             "`brew install libomp`), use GCC, or build serial kernels with "
                             "CYNORM_NO_OPENMP=1.")
        print(f"WARNING: cynorm: the C compiler ({cc}) cannot build OpenMP code (an OpenMP "
              f"program failed: {reason}): building serial kernels, which are correct but run on one thread. For threads, "
              "install an OpenMP runtime (macOS: `brew install libomp`) or use GCC; "
              "CYNORM_NO_OPENMP=1 asks for the serial build and silences this warning.",
              file=sys.stderr)
        for ext in self.extensions:
            ext.extra_compile_args = without_openmp(ext.extra_compile_args)
            ext.extra_link_args = without_openmp(ext.extra_link_args)

    def _links_openmp(self, cflags, ldflags):
        """'' if an OpenMP program compiles and links with these flags, else
        which step failed."""
        import tempfile
        from setuptools.errors import CompileError, LinkError
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "omp_probe.c")
            with open(src, "w") as f:
                f.write(OPENMP_PROBE)
            try:
                objects = self.compiler.compile([src], output_dir=tmp, extra_postargs=cflags)
            except CompileError:
                return "omp.h or -fopenmp refused: the compiler's error is above"
            try:
                self.compiler.link_executable(objects, "omp_probe", output_dir=tmp,
                                              extra_postargs=ldflags)
            except LinkError:
                return "no OpenMP runtime to link: the linker's error is above"
        return ""

    def _accepts(self, *flags, source="int main(void) { return 0; }\n"):
        """Whether the C compiler takes `flags` (and `source`) without a
        warning.  The probe's output is dropped: a flag this compiler lacks
        is an expected answer, not an error for the build's log."""
        import tempfile
        from setuptools.errors import CompileError
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "flag.c")
            with open(src, "w") as f:
                f.write(source)
            sys.stdout.flush()
            sys.stderr.flush()
            saved = [os.dup(1), os.dup(2)]
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                self.compiler.compile([src], output_dir=tmp, extra_postargs=[*flags, "-Werror"])
            except CompileError:
                return False
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in (*saved, devnull):
                    os.close(fd)
        return True


def build_key(compiler, exts):
    """What a build's modules depend on, as text: every source under
    cynorm/_kernels and the build scripts (their bytes' SHA-256), each
    module's flags, the compiler's commands, the switches of the environment
    and the versions of Python, NumPy and Cython."""
    import hashlib
    import json

    import Cython
    digest = hashlib.sha256()
    sources = sorted(glob.glob(os.path.join(KERNELS, "*")) + [__file__, DTYPE_TABLE])
    for path in sources:
        if os.path.isfile(path) and not path.endswith((".c", ".so", ".pyd")):
            digest.update(path.encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    # NumPy's headers by NumPy's version (pip builds each time in a new
    # environment, NumPy's directory a new temporary one)
    numpy = np.get_include()
    env = {k: v for k, v in os.environ.items()
           if k.startswith("CYNORM_") or k in ("CC", "CFLAGS", "CPPFLAGS", "LDFLAGS", "LDSHARED")}
    return json.dumps({
        "sources": digest.hexdigest(),
        "modules": [[e.name, e.sources, e.extra_compile_args, e.extra_link_args,
                     e.define_macros, [d.replace(numpy, "<numpy>") for d in e.include_dirs]]
                    for e in exts],
        "compiler": [getattr(compiler, a, None) for a in ("compiler_so", "linker_so")],
        "environment": env,
        "versions": [sys.version, np.__version__, Cython.__version__],
    }, sort_keys=True, default=str)


# cn_team.h's wrap of GOMP_parallel needs GCC (not clang, which also
# defines __GNUC__), Linux's linker and an OpenMP build: the probe compiles,
# with the kernels' flags, only where all three hold.
TEAM_WRAP_PROBE = """
#if !defined(__GNUC__) || defined(__clang__) || !defined(__linux__) || !defined(_OPENMP)
#error no GOMP_parallel to wrap
#endif
int main(void) { return 0; }
"""

KERNELS = "cynorm/_kernels"

# what compile_flags adds for OpenMP, and a program that needs all of it
OPENMP_FLAGS = ("-fopenmp", "-lomp")
OPENMP_PROBE = """
#include <omp.h>
int main(void) { return omp_get_max_threads() > 0 ? 0 : 1; }
"""


def without_openmp(flags):
    """flags less compile_flags' OpenMP ones (-Xpreprocessor goes with its -fopenmp)."""
    out = []
    for flag in flags:
        if flag in OPENMP_FLAGS:
            if flag == "-fopenmp" and out and out[-1] == "-Xpreprocessor":
                out.pop()
            continue
        out.append(flag)
    return out

# The storage types every kernel template is written for (Tempita, which
# ships with Cython), from the one dtype table (cynorm/_dtype_table.py):
# DTYPES rows are (suffix, storage C type, math C type, NumPy name), ITEMSIZE
# maps a suffix to its element size.  Each type gets its own functions,
# named by suffix, at compile time.
DTYPE_TABLE = os.path.join("cynorm", "_dtype_table.py")
_STORAGE_TYPES = runpy.run_path(DTYPE_TABLE)["STORAGE_TYPES"]
DTYPES = [(sfx, io, math, name) for sfx, name, _, io, math, _ in _STORAGE_TYPES]
ITEMSIZE = {sfx: size for sfx, _, size, _, _, _ in _STORAGE_TYPES}


def render_templates():
    """Write every cynorm/_kernels/<name>.tp to <name> (.pyx, .pxi, .pxd, .h),
    substituting DTYPES and ITEMSIZE; a file already newer than its template
    (and than this script and the dtype table) is left alone."""
    from Cython import Tempita
    for tp in sorted(glob.glob(os.path.join(KERNELS, "*.tp"))):
        target = tp[:-3]
        newest = max(os.path.getmtime(tp), os.path.getmtime(__file__),
                     os.path.getmtime(DTYPE_TABLE))
        if os.path.exists(target) and os.path.getmtime(target) >= newest:
            continue
        with open(tp, encoding="utf-8") as f:
            text = Tempita.sub(f.read(), DTYPES=DTYPES, ITEMSIZE=ITEMSIZE)
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)


def target_machine():
    """The CPU architecture the build is for: $CYNORM_TARGET_MACHINE, else the
    C compiler's target (`$CC -dumpmachine`: a cross compiler's), else this
    machine's."""
    named = os.environ.get("CYNORM_TARGET_MACHINE", "").strip()
    if named:
        return named
    if sys.platform != "win32":
        cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
        try:
            triple = subprocess.run(cc[:1] + ["-dumpmachine"], capture_output=True, text=True,
                                    timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            triple = ""
        if triple:
            return triple.split("-")[0]
    return platform.machine()


TARGET = target_machine()
X86_64 = TARGET in ("x86_64", "AMD64")


def compile_flags():
    openmp = os.environ.get("CYNORM_NO_OPENMP", "") in ("", "0")
    if sys.platform == "win32":
        if os.environ.get("CYNORM_SANITIZE", "").strip():
            raise SystemExit("CYNORM_SANITIZE: GCC or clang builds only")
        cflags = ["/O2", "/fp:precise"] + (["/openmp"] if openmp else [])
        return cflags, [], openmp
    # -ffp-contract=off: no FMA contraction, so every build computes the same
    # expression and results do not change with the target's instruction set.
    cflags = ["-O3", "-ffp-contract=off", "-fno-math-errno"]
    # the loops are shared by several modules (cn_elementwise.h,
    # stats_loops.pxi.tp): each compiles every loop, and drops those it does
    # not call
    cflags.append("-Wno-unused-function")
    native_ok = sys.platform.startswith("linux") and X86_64 and TARGET == platform.machine()
    march = os.environ.get("CYNORM_MARCH", "native" if native_ok else "none")
    if march and march != "none":
        cflags.append(f"-march={march}")
        # GCC picks 256-bit vectors even where AVX-512 exists; the 16-bit
        # conversions want 512 (no effect without AVX-512)
        if X86_64:
            cflags.append("-mprefer-vector-width=512")
    ldflags = []
    sanitize = os.environ.get("CYNORM_SANITIZE", "").strip()
    if sanitize:
        # -O1 after -O3: the level ASan's documentation suggests (a native
        # build took 39 s instead of 70 s here).  -fno-wrapv: Python's
        # CFLAGS bring -fwrapv, which makes signed overflow defined and so
        # turns UBSan's check of it off (the suite runs clean without it).
        san = [f"-fsanitize={sanitize}", "-fno-sanitize-recover=all"]
        cflags += san + ["-fno-omit-frame-pointer", "-g", "-O1", "-fno-wrapv"]
        ldflags += san
    cflags += shlex.split(os.environ.get("CYNORM_CFLAGS", ""))
    if openmp:
        if sys.platform == "darwin":
            cflags += ["-Xpreprocessor", "-fopenmp"]
            ldflags += ["-lomp"]
        else:
            cflags.append("-fopenmp")
            ldflags.append("-fopenmp")
    return cflags, ldflags, openmp


# Extra flags of single modules (GCC/clang).  segments, softmax, pointwise:
# lets GCC if-convert the selects of their float32 exp and log1p
# (cn_vecmath.h), so the loops vectorize at x86-64-v3 and up; no program
# here reads the floating-point exception flags, and the values are the same.
MODULE_FLAGS = {} if sys.platform == "win32" else {
    name: ["-fno-trapping-math"] for name in ("segments", "softmax", "pointwise")}

# the compiled modules (cynorm/_kernels/_modules.py), DISPATCHED those
# built once more per SIMD level in a dispatching build
_MODULES = runpy.run_path(os.path.join("cynorm", "_kernels", "_modules.py"))
MODULES = _MODULES["KERNEL_MODULES"] + _MODULES["SUPPORT_MODULES"]
DISPATCHED = _MODULES["DISPATCHED"]
LEVEL_FLAGS = {
    "v3": ["-march=x86-64-v3"],
    # GCC picks 256-bit vectors even where AVX-512 exists (see compile_flags).
    # Tuned for Ice Lake server, a middle member of the AVX-512 family, so
    # the wheel keeps up with a -march=native build (benchmarks/README.md).
    # -mtune changes scheduling, not the instructions the code may use.
    "v4": ["-march=x86-64-v4", "-mtune=icelake-server", "-mprefer-vector-width=512"],
    # the same with AVX512-BF16 (Sapphire Rapids, Zen 4): bfloat16 outputs
    # rounded in registers by its instruction, as a -march=native build on
    # such a CPU rounds them (the v4 modules compute blocks of float32 and
    # pack them): bfloat16 GN/IN/BN 1.19x at the median on Zen 4
    # (benchmarks/README.md)
    "v4bf16": ["-march=x86-64-v4", "-mavx512bf16", "-mtune=icelake-server",
               "-mprefer-vector-width=512"],
}
# MSVC: /arch:AVX2 also enables FMA and F16C; /arch:AVX512 is F, CD, BW, DQ, VL
MSVC_LEVEL_FLAGS = {"v3": ["/arch:AVX2"], "v4": ["/arch:AVX512"]}


def dispatch_levels():
    """{level: extra compiler flags} to build besides the baseline: on x86-64,
    for a portable build (the wheels) only."""
    if not X86_64:
        return {}
    if os.environ.get("CYNORM_NO_DISPATCH", "") not in ("", "0"):
        return {}
    if sys.platform == "win32":
        # MSVC has no -march: its baseline is always the portable one
        return MSVC_LEVEL_FLAGS
    return LEVEL_FLAGS if os.environ.get("CYNORM_MARCH") == "none" else {}


def extensions():
    render_templates()
    cflags, ldflags, openmp = compile_flags()
    common = dict(
        include_dirs=[np.get_include(), KERNELS],
        extra_link_args=ldflags,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION"),
                       ("NPY_TARGET_VERSION", "NPY_2_0_API_VERSION")],
    )
    exts = [Extension(f"cynorm._kernels.{n}", [f"{KERNELS}/{n}.pyx"],
                      extra_compile_args=cflags + MODULE_FLAGS.get(n, []), **common)
            for n in MODULES]
    options = dict(compiler_directives={"language_level": 3},
                   compile_time_env={"CN_OPENMP_BUILD": openmp})
    if sys.platform != "win32":     # Windows' process pool would run setup.py again
        options["nthreads"] = CPUS
    modules = cythonize(exts, **options)
    for level, level_flags in dispatch_levels().items():
        # same sources, another module name: Cython writes each level's C
        # file under its own build directory
        lexts = [Extension(f"cynorm._kernels.{n}_{level}", [f"{KERNELS}/{n}.pyx"],
                           extra_compile_args=cflags + MODULE_FLAGS.get(n, []) + level_flags,
                           **common)
                 for n in DISPATCHED]
        modules += cythonize(lexts, build_dir=os.path.join("build", f"cython-{level}"), **options)
    return modules


setup(ext_modules=extensions(), cmdclass={"build_ext": build_ext_keyed})
