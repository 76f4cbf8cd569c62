"""Every ctypes struct cudnn_bind passes to or reads from C, against the
real headers: cudaPointerAttributes of the CUDA 12 and CUDA 13 runtimes (a
struct too small for the runtime that fills it is a heap overflow), and
DLPack's tensor structs.  A tiny C program compiled against the headers
prints sizeof and offsetof; the ctypes layout must match field for field."""
import ctypes
import importlib.util
import os
import shutil
import subprocess

import pytest

from cudnn_bind import _lib, memory
from cudnn_helpers import find, missing

pytestmark = pytest.mark.cudnn


def _compile_and_run(tmp_path, source, includes):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        missing("no C compiler to read the headers' struct layouts")
    src = tmp_path / "layout.c"
    src.write_text(source)
    exe = tmp_path / "layout"
    proc = subprocess.run([cc, *[f"-I{d}" for d in includes], str(src), "-o", str(exe)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


POINTER_ATTRIBUTES = r"""
#include <stddef.h>
#include <stdio.h>
#include <cuda_runtime_api.h>
int main(void)
{
    printf("version %d\n", CUDART_VERSION);
    printf("size %zu\n", sizeof(struct cudaPointerAttributes));
    printf("type %zu\n", offsetof(struct cudaPointerAttributes, type));
    printf("device %zu\n", offsetof(struct cudaPointerAttributes, device));
    printf("devicePointer %zu\n", offsetof(struct cudaPointerAttributes, devicePointer));
    printf("hostPointer %zu\n", offsetof(struct cudaPointerAttributes, hostPointer));
    return 0;
}
"""

# (include directories from site-packages/nvidia, the header that must exist there)
RUNTIMES = {
    "cuda12": (["cuda_runtime/include", "cuda_nvcc/include"], "cuda_runtime/include/cuda_runtime_api.h",
               "pip install --no-deps nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12"),
    "cuda13": (["cu13/include"], "cu13/include/cuda_runtime_api.h",
               "pip install --no-deps nvidia-cuda-runtime==13.5.37 nvidia-cuda-crt==13.5.37"),
}


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_pointer_attributes_match_the_runtime_headers(runtime, tmp_path):
    dirs, header, install = RUNTIMES[runtime]
    found = find(header)
    if found is None:
        missing(f"the {runtime} runtime headers are not installed ({install})")
    base = os.path.dirname(os.path.dirname(os.path.dirname(found)))  # .../nvidia
    layout = _compile_and_run(tmp_path, POINTER_ATTRIBUTES, [os.path.join(base, d) for d in dirs])
    struct = _lib.pointer_attributes_type(layout["version"])
    assert ctypes.sizeof(struct) == layout["size"], (runtime, layout)
    for field in ("type", "device", "devicePointer", "hostPointer"):
        assert getattr(struct, field).offset == layout[field], (runtime, field, layout)


DLPACK = r"""
#include <stddef.h>
#include <stdio.h>
#include <dlpack.h>
int main(void)
{
    printf("DLDevice %zu\n", sizeof(DLDevice));
    printf("DLDataType %zu\n", sizeof(DLDataType));
    printf("DLTensor %zu\n", sizeof(DLTensor));
    printf("DLTensor.data %zu\n", offsetof(DLTensor, data));
    printf("DLTensor.device %zu\n", offsetof(DLTensor, device));
    printf("DLTensor.ndim %zu\n", offsetof(DLTensor, ndim));
    printf("DLTensor.dtype %zu\n", offsetof(DLTensor, dtype));
    printf("DLTensor.shape %zu\n", offsetof(DLTensor, shape));
    printf("DLTensor.strides %zu\n", offsetof(DLTensor, strides));
    printf("DLTensor.byte_offset %zu\n", offsetof(DLTensor, byte_offset));
    printf("versioned.flags %zu\n", offsetof(DLManagedTensorVersioned, flags));
    printf("versioned.dl_tensor %zu\n", offsetof(DLManagedTensorVersioned, dl_tensor));
    printf("read_only %d\n", (int)DLPACK_FLAG_BITMASK_READ_ONLY);
    return 0;
}
"""


def test_dlpack_structs_match_dlpack_h(tmp_path):
    spec = importlib.util.find_spec("torch")
    header = None
    if spec is not None and spec.submodule_search_locations:
        candidate = os.path.join(spec.submodule_search_locations[0], "include", "ATen", "dlpack.h")
        header = candidate if os.path.exists(candidate) else None
    if header is None:
        pytest.skip("no dlpack.h (PyTorch ships one: pip install torch==2.13.0)")
    layout = _compile_and_run(tmp_path, DLPACK, [os.path.dirname(header)])
    assert ctypes.sizeof(memory._DLDevice) == layout["DLDevice"]
    assert ctypes.sizeof(memory._DLDataType) == layout["DLDataType"]
    assert ctypes.sizeof(memory._DLTensor) == layout["DLTensor"]
    for field in ("data", "device", "ndim", "dtype", "shape", "strides", "byte_offset"):
        assert getattr(memory._DLTensor, field).offset == layout[f"DLTensor.{field}"], field
    assert memory._DL_VERSIONED_OFFSET == layout["versioned.dl_tensor"]
    assert memory._DL_VERSIONED_FLAGS_OFFSET == layout["versioned.flags"]
    assert memory._DL_FLAG_READ_ONLY == layout["read_only"]
