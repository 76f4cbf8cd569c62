"""Pointwise activations of nested arrays and their backward (ATen's
nested relu/threshold/gelu/silu and threshold_backward, gelu_backward,
silu_backward): one pass over the whole buffer, whatever the shapes."""
from __future__ import annotations

from typing import Literal

import numpy as np

from cynorm import _kernels
from cynorm._kernels import float_kernel
from cynorm._kernels._runtime import get_num_threads
from cynorm.nested._common import (
    check_nested, check_same_structure, math_buffer, stored,
)
from cynorm._typing import Real
from cynorm._validation import check_real
from cynorm.nested.container import NestedArray

_act = _kernels.load("activations")

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


def threshold(x: NestedArray, threshold: Real, value: Real) -> NestedArray:
    """Replace the elements at or below a threshold by a value.

    y = value where x <= threshold, else x (NaN stays NaN, as in ATen:
    ``NaN <= threshold`` is false).  One pass over the buffer.

    Parameters
    ----------
    x : NestedArray
        The input.
    threshold : float
        The threshold: a finite real number.
    value : float
        The value of the elements at or below the threshold: a finite real
        number, stored in x's dtype.

    Returns
    -------
    NestedArray
        A new array of x's structure and dtype.

    Raises
    ------
    TypeError
        If x is not a NestedArray, or threshold or value is not a real
        number (bools are refused).
    ValueError
        If threshold or value is not finite.
    """
    check_nested(x, "x")
    t, v = check_real(threshold, "threshold"), check_real(value, "value")
    xb = x.buffer
    # x <= threshold is false for NaN: NaN passes through, as in ATen
    return x.like(np.where(xb <= t, np.asarray(v).astype(x.dtype), xb).astype(x.dtype, copy=False))


def relu(x: NestedArray) -> NestedArray:
    """Rectified linear unit: max(x, 0) elementwise (NaN stays NaN, as in torch).

    ``threshold(x, 0.0, 0.0)``.

    Parameters
    ----------
    x : NestedArray
        The input.

    Returns
    -------
    NestedArray
        A new array of x's structure and dtype.

    Raises
    ------
    TypeError
        If x is not a NestedArray.
    """
    check_nested(x, "x")
    return threshold(x, 0.0, 0.0)


def threshold_backward(grad: NestedArray, self: NestedArray, threshold: Real) -> NestedArray:
    """Backward of `threshold`: 0 where self <= threshold, else grad.

    relu's backward at threshold 0.  Where self is NaN, grad passes
    through (``NaN <= threshold`` is false).

    Parameters
    ----------
    grad : NestedArray
        The gradient of threshold(self, threshold, value): self's structure
        and dtype.
    self : NestedArray
        The input of the forward.
    threshold : float
        The forward's threshold: a finite real number.

    Returns
    -------
    NestedArray
        The gradient of self: a new array of its structure and dtype.

    Raises
    ------
    TypeError
        If grad or self is not a NestedArray, their dtypes differ, or
        threshold is not a real number (bools are refused).
    ValueError
        If grad and self have different structures (component shapes), or
        threshold is not finite.
    """
    check_nested(grad, "grad")
    check_nested(self, "self")
    check_same_structure(grad, "grad", self, "self")
    t = check_real(threshold, "threshold")
    return self.like(np.where(self.buffer <= t, 0, grad.buffer).astype(self.dtype, copy=False))


def gelu(x: NestedArray, approximate: Literal["none", "tanh"] = "none") -> NestedArray:
    """Gaussian error linear unit: x * Phi(x) elementwise.

    Phi is the standard normal's distribution function; with
    ``approximate='tanh'``, the tanh approximation of it, as ATen's gelu.
    One pass over the buffer.

    Parameters
    ----------
    x : NestedArray
        The input.
    approximate : {'none', 'tanh'}, optional
        'none' (the default): the exact GELU; 'tanh': the tanh
        approximation.

    Returns
    -------
    NestedArray
        A new array of x's structure and dtype (16-bit data is computed in
        float32).

    Raises
    ------
    TypeError
        If x is not a NestedArray.
    ValueError
        If approximate is not 'none' or 'tanh'.
    """
    check_nested(x, "x")
    return _forward_kernel(x, GELU, _approximate(approximate))


def gelu_backward(grad: NestedArray, self: NestedArray,
                  approximate: Literal["none", "tanh"] = "none") -> NestedArray:
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


def silu(x: NestedArray) -> NestedArray:
    """Sigmoid linear unit (swish): x * sigmoid(x) elementwise.

    One pass over the buffer, as ATen's silu.

    Parameters
    ----------
    x : NestedArray
        The input.

    Returns
    -------
    NestedArray
        A new array of x's structure and dtype (16-bit data is computed in
        float32).

    Raises
    ------
    TypeError
        If x is not a NestedArray.
    """
    check_nested(x, "x")
    return _forward_kernel(x, SILU)


def silu_backward(grad: NestedArray, self: NestedArray) -> NestedArray:
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
