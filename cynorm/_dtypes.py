"""The dtype policy, derived from the one dtype table (cynorm/_dtype_table.py).

| storage  | kernel suffix | math    | saved statistics |
|----------|---------------|---------|------------------|
| float32  | f32           | float32 | float32          |
| float64  | f64           | float64 | float64          |
| bfloat16 | bf16          | float32 | float32          |
| float16  | f16           | float32 | float32          |

The kernel modules, rendered from templates with the same table, have one entry
point per storage type, named by suffix (weight_norm_forward_bf16), taking
16-bit arrays as their uint16 bits (_arrays.kernel_flat).

Reductions accumulate in float64 whatever the storage.  16-bit arrays are
read and written in 16 bits; their stores round to nearest even, bit-identical
to an ml_dtypes / NumPy cast of the float32 result.
"""
import sys
from typing import Callable, NamedTuple

import numpy as np

from cynorm._dtype_table import STORAGE_TYPES

FLOAT32, FLOAT64, FLOAT16 = np.dtype("float32"), np.dtype("float64"), np.dtype("float16")
# ml_dtypes' bfloat16, once registered (bfloat16(), policy_of): importing
# ml_dtypes costs most of a second with its 0.7 releases (it registers
# thousands of NumPy loops), so cynorm imports it only when a bfloat16 array,
# tensor or dtype name is met, or the caller asks for the type
BFLOAT16 = None
# the table's dtype names, in the kernels' storage-code order
STORAGE_NAMES = tuple(name for _, name, _, _, _, _ in STORAGE_TYPES)
SUPPORTED_NAMES = ", ".join(STORAGE_NAMES)


class Policy(NamedTuple):
    math: np.dtype       # dtype the kernels read per-channel coefficients in
    stat: np.dtype       # dtype of saved statistics (norm, mean, rstd ...)
    coefficients: tuple  # dtypes accepted for per-channel parameters (g, weight, bias)
    suffix: str          # the name suffix of the kernels for this storage type


def _policy(dtype, suffix, math_name):
    math = np.dtype(math_name)
    # a 16-bit type's parameters may be its own or the math type's
    return Policy(math, math, (dtype,) if dtype == math else (dtype, math), suffix)


# storage dtype -> its policy; bfloat16's is added when it is registered
POLICY = {np.dtype(name): _policy(np.dtype(name), sfx, math_name)
          for sfx, name, _, _, _, math_name in STORAGE_TYPES if name != "bfloat16"}
_BF16_ROW = STORAGE_TYPES[STORAGE_NAMES.index("bfloat16")]
# called with the dtype when bfloat16 is registered (the kernels' tables)
_ON_BFLOAT16: list[Callable[[np.dtype], None]] = []


def _register(ml_dtypes):
    global BFLOAT16
    if BFLOAT16 is None:
        dtype = np.dtype(ml_dtypes.bfloat16)
        POLICY[dtype] = _policy(dtype, _BF16_ROW[0], _BF16_ROW[5])
        BFLOAT16 = dtype
        for hook in _ON_BFLOAT16:
            hook(dtype)
    return BFLOAT16


def bfloat16():
    """ml_dtypes' bfloat16 dtype, registered with cynorm (ml_dtypes imported
    here if nobody has yet)."""
    if BFLOAT16 is None:
        import ml_dtypes
        _register(ml_dtypes)
    return BFLOAT16


def policy_of(dtype):
    """dtype's Policy, or None where cynorm does not compute on dtype.  A
    bfloat16 array can exist only once ml_dtypes is imported (by anyone):
    a dtype not found while bfloat16 is unregistered registers it from the
    imported module and looks again."""
    policy = POLICY.get(dtype)
    if policy is None and BFLOAT16 is None:
        ml_dtypes = sys.modules.get("ml_dtypes")
        if ml_dtypes is not None and hasattr(ml_dtypes, "bfloat16"):   # (not mid-import)
            _register(ml_dtypes)
            policy = POLICY.get(dtype)
    return policy


def on_bfloat16(hook):
    """Call hook(dtype) when bfloat16 is registered (at once if it is)."""
    _ON_BFLOAT16.append(hook)
    if BFLOAT16 is not None:
        hook(BFLOAT16)


def is_16bit(dtype):
    return dtype == FLOAT16 or (BFLOAT16 is not None and dtype == BFLOAT16)


def from_float64(a, dtype):
    """float64 values as dtype, rounded the way the kernels store: 16-bit
    types go through float32 (ml_dtypes' round-to-nearest-even of the float32
    value), so a float64 sum and a kernel result agree bit for bit."""
    dtype = np.dtype(dtype)
    if is_16bit(dtype):
        return np.asarray(a, np.float32).astype(dtype)
    return np.asarray(a).astype(dtype, copy=False)


_imported = sys.modules.get("ml_dtypes")
if _imported is not None and hasattr(_imported, "bfloat16"):     # by JAX, say: nothing to wait for
    _register(_imported)
