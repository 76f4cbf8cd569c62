"""ATen-named entry points whose names or argument orders differ from cynorm's:
the other batch-norm backward ops, as thin adapters over
cynorm.batch_norm_backward with their argument orders (channel axis 1).

PyTorch routes all of them through one forward-mode rule; so does cynorm.
The CPU has no cuDNN/MIOpen reserve space: `reserve` / `reserveSpace` are
accepted and not read.  cuDNN and MIOpen save the inverse standard
deviation, so their `save_var` is invstd, and they always differentiate
the training-mode formula.
"""
from __future__ import annotations

from typing import Optional

from cynorm._typing import Array, ArrayLike, OutputMask, Real
from cynorm.batchnorm import BACKWARD_NAMES, backward as _native

__all__ = ["batch_norm_backward", "cudnn_batch_norm_backward", "miopen_batch_norm_backward"]

# Errors name the arguments as these ops spell them (input, not x; save_var,
# not save_invstd; ...).
CUDNN_NAMES = dict(BACKWARD_NAMES, x="input", grad_out="grad_output", save_invstd="save_var",
                   eps="epsilon")
ATEN_NAMES = dict(BACKWARD_NAMES, x="input", save_invstd="save_var", training="update")


def cudnn_batch_norm_backward(input: ArrayLike, grad_output: ArrayLike,
                              weight: Optional[ArrayLike], running_mean: Optional[ArrayLike],
                              running_var: Optional[ArrayLike], save_mean: ArrayLike,
                              save_var: ArrayLike, epsilon: Real, reserveSpace: object = None,
                              ) -> tuple[Array, Array, Array]:
    """Gradients of cuDNN's training batch norm (torch.ops.aten.cudnn_batch_norm_backward).

    cynorm.batch_norm_backward's training formula with all three gradients,
    in cuDNN's argument order, channel axis 1.  cuDNN saves the inverse
    standard deviation, so `save_var` is invstd.  Errors name the arguments
    as this op spells them.

    Parameters
    ----------
    input : array_like
        The forward's input x, rank >= 2, float64, float32, bfloat16 or
        float16; channel axis 1.
    grad_output : array_like
        The gradient with respect to the forward's output, input's shape and
        dtype.
    weight : array_like or None
        Per-channel scale, shape (C,) with C = ``input.shape[1]``: input's
        dtype, or float32 when input is 16-bit.  None stands for ones.
    running_mean : array_like or None
        Not read: the training formula uses the saved statistics.
    running_var : array_like or None
        As `running_mean`.
    save_mean : array_like
        The batch's per-channel mean saved by the forward, shape (C,), any
        supported floating dtype.
    save_var : array_like
        The batch's per-channel invstd saved by the forward (cuDNN's
        naming), as `save_mean`.
    epsilon : float
        >= 0; checked, not read (save_var holds it).
    reserveSpace : object, optional
        cuDNN's reserve space: accepted and not read (the CPU has none).

    Returns
    -------
    grad_input : numpy.ndarray
        input's shape and dtype.
    grad_weight : numpy.ndarray
        Shape (C,), weight's dtype (float64 for float64 input, float32
        otherwise when weight is None).
    grad_bias : numpy.ndarray
        As `grad_weight`.

    Raises
    ------
    TypeError
        If an array argument is not an array or has a dtype that is not
        supported or does not match, or `epsilon` is not a real number.
    ValueError
        If input has rank < 2, grad_output's shape is not input's, a
        per-channel argument has the wrong shape, `epsilon` is negative, or
        save_mean or save_var is None.
    """
    return _native(grad_output, input, weight, running_mean, running_var, save_mean, save_var,
                   True, epsilon, (True, True, True), 1, CUDNN_NAMES)


def miopen_batch_norm_backward(input: ArrayLike, grad_output: ArrayLike,
                               weight: Optional[ArrayLike], running_mean: Optional[ArrayLike],
                               running_var: Optional[ArrayLike], save_mean: ArrayLike,
                               save_var: ArrayLike, epsilon: Real,
                               ) -> tuple[Array, Array, Array]:
    """Gradients of MIOpen's training batch norm (torch.ops.aten.miopen_batch_norm_backward).

    The same as cudnn_batch_norm_backward, without the reserve space:
    cynorm.batch_norm_backward's training formula with all three gradients,
    channel axis 1, `save_var` being invstd.

    Parameters
    ----------
    input : array_like
        The forward's input x, rank >= 2, float64, float32, bfloat16 or
        float16; channel axis 1.
    grad_output : array_like
        The gradient with respect to the forward's output, input's shape and
        dtype.
    weight : array_like or None
        Per-channel scale, shape (C,) with C = ``input.shape[1]``: input's
        dtype, or float32 when input is 16-bit.  None stands for ones.
    running_mean : array_like or None
        Not read: the training formula uses the saved statistics.
    running_var : array_like or None
        As `running_mean`.
    save_mean : array_like
        The batch's per-channel mean saved by the forward, shape (C,), any
        supported floating dtype.
    save_var : array_like
        The batch's per-channel invstd saved by the forward (MIOpen's
        naming), as `save_mean`.
    epsilon : float
        >= 0; checked, not read (save_var holds it).

    Returns
    -------
    grad_input : numpy.ndarray
        input's shape and dtype.
    grad_weight : numpy.ndarray
        Shape (C,), weight's dtype (float64 for float64 input, float32
        otherwise when weight is None).
    grad_bias : numpy.ndarray
        As `grad_weight`.

    Raises
    ------
    TypeError
        If an array argument is not an array or has a dtype that is not
        supported or does not match, or `epsilon` is not a real number.
    ValueError
        If input has rank < 2, grad_output's shape is not input's, a
        per-channel argument has the wrong shape, `epsilon` is negative, or
        save_mean or save_var is None.
    """
    return _native(grad_output, input, weight, running_mean, running_var, save_mean, save_var,
                   True, epsilon, (True, True, True), 1, CUDNN_NAMES)


def batch_norm_backward(grad_out: ArrayLike, input: ArrayLike, weight: Optional[ArrayLike],
                        running_mean: Optional[ArrayLike], running_var: Optional[ArrayLike],
                        save_mean: Optional[ArrayLike], save_var: Optional[ArrayLike],
                        update: bool, eps: Real, output_mask: OutputMask,
                        reserve: object = None,
                        ) -> tuple[Optional[Array], Optional[Array], Optional[Array]]:
    """Gradients of batch norm, ATen's generic op (torch.ops.aten.batch_norm_backward).

    The training formula when `update` is true, the inference formula
    otherwise, channel axis 1.  Exported as cynorm.aten.batch_norm_backward
    (cynorm.batch_norm_backward is native_batch_norm_backward's argument
    order).  As in cuDNN's op, `save_var` is the saved invstd.

    Parameters
    ----------
    grad_out : array_like
        The gradient with respect to the forward's output, input's shape and
        dtype.
    input : array_like
        The forward's input x, rank >= 2, float64, float32, bfloat16 or
        float16; channel axis 1.
    weight : array_like or None
        Per-channel scale, shape (C,) with C = ``input.shape[1]``: input's
        dtype, or float32 when input is 16-bit.  None stands for ones.
    running_mean : array_like or None
        The running mean (dtype as `weight`, shape (C,)); required when
        `update` is False, not read otherwise.
    running_var : array_like or None
        The running variance, as `running_mean`.
    save_mean : array_like or None
        The batch's per-channel mean saved by the forward, shape (C,), any
        supported floating dtype; required when `update` is True, not read
        otherwise.
    save_var : array_like or None
        The batch's per-channel invstd saved by the forward, as `save_mean`.
    update : bool
        Differentiate the training formula (True) or the inference one
        (False: invstd = 1 / sqrt(running_var + eps)).
    eps : float
        >= 0; read in inference only.
    output_mask : sequence of 3 bool
        Which of (grad_input, grad_weight, grad_bias) to compute.
    reserve : object, optional
        The reserve space: accepted and not read (the CPU has none).

    Returns
    -------
    grad_input : numpy.ndarray or None
        input's shape and dtype; None when ``output_mask[0]`` is False.
    grad_weight : numpy.ndarray or None
        Shape (C,), weight's dtype (float64 for float64 input, float32
        otherwise when weight is None); None when ``output_mask[1]`` is
        False.
    grad_bias : numpy.ndarray or None
        As `grad_weight`; None when ``output_mask[2]`` is False.

    Raises
    ------
    TypeError
        If an array argument is not an array or has a dtype that is not
        supported or does not match, `update` is not a bool, `eps` is not a
        real number, or `output_mask` is not a sequence of bools.
    ValueError
        If input has rank < 2, grad_out's shape is not input's, a
        per-channel argument has the wrong shape, `eps` is negative,
        `output_mask` does not have 3 entries, or a statistic the formula
        reads is None.
    """
    return _native(grad_out, input, weight, running_mean, running_var, save_mean, save_var,
                   update, eps, output_mask, 1, ATEN_NAMES)
