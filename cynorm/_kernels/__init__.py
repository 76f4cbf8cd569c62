"""Compiled kernels (Cython + OpenMP) and their C helpers, and the choice of
SIMD level.

A portable x86-64 build (the wheels: CYNORM_MARCH=none) compiles the kernel
modules four times: `batch_norm` for the baseline (SSE2), `batch_norm_v3`
for x86-64-v3 (AVX2, FMA), `batch_norm_v4` for x86-64-v4 (AVX-512) and
`batch_norm_v4bf16` for x86-64-v4 with AVX512-BF16 (bfloat16 outputs rounded
in registers by its instruction).  `load(name)` returns the best one this
CPU runs, chosen once at import; `CYNORM_SIMD=baseline|avx2|avx512|avx512bf16`
forces a lower level (a higher one than the CPU runs is refused).  Other
builds have the one module per kernel.
"""
import importlib
import os
import pkgutil

# see cynorm/__init__.py: in a source checkout the built modules live in the
# installed copy of this package
__path__ = pkgutil.extend_path(__path__, __name__)

from cynorm._kernels._runtime import cpu_level as _cpu_level  # noqa: E402
from cynorm import _dtypes  # noqa: E402
from cynorm._dtype_table import STORAGE_TYPES  # noqa: E402
from cynorm._kernels._modules import DISPATCHED, KERNEL_MODULES, SUPPORT_MODULES  # noqa: E402

# level name -> (module suffix, x86-64 level it needs)
LEVELS = {"baseline": ("", 1), "avx2": ("_v3", 3), "avx512": ("_v4", 4),
          "avx512bf16": ("_v4bf16", 5)}


def _built(suffix):
    try:
        importlib.import_module(f"cynorm._kernels.batch_norm{suffix}")
    except ImportError:
        return False
    return True


def has_variants():
    """Whether this build has per-level kernel modules (a dispatching build)."""
    return _built("_v3") or _built("_v4")


def available_levels():
    """The SIMD levels this build has kernels for and this CPU can run."""
    cpu = _cpu_level()
    return [name for name, (suffix, need) in LEVELS.items() if need <= cpu and _built(suffix)]


def _choose():
    levels = available_levels()
    if not levels:
        # not even the baseline module imports: let its own ImportError say why
        importlib.import_module("cynorm._kernels.batch_norm")
        raise ImportError("cynorm: this build has no kernel modules this CPU can run")
    forced = os.environ.get("CYNORM_SIMD", "").strip().lower()
    if not forced:
        return levels[-1]
    if forced not in LEVELS:
        raise ValueError(f"CYNORM_SIMD={forced!r}: expected one of {', '.join(LEVELS)}")
    if forced not in levels:
        raise ValueError(f"CYNORM_SIMD={forced!r}: this build or CPU offers only "
                          f"{', '.join(levels)}")
    return forced


SIMD_LEVEL = _choose()


def load(name):
    """The compiled module `name` (_modules.py lists them): a DISPATCHED one
    at SIMD_LEVEL, the others as built.  Every op module imports its
    kernels through this function."""
    if name not in KERNEL_MODULES + SUPPORT_MODULES:
        raise ValueError(f"no kernel module {name!r}: expected one of "
                         f"{', '.join(KERNEL_MODULES + SUPPORT_MODULES)}")
    suffix = LEVELS[SIMD_LEVEL][0] if name in DISPATCHED else ""
    return importlib.import_module(f"cynorm._kernels.{name}{suffix}")


def by_storage(module, names):
    """The lookup `kernel(name, policy)` -> module's entry point
    name_<policy.suffix> (weight_norm_forward_bf16 ...), for each of names:
    the kernel templates render one entry per storage type."""
    table = {(name, sfx): getattr(module, f"{name}_{sfx}")
             for name in names for sfx, *_ in STORAGE_TYPES
             if hasattr(module, f"{name}_{sfx}")}

    def kernel(name, policy):
        return table[name, policy.suffix]
    kernel.names = tuple(names)
    return kernel


def float_kernel(module, name, buffer):
    """module's kernel `name` for a float32 or float64 buffer (name_f32,
    name_f64: the entries of the float-only templates: segments, softmax,
    activations)."""
    return getattr(module, f"{name}_{_dtypes.POLICY[buffer.dtype].suffix}")
