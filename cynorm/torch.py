"""cynorm's kernels inside PyTorch: custom operators, autograd, modules.

``import cynorm.torch`` (PyTorch must be installed: ``pip install torch``)
registers cynorm's norms as PyTorch operators (``torch.ops.cynorm.*``),
forward and backward, with fake (meta) implementations, so that they run
under autograd, ``torch.compile(fullgraph=True)`` and ``torch.export`` on
CPU.  On top of them:

- functions with ``torch.nn.functional``'s signatures: :func:`layer_norm`,
  :func:`rms_norm`, :func:`group_norm`, :func:`batch_norm`,
  :func:`instance_norm`;
- drop-in modules, subclasses of PyTorch's with the same constructor
  arguments, parameters and ``state_dict`` keys: :class:`LayerNorm`,
  :class:`RMSNorm`, :class:`GroupNorm`, :class:`BatchNorm1d`,
  :class:`BatchNorm2d`, :class:`BatchNorm3d`, :class:`InstanceNorm1d`,
  :class:`InstanceNorm2d`, :class:`InstanceNorm3d`;
- :func:`weight_norm`, ``torch.nn.utils.parametrizations.weight_norm`` on
  cynorm's kernel (the :class:`WeightNorm` parametrization);
- :func:`replace_norms`, which swaps a model's CPU norms (and weight-norm
  parametrizations) for these in place.

Tensors that cynorm cannot take (on a device, or of a dtype outside
float64, float32, bfloat16 and float16) run PyTorch's own kernels.
"""
from __future__ import annotations

from typing import List, Optional, Tuple, cast

import ml_dtypes
import numpy as np
import torch
from torch import Tensor

import cynorm as _cn
from torch._C import _functorch
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

__all__ = ["layer_norm", "rms_norm", "group_norm", "batch_norm", "instance_norm", "weight_norm",
           "LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
           "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "WeightNorm", "replace_norms"]

_BF16 = np.dtype(ml_dtypes.bfloat16)
_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def _tensor(a: np.ndarray) -> Tensor:
    """A result array as a tensor over the same memory (bfloat16 through its
    16-bit storage, which torch.from_numpy cannot name)."""
    if a.dtype == _BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _array(t: Optional[Tensor]) -> Optional[np.ndarray]:
    """An operator's tensor as a NumPy array over its memory: detached
    (autograd is the operators' registered formulas), bfloat16 through its
    16-bit storage.  Plain NumPy arrays take cynorm's fast argument path
    (about a microsecond; DLPack's export costs several a tensor)."""
    if t is None:
        return None
    if _functorch.is_functorch_wrapped_tensor(t):
        # a torch.func level's wrapper (Eager's derivatives, under one level):
        # the plain tensor, read with that level's dispatch off, which would
        # wrap every view of it again
        with torch._C._DisableFuncTorch():
            while _functorch.is_functorch_wrapped_tensor(t):
                t = _functorch.get_unwrapped(t)
            return _array(t)
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_BF16)
    return t.numpy()


def _plain(*ts: Optional[Tensor]):
    return [_array(t) for t in ts]


def _like(y: Tensor, x: Tensor) -> Tensor:
    """y laid out as torch.empty_like(x) lays out (what the fake kernels
    promise), copied only where cynorm returned another layout."""
    if y.stride() == torch.empty_like(x, device="meta").stride():
        return y
    return torch.empty_like(x).copy_(y)


def _stat_dtype(x: Tensor) -> torch.dtype:
    """The statistics' dtype: float32 for 16-bit x, else x's."""
    return torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype


def _wanted(t: Tensor, wanted: bool) -> Optional[Tensor]:
    return t if wanted else None


def _nothing(x: Tensor) -> Tensor:
    # a gradient not asked for (the operators return tensors only)
    return x.new_empty(0)


def _gradients(x: Tensor, gx: Optional[np.ndarray], *gp: Optional[np.ndarray]):
    """A backward operator's outputs: grad_x laid out as x, then the
    parameters' gradients; an empty tensor for each one not computed."""
    return ((_like(_tensor(gx), x) if gx is not None else _nothing(x),)
            + tuple(_tensor(g) if g is not None else _nothing(x) for g in gp))


def _ours(x: Tensor, *params: Optional[Tensor]) -> bool:
    """Whether cynorm's kernels take this call: CPU tensors of its dtypes."""
    return (x.device.type == "cpu" and x.dtype in _DTYPES
            and all(p is None or p.device.type == "cpu" for p in params))


_SAVED = object()      # an input Eager.jvp finds in ctx.saved_tensors


def _transformed() -> bool:
    """Whether a call runs under forward-mode AD (dual tensors) or a
    torch.func transform, where tensors carry what a plain call would drop."""
    return (torch.autograd.forward_ad._current_level >= 0
            or _functorch.peek_interpreter_stack() is not None)


def _tangents(fn, inputs, input_tangents, running=()):
    """An operator's output tangents, for a body that calls fn on its own
    arguments: cynorm.jvp's rule on the inputs as arrays (lists as tuples),
    the first output laid out as the first input.  running: the positions of
    running statistics, which the body updates in copies (their tangents
    too, here)."""
    primals, tangents = [], []
    for i, (a, t) in enumerate(zip(inputs, input_tangents)):
        if isinstance(a, Tensor):
            a, t = _array(a), _array(t)
            if i in running:
                a, t = a.copy(), None if t is None else t.copy()
        else:
            a, t = (tuple(a) if isinstance(a, list) else a), None
        primals.append(a)
        tangents.append(t)
    _, out = _cn.jvp(fn, primals, tangents)
    return ((_like(_tensor(out[0]), inputs[0]),)
            + tuple(None if o is None else _tensor(o) for o in out[1:]))


def _one_level(name, backward):
    """The Function's derivatives are cynorm's kernels on plain arrays: a
    second level of differentiation would see constants.  Refused: nested
    torch.func transforms, and a backward that builds a graph
    (create_graph=True; torch.func.grad asks for one at its single level)."""
    levels = len(retrieve_all_functorch_interpreters())
    if levels > 1 or (backward and levels == 0 and torch.is_grad_enabled()):
        raise NotImplementedError(
            f"cynorm.torch.{name}: a derivative of a derivative (double backward, "
            "create_graph=True, nested torch.func transforms) is not supported: "
            "cynorm's backward and forward-mode rules are not differentiable themselves")


def _register(name, forward, forward_fake, backward, backward_fake, setup, grad, tangents):
    """The operators cynorm::<name> and cynorm::<name>_backward, made from
    their bodies (forward, backward) with their fake kernels and the
    autograd formula (setup, grad); returns the function that runs them.

    torch.compile and torch.export trace the operators.  Eager calls run the
    same bodies and the same formula through a torch.autograd.Function, or
    straight where nothing needs a gradient: PyTorch's operator dispatch
    costs tens of microseconds a call in Python, more than the kernels on
    small tensors.  The Function's forward-mode rule (dual tensors,
    torch.func.jvp) is tangents(inputs, input_tangents): cynorm.jvp's rule."""
    op = torch.library.custom_op(f"cynorm::{name}", forward, mutates_args=(),
                                 device_types="cpu")
    op.register_fake(forward_fake)
    bop = torch.library.custom_op(f"cynorm::{name}_backward", backward, mutates_args=(),
                                  device_types="cpu")
    bop.register_fake(backward_fake)
    op.register_autograd(lambda ctx, *grads: grad(ctx, bop, *grads), setup_context=setup)

    class Eager(torch.autograd.Function):
        @staticmethod
        def forward(*inputs):
            return forward(*inputs)

        @staticmethod
        def setup_context(ctx, inputs, output):
            setup(ctx, inputs, output)
            # the inputs again for jvp (its tensors through save_for_forward,
            # as torch.func asks)
            ctx.save_for_forward(*[t for t in inputs if isinstance(t, Tensor)])
            ctx.forward_inputs = [_SAVED if isinstance(t, Tensor) else t for t in inputs]

        @staticmethod
        def backward(ctx, *grads):
            _one_level(name, True)
            return grad(ctx, backward, *grads)

        @staticmethod
        def jvp(ctx, *input_tangents):
            _one_level(name, False)
            saved = iter(ctx.saved_tensors)
            inputs = [next(saved) if t is _SAVED else t for t in ctx.forward_inputs]
            return tangents(inputs, input_tangents)

    def run(*inputs):
        if torch.compiler.is_compiling():
            return op(*inputs)
        if _transformed() or (torch.is_grad_enabled()
                              and any(isinstance(t, Tensor) and t.requires_grad
                                      for t in inputs)):
            return Eager.apply(*inputs)
        return forward(*inputs)

    Eager.__name__ = Eager.__qualname__ = f"_{name}_eager"
    return run


# ---- layer norm --------------------------------------------------------------

def _layer_norm_fwd(x: Tensor, normalized_shape: List[int], weight: Optional[Tensor],
                bias: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    xa, w, b = _plain(x, weight, bias)
    y, mean, rstd = _cn.layer_norm(xa, tuple(normalized_shape), w, b, eps)
    return _like(_tensor(y), x), _tensor(mean), _tensor(rstd)


def _layer_norm_fake(x, normalized_shape, weight, bias, eps):
    k = len(normalized_shape)
    shape = tuple(x.shape[:x.dim() - k]) + (1,) * k
    return (torch.empty_like(x), x.new_empty(shape, dtype=_stat_dtype(x)),
            x.new_empty(shape, dtype=_stat_dtype(x)))


def _layer_norm_bwd(grad_out: Tensor, x: Tensor, normalized_shape: List[int], mean: Tensor,
                         rstd: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                         output_mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    g, xa, m, r, w, b = _plain(grad_out, x, mean, rstd, weight, bias)
    gx, gw, gb = _cn.layer_norm_backward(g, xa, tuple(normalized_shape), m, r, w, b,
                                         tuple(output_mask))
    return _gradients(x, gx, gw, gb)


def _layer_norm_bwd_fake(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    return (torch.empty_like(x) if output_mask[0] else _nothing(x),
            torch.empty_like(weight) if output_mask[1] and weight is not None else _nothing(x),
            torch.empty_like(bias) if output_mask[2] and bias is not None else _nothing(x))


def _layer_norm_setup(ctx, inputs, output):
    x, normalized_shape, weight, bias, eps = inputs
    ctx.save_for_backward(x, output[1], output[2], weight, bias)
    ctx.normalized_shape = normalized_shape


def _layer_norm_grad(ctx, backward, gy, _gmean, _grstd):
    x, mean, rstd, weight, bias = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask = [need[0], weight is not None and need[2], bias is not None and need[3]]
    gx, gw, gb = backward(gy, x, ctx.normalized_shape, mean, rstd, weight, bias,
                                      mask)
    return (_wanted(gx, mask[0]), None, _wanted(gw, mask[1]),
            _wanted(gb, mask[2]), None)


_layer_norm = _register("layer_norm", _layer_norm_fwd, _layer_norm_fake, _layer_norm_bwd,
                        _layer_norm_bwd_fake, _layer_norm_setup, _layer_norm_grad,
                        lambda inputs, t: _tangents(_cn.layer_norm, inputs, t))


def layer_norm(input: Tensor, normalized_shape, weight: Optional[Tensor] = None,
               bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """``torch.nn.functional.layer_norm`` on cynorm's kernels, with autograd.

    Parameters
    ----------
    input : torch.Tensor
        The tensor to normalize over its last ``len(normalized_shape)`` axes.
    normalized_shape : int or sequence of int
        The trailing shape normalized over.
    weight : torch.Tensor, optional
        Shape ``normalized_shape``; None: no scale.
    bias : torch.Tensor, optional
        Shape ``normalized_shape``; None: no shift.
    eps : float, default 1e-5
        Added to the variance.

    Returns
    -------
    torch.Tensor
        The normalized tensor, laid out as ``torch.empty_like(input)``.
        Tensors cynorm does not take (on a device, or of another dtype than
        float64, float32, bfloat16 and float16) run PyTorch's kernel.
    """
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if not _ours(input, weight, bias):
        return torch.nn.functional.layer_norm(input, shape, weight, bias, eps)
    return _layer_norm(input, shape, weight, bias, float(eps))[0]


# ---- RMS norm ----------------------------------------------------------------

def _rms_norm_fwd(x: Tensor, normalized_shape: List[int], weight: Optional[Tensor],
              eps: Optional[float]) -> Tuple[Tensor, Tensor]:
    xa, w = _plain(x, weight)
    y, rstd = _cn.rms_norm(xa, tuple(normalized_shape), w, eps)
    return _like(_tensor(y), x), _tensor(rstd)


def _rms_norm_fake(x, normalized_shape, weight, eps):
    k = len(normalized_shape)
    shape = tuple(x.shape[:x.dim() - k]) + (1,) * k
    return torch.empty_like(x), x.new_empty(shape, dtype=_stat_dtype(x))


def _rms_norm_bwd(grad_out: Tensor, x: Tensor, normalized_shape: List[int], rstd: Tensor,
                       weight: Optional[Tensor],
                       output_mask: List[bool]) -> Tuple[Tensor, Tensor]:
    g, xa, r, w = _plain(grad_out, x, rstd, weight)
    gx, gw = _cn.rms_norm_backward(g, xa, tuple(normalized_shape), r, w, tuple(output_mask))
    return _gradients(x, gx, gw)


def _rms_norm_bwd_fake(grad_out, x, normalized_shape, rstd, weight, output_mask):
    return (torch.empty_like(x) if output_mask[0] else _nothing(x),
            torch.empty_like(weight) if output_mask[1] and weight is not None else _nothing(x))


def _rms_norm_setup(ctx, inputs, output):
    x, normalized_shape, weight, eps = inputs
    ctx.save_for_backward(x, output[1], weight)
    ctx.normalized_shape = normalized_shape


def _rms_norm_grad(ctx, backward, gy, _grstd):
    x, rstd, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask = [need[0], weight is not None and need[2]]
    gx, gw = backward(gy, x, ctx.normalized_shape, rstd, weight, mask)
    return _wanted(gx, mask[0]), None, _wanted(gw, mask[1]), None


_rms_norm = _register("rms_norm", _rms_norm_fwd, _rms_norm_fake, _rms_norm_bwd,
                      _rms_norm_bwd_fake, _rms_norm_setup, _rms_norm_grad,
                      lambda inputs, t: _tangents(_cn.rms_norm, inputs, t))


def rms_norm(input: Tensor, normalized_shape, weight: Optional[Tensor] = None,
             eps: Optional[float] = None) -> Tensor:
    """``torch.nn.functional.rms_norm`` on cynorm's kernels, with autograd.

    Parameters
    ----------
    input : torch.Tensor
        The tensor to normalize over its last ``len(normalized_shape)`` axes.
    normalized_shape : int or sequence of int
        The trailing shape normalized over.
    weight : torch.Tensor, optional
        Shape ``normalized_shape``; None: no scale.
    eps : float, optional
        Added to the mean square; None: the machine epsilon of the math
        type (float32 for 16-bit input), as torch.

    Returns
    -------
    torch.Tensor
        The normalized tensor (PyTorch's kernel for tensors cynorm does not
        take).
    """
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if not _ours(input, weight):
        return torch.nn.functional.rms_norm(input, shape, weight, eps)
    return _rms_norm(input, shape, weight, None if eps is None else float(eps))[0]


# ---- group norm --------------------------------------------------------------

def _group_norm_fwd(x: Tensor, num_groups: int, weight: Optional[Tensor], bias: Optional[Tensor],
                eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    xa, w, b = _plain(x, weight, bias)
    y, mean, rstd = _cn.group_norm(xa, num_groups, w, b, eps)
    return _like(_tensor(y), x), _tensor(mean), _tensor(rstd)


def _group_norm_fake(x, num_groups, weight, bias, eps):
    shape = (x.shape[0], num_groups)
    return (torch.empty_like(x), x.new_empty(shape, dtype=_stat_dtype(x)),
            x.new_empty(shape, dtype=_stat_dtype(x)))


def _group_norm_bwd(grad_out: Tensor, x: Tensor, mean: Tensor, rstd: Tensor,
                         weight: Optional[Tensor], num_groups: int,
                         output_mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    g, xa, m, r, w = _plain(grad_out, x, mean, rstd, weight)
    gx, gw, gb = _cn.group_norm_backward(g, xa, m, r, w, num_groups, tuple(output_mask))
    return _gradients(x, gx, gw, gb)


def _group_norm_bwd_fake(grad_out, x, mean, rstd, weight, num_groups, output_mask):
    C = x.shape[1]
    stat = weight.dtype if weight is not None else x.dtype
    return (torch.empty_like(x) if output_mask[0] else _nothing(x),
            x.new_empty(C, dtype=stat) if output_mask[1] else _nothing(x),
            x.new_empty(C, dtype=stat) if output_mask[2] else _nothing(x))


def _group_norm_setup(ctx, inputs, output):
    x, num_groups, weight, bias, eps = inputs
    ctx.save_for_backward(x, output[1], output[2], weight)
    ctx.num_groups = num_groups
    ctx.has_bias = bias is not None


def _group_norm_grad(ctx, backward, gy, _gmean, _grstd):
    x, mean, rstd, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask = [need[0], weight is not None and need[2], ctx.has_bias and need[3]]
    gx, gw, gb = backward(gy, x, mean, rstd, weight, ctx.num_groups, mask)
    return (_wanted(gx, mask[0]), None, _wanted(gw, mask[1]),
            _wanted(gb, mask[2]), None)


_group_norm = _register("group_norm", _group_norm_fwd, _group_norm_fake, _group_norm_bwd,
                        _group_norm_bwd_fake, _group_norm_setup, _group_norm_grad,
                        lambda inputs, t: _tangents(_cn.group_norm, inputs, t))


def group_norm(input: Tensor, num_groups: int, weight: Optional[Tensor] = None,
               bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """``torch.nn.functional.group_norm`` on cynorm's kernels, with autograd.

    Parameters
    ----------
    input : torch.Tensor
        ``(N, C, *spatial)``; a ``channels_last`` tensor is read, and its
        result written, channels last.
    num_groups : int
        The number of groups; must divide C.
    weight : torch.Tensor, optional
        Shape (C,); None: no scale.
    bias : torch.Tensor, optional
        Shape (C,); None: no shift.
    eps : float, default 1e-5
        Added to the variance.

    Returns
    -------
    torch.Tensor
        The normalized tensor (PyTorch's kernel for tensors cynorm does not
        take).
    """
    if not _ours(input, weight, bias):
        return torch.nn.functional.group_norm(input, num_groups, weight, bias, eps)
    return _group_norm(input, int(num_groups), weight, bias, float(eps))[0]


# ---- batch norm --------------------------------------------------------------

def _running_copies(running_mean, running_var, updated):
    """The running statistics as the kernels take them: where the call
    updates them, private copies (the operators are functional, and return
    them as _running_outputs)."""
    rm, rv = _plain(running_mean, running_var)
    if updated:
        rm = None if rm is None else rm.copy()
        rv = None if rv is None else rv.copy()
    return rm, rv


def _running_outputs(x, rm, rv, updated):
    """The operators' last two outputs: the updated running statistics as
    tensors (arrays from _running_copies; tensors in the fake kernels, which
    return new ones alike), or empty ones where the call updates none."""
    def out(a):
        if not updated or a is None:
            return _nothing(x)
        return torch.empty_like(a) if isinstance(a, Tensor) else _tensor(a)
    return out(rm), out(rv)


def _running_tangents(fn, inputs, input_tangents):
    # batch and instance norm: (x, weight, bias, running_mean, running_var,
    # ...); the returned running statistics are not differentiable
    return _tangents(fn, inputs, input_tangents, running=(3, 4)) + (None, None)


def _batch_norm_fwd(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                running_mean: Optional[Tensor], running_var: Optional[Tensor], training: bool,
                momentum: float, eps: float) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    # functional (an operator that mutates has no autograd formula): in
    # training, the updated running statistics come back as new tensors
    xa, w, b = _plain(x, weight, bias)
    rm, rv = _running_copies(running_mean, running_var, training)
    y, save_mean, save_invstd = _cn.batch_norm(xa, w, b, rm, rv, training, momentum, eps)
    return (_like(_tensor(y), x), _tensor(save_mean), _tensor(save_invstd),
            *_running_outputs(x, rm, rv, training))


def _batch_norm_fake(x, weight, bias, running_mean, running_var, training, momentum, eps):
    n = x.shape[1] if training else 0
    return (torch.empty_like(x), x.new_empty(n, dtype=_stat_dtype(x)),
            x.new_empty(n, dtype=_stat_dtype(x)),
            *_running_outputs(x, running_mean, running_var, training))


def _batch_norm_bwd(grad_out: Tensor, x: Tensor, weight: Optional[Tensor],
                         running_mean: Optional[Tensor], running_var: Optional[Tensor],
                         save_mean: Tensor, save_invstd: Tensor, training: bool, eps: float,
                         output_mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    g, xa, w, rm, rv, sm, si = _plain(grad_out, x, weight, running_mean, running_var,
                                      save_mean, save_invstd)
    gx, gw, gb = _cn.batch_norm_backward(g, xa, w, rm, rv, sm if training else None,
                                         si if training else None, training, eps,
                                         tuple(output_mask))
    return _gradients(x, gx, gw, gb)


def _batch_norm_bwd_fake(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd,
                         training, eps, output_mask):
    C = x.shape[1]
    stat = weight.dtype if weight is not None else _stat_dtype(x)
    return (torch.empty_like(x) if output_mask[0] else _nothing(x),
            x.new_empty(C, dtype=stat) if output_mask[1] else _nothing(x),
            x.new_empty(C, dtype=stat) if output_mask[2] else _nothing(x))


def _batch_norm_setup(ctx, inputs, output):
    x, weight, bias, running_mean, running_var, training, momentum, eps = inputs
    # eval: the running statistics as they were used (saved before any
    # later update of the module's buffers)
    rm = None if training or running_mean is None else running_mean.clone()
    rv = None if training or running_var is None else running_var.clone()
    ctx.save_for_backward(x, weight, rm, rv, output[1], output[2])
    ctx.training, ctx.eps, ctx.has_bias = training, eps, bias is not None
    ctx.mark_non_differentiable(output[3], output[4])


def _batch_norm_grad(ctx, backward, gy, _gmean, _ginvstd, _grm, _grv):
    x, weight, rm, rv, save_mean, save_invstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask = [need[0], weight is not None and need[1], ctx.has_bias and need[2]]
    gx, gw, gb = backward(gy, x, weight, rm, rv, save_mean, save_invstd,
                                      ctx.training, ctx.eps, mask)
    return (_wanted(gx, mask[0]), _wanted(gw, mask[1]),
            _wanted(gb, mask[2]), None, None, None, None, None)


_batch_norm = _register("batch_norm", _batch_norm_fwd, _batch_norm_fake, _batch_norm_bwd,
                        _batch_norm_bwd_fake, _batch_norm_setup, _batch_norm_grad,
                        lambda inputs, t: _running_tangents(_cn.batch_norm, inputs, t))


def batch_norm(input: Tensor, running_mean: Optional[Tensor], running_var: Optional[Tensor],
               weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """``torch.nn.functional.batch_norm`` on cynorm's kernels, with autograd.

    Parameters
    ----------
    input : torch.Tensor
        ``(N, C, *spatial)`` or ``(N, C)``.
    running_mean : torch.Tensor or None
        Shape (C,); updated in place in training (required in eval).
    running_var : torch.Tensor or None
        Shape (C,); updated in place in training with the unbiased batch
        variance (required in eval).
    weight : torch.Tensor, optional
        Shape (C,); None: no scale.
    bias : torch.Tensor, optional
        Shape (C,); None: no shift.
    training : bool, default False
        Normalize by the batch's statistics (and update the running ones)
        rather than by the running statistics.
    momentum : float, default 0.1
        The running statistics' update factor.
    eps : float, default 1e-5
        Added to the variance.

    Returns
    -------
    torch.Tensor
        The normalized tensor (PyTorch's kernel for tensors cynorm does not
        take).

    Raises
    ------
    ValueError
        If training is False and a running statistic is None.
    """
    if not _ours(input, weight, bias, running_mean, running_var) or input.dim() < 2:
        return torch.nn.functional.batch_norm(input, running_mean, running_var, weight, bias,
                                              training, momentum, eps)
    if not training and (running_mean is None or running_var is None):
        raise ValueError("batch_norm: running_mean and running_var are required when "
                         "training is False")
    y, _, _, rm, rv = _batch_norm(input, weight, bias, running_mean, running_var,
                                  bool(training), float(momentum), float(eps))
    _store_running(running_mean, running_var, rm, rv, training)
    return y


def _store_running(running_mean, running_var, rm, rv, updated):
    """The operators' updated running statistics into the caller's buffers
    (outside the autograd graph, as torch updates its own)."""
    if not updated:
        return
    with torch.no_grad():
        if running_mean is not None:
            running_mean.copy_(rm)
        if running_var is not None:
            running_var.copy_(rv)


# ---- instance norm -----------------------------------------------------------

def _instance_norm_fwd(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                       running_mean: Optional[Tensor], running_var: Optional[Tensor],
                       use_input_stats: bool, momentum: float,
                       eps: float) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    # functional, as batch norm's: the updated running statistics come back
    xa, w, b = _plain(x, weight, bias)
    rm, rv = _running_copies(running_mean, running_var, use_input_stats)
    y, mean, rstd = _cn.instance_norm(xa, w, b, rm, rv, use_input_stats, momentum, eps)
    return (_like(_tensor(y), x), _tensor(mean), _tensor(rstd),
            *_running_outputs(x, rm, rv, use_input_stats))


def _instance_norm_fake(x, weight, bias, running_mean, running_var, use_input_stats, momentum,
                        eps):
    shape = (x.shape[0], x.shape[1])
    return (torch.empty_like(x), x.new_empty(shape, dtype=_stat_dtype(x)),
            x.new_empty(shape, dtype=_stat_dtype(x)),
            *_running_outputs(x, running_mean, running_var, use_input_stats))


def _instance_norm_bwd(grad_out: Tensor, x: Tensor, mean: Tensor, rstd: Tensor,
                       weight: Optional[Tensor], use_input_stats: bool,
                       output_mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    g, xa, m, r, w = _plain(grad_out, x, mean, rstd, weight)
    gx, gw, gb = _cn.instance_norm_backward(g, xa, m, r, w, use_input_stats, tuple(output_mask))
    return _gradients(x, gx, gw, gb)


def _instance_norm_bwd_fake(grad_out, x, mean, rstd, weight, use_input_stats, output_mask):
    return _group_norm_bwd_fake(grad_out, x, mean, rstd, weight, 0, output_mask)


def _instance_norm_setup(ctx, inputs, output):
    x, weight, bias, running_mean, running_var, use_input_stats, momentum, eps = inputs
    ctx.save_for_backward(x, output[1], output[2], weight)
    ctx.use_input_stats, ctx.has_bias = use_input_stats, bias is not None
    ctx.mark_non_differentiable(output[3], output[4])


def _instance_norm_grad(ctx, backward, gy, _gmean, _grstd, _grm, _grv):
    x, mean, rstd, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask = [need[0], weight is not None and need[1], ctx.has_bias and need[2]]
    gx, gw, gb = backward(gy, x, mean, rstd, weight, ctx.use_input_stats, mask)
    return (_wanted(gx, mask[0]), _wanted(gw, mask[1]), _wanted(gb, mask[2]), None, None, None,
            None, None)


_instance_norm = _register("instance_norm", _instance_norm_fwd, _instance_norm_fake,
                           _instance_norm_bwd, _instance_norm_bwd_fake, _instance_norm_setup,
                           _instance_norm_grad,
                           lambda inputs, t: _running_tangents(_cn.instance_norm, inputs, t))


def instance_norm(input: Tensor, running_mean: Optional[Tensor] = None,
                  running_var: Optional[Tensor] = None, weight: Optional[Tensor] = None,
                  bias: Optional[Tensor] = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """``torch.nn.functional.instance_norm`` on cynorm's kernels, with autograd.

    Parameters
    ----------
    input : torch.Tensor
        ``(N, C, *spatial)``; a ``channels_last`` tensor is read, and its
        result written, channels last.
    running_mean : torch.Tensor, optional
        Shape (C,); with use_input_stats, updated in place with the batch
        average of the instances' means, as torch.
    running_var : torch.Tensor, optional
        Shape (C,); likewise with their unbiased variances.
    weight : torch.Tensor, optional
        Shape (C,); None: no scale.
    bias : torch.Tensor, optional
        Shape (C,); None: no shift.
    use_input_stats : bool, default True
        Normalize each instance by its own statistics; False: by the running
        statistics.
    momentum : float, default 0.1
        The running statistics' update factor.
    eps : float, default 1e-5
        Added to the variance.

    Returns
    -------
    torch.Tensor
        The normalized tensor (PyTorch's kernel for tensors cynorm does not
        take).
    """
    if not _ours(input, weight, bias, running_mean, running_var) or input.dim() < 3:
        return torch.nn.functional.instance_norm(input, running_mean, running_var, weight,
                                                 bias, use_input_stats, momentum, eps)
    y, _, _, rm, rv = _instance_norm(input, weight, bias, running_mean, running_var,
                                     bool(use_input_stats), float(momentum), float(eps))
    _store_running(running_mean, running_var, rm, rv, use_input_stats)
    return y


# ---- weight norm -------------------------------------------------------------

def _weight_norm_fwd(v: Tensor, g: Tensor, dim: Optional[int]) -> Tuple[Tensor, Tensor]:
    va, ga = _plain(v, g)
    w, norm = _cn.weight_norm_interface(va, ga, dim)
    return _like(_tensor(w), v), _tensor(norm)


def _weight_norm_fake(v, g, dim):
    return torch.empty_like(v), torch.empty_like(g, dtype=_stat_dtype(v))


def _weight_norm_bwd(grad_w: Tensor, v: Tensor, g: Tensor, norm: Tensor,
                     dim: Optional[int]) -> Tuple[Tensor, Tensor]:
    gw, va, ga, na = _plain(grad_w, v, g, norm)
    gv, gg = _cn.weight_norm_backward(gw, va, ga, na, dim)
    return _like(_tensor(gv), v), _tensor(gg)


def _weight_norm_bwd_fake(grad_w, v, g, norm, dim):
    return torch.empty_like(v), torch.empty_like(g)


def _weight_norm_setup(ctx, inputs, output):
    v, g, dim = inputs
    ctx.save_for_backward(v, g, output[1])
    ctx.dim = dim


def _weight_norm_grad(ctx, backward, gw, _gnorm):
    v, g, norm = ctx.saved_tensors
    gv, gg = backward(gw, v, g, norm, ctx.dim)
    return gv, gg, None


_weight_norm = _register("weight_norm", _weight_norm_fwd, _weight_norm_fake, _weight_norm_bwd,
                         _weight_norm_bwd_fake, _weight_norm_setup, _weight_norm_grad,
                         lambda inputs, t: _tangents(_cn.weight_norm_interface, inputs, t))


class WeightNorm(torch.nn.utils.parametrizations._WeightNorm):
    """The parametrization ``torch.nn.utils.parametrizations.weight_norm``
    registers, computing w = g * v / ||v|| (``torch._weight_norm``) with
    cynorm's kernels (PyTorch's for tensors cynorm does not take)."""

    def forward(self, weight_g: Tensor, weight_v: Tensor) -> Tensor:
        if not _ours(weight_v, weight_g) or weight_g.dtype not in _DTYPES:
            return super().forward(weight_g, weight_v)
        # torch's dim -1 is the whole tensor, cynorm's None
        return _weight_norm(weight_v, weight_g, None if self.dim == -1 else self.dim)[0]


def weight_norm(module: torch.nn.Module, name: str = "weight",
                dim: Optional[int] = 0) -> torch.nn.Module:
    """``torch.nn.utils.parametrizations.weight_norm`` with cynorm's kernels:
    the same parametrization (parameters ``parametrizations.<name>.original0``
    = g and ``original1`` = v, the same state_dict keys and the loading of
    old ``<name>_g`` / ``<name>_v`` keys), computed by :class:`WeightNorm`.

    Parameters
    ----------
    module : torch.nn.Module
        The module whose parameter is reparametrized.
    name : str, default "weight"
        The parameter's name.
    dim : int or None, default 0
        The axis whose slices are normalized; None: the whole tensor.

    Returns
    -------
    torch.nn.Module
        The module, reparametrized in place.
    """
    # (torch's annotation says int; its code takes None, as documented)
    torch.nn.utils.parametrizations.weight_norm(module, name, cast(int, dim))
    getattr(module, "parametrizations")[name][0].__class__ = WeightNorm
    return module


# ---- modules -----------------------------------------------------------------

class LayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` running cynorm's kernels (same arguments,
    parameters and state_dict)."""

    def forward(self, input: Tensor) -> Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` running cynorm's kernels."""

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)


class GroupNorm(torch.nn.GroupNorm):
    """``torch.nn.GroupNorm`` running cynorm's kernels."""

    def forward(self, input: Tensor) -> Tensor:
        return group_norm(input, self.num_groups, self.weight, self.bias, self.eps)


class _BatchNormForward(torch.nn.modules.batchnorm._BatchNorm):
    """torch's _BatchNorm.forward (the momentum and num_batches_tracked
    rules), with cynorm's batch_norm."""

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        return batch_norm(input, self.running_mean if track else None,
                          self.running_var if track else None, self.weight, self.bias,
                          use_batch, factor, self.eps)


class BatchNorm1d(_BatchNormForward, torch.nn.BatchNorm1d):
    """``torch.nn.BatchNorm1d`` running cynorm's kernels."""


class BatchNorm2d(_BatchNormForward, torch.nn.BatchNorm2d):
    """``torch.nn.BatchNorm2d`` running cynorm's kernels."""


class BatchNorm3d(_BatchNormForward, torch.nn.BatchNorm3d):
    """``torch.nn.BatchNorm3d`` running cynorm's kernels."""


class _InstanceNormForward(torch.nn.modules.instancenorm._InstanceNorm):
    """torch's _InstanceNorm (unbatched input, the channel-count checks),
    with cynorm's instance_norm."""

    def _apply_instance_norm(self, input: Tensor) -> Tensor:
        return instance_norm(input, self.running_mean, self.running_var, self.weight,
                             self.bias, self.training or not self.track_running_stats,
                             self.momentum if self.momentum is not None else 0.0, self.eps)


class InstanceNorm1d(_InstanceNormForward, torch.nn.InstanceNorm1d):
    """``torch.nn.InstanceNorm1d`` running cynorm's kernels."""


class InstanceNorm2d(_InstanceNormForward, torch.nn.InstanceNorm2d):
    """``torch.nn.InstanceNorm2d`` running cynorm's kernels."""


class InstanceNorm3d(_InstanceNormForward, torch.nn.InstanceNorm3d):
    """``torch.nn.InstanceNorm3d`` running cynorm's kernels."""


_SWAPS = {torch.nn.LayerNorm: LayerNorm, torch.nn.RMSNorm: RMSNorm,
          torch.nn.GroupNorm: GroupNorm, torch.nn.BatchNorm1d: BatchNorm1d,
          torch.nn.BatchNorm2d: BatchNorm2d, torch.nn.BatchNorm3d: BatchNorm3d,
          torch.nn.InstanceNorm1d: InstanceNorm1d, torch.nn.InstanceNorm2d: InstanceNorm2d,
          torch.nn.InstanceNorm3d: InstanceNorm3d,
          torch.nn.utils.parametrizations._WeightNorm: WeightNorm}


def replace_norms(model: torch.nn.Module) -> List[str]:
    """Swap a model's norm modules for cynorm's, in place.

    Each ``torch.nn`` ``LayerNorm``, ``RMSNorm``, ``GroupNorm``,
    ``BatchNorm1d/2d/3d`` and ``InstanceNorm1d/2d/3d`` (exactly those
    classes, not subclasses) becomes the cynorm module of the same name, and
    each weight-norm parametrization
    (``torch.nn.utils.parametrizations.weight_norm``) becomes
    :class:`WeightNorm`: each keeps its parameters, buffers, hooks and
    state_dict keys; only its class changes.

    Parameters
    ----------
    model : torch.nn.Module
        The model (itself a norm module, or holding some).

    Returns
    -------
    list of str
        The names (as ``model.named_modules()`` gives them) of the modules
        swapped.

    Raises
    ------
    ValueError
        Before swapping any, if one of them holds a parameter or buffer off
        the CPU (cynorm's kernels run on the CPU).
    """
    found = [(name, m) for name, m in model.named_modules() if type(m) in _SWAPS]
    for name, m in found:
        for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)):
            if t.device.type != "cpu":
                raise ValueError(f"replace_norms: {name or 'the model'} "
                                 f"({type(m).__name__}) is on {t.device}; cynorm's kernels "
                                 f"run on the CPU (move the model with .cpu() first)")
    for _, m in found:
        m.__class__ = _SWAPS[type(m)]
    return [name for name, _ in found]
