"""cudnn_bind against the real libcudnn from the nvidia-cudnn wheels:
loading, symbols, status strings, descriptors, mode selection, and (on a
machine with no GPU; they skip where one is present) the no-GPU errors.
Anything that could crash runs in a child process."""
import ctypes
import os
import re
import subprocess
import sys
import textwrap

import pytest

import cudnn_bind
from cudnn_bind import _lib, errors
from cudnn_helpers import find, missing

pytestmark = pytest.mark.cudnn


@pytest.fixture(scope="module")
def lib():
    path = find("cudnn/lib/libcudnn.so.9") or find("cudnn/lib/libcudnn.so.8")
    if path is None:
        missing("nvidia-cudnn-cu12 is not installed (pip install --no-deps nvidia-cudnn-cu12)")
    try:
        loaded = cudnn_bind.load(path)
    except cudnn_bind.CudnnUnavailableError as exc:
        missing(f"the cuDNN wheel is installed but does not load: {exc}")
    yield loaded
    cudnn_bind.reset()


def test_loads_by_absolute_path_with_a_matching_runtime(lib):
    assert os.path.isabs(lib.cudnn_path) and os.path.isabs(lib.cudart_path)
    assert lib.major in (8, 9)
    assert cudnn_bind.version() == lib.version
    # the runtime is the major version cuDNN was built for, not whatever find_library says
    assert lib.cudart_path.endswith(f".so.{lib.cudart_version // 1000}")
    runtime = ctypes.c_int()
    lib.cuda("cudaRuntimeGetVersion", ctypes.byref(runtime))
    assert runtime.value // 1000 == lib.cudart_version // 1000


def test_every_declared_symbol_resolves_with_its_prototype(lib):
    tables = [(lib.cudnn, _lib.CUDNN_FUNCTIONS), (lib.cudart, _lib.CUDART_FUNCTIONS)]
    if lib.major >= 9:
        tables.append((lib.cudnn, _lib.CUDNN9_FUNCTIONS))
    for handle, table in tables:
        for name, (restype, argtypes) in table.items():
            fn = getattr(handle, name)
            if name == "cudaPointerGetAttributes":  # the struct of the loaded runtime's version
                argtypes = [ctypes.POINTER(lib.PointerAttributes), ctypes.c_void_p]
            assert fn.restype is restype and list(fn.argtypes) == list(argtypes), name
    assert lib.PointerAttributes is _lib.pointer_attributes_type(lib.runtime_version)


def _header_statuses():
    header = find("cudnn/include/cudnn_graph.h")
    if header is None:
        missing("cudnn_graph.h is not installed with the cuDNN wheel")
    text = open(header).read()
    return {int(v): n for n, v in re.findall(r"\b(CUDNN_STATUS_[A-Z_]+)\s*=\s*(\d+)", text)}


def test_status_table_matches_the_header(lib):
    if lib.major < 9:
        pytest.skip("the 4-digit status table is cuDNN 9's")
    assert _header_statuses() == errors._STATUS_9


def test_error_string_of_every_status(lib):
    lib.check(0, "someFunction")  # success raises nothing
    for code, name in _header_statuses().items():
        text = lib.cudnn.cudnnGetErrorString(code).decode()
        assert text == name
        if code == 0:
            continue
        with pytest.raises(cudnn_bind.CudnnError) as info:
            lib.check(code, "someFunction")
        assert (info.value.status, info.value.name, info.value.message) == (code, name, text)
        assert f"someFunction failed: {name} ({code})" in str(info.value)


def test_bad_param_carries_the_last_error_detail(lib):
    size = ctypes.c_size_t()
    status = lib.cudnn.cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
        None, 1, 0, None, None, None, None, None, ctypes.byref(size))
    with pytest.raises(cudnn_bind.CudnnError) as info:
        lib.check(status, "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize")
    err = info.value
    assert err.name == "CUDNN_STATUS_BAD_PARAM" and err.status == 2000
    assert "handle" in err.detail  # cudnnGetLastErrorString names the failed check
    assert "CUDNN_STATUS_BAD_PARAM" in str(err) and err.detail in str(err)


@pytest.mark.parametrize("shape,strides,dtype", [
    ((2, 3, 4, 5), (60, 20, 5, 1), "float32"),
    ((2, 3, 4, 5), (60, 1, 15, 3), "float16"),          # channels-last
    ((2, 3, 4, 5, 6), (360, 120, 30, 6, 1), "float64"),
    ((2, 3, 4, 5, 6), (360, 1, 90, 18, 3), "bfloat16"),  # channels-last 3-D
])
def test_tensor_descriptor_round_trip(lib, shape, strides, dtype):
    with cudnn_bind.TensorDescriptor(shape, strides, dtype) as d:
        code, dims, st = d.get()
    assert code == {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 9}[dtype]
    assert dims == shape and st == strides


@pytest.mark.parametrize("shape,expected", [((8, 5), (8, 5, 1, 1)), ((8, 5, 7), (8, 5, 7, 1))])
def test_low_rank_input_is_padded_to_4d_as_aten_does(lib, shape, expected):
    strides = tuple(int(s) for s in __import__("numpy").empty(shape, "f4").strides)
    with cudnn_bind.TensorDescriptor(shape, tuple(s // 4 for s in strides), "float32") as d:
        assert d.get()[1] == expected


@pytest.mark.parametrize("xdtype,pdtype", [("float32", 0), ("float16", 0), ("bfloat16", 0),
                                           ("float64", 1)])
@pytest.mark.parametrize("shape,mode,expected", [
    ((2, 3, 4, 5), cudnn_bind.SPATIAL, (1, 3, 1, 1)),
    ((2, 3, 4, 5), cudnn_bind.SPATIAL_PERSISTENT, (1, 3, 1, 1)),
    ((2, 3, 4, 5), cudnn_bind.PER_ACTIVATION, (1, 3, 4, 5)),
    ((2, 3, 4, 5, 6), cudnn_bind.SPATIAL, (1, 3, 1, 1, 1)),
    ((2, 3, 1, 1), cudnn_bind.PER_ACTIVATION, (1, 3, 1, 1)),
])
def test_derived_bn_descriptor_per_mode(lib, shape, mode, expected, xdtype, pdtype):
    import numpy as np
    strides = tuple(s // 4 for s in np.empty(shape, "f4").strides)
    with cudnn_bind.TensorDescriptor(shape, strides, xdtype) as x, \
            cudnn_bind.derive_bn_descriptor(x, mode) as bn:
        code, dims, _ = bn.get()
    assert dims == expected and code == pdtype


def test_derive_refuses_a_closed_descriptor_instead_of_crashing(lib):
    d = cudnn_bind.TensorDescriptor((2, 3, 4, 5), (60, 20, 5, 1), "float32")
    d.close()
    with pytest.raises(ValueError, match="closed"):
        cudnn_bind.derive_bn_descriptor(d, cudnn_bind.SPATIAL)
    with pytest.raises(TypeError, match="TensorDescriptor"):
        cudnn_bind.derive_bn_descriptor(None, cudnn_bind.SPATIAL)


def test_activation_descriptor(lib):
    with cudnn_bind.ActivationDescriptor() as a:
        assert a.value.value
    with pytest.raises(ValueError, match="closed"):
        a.value


def test_mode_selection_follows_aten_except_2d():
    # ATen would pick PER_ACTIVATION for 2-D input but never sends it to
    # cuDNN; cudnn_bind runs it as (N, C, 1, 1) in SPATIAL mode
    assert cudnn_bind.choose_mode(2, "contiguous", True) == cudnn_bind.SPATIAL
    assert cudnn_bind.choose_mode(2, "contiguous", False) == cudnn_bind.SPATIAL
    assert cudnn_bind.choose_mode(4, "channels_last", True) == cudnn_bind.SPATIAL_PERSISTENT
    assert cudnn_bind.choose_mode(5, "channels_last", True) == cudnn_bind.SPATIAL_PERSISTENT
    assert cudnn_bind.choose_mode(4, "channels_last", False) == cudnn_bind.SPATIAL
    assert cudnn_bind.choose_mode(4, "contiguous", True) == cudnn_bind.SPATIAL
    assert cudnn_bind.choose_mode(3, "contiguous", True) == cudnn_bind.SPATIAL


def _child(code, env=None):
    """Run code in a fresh interpreter; return (returncode, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, **(env or {})))
    return proc.returncode, proc.stdout, proc.stderr


def _gpu_here(lib):
    """Whether this machine has a usable GPU (asked in a child process, so
    this one's loaded library is not touched)."""
    code, out, err = _child(f"""
        import cudnn_bind
        cudnn_bind.load({lib.cudnn_path!r})
        print(cudnn_bind.is_available())
    """)
    assert code == 0, err
    return out.strip().endswith("True")


@pytest.fixture(scope="module")
def no_gpu(lib):
    if _gpu_here(lib):
        pytest.skip("a GPU is present: the no-GPU errors cannot be seen here "
                    "(tests/test_cudnn_gpu.py runs the GPU)")


def test_no_gpu_first_use_is_one_clear_error(lib, no_gpu):
    code, out, err = _child(f"""
        import cudnn_bind
        cudnn_bind.load({lib.cudnn_path!r})
        print("reason:", cudnn_bind.unavailable_reason())
        print("available:", cudnn_bind.is_available())
        try:
            cudnn_bind.handle_for(0)
        except cudnn_bind.CudnnError as e:
            print("status:", e.status, e.name)
            print("detail:", e.detail)
        try:
            cudnn_bind.DeviceArray((2, 3), "float32")
        except cudnn_bind.CudaError as e:
            print("malloc:", e.name)
    """)
    assert code == 0, err
    assert "available: False" in out
    assert re.search(r"reason: no (NVIDIA driver|GPU)", out)
    if lib.major >= 9:
        assert "status: 1001 CUDNN_STATUS_NOT_INITIALIZED" in out
        assert re.search(r"detail: \S", out)  # cudnnGetLastErrorString said something
    assert re.search(r"malloc: cudaError(InsufficientDriver|NoDevice)", out)


def test_batch_norm_without_gpu_raises_not_crashes(lib, no_gpu):
    code, out, err = _child(f"""
        import cudnn_bind
        cudnn_bind.load({lib.cudnn_path!r})
        class Fake:
            __cuda_array_interface__ = {{"shape": (4, 3, 2, 2), "typestr": "<f4",
                                         "data": (0x10000, False), "version": 3}}
        try:
            cudnn_bind.batch_norm_forward_training(Fake(), Fake(), Fake())
        except cudnn_bind.CudnnBindError as e:
            print("error:", type(e).__name__, e)
        except (TypeError, ValueError) as e:
            print("error:", type(e).__name__, e)
    """)
    assert code == 0, err
    assert out.startswith("error:")


def test_explicit_library_path_is_the_only_candidate(lib, tmp_path, monkeypatch):
    bad = str(tmp_path / "libcudnn.so.9")
    with pytest.raises(cudnn_bind.CudnnUnavailableError, match="no cuDNN library"):
        _lib.Library(bad)
    monkeypatch.setenv("CUDNN_BIND_LIBRARY", lib.cudnn_path)
    assert _lib.cudnn_candidates() == [lib.cudnn_path]
    assert _lib.cudnn_candidates("/x/libcudnn.so.9") == ["/x/libcudnn.so.9"]
    monkeypatch.delenv("CUDNN_BIND_LIBRARY")
    found = _lib.cudnn_candidates()
    assert found[-2:] == ["libcudnn.so.9", "libcudnn.so.8"]
    assert lib.cudnn_path in found and os.path.isabs(found[0])  # the wheel comes first
    assert _lib.cudart_candidates(12)[-1] == "libcudart.so.12"
