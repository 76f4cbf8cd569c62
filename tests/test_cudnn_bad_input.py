"""cudnn_bind's public API given what a fuzzer gives it: every wrong-typed or
out-of-range argument is a TypeError or ValueError naming the argument (or a
CudnnUnavailableError when the library is not cuDNN) -- never an
AttributeError, IndexError, KeyError, OverflowError or ctypes.ArgumentError
from inside, and never a value silently truncated on its way to C."""
import ctypes
import ctypes.util
import re

import numpy as np
import pytest

import cudnn_bind
from cudnn_bind import _lib
from cudnn_bind.descriptors import ActivationDescriptor, TensorDescriptor
from cudnn_helpers import build_standin, find, missing

pytestmark = pytest.mark.cudnn

HUGE = 10 ** 400  # float() of it raises OverflowError


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    out = build_standin(tmp_path_factory.mktemp("standin_bad_input"))
    yield cudnn_bind.load(out, cudart=out), out
    cudnn_bind.reset()


@pytest.fixture
def saved_library():
    """Let a test load or reset freely; the library loaded before comes back after."""
    state = dict(_lib._STATE)
    yield
    cudnn_bind.reset()
    _lib._STATE.update(state)


def _not_cudnn():
    """A shared library that loads but is not cuDNN."""
    return ctypes.util.find_library("m") or "libm.so.6"


def _real_cudnn():
    path = find("cudnn/lib/libcudnn.so.9") or find("cudnn/lib/libcudnn.so.8")
    if path is None:
        missing("nvidia-cudnn-cu12 is not installed (pip install --no-deps nvidia-cudnn-cu12)")
    return path


# ---- 1. loading a library that is not cuDNN ------------------------------------

@pytest.mark.parametrize("name", ["m", "c"])
def test_load_of_a_library_without_cudnn_symbols_says_so(saved_library, name):
    path = ctypes.util.find_library(name) or f"lib{name}.so.6"
    with pytest.raises(cudnn_bind.CudnnUnavailableError, match=re.escape(
            f"{path} has no symbol cudnnGetVersion: it is not a cuDNN library")):
        cudnn_bind.load(path)


def test_load_of_a_runtime_without_cuda_symbols_says_so(saved_library):
    with pytest.raises(cudnn_bind.CudnnUnavailableError, match="not a CUDA runtime library"):
        cudnn_bind.load(_real_cudnn(), cudart=_not_cudnn())


def test_env_library_that_is_not_cudnn_is_reported_not_raised(saved_library, monkeypatch):
    path = _not_cudnn()
    monkeypatch.setenv("CUDNN_BIND_LIBRARY", path)
    cudnn_bind.reset()
    assert cudnn_bind.is_available() is False
    reason = cudnn_bind.unavailable_reason()
    assert reason.startswith("no usable cuDNN library") and "cudnnGetVersion" in reason
    assert path in cudnn_bind.describe() and "not a cuDNN library" in cudnn_bind.describe()
    with pytest.raises(cudnn_bind.CudnnUnavailableError, match="not a cuDNN library"):
        cudnn_bind.version()


@pytest.mark.parametrize("kwargs,error,match", [
    ({"path": 5}, TypeError, "path must be a library path"),
    ({"path": ""}, ValueError, "path must be a non-empty"),
    ({"path": "lib\0cudnn.so"}, ValueError, "path must be a non-empty library path without NUL"),
    ({"cudart": 3.5}, TypeError, "cudart must be a library path"),
])
def test_load_path_arguments(saved_library, kwargs, error, match):
    with pytest.raises(error, match=match):
        cudnn_bind.load(**kwargs)


# ---- 2. descriptor constructors ----------------------------------------------------

@pytest.mark.parametrize("args,error,match", [
    (("relu",), TypeError, r"mode \(a cudnnActivationMode_t.*must be an int, got str"),
    ((True,), TypeError, "mode .* must be an int, got bool"),
    ((2 ** 31,), ValueError, "mode .* must be between"),   # ctypes wraps it to -2**31
    ((1, "0.5"), TypeError, "coef must be a real number"),
    ((1, None), TypeError, "coef must be a real number"),
    ((1, HUGE), ValueError, "coef is too large for a C double"),
    ((1, float("nan")), ValueError, "coef must be finite"),
])
def test_activation_descriptor_arguments(standin, args, error, match):
    with pytest.raises(error, match=match):
        ActivationDescriptor(*args)


# ---- 3./4. tensor descriptor geometry ------------------------------------------------

@pytest.mark.parametrize("shape,strides,kwargs,error,match", [
    # C ints: no silent truncation of 2**32 + 5 to 5
    ((1, 1, 1, 2 ** 32 + 5), None, {}, ValueError, r"shape\[3\] must be between 1 and 2147483647"),
    ((2, 3, 4, 5), (60, 20, 5, 2 ** 32 + 1), {}, ValueError, r"strides\[3\] is 4294967297"),
    ((2, -3), (3, 1), {}, ValueError, r"shape\[1\] must be between 1"),
    ((2, 0), (3, 1), {}, ValueError, r"shape\[1\] must be between 1"),
    ((2, 3), (3, -1), {}, ValueError, r"strides\[1\] is -1"),
    ((2, 1, 2 ** 20, 2 ** 11), None, {}, ValueError, r"strides\[0\] is 2147483648"),
    ((2, HUGE), (1, 1), {}, ValueError, r"shape\[1\] .* got an int of 1329 bits"),
    ((2, 3.0), (3, 1), {}, TypeError, r"shape\[1\] must be an int, got float"),
    ((2, True), (3, 1), {}, TypeError, r"shape\[1\] must be an int, got bool"),
    (5, (1,), {}, TypeError, "shape must be a sequence of ints"),
    ("ab", (1,), {}, TypeError, "shape must be a sequence of ints"),
    ((2, 3), "ab", {}, TypeError, "strides must be a sequence of ints"),
    # at most 8 dimensions, 2 at least after padding; strides match shape
    ((1,) * 9, (1,) * 9, {}, ValueError, "at most 8 dimensions"),
    ((1,) * 9, (1,) * 8, {}, ValueError, "at most 8 dimensions"),
    ((2, 3, 4), (3, 1), {}, ValueError, "strides .* one entry per dimension"),
    ((2, 3), (3, 1, 1), {}, ValueError, "strides .* one entry per dimension"),
    ((), (), {"pad": 0}, ValueError, "fewer than 2 dimensions"),
    ((5,), (1,), {"pad": 1}, ValueError, "fewer than 2 dimensions"),
    ((2, 3), (3, 1), {"pad": 9}, ValueError, "pad must be between 0 and 8"),
    ((2, 3), (3, 1), {"pad": True}, TypeError, "pad must be an int"),
    ((2, 3), (3, 1), {"dtype": ["float32"]}, TypeError, "dtype must be one of"),
    ((2, 3), (3, 1), {"dtype": None}, TypeError, "dtype must be one of"),
    ((2, 3), (3, 1), {"dtype": "uint8"}, TypeError, "dtype must be one of"),
])
def test_tensor_descriptor_arguments(standin, shape, strides, kwargs, error, match):
    with pytest.raises(error, match=match):
        TensorDescriptor(shape, strides, **kwargs)


def test_tensor_descriptor_edge_cases_that_are_fine(standin):
    with TensorDescriptor((), ()) as d:  # 0-D: padded to 4 size-1 dimensions, as ATen does
        assert d.get()[1:] == ((1, 1, 1, 1), (1, 1, 1, 1))
    with TensorDescriptor((2, 3, 4), None) as d:  # strides None: C order
        assert d.get()[1:] == ((2, 3, 4, 1), (12, 4, 1, 1))
    with TensorDescriptor(np.array([2, 3, 4, 5]), (60, 20, 5, 1), np.float16) as d:
        assert d.get() == (2, (2, 3, 4, 5), (60, 20, 5, 1))
    with TensorDescriptor((1, 3), (-5, 1)) as d:  # a size-1 dimension's stride is ignored
        assert d.get()[1:] == ((1, 3, 1, 1), (3, 1, 1, 1))
    big = 2 ** 31 - 1
    with TensorDescriptor((1, big), (big, 1), pad=3) as d:
        assert d.get()[1] == (1, big, 1)


def test_refused_tensor_descriptor_is_destroyed(standin):
    _, path = standin
    live = ctypes.CDLL(path).standin_live_objects
    live.restype, live.argtypes = ctypes.c_long, [ctypes.c_char_p]
    before = live(b"tensor")
    with pytest.raises(ValueError):
        TensorDescriptor((2, 2 ** 40), (2 ** 40, 1))
    assert live(b"tensor") == before


@pytest.mark.parametrize("mode,error", [(True, TypeError), (1.0, TypeError), ("fast", ValueError),
                                        (7, ValueError), (HUGE, ValueError),
                                        (np.array([1, 2]), TypeError)])
def test_derive_bn_descriptor_mode(standin, mode, error):
    with TensorDescriptor((2, 3, 4, 5), (60, 20, 5, 1)) as x:
        with pytest.raises(error, match="mode must be PER_ACTIVATION, SPATIAL"):
            cudnn_bind.derive_bn_descriptor(x, mode)
        with cudnn_bind.derive_bn_descriptor(x, "Spatial") as bn:
            assert bn.get()[1] == (1, 3, 1, 1)


# ---- 5. __cuda_array_interface__ and DLPack -------------------------------------------

dev = cudnn_bind.DeviceArray.from_numpy


class CAI:
    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


DROP = object()


def _good(**changes):
    """A valid interface dict of a (4, 3, 2, 2) float32 array, with `changes`
    (a key set to DROP is left out)."""
    cai = {"shape": (4, 3, 2, 2), "typestr": "<f4", "data": (0, False), "version": 3}
    cai.update(changes)
    return {k: v for k, v in cai.items() if v is not DROP}


def _run(x, w=None):
    w = w if w is not None else dev(np.ones(3, np.float32))
    cudnn_bind.batch_norm_forward_training(x, w, dev(np.zeros(3, np.float32)))


@pytest.mark.parametrize("key", ["shape", "typestr", "data", "version"])
def test_cai_missing_key(standin, key):
    with pytest.raises(TypeError, match=rf"x.__cuda_array_interface__ has no '{key}' key"):
        _run(CAI(_good(**{key: DROP})))


@pytest.mark.parametrize("cai,error,match", [
    (None, TypeError, "must be a dict, got NoneType"),
    ([("shape", (4, 3))], TypeError, "must be a dict, got list"),
    (_good(shape=7), TypeError, r"\['shape'\] must be a sequence of ints"),
    (_good(shape=(4, "3", 2, 2)), TypeError, r"\['shape'\]\[1\] must be an int"),
    (_good(shape=(4, 3.0, 2, 2)), TypeError, r"\['shape'\]\[1\] must be an int"),
    (_good(shape=(4, -3, 2, 2)), ValueError, r"\['shape'\]\[1\] must be >= 0"),
    (_good(typestr=4), TypeError, r"\['typestr'\] must be one of"),
    (_good(typestr=""), TypeError, r"\['typestr'\] must be one of"),
    (_good(typestr="<i4"), TypeError, r"\['typestr'\] must be one of"),
    (_good(typestr=">f4"), TypeError, r"\['typestr'\] must be one of"),
    (_good(data=0), TypeError, r"\['data'\] must be a \(pointer, read_only\) tuple"),
    (_good(data=(0,)), TypeError, r"\['data'\] must be a \(pointer, read_only\) tuple"),
    (_good(data=(0, False, 1)), TypeError, r"\['data'\] must be a \(pointer, read_only\) tuple"),
    (_good(data=(0, "no")), TypeError, r"\['data'\] must be a \(pointer, read_only\) tuple"),
    (_good(data=("0x10", False)), TypeError, r"\['data'\]\[0\] \(the pointer\) must be an int"),
    (_good(data=(-16, False)), ValueError, r"\['data'\]\[0\] \(the pointer\) must be between 0"),
    (_good(data=(2 ** 64, False)), ValueError, r"\['data'\]\[0\] \(the pointer\) must be between"),
    (_good(version="3"), TypeError, r"\['version'\] must be an int"),
    (_good(strides=(48, 16, 8)), ValueError, r"\['strides'\] .* one entry per dimension"),
    (_good(strides=(48.0, 16, 8, 4)), TypeError, r"\['strides'\]\[0\] must be an int"),
    (_good(strides=5), TypeError, r"\['strides'\] must be a sequence of ints"),
    (_good(strides=(48, 16, 8, 2)), ValueError, r"\['strides'\] .* not multiples of the item size"),
    (_good(mask=CAI(_good())), ValueError, "has a mask: masked arrays are not supported"),
])
def test_malformed_cai(standin, cai, error, match):
    with pytest.raises(error, match=match) as info:
        _run(CAI(cai))
    assert str(info.value).startswith("x.__cuda_array_interface__")
    with pytest.raises(error, match=r"^weight\.__cuda_array_interface__"):  # named as itself
        _run(dev(np.ones((4, 3, 2, 2), np.float32)), CAI(cai))


def test_element_count_does_not_wrap_at_2_63(standin):
    # 2**33 * 2**31 elements: np.prod in int64 wrapped this to 0 (an empty batch)
    with pytest.raises(ValueError, match="cuDNN batch norm indexes with 32 bits"):
        _run(CAI(_good(shape=(2 ** 33, 2 ** 31, 1, 1))))


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8),
                ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("tensor", _DLTensor)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class Exporter:
    """A DLPack producer of a hand-made CUDA DLTensor (nothing is read from
    its data pointer); keeps the structures alive."""
    NAMES = {False: b"dltensor", True: b"dltensor_versioned"}

    def __init__(self, shape, ndim=None, major=1, versioned=True, null_shape=False):
        self.dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.managed = _DLVersioned(major=major, minor=0)
        t = self.managed.tensor
        t.data, t.device_type, t.code, t.bits, t.lanes = 0x1000, 2, 2, 32, 1
        t.ndim = len(shape) if ndim is None else ndim
        if not null_shape:
            t.shape = self.dims
        self.name = self.NAMES[versioned]
        self.address = ctypes.addressof(self.managed if versioned else t)

    def __dlpack__(self, max_version=None, **kwargs):
        return _capsule_new(self.address, self.name, None)


@pytest.mark.parametrize("exporter,error,match", [
    (Exporter((4, 3), ndim=-1), ValueError, r"x: malformed DLPack tensor \(ndim -1"),
    (Exporter((4, 3), ndim=1000), ValueError, r"x: malformed DLPack tensor \(ndim 1000"),
    (Exporter((4, 3), null_shape=True), ValueError, "x: malformed DLPack tensor .*shape NULL"),
    (Exporter((4, 3), versioned=False, null_shape=True), ValueError, "x: malformed DLPack"),
    (Exporter((4, -3)), ValueError, "x: DLPack shape .* negative"),
    (Exporter((4, 3), major=2), TypeError, r"x: DLPack version 2.x is not supported"),
])
def test_malformed_dlpack(standin, exporter, error, match):
    with pytest.raises(error, match=match):
        _run(exporter)


def test_dlpack_producer_errors_name_the_argument(standin):
    class Refuses:
        def __dlpack__(self, **kwargs):
            if kwargs:
                raise TypeError("unexpected keyword argument 'max_version'")
            raise BufferError("cannot export")

    class NotCapsule:
        def __dlpack__(self, **kwargs):
            return 42

    with pytest.raises(TypeError, match=r"x: its __dlpack__\(\) failed: cannot export"):
        _run(Refuses())
    with pytest.raises(TypeError, match="x: not an unconsumed DLPack capsule"):
        _run(NotCapsule())


# ---- the rest of the public API ---------------------------------------------------------

@pytest.fixture
def arrays(standin):
    rng = np.random.default_rng(0)
    x = dev(rng.standard_normal((4, 3, 2, 2)).astype(np.float32))
    return x, dev(np.ones(3, np.float32)), dev(np.zeros(3, np.float32))


@pytest.mark.parametrize("kwargs,error,match", [
    ({"eps": "1e-5"}, TypeError, "eps must be a real number, got str"),
    ({"eps": None}, TypeError, "eps must be a real number, got NoneType"),
    ({"eps": True}, TypeError, "eps must be a real number, got bool"),
    ({"eps": HUGE}, ValueError, "eps is too large for a C double"),
    ({"eps": float("inf")}, ValueError, "eps must be finite"),
    ({"eps": float("nan")}, ValueError, "eps must be finite"),
    ({"exponential_average_factor": HUGE}, ValueError, "exponential_average_factor is too large"),
    ({"exponential_average_factor": "0.1"}, TypeError, "exponential_average_factor must be a real"),
    ({"exponential_average_factor": float("nan")}, ValueError,
     "exponential_average_factor must be finite"),
    ({"mode": True}, TypeError, "mode must be PER_ACTIVATION"),
    ({"mode": 1.0}, TypeError, "mode must be PER_ACTIVATION"),
    ({"mode": HUGE}, ValueError, "mode must be PER_ACTIVATION"),
    ({"mode": np.array([1, 2])}, TypeError, "mode must be PER_ACTIVATION"),
    ({"activation": np.array(["relu", "relu"])}, ValueError, "activation must be None or 'relu'"),
    ({"activation": b"relu"}, ValueError, "activation must be None or 'relu'"),
    ({"stream": True}, TypeError, "stream must be None, an int"),
    ({"stream": -1}, ValueError, "stream must be between 0 and"),
    ({"stream": 2 ** 64}, ValueError, "stream must be between 0 and"),
    ({"stream": 1.5}, TypeError, "stream must be None, an int"),
    ({"handle": "h"}, TypeError, "handle must be None or a cudnn_bind Handle"),
])
def test_batch_norm_scalar_arguments(arrays, kwargs, error, match):
    x, w, b = arrays
    with pytest.raises(error, match=match):
        cudnn_bind.batch_norm_forward_training(x, w, b, **kwargs)


def test_stream_objects_with_bad_pointers(arrays):
    class Stream:
        ptr = -5

    with pytest.raises(ValueError, match=r"stream.ptr must be between 0"):
        cudnn_bind.batch_norm_forward_training(*arrays, stream=Stream())
    y, *_ = cudnn_bind.batch_norm_forward_training(*arrays, stream=np.uint64(0x55))
    assert y.shape == (4, 3, 2, 2)


def test_inference_and_backward_eps(arrays):
    x, w, b = arrays
    rm, rv = dev(np.zeros(3, np.float32)), dev(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="eps is too large"):
        cudnn_bind.batch_norm_forward_inference(x, w, b, rm, rv, HUGE)
    _, sm, si, reserve = cudnn_bind.batch_norm_forward_training(x, w, b)
    with pytest.raises(TypeError, match="eps must be a real number"):
        cudnn_bind.batch_norm_backward(x, x, w, sm, si, "1e-5", reserve)


def test_can_use_cudnn_reports_a_bad_eps(arrays):
    ok, why = cudnn_bind.can_use_cudnn(*arrays, eps="small")
    assert not ok and "eps must be a real number" in why
    ok, why = cudnn_bind.can_use_cudnn(*arrays, eps=HUGE)
    assert not ok and "eps is too large" in why


@pytest.mark.parametrize("args,error,match", [
    (("4", "contiguous", True), TypeError, "ndim must be an int"),
    ((True, "contiguous", True), TypeError, "ndim must be an int"),
    ((6, "contiguous", True), ValueError, "ndim must be between 2 and 5"),
    ((4, "rows", True), ValueError, "layout must be 'contiguous' or 'channels_last'"),
    ((4, None, True), ValueError, "layout must be"),
])
def test_choose_mode_arguments(args, error, match):
    with pytest.raises(error, match=match):
        cudnn_bind.choose_mode(*args)


@pytest.mark.parametrize("args,kwargs,error,match", [
    (((2, 2.5),), {}, TypeError, r"shape\[1\] must be an int, got float"),   # was truncated to 2
    (((2, "3"),), {}, TypeError, r"shape\[1\] must be an int, got str"),
    (((2, -3),), {}, ValueError, r"shape\[1\] must be >= 0"),
    ((5,), {}, TypeError, "shape must be a sequence of ints"),
    (((2, 3), None), {}, TypeError, "dtype must be given"),                    # was float64
    (((2, 3), "int32"), {}, TypeError, "unsupported dtype"),
    (((2, 3), {"names": 1}), {}, TypeError, "unsupported dtype"),
    (((2, 3),), {"strides": (3, -1)}, ValueError, r"strides\[1\] must be >= 0"),
    (((2, 3),), {"strides": (3,)}, ValueError, "do not match shape"),
    (((2 ** 40, 2 ** 40),), {}, ValueError, "more than a size_t holds"),
])
def test_device_array_arguments(standin, args, kwargs, error, match):
    with pytest.raises(error, match=match):
        cudnn_bind.DeviceArray(*args, **kwargs)


@pytest.mark.parametrize("ptr,error,match", [
    (True, TypeError, r"ptr \(a device address\) must be an int, got bool"),
    (-1, ValueError, r"ptr \(a device address\) must be between 0"),
    (2 ** 64, ValueError, r"ptr \(a device address\) must be between 0"),   # ctypes wraps it to 0
    ("0x1000", TypeError, r"ptr \(a device address\) must be an int"),
])
def test_from_pointer_address(standin, ptr, error, match):
    with pytest.raises(error, match=match):
        cudnn_bind.DeviceArray.from_pointer(ptr, (2, 3), "float32")


@pytest.mark.parametrize("nbytes,error", [(-1, ValueError), (2 ** 64, ValueError),
                                          (2.5, TypeError), ("8", TypeError)])
def test_device_buffer_size(standin, nbytes, error):
    with pytest.raises(error, match="nbytes must be"):
        cudnn_bind.DeviceBuffer(nbytes)


def test_handles(standin):
    lib, _ = standin
    with pytest.raises(TypeError, match="device must be an int, got str"):
        cudnn_bind.handle_for("0")
    with pytest.raises(TypeError, match="device must be an int, got bool"):
        cudnn_bind.handle_for(True)
    with pytest.raises(ValueError, match="device must be between 0"):
        cudnn_bind.Handle(lib, -1)
    with pytest.raises(TypeError, match="lib must be a cudnn_bind Library"):
        cudnn_bind.Handle("libcudnn.so", 0)
    h = cudnn_bind.handle_for(0)
    with pytest.raises(TypeError, match=r"stream \(a cudaStream_t\) must be an int"):
        h.set_stream("default")
    with pytest.raises(ValueError, match=r"stream \(a cudaStream_t\) must be between 0"):
        h.set_stream(2 ** 64)


# ---- closed descriptors and handles, messages naming the argument (fuzzer regressions) --

def _names(msg, name):
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", msg) is not None


def test_derive_bn_descriptor_of_a_closed_descriptor_names_x_desc(standin):
    """cudnn_bind.derive_bn_descriptor:20261124:14 said "TensorDescriptor is
    closed", naming no argument."""
    x = TensorDescriptor((2, 3, 4, 5), (60, 20, 5, 1))
    x.close()
    with pytest.raises(ValueError, match="closed TensorDescriptor") as info:
        cudnn_bind.derive_bn_descriptor(x, cudnn_bind.SPATIAL)
    assert _names(str(info.value), "x_desc"), str(info.value)
    with pytest.raises(ValueError, match="closed TensorDescriptor"):
        x.get()
    with pytest.raises(ValueError, match="closed TensorDescriptor"):
        x.set((2, 3))
    with pytest.raises(ValueError, match="closed ActivationDescriptor"):
        with ActivationDescriptor() as a:
            pass
        a.value


def test_set_stream_on_a_destroyed_handle_is_refused(standin):
    lib, _ = standin
    h = cudnn_bind.Handle(lib, 0)
    h.set_stream(0)
    h.destroy()
    with pytest.raises(ValueError, match="Handle has been destroyed"):
        h.set_stream(0)
    with pytest.raises(ValueError, match=r"stream \(a cudaStream_t\) must be between 0"):
        h.set_stream(-1)      # the argument is still checked first


def test_one_value_per_channel_messages_name_x(arrays):
    """cuDNN batch norm's "more than 1 value per channel" said "input", which
    is no argument of these functions; it names x, in PyTorch's words."""
    _, w, b = arrays
    one = dev(np.ones((1, 3), np.float32))
    with pytest.raises(ValueError) as info:
        cudnn_bind.batch_norm_forward_training(one, w, b)
    msg = str(info.value)
    assert msg.startswith("Expected more than 1 value per channel when training") and _names(msg, "x")
    with pytest.raises(ValueError) as info:
        cudnn_bind.batch_norm_backward(one, one, w, b, b, 1e-5, None)
    msg = str(info.value)
    assert msg.startswith("Expected more than 1 value per channel when training") and _names(msg, "x")
