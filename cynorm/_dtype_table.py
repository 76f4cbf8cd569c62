"""The storage types cynorm computes on, in one table.

setup.py renders the kernel templates from it (each storage type gets its
own kernel functions, named by suffix, and its index is the kernels'
storage code, `STORAGE_<SUFFIX>`); cynorm._dtypes builds the dtype policy
from it; _kernels/_plain.pyx reads it for the plain case.  Plain Python with
no imports: setup.py runs this file before NumPy's build is configured.

Columns: kernel suffix, NumPy dtype name, itemsize, C storage type, C math
type, math dtype name.  bfloat16 and float16 are stored as their raw uint16
bits and computed in float32.
"""
STORAGE_TYPES = (
    ("f32", "float32", 4, "float", "float", "float32"),
    ("f64", "float64", 8, "double", "double", "float64"),
    ("bf16", "bfloat16", 2, "uint16_t", "float", "float32"),
    ("f16", "float16", 2, "uint16_t", "float", "float32"),
)
