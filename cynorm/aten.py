"""ATen-named entry points whose names or argument orders differ from cynorm's:
the other batch-norm backward ops, as thin adapters over
cynorm.batch_norm_backward with their argument orders (channel axis 1).

PyTorch routes all of them through one forward-mode rule; so does cynorm.
The CPU has no cuDNN/MIOpen reserve space: `reserve` / `reserveSpace` are
accepted and not read.  cuDNN and MIOpen save the inverse standard
deviation, so their `save_var` is invstd, and they always differentiate
the training-mode formula.
"""
from cynorm.batchnorm import BACKWARD_NAMES, backward as _native

__all__ = ["batch_norm_backward", "cudnn_batch_norm_backward", "miopen_batch_norm_backward"]

# Errors name the arguments as these ops spell them (input, not x; save_var,
# not save_invstd; ...).
CUDNN_NAMES = dict(BACKWARD_NAMES, x="input", grad_out="grad_output", save_invstd="save_var",
                   eps="epsilon")
ATEN_NAMES = dict(BACKWARD_NAMES, x="input", save_invstd="save_var", training="update")


def cudnn_batch_norm_backward(input, grad_output, weight, running_mean, running_var, save_mean,
                              save_var, epsilon, reserveSpace=None):
    """torch.ops.aten.cudnn_batch_norm_backward: (grad_input, grad_weight, grad_bias)."""
    return _native(grad_output, input, weight, running_mean, running_var, save_mean, save_var,
                   True, epsilon, (True, True, True), 1, CUDNN_NAMES)


def miopen_batch_norm_backward(input, grad_output, weight, running_mean, running_var, save_mean,
                               save_var, epsilon):
    """torch.ops.aten.miopen_batch_norm_backward: (grad_input, grad_weight, grad_bias)."""
    return _native(grad_output, input, weight, running_mean, running_var, save_mean, save_var,
                   True, epsilon, (True, True, True), 1, CUDNN_NAMES)


def batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var,
                        update, eps, output_mask, reserve=None):
    """torch.ops.aten.batch_norm_backward (the generic one): training formula
    when `update` is true, inference formula otherwise.  Exported as
    cynorm.aten.batch_norm_backward (cynorm.batch_norm_backward is
    native_batch_norm_backward's argument order)."""
    return _native(grad_out, input, weight, running_mean, running_var, save_mean, save_var,
                   update, eps, output_mask, 1, ATEN_NAMES)
