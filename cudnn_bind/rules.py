"""Which batch norms cudnn_bind runs on cuDNN, and how: the rules, once.

The three calls and `can_use_cudnn` all ask `check_call` (layout, mode,
fused op, batch limit), `param_dtype` and `layout_of`; what they refuse,
they refuse with the same `UnsupportedError`, which names the rule
(`.rule`).  Every rule below carries its source; nothing here is a guess
about what cuDNN might refuse.

Rules (cuDNN 8/9 legacy batch-norm API, as PyTorch, TensorFlow and CuPy
use it):

* layout: x is packed in N,C,... order ("contiguous") or, for 4-D and 5-D,
  channels-last.  When both describe it (C = 1, or unit spatial dims),
  PyTorch's stride rule (suggest_memory_format) picks, so the mode is the
  one PyTorch would pick for the same tensor.
* data: float32, float64, float16 or bfloat16 x; the parameters (weight,
  bias, statistics) are float64 for float64 x and float32 otherwise.
* mode, chosen automatically as ATen's getCudnnBatchNormMode does:
  SPATIAL_PERSISTENT for channels-last training, SPATIAL otherwise.  2-D
  input (N, C) runs as (N, C, 1, 1) in SPATIAL mode, the same statistics:
  PyTorch never gives 2-D input to cuDNN, whose PER_ACTIVATION kernel is
  many times slower and refuses large batches.  An explicit `mode=` is
  used as given, within the rules below.
* batch: training runs at most 880801 samples per call in the spatial
  modes and 131070 in PER_ACTIVATION (UnsupportedError "batch_limit");
  inference runs in chunks of 65535 samples, so it has no limit here.
* fused ReLU (activation='relu') and add+ReLU (z=...): cuDNN has kernels
  for these only for fully packed channels-last (NHWC/NDHWC) float16 data
  in SPATIAL_PERSISTENT mode, with C % 4 == 0 for add+ReLU (for ReLU too
  before cuDNN 8.2): cudnnBatchNormalizationForwardTrainingEx's documented
  conditions for its NHWC kernel; TensorFlow's remapper and CuPy gate on
  the same (UnsupportedError "fused_activation").

What the documentation states and is *not* a refusal, so no rule here:
SPATIAL_PERSISTENT's optimized path exists for float and half data only
(other types, and inference, run the ordinary SPATIAL kernel), and on
N,C,... data it may use a scaled integer reduction that overflows for very
large finite inputs where SPATIAL would not (why ATen picks it only for
channels-last; an explicit mode='spatial_persistent' gets it anyway).
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

from cudnn_bind._typing import ModeLike
from cudnn_bind.descriptors import PER_ACTIVATION, SPATIAL, SPATIAL_PERSISTENT, bn_mode
from cudnn_bind.errors import UnsupportedError

__all__ = ["layout_of", "layout_order", "plan_mode", "check_call", "check_batch",
           "param_dtype", "packed", "MODE_NAMES", "TRAINING_MAX_BATCH",
           "PER_ACTIVATION_TRAINING_MAX_BATCH", "INFERENCE_MAX_BATCH"]

MODE_NAMES = {PER_ACTIVATION: "PER_ACTIVATION", SPATIAL: "SPATIAL",
              SPATIAL_PERSISTENT: "SPATIAL_PERSISTENT"}

# Source: ATen's _select_batch_norm_backend, spatial training (pytorch#32763, cuDNN 7.6.5)
TRAINING_MAX_BATCH = 880801
# Source: pytorch/pytorch#2917, per-activation training over 131070 is NOT_SUPPORTED (#2919)
PER_ACTIVATION_TRAINING_MAX_BATCH = 131070
# Source: ATen's _select_batch_norm_backend, spatial inference (pytorch#19911: 65536 fails)
INFERENCE_MAX_BATCH = 65535


def param_dtype(x_dtype: str) -> str:
    """The dtype cuDNN wants for weight, bias and the statistics of x_dtype data."""
    # Source: cudnn_ops.h of 9.x on bnScaleBiasMeanVarDesc: "(typeOf(x) == double) ? double : float"
    return "float64" if x_dtype == "float64" else "float32"


def packed(shape: Sequence[int], strides: Sequence[int], order: Iterable[int]) -> bool:
    """Whether an array is densely packed with its dimensions, innermost
    first, in `order` (size-1 dimensions may have any stride)."""
    acc = 1
    for i in order:
        if shape[i] != 1 and strides[i] != acc:
            return False
        acc *= max(shape[i], 1)  # an empty dimension's neighbours keep C-order strides
    return True


def layout_order(ndim: int, layout: str) -> list[int]:
    """The dimensions of a packed `layout`, innermost first."""
    if layout == "channels_last":
        return [1] + list(range(ndim - 1, 1, -1)) + [0]
    return list(range(ndim - 1, -1, -1))


def _torch_says_channels_last(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """PyTorch's is_channels_last_strides_2d/3d (the rule behind
    suggest_memory_format): the strides of size-1 dimensions decide."""
    if strides[1] == 0:
        return False
    order = (1, 3, 2, 0) if len(shape) == 4 else (1, 4, 3, 2, 0)
    floor = 0
    for d in order:
        if shape[d] == 0 or strides[d] < floor:
            return False
        if d == 0 and floor == strides[1]:
            return False  # N111 with equal strides: N,C,... by default
        floor = strides[d] * shape[d] if shape[d] > 1 else strides[d]
    return True


def layout_of(shape: Sequence[int], strides: Sequence[int], name: str = "x") -> str:
    """'contiguous' (packed N,C,...) or 'channels_last' (packed N,...,C; 4-D
    and 5-D), else ValueError naming `name`."""
    # Source: ATen's cudnn_batch_norm: input->is_contiguous(input->suggest_memory_format())
    nd = len(shape)
    nchw = packed(shape, strides, layout_order(nd, "contiguous"))
    nhwc = nd in (4, 5) and packed(shape, strides, layout_order(nd, "channels_last"))
    if nchw and nhwc:
        return "channels_last" if _torch_says_channels_last(shape, strides) else "contiguous"
    if nchw:
        return "contiguous"
    if nhwc:
        return "channels_last"
    raise ValueError(f"{name} must be contiguous in N,C,... order or channels-last, "
                     f"got shape {shape} with strides {strides} (elements)")


def _fused_rule(fused: str, ndim: int, layout: str, dtype: Optional[str], channels: int,
                mode: Optional[int], version: int) -> Optional[str]:
    """None when cuDNN has a kernel for the fused op, else why not."""
    # Source: cudnnBatchNormalizationForwardTrainingEx's docs, its NHWC kernel's conditions
    need_c4 = fused == "add_relu" or version < 8200
    wants = []
    if dtype != "float16":
        wants.append(f"float16 data (x is {dtype})")
    if layout != "channels_last" or ndim not in (4, 5):
        wants.append("channels-last 4-D or 5-D x (x is "
                     f"{'channels-last' if layout == 'channels_last' else 'N,C,...'} {ndim}-D)")
    if need_c4 and channels % 4:
        wants.append(f"a channel count divisible by 4 (C = {channels})")
    if mode is not None and mode != SPATIAL_PERSISTENT:
        wants.append(f"mode SPATIAL_PERSISTENT (mode= asked for {MODE_NAMES[mode]})")
    if not wants:
        return None
    what = "add+ReLU" if fused == "add_relu" else "ReLU"
    c4 = " with C % 4 == 0" if need_c4 else ""
    return (f"cuDNN fuses {what} into batch norm only for float16 channels-last data{c4} "
            f"in SPATIAL_PERSISTENT mode; this call needs " + "; ".join(wants))


def plan_mode(ndim: int, layout: str, dtype: Optional[str], channels: int, training: bool,
              mode: Optional[ModeLike] = None, fused: Optional[str] = None,
              version: int = 90000) -> int:
    """The cudnnBatchNormMode_t for a call, or UnsupportedError naming the rule.

    `mode`: None (choose as ATen does) or an explicit mode; `fused`: None,
    'relu' or 'add_relu' (training forward and backward only); `version`:
    the loaded cuDNN's (cudnnGetVersion)."""
    if mode is not None:
        mode = bn_mode(mode)
    if fused is not None:
        why = _fused_rule(fused, ndim, layout, dtype, channels, mode, version)
        if why:
            raise UnsupportedError("fused_activation", why)
        return SPATIAL_PERSISTENT
    if mode is not None:
        return mode
    # Source: ATen's getCudnnBatchNormMode (native/cudnn/BatchNorm.cpp), but 2-D runs SPATIAL
    if training and layout == "channels_last" and ndim >= 4:
        return SPATIAL_PERSISTENT
    return SPATIAL


def check_batch(batch: int, mode: int, training: bool) -> None:
    """UnsupportedError ("batch_limit") when cuDNN cannot train on `batch`
    samples in `mode`; inference has no limit (the calls run it in chunks)."""
    if not training:
        return
    if mode == PER_ACTIVATION:
        if batch > PER_ACTIVATION_TRAINING_MAX_BATCH:
            raise UnsupportedError(
                "batch_limit",
                f"x has a batch of {batch}; cuDNN's PER_ACTIVATION training is limited to "
                f"N <= {PER_ACTIVATION_TRAINING_MAX_BATCH} (pytorch/pytorch#2917): leave mode= "
                "unset for 2-D x, or give x as (N, C*H*W, 1, 1) in SPATIAL mode (the same "
                "statistics), or split the batch")
    elif batch > TRAINING_MAX_BATCH:
        raise UnsupportedError(
            "batch_limit",
            f"x has a batch of {batch}; cuDNN batch-norm training is limited to N <= "
            f"{TRAINING_MAX_BATCH} (PyTorch's limit): split the batch or use cynorm's "
            "split-statistics ops")


def check_call(shape: Sequence[int], layout: str, dtype: Optional[str], training: bool,
               mode: Optional[ModeLike] = None, fused: Optional[str] = None,
               version: int = 90000) -> int:
    """Every rule of a call on x of `shape` (N, C, ...): its mode
    (`plan_mode`), and the batch limit of that mode (`check_batch`);
    UnsupportedError naming the rule that fails."""
    chosen = plan_mode(len(shape), layout, dtype, shape[1], training, mode, fused, version)
    check_batch(shape[0], chosen, training)
    return chosen
