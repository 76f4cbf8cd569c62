"""The compiled modules of cynorm._kernels, in one list: setup.py builds
them from it and cynorm._kernels.load imports them by it.  Plain Python
with no imports (setup.py runs this file)."""

# the kernel modules (one .pyx or .pyx.tp each)
KERNEL_MODULES = ("weight_norm", "layer_norm", "batch_norm", "activations", "segments",
                  "softmax", "pointwise", "nll_loss")
# the support modules: runtime settings, allocator, views, the plain case,
# the 16-bit conversions (the tests' and show_config's), DLPack import
SUPPORT_MODULES = ("_runtime", "_alloc", "_convert", "_views", "_plain", "_dlpack")
# compiled once more per SIMD level in a portable (dispatching) build, the
# level chosen at import (setup.py's dispatch_levels, cynorm._kernels.load):
# the modules whose loops gain from wider vectors
DISPATCHED = ("weight_norm", "layer_norm", "batch_norm", "segments", "softmax", "pointwise",
              "_convert")
