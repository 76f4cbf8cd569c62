"""The dtype policy, in one table.

| storage  | kernel suffix | math    | saved statistics |
|----------|---------------|---------|------------------|
| float32  | f32           | float32 | float32          |
| float64  | f64           | float64 | float64          |
| bfloat16 | bf16          | float32 | float32          |
| float16  | f16           | float32 | float32          |

The kernel modules, rendered from templates (setup.py's DTYPES), have one entry
point per storage type, named by suffix (weight_norm_forward_bf16), taking
16-bit arrays as their uint16 bits (_arrays.kernel_flat).

Reductions accumulate in float64 whatever the storage.  16-bit arrays are
read and written in 16 bits; their stores round to nearest even, bit-identical
to an ml_dtypes / NumPy cast of the float32 result.
"""
from typing import NamedTuple

import ml_dtypes
import numpy as np

FLOAT32 = np.dtype(np.float32)
FLOAT64 = np.dtype(np.float64)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT16 = np.dtype(np.float16)


class Policy(NamedTuple):
    math: np.dtype       # dtype the kernels read per-channel coefficients in
    stat: np.dtype       # dtype of saved statistics (norm, mean, rstd ...)
    coefficients: tuple  # dtypes accepted for per-channel parameters (g, weight, bias)
    suffix: str          # the name suffix of the kernels for this storage type


POLICY = {
    FLOAT32: Policy(FLOAT32, FLOAT32, (FLOAT32,), "f32"),
    FLOAT64: Policy(FLOAT64, FLOAT64, (FLOAT64,), "f64"),
    BFLOAT16: Policy(FLOAT32, FLOAT32, (BFLOAT16, FLOAT32), "bf16"),
    FLOAT16: Policy(FLOAT32, FLOAT32, (FLOAT16, FLOAT32), "f16"),
}

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
