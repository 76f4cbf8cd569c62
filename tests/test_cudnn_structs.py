"""Every ctypes struct cudnn_bind passes to or reads from C, against the
real headers: cudaPointerAttributes of the CUDA 12 and CUDA 13 runtimes (a
struct too small for the runtime that fills it is a heap overflow), and
DLPack's tensor structs.  A tiny C program compiled against the headers
prints sizeof and offsetof; the ctypes layout must match field for field.
Also from the headers: CUDNN_BN_MIN_EPSILON, the eps floor cudnn_bind
enforces; and from the real runtimes of the wheels: the struct cudnn_bind
picks for each (cudaRuntimeGetVersion needs no GPU)."""
import ctypes
import importlib.util
import os
import shutil
import subprocess

import pytest

from cudnn_bind import _lib, memory
from cudnn_helpers import find, header_dirs, missing

pytestmark = pytest.mark.cudnn


def _compile_and_run(tmp_path, source, includes, parse=int):
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
    return {k: parse(v) for k, v in (line.split() for line in out.splitlines())}


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

# (include directories from site-packages/nvidia, the headers that must exist
# there: the runtime's and crt/host_defines.h, which it includes and which
# comes in another wheel; the install that brings them)
RUNTIMES = {
    "cuda12": (["cuda_runtime/include", "cuda_nvcc/include"],
               ["cuda_runtime/include/cuda_runtime_api.h", "cuda_nvcc/include/crt/host_defines.h"],
               "pip install --no-deps nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12"),
    "cuda13": (["cu13/include"],
               ["cu13/include/cuda_runtime_api.h", "cu13/include/crt/host_defines.h"],
               "pip install --no-deps nvidia-cuda-runtime==13.5.37 nvidia-cuda-crt==13.5.37"),
}


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_pointer_attributes_match_the_runtime_headers(runtime, tmp_path):
    dirs, headers, install = RUNTIMES[runtime]
    found = [find(h) for h in headers]
    if None in found:
        absent = ", ".join(h for h, f in zip(headers, found) if f is None)
        missing(f"the {runtime} runtime headers are not all installed: no {absent} ({install})")
    base = os.path.dirname(os.path.dirname(os.path.dirname(found[0])))  # .../nvidia
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


BN_MIN_EPSILON = r"""
#include <stdio.h>
#include <cudnn.h>
int main(void)
{
    printf("major %d\n", CUDNN_MAJOR);
    printf("min_epsilon %.17g\n", (double)CUDNN_BN_MIN_EPSILON);
    return 0;
}
"""


def test_the_eps_floor_is_cudnn_bn_min_epsilon_of_the_installed_headers(tmp_path):
    """_lib's per-version floor against the header of the cuDNN wheel installed
    here, and the real library of that wheel, loaded, uses it."""
    includes = header_dirs()
    if includes is None:
        missing("the cuDNN/CUDA headers are not installed (pip install --no-deps "
                "nvidia-cudnn-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12)")
    header = _compile_and_run(tmp_path, BN_MIN_EPSILON, includes, parse=float)
    major = int(header["major"])
    assert _lib.BN_MIN_EPSILON[major] == header["min_epsilon"], header
    path = find(f"cudnn/lib/libcudnn.so.{major}")
    if path is None:
        missing(f"the headers are cuDNN {major}'s but libcudnn.so.{major} is not installed")
    lib = _lib.Library(path)  # not installed as cudnn_bind's library: nothing else changes
    assert lib.major == major and lib.min_epsilon == header["min_epsilon"]


# (runtime wheel's library under site-packages/nvidia, sizeof(struct cudaPointerAttributes))
RUNTIME_LIBRARIES = {12: ("cuda_runtime/lib/libcudart.so.12", 24),
                     13: ("cu13/lib/libcudart.so.13", 88)}


@pytest.mark.parametrize("major", sorted(RUNTIME_LIBRARIES))
def test_each_cuda_runtime_wheel_loads_with_its_pointer_attributes(major, monkeypatch):
    """The real libcudart of the CUDA 12 and 13 wheels, found and loaded the
    way cudnn_bind does it (the wheel search; the runtime named by
    $CUDNN_BIND_CUDART where it is not the one cuDNN was built for): the
    runtime reports its version without a GPU, and the struct declared for
    cudaPointerGetAttributes is that runtime's size, 88 bytes for CUDA 13."""
    wheel_path, size = RUNTIME_LIBRARIES[major]
    wheel = find(wheel_path)
    if wheel is None:
        missing(f"the CUDA {major} runtime wheel is not installed ({RUNTIMES[f'cuda{major}'][2]})")
    cudnn = find("cudnn/lib/libcudnn.so.9") or find("cudnn/lib/libcudnn.so.8")
    if cudnn is None:
        missing("nvidia-cudnn-cu12 is not installed (pip install --no-deps nvidia-cudnn-cu12)")
    assert _lib.cudart_candidates(major)[0] == wheel  # the wheel comes first in the search
    monkeypatch.delenv("CUDNN_BIND_LIBRARY", raising=False)
    monkeypatch.delenv("CUDNN_BIND_CUDART", raising=False)
    lib = _lib.Library(cudnn)
    if lib.cudart_version // 1000 != major:  # not cuDNN's own runtime: name it, as a user would
        monkeypatch.setenv("CUDNN_BIND_CUDART", wheel)
        lib = _lib.Library(cudnn)
    assert lib.cudart_path == wheel
    assert lib.runtime_version // 1000 == major
    assert lib.PointerAttributes is _lib.pointer_attributes_type(lib.runtime_version)
    assert ctypes.sizeof(lib.PointerAttributes) == size
    declared = lib.cudart.cudaPointerGetAttributes.argtypes[0]
    assert declared._type_ is lib.PointerAttributes  # what the runtime is handed to fill
