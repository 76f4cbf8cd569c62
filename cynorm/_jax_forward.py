"""Forward mode for cynorm.jax: one JAX primitive, linear in its tangents.

Each op of cynorm.jax is a ``jax.custom_jvp`` whose rule takes the primal
outputs from the op's kernels and y's tangent from :func:`tangent`, which
binds ``cynorm_tangent``: a primitive that is linear in the tangents it is
given, the op's inputs and saved statistics being constants to it.

* Evaluated (``jax.jvp``, ``jax.linearize``'s linear function), it runs the
  op's traced rule where it has one: the op's backward kernel as an XLA
  custom call for the normalized input's tangent, then XLA's own fused
  arithmetic for the parameters' terms.  Elsewhere (no XLA FFI), the op's
  cynorm JVP rule (``cynorm.jvp``) on the host through ``jax.pure_callback``.
* Transposed (``jax.grad``, ``jax.vjp``: JAX differentiates in reverse by
  transposing the forward mode), it runs the op's backward kernels.
* Under ``jax.vmap``, its evaluation and transposition are themselves
  vmapped, so the op's custom calls each run once over the batch (a set of
  each argument per element); where the parameters are unbatched, the row
  norms' rows and group and instance norm's samples take the batch as more
  rows or samples instead.
* Its own derivative is refused (a derivative of a derivative).

An op registers its two halves with :func:`register`.
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, batching, mlir

try:
    _core = importlib.import_module("jax.extend.core")
except ImportError:                  # JAX before jax.extend.core
    _core = importlib.import_module("jax.core")
Primitive = _core.Primitive


class _Rule(NamedTuple):
    # host(primals, tangents, static) -> y's tangent (NumPy), primals and
    # tangents as lists of NumPy arrays or None
    host: Callable[[list, list, tuple], np.ndarray]
    # backward(primals, ct, static) -> the gradients of the tangent slots
    # (None where a slot is None), primals and ct as JAX values
    backward: Callable[[list, Any, tuple], Sequence[Any]]
    # traced(primals, tangents, static) -> y's tangent as JAX values (XLA
    # custom calls and jax.numpy); None: the host rule through a callback
    traced: Optional[Callable[[list, list, tuple], Any]]
    # the slots (primals, then tangents) that hold rows of x (x, its
    # statistics, its tangent), the rest being parameters: under vmap with
    # the parameters unbatched, one call over the batch's rows; otherwise
    # (and None) the vmap is a level of the primitive (_over_levels)
    rows: Optional[frozenset]
    # whether the batch joins the rows' first axis (group and instance
    # norm's samples) rather than standing before them (the row norms, whose
    # every leading axis is rows)
    merge: bool


_RULES: dict[str, _Rule] = {}

_tangent_p = Primitive("cynorm_tangent")


def register(op: str, host: Callable[[list, list, tuple], np.ndarray],
             backward: Callable[[list, Any, tuple], Sequence[Any]],
             traced: Optional[Callable[[list, list, tuple], Any]] = None,
             rows: Optional[Sequence[int]] = None, merge: bool = False) -> None:
    """op's halves: its JVP (on the host, and traced where given), and its
    backward kernels; rows: the slots (positions among primals then
    tangents) that hold rows of x, where a batch of them is more rows (for
    the row norms, any leading axis; with merge, the first axis: group and
    instance norm's samples)."""
    _RULES[op] = _Rule(host, backward, traced, None if rows is None else frozenset(rows), merge)


def tangent(op: str, static: tuple, primals: Sequence[Any], tangents: Sequence[Any]) -> Any:
    """The tangent of op's first output y (x's shape and dtype), linear in
    `tangents`.  primals: op's differentiable inputs (x first), then what
    its backward needs (saved statistics); tangents: one per input, None
    where the input is None.  static: op's hashable non-array arguments."""
    slots = list(primals) + list(tangents)
    present = tuple(a is not None for a in slots)
    return _tangent_p.bind(*[a for a in slots if a is not None], op=op, static=static,
                           present=present, nprimal=len(primals), levels=())


# The primitive's parameters: op, static; present (which slots, primals then
# tangents, hold an array: the bound arrays are those); nprimal (how many
# slots are primals); levels: the vmaps it runs under that it does not fold,
# innermost first, each (batch size, which bound arrays carry its axis), the
# axes in front of an array's own, outermost first.


def _unpack(arrays: Sequence[Any], present: tuple, nprimal: int) -> tuple[list, list]:
    # (primals, tangents), None in the slots not present
    it = iter(arrays)
    slots = [next(it) if p else None for p in present]
    return slots[:nprimal], slots[nprimal:]


def _abstract(*arrays, op, static, present, nprimal, levels):
    # x's tangent, with every level's batch axis in front
    x = arrays[0]
    own = x.shape[sum(flags[0] for _, flags in levels):]
    return ShapedArray(tuple(size for size, _ in reversed(levels)) + own, x.dtype)


def _over_levels(fn: Callable[..., Any], levels: tuple) -> Callable[..., Any]:
    # fn, on one element's arrays, over the batch levels: a jax.vmap each,
    # innermost first (the op's custom calls then run once over each level)
    for size, flags in levels:
        fn = jax.vmap(fn, in_axes=tuple(0 if f else None for f in flags), axis_size=size)
    return fn


@functools.lru_cache(maxsize=256)
def _jitted(op, static, present, nprimal, levels):
    # the op's traced rule as one jitted function: evaluated eagerly it is
    # compiled (and fused) as it is inside a jit, so both give the same bits
    traced = _RULES[op].traced
    return jax.jit(_over_levels(
        lambda *arrays: traced(*_unpack(arrays, present, nprimal), static), levels))


def _impl(*arrays, op, static, present, nprimal, levels):
    rule = _RULES[op]
    if rule.traced is not None:
        return _jitted(op, static, present, nprimal, levels)(*arrays)

    def call(*arrays):
        x = arrays[0]

        def host(*values):
            primals, tangents = _unpack([np.asarray(v) for v in values], present, nprimal)
            return np.asarray(rule.host(primals, tangents, static))
        return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), *arrays,
                                 vmap_method="sequential")
    return _over_levels(call, levels)(*arrays)


def _transpose(ct, *arrays, op, static, present, nprimal, levels):
    nprim = sum(present[:nprimal])
    given, tangent_args = arrays[:nprim], arrays[nprim:]
    if any(ad.is_undefined_primal(a) for a in given):
        raise NotImplementedError(f"cynorm.jax.{op}: its tangent is linear in the tangents "
                                  "only, not in the op's inputs")
    if type(ct) is ad.Zero:
        grads = [None] * len(tangent_args)
    else:
        def backward(*args):
            # the gradients of the tangents present, for one element
            primals, _ = _unpack(args[:nprim], present[:nprimal], nprimal)
            grads = _RULES[op].backward(primals, args[nprim], static)
            return [g for g, p in zip(grads, present[nprimal:]) if p]
        for size, flags in levels:
            # each level's gradients summed over its axis for a tangent it
            # does not batch (shared by the level's elements)
            backward = functools.partial(_summed, jax.vmap(
                backward, in_axes=tuple(0 if f else None for f in flags[:nprim]) + (0,),
                axis_size=size), flags[nprim:])
        grads = backward(*given, ct)
    out = [None] * nprim
    for t, g in zip(tangent_args, grads):
        if not ad.is_undefined_primal(t):
            out.append(None)            # a constant (a zero tangent made concrete)
        elif g is None:
            out.append(jnp.zeros(t.aval.shape, t.aval.dtype))
        else:
            out.append(g)
    return out


def _summed(backward, batched, *args):
    return [g if g is None or b else g.sum(0) for g, b in zip(backward(*args), batched)]


def _batched(args, dims, *, op, static, present, nprimal, levels):
    # an op with row slots whose parameters are unbatched: the primitive
    # once over the batch's rows (its row slots batched, broadcast where
    # they are not; the parameters' tangents transpose to sums over every
    # row, as the batch's sum); otherwise a level more (_over_levels: the
    # op's custom calls each run once over the batch, a set per element)
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    rule = _RULES[op]
    slots = [i for i, p in enumerate(present) if p]
    params = dict(op=op, static=static, present=present, nprimal=nprimal)
    if not levels and rule.rows is not None and all(d is None for d, i in zip(dims, slots)
                                                    if i not in rule.rows):
        args = [batching.bdim_at_front(a, d, size) if i in rule.rows else a
                for a, d, i in zip(args, dims, slots)]
        if not rule.merge:
            return _tangent_p.bind(*args, levels=(), **params), 0
        # the batch joined to the first axis (x's, slot 0), and split from it again
        shape = args[0].shape
        args = [a.reshape((size * a.shape[1],) + a.shape[2:]) if i in rule.rows else a
                for a, i in zip(args, slots)]
        return _tangent_p.bind(*args, levels=(), **params).reshape(shape), 0
    front = [a if d is None else batching.bdim_at_front(a, d, size) for a, d in zip(args, dims)]
    level = (size, tuple(d is not None for d in dims))
    return _tangent_p.bind(*front, levels=levels + (level,), **params), 0


def _refuse(op: str) -> NotImplementedError:
    return NotImplementedError(
        f"cynorm.jax.{op}: a derivative of a derivative (jax.hessian, a jvp of a jvp or of a "
        "grad) is not supported: cynorm's backward and forward-mode rules are not "
        "differentiable themselves")


def _second_order(primals, tangents, *, op, **params):
    raise _refuse(op)


def first_order(op: str, fn: Callable[..., Any], nondiff_argnums: tuple[int, ...]) -> Any:
    """fn (an op's forward kernels, as its custom_jvp rule calls them) with
    a derivative that raises: differentiating the rule itself is a second
    derivative, which would otherwise fail inside JAX on the kernels' custom
    call."""
    wrapped = jax.custom_jvp(fn, nondiff_argnums=nondiff_argnums)

    def refused(*args):
        raise _refuse(op)
    wrapped.defjvp(refused)
    return wrapped


_tangent_p.def_abstract_eval(_abstract)
_tangent_p.def_impl(_impl)
mlir.register_lowering(_tangent_p, mlir.lower_fun(_impl, multiple_results=False))
ad.primitive_transposes[_tangent_p] = _transpose
ad.primitive_jvps[_tangent_p] = _second_order
batching.primitive_batchers[_tangent_p] = _batched
