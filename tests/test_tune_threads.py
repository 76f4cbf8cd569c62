"""Per-machine thread-team thresholds: cynorm.tune_threads measures each
kernel family's, get/set_thread_thresholds read and set them (that they
never change a result's bits: test_threads_by_work.py)."""
import json
import sys

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
import numpy as np
import pytest

import cynorm as cn
from cynorm import _tune
from cynorm._kernels import _runtime

FAMILIES = ("rows", "elementwise", "channels", "row_grads", "columns", "exp")
DEFAULTS = {"rows": 512 << 10, "elementwise": 768 << 10, "channels": 1 << 20,
            "row_grads": 640 << 10, "columns": 768 << 10, "exp": 96 << 10}


@pytest.fixture
def restore_thresholds():
    old = cn.get_thread_thresholds()
    threads = cn.get_num_threads()
    yield
    cn.set_thread_thresholds(old)
    cn.set_num_threads(threads)


def test_defaults_are_the_measured_ones():
    cn.set_thread_thresholds(None)
    assert cn.get_thread_thresholds() == DEFAULTS
    assert tuple(cn.get_thread_thresholds()) == FAMILIES


def test_set_returns_the_old_values_and_none_restores(restore_thresholds):
    assert cn.set_thread_thresholds({"rows": 1000, "exp": np.int64(0)}) == DEFAULTS
    now = cn.get_thread_thresholds()
    assert now == dict(DEFAULTS, rows=1000, exp=0)
    assert all(type(v) is int for v in now.values())
    # a saved dict round-trips through JSON
    assert cn.set_thread_thresholds(json.loads(json.dumps(now))) == now
    assert cn.set_thread_thresholds(None) == now
    assert cn.get_thread_thresholds() == DEFAULTS


@pytest.mark.parametrize("bad, err, match", [
    ({"row": 10}, ValueError, r"unknown kernel family 'row'; the families are rows, "
                              r"elementwise, channels, row_grads, columns, exp"),
    ({"rows": -1}, ValueError, r"thresholds\['rows'\] must be >= 0 and at most \d+ bytes, "
                               r"got -1"),
    ({"rows": sys.maxsize + 1}, ValueError, r"at most \d+ bytes"),
    ({"rows": 1.5}, TypeError, r"thresholds\['rows'\] must be an int \(a number of bytes\)"),
    ({"rows": True}, TypeError, r"thresholds\['rows'\] must be an int"),
    ([("rows", 10)], TypeError, r"thresholds must be a mapping of kernel family to bytes, "
                                r"or None, got list"),
    (1 << 20, TypeError, r"got int"),
])
def test_bad_thresholds_are_refused_and_nothing_is_set(bad, err, match, restore_thresholds):
    before = cn.get_thread_thresholds()
    with pytest.raises(err, match=match):
        cn.set_thread_thresholds(bad if not isinstance(bad, dict) else {"exp": 5, **bad})
    assert cn.get_thread_thresholds() == before


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(threads=0), ValueError, "threads must be >= 1, got 0"),
    (dict(threads=2.0), TypeError, "threads must be a positive int"),
    (dict(repeats=0), ValueError, r"repeats must be in 1\.\.1000, got 0"),
    (dict(repeats="3"), TypeError, "repeats must be an int"),
    (dict(apply=1), TypeError, "apply must be a bool, got 1"),
])
def test_tune_threads_bad_arguments(kwargs, err, match):
    with pytest.raises(err, match=match):
        cn.tune_threads(**kwargs)


def test_one_thread_has_nothing_to_tune(restore_thresholds):
    cn.set_thread_thresholds({"rows": 12345})
    assert cn.tune_threads(1) == cn.get_thread_thresholds()
    assert cn.get_thread_thresholds()["rows"] == 12345


def test_crossover_rule():
    moved = [10, 20, 40, 80]
    assert _tune.crossover(moved, [0.5, 0.9, 1.1, 1.5], 7) == 40
    assert _tune.crossover(moved, [1.3, 0.9, 1.1, 1.5], 7) == 40    # a lone early win: noise
    assert _tune.crossover(moved, [1.0, 1.2, 1.4, 1.9], 7) == 10
    assert _tune.crossover(moved, [0.9, 1.2, 0.97, 1.9], 7) == 20   # a dip within 5 %
    assert _tune.crossover(moved, [0.9, 1.2, 1.3, 0.9], 7) == 7     # behind at the top: default
    assert _tune.crossover(moved, [0.5, 0.6, 0.7, 0.9], 7) == 7     # never: the default


def test_tune_threads_measures_applies_and_restores(restore_thresholds):
    cn.set_thread_thresholds(None)
    cn.set_num_threads(1)
    old_forced = _runtime.set_parallel_min_bytes(None)
    found = cn.tune_threads(2, repeats=1, apply=False)
    assert tuple(found) == FAMILIES
    for family, nbytes in found.items():
        sizes = [_tune.family_call(family, n, np.random.default_rng(0))[0]
                 for n in _tune.SIZES]
        # the traffic of a size measured, or the default (the team never paid)
        assert type(nbytes) is int and (nbytes in sizes or nbytes == DEFAULTS[family])
    assert cn.get_thread_thresholds() == DEFAULTS         # apply=False: only returned
    assert cn.get_num_threads() == 1                      # the caller's thread count back
    assert _runtime.set_parallel_min_bytes(old_forced) is None
    applied = cn.tune_threads(2, repeats=1)
    assert cn.get_thread_thresholds() == applied


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_threshold_decides_the_team(family, restore_thresholds):
    # threads_for (entry.pxd) reads the family's own threshold: a call whose
    # traffic reaches it gets the team, one byte short runs on one thread;
    # 16-bit elements count at float32's width
    from cynorm import _kernels
    team_size = _kernels.load("layer_norm").team_size
    index = FAMILIES.index(family)
    old_forced = _runtime.set_parallel_min_bytes(None)
    # the fixed team policy: on a loaded machine the adaptive one may cap
    # the team, which is not what this test is about
    policy = cn.set_team_policy("fixed")
    try:
        cn.set_thread_thresholds({family: 3 * 4 * 1000})        # 1000 float32, 3 passes
        assert team_size(1000, 3, 4, index, 4) == 4
        assert team_size(999, 3, 4, index, 4) == 1
        assert team_size(1000, 3, 2, index, 4) == 4             # bfloat16: float32's width
        other = FAMILIES[(index + 1) % len(FAMILIES)]
        cn.set_thread_thresholds({other: 0})                     # another family's: no effect
        assert team_size(999, 3, 4, index, 4) == 1
        cn.set_thread_thresholds({family: 0})
        assert team_size(1, 1, 4, index, 3) == 3
        _runtime.set_parallel_min_bytes(1 << 40)                 # the override wins
        assert team_size(1000, 3, 4, index, 4) == 1
    finally:
        _runtime.set_parallel_min_bytes(old_forced)
        cn.set_team_policy(policy)
