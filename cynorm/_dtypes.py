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
from typing import NamedTuple

import ml_dtypes  # noqa: F401 (registers bfloat16 with NumPy)
import numpy as np

from cynorm._dtype_table import STORAGE_TYPES

# the table's dtypes, in the kernels' storage-code order
STORAGE_DTYPES = tuple(np.dtype(name) for _, name, _, _, _, _ in STORAGE_TYPES)
FLOAT32, FLOAT64, BFLOAT16, FLOAT16 = (np.dtype(n) for n in ("float32", "float64", "bfloat16",
                                                             "float16"))


class Policy(NamedTuple):
    math: np.dtype       # dtype the kernels read per-channel coefficients in
    stat: np.dtype       # dtype of saved statistics (norm, mean, rstd ...)
    coefficients: tuple  # dtypes accepted for per-channel parameters (g, weight, bias)
    suffix: str          # the name suffix of the kernels for this storage type


def _policy(dtype, suffix, math_name):
    math = np.dtype(math_name)
    # a 16-bit type's parameters may be its own or the math type's
    return Policy(math, math, (dtype,) if dtype == math else (dtype, math), suffix)


POLICY = {dtype: _policy(dtype, sfx, math_name)
          for dtype, (sfx, _, _, _, _, math_name) in zip(STORAGE_DTYPES, STORAGE_TYPES)}

SUPPORTED_DTYPES = tuple(POLICY)
SUPPORTED_NAMES = ", ".join(str(d) for d in SUPPORTED_DTYPES)


def is_16bit(dtype):
    return dtype is BFLOAT16 or dtype is FLOAT16 or dtype in (BFLOAT16, FLOAT16)


def from_float64(a, dtype):
    """float64 values as dtype, rounded the way the kernels store: 16-bit
    types go through float32 (ml_dtypes' round-to-nearest-even of the float32
    value), so a float64 sum and a kernel result agree bit for bit."""
    dtype = np.dtype(dtype)
    if is_16bit(dtype):
        return np.asarray(a, np.float32).astype(dtype)
    return np.asarray(a).astype(dtype, copy=False)
