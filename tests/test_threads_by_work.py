"""The thread team's threshold per kernel family (cynorm/_kernels/entry.pxd):
a call below its family's traffic runs on one thread, and the override
set_parallel_min_bytes, like each family's own threshold
(set_thread_thresholds), changes only where the team starts, never the bits."""
import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
import numpy as np
import pytest

import cynorm as cn
from cynorm._kernels import _runtime


def test_override_round_trip_and_bad_values():
    assert _runtime.set_parallel_min_bytes(0) is None          # the families' own by default
    try:
        assert _runtime.set_parallel_min_bytes(1 << 20) == 0
        with pytest.raises(ValueError, match="nbytes must be >= 0 or None"):
            _runtime.set_parallel_min_bytes(-1)
        assert _runtime.set_parallel_min_bytes(None) == 1 << 20
    finally:
        _runtime.set_parallel_min_bytes(None)
    assert _runtime.set_parallel_min_bytes(None) is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("forced", [0, 1 << 40, None], ids=["team-always", "never", "families"])
@pytest.mark.parametrize("how", ["override", "per-family"])
def test_the_threshold_never_changes_the_bits(forced, how, dtype, restore_threads):
    # set_parallel_min_bytes for all families at once, or each family's own
    # threshold (cynorm.set_thread_thresholds, what tune_threads sets)
    rng = np.random.default_rng(0)
    # 262 KiB of float32 (131 KiB of bfloat16, counted at float32's width):
    # around the thresholds
    x = rng.standard_normal((96, 700)).astype(np.float32).astype(np.dtype(dtype))
    w, b = np.ones(700, np.float32), np.zeros(700, np.float32)
    g = np.ones((1, 700), np.float32)

    def outputs():
        y, mean, rstd = cn.layer_norm(x, (700,), w, b)
        return [y, mean, rstd, *cn.layer_norm_backward(x, x, (700,), mean, rstd, w, b),
                cn.softmax(x, 1), cn.softmax(x, 0), cn.log_sigmoid_forward(x)[0],
                *cn.weight_norm_interface(x, g, 1), *cn.batch_norm(x, training=True)[:3]]

    cn.set_num_threads(1)
    want = outputs()
    cn.set_num_threads(2)
    if how == "override":
        old = _runtime.set_parallel_min_bytes(forced)
        try:
            got = outputs()
        finally:
            _runtime.set_parallel_min_bytes(old)
    else:
        old = cn.set_thread_thresholds(
            None if forced is None else dict.fromkeys(cn.get_thread_thresholds(), forced))
        try:
            got = outputs()
        finally:
            cn.set_thread_thresholds(old)
    for a, b_ in zip(got, want):
        np.testing.assert_array_equal(a.view(np.uint8), b_.view(np.uint8))
