"""Layer norm of nested arrays (ATen's nested_layer_norm and the seed's
layer_norm_backward_nested): the normalized trailing dims must be the same in
every component, so the buffer is M rows of N and cynorm's layer-norm kernels
run on it directly (no per-component loop)."""
import numpy as np

from cynorm import layernorm as _ln
from cynorm._validation import as_array, check_mask, int_tuple
from cynorm.nested._common import check_nested, check_same_structure


def _rows(x, normalized_shape, name="x"):
    ns = int_tuple(normalized_shape, "normalized_shape")
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
    return ns, M, N


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(y, mean, rstd): y nested like x; mean and rstd dense (M,) arrays, one
    per normalized row of the buffer (M = total rows), as PyTorch's nested
    layer_norm returns them."""
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


def layer_norm_backward(grad, input, normalized_shape, mean, rstd, weight=None, bias=None,
                        output_mask=(True, True, True)):
    """(grad_input, grad_weight, grad_bias) of nested layer_norm.  As in the
    seed, a masked-off grad_input is zeros of input's structure; masked-off
    grad_weight / grad_bias are None."""
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
