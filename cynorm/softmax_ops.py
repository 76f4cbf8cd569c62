"""Softmax and log-softmax over one axis, and their backward ops
(ATen's _softmax, _log_softmax, _softmax_backward_data,
_log_softmax_backward_data).

Cython kernels (_kernels/softmax.pyx.tp) in the math dtype (float64 for
float64, float32 otherwise): the maximum is subtracted before exp, sums
accumulate in float64.  16-bit arrays are read as float32 and the result
rounds once to 16 bits.  A call with plain arrays (exact ndarrays,
C-contiguous, of the four dtypes) goes straight to the kernel's plain entry,
which widens 16-bit data itself; any other is validated and converted here,
then runs the same kernel.
"""
from __future__ import annotations

import numpy as np

from cynorm import _kernels
from cynorm._dtypes import FLOAT32, is_16bit
from cynorm._kernels import float_kernel
from cynorm._kernels._runtime import get_num_threads
from cynorm._typing import Array, ArrayLike, DTypeLike
from cynorm._validation import (
    as_dtype, as_float_array, check_bool, check_same, in_memory, normalize_dim, split_shape,
)

_k = _kernels.load("softmax")  # the SIMD level chosen at import


def _math(x):
    return x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False)


def _dim(dim, x):
    if dim is None:
        raise TypeError("dim must be an int, got None")
    # a 0-d array has one axis for softmax's purposes (dim 0 or -1), as in ATen
    d = normalize_dim(dim, max(x.ndim, 1))
    return d if x.ndim else None


def _out_dtype(x, half_to_float):
    if not check_bool(half_to_float, "half_to_float"):
        return x.dtype
    if not is_16bit(x.dtype):
        raise ValueError(f"half_to_float=True needs a 16-bit x (float16 or bfloat16), got {x.dtype}")
    return FLOAT32


def _run(x, dim, half_to_float, log_out):
    x, _ = as_float_array(x, "x")
    d = _dim(dim, x)
    dtype = _out_dtype(x, half_to_float)
    # a broadcast view too large for memory is refused by this copy at once
    xm = np.asarray(_math(in_memory(x)), order="C")
    y = np.empty(xm.shape, xm.dtype)
    A, D, B = split_shape(xm.shape, d)
    float_kernel(_k, "softmax", xm)(xm.reshape(-1), y.reshape(-1), A, D, B, log_out,
                                    get_num_threads())
    return y.astype(dtype, copy=False)


def softmax(x: ArrayLike, dim: int, half_to_float: bool = False) -> Array:
    """Softmax exp(x) / sum(exp(x)) along `dim` (torch._softmax).

    Parameters
    ----------
    x : array_like
        float64, float32, bfloat16 or float16; never modified.
    dim : int
        The axis to normalize along (a 0-d x takes 0 or -1).
    half_to_float : bool, default False
        True (16-bit x only) returns float32.

    Returns
    -------
    numpy.ndarray
        x's shape; x's dtype, or float32 with half_to_float.

    Raises
    ------
    TypeError
        If x has an unsupported dtype, dim is not an int, or half_to_float
        is not a bool.
    ValueError
        If dim is out of range for x, or half_to_float is True for x that is
        not 16-bit.
    """
    y = _k.softmax_plain(x, dim, half_to_float, False)
    return y if y is not None else _run(x, dim, half_to_float, False)


def log_softmax(x: ArrayLike, dim: int, half_to_float: bool = False) -> Array:
    """Log-softmax x - log(sum(exp(x))) along `dim` (torch._log_softmax).

    Parameters
    ----------
    x : array_like
        float64, float32, bfloat16 or float16; never modified.
    dim : int
        The axis to normalize along (a 0-d x takes 0 or -1).
    half_to_float : bool, default False
        True (16-bit x only) returns float32.

    Returns
    -------
    numpy.ndarray
        x's shape; x's dtype, or float32 with half_to_float.

    Raises
    ------
    TypeError
        If x has an unsupported dtype, dim is not an int, or half_to_float
        is not a bool.
    ValueError
        If dim is out of range for x, or half_to_float is True for x that is
        not 16-bit.
    """
    y = _k.softmax_plain(x, dim, half_to_float, True)
    return y if y is not None else _run(x, dim, half_to_float, True)


def _backward(grad_output, output, dim, input_dtype, log_out):
    output, _ = as_float_array(output, "output")
    grad_output, _ = as_float_array(grad_output, "grad_output")
    check_same(grad_output, "grad_output", output.shape, output.dtype, ref="output")
    in_dtype = as_dtype(input_dtype, "input_dtype")
    if in_dtype != output.dtype and not (output.dtype == FLOAT32 and is_16bit(in_dtype)):
        raise ValueError(f"input_dtype must be output's dtype {output.dtype} (or a 16-bit type "
                         f"when output is float32: half_to_float), got {in_dtype}")
    d = _dim(dim, output)
    # a broadcast view too large for memory is refused by these copies at once
    g = np.asarray(_math(in_memory(grad_output)), order="C")
    y = np.asarray(_math(in_memory(output)), order="C")
    out = np.empty(y.shape, y.dtype)
    A, D, B = split_shape(y.shape, d)
    float_kernel(_k, "softmax_backward", y)(g.reshape(-1), y.reshape(-1), out.reshape(-1),
                                            A, D, B, log_out, get_num_threads())
    return out.astype(in_dtype, copy=False)


def softmax_backward_data(grad_output: ArrayLike, output: ArrayLike, dim: int,
                          input_dtype: DTypeLike) -> Array:
    """Gradient of softmax with respect to its input, from its output.

    With y the forward's output, ``y * (grad_output - sum(grad_output * y))``
    along `dim` (torch._softmax_backward_data).

    Parameters
    ----------
    grad_output : array_like
        The gradient of y: y's shape and dtype.
    output : array_like
        y, what softmax returned.
    dim : int
        The forward's dim.
    input_dtype : dtype
        The forward input's dtype: the result has it (a 16-bit one when the
        forward ran with half_to_float).

    Returns
    -------
    numpy.ndarray
        The gradient of x: y's shape, input_dtype.

    Raises
    ------
    TypeError
        If an array has an unsupported dtype, grad_output's dtype differs
        from output's, input_dtype is not a dtype, or dim is not an int.
    ValueError
        If grad_output's shape differs from output's, dim is out of range,
        or input_dtype is neither output's dtype nor (for float32 output) a
        16-bit type.
    """
    out = _k.softmax_backward_plain(grad_output, output, dim, input_dtype, False)
    return out if out is not None else _backward(grad_output, output, dim, input_dtype, False)


def log_softmax_backward_data(grad_output: ArrayLike, output: ArrayLike, dim: int,
                              input_dtype: DTypeLike) -> Array:
    """Gradient of log_softmax with respect to its input, from its output.

    ``grad_output - exp(output) * sum(grad_output)`` along `dim`
    (torch._log_softmax_backward_data).

    Parameters
    ----------
    grad_output : array_like
        The gradient of the output: output's shape and dtype.
    output : array_like
        What log_softmax returned.
    dim : int
        The forward's dim.
    input_dtype : dtype
        The forward input's dtype: the result has it (a 16-bit one when the
        forward ran with half_to_float).

    Returns
    -------
    numpy.ndarray
        The gradient of x: output's shape, input_dtype.

    Raises
    ------
    TypeError
        If an array has an unsupported dtype, grad_output's dtype differs
        from output's, input_dtype is not a dtype, or dim is not an int.
    ValueError
        If grad_output's shape differs from output's, dim is out of range,
        or input_dtype is neither output's dtype nor (for float32 output) a
        16-bit type.
    """
    out = _k.softmax_backward_plain(grad_output, output, dim, input_dtype, True)
    return out if out is not None else _backward(grad_output, output, dim, input_dtype, True)
