"""Forward-mode derivatives (Jacobian-vector products) of cynorm's ops::

    outputs, output_tangents = cynorm.jvp(op, primals, tangents, **kwargs)

`op` is a cynorm function (or any function with a registered rule),
`primals` its positional arguments, `tangents` one entry per primal: an array
of the primal's shape and dtype, or None (a zero tangent; its work is
skipped).  Keyword arguments go to `op` unchanged and are never
differentiated.  `outputs` is what `op(*primals, **kwargs)` returns, and
`output_tangents` mirrors it (None where an output is None).

Rules are analytic and vectorized (NumPy, or fused Cython kernels where a
rule is a pass over a large array).  They live in `jvp_rules`, a mapping
op -> rule; `@register_jvp(op)` adds one for your own op.

The backward ops' rules follow PyTorch's forward-mode decompositions
(torch/_decomp/decompositions_for_jvp.py): the saved statistics (mean and
rstd / invstd of layer and batch norm, the norm of weight norm) are
functions of the input, recomputed from it, with eps held fixed; tangents
given for saved statistics are therefore accepted and ignored.

Arguments updated in place (batch_norm's running_mean / running_var in
training) have their tangents updated in place the same way, when given:
pass zeros to get the tangent of the update alone.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from cynorm._dtypes import policy_of
from cynorm._typing import Array
from cynorm._validation import dlpack_array, is_dlpack
from cynorm.forward_ad._registry import _op_name, jvp_rules, register_jvp
# the rule modules register their rules on import
from cynorm.forward_ad import (  # noqa: F401
    group_rules, norm_rules, rms_rules, seed_rules, split_stats_rules,
)

def _differentiable(x):
    """Whether primal x can carry a tangent: a floating array (not a scalar,
    shape, flag or integer array)."""
    return isinstance(x, np.ndarray) and policy_of(x.dtype) is not None


def _check_tangent(rule, i, primal, tangent):
    name = f"tangents[{i}] (for {rule.name_of(i)})"
    if rule.name_of(i) in rule.nondiff or not _differentiable(primal):
        what = (f"an array of dtype {primal.dtype}" if isinstance(primal, np.ndarray)
                else type(primal).__name__)
        raise TypeError(f"{name}: {rule.name_of(i)} is not differentiable ({what}); "
                        "pass None as its tangent")
    if not isinstance(tangent, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array or None, got {type(tangent).__name__}")
    if isinstance(tangent, np.ma.MaskedArray):     # its mask would be ignored
        raise TypeError(f"{name} is a masked array: pass its data and handle the mask yourself")
    if tangent.shape != primal.shape:
        raise ValueError(f"{name} must have the primal's shape {primal.shape}, got {tangent.shape}")
    if tangent.dtype != primal.dtype:
        raise TypeError(f"{name} must have the primal's dtype {primal.dtype}, got {tangent.dtype}")


def jvp(op: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Optional[Array]],
        **kwargs: Any) -> tuple[Any, Any]:
    """Outputs of ``op(*primals, **kwargs)`` and their tangents.

    Parameters
    ----------
    op : callable
        A function with a registered rule (see `jvp_rules`): every public
        op of cynorm and cynorm.aten, or one registered with `register_jvp`.
    primals : tuple or list
        op's positional arguments.
    tangents : tuple or list
        One entry per primal: a numpy.ndarray of the primal's shape and
        dtype, or None (a zero tangent; its work is skipped).  Only
        floating-array primals can have tangents.
    **kwargs
        op's keyword arguments (not differentiated).

    Returns
    -------
    outputs : object
        What ``op(*primals, **kwargs)`` returns.
    output_tangents : object
        With the structure of `outputs`: each output tangent has its
        output's shape and dtype (None where the output is None).

    Raises
    ------
    TypeError
        If op has no registered rule, primals or tangents is not a tuple or
        list, or a tangent is not an array of its primal's dtype, or is given
        for an argument that is not differentiable.
    ValueError
        If tangents has not one entry per primal, or a tangent's shape
        differs from its primal's.
    """
    try:
        rule = jvp_rules.get(op)
    except TypeError:            # unhashable op
        rule = None
    if rule is None:
        raise TypeError(f"jvp: no forward-mode rule is registered for {_op_name(op)}; "
                        "register one with @cynorm.register_jvp(op)")
    if not isinstance(primals, (tuple, list)):
        raise TypeError(f"jvp: primals must be a tuple or list of op's positional arguments, "
                        f"got {type(primals).__name__}")
    if not isinstance(tangents, (tuple, list)):
        raise TypeError(f"jvp: tangents must be a tuple or list, got {type(tangents).__name__}")
    if len(tangents) != len(primals):
        raise ValueError(f"jvp: tangents must have one entry per primal ({len(primals)}), "
                         f"got {len(tangents)}")
    # tensors of other libraries (DLPack) as arrays over their memory
    primals = tuple(dlpack_array(p, f"primals[{i}]") if is_dlpack(p) else p
                    for i, p in enumerate(primals))
    tangents = [dlpack_array(t, f"tangents[{i}]") if is_dlpack(t) else t
                for i, t in enumerate(tangents)]
    checked = []
    for i, (p, t) in enumerate(zip(primals, tangents)):
        if t is not None:
            _check_tangent(rule, i, p, t)
            if rule.name_of(i) in rule.ignored:
                t = None
        checked.append(t)
    return rule.fn(primals, tuple(checked), kwargs)


__all__ = ["jvp", "jvp_rules", "register_jvp"]
