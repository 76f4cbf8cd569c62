"""Pointwise activations of nested arrays and their backward (ATen's
nested relu/threshold/gelu/silu and threshold_backward, gelu_backward,
silu_backward): one pass over the whole buffer, whatever the shapes."""
import numpy as np

from cynorm._kernels import activations as _act, float_kernel
from cynorm._kernels._runtime import get_num_threads
from cynorm.nested._common import (
    check_nested, check_same_structure, math_buffer, stored,
)
from cynorm._validation import check_real

APPROXIMATE = ("none", "tanh")


def _approximate(approximate):
    if not isinstance(approximate, str) or approximate not in APPROXIMATE:
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate == "tanh"


GELU, SILU = 0, 1      # the kernels' activation codes


def _forward_kernel(x, kind, approx_tanh=False):
    xb = math_buffer(x)
    out = np.empty_like(xb)
    float_kernel(_act, "forward", xb)(kind, xb, out, approx_tanh, get_num_threads())
    return x.like(stored(out, x.dtype))


def _backward_kernel(grad, x, kind, approx_tanh=False):
    check_same_structure(grad, "grad", x, "self")
    gb, xb = math_buffer(grad), math_buffer(x)
    out = np.empty_like(xb)
    float_kernel(_act, "backward", xb)(kind, gb, xb, out, approx_tanh, get_num_threads())
    return x.like(stored(out, x.dtype))


def threshold(x, threshold, value):
    """y = value where x <= threshold, else x (NaN stays NaN)."""
    check_nested(x, "x")
    t, v = check_real(threshold, "threshold"), check_real(value, "value")
    xb = x.buffer
    # x <= threshold is false for NaN: NaN passes through, as in ATen
    return x.like(np.where(xb <= t, np.asarray(v).astype(x.dtype), xb).astype(x.dtype, copy=False))


def relu(x):
    """max(x, 0) (NaN stays NaN, as in torch)."""
    check_nested(x, "x")
    return threshold(x, 0.0, 0.0)


def threshold_backward(grad, self, threshold):
    """0 where self <= threshold, else grad (relu's backward at threshold 0)."""
    check_nested(grad, "grad")
    check_nested(self, "self")
    check_same_structure(grad, "grad", self, "self")
    t = check_real(threshold, "threshold")
    return self.like(np.where(self.buffer <= t, 0, grad.buffer).astype(self.dtype, copy=False))


def gelu(x, approximate="none"):
    """x * Phi(x) (approximate='tanh': the tanh approximation)."""
    check_nested(x, "x")
    return _forward_kernel(x, GELU, _approximate(approximate))


def gelu_backward(grad, self, approximate="none"):
    """Backward of `gelu`: grad times the derivative of GELU at self.

    The derivative is Phi(x) + x * phi(x) (Phi, phi: the standard normal's
    distribution and density), or that of the tanh approximation for
    ``approximate='tanh'``, as ATen's gelu_backward; one pass over the
    buffer.

    Parameters
    ----------
    grad : NestedArray
        The gradient of gelu(self, approximate): self's structure and dtype.
    self : NestedArray
        The input of the forward.
    approximate : {'none', 'tanh'}, optional
        The forward's approximation.

    Returns
    -------
    NestedArray
        The gradient of self: its structure and dtype (16-bit data is
        computed in float32).

    Raises
    ------
    TypeError
        If grad or self is not a NestedArray, or their dtypes differ.
    ValueError
        If grad and self have different structures (component shapes), or
        approximate is not 'none' or 'tanh'.
    """
    check_nested(grad, "grad")
    check_nested(self, "self")
    return _backward_kernel(grad, self, GELU, _approximate(approximate))


def silu(x):
    """x * sigmoid(x)."""
    check_nested(x, "x")
    return _forward_kernel(x, SILU)


def silu_backward(grad, self):
    """Backward of `silu`: grad times the derivative of SiLU at self.

    The derivative is s * (1 + x * (1 - s)) with s = sigmoid(x), as ATen's
    silu_backward; one pass over the buffer.

    Parameters
    ----------
    grad : NestedArray
        The gradient of silu(self): self's structure and dtype.
    self : NestedArray
        The input of the forward.

    Returns
    -------
    NestedArray
        The gradient of self: its structure and dtype (16-bit data is
        computed in float32).

    Raises
    ------
    TypeError
        If grad or self is not a NestedArray, or their dtypes differ.
    ValueError
        If grad and self have different structures (component shapes).
    """
    check_nested(grad, "grad")
    check_nested(self, "self")
    return _backward_kernel(grad, self, SILU)
