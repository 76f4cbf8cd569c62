"""The registry of forward-mode rules: `jvp_rules` (op -> Rule) and the
`register_jvp` decorator the rule modules and users add rules with."""
from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, TypeVar, Union

import numpy as np

#: a rule: fn(primals, tangents, kwargs) -> (outputs, output_tangents)
RuleFunction = TypeVar("RuleFunction", bound=Callable[..., Any])

#: one argument name or several
ArgumentNames = Union[str, Iterable[str]]

jvp_rules: dict[Callable[..., Any], Rule] = {}


class Rule:
    """A registered rule: `fn(primals, tangents, kwargs) -> (outputs, tangents)`.

    `nondiff` names the arguments that take no tangent (shapes, flags, eps,
    index arrays ...); a tangent given for one is an error.  `ignored` names
    arguments whose tangents are accepted and dropped (saved statistics,
    which the rule recomputes from the input).
    """

    def __init__(self, op, fn, nondiff=(), ignored=()):
        self.op, self.fn = op, fn
        self.nondiff, self.ignored = frozenset(nondiff), frozenset(ignored)
        try:
            params = inspect.signature(op).parameters.values()
            self.names = [p.name for p in params
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):      # builtins without a signature
            self.names = []

    def name_of(self, i):
        return self.names[i] if i < len(self.names) else f"argument {i}"

    def __repr__(self):
        return f"<jvp rule for {_op_name(self.op)}>"


def _op_name(op):
    mod = getattr(op, "__module__", None) or ""
    name = getattr(op, "__qualname__", None) or repr(op)
    return f"{mod.split('.')[0]}.{name}" if mod.startswith("cynorm") else f"{mod}.{name}".lstrip(".")


def register_jvp(op: Callable[..., Any], *, nondiff: ArgumentNames = (),
                 ignored: ArgumentNames = ()) -> Callable[[RuleFunction], RuleFunction]:
    """Decorator: register ``rule(primals, tangents, kwargs)`` as op's JVP rule.

    The rule receives `primals`, the tuple of positional arguments (as the
    caller passed them), `tangents`, a tuple of the same length (None or an
    array of the primal's shape and dtype, already checked), and `kwargs`,
    the keyword arguments.  It returns ``(outputs, output_tangents)``.
    Registering an op again replaces its rule.

    Parameters
    ----------
    op : callable
        The function the rule differentiates (the key of `jvp_rules`).
    nondiff : str or iterable of str, optional
        Positional arguments that must not get a tangent (shapes, flags,
        eps, index arrays): a tangent given for one is a TypeError in `jvp`.
    ignored : str or iterable of str, optional
        Arguments whose tangents are accepted and dropped before the rule
        runs (saved statistics a rule recomputes from the input).

    Returns
    -------
    callable
        The decorator: it registers the rule and returns it unchanged.

    Raises
    ------
    TypeError
        If op or the decorated rule is not callable, or nondiff / ignored is
        not a name or an iterable of names.
    ValueError
        If nondiff and ignored name the same argument.
    """
    if not callable(op):
        raise TypeError(f"register_jvp: op must be callable, got {type(op).__name__}")
    nondiff = _names(nondiff, "nondiff")
    ignored = _names(ignored, "ignored")
    both = nondiff & ignored
    if both:
        raise ValueError(f"register_jvp: nondiff and ignored both name {sorted(both)}: an argument "
                         "either takes no tangent (nondiff) or has its tangent dropped (ignored)")

    def decorator(fn: RuleFunction) -> RuleFunction:
        if not callable(fn):
            raise TypeError(f"register_jvp: the rule must be callable, got {type(fn).__name__}")
        jvp_rules[op] = Rule(op, fn, nondiff, ignored)
        return fn
    return decorator


def _names(value: Any, name: str) -> frozenset[str]:
    """register_jvp's nondiff / ignored as a frozenset of argument names: one
    name (a str) or an iterable of them."""
    if isinstance(value, str):
        return frozenset((value,))
    if isinstance(value, (bytes, bytearray, np.ndarray)) or not hasattr(value, "__iter__"):
        raise TypeError(f"register_jvp: {name} must be an argument name or a sequence of argument "
                        f"names (str), got {type(value).__name__}")
    names = tuple(value)
    for i, n in enumerate(names):
        if not isinstance(n, str):
            raise TypeError(f"register_jvp: {name}[{i}] must be an argument name (str), got "
                            f"{type(n).__name__}")
    return frozenset(names)
