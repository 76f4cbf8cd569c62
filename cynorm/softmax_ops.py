"""Softmax and log-softmax over one axis, and their backward ops
(ATen's _softmax, _log_softmax, _softmax_backward_data,
_log_softmax_backward_data).

NumPy, in the math dtype (float64 for float64, float32 otherwise); 16-bit
arrays are read as float32 and the result rounds once to 16 bits.
"""
import numpy as np

from cynorm._dtypes import FLOAT32, is_16bit
from cynorm._validation import (
    as_dtype, as_float_array, check_bool, check_same, in_memory, normalize_dim,
)


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


def _shifted(x, d):
    xm = _math(in_memory(x))      # a broadcast view too large for memory: refused at once
    with np.errstate(invalid="ignore"):       # all -inf along an axis: nan, as in torch
        return xm - np.max(xm, axis=d, keepdims=True) if xm.size else xm


def softmax(x, dim, half_to_float=False):
    """exp(x) / sum(exp(x)) along `dim` (torch._softmax).

    half_to_float=True (16-bit x only) returns float32; otherwise x's dtype.
    """
    x, _ = as_float_array(x, "x")
    d = _dim(dim, x)
    dtype = _out_dtype(x, half_to_float)
    e = np.exp(_shifted(x, d))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(e / np.sum(e, axis=d, keepdims=True)).astype(dtype)


def log_softmax(x, dim, half_to_float=False):
    """x - log(sum(exp(x))) along `dim` (torch._log_softmax)."""
    x, _ = as_float_array(x, "x")
    d = _dim(dim, x)
    dtype = _out_dtype(x, half_to_float)
    s = _shifted(x, d)
    with np.errstate(divide="ignore"):
        return np.asarray(s - np.log(np.sum(np.exp(s), axis=d, keepdims=True))).astype(dtype)


def _backward_args(grad_output, output, dim, input_dtype):
    output, _ = as_float_array(output, "output")
    grad_output, _ = as_float_array(grad_output, "grad_output")
    check_same(grad_output, "grad_output", output.shape, output.dtype, ref="output")
    in_dtype = as_dtype(input_dtype, "input_dtype")
    if in_dtype != output.dtype and not (output.dtype == FLOAT32 and is_16bit(in_dtype)):
        raise ValueError(f"input_dtype must be output's dtype {output.dtype} (or a 16-bit type "
                         f"when output is float32: half_to_float), got {in_dtype}")
    d = _dim(dim, output)
    # a broadcast view too large for memory: refused at once, not reduced over
    return in_memory(grad_output), in_memory(output), d, in_dtype


def softmax_backward_data(grad_output, output, dim, input_dtype):
    """Gradient of softmax w.r.t. its input from its output y:
    y * (grad_output - sum(grad_output * y)) (torch._softmax_backward_data).

    input_dtype is the forward input's dtype: the result has it (a 16-bit
    one when the forward ran with half_to_float)."""
    g, y, d, in_dtype = _backward_args(grad_output, output, dim, input_dtype)
    gm, ym = _math(g), _math(y)
    return np.asarray(ym * (gm - np.sum(gm * ym, axis=d, keepdims=True))).astype(in_dtype)


def log_softmax_backward_data(grad_output, output, dim, input_dtype):
    """Gradient of log_softmax w.r.t. its input from its output:
    grad_output - exp(output) * sum(grad_output) (torch._log_softmax_backward_data)."""
    g, y, d, in_dtype = _backward_args(grad_output, output, dim, input_dtype)
    gm, ym = _math(g), _math(y)
    return np.asarray(gm - np.exp(ym) * np.sum(gm, axis=d, keepdims=True)).astype(in_dtype)
