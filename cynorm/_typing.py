"""The type aliases of cynorm's public signatures (PEP 484).

These are what a type checker (mypy, pyright) sees in users' code: cynorm
ships a ``py.typed`` marker.  The aliases stay broad where the functions
are: every array argument takes anything ``numpy.asarray`` takes (torch
and JAX tensors among them, by their ``__array__``; cynorm reads them
through ``__dlpack__``), every
array returned is a NumPy array (float64, float32, bfloat16 or float16:
NumPy's typing cannot spell ml_dtypes' bfloat16, so the dtype is Any).
"""
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

__all__ = ["Array", "ArrayLike", "DTypeLike", "Axis", "Dims", "OutArray", "OutArrays",
           "OutputMask", "Real", "NDArray", "Tuple"]

#: an array cynorm returns (or an ``out=`` it writes): any dtype
Array = NDArray[Any]

#: an axis, wrapping like NumPy's (-1 is the last one)
Axis = int

#: one axis, several, or None for every one
Dims = Union[int, Sequence[int], None]

#: ``out=`` of a function with one output: an array, a tuple of one, or None
OutArray = Union[NDArray[Any], Tuple[Optional[NDArray[Any]]], None]

#: ``out=`` of a function with several outputs: a tuple with one array or
#: None per output
OutArrays = Optional[Tuple[Optional[NDArray[Any]], ...]]

#: which gradients a backward computes, in the order of its outputs
OutputMask = Sequence[bool]

#: a real scalar argument (eps, momentum, pow ...): a Python or NumPy number
Real = Union[float, int, np.floating[Any], np.integer[Any]]
