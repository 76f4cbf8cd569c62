"""Softmax and log-softmax over one axis, and their backward ops
(ATen's _softmax, _log_softmax, _softmax_backward_data,
_log_softmax_backward_data).

Cython kernels (_kernels/softmax.pyx.tp) in the math dtype (float64 for
float64, float32 otherwise): the maximum is subtracted before exp, sums
accumulate in float64.  16-bit arrays are read as float32 and the result
rounds once to 16 bits.  A call with a plain float32/float64 array (exact
ndarray, C-contiguous) goes straight to the kernel's plain entry; any other
is validated and converted here, then runs the same kernel.
"""
import numpy as np

from cynorm import _kernels
from cynorm._dtypes import FLOAT32, is_16bit
from cynorm._kernels import float_kernel
from cynorm._kernels._runtime import get_num_threads
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


def softmax(x, dim, half_to_float=False):
    """exp(x) / sum(exp(x)) along `dim` (torch._softmax).

    half_to_float=True (16-bit x only) returns float32; otherwise x's dtype.
    """
    y = _k.softmax_plain(x, dim, half_to_float, False)
    return y if y is not None else _run(x, dim, half_to_float, False)


def log_softmax(x, dim, half_to_float=False):
    """x - log(sum(exp(x))) along `dim` (torch._log_softmax)."""
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


def softmax_backward_data(grad_output, output, dim, input_dtype):
    """Gradient of softmax w.r.t. its input from its output y:
    y * (grad_output - sum(grad_output * y)) (torch._softmax_backward_data).

    input_dtype is the forward input's dtype: the result has it (a 16-bit
    one when the forward ran with half_to_float)."""
    out = _k.softmax_backward_plain(grad_output, output, dim, input_dtype, False)
    return out if out is not None else _backward(grad_output, output, dim, input_dtype, False)


def log_softmax_backward_data(grad_output, output, dim, input_dtype):
    """Gradient of log_softmax w.r.t. its input from its output:
    grad_output - exp(output) * sum(grad_output) (torch._log_softmax_backward_data)."""
    out = _k.softmax_backward_plain(grad_output, output, dim, input_dtype, True)
    return out if out is not None else _backward(grad_output, output, dim, input_dtype, True)
