"""Small ops of PyTorch's forward-mode decomposition table that are not
normalizations: trace and log_sigmoid_forward (ATen's trace,
log_sigmoid_forward).  Cython kernels (_kernels/pointwise.pyx.tp); a plain
argument goes straight to the kernel's plain entry, any other is validated
and converted here, then runs the same kernel."""
from __future__ import annotations

import numpy as np

from cynorm._dtypes import POLICY
from cynorm import _kernels
from cynorm._kernels import float_kernel
from cynorm._kernels._runtime import get_num_threads
from cynorm._typing import Array, ArrayLike
from cynorm._validation import as_array, as_float_array

_k = _kernels.load("pointwise")  # the SIMD level chosen at import


def trace(x: ArrayLike) -> Array:
    """Sum of the main diagonal of a 2-D array (torch.trace).

    Parameters
    ----------
    x : array_like
        A 2-D array: floating (float64, float32, bfloat16, float16) or
        integer.

    Returns
    -------
    numpy.ndarray
        0-d.  Floating x gives x's dtype: the sum accumulates in float64 and
        rounds once (16-bit: through float32); integer x gives int64, as in
        PyTorch.

    Raises
    ------
    TypeError
        If x is a bool array or has another unsupported dtype.
    ValueError
        If x is not 2-D.
    """
    result = _k.trace_plain(x)
    if result is not None:
        return result
    if type(x) is not np.ndarray:
        x = as_array(x, "x")
    if x.ndim != 2:
        raise ValueError(f"x must be a 2-D array (trace), got shape {x.shape}")
    if x.dtype.kind == "b":
        raise TypeError("x must be numeric: trace of a bool array is not defined (as in PyTorch)")
    if x.dtype.kind in "iu":
        return np.asarray(np.trace(x, dtype=np.int64))
    x, _ = as_float_array(x, "x")
    result = _k.trace_plain(x)
    if result is None:
        # unaligned, or an equal but distinct dtype object: the diagonal copied
        # into the policy dtype, seen as a (k, k) array whose diagonal it is
        dtype = next(d for d in POLICY if d == x.dtype)
        diagonal = np.diagonal(x).astype(dtype)
        result = _k.trace_plain(np.lib.stride_tricks.as_strided(
            diagonal, (diagonal.size, diagonal.size), (0, diagonal.itemsize), writeable=False))
    return result


def log_sigmoid_forward(x: ArrayLike) -> tuple[Array, Array]:
    """log(sigmoid(x)) and the buffer its backward reads, as PyTorch's CPU kernel.

    Parameters
    ----------
    x : array_like
        float64, float32, bfloat16 or float16.

    Returns
    -------
    out : numpy.ndarray
        ``min(x, 0) - log1p(exp(-|x|))``: x's shape and dtype.
    buffer : numpy.ndarray
        ``exp(-|x|)``: x's shape and dtype.

    Raises
    ------
    TypeError
        If x has an unsupported dtype.
    """
    result = _k.log_sigmoid_forward_plain(x)
    if result is not None:
        return result
    x, _ = as_float_array(x, "x")
    xm = np.asarray(x, np.float64 if x.dtype == np.float64 else np.float32, order="C")
    out, buffer = np.empty_like(xm), np.empty_like(xm)
    float_kernel(_k, "log_sigmoid_forward", xm)(xm.reshape(-1), out.reshape(-1),
                                                buffer.reshape(-1), get_num_threads())
    return out.astype(x.dtype, copy=False), buffer.astype(x.dtype, copy=False)
