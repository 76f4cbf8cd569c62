"""cynorm's kernels inside PyTorch: custom operators, autograd, modules.

``import cynorm.torch`` (PyTorch must be installed: ``pip install torch``)
registers cynorm's norms as PyTorch operators (``torch.ops.cynorm.*``),
forward and backward, with fake (meta) implementations, so that they run
under autograd, ``torch.compile(fullgraph=True)`` and ``torch.export`` on
CPU (where, under torch.compile, batch norm runs cynorm's statistics
operator, cynorm::batch_norm_moments, and leaves the rest to Inductor's
fused loops).  On top of them:

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
  parametrizations) for these in place;
- :func:`native_status`: whether eager norm calls with gradients run
  compiled operators (their autograd formula in C++, built against the
  installed torch on first use) or cynorm's Python Functions.

Tensors that cynorm cannot take (on a device, or of a dtype outside
float64, float32, bfloat16 and float16) run PyTorch's own kernels.
"""
from __future__ import annotations

import math
import types
import typing
from typing import Any, List, Optional, Tuple, cast

import numpy as np
import torch
from torch import Tensor

import cynorm
from cynorm import _dtypes, _torch_native
from cynorm import layernorm as _layernorm
from cynorm._validation import check_int
from cynorm._channels import channel_input as _channel_input, prepare as _prepare
from cynorm._channels import moments as _channel_moments, native_abi as _channels_abi
from cynorm._kernels._alloc import OutsideCache
from cynorm._kernels._dlpack import to_dlpack
from cynorm._kernels._views import tensor_view
from torch._C import _functorch
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

__all__ = ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "group_norm", "batch_norm",
           "instance_norm", "weight_norm",
           "LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
           "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "WeightNorm", "replace_norms",
           "native_status", "ArgumentError", "ArgumentTypeError"]

_DTYPES = frozenset((torch.float64, torch.float32, torch.bfloat16, torch.float16))
_from_dlpack = getattr(torch._C, "_from_dlpack", torch.utils.dlpack.from_dlpack)
# (bfloat16's added with the first bfloat16 tensor: importing ml_dtypes is slow)
_NUMPY: dict[Any, np.dtype[Any]] = {torch.float64: np.dtype(np.float64),
                                    torch.float32: np.dtype(np.float32),
                                    torch.float16: np.dtype(np.float16)}


class _Kernels:
    """cynorm's functions as this module calls them: each an OutsideCache, so
    that their outputs, which become tensors, come from the allocator
    PyTorch's own operators free into (memory they just used), not from
    cynorm's block cache (blocks kept since the last backward, cold, and
    memory PyTorch cannot reuse: docs/torch.rst, "Memory")."""

    def __getattr__(self, name: str) -> Any:
        f = getattr(cynorm, name)
        if callable(f):
            f = OutsideCache(f)
        setattr(self, name, f)      # looked up once
        return f


_cn: Any = _Kernels()


def _tensor(a: np.ndarray) -> Tensor:
    """A result array as a tensor over the same memory, through a DLPack
    capsule cynorm makes (one torch call for every dtype: torch.from_numpy
    cannot name bfloat16, and costs more where the model's other operators
    leave the caches cold)."""
    return _from_dlpack(to_dlpack(a))


# a batched tensor (torch.func.vmap's) that reaches an operator's eager
# formula: in a backward, where vmap's own "does not have vmap support"
# check does not run
_NO_VMAP = ("cynorm.torch's operators do not support vmap: a batched tensor reached one "
            "(torch.func.vmap, jacrev, jacfwd or hessian, or torch.autograd.grad with "
            "is_grads_batched=True); compute the derivatives one at a time, or use "
            "PyTorch's norms there")


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
                if _functorch.is_batchedtensor(t):
                    raise RuntimeError(_NO_VMAP)
                t = _functorch.get_unwrapped(t)
            return _array(t)
    return _memory(t)


def _memory(t: Tensor) -> np.ndarray:
    """A plain tensor (no torch.func wrapper) as _array gives it: a CPU
    tensor of cynorm's dtypes through its attributes (tensor_view: no
    operator call; Tensor.numpy() makes four, costly where the model's other
    operators leave the caches cold), the rest through Tensor.numpy()."""
    dtype = _NUMPY.get(t.dtype)
    if dtype is None and t.dtype == torch.bfloat16:
        dtype = _NUMPY[torch.bfloat16] = _dtypes.bfloat16()
    if dtype is not None and t.is_cpu and not t.is_neg():
        try:
            a = tensor_view(t, dtype)
        except RuntimeError:
            # a batched tensor has no storage (is_grads_batched's gradients)
            if _functorch.is_legacy_batchedtensor(t):
                raise RuntimeError(_NO_VMAP) from None
            raise
        if a is not None:
            return a
    if t.dtype == torch.bfloat16:
        return t.detach().view(torch.int16).numpy().view(_dtypes.bfloat16())
    return t.numpy(force=True)      # detached (on the CPU, a view: no copy)


def _plain(*args):
    """Arguments as the kernels take them: tensors as arrays (_array), the
    rest as they are."""
    return [_array(a) if isinstance(a, Tensor) else a for a in args]


def _outputs(x: Tensor, xa: np.ndarray, out, results: int = 1, dense: bool = False) -> Any:
    """The kernels' results as an operator's outputs: the first `results`
    (y; y and h) laid out as x (_like; xa: x as an array; dense: y
    contiguous), the statistics after them."""
    return (tuple(_like(a, x, xa, dense and i == 0) for i, a in enumerate(out[:results]))
            + tuple(_tensor(a) for a in out[results:]))


def _like(y: np.ndarray, x: Tensor, xa: np.ndarray, dense: bool = False) -> Tensor:
    """y as a tensor laid out as torch.empty_like(x) lays out, or (dense)
    contiguous: the layout the fake kernels promise, PyTorch's (its layer
    norm and instance norm return y contiguous whatever x's layout), copied
    only where cynorm returned another layout.  xa: x as an array (y with
    its strides has x's layout, and x is then dense, a layout empty_like
    keeps: no torch call needed to tell)."""
    t = _tensor(y)
    if dense:
        return t if t.is_contiguous() else t.contiguous()
    if y.strides == xa.strides or t.stride() == torch.empty_like(x, device="meta").stride():
        return t
    return torch.empty_like(x).copy_(t)


def _stat_dtype(x: Tensor) -> torch.dtype:
    """The statistics' dtype: float32 for 16-bit x, else x's."""
    return torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype


def _wanted(t: Tensor, wanted: bool) -> Optional[Tensor]:
    return t if wanted else None


def _nothing(x: Tensor) -> Tensor:
    # a gradient not asked for (the operators return tensors only)
    return x.new_empty(0)


def _gradients(x: Tensor, xa: np.ndarray, gx: Optional[np.ndarray],
               *gp: Optional[np.ndarray]):
    """A backward operator's outputs: grad_x laid out as x (xa: x as an
    array), then the parameters' gradients; an empty tensor for each one not
    computed."""
    return ((_like(gx, x, xa) if gx is not None else _nothing(x),)
            + tuple(_tensor(g) if g is not None else _nothing(x) for g in gp))


def _ours(x: Tensor, *params: Optional[Tensor], dtype_rule: bool = True) -> bool:
    """Whether cynorm's kernels take this call: CPU tensors of its dtypes,
    the parameters (with dtype_rule) of x's dtype or float32 for 16-bit x,
    cynorm's dtype rule.  The rest runs PyTorch's kernels, which compute or
    raise as they do (a float64 weight beside float32 input: RMS norm
    computes, with a warning; layer norm raises)."""
    dtype = x.dtype
    if not (x.is_cpu and dtype in _DTYPES):
        return False
    wide = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    # a loop, not all() over a generator: a call's fixed cost (docs/torch.rst)
    for p in params:
        if p is not None and not (p.is_cpu and (not dtype_rule or p.dtype == dtype
                                                or p.dtype == wide)):
            return False
    return True


_SAVED = object()      # an input Eager.jvp finds in ctx.saved_tensors


def _transformed() -> bool:
    """Whether a call runs under forward-mode AD (dual tensors) or a
    torch.func transform, where tensors carry what a plain call would drop."""
    return (torch.autograd.forward_ad._current_level >= 0
            or _functorch.peek_interpreter_stack() is not None)


def _tangents(fn, inputs, input_tangents, running=(), outputs=1, dense=False):
    """An operator's output tangents, for a body that calls fn on its own
    arguments: cynorm.jvp's rule on the inputs as arrays (lists as tuples),
    the first `outputs` outputs laid out as the outputs are (_like, dense
    as _register's).  running: the
    positions of running statistics, which the body updates in copies (their
    tangents too, here)."""
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
    # (cynorm.jvp finds the rule by the function itself)
    _, out = _cn.jvp(fn.__wrapped__ if isinstance(fn, OutsideCache) else fn, primals, tangents)
    return (tuple(_like(o, inputs[0], primals[0], dense and i == 0)
                  for i, o in enumerate(out[:outputs]))
            + tuple(None if o is None else _tensor(o) for o in out[outputs:]))


class ArgumentError(ValueError, RuntimeError):
    """A bad argument to one of this module's functions or modules (a shape,
    a value): a ValueError, as cynorm's NumPy functions raise, that is also
    the RuntimeError PyTorch raises for the same mistake."""


class ArgumentTypeError(TypeError, RuntimeError):
    """An argument of the wrong type (``eps`` as a string, a float group
    count): a TypeError, as cynorm's NumPy functions raise, that is also a
    RuntimeError, the class PyTorch raises for most bad arguments."""


def _torch_error(e: Exception) -> Exception:
    """cynorm's argument error e as the class above that extends it (the
    same message and traceback); any other exception as it is."""
    kind = {ValueError: ArgumentError, TypeError: ArgumentTypeError}.get(type(e))
    return e if kind is None else kind(*e.args).with_traceback(e.__traceback__)


def _buffers_without_grad(name: str, running_mean: Optional[Tensor],
                          running_var: Optional[Tensor]) -> None:
    """Refuse running statistics that require grad, as PyTorch's batch and
    instance norm do (their operators have no derivative in them: a
    gradient would otherwise be silently missing)."""
    if torch.is_grad_enabled():
        for arg, t in (("running_mean", running_mean), ("running_var", running_var)):
            if t is not None and t.requires_grad:
                raise ArgumentError(f"cynorm.torch.{name} is not differentiable with respect "
                                    f"to {arg}, as PyTorch's: it cannot have requires_grad "
                                    f"True")


def _real(value: Any, name: str) -> float:
    """A float argument as PyTorch's functions take it: a Python or NumPy
    number, a bool, a one-element tensor; a string or None refused, as
    PyTorch refuses them (float() would read "1e-5")."""
    if not isinstance(value, (str, bytes)):
        try:
            return float(value)
        except TypeError:
            pass
    raise ArgumentTypeError(f"{name} must be a float, got {type(value).__name__}")


def _integer(value: Any, name: str) -> int:
    """An int argument as PyTorch's functions take it (cynorm's check_int:
    an integer, not a bool, nor a float that int() would truncate)."""
    try:
        return check_int(value, name)
    except TypeError as e:
        raise _torch_error(e) from None


_NATIVE: dict[str, Any] = {}


def _native_op(name: str) -> Any:
    """torch.ops.cynorm_native.<name>'s C++ callable (_torch_native: built
    or loaded on the first call), or None where the compiled operators are
    off or could not be built."""
    op = _NATIVE.get(name, False)
    if op is False:
        ops = _torch_native.load(torch, (_layernorm.native_abi(), _channels_abi()))
        overload = None if ops is None else getattr(ops, name).default
        # the overload's own callable: past OpOverload.__call__'s Python
        op = _NATIVE[name] = getattr(overload, "_op", overload)
    return op


def native_status() -> str:
    """Which path eager norm calls with gradients take.

    :func:`layer_norm`, :func:`rms_norm`, :func:`add_layer_norm`,
    :func:`add_rms_norm`, :func:`batch_norm`, :func:`group_norm` and
    :func:`instance_norm` calls (and the modules') that need gradients run
    cynorm's compiled operators (instance norm's without running
    statistics), whose autograd formula is C++, where they
    are loaded, else its Python autograd Functions.  Both run the same
    kernels and give the same bits; the compiled operators cost less a call
    (docs/torch.rst, "Cost per call").  ``CYNORM_TORCH_NATIVE=0`` turns
    them off.

    Returns
    -------
    str
        ``"loaded from <path>"``; ``"off ..."``; ``"unavailable (<reason>)
        ..."``; or, before the first such call, ``"not loaded yet ..."``.
    """
    return _torch_native.status()


def _one_level(name, backward):
    """The Function's derivatives are cynorm's kernels on plain arrays: a
    second level of differentiation would see constants.  Refused: nested
    torch.func transforms, and a backward that builds a graph
    (create_graph=True; torch.func.grad asks for one at its single level)."""
    levels = (0 if _functorch.peek_interpreter_stack() is None
              else len(retrieve_all_functorch_interpreters()))
    if levels > 1 or (backward and levels == 0 and torch.is_grad_enabled()):
        raise NotImplementedError(
            f"cynorm.torch.{name}: a derivative of a derivative (double backward, "
            "create_graph=True, nested torch.func transforms) is not supported: "
            "cynorm's backward and forward-mode rules are not differentiable themselves")


def _register(name, forward, forward_fake, backward, backward_fake, *, core, backward_core,
              saved, attrs, grad, tangents, running=(), outputs=1, dense=False, native=None):
    """The operators cynorm::<name> and cynorm::<name>_backward, made from
    their bodies (forward, backward) and fake kernels, with their autograd
    formula; returns the function that runs them.

    The formula: saved(inputs, outputs), what the backward reads (tensors,
    or arrays), and attrs(ctx, inputs), the rest of what it needs, taken in
    the forward; grad(ctx, backward, saved, grad_y) the inputs' gradients,
    backward computing them from the backward operator's arguments.
    core, backward_core: the bodies on arrays (the kernels' calls);
    running: the positions of the running statistics, which the kernels
    update in place (the operators, which are functional, on copies) where
    the argument after them is true; outputs: how many of the operator's
    leading outputs are results laid out as the first input, with
    gradients (y; y and h for the residual-fused norms), grad then taking
    the gradient of each (None for one not used, in an eager call); dense:
    y comes back contiguous instead, as PyTorch's operator returns it (the
    op's body, fake kernel and tangents do the same).

    torch.compile and torch.export trace the operators.  Eager calls run the
    cores: straight where nothing needs a gradient (PyTorch's operator
    dispatch costs tens of microseconds a call in Python, more than the
    kernels on small tensors), else through one of two
    torch.autograd.Functions: Plain, whose forward keeps the arrays its
    backward reads (a call's Python work is much of its cost where the
    model's large operators leave the caches cold), or, under torch.func's
    transforms and dual tensors, Eager, which runs the operators' bodies and
    whose forward-mode rule is tangents(inputs, input_tangents):
    cynorm.jvp's rule.  native: the name of the compiled operator
    (_torch_native; its autograd formula in C++) that takes Plain's calls
    where it is loaded and the arguments are its plain case (it returns None
    for the rest, which Plain takes)."""
    op = torch.library.custom_op(f"cynorm::{name}", forward, mutates_args=(),
                                 device_types="cpu")
    op.register_fake(forward_fake)
    bop = torch.library.custom_op(f"cynorm::{name}_backward", backward, mutates_args=(),
                                  device_types="cpu")
    bop.register_fake(backward_fake)

    # the leading inputs the backward does not read: the residual-fused
    # norms' x and residual (it reads h)
    unread = 2 if outputs > 1 else 0

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*saved(inputs, output))
        attrs(ctx, inputs)
        if running:
            ctx.mark_non_differentiable(*output[-2:])

    op.register_autograd(lambda ctx, *g: grad(ctx, bop, ctx.saved_tensors, *g[:outputs]),
                         setup_context=setup)
    # the op's outputs past the results (the statistics; the running ones):
    # None where an eager call returns the results alone
    hints = typing.get_type_hints(forward)
    rest = (None,) * (len(typing.get_args(hints.pop("return"))) - outputs)
    # the positions of the tensor arguments (Tensor or Optional[Tensor]), and
    # of those Plain saves (below)
    tensor_args = tuple(i for i, h in enumerate(hints.values())
                        if h is Tensor or Tensor in typing.get_args(h))
    reread = tuple(i for i in tensor_args if i not in running and i >= unread)

    def compute(inputs, array=_array):
        # the kernels on the inputs' memory (the running statistics updated
        # in place: their version counters bumped, as an in-place torch op)
        arrays = [array(t) if isinstance(t, Tensor) else t for t in inputs]
        out = core(*arrays)
        if running and inputs[running[-1] + 1]:
            torch.autograd.graph.increment_version(
                [inputs[i] for i in running if inputs[i] is not None])
        return arrays, out

    class Plain(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            arrays, out = compute(inputs, _memory)
            ys = [_like(o, inputs[0], arrays[0], dense and i == 0)
                  for i, o in enumerate(out[:outputs])]
            ctx.arrays = saved(arrays, out)
            # the tensors read again, for autograd's check that none changed
            # (and the layout of grad_x, the first): the inputs, but for the
            # residual-fused norms h in place of x and residual, which their
            # backward does not read (nor keeps alive, as the unfused
            # composition does not)
            ctx.save_for_backward(*ys[1:], *[inputs[i] for i in reread
                                             if inputs[i] is not None])
            if unread and not any(ctx.needs_input_grad[:unread]):
                # h, as x + residual, has a gradient only where one of them does
                ctx.mark_non_differentiable(ys[1])
            attrs(ctx, inputs)
            ctx.set_materialize_grads(False)
            return ys[0] if outputs == 1 else tuple(ys)

        @staticmethod
        def backward(ctx, *grads):
            _one_level(name, True)
            x = ctx.saved_tensors[0]
            if all(g is None for g in grads):
                return (None,) * len(ctx.needs_input_grad)
            return grad(ctx, lambda *a: _gradients(x, ctx.arrays[0], *backward_core(*a)),
                        ctx.arrays, *[_array(g) for g in grads])

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
            return grad(ctx, backward, ctx.saved_tensors, *grads[:outputs])

        @staticmethod
        def jvp(ctx, *input_tangents):
            _one_level(name, False)
            saved = iter(ctx.saved_tensors)
            inputs = [next(saved) if t is _SAVED else t for t in ctx.forward_inputs]
            return tangents(inputs, input_tangents)

    def run(*inputs):
        try:
            return call(*inputs)
        except (ValueError, TypeError) as e:
            raise _torch_error(e) from None

    def call(*inputs):
        if torch.compiler.is_compiling():
            return op(*inputs)
        if _transformed():
            return Eager.apply(*inputs)
        if torch.is_grad_enabled():
            # as Function.apply does: a dead torch.func wrapper (a tensor
            # kept from an exited transform) stands for the tensor it wraps.
            # One loop over the tensor arguments' positions, no generators:
            # this is every call's fixed cost
            grads = False
            for i in tensor_args:
                t = inputs[i]
                if t is not None:
                    u = _functorch.unwrap_if_dead(t)
                    if u is not t:
                        inputs = inputs[:i] + (u,) + inputs[i + 1:]
                    grads = grads or u.requires_grad
            if grads:
                compiled = _native_op(native) if native else None
                if compiled is not None:
                    res = compiled(*inputs)
                    if outputs == 1 and res is not None:
                        return (res,) + rest
                    if outputs > 1 and res[0] is not None:
                        return tuple(res) + rest
                return ((plain(*inputs),) if outputs == 1 else plain(*inputs)) + rest
        arrays, out = compute(inputs)
        return tuple(_like(o, inputs[0], arrays[0], dense and i == 0)
                     for i, o in enumerate(out[:outputs])) + rest

    Plain, Eager = _named(f"_{name}_plain", Plain), _named(f"_{name}_eager", Eager)
    # Plain.apply past Function.apply's Python (which checks what run has
    # checked: no torch.func transform, dead wrappers unwrapped)
    plain = _BASE_APPLY.__get__(None, Plain) if _BASE_APPLY is not None else None
    return run


# autograd.Function.apply's C base (a class method, bound to each Plain
# above); None under the docs build's stand-in for torch, where torch is not
# installed and nothing runs
_BASE_APPLY = vars(torch._C._FunctionBase).get("apply")


def _named(name, cls):
    """The Function cls under the name profiles show: its own, and its
    backward node's (name + "Backward"), which torch takes from the class
    statement."""
    body = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    # types.new_class, not type(): it resolves a base's __mro_entries__, which
    # the docs build's stand-in for torch (where torch is not installed) has
    return types.new_class(name, (torch.autograd.Function,),
                           exec_body=lambda ns: ns.update(body, __qualname__=name))


# ---- layer norm --------------------------------------------------------------

def _layer_norm_core(x, normalized_shape, weight, bias, eps):
    return _cn.layer_norm(x, tuple(normalized_shape), weight, bias, eps)


def _layer_norm_backward_core(grad_out, x, normalized_shape, mean, rstd, weight, bias,
                              output_mask):
    return _cn.layer_norm_backward(grad_out, x, tuple(normalized_shape), mean, rstd, weight,
                                   bias, tuple(output_mask))


def _layer_norm_fwd(x: Tensor, normalized_shape: List[int], weight: Optional[Tensor],
                    bias: Optional[Tensor], eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    a = _plain(x, normalized_shape, weight, bias, eps)
    return _outputs(x, a[0], _layer_norm_core(*a), dense=True)


def _layer_norm_fake(x, normalized_shape, weight, bias, eps):
    k = len(normalized_shape)
    shape = tuple(x.shape[:x.dim() - k]) + (1,) * k
    return (x.new_empty(x.shape), x.new_empty(shape, dtype=_stat_dtype(x)),
            x.new_empty(shape, dtype=_stat_dtype(x)))


def _layer_norm_bwd(grad_out: Tensor, x: Tensor, normalized_shape: List[int], mean: Tensor,
                    rstd: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                    output_mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    a = _plain(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask)
    return _gradients(x, a[1], *_layer_norm_backward_core(*a))


def _layer_norm_bwd_fake(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    return (torch.empty_like(x) if output_mask[0] else _nothing(x),
            torch.empty_like(weight) if output_mask[1] and weight is not None else _nothing(x),
            torch.empty_like(bias) if output_mask[2] and bias is not None else _nothing(x))


def _layer_norm_saved(inputs, output):
    x, _, weight, bias, _ = inputs
    return x, output[1], output[2], weight, bias


def _layer_norm_attrs(ctx, inputs):
    ctx.normalized_shape = inputs[1]


def _layer_norm_grad(ctx, backward, saved, gy):
    x, mean, rstd, weight, bias = saved
    need = ctx.needs_input_grad
    mask = [need[0], weight is not None and need[2], bias is not None and need[3]]
    gx, gw, gb = backward(gy, x, ctx.normalized_shape, mean, rstd, weight, bias, mask)
    return (_wanted(gx, mask[0]), None, _wanted(gw, mask[1]), _wanted(gb, mask[2]), None)


_layer_norm = _register("layer_norm", _layer_norm_fwd, _layer_norm_fake, _layer_norm_bwd,
                        _layer_norm_bwd_fake, core=_layer_norm_core,
                        backward_core=_layer_norm_backward_core, saved=_layer_norm_saved,
                        attrs=_layer_norm_attrs, grad=_layer_norm_grad,
                        tangents=lambda inputs, t: _tangents(_cn.layer_norm, inputs, t,
                                                             dense=True), dense=True,
                        native="layer_norm")


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
        The normalized tensor, contiguous whatever input's layout, as
        PyTorch's layer norm returns it.
        Tensors cynorm does not take (on a device, or of another dtype than
        float64, float32, bfloat16 and float16) run PyTorch's kernel.
    """
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if not _ours(input, weight, bias):
        return torch.nn.functional.layer_norm(input, shape, weight, bias, eps)
    return _layer_norm(input, shape, weight, bias, _real(eps, "eps"))[0]


# ---- RMS norm ----------------------------------------------------------------

def _rms_norm_core(x, normalized_shape, weight, eps):
    return _cn.rms_norm(x, tuple(normalized_shape), weight, eps)


def _rms_norm_backward_core(grad_out, x, normalized_shape, rstd, weight, output_mask):
    return _cn.rms_norm_backward(grad_out, x, tuple(normalized_shape), rstd, weight,
                                 tuple(output_mask))


def _rms_norm_fwd(x: Tensor, normalized_shape: List[int], weight: Optional[Tensor],
                  eps: Optional[float]) -> Tuple[Tensor, Tensor]:
    a = _plain(x, normalized_shape, weight, eps)
    return _outputs(x, a[0], _rms_norm_core(*a), dense=True)


def _rms_norm_fake(x, normalized_shape, weight, eps):
    k = len(normalized_shape)
    shape = tuple(x.shape[:x.dim() - k]) + (1,) * k
    return x.new_empty(x.shape), x.new_empty(shape, dtype=_stat_dtype(x))


def _rms_norm_bwd(grad_out: Tensor, x: Tensor, normalized_shape: List[int], rstd: Tensor,
                  weight: Optional[Tensor], output_mask: List[bool]) -> Tuple[Tensor, Tensor]:
    a = _plain(grad_out, x, normalized_shape, rstd, weight, output_mask)
    return _gradients(x, a[1], *_rms_norm_backward_core(*a))


def _rms_norm_bwd_fake(grad_out, x, normalized_shape, rstd, weight, output_mask):
    return (torch.empty_like(x) if output_mask[0] else _nothing(x),
            torch.empty_like(weight) if output_mask[1] and weight is not None else _nothing(x))


def _rms_norm_saved(inputs, output):
    x, _, weight, _ = inputs
    return x, output[1], weight


def _rms_norm_grad(ctx, backward, saved, gy):
    x, rstd, weight = saved
    need = ctx.needs_input_grad
    mask = [need[0], weight is not None and need[2]]
    gx, gw = backward(gy, x, ctx.normalized_shape, rstd, weight, mask)
    return _wanted(gx, mask[0]), None, _wanted(gw, mask[1]), None


_rms_norm = _register("rms_norm", _rms_norm_fwd, _rms_norm_fake, _rms_norm_bwd,
                      _rms_norm_bwd_fake, core=_rms_norm_core,
                      backward_core=_rms_norm_backward_core, saved=_rms_norm_saved,
                      attrs=_layer_norm_attrs, grad=_rms_norm_grad,
                      tangents=lambda inputs, t: _tangents(_cn.rms_norm, inputs, t, dense=True),
                      dense=True, native="rms_norm")


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
        The normalized tensor, contiguous whatever input's layout, as
        PyTorch's RMS norm returns it (PyTorch's kernel for tensors cynorm
        does not take).
    """
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if not _ours(input, weight):
        return torch.nn.functional.rms_norm(input, shape, weight, eps)
    eps = None if eps is None else _real(eps, "eps")
    return _rms_norm(input, shape, weight, eps)[0]


# ---- the residual add fused into layer norm and RMS norm ---------------------
# h = x + residual, then the norm of h; both y and h are results with
# gradients, and x and residual both take h's total gradient.

def _add_layer_norm_core(x, residual, normalized_shape, weight, bias, eps):
    return _cn.add_layer_norm(x, residual, tuple(normalized_shape), weight, bias, eps)


def _add_layer_norm_backward_core(grad_out, grad_h, h, normalized_shape, mean, rstd, weight,
                                  bias, output_mask):
    return _cn.add_layer_norm_backward(grad_out, grad_h, h, tuple(normalized_shape), mean,
                                       rstd, weight, bias, tuple(output_mask))


def _add_layer_norm_fwd(x: Tensor, residual: Tensor, normalized_shape: List[int],
                        weight: Optional[Tensor], bias: Optional[Tensor], eps: float,
                        ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    a = _plain(x, residual, normalized_shape, weight, bias, eps)
    return _outputs(x, a[0], _add_layer_norm_core(*a), results=2, dense=True)


def _add_layer_norm_fake(x, residual, normalized_shape, weight, bias, eps):
    # (y, h, mean, rstd): y as layer norm's, h laid out as x
    y, mean, rstd = _layer_norm_fake(x, normalized_shape, weight, bias, eps)
    return y, torch.empty_like(x), mean, rstd


def _add_layer_norm_bwd(grad_out: Tensor, grad_h: Optional[Tensor], h: Tensor,
                        normalized_shape: List[int], mean: Tensor, rstd: Tensor,
                        weight: Optional[Tensor], bias: Optional[Tensor],
                        output_mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    a = _plain(grad_out, grad_h, h, normalized_shape, mean, rstd, weight, bias, output_mask)
    return _gradients(h, a[2], *_add_layer_norm_backward_core(*a))


def _add_layer_norm_bwd_fake(grad_out, grad_h, h, normalized_shape, mean, rstd, weight, bias,
                             output_mask):
    return _layer_norm_bwd_fake(grad_out, h, normalized_shape, mean, rstd, weight, bias,
                                output_mask)


def _add_layer_norm_saved(inputs, output):
    _, _, _, weight, bias, _ = inputs
    return output[1], output[2], output[3], weight, bias


def _add_layer_norm_attrs(ctx, inputs):
    ctx.normalized_shape = inputs[2]


def _y_gradient(gy, gh):
    """The gradient of y where an eager call's backward has only h's (y not
    used further): zeros, which the backward kernels take."""
    if gy is not None:
        return gy
    return np.zeros_like(gh) if isinstance(gh, np.ndarray) else torch.zeros_like(gh)


def _add_layer_norm_grad(ctx, backward, saved, gy, gh):
    h, mean, rstd, weight, bias = saved
    need = ctx.needs_input_grad
    # (y not used: no parameter gradients, as torch's unfused composition)
    mask = [need[0] or need[1], weight is not None and need[3] and gy is not None,
            bias is not None and need[4] and gy is not None]
    gi, gw, gb = backward(_y_gradient(gy, gh), gh, h, ctx.normalized_shape, mean, rstd, weight,
                          bias, mask)
    return (_wanted(gi, need[0]), _wanted(gi, need[1]), None, _wanted(gw, mask[1]),
            _wanted(gb, mask[2]), None)


_add_layer_norm = _register("add_layer_norm", _add_layer_norm_fwd, _add_layer_norm_fake,
                            _add_layer_norm_bwd, _add_layer_norm_bwd_fake,
                            core=_add_layer_norm_core,
                            backward_core=_add_layer_norm_backward_core,
                            saved=_add_layer_norm_saved, attrs=_add_layer_norm_attrs,
                            grad=_add_layer_norm_grad, outputs=2,
                            tangents=lambda inputs, t: _tangents(_cn.add_layer_norm, inputs, t,
                                                                 outputs=2, dense=True),
                            dense=True, native="add_layer_norm")


def _add_rms_norm_core(x, residual, normalized_shape, weight, eps):
    return _cn.add_rms_norm(x, residual, tuple(normalized_shape), weight, eps)


def _add_rms_norm_backward_core(grad_out, grad_h, h, normalized_shape, rstd, weight,
                                output_mask):
    return _cn.add_rms_norm_backward(grad_out, grad_h, h, tuple(normalized_shape), rstd, weight,
                                     tuple(output_mask))


def _add_rms_norm_fwd(x: Tensor, residual: Tensor, normalized_shape: List[int],
                      weight: Optional[Tensor], eps: Optional[float],
                      ) -> Tuple[Tensor, Tensor, Tensor]:
    a = _plain(x, residual, normalized_shape, weight, eps)
    return _outputs(x, a[0], _add_rms_norm_core(*a), results=2, dense=True)


def _add_rms_norm_fake(x, residual, normalized_shape, weight, eps):
    y, rstd = _rms_norm_fake(x, normalized_shape, weight, eps)
    return y, torch.empty_like(x), rstd


def _add_rms_norm_bwd(grad_out: Tensor, grad_h: Optional[Tensor], h: Tensor,
                      normalized_shape: List[int], rstd: Tensor, weight: Optional[Tensor],
                      output_mask: List[bool]) -> Tuple[Tensor, Tensor]:
    a = _plain(grad_out, grad_h, h, normalized_shape, rstd, weight, output_mask)
    return _gradients(h, a[2], *_add_rms_norm_backward_core(*a))


def _add_rms_norm_bwd_fake(grad_out, grad_h, h, normalized_shape, rstd, weight, output_mask):
    return _rms_norm_bwd_fake(grad_out, h, normalized_shape, rstd, weight, output_mask)


def _add_rms_norm_saved(inputs, output):
    _, _, _, weight, _ = inputs
    return output[1], output[2], weight


def _add_rms_norm_grad(ctx, backward, saved, gy, gh):
    h, rstd, weight = saved
    need = ctx.needs_input_grad
    mask = [need[0] or need[1], weight is not None and need[3] and gy is not None]
    gi, gw = backward(_y_gradient(gy, gh), gh, h, ctx.normalized_shape, rstd, weight, mask)
    return _wanted(gi, need[0]), _wanted(gi, need[1]), None, _wanted(gw, mask[1]), None


_add_rms_norm = _register("add_rms_norm", _add_rms_norm_fwd, _add_rms_norm_fake,
                          _add_rms_norm_bwd, _add_rms_norm_bwd_fake, core=_add_rms_norm_core,
                          backward_core=_add_rms_norm_backward_core, saved=_add_rms_norm_saved,
                          attrs=_add_layer_norm_attrs, grad=_add_rms_norm_grad, outputs=2,
                          tangents=lambda inputs, t: _tangents(_cn.add_rms_norm, inputs, t,
                                                               outputs=2, dense=True),
                          dense=True, native="add_rms_norm")


def _fused(input: Tensor, residual: Tensor, name: str, *params: Optional[Tensor]) -> bool:
    """Whether the fused kernel takes the call: tensors cynorm takes, and a
    residual of input's shape and dtype (the kernel adds without
    broadcasting or type promotion; the callers run PyTorch's add and
    cynorm's norm otherwise)."""
    if not isinstance(residual, Tensor):
        raise TypeError(f"cynorm.torch.{name}: residual must be a torch.Tensor, "
                        f"got {type(residual).__name__}")
    return (residual.shape == input.shape and residual.dtype == input.dtype
            and _ours(input, residual, *params))


def add_layer_norm(input: Tensor, residual: Tensor, normalized_shape,
                   weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                   eps: float = 1e-5) -> Tuple[Tensor, Tensor]:
    """The residual add fused into layer norm, with autograd: ``h = input +
    residual``, ``y = layer_norm(h)``, in one pass over the rows.

    The same values as ``h = input + residual`` followed by
    :func:`layer_norm` (h rounded to input's dtype first), and the same
    gradients: ``input`` and ``residual`` both take h's, which sums what
    reaches h through y and through the later uses of h.

    Parameters
    ----------
    input, residual : torch.Tensor
        Fused where they have the same shape and dtype; otherwise (a
        residual that broadcasts, or of another dtype, as a float32
        residual stream beside bfloat16 activations under autocast)
        PyTorch's add, with its broadcasting and type promotion, then
        :func:`layer_norm`.
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
    y : torch.Tensor
        layer_norm(h), contiguous (as PyTorch's layer norm returns it).
    h : torch.Tensor
        input + residual, laid out as ``torch.empty_like(input)``: the next
        block's residual.  Changing it in place before the backward is an
        error, as for a tensor a PyTorch operator saved.

    Raises
    ------
    TypeError
        If residual is not a tensor.

    Notes
    -----
    Tensors cynorm does not take (on a device, or of another dtype than
    float64, float32, bfloat16 and float16) run the unfused composition in
    PyTorch's operators.
    """
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if not _fused(input, residual, "add_layer_norm", weight, bias):
        h = input + residual
        return layer_norm(h, shape, weight, bias, eps), h
    y, h, _, _ = _add_layer_norm(input, residual, shape, weight, bias, _real(eps, "eps"))
    return y, h


def add_rms_norm(input: Tensor, residual: Tensor, normalized_shape,
                 weight: Optional[Tensor] = None,
                 eps: Optional[float] = None) -> Tuple[Tensor, Tensor]:
    """The residual add fused into RMS norm, with autograd: ``h = input +
    residual``, ``y = rms_norm(h)``, in one pass over the rows (vLLM's and
    FlashInfer's ``fused_add_rmsnorm``, functional).

    The same values as ``h = input + residual`` followed by
    :func:`rms_norm` (h rounded to input's dtype first), and the same
    gradients: ``input`` and ``residual`` both take h's.

    Parameters
    ----------
    input, residual : torch.Tensor
        Fused where they have the same shape and dtype; otherwise PyTorch's
        add (broadcasting, type promotion), then :func:`rms_norm`.
    normalized_shape : int or sequence of int
        The trailing shape normalized over.
    weight : torch.Tensor, optional
        Shape ``normalized_shape``; None: no scale.
    eps : float, optional
        Added to the mean square; None: the machine epsilon of the math
        type (float32 for 16-bit input), as ``torch.nn.functional.rms_norm``.

    Returns
    -------
    y : torch.Tensor
        rms_norm(h), contiguous (as PyTorch's RMS norm returns it).
    h : torch.Tensor
        input + residual, laid out as ``torch.empty_like(input)``.
        Changing it in place before the backward is an error.

    Raises
    ------
    TypeError
        If residual is not a tensor.

    Notes
    -----
    Tensors cynorm does not take run the unfused composition in PyTorch's
    operators.

    Examples
    --------
    >>> import torch, cynorm.torch as ct
    >>> x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    >>> r = torch.tensor([[2.0, 2.0]])
    >>> y, h = ct.add_rms_norm(x, r, 2, eps=0.0)
    >>> h.tolist()
    [[3.0, 4.0]]
    >>> (y * h).sum().backward()        # gradients through both y and h
    >>> x.grad.shape
    torch.Size([1, 2])
    """
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if not _fused(input, residual, "add_rms_norm", weight):
        h = input + residual
        return rms_norm(h, shape, weight, eps), h
    eps = None if eps is None else _real(eps, "eps")
    y, h, _ = _add_rms_norm(input, residual, shape, weight, eps)
    return y, h


# ---- group norm --------------------------------------------------------------

def _group_norm_backward_core(grad_out, x, mean, rstd, weight, num_groups, output_mask):
    return _cn.group_norm_backward(grad_out, x, mean, rstd, weight, num_groups,
                                   tuple(output_mask))


def _group_norm_fwd(x: Tensor, num_groups: int, weight: Optional[Tensor], bias: Optional[Tensor],
                    eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    a = _plain(x, num_groups, weight, bias, eps)
    return _outputs(x, a[0], _cn.group_norm(*a))


def _group_norm_fake(x, num_groups, weight, bias, eps):
    shape = (x.shape[0], num_groups)
    return (torch.empty_like(x), x.new_empty(shape, dtype=_stat_dtype(x)),
            x.new_empty(shape, dtype=_stat_dtype(x)))


def _group_norm_bwd(grad_out: Tensor, x: Tensor, mean: Tensor, rstd: Tensor,
                    weight: Optional[Tensor], num_groups: int,
                    output_mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    a = _plain(grad_out, x, mean, rstd, weight, num_groups, output_mask)
    return _gradients(x, a[1], *_group_norm_backward_core(*a))


def _group_norm_bwd_fake(grad_out, x, mean, rstd, weight, num_groups, output_mask):
    C = x.shape[1]
    stat = weight.dtype if weight is not None else x.dtype
    return (torch.empty_like(x) if output_mask[0] else _nothing(x),
            x.new_empty(C, dtype=stat) if output_mask[1] else _nothing(x),
            x.new_empty(C, dtype=stat) if output_mask[2] else _nothing(x))


def _group_norm_saved(inputs, output):
    x, _, weight, _, _ = inputs
    return x, output[1], output[2], weight


def _group_norm_attrs(ctx, inputs):
    ctx.num_groups = inputs[1]
    ctx.has_bias = inputs[3] is not None


def _group_norm_grad(ctx, backward, saved, gy):
    x, mean, rstd, weight = saved
    need = ctx.needs_input_grad
    mask = [need[0], weight is not None and need[2], ctx.has_bias and need[3]]
    gx, gw, gb = backward(gy, x, mean, rstd, weight, ctx.num_groups, mask)
    return (_wanted(gx, mask[0]), None, _wanted(gw, mask[1]), _wanted(gb, mask[2]), None)


_group_norm = _register("group_norm", _group_norm_fwd, _group_norm_fake, _group_norm_bwd,
                        _group_norm_bwd_fake, core=_cn.group_norm,
                        backward_core=_group_norm_backward_core, saved=_group_norm_saved,
                        attrs=_group_norm_attrs, grad=_group_norm_grad,
                        tangents=lambda inputs, t: _tangents(_cn.group_norm, inputs, t),
                        native="group_norm")


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
    return _group_norm(input, _integer(num_groups, "num_groups"), weight, bias,
                       _real(eps, "eps"))[0]


# ---- batch norm --------------------------------------------------------------

def _functional_running(x, core, a, updated, dense=False):
    """An operator's forward with running statistics (batch and instance
    norm), functional as an operator with an autograd formula must be: the
    kernels update copies of them, returned as new tensors (empty ones where
    the call updates none).  a: the arguments as arrays; dense: y
    contiguous (instance norm's, as PyTorch's)."""
    rm, rv = ((None if s is None else s.copy()) for s in a[3:5]) if updated else a[3:5]
    out = _outputs(x, a[0], core(*a[:3], rm, rv, *a[5:]), dense=dense)
    return out + tuple(_tensor(s) if updated and s is not None else _nothing(x)
                       for s in (rm, rv))


def _running_fake(x, running_mean, running_var, updated):
    # the fake kernels' last two outputs, as _functional_running's
    return tuple(torch.empty_like(s) if updated and s is not None else _nothing(x)
                 for s in (running_mean, running_var))


def _copy(s):
    # a running statistic as the backward of an eval-mode call reads it:
    # as it was used (a later call may update the module's buffers)
    return None if s is None else s.clone() if isinstance(s, Tensor) else s.copy()


def _running_tangents(fn, inputs, input_tangents, dense=False):
    # batch and instance norm: (x, weight, bias, running_mean, running_var,
    # ...); the returned running statistics are not differentiable
    return _tangents(fn, inputs, input_tangents, running=(3, 4), dense=dense) + (None, None)


def _batch_norm_backward_core(grad_out, x, weight, running_mean, running_var, save_mean,
                              save_invstd, training, eps, output_mask):
    return _cn.batch_norm_backward(grad_out, x, weight, running_mean, running_var,
                                   save_mean if training else None,
                                   save_invstd if training else None, training, eps,
                                   tuple(output_mask))


def _batch_norm_fwd(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                    running_mean: Optional[Tensor], running_var: Optional[Tensor], training: bool,
                    momentum: float, eps: float) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return _functional_running(x, _cn.batch_norm, _plain(x, weight, bias, running_mean,
                                                         running_var, training, momentum, eps),
                               training)


def _batch_norm_fake(x, weight, bias, running_mean, running_var, training, momentum, eps):
    n = x.shape[1] if training else 0
    return (torch.empty_like(x), x.new_empty(n, dtype=_stat_dtype(x)),
            x.new_empty(n, dtype=_stat_dtype(x)),
            *_running_fake(x, running_mean, running_var, training))


def _batch_norm_bwd(grad_out: Tensor, x: Tensor, weight: Optional[Tensor],
                    running_mean: Optional[Tensor], running_var: Optional[Tensor],
                    save_mean: Tensor, save_invstd: Tensor, training: bool, eps: float,
                    output_mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    a = _plain(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, training,
               eps, output_mask)
    return _gradients(x, a[1], *_batch_norm_backward_core(*a))


def _batch_norm_bwd_fake(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd,
                         training, eps, output_mask):
    C = x.shape[1]
    stat = weight.dtype if weight is not None else _stat_dtype(x)
    return (torch.empty_like(x) if output_mask[0] else _nothing(x),
            x.new_empty(C, dtype=stat) if output_mask[1] else _nothing(x),
            x.new_empty(C, dtype=stat) if output_mask[2] else _nothing(x))


def _batch_norm_saved(inputs, output):
    x, weight, _, running_mean, running_var, training = inputs[:6]
    # eval: the running statistics as they were used
    return (x, weight, None if training else _copy(running_mean),
            None if training else _copy(running_var), output[1], output[2])


def _batch_norm_attrs(ctx, inputs):
    ctx.training, ctx.eps, ctx.has_bias = inputs[5], inputs[7], inputs[2] is not None


def _batch_norm_grad(ctx, backward, saved, gy):
    x, weight, rm, rv, save_mean, save_invstd = saved
    need = ctx.needs_input_grad
    mask = [need[0], weight is not None and need[1], ctx.has_bias and need[2]]
    gx, gw, gb = backward(gy, x, weight, rm, rv, save_mean, save_invstd, ctx.training, ctx.eps,
                          mask)
    return (_wanted(gx, mask[0]), _wanted(gw, mask[1]), _wanted(gb, mask[2]), None, None, None,
            None, None)


_batch_norm = _register("batch_norm", _batch_norm_fwd, _batch_norm_fake, _batch_norm_bwd,
                        _batch_norm_bwd_fake, core=_cn.batch_norm,
                        backward_core=_batch_norm_backward_core, saved=_batch_norm_saved,
                        attrs=_batch_norm_attrs, grad=_batch_norm_grad,
                        tangents=lambda inputs, t: _running_tangents(_cn.batch_norm, inputs, t),
                        running=(3, 4), native="batch_norm")


# ---- batch norm inside a compiled graph --------------------------------------

def _batch_norm_moments_core(x, eps):
    x, policy, _, _, _ = _channel_input(x, 1)
    (kx,), _, dims = _prepare([x], 1, ())
    return _channel_moments(kx, dims, policy, eps)


def _batch_norm_moments(x: Tensor, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    mean, var = _batch_norm_moments_core(_array(x), eps)
    math = _NUMPY[_stat_dtype(x)]
    hi = mean.astype(math)
    # x - hi is exact for x near the mean: (x - hi) - lo keeps what rounding
    # the mean to float32 drops, as cynorm's normalize kernel does
    lo = (mean - hi).astype(math)
    return _tensor(hi), _tensor(lo), _tensor(var.astype(math))


def _batch_norm_moments_fake(x, eps):
    return tuple(x.new_empty(x.shape[1], dtype=_stat_dtype(x)) for _ in range(3))


# Registered through torch.library.Library, not custom_op: the dispatcher
# calls it straight (custom_op's Python wrappers cost about 14 us a call,
# which shows on small activations).  No autograd formula: only
# _CompiledBatchNorm calls it, and its backward is the whole batch norm's.
_LIBRARY = torch.library.Library("cynorm", "FRAGMENT")
_LIBRARY.define("batch_norm_moments(Tensor x, float eps) -> (Tensor, Tensor, Tensor)",
                tags=(torch.Tag.flexible_layout,))
_LIBRARY.impl("batch_norm_moments", _batch_norm_moments, "CPU")
torch.library.register_fake("cynorm::batch_norm_moments", _batch_norm_moments_fake,
                            lib=_LIBRARY)
_moments_op = torch.ops.cynorm.batch_norm_moments.default


def _channel_shape(x: Tensor) -> Tuple[int, ...]:
    # a (C,) vector broadcast along x's axis 1
    return (1, -1) + (1,) * (x.dim() - 2)


def _centered(x: Tensor, hi: Tensor, lo: Optional[Tensor]) -> Tensor:
    """x - (hi + lo) in the statistics' dtype (lo None: x - hi)."""
    shape = _channel_shape(x)
    xc = x.to(hi.dtype) - hi.view(shape)
    return xc if lo is None else xc - lo.view(shape)


def _scale(rstd: Tensor, weight: Optional[Tensor]) -> Tensor:
    """rstd * weight per channel (rstd alone without a weight)."""
    return rstd if weight is None else rstd * weight.to(rstd.dtype)


def _normalized(x, weight, bias, hi, lo, rstd):
    """(x - mean) * rstd * weight + bias, mean = hi + lo, in x's dtype."""
    shape = _channel_shape(x)
    y = _centered(x, hi, lo) * _scale(rstd, weight).view(shape)
    if bias is not None:
        y = y + bias.to(y.dtype).view(shape)
    return y.to(x.dtype)


class _CompiledBatchNorm(torch.autograd.Function):
    """Training-mode batch norm in a torch.compile graph: the batch's
    statistics from cynorm's kernel (cynorm::batch_norm_moments: the mean,
    as hi + lo, and the biased variance, float64-summed, x read in the
    layout it comes in); the normalization and the backward in PyTorch
    operators, which Inductor fuses with the operators around them (a ReLU,
    a residual add) into its loops."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
        n = x.numel() // x.shape[1]
        hi, lo, var = _moments_op(x, eps)
        for buf, stat in ((running_mean, hi + lo), (running_var, var * (n / (n - 1)))):
            if buf is not None:
                buf.mul_(1.0 - momentum).add_(stat.to(buf.dtype), alpha=momentum)
        rstd = torch.rsqrt(var + eps)
        ctx.save_for_backward(x, weight, hi, lo, rstd)
        ctx.has_bias = bias is not None
        return _normalized(x, weight, bias, hi, lo, rstd)

    @staticmethod
    def backward(ctx, grad_out):
        # dx = (g - mean(g) - (x - mean) rstd^2 mean(g (x - mean))) rstd w
        x, weight, hi, lo, rstd = ctx.saved_tensors
        shape, dims = _channel_shape(x), [0] + list(range(2, x.dim()))
        per = 1.0 / (x.numel() // x.shape[1])
        g, xc = grad_out.to(hi.dtype), _centered(x, hi, lo)
        sum_g, sum_gx = g.sum(dims), (g * xc).sum(dims)
        grad_x = ((g - (sum_g * per).view(shape) - xc * (rstd * rstd * sum_gx * per).view(shape))
                  * _scale(rstd, weight).view(shape)).to(x.dtype)
        need = ctx.needs_input_grad
        grad_w = (sum_gx * rstd).to(weight.dtype) if weight is not None and need[1] else None
        grad_b = sum_g.to(hi.dtype if weight is None else weight.dtype) if ctx.has_bias and need[2] \
            else None
        return grad_x, grad_w, grad_b, None, None, None, None


def _compiled_batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps):
    """batch_norm in a torch.compile graph (_CompiledBatchNorm; in eval, the
    normalization by the running statistics, in PyTorch operators)."""
    if not training:
        math = _stat_dtype(x)
        return _normalized(x, weight, bias, running_mean.to(math), None,
                           torch.rsqrt(running_var.to(math) + eps))
    if x.numel() // x.shape[1] <= 1:
        raise ArgumentError(f"Expected more than 1 value per channel when training, got "
                            f"input of shape {tuple(x.shape)}")
    return _CompiledBatchNorm.apply(x, weight, bias, running_mean, running_var, momentum, eps)


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
        raise ArgumentError("batch_norm: running_mean and running_var are required when "
                            "training is False")
    _buffers_without_grad("batch_norm", running_mean, running_var)
    momentum, eps = _real(momentum, "momentum"), _real(eps, "eps")
    if torch.compiler.is_compiling() and not torch.compiler.is_exporting():
        return _compiled_batch_norm(input, running_mean, running_var, weight, bias,
                                    bool(training), momentum, eps)
    y, _, _, rm, rv = _batch_norm(input, weight, bias, running_mean, running_var,
                                  bool(training), momentum, eps)
    _store_running(running_mean, running_var, rm, rv, training)
    return y


def _store_running(running_mean, running_var, rm, rv, updated):
    """The operators' updated running statistics into the caller's buffers
    (outside the autograd graph, as torch updates its own); rm, rv None:
    an eager call's kernels updated them in place."""
    if not updated or (rm is None and rv is None):
        return
    with torch.no_grad():
        if running_mean is not None:
            running_mean.copy_(rm)
        if running_var is not None:
            running_var.copy_(rv)


# ---- instance norm -----------------------------------------------------------

def _instance_norm_backward_core(grad_out, x, mean, rstd, weight, use_input_stats,
                                 output_mask):
    return _cn.instance_norm_backward(grad_out, x, mean, rstd, weight, use_input_stats,
                                      tuple(output_mask))


def _instance_norm_fwd(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                       running_mean: Optional[Tensor], running_var: Optional[Tensor],
                       use_input_stats: bool, momentum: float,
                       eps: float) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return _functional_running(x, _cn.instance_norm,
                               _plain(x, weight, bias, running_mean, running_var,
                                      use_input_stats, momentum, eps), use_input_stats,
                               dense=True)


def _instance_norm_fake(x, weight, bias, running_mean, running_var, use_input_stats, momentum,
                        eps):
    shape = (x.shape[0], x.shape[1])
    return (x.new_empty(x.shape), x.new_empty(shape, dtype=_stat_dtype(x)),
            x.new_empty(shape, dtype=_stat_dtype(x)),
            *_running_fake(x, running_mean, running_var, use_input_stats))


def _instance_norm_bwd(grad_out: Tensor, x: Tensor, mean: Tensor, rstd: Tensor,
                       weight: Optional[Tensor], use_input_stats: bool,
                       output_mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    a = _plain(grad_out, x, mean, rstd, weight, use_input_stats, output_mask)
    return _gradients(x, a[1], *_instance_norm_backward_core(*a))


def _instance_norm_bwd_fake(grad_out, x, mean, rstd, weight, use_input_stats, output_mask):
    return _group_norm_bwd_fake(grad_out, x, mean, rstd, weight, 0, output_mask)


def _instance_norm_saved(inputs, output):
    return inputs[0], output[1], output[2], inputs[1]


def _instance_norm_attrs(ctx, inputs):
    ctx.use_input_stats, ctx.has_bias = inputs[5], inputs[2] is not None


def _instance_norm_grad(ctx, backward, saved, gy):
    x, mean, rstd, weight = saved
    need = ctx.needs_input_grad
    mask = [need[0], weight is not None and need[1], ctx.has_bias and need[2]]
    gx, gw, gb = backward(gy, x, mean, rstd, weight, ctx.use_input_stats, mask)
    return (_wanted(gx, mask[0]), _wanted(gw, mask[1]), _wanted(gb, mask[2]), None, None, None,
            None, None)


_instance_norm = _register("instance_norm", _instance_norm_fwd, _instance_norm_fake,
                           _instance_norm_bwd, _instance_norm_bwd_fake, core=_cn.instance_norm,
                           backward_core=_instance_norm_backward_core,
                           saved=_instance_norm_saved, attrs=_instance_norm_attrs,
                           grad=_instance_norm_grad,
                           tangents=lambda inputs, t: _running_tangents(_cn.instance_norm,
                                                                        inputs, t, dense=True),
                           running=(3, 4), dense=True, native="instance_norm")


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
        The normalized tensor, contiguous whatever input's layout, as
        PyTorch's instance norm returns it (PyTorch's kernel for tensors cynorm
        does not take).
    """
    if not _ours(input, weight, bias, running_mean, running_var) or input.dim() < 3:
        return torch.nn.functional.instance_norm(input, running_mean, running_var, weight,
                                                 bias, use_input_stats, momentum, eps)
    _buffers_without_grad("instance_norm", running_mean, running_var)
    if use_input_stats and math.prod(input.shape[2:]) == 1:
        raise ArgumentError(f"Expected more than 1 spatial element when training, got input "
                            f"size {input.size()}")
    y, _, _, rm, rv = _instance_norm(input, weight, bias, running_mean, running_var,
                                     bool(use_input_stats), _real(momentum, "momentum"),
                                     _real(eps, "eps"))
    _store_running(running_mean, running_var, rm, rv, use_input_stats)
    return y


# ---- weight norm -------------------------------------------------------------

def _weight_norm_fwd(v: Tensor, g: Tensor, dim: Optional[int]) -> Tuple[Tensor, Tensor]:
    a = _plain(v, g, dim)
    return _outputs(v, a[0], _cn.weight_norm_interface(*a))


def _weight_norm_fake(v, g, dim):
    return torch.empty_like(v), torch.empty_like(g, dtype=_stat_dtype(v))


def _weight_norm_bwd(grad_w: Tensor, v: Tensor, g: Tensor, norm: Tensor,
                     dim: Optional[int]) -> Tuple[Tensor, Tensor]:
    a = _plain(grad_w, v, g, norm, dim)
    return _gradients(v, a[1], *_cn.weight_norm_backward(*a))


def _weight_norm_bwd_fake(grad_w, v, g, norm, dim):
    return torch.empty_like(v), torch.empty_like(g)


def _weight_norm_saved(inputs, output):
    return inputs[0], inputs[1], output[1]


def _weight_norm_attrs(ctx, inputs):
    ctx.dim = inputs[2]


def _weight_norm_grad(ctx, backward, saved, gw):
    v, g, norm = saved
    gv, gg = backward(gw, v, g, norm, ctx.dim)
    return gv, gg, None


_weight_norm = _register("weight_norm", _weight_norm_fwd, _weight_norm_fake, _weight_norm_bwd,
                         _weight_norm_bwd_fake, core=_cn.weight_norm_interface,
                         backward_core=_cn.weight_norm_backward, saved=_weight_norm_saved,
                         attrs=_weight_norm_attrs, grad=_weight_norm_grad,
                         tangents=lambda inputs, t: _tangents(_cn.weight_norm_interface,
                                                              inputs, t))


class WeightNorm(torch.nn.utils.parametrizations._WeightNorm):
    """The parametrization ``torch.nn.utils.parametrizations.weight_norm``
    registers, computing w = g * v / ||v|| (``torch._weight_norm``) with
    cynorm's kernels (PyTorch's for tensors cynorm does not take)."""

    def forward(self, weight_g: Tensor, weight_v: Tensor) -> Tensor:
        if not _ours(weight_v, weight_g, dtype_rule=False) or weight_g.dtype not in _DTYPES:
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
    TypeError
        If model is not a ``torch.nn.Module``.
    ValueError
        Before swapping any, if one of them holds a parameter or buffer off
        the CPU (cynorm's kernels run on the CPU).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
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
