"""cudnn_bind's streams and memory, end to end through the host stand-in:
which stream each call runs on, what it waits for (events, never a device
synchronization), where outputs, workspace and reserve come from (the
stream-ordered pool), what a failing cudaMalloc does, and what a steady
call costs in CUDA/cuDNN calls.  The stand-in runs everything at once, so
these tests read its stream log rather than timing anything."""
import ctypes
import threading

import numpy as np
import pytest

import cudnn_bind
from cudnn_bind import _lib
from cudnn_helpers import build_standin, standin_hooks

pytestmark = pytest.mark.cudnn

dev = cudnn_bind.DeviceArray.from_numpy


@pytest.fixture(scope="module")
def hooks(tmp_path_factory):
    out = build_standin(tmp_path_factory.mktemp("standin"))
    cudnn_bind.load(out, cudart=out)
    yield standin_hooks(out)
    cudnn_bind.reset()


def take_log(hooks):
    buf = ctypes.create_string_buffer(8192)
    hooks.standin_take_log(buf, len(buf))
    return buf.value.decode().splitlines()


def _stream(text):
    return 0 if text in ("(nil)", "0") else int(text, 16)


def parse(lines):
    """The log as tuples: ("record", event, stream), ("wait", stream, event),
    (cuDNN function, stream), ("cudaMemcpyAsync", stream)."""
    out = []
    for line in lines:
        words = line.split()
        if words[0] == "record":
            out.append(("record", words[1], _stream(words[3])))
        elif words[0] == "wait":
            out.append(("wait", _stream(words[1]), words[3]))
        else:
            out.append((words[0], _stream(words[2])))
    return out


def data(shape=(4, 3, 5, 6), seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    c = shape[1]
    return x, rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)


def count_calls(hooks):
    names = list(_lib.CUDNN_FUNCTIONS) + list(_lib.CUDART_FUNCTIONS)
    return {n: hooks.standin_calls(n.encode()) for n in names}


class Exported:
    """A foreign array: only __cuda_array_interface__ (as CuPy's or Numba's)."""

    def __init__(self, array):
        self.__cuda_array_interface__ = array.__cuda_array_interface__
        self._keep = array


@pytest.mark.parametrize("kind", ["DeviceArray", "__cuda_array_interface__"])
def test_steady_calls_make_only_the_calls_that_do_work(hooks, kind):
    x, w, b = data((2, 4, 1, 1))
    gx, gw, gb, gm, gv = dev(x), dev(w), dev(b), dev(np.zeros(4, np.float32)), dev(np.ones(4, np.float32))
    gdy = dev(x)
    if kind != "DeviceArray":  # no cudaPointerGetAttributes per array once they are known
        gx, gw, gb, gm, gv, gdy = (Exported(a) for a in (gx, gw, gb, gm, gv, gdy))
    for _ in range(3):  # warm-up: plans, handle, workspace, pool
        y, sm, si, rs = cudnn_bind.batch_norm_forward_training(gx, gw, gb, gm, gv)
        cudnn_bind.batch_norm_backward(gx, gdy, gw, sm, si, 1e-5, rs)
        cudnn_bind.batch_norm_forward_inference(gx, gw, gb, gm, gv)
    for call, expected in [
            (lambda: cudnn_bind.batch_norm_forward_training(gx, gw, gb, gm, gv),
             "cudnnBatchNormalizationForwardTrainingEx"),
            (lambda: cudnn_bind.batch_norm_backward(gx, gdy, gw, sm, si, 1e-5, rs),
             "cudnnBatchNormalizationBackwardEx"),
            (lambda: cudnn_bind.batch_norm_forward_inference(gx, gw, gb, gm, gv),
             "cudnnBatchNormalizationForwardInference")]:
        before = count_calls(hooks)
        result = call()
        del result  # its memory goes back to the pool: no cudaFree either
        after = count_calls(hooks)
        made = {n: after[n] - before[n] for n in after if after[n] != before[n]}
        # the batch-norm call and the current-device query, nothing else
        assert made == {expected: 1, "cudaGetDevice": 1}, made


def test_exported_pointers_are_asked_about_once_per_live_exporter(hooks):
    """The device of a __cuda_array_interface__ pointer is cached for as long
    as its exporter lives (the interface keeps the memory alive that long),
    and forgotten when it dies: a pointer freed and reused comes with a new
    exporter, asked about afresh."""
    lib = _lib.get()
    x, w, b = data((2, 3, 2, 2))
    arrays = [dev(x), dev(w), dev(b)]

    def attribute_queries(args):
        before = hooks.standin_calls(b"cudaPointerGetAttributes")
        cudnn_bind.batch_norm_forward_training(*args)
        return hooks.standin_calls(b"cudaPointerGetAttributes") - before

    exported = [Exported(a) for a in arrays]
    known = len(lib.cai_devices)
    assert attribute_queries(exported) == 3  # new exporters: asked once each
    assert attribute_queries(exported) == 0
    assert len(lib.cai_devices) == known + 3
    del exported
    assert len(lib.cai_devices) == known  # each entry went with its exporter
    assert attribute_queries([Exported(a) for a in arrays]) == 3

    class NoWeakref:  # an exporter that takes no weak references: asked every time
        __slots__ = ("__cuda_array_interface__", "_keep")

        def __init__(self, array):
            self.__cuda_array_interface__ = array.__cuda_array_interface__
            self._keep = array

    plain = [NoWeakref(a) for a in arrays]
    assert attribute_queries(plain) == 3 and attribute_queries(plain) == 3
    # host memory behind an exporter is still refused (its device is None, cached or not)
    host = np.ones(3, np.float32)
    fake = Exported(cudnn_bind.DeviceArray.from_pointer(host.ctypes.data, (3,), "float32",
                                                         owner=host))
    ex, eb = Exported(arrays[0]), Exported(arrays[2])
    for _ in range(2):
        with pytest.raises(ValueError, match="weight: not device memory"):
            cudnn_bind.batch_norm_forward_training(ex, fake, eb)


def test_outputs_belong_to_the_calls_stream_and_carry_it(hooks):
    x, w, b = data()
    gx, gw, gb = dev(x), dev(w), dev(b)
    take_log(hooks)
    y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(gx, gw, gb, stream=0x51)
    log = parse(take_log(hooks))
    # x, w, b were made on the legacy default stream: 0x51 waits for it first
    assert log[0][0] == "record" and log[0][2] == 0
    assert log[1] == ("wait", 0x51, log[0][1])
    assert log[2] == ("cudnnBatchNormalizationForwardTrainingEx", 0x51)
    for a in (y, sm, si, reserve):
        assert a.stream == 0x51 and a.__cuda_array_interface__["stream"] == 0x51
    # the next call on 0x51 with those outputs waits for nothing
    dy = cudnn_bind.DeviceArray(x.shape, "float32", stream=0x51)
    cudnn_bind.batch_norm_forward_training(y, gw, gb, stream=0x51)  # warm the plan
    take_log(hooks)
    gw51 = cudnn_bind.DeviceArray.from_numpy(w, stream=0x51)
    gb51 = cudnn_bind.DeviceArray.from_numpy(b, stream=0x51)
    take_log(hooks)
    cudnn_bind.batch_norm_forward_training(y, gw51, gb51, stream=0x51)
    cudnn_bind.batch_norm_backward(gx, dy, gw51, sm, si, 1e-5, reserve, stream=0x51)
    log = parse(take_log(hooks))
    # gx (legacy stream) is waited for in backward; nothing else
    assert [e[0] for e in log] == ["cudnnBatchNormalizationForwardTrainingEx", "record", "wait",
                                   "cudnnBatchNormalizationBackwardEx"]
    # host copies run on the array's own stream and wait for it
    take_log(hooks)
    y.to_numpy()
    assert parse(take_log(hooks)) == [("cudaMemcpyAsync", 0x51)]


def test_default_stream_is_the_one_x_was_produced_on(hooks):
    x, w, b = data()
    gx = cudnn_bind.DeviceArray.from_numpy(x, stream=0x61)
    gw, gb = cudnn_bind.DeviceArray.from_numpy(w, stream=0x61), cudnn_bind.DeviceArray.from_numpy(b, stream=0x61)
    take_log(hooks)
    y = cudnn_bind.batch_norm_forward_training(gx, gw, gb)[0]
    assert parse(take_log(hooks)) == [("cudnnBatchNormalizationForwardTrainingEx", 0x61)]
    assert y.stream == 0x61


class CAI:
    """A foreign producer: the CUDA Array Interface with a "stream" key."""

    def __init__(self, array, stream):
        cai = dict(array.__cuda_array_interface__)
        cai["stream"] = stream
        self.__cuda_array_interface__ = cai
        self._keep = array


def test_the_cuda_array_interface_stream_is_waited_for_with_an_event(hooks):
    x, w, b = data()
    gx, gw, gb = dev(x), dev(w), dev(b)
    cudnn_bind.batch_norm_forward_training(gx, gw, gb, stream=0x71)  # warm
    take_log(hooks)
    cudnn_bind.batch_norm_forward_training(CAI(gx, 0x99), CAI(gw, None), CAI(gb, 0x99),
                                           stream=0x71)
    log = parse(take_log(hooks))
    # one wait per producer stream, then the call; no synchronization
    assert [e[0] for e in log] == ["record", "wait", "cudnnBatchNormalizationForwardTrainingEx"]
    assert log[0][2] == 0x99 and log[1][1] == 0x71
    assert hooks.standin_calls(b"cudaDeviceSynchronize") == 0
    assert hooks.standin_calls(b"cudaStreamSynchronize") >= 0  # only host copies sync
    # 1 is the legacy default stream, 2 the per-thread one; 0 is refused
    take_log(hooks)
    cudnn_bind.batch_norm_forward_training(CAI(gx, 1), CAI(gw, 2), gb, stream=0x71)
    log = parse(take_log(hooks))
    assert {e[2] for e in log if e[0] == "record"} == {0, 2}
    with pytest.raises(ValueError, match=r"\['stream'\] is 0"):
        cudnn_bind.batch_norm_forward_training(CAI(gx, 0), gw, gb)
    # a producer on the call's own stream needs no wait
    take_log(hooks)
    cudnn_bind.batch_norm_forward_training(CAI(gx, 0x71), CAI(gw, 0x71), CAI(gb, 0x71), stream=0x71)
    assert [e[0] for e in parse(take_log(hooks))] == ["cudnnBatchNormalizationForwardTrainingEx"]


def test_dlpack_producers_are_told_the_consumer_stream(hooks):
    x, w, b = data()
    gx, gw, gb = dev(x), dev(w), dev(b)
    seen = []

    class Producer:  # wraps a capsule-less DLPack producer around a DeviceArray
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, stream=None, max_version=None):
            seen.append(stream)
            raise BufferError("no export here")

    with pytest.raises(TypeError, match="no export here"):
        cudnn_bind.batch_norm_forward_training(Producer(gx), gw, gb, stream=0x81)
    with pytest.raises(TypeError, match="no export here"):
        cudnn_bind.batch_norm_forward_training(gx, Producer(gw), gb, stream=0)
    assert seen[0] == 0x81 and seen[-1] == 1  # DLPack: 1 is the legacy default stream


def test_pool_reuses_blocks_only_on_their_own_stream(hooks):
    cudnn_bind.empty_cache()
    a = cudnn_bind.DeviceArray((1000,), "float32", stream=0x11)
    ptr = a.ptr
    del a
    b = cudnn_bind.DeviceArray((1000,), "float32", stream=0x22)
    assert b.ptr != ptr  # a block freed on 0x11 may still be in use there
    c = cudnn_bind.DeviceArray((1000,), "float32", stream=0x11)
    assert c.ptr == ptr  # same stream: work on it runs in order
    info = cudnn_bind.memory_info()
    assert info["live_bytes"] >= 8000 and info["cached_bytes"] == 0
    del b, c
    assert cudnn_bind.memory_info()["cached_bytes"] >= 8000
    syncs = hooks.standin_calls(b"cudaDeviceSynchronize")
    cudnn_bind.empty_cache()
    assert cudnn_bind.memory_info()["cached_bytes"] == 0
    assert hooks.standin_calls(b"cudaDeviceSynchronize") == syncs + 1


def test_statistics_and_reserve_share_a_block_until_the_last_goes(hooks):
    x, w, b = data()
    y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(dev(x), dev(w), dev(b))
    assert si.ptr > sm.ptr and si.ptr % 256 == 0 and reserve.ptr % 256 == 0
    cudnn_bind.empty_cache()
    live = hooks.standin_live_allocations()
    sm.free()
    del si
    cudnn_bind.empty_cache()
    assert hooks.standin_live_allocations() == live  # the reserve still holds the block
    np.testing.assert_array_equal(reserve.to_numpy(), reserve.to_numpy())
    del reserve
    cudnn_bind.empty_cache()
    assert hooks.standin_live_allocations() == live - 1


def test_a_failing_cudamalloc_empties_the_cache_and_retries_then_raises(hooks):
    x, w, b = data((4, 3, 5, 7))
    gx, gw, gb = dev(x), dev(w), dev(b)
    cudnn_bind.DeviceArray((4096,), "float32")  # something cached
    assert cudnn_bind.memory_info()["cached_bytes"] > 0
    hooks.standin_fail_mallocs(1)
    big = cudnn_bind.DeviceArray((123457,), "float32")  # first try fails, cache freed, retry works
    assert big.ptr and cudnn_bind.memory_info()["cached_bytes"] == 0
    hooks.standin_fail_mallocs(2)
    with pytest.raises(cudnn_bind.CudaError, match="cudaErrorMemoryAllocation"):
        cudnn_bind.batch_norm_forward_training(gx, gw, gb, stream=0x4242)  # a new stream: new blocks
    hooks.standin_fail_mallocs(0)
    # nothing half-done is left behind: the same call works now
    y = cudnn_bind.batch_norm_forward_training(gx, gw, gb, stream=0x4242)[0]
    assert y.ptr


def test_workspaces_are_kept_for_the_most_recent_streams_only(hooks):
    from cudnn_bind.handles import MAX_STREAMS
    x, w, b = data()
    gx, gw, gb = dev(x), dev(w), dev(b)
    h = cudnn_bind.handle_for(0)
    streams = [0x1000 + i for i in range(MAX_STREAMS + 3)]
    for s in streams:
        cudnn_bind.batch_norm_forward_training(gx, gw, gb, stream=s)
    assert list(h._workspaces) == streams[-MAX_STREAMS:]


def test_size_queries_get_x_descriptor_never_null(hooks, monkeypatch):
    lib = _lib.get()
    seen = {}
    real_call = lib.call

    def spy(function, *args):
        if "WorkspaceSize" in function:
            seen[function] = args
        return real_call(function, *args)
    monkeypatch.setattr(lib, "call", spy)
    x, w, b = data((3, 5, 2, 9))  # a signature no other test uses: a new plan
    gx, gw, gb = dev(x), dev(w), dev(b)
    y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(gx, gw, gb)
    cudnn_bind.batch_norm_backward(gx, gx, gw, sm, si, 1e-5, reserve)
    fwd = seen["cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize"]
    bwd = seen["cudnnGetBatchNormalizationBackwardExWorkspaceSize"]
    # (handle, mode, ops, x, z, y, bn, act, out) and (handle, mode, ops, x, y, dy, dz, dx, bn, act, out)
    assert all(d is not None and d.value for d in fwd[3:6])
    assert all(d is not None and d.value for d in bwd[3:8])


def test_2d_input_runs_spatial_or_per_activation_when_asked(hooks):
    x, w, b = data((64, 5))
    gx, gw, gb = dev(x), dev(w), dev(b)
    take_log(hooks)
    y = cudnn_bind.batch_norm_forward_training(gx, gw, gb)[0]
    y2 = cudnn_bind.batch_norm_forward_training(gx, gw, gb, mode="per_activation")[0]
    log = take_log(hooks)
    assert [int(line.rsplit(" ", 1)[1]) for line in log if " mode " in line] == [
        cudnn_bind.SPATIAL, cudnn_bind.PER_ACTIVATION]
    np.testing.assert_allclose(y.to_numpy(), y2.to_numpy(), rtol=1e-5, atol=1e-5)
    ok, why = cudnn_bind.can_use_cudnn(gx, gw, gb)
    assert not ok and "at least 3 dimensions" in why and "(N, C, 1, 1)" in why


def test_two_threads_keep_their_own_handles_and_streams(hooks):
    x, w, b = data()
    results, errors = {}, []

    def work(stream):
        try:
            gx, gw, gb = (cudnn_bind.DeviceArray.from_numpy(a, stream=stream) for a in (x, w, b))
            for _ in range(20):
                y, sm, si, rs = cudnn_bind.batch_norm_forward_training(gx, gw, gb)
                dx = cudnn_bind.batch_norm_backward(gx, y, gw, sm, si, 1e-5, rs)[0]
            results[stream] = (y.to_numpy(), dx.to_numpy(), y.stream,
                               cudnn_bind.handle_for(0))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(s,)) for s in (0x31, 0x32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    (y1, dx1, s1, h1), (y2, dx2, s2, h2) = results[0x31], results[0x32]
    assert (s1, s2) == (0x31, 0x32) and h1 is not h2
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(dx1, dx2)


def test_pool_under_threads_and_empty_cache_never_double_frees(hooks):
    errors = []
    stop = threading.Event()

    def churn(stream):
        try:
            while not stop.is_set():
                arrays = [cudnn_bind.DeviceArray((n,), "float32", stream=stream)
                          for n in (100, 1000, 5000)]
                del arrays
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=churn, args=(s,)) for s in (0x5, 0x6, 2)]
    for t in threads:
        t.start()
    for _ in range(200):
        cudnn_bind.empty_cache()
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors  # a pointer freed twice is cudaErrorInvalidValue here
    cudnn_bind.empty_cache()
    pool = _lib.get().pool
    assert pool.cached_bytes == 0 and pool.live_bytes == pool.reserved_bytes


def test_per_thread_default_stream_blocks_stay_in_their_thread(hooks):
    cudnn_bind.empty_cache()
    ptrs = []

    def first():
        a = cudnn_bind.DeviceArray((777,), "float32", stream=2)
        ptrs.append(a.ptr)
        del a  # cached for this thread's stream 2

    def second():
        b = cudnn_bind.DeviceArray((777,), "float32", stream=2)
        ptrs.append(b.ptr)
    for fn in (first, second):
        t = threading.Thread(target=fn)
        t.start()
        t.join()
    assert ptrs[0] != ptrs[1]  # another thread's stream 2 is another stream


def test_like_x_arrays_may_describe_ambiguous_layouts_either_way(hooks):
    x, w, b = data((4, 8, 1, 1))
    gx, gw, gb = dev(x), dev(w), dev(b)
    out = cudnn_bind.DeviceArray((4, 8, 1, 1), "float32", strides=(8, 1, 8, 8))
    y = cudnn_bind.batch_norm_forward_training(gx, gw, gb, out=out)[0]
    assert y is out
    np.testing.assert_allclose(out.to_numpy(), (x - x.mean((0, 2, 3), keepdims=True))
                               / np.sqrt(x.var((0, 2, 3), keepdims=True) + 1e-5)
                               * w[None, :, None, None] + b[None, :, None, None],
                               rtol=1e-4, atol=1e-5)


def test_backward_checks_the_batch_limit_and_the_reserve_layout(hooks):
    x, w, b = data()
    gx, gw, gb = dev(x), dev(w), dev(b)
    y, sm, si, reserve = cudnn_bind.batch_norm_forward_training(gx, gw, gb)
    huge = cudnn_bind.DeviceArray.from_pointer(gx.ptr, (cudnn_bind.TRAINING_MAX_BATCH + 1, 3, 1, 1),
                                               "float32", owner=gx)
    with pytest.raises(ValueError, match="880801"):
        cudnn_bind.batch_norm_backward(huge, huge, gw, sm, si, 1e-5, reserve)
    if reserve.nbytes >= 2:
        strided = cudnn_bind.DeviceArray.from_pointer(reserve.ptr, (reserve.nbytes // 2,), "uint8",
                                                      (2,), owner=reserve)
        with pytest.raises(ValueError, match="reserve must be contiguous"):
            cudnn_bind.batch_norm_backward(gx, gx, gw, sm, si, 1e-5, strided)


def test_empty_spatial_dims_are_an_empty_batch(hooks):
    w, b = np.ones(3, np.float32), np.zeros(3, np.float32)
    x = cudnn_bind.DeviceArray((2, 3, 0, 4), "float32")
    y = cudnn_bind.batch_norm_forward_inference(x, dev(w), dev(b), dev(w), dev(w))
    assert y.shape == (2, 3, 0, 4)


def test_host_copy_on_another_stream_waits_for_the_producer(hooks):
    a = cudnn_bind.DeviceArray.from_numpy(np.arange(6, dtype=np.float32), stream=0x91)
    syncs = hooks.standin_calls(b"cudaStreamSynchronize")
    take_log(hooks)
    np.testing.assert_array_equal(a.to_numpy(stream=0x92), np.arange(6, dtype=np.float32))
    assert parse(take_log(hooks)) == [("cudaMemcpyAsync", 0x92)]
    assert hooks.standin_calls(b"cudaStreamSynchronize") == syncs + 2  # 0x91, then 0x92
