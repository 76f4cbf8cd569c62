"""cudnn_bind's support rules (cudnn_bind/rules.py) at work: explicit
modes, dtypes, layouts, fused ops and batch sizes, through the host
stand-in (tests/cudnn_standin, which answers NOT_SUPPORTED outside cuDNN's
documented fused-op conditions as the real library does).  What a call
refuses, can_use_cudnn reports in the same words; what it accepts reaches
cuDNN and succeeds; the automatic mode choice never lands on a refusal."""
import ctypes
import itertools
import math

import ml_dtypes
import numpy as np
import pytest

import cudnn_bind
import cynorm
from cudnn_bind import rules
from cudnn_helpers import build_standin, standin_hooks, to_device

pytestmark = pytest.mark.cudnn

BF16 = np.dtype(ml_dtypes.bfloat16)
# reasons can_use_cudnn gives for PyTorch's own conditions, which cudnn_bind's calls do not have
PYTORCH_ONLY = ("bfloat16 input or weight", "input must have at least 3 dimensions", "batch of ")


@pytest.fixture(scope="module")
def hooks(tmp_path_factory):
    out = build_standin(tmp_path_factory.mktemp("standin_rules"))
    cudnn_bind.load(out, cudart=out)
    yield standin_hooks(out)
    cudnn_bind.reset()


def bn_calls(hooks):
    return sum(hooks.standin_calls(name.encode()) for name in (
        "cudnnBatchNormalizationForwardTrainingEx", "cudnnBatchNormalizationForwardInference",
        "cudnnBatchNormalizationBackwardEx"))


def modes_logged(hooks):
    buf = ctypes.create_string_buffer(8192)
    hooks.standin_take_log(buf, len(buf))
    return [int(line.rsplit(" ", 1)[1]) for line in buf.value.decode().splitlines()
            if " mode " in line]


def host(shape, dtype, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return x.astype(BF16 if dtype == "bfloat16" else dtype)


SHAPES = {2: (6, 4), 3: (3, 4, 3), 4: (2, 4, 3, 2), 5: (2, 4, 2, 2, 2)}
GRID = [(dtype, nd, layout, mode, fused, training)
        for dtype in ("float32", "float64", "float16", "bfloat16")
        for nd in (2, 3, 4, 5)
        for layout in (("contiguous", "channels_last") if nd >= 4 else ("contiguous",))
        for mode in (None, "per_activation", "spatial", "spatial_persistent")
        for fused in (None, "relu", "add_relu")
        for training in (True, False)]


def test_every_call_and_can_use_cudnn_agree_over_the_grid(hooks):
    """dtype x rank x layout x mode x fused op x training: a call refused with
    an error has can_use_cudnn report exactly that error; an accepted call
    reaches cuDNN (no NOT_SUPPORTED from the stand-in) and can_use_cudnn
    says yes, or names one of PyTorch's own conditions."""
    refused = accepted = 0
    rules_named = set()
    for dtype, nd, layout, mode, fused, training in GRID:
        shape = SHAPES[nd]
        c = shape[1]
        nparam = c * (math.prod(shape[2:]) if mode == "per_activation" else 1)
        pdt = np.float64 if dtype == "float64" else np.float32
        x = to_device(host(shape, dtype), layout)
        w, b = (cudnn_bind.DeviceArray.from_numpy(np.full(nparam, v, pdt)) for v in (1.5, 0.25))
        rm, rv = (cudnn_bind.DeviceArray.from_numpy(np.full(nparam, v, pdt)) for v in (0.0, 1.0))
        z = to_device(host(shape, dtype, seed=1), layout) if fused == "add_relu" else None
        activation = "relu" if fused else None
        ok, why = cudnn_bind.can_use_cudnn(x, w, b, rm, rv, training, mode=mode,
                                           activation=activation, z=z)
        before = bn_calls(hooks)
        try:
            if training:
                cudnn_bind.batch_norm_forward_training(x, w, b, rm, rv, mode=mode,
                                                       activation=activation, z=z)
            elif fused:
                assert not ok and "fuse into training only" in why
                continue  # the inference call has no fused ops to ask for
            else:
                cudnn_bind.batch_norm_forward_inference(x, w, b, rm, rv, mode=mode)
        except (TypeError, ValueError) as exc:
            refused += 1
            rules_named.add(getattr(exc, "rule", None))
            assert bn_calls(hooks) == before, f"refused after reaching cuDNN: {exc}"
            assert not ok and why == str(exc), (dtype, nd, layout, mode, fused, training, why)
            continue
        accepted += 1
        assert bn_calls(hooks) == before + 1
        assert ok or why.startswith(PYTORCH_ONLY), (dtype, nd, layout, mode, fused, training, why)
    assert refused > 50 and accepted > 100 and "fused_activation" in rules_named


@pytest.mark.parametrize("training", [True, False])
def test_the_automatic_mode_never_lands_on_a_refusal(training):
    """With mode= left unset (and no fused op) every rank, layout and dtype
    gets a mode the rules accept, up to the batch limit of its call."""
    n = rules.TRAINING_MAX_BATCH if training else 10 ** 7  # inference runs in chunks
    for nd, layout, dtype in itertools.product((2, 3, 4, 5), ("contiguous", "channels_last"),
                                               ("float32", "float64", "float16", "bfloat16")):
        if layout == "channels_last" and nd < 4:
            continue
        shape = (n, 3) + (2,) * (nd - 2)
        mode = rules.check_call(shape, layout, dtype, training)
        assert mode == cudnn_bind.choose_mode(nd, layout, training)
        assert mode != cudnn_bind.PER_ACTIVATION


def test_per_activation_training_is_refused_over_its_batch_limit(hooks):
    """cuDNN's PER_ACTIVATION training fails beyond 131070 samples
    (pytorch/pytorch#2917): an explicit mode='per_activation' is refused
    before cuDNN, forward and backward, with the rule named; left to the
    automatic choice the same 2-D batch runs in SPATIAL mode, the same
    statistics."""
    limit = rules.PER_ACTIVATION_TRAINING_MAX_BATCH
    x = np.random.default_rng(3).standard_normal((limit + 1, 2)).astype(np.float32)
    w, b = np.array([1.5, -0.5], np.float32), np.array([0.25, 0.0], np.float32)
    gx, gw, gb = (cudnn_bind.DeviceArray.from_numpy(a) for a in (x, w, b))
    before = bn_calls(hooks)
    with pytest.raises(cudnn_bind.UnsupportedError, match=f"limited to N <= {limit}") as info:
        cudnn_bind.batch_norm_forward_training(gx, gw, gb, mode="per_activation")
    assert info.value.rule == "batch_limit" and "pytorch/pytorch#2917" in str(info.value)
    with pytest.raises(cudnn_bind.UnsupportedError, match=f"limited to N <= {limit}"):
        cudnn_bind.batch_norm_backward(gx, gx, gw, gw, gw, 1e-5, None, mode="per_activation")
    assert cudnn_bind.can_use_cudnn(gx, gw, gb, mode="per_activation") == (False,
                                                                          str(info.value))
    assert bn_calls(hooks) == before
    modes_logged(hooks)
    y = cudnn_bind.batch_norm_forward_training(gx, gw, gb)[0]
    assert modes_logged(hooks) == [cudnn_bind.SPATIAL]
    ref = cynorm.batch_norm(x, w, b, training=True)[0]
    np.testing.assert_allclose(y.to_numpy(), ref, rtol=1e-4, atol=1e-4)
    # at the limit itself PER_ACTIVATION runs
    at = cudnn_bind.DeviceArray.from_pointer(gx.ptr, (limit, 2), "float32", owner=gx)
    y = cudnn_bind.batch_norm_forward_training(at, gw, gb, mode="per_activation")[0]
    assert modes_logged(hooks) == [cudnn_bind.PER_ACTIVATION]
    np.testing.assert_allclose(y.to_numpy(), cynorm.batch_norm(x[:limit], w, b, training=True)[0],
                               rtol=1e-4, atol=1e-4)


def test_the_spatial_training_limit_is_reported_as_the_call_raises_it(hooks):
    limit = rules.TRAINING_MAX_BATCH
    huge = cudnn_bind.DeviceArray((limit + 1, 2, 1, 1), "float32")  # never read: refused first
    w = cudnn_bind.DeviceArray.from_numpy(np.ones(2, np.float32))
    with pytest.raises(cudnn_bind.UnsupportedError, match=f"N <= {limit}") as info:
        cudnn_bind.batch_norm_forward_training(huge, w, w)
    assert info.value.rule == "batch_limit" and isinstance(info.value, ValueError)
    assert cudnn_bind.can_use_cudnn(huge, w, w) == (False, str(info.value))


def test_parameters_of_the_wrong_dtype_or_size_are_reported_as_the_call_raises_them(hooks):
    """can_use_cudnn used to say yes to weights the calls refuse (float64 for
    float32 x, C values where PER_ACTIVATION needs C*H*W)."""
    x = cudnn_bind.DeviceArray.from_numpy(host((2, 3, 2, 2), "float32"))
    w64 = cudnn_bind.DeviceArray.from_numpy(np.ones(3, np.float64))
    w = cudnn_bind.DeviceArray.from_numpy(np.ones(3, np.float32))
    for kwargs, weight, error in [({}, w64, TypeError),
                                  ({"mode": "per_activation"}, w, ValueError)]:
        with pytest.raises(error) as info:
            cudnn_bind.batch_norm_forward_training(x, weight, w, **kwargs)
        assert cudnn_bind.can_use_cudnn(x, weight, w, **kwargs) == (False, str(info.value))
    one = cudnn_bind.DeviceArray.from_numpy(host((1, 3), "float32"))
    with pytest.raises(ValueError, match="more than 1 value per channel") as info:
        cudnn_bind.batch_norm_forward_training(one, w, w)
    assert cudnn_bind.can_use_cudnn(one, w, w) == (False, str(info.value))

