"""Layer norm of nested arrays (ATen's nested_layer_norm and the seed's
layer_norm_backward_nested): the normalized trailing dims must be the same in
every component, so the buffer is M rows of N and cynorm's layer-norm kernels
run on it directly (no per-component loop)."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from cynorm import layernorm as _ln
from cynorm._typing import Array, ArrayLike, OutputMask, Real
from cynorm._validation import as_array, check_mask, int_tuple
from cynorm.nested._common import check_nested, check_same_structure
from cynorm.nested.container import NestedArray


def _rows(x, normalized_shape, name="x"):
    ns = int_tuple(normalized_shape, "normalized_shape")
    # once per structure: a structure that passed the checks keeps (M, N)
    M, N = x._derived_value(("layer_norm rows", ns), lambda: _row_counts(x, ns, name))
    return ns, M, N


def _row_counts(x, ns, name):
    """(M, N): x's buffer as M rows of N = prod(ns), after checking that every
    component ends in ns."""
    k = len(ns)
    if not 1 <= k <= x.ndim - 1:
        raise ValueError(f"normalized_shape {ns} must name 1 to {x.ndim - 1} trailing component dims")
    trailing = np.asarray(x.sizes)[:, x.ndim - 1 - k:]
    if len(x) and not np.all(trailing == np.array(ns)):
        bad = int(np.argmax(np.any(trailing != np.array(ns), axis=1)))
        raise ValueError(f"{name}'s components must end in normalized_shape {ns}; component {bad} "
                         f"has shape {x.component_shape(bad)}")
    N = int(np.prod(ns))
    M = x.buffer.size // N if N else int(np.sum(np.prod(np.asarray(x.sizes)[:, :x.ndim - 1 - k], axis=1)))
    return M, N


def layer_norm(x: NestedArray, normalized_shape: Union[int, Sequence[int]],
               weight: Optional[ArrayLike] = None, bias: Optional[ArrayLike] = None,
               eps: Real = 1e-5) -> tuple[NestedArray, Array, Array]:
    """Layer normalization over the trailing component dims of a nested array.

    The normalized trailing dims must be the same in every component, so
    the buffer is M rows of N = prod(normalized_shape) and cynorm's
    `layer_norm` kernels run on it directly (no per-component loop), with
    its semantics: y = (x - mean) * rstd * weight + bias per row,
    rstd = 1 / sqrt(var + eps), biased variance.

    Parameters
    ----------
    x : NestedArray
        The input: float64, float32, bfloat16 or float16.
    normalized_shape : int or tuple of int
        The trailing component dims to normalize over (1 to the component
        ndim of them): every component's shape must end in it.
    weight, bias : array_like, optional
        Shape normalized_shape; x's dtype, or float32 for 16-bit x.  None
        (the default): no scale, no shift.
    eps : float, optional
        Added to the variance: >= 0 (default 1e-5).

    Returns
    -------
    y : NestedArray
        The normalized x: x's structure and dtype.
    mean, rstd : numpy.ndarray
        Dense (M,) arrays, one entry per normalized row of the buffer
        (M = total rows), as PyTorch's nested layer_norm returns them;
        float64 for float64 x, float32 otherwise.

    Raises
    ------
    TypeError
        If x is not a NestedArray, normalized_shape is not an int or a
        sequence of ints, weight or bias has the wrong dtype, or eps is not
        a real number.
    ValueError
        If normalized_shape names no dims or more than the components have,
        a component does not end in normalized_shape, weight or bias does
        not have shape normalized_shape, or eps is negative or NaN.
    """
    check_nested(x, "x")
    ns, M, N = _rows(x, normalized_shape)
    _check_param(weight, "weight", ns)
    _check_param(bias, "bias", ns)
    y, mean, rstd = _ln.layer_norm(x.buffer.reshape(M, N), (N,),
                                   None if weight is None else np.asarray(weight).reshape(-1),
                                   None if bias is None else np.asarray(bias).reshape(-1), eps)
    return x.like(y.reshape(-1)), mean.reshape(M), rstd.reshape(M)


def _check_param(p, name, ns):
    if p is not None and np.shape(as_array(p, name)) != ns:
        raise ValueError(f"{name} must have shape normalized_shape {ns}, got {np.shape(p)}")


def layer_norm_backward(grad: NestedArray, input: NestedArray,
                        normalized_shape: Union[int, Sequence[int]], mean: ArrayLike,
                        rstd: ArrayLike, weight: Optional[ArrayLike] = None,
                        bias: Optional[ArrayLike] = None,
                        output_mask: OutputMask = (True, True, True),
                        ) -> tuple[NestedArray, Optional[Array], Optional[Array]]:
    """Backward of nested `layer_norm`: (grad_input, grad_weight, grad_bias).

    cynorm's `layer_norm_backward` on the buffer viewed as M rows of N.  As
    in the seed, a masked-off grad_input is zeros of input's structure;
    masked-off grad_weight / grad_bias are None.

    Parameters
    ----------
    grad : NestedArray
        The gradient of y: input's structure and dtype.
    input : NestedArray
        The input of the forward.
    normalized_shape : int or tuple of int
        As in the forward.
    mean, rstd : array_like
        The statistics the forward returned: M entries each (any shape of
        that size), of a floating dtype.
    weight, bias : array_like, optional
        The forward's weight and bias (or None).  bias only sets
        grad_bias's dtype.
    output_mask : sequence of 3 bools, optional
        Which of (grad_input, grad_weight, grad_bias) to compute (default
        all three).

    Returns
    -------
    grad_input : NestedArray
        Of input's structure and dtype (zeros when masked off).
    grad_weight, grad_bias : numpy.ndarray or None
        Shape normalized_shape, the dtype of weight (bias), or input's dtype
        when it is None; None when masked off.

    Raises
    ------
    TypeError
        If grad or input is not a NestedArray, their dtypes differ,
        normalized_shape is not an int or a sequence of ints, mean, rstd,
        weight or bias has the wrong dtype, or output_mask is not 3 bools.
    ValueError
        If grad and input have different structures, normalized_shape does
        not fit input (as in the forward), weight or bias does not have
        shape normalized_shape, mean or rstd does not have M entries, or
        output_mask has not 3 entries.
    """
    check_nested(grad, "grad")
    check_nested(input, "input")
    check_same_structure(grad, "grad", input, "input")
    ns, M, N = _rows(input, normalized_shape, "input")
    _check_param(weight, "weight", ns)
    _check_param(bias, "bias", ns)
    mask = check_mask(output_mask)
    for name, s in (("mean", mean), ("rstd", rstd)):
        if np.size(as_array(s, name)) != M:
            raise ValueError(f"{name} must have {M} entries (one per normalized row), got shape "
                             f"{np.shape(s)}")
    gx, gw, gb = _ln.layer_norm_backward(
        grad.buffer.reshape(M, N), input.buffer.reshape(M, N), (N,),
        np.asarray(mean).reshape(M, 1), np.asarray(rstd).reshape(M, 1),
        None if weight is None else np.asarray(weight).reshape(N),
        None if bias is None else np.asarray(bias).reshape(N), mask)
    grad_input = input.like(gx.reshape(-1) if gx is not None else np.zeros(input.buffer.size, input.dtype))
    return (grad_input, None if gw is None else gw.reshape(ns), None if gb is None else gb.reshape(ns))
