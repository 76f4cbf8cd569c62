"""Small ops of PyTorch's forward-mode decomposition table that are not
normalizations: trace and log_sigmoid_forward (ATen's trace,
log_sigmoid_forward).  NumPy, in the math dtype."""
import numpy as np

from cynorm._dtypes import is_16bit
from cynorm._validation import as_array, as_float_array


def trace(x):
    """Sum of the main diagonal of a 2-D array (torch.trace).

    Floating x gives x's dtype (16-bit sums accumulate in float32, then
    round); integer x gives int64, as in PyTorch."""
    if type(x) is not np.ndarray:
        x = as_array(x, "x")
    if x.ndim != 2:
        raise ValueError(f"x must be a 2-D array (trace), got shape {x.shape}")
    if x.dtype.kind == "b":
        raise TypeError("x must be numeric: trace of a bool array is not defined (as in PyTorch)")
    if x.dtype.kind in "iu":
        return np.asarray(np.trace(x, dtype=np.int64))
    x, _ = as_float_array(x, "x")
    acc = np.float64 if x.dtype == np.float64 else np.float32
    return np.asarray(np.trace(x, dtype=acc)).astype(x.dtype)


def log_sigmoid_forward(x):
    """(log(sigmoid(x)), buffer) as PyTorch's CPU kernel: out =
    min(x, 0) - log1p(exp(-|x|)), buffer = exp(-|x|) (what the backward reads)."""
    x, _ = as_float_array(x, "x")
    xm = x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False)
    z = np.exp(-np.abs(xm))
    out = np.asarray(np.minimum(xm, 0) - np.log1p(z))
    z = np.asarray(z)
    dtype = x.dtype
    if is_16bit(dtype):
        return out.astype(dtype), z.astype(dtype)
    return out.astype(dtype, copy=False), z.astype(dtype, copy=False)
