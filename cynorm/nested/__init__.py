"""Nested (jagged) arrays: a batch of differently shaped arrays in one buffer,
and the ops of PyTorch's nested tensors with their backward.

    x = cynorm.nested.nested_array([a0, a1, a2])     # components of one ndim
    y, mean, rstd = cynorm.nested.layer_norm(x, (768,), w, b)

Dims are nested coordinates: dim 0 indexes the components, dim d >= 1 is the
components' dim d - 1.  `sum` over dim 0 adds the components up into a dense
array (they must agree in the dims it keeps); the other reductions and the
normalizations over dim 0 raise.
"""
from cynorm.nested.container import NestedArray, from_padded, nested_array
from cynorm.nested.activations import (
    gelu, gelu_backward, relu, silu, silu_backward, threshold, threshold_backward,
)
from cynorm.nested.linear import linear, linear_backward, matmul, matmul_backward
from cynorm.nested.reductions import (
    select, select_backward, softmax, softmax_backward, sum, sum_backward,
)
from cynorm.nested.layernorm import layer_norm, layer_norm_backward

__all__ = [
    "NestedArray", "from_padded", "gelu", "gelu_backward", "layer_norm", "layer_norm_backward",
    "linear", "linear_backward", "matmul", "matmul_backward", "nested_array", "relu", "select",
    "select_backward", "silu", "silu_backward", "softmax", "softmax_backward", "sum",
    "sum_backward", "threshold", "threshold_backward",
]
