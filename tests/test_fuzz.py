"""The fuzz suite (tests/fuzz): a fixed budget of seeded cases over every
public function, each run in a restartable worker, asserting no crash, hang,
wrong answer, wrong exception class or modified input; a long run is marked
slow.  CYNORM_FUZZ_SEED picks the seed, CYNORM_FUZZ_CASES (LONG_CASES) the
cases per target of the normal (long) run and CYNORM_FUZZ_BUDGET
(LONG_BUDGET) the seconds that cap it; a failure's message lists the cases
to replay:

    python -m tests.fuzz.runner --replay TARGET:SEED:INDEX
"""
import json
import os

import numpy as np
import pytest

from fuzz import cases, oracles, runner

SEED = int(os.environ.get("CYNORM_FUZZ_SEED", runner.DEFAULT_SEED))
# A run is the first CASES indices of every target, the same cases on every
# machine (a run that passed here passes anywhere); the seconds only cap a
# slow machine's run, which then stops early.
CASES = int(os.environ.get("CYNORM_FUZZ_CASES", "200"))
BUDGET = float(os.environ.get("CYNORM_FUZZ_BUDGET", "300"))
LONG_CASES = int(os.environ.get("CYNORM_FUZZ_LONG_CASES", "400"))
LONG_BUDGET = float(os.environ.get("CYNORM_FUZZ_LONG_BUDGET", "1800"))
WORKERS = min(2, os.cpu_count() or 1)


def _run(budget, seed=SEED, **kw):
    report = runner.drive(seed=seed, budget=budget, workers=WORKERS, **kw)
    path = os.environ.get("CYNORM_FUZZ_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return report


def _message(report):
    lines = runner.failure_lines(report, limit=80)
    return (f"{len(report['failures'])} failing fuzz cases (seed {report['seed']}, "
            f"{report['cases']} cases); replay with python -m tests.fuzz.runner --replay "
            f"TARGET:SEED:INDEX\n" + "\n".join(lines) + "\n\n" + runner.table(report))


needs_wide = pytest.mark.skipif(
    not oracles.WIDE, reason="the references need an extended long double (x86-64 Linux): here "
    "np.longdouble is float64 and the extreme-value cases would overflow the references themselves")


@needs_wide
def test_fuzz_budget():
    report = _run(BUDGET, cases=CASES)
    assert report["cases"] > 0
    assert not report["failures"], _message(report)


@needs_wide
@pytest.mark.slow
def test_fuzz_long():
    report = _run(LONG_BUDGET, seed=SEED + 1, cases=LONG_CASES)
    assert not report["failures"], _message(report)


# ---------------------------------------------------------------- the fuzzer itself

def test_cases_are_reproducible():
    """A case is a pure function of (target, seed, index)."""
    import re

    def text(c):      # object addresses differ between two generations
        return re.sub(r" at 0x[0-9a-f]+", "", runner.call_text(c, full=True)) + repr((c.expect, c.notes))
    for name in ("cynorm.layer_norm", "cynorm.batch_norm", "cynorm.jvp.layer_norm",
                 "cynorm.nested.softmax"):
        t = cases.TARGETS[name]
        for index in range(20):
            assert text(t.case(7, index)) == text(t.case(7, index)), (name, index)


def test_every_public_function_is_a_target():
    import cynorm
    import cynorm.nested
    names = set(cases.TARGETS)
    for n in cynorm.__all__:
        obj = getattr(cynorm, n)
        if callable(obj) and not isinstance(obj, type) and n not in ("jvp",):
            assert f"cynorm.{n}" in names, n
    for n in cynorm.nested.__all__:
        assert f"cynorm.nested.{n}" in names, n
    assert any(n.startswith("cynorm.jvp.") for n in names)


@pytest.mark.skipif(os.name != "posix", reason="the crash target kills itself with SIGSEGV")
def test_argument_names_are_the_functions_own():
    """Cases name their arguments as the functions do (the 'unnamed' check
    and the reports rely on it)."""
    import inspect
    for name, t in cases.TARGETS.items():
        if name.startswith("selftest.") or t.unavailable():
            continue
        fn = t.resolve()
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        if any(p.kind == p.VAR_KEYWORD for p in params.values()):
            continue
        c = t.case(3, 0)
        for a in c.args:
            assert a.name in params, (name, a.name, list(params))


@pytest.mark.skipif(os.name != "posix", reason="the crash target kills itself with SIGSEGV")
def test_driver_classifies_each_outcome(monkeypatch):
    """Deliberately broken targets (fuzz/selftest.py) end as what they are."""
    monkeypatch.setenv("CYNORM_FUZZ_SELFTEST", "1")
    from fuzz import selftest  # noqa: F401  (registers them here too, for select_targets)
    report = runner.drive(seed=1, budget=120, cases=1, targets=["^selftest\\."], workers=1, timeout=5)
    got = {t: next(iter(c)) for t, c in report["counts"].items()}
    assert got == {"selftest.crash": "crash", "selftest.hang": "hang",
                   "selftest.modifies": "modified_input", "selftest.wrong": "wrong_answer",
                   "selftest.keyerror": "wrong_class", "selftest.unnamed": "unnamed",
                   "selftest.outside": "wrote_outside_out"}, got


def _with_fn(name, fn, seed, index):
    c = cases.TARGETS[name].case(seed, index)
    c.fn = fn
    return c


def test_oracle_catches_float32_norm_overflow():
    """A norm computed in float32 overflows for [[3e20, 4e20]]: a wrong answer."""
    v = np.array([[3e20, 4e20]], np.float32)
    with np.errstate(over="ignore"):
        got = np.sqrt(np.sum(v * v, axis=1, keepdims=True))      # inf in float32
    exp = oracles.ref_norm_except_dim(v, 2, 0)
    assert oracles.verify(exp, got, single=True)
    assert not oracles.verify(exp, np.array([[5e20]], np.float32), single=True)


def test_oracle_catches_layer_norm_variance_overflow():
    x = np.array([[3e20, 4e20]], np.float32)
    exp = oracles.ref_layer_norm(x, 2)
    right = (np.array([[-1.0, 1.0]], np.float32), np.array([[3.5e20]], np.float32),
             np.array([[2e-20]], np.float32))
    wrong = (np.zeros((1, 2), np.float32),) + right[1:2] + (np.zeros((1, 1), np.float32),)
    assert not oracles.verify(exp, right)
    assert oracles.verify(exp, wrong)


def test_oracle_tolerates_float32_rounding():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 33)).astype(np.float32)
    x64 = x.astype(np.float64)
    m = x64.mean(1, keepdims=True)
    r = 1 / np.sqrt(((x64 - m) ** 2).mean(1, keepdims=True) + 1e-5)
    y = ((x.astype(np.float32) - m.astype(np.float32)) * r.astype(np.float32)).astype(np.float32)
    assert not oracles.verify(oracles.ref_layer_norm(x, 33), (y, m.astype(np.float32), r.astype(np.float32)))
