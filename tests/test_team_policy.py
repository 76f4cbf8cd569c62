"""The thread-team policy (cn_team.h): a worker that starts late caps the
team, the call still returns the same bits, and the full team comes back.

A worker is held back deterministically: _runtime.set_worker_delay_ns makes
every worker of a timed region sleep before its share, as a worker the OS
had not scheduled would.  No timing is asserted beyond that delay.
"""
import os
import subprocess
import sys
import time

import ml_dtypes
import numpy as np
import pytest

import cynorm
from cynorm._kernels import _runtime

AVAILABLE = cynorm.thread_team_info()["available"]
needs_timing = pytest.mark.skipif(not AVAILABLE, reason="this build cannot time its thread "
                                  "teams (GCC with OpenMP on Linux only)")
HELD_BACK_NS = 20_000_000       # far above a region of these sizes, and above LATE_MIN
FIRST_HOLD_NS = 10_000_000      # a first late region's hold (cn_team.h: CN_TEAM_HOLD_MIN_NS)


def test_gcc_openmp_linux_builds_time_their_teams():
    """Where the wrap can be built, it is: the adaptive policy is no silent no-op."""
    cfg = cynorm.config()
    gcc_openmp_linux = (cfg["compiler"].startswith("gcc") and cfg["openmp"].startswith("yes")
                        and sys.platform.startswith("linux"))
    assert AVAILABLE == gcc_openmp_linux, cfg
    if AVAILABLE and os.environ.get("CYNORM_TEAM_POLICY", "") != "fixed":
        assert cynorm.get_team_policy() == "adaptive"


@pytest.fixture
def team_of_two():
    """Two threads, woken for every call, adaptive policy, a fresh cap; the
    worker delay is cleared afterwards whatever happens."""
    old_threads = cynorm.get_num_threads()
    cynorm.set_num_threads(2)
    _runtime.set_parallel_min_bytes(0)
    old_policy = cynorm.set_team_policy("adaptive")
    yield
    _runtime.set_worker_delay_ns(0)
    _runtime.set_parallel_min_bytes(None)
    cynorm.set_team_policy(old_policy)
    cynorm.set_num_threads(old_threads)


def _ops():
    """One public op per kernel module with parallel regions: each module
    must be bound to the process's team state (entry.pxd's bind_team)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    x4 = rng.standard_normal((4, 8, 6, 5)).astype(np.float32)
    v = rng.standard_normal((32, 40)).astype(np.float32)
    g = (rng.random((32, 1)) + 0.5).astype(np.float32)
    target = rng.integers(0, 96, 64)
    logp = cynorm.log_softmax(x, 1)
    nested = cynorm.nested.nested_array([x[:5], x[5:30], x[30:]])
    return {
        "layer_norm": lambda: cynorm.layer_norm(x.astype(ml_dtypes.bfloat16), 96),
        "batch_norm": lambda: cynorm.batch_norm(x4, None, None, None, None, True),
        "weight_norm": lambda: cynorm.weight_norm_interface(v, g, 0),
        "softmax": lambda: cynorm.softmax(x, 1),
        "segments": lambda: cynorm.nested.softmax(nested, -1),
        "pointwise": lambda: cynorm.log_sigmoid_forward(x),
        "activations": lambda: cynorm.nested.gelu(nested),
        "nll_loss": lambda: cynorm.nll_loss_backward(np.float32(1.0), logp, target, None,
                                                     "mean", -100, np.float32(64.0)),
    }


def _bits(result):
    """Every output array of a call, as raw bytes (NaN-safe comparison)."""
    if isinstance(result, (tuple, list)):
        return [b for r in result for b in _bits(r)]
    if isinstance(result, cynorm.nested.NestedArray):
        return _bits(result.buffer)
    return [np.ascontiguousarray(result).tobytes()] if result is not None else [None]


@needs_timing
@pytest.mark.parametrize("module", list(_ops()))
def test_a_held_back_worker_caps_the_team_and_the_bits_stay(team_of_two, module):
    call = _ops()[module]
    cynorm.set_num_threads(1)
    want = _bits(call())
    cynorm.set_num_threads(2)

    _runtime.reset_team()
    before = cynorm.thread_team_info()
    _runtime.set_worker_delay_ns(HELD_BACK_NS)
    start = time.monotonic()
    got = _bits(call())
    took = time.monotonic() - start
    after = cynorm.thread_team_info()
    assert got == want
    # every region of the call was timed, and the first was late: the
    # worker started 20 ms after a fork whose work takes microseconds
    assert after["late_regions"] > before["late_regions"], (module, before, after)
    assert after["cap"] == 1, after
    # the hold (10 ms at first) starts as the late region ends and outlasts
    # the rest of the call, unless the machine stalled the call past it
    if took < (HELD_BACK_NS + FIRST_HOLD_NS) / 1e9:
        assert after["held_for_s"] > 0, (after, took)

    # while the hold lasts, calls run on one thread: no region is forked
    # (so none is timed), and the bits are the same
    got = _bits(call())
    held = cynorm.thread_team_info()
    assert got == want
    if held["held_for_s"] > 0:      # a slow machine may have outlived the hold
        assert held["regions"] == after["regions"], (after, held)


@needs_timing
def test_the_full_team_comes_back_after_the_hold(team_of_two):
    x = np.random.default_rng(3).standard_normal((256, 256)).astype(np.float32)
    _runtime.reset_team()
    _runtime.set_worker_delay_ns(HELD_BACK_NS)
    cynorm.layer_norm(x, 256)
    assert cynorm.thread_team_info()["cap"] == 1
    _runtime.set_worker_delay_ns(0)
    held = cynorm.thread_team_info()
    # the hold is 10 ms; a probe that a loaded machine makes late again
    # holds longer, so try for a few seconds
    deadline = time.monotonic() + 10
    while cynorm.thread_team_info()["cap"] == 1 and time.monotonic() < deadline:
        time.sleep(0.02)
        cynorm.layer_norm(x, 256)
    after = cynorm.thread_team_info()
    assert after["regions"] > held["regions"]       # the team was tried again
    if after["cap"] != 2:
        # only a machine whose other work kept every probe's worker late
        # (the suite beside a build, say) keeps the cap: each such probe
        # was judged late
        assert after["late_regions"] > held["late_regions"]


@needs_timing
def test_the_fixed_policy_forks_as_asked(team_of_two):
    x = np.random.default_rng(4).standard_normal((64, 64)).astype(np.float32)
    assert cynorm.set_team_policy("fixed") == "adaptive"
    before = cynorm.thread_team_info()
    _runtime.set_worker_delay_ns(HELD_BACK_NS)      # not applied: regions are not timed
    cynorm.layer_norm(x, 64)
    after = cynorm.thread_team_info()
    assert after["policy"] == "fixed"
    assert (after["regions"], after["late_regions"], after["cap"]) == \
        (before["regions"], before["late_regions"], 0)


def test_team_policy_arguments():
    with pytest.raises(TypeError, match="policy must be a str"):
        cynorm.set_team_policy(1)
    with pytest.raises(ValueError, match="'adaptive' or 'fixed'"):
        cynorm.set_team_policy("dynamic")
    old = cynorm.set_team_policy("fixed")
    try:
        assert cynorm.get_team_policy() == "fixed"
        if not AVAILABLE:
            with pytest.raises(ValueError, match="needs a build that times its parallel"):
                cynorm.set_team_policy("adaptive")
    finally:
        if AVAILABLE:
            cynorm.set_team_policy(old)
    info = cynorm.thread_team_info()
    assert set(info) == {"policy", "available", "cap", "held_for_s", "regions", "late_regions"}


def test_environment_selects_the_fixed_policy():
    code = "import cynorm; print(cynorm.get_team_policy())"
    env = dict(os.environ, CYNORM_TEAM_POLICY="fixed")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, cwd=os.path.dirname(__file__))
    assert out.stdout.strip() == "fixed"
