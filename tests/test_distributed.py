"""cynorm.distributed: synchronized batch norm over MPI.

The multi-process tests launch ``mpiexec -n 2`` and ``-n 3`` runs of
tests/mpi_sync_bn_worker.py, which compare each rank's results with
single-process cynorm.batch_norm on the whole batch.  The rest runs in this
process on MPI.COMM_SELF (mpi4py initializes MPI as a singleton).
"""
import ast
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import cynorm
from cynorm import _sync_records as records
from helpers import needs_openmp
from cynorm import distributed
from mpi_helpers import find_mpiexec, launch_env

HERE = pathlib.Path(__file__).resolve().parent

try:
    from mpi4py import MPI
except (ImportError, RuntimeError, OSError):    # pragma: no cover - without the mpi extra
    MPI = None

REQUIRE_MPI = os.environ.get("CYNORM_REQUIRE_MPI") == "1"   # CI: missing MPI is a failure
needs_mpi = pytest.mark.skipif(MPI is None and not REQUIRE_MPI, reason="mpi4py is not "
                               "installed (pip install mpi4py mpich)")
pytestmark = pytest.mark.mpi


def skip_or_fail(reason):
    if REQUIRE_MPI:
        pytest.fail(f"CYNORM_REQUIRE_MPI=1 but {reason}")
    pytest.skip(reason)


TOL = {"float64": 1e-12, "float32": 1e-5, "bfloat16": 1e-5, "float16": 1e-5}


def launcher_or_skip():
    """mpiexec, after checking that mpi4py imports (skip, or fail in CI, without)."""
    if MPI is None:
        skip_or_fail("mpi4py is not installed (pip install mpi4py mpich)")
    launcher = find_mpiexec()
    if launcher is None:
        skip_or_fail("no mpiexec next to this Python or on PATH (pip install mpi4py mpich)")
    return launcher


@pytest.fixture(scope="module", params=[2, 3], ids=["np2", "np3"])
def mpi_run(request, tmp_path_factory):
    launcher = launcher_or_skip()
    out = tmp_path_factory.mktemp("mpi") / "results.json"
    env = launch_env()  # the worker imports the cynorm these tests import
    cmd = [launcher, "-n", str(request.param), sys.executable,
           str(HERE / "mpi_sync_bn_worker.py"), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return request.param, json.loads(out.read_text())


CASES = ["even-float64", "even-float32", "uneven-float64", "uneven-float32",
         "zero-row-rank-float64", "zero-row-last-rank-float32", "channels-last-float64",
         "channels-last-float32", "2d-float64", "no-affine-no-running-float64", "bfloat16",
         "float16", "no-grad-x-float64", "reduced-param-grads-float32",
         "reduced-param-grads-no-grad-x-float64", "subcomm-group0", "subcomm-group1",
         "compact-uneven-float32", "compact-zero-row-rank-float64",
         "compact-channels-last-bfloat16", "compact-reduced-param-grads-float32",
         "compact-large-mean-float32"]


def tolerance(r):
    # the compact record rounds the variance to float32 also for float64 x
    return max(TOL[r["dtype"]], 1e-6) if r["compact"] else TOL[r["dtype"]]


@pytest.mark.parametrize("case", CASES)
def test_matches_single_process_batch_norm(mpi_run, case):
    size, results = mpi_run
    r = results[case]
    tol = tolerance(r)
    for name, err in r["errors"].items():
        if err is not None:
            assert err <= tol, f"{case} at -n {size}: {name} off by {err:.3g} (tolerance {tol})"
    facts = r["facts"]
    assert facts["count"] == facts["expected_count"]
    assert facts["dtypes_ok"] and facts["input_unchanged"]
    # running statistics, save_mean and save_invstd: the same bits on every rank
    assert facts["stats_same_on_all_ranks"] and facts["count_same_on_all_ranks"]


@pytest.mark.parametrize("case", CASES)
def test_one_fixed_size_collective_each_way(mpi_run, case):
    size, results = mpi_run
    r = results[case]
    C = {"compact-large-mean": 3, "compact-uneven": 5, "compact-zero-row": 4, "compact-channels-last": 5,
         "compact-reduced": 5, "even": 6, "uneven-float64": 3, "uneven-float32": 5, "zero-row": 4,
         "channels-last": 5, "2d": 7, "no-affine": 4, "bfloat16": 3, "float16": 3,
         "no-grad-x": 4, "reduced-param-grads-float32": 5, "reduced-param-grads-no": 4,
         "subcomm": 4}
    channels = next(v for k, v in C.items() if case.startswith(k))
    s = 8 if r["dtype"] == "float64" else 4
    facts = r["facts"]
    # (count, dtype code, means, squared deviations) in 16 + 16 C bytes, or
    # 8 + 12 C for the compact record; then a rejection flag, sum dy and
    # sum dy * (x - mean) in the statistics' dtype
    forward = 8 + 12 * channels if r["compact"] else 16 + 16 * channels
    assert facts["forward_calls"] == [forward]
    want_backward = [] if case.startswith("no-grad-x") else [(1 + 2 * channels) * s]
    assert facts["backward_calls"] == want_backward


def test_large_mean_keeps_the_variance(mpi_run):
    """Data at 1e6 +- 2: a merge of raw sums of squares would lose ~1e-5 of
    the variance to cancellation; Chan's merge keeps it to ~1e-12."""
    size, results = mpi_run
    errors = results["large-mean-float64"]["errors"]
    assert errors["save_invstd"] <= 1e-10 and errors["running_var"] <= 1e-10
    assert errors["save_mean"] <= 1e-12
    # y and the gradients carry the mean's own rounding, ulp(1e6) / 2 = 6e-11
    for name in ("y", "grad_x", "grad_weight", "grad_bias"):
        assert errors[name] <= 1e-9, (name, errors[name])


def test_large_mean_float32_keeps_the_variance(mpi_run):
    """float32 data at 1e4 +- 2: the float64 record keeps the variance as
    single-process batch_norm does (a float32 exchange loses ~1e-5)."""
    _, results = mpi_run
    errors = results["large-mean-float32"]["errors"]
    assert errors["save_invstd"] <= 2e-7 and errors["running_var"] <= 2e-7
    assert errors["save_mean"] <= 1e-7
    # y: at most a flip of save_mean's float32 rounding, ulp(1e4) / 2 * invstd
    assert errors["y"] <= 5e-4


def test_compact_record_large_mean_keeps_the_variance(mpi_run):
    """float32 data at 1e4 +- 2, the ranks' means several std apart, through
    the compact record: float64 means, so only float32 rounding of the
    variance is lost (float32 means would cost it ~1e-3)."""
    _, results = mpi_run
    errors = results["compact-large-mean-float32"]["errors"]
    assert errors["save_invstd"] <= 2e-7 and errors["running_var"] <= 2e-7
    assert errors["save_mean"] == 0.0                   # the means travel in float64
    assert errors["y"] <= 1e-6


@pytest.mark.parametrize("case", ["rejection", "rejection-compact"])
def test_a_rejecting_rank_makes_every_rank_raise(mpi_run, case):
    size, results = mpi_run
    r = results[case]
    for messages, own in ((r["forward"], "running_mean"), (r["backward"], "grad_out")):
        assert own in messages[-1]
        assert all("another rank of comm rejected its arguments" in m for m in messages[:-1])
    assert r["then_ok"]


def test_a_rank_failing_in_its_statistics_does_not_hang_the_others(mpi_run):
    size, results = mpi_run
    r = results["statistics-failure"]
    assert r["messages"][-1].startswith("ValueError: compact_stats=True exchanges variances")
    assert all("another rank of comm rejected its arguments" in m for m in r["messages"][:-1])
    assert r["then_ok"]


@pytest.mark.parametrize("case", ["dtype-mismatch", "dtype-mismatch-compact"])
def test_ranks_with_different_dtypes_all_raise(mpi_run, case):
    _, results = mpi_run
    assert all(m is not None and "different dtypes" in m
               for m in results[case]["messages"])


def test_empty_global_batch(mpi_run):
    _, results = mpi_run
    assert results["all-empty"]["ok"]
    assert results["all-empty"]["calls"] == 2


def test_one_value_per_channel_fails_on_every_rank(mpi_run):
    size, results = mpi_run
    messages = results["one-value-in-all"]["messages"]
    assert len(messages) == size
    assert all(m is not None and "more than 1 value per channel" in m for m in messages)


def test_eval_uses_running_stats_without_communicating(mpi_run):
    _, results = mpi_run
    r = results["eval"]
    assert r["error"] == 0.0 and r["count"] is None and r["calls"] == 0
    # reduce_param_grads needs the one backward Allreduce, even in inference
    assert r["reduced_error"] <= 1e-12 and r["reduced_calls"] == [(1 + 2 * 4) * 8]


SHARE_SCRIPT = """
import os, sys
import numpy as np
from mpi4py import MPI
import cynorm
from cynorm.distributed import sync_batch_norm
before = cynorm.get_num_threads()
x = np.ones((2, 3, 4), np.float32)
x[0] = 0.0
sync_batch_norm(x)                     # the first collective use of COMM_WORLD
after = cynorm.get_num_threads()
sync_batch_norm(x)                     # cached: no second split, no change
rows = MPI.COMM_WORLD.gather((before, after, cynorm.get_num_threads()))
if MPI.COMM_WORLD.Get_rank() == 0:
    print(rows)
"""


def _launch_share(n, omp_num_threads):
    """Each rank's (threads before, after the first training call, after the
    second), from SHARE_SCRIPT under mpiexec -n n."""
    launcher = launcher_or_skip()
    env = launch_env()
    env.pop("OMP_NUM_THREADS")
    if omp_num_threads is not None:
        env["OMP_NUM_THREADS"] = str(omp_num_threads)
    cmd = [launcher, "-n", str(n), sys.executable, "-c", SHARE_SCRIPT]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return ast.literal_eval(proc.stdout.strip().splitlines()[-1])


def test_ranks_on_one_node_share_its_cores():
    """Two ranks on this machine: each runs on cores // 2 threads (at least
    one) after its first training call, unless the launcher bound it to
    fewer cores already."""
    cores = os.cpu_count()
    bound = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) < cores
    rows = _launch_share(2, None)
    for before, after, later in rows:
        want = before if bound else min(before, max(1, cores // 2))
        assert (after, later) == (want, want), rows


@needs_openmp
def test_a_chosen_thread_count_is_kept():
    rows = _launch_share(2, 3)
    assert rows == [(3, 3, 3)] * 2, rows


# ---- in this process, on MPI.COMM_SELF -----------------------------------------

@needs_mpi
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_comm_self_is_batch_norm(rng, dtype):
    x = rng.normal(2.0, 3.0, (5, 4, 3)).astype(dtype)
    dy = rng.normal(size=x.shape).astype(dtype)
    w, b = rng.normal(size=4).astype(dtype), rng.normal(size=4).astype(dtype)
    rm, rv = np.zeros(4, dtype), np.ones(4, dtype)
    rm2, rv2 = rm.copy(), rv.copy()
    y, mean, inv, count = distributed.sync_batch_norm(x, w, b, rm, rv, comm=MPI.COMM_SELF)
    ry, rmean, rinv = cynorm.batch_norm(x, w, b, rm2, rv2)
    tol = TOL[np.dtype(dtype).name]
    assert count == 15
    for a, r in ((y, ry), (mean, rmean), (inv, rinv), (rm, rm2), (rv, rv2)):
        np.testing.assert_allclose(a, r, rtol=tol, atol=tol)
    got = distributed.sync_batch_norm_backward(dy, x, w, mean, inv, count, comm=MPI.COMM_SELF)
    want = cynorm.batch_norm_backward(dy, x, w, None, None, rmean, rinv, True)
    for a, r in zip(got, want):
        np.testing.assert_allclose(a, r, rtol=tol, atol=tol)


def float64_reference(x, dy, w, b, eps=1e-5):
    """Batch norm and its gradient over axis 1, written out in float64."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    n = x.size // x.shape[1]
    mean = x.mean(axis=axes)
    var = ((x - mean.reshape(shape)) ** 2).mean(axis=axes)
    inv = 1 / np.sqrt(var + eps)
    xhat = (x - mean.reshape(shape)) * inv.reshape(shape)
    y = xhat * w.reshape(shape) + b.reshape(shape)
    gb = dy.sum(axis=axes)
    gw = (dy * xhat).sum(axis=axes)
    gx = (w * inv).reshape(shape) / n * (n * dy - gb.reshape(shape) - xhat * gw.reshape(shape))
    return y, gx, gw, gb


@needs_mpi
def test_comm_self_against_float64_formulas(rng):
    x = rng.normal(-1.0, 0.5, (6, 3, 4))
    dy = rng.normal(size=x.shape)
    w, b = rng.normal(size=3), rng.normal(size=3)
    y, mean, inv, count = distributed.sync_batch_norm(x, w, b, comm=MPI.COMM_SELF)
    gx, gw, gb = distributed.sync_batch_norm_backward(dy, x, w, mean, inv, count,
                                                      comm=MPI.COMM_SELF)
    for a, r in zip((y, gx, gw, gb), float64_reference(x, dy, w, b)):
        np.testing.assert_allclose(a, r, rtol=1e-12, atol=1e-12)


@needs_mpi
def test_gradients_match_finite_differences(rng):
    """grad_x of sum(y * g) by central differences, through the communicator path."""
    x = rng.normal(size=(3, 2, 2))
    g = rng.normal(size=x.shape)
    w, b = rng.normal(size=2), rng.normal(size=2)

    def loss(xv):
        return float(np.sum(distributed.sync_batch_norm(xv, w, b, comm=MPI.COMM_SELF)[0] * g))

    _, mean, inv, count = distributed.sync_batch_norm(x, w, b, comm=MPI.COMM_SELF)
    gx, _, _ = distributed.sync_batch_norm_backward(g, x, w, mean, inv, count,
                                                    comm=MPI.COMM_SELF)
    h = 1e-6
    numeric = np.empty_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        numeric[i] = (loss(xp) - loss(xm)) / (2 * h)
    np.testing.assert_allclose(gx, numeric, rtol=1e-6, atol=1e-7)


def record(n, mean, m2, code=1.0):
    return np.concatenate([[n, code], mean, m2])


def test_merge_is_symmetric_and_exact(rng):
    """merge(a, b) and merge(b, a) give the same bits (so every rank ends with
    the same statistics), and equal the statistics of the joined samples."""
    xa = rng.normal(5.0, 2.0, (7, 3))
    xb = rng.normal(4.0, 1.0, (4, 3))
    a = record(7, xa.mean(0), ((xa - xa.mean(0)) ** 2).sum(0))
    b = record(4, xb.mean(0), ((xb - xb.mean(0)) ** 2).sum(0))
    ab, ba = b.copy(), a.copy()
    records.Float64Record.merge(a, ab)
    records.Float64Record.merge(b, ba)
    assert np.array_equal(ab, ba)
    joined = np.concatenate([xa, xb])
    assert ab[0] == 11 and ab[1] == 1.0
    np.testing.assert_allclose(ab[2:5], joined.mean(0), rtol=1e-14)
    np.testing.assert_allclose(ab[5:], ((joined - joined.mean(0)) ** 2).sum(0), rtol=1e-13)
    # an empty record is the identity, on either side
    empty = record(0, np.zeros(3), np.zeros(3))
    left, right = a.copy(), empty.copy()
    records.Float64Record.merge(empty, left)
    records.Float64Record.merge(a, right)
    assert np.array_equal(left, a) and np.array_equal(right, a)


def test_merge_carries_rejections_and_dtype_disagreement(rng):
    a = record(3, np.ones(2), np.ones(2))
    rejected = record(-1, np.zeros(2), np.zeros(2))
    for x, y in ((a, rejected), (rejected, a)):
        out = y.copy()
        records.Float64Record.merge(x, out)
        assert out[0] == -1
    other_dtype = record(5, np.ones(2), np.ones(2), code=2.0)
    out = other_dtype.copy()
    records.Float64Record.merge(a, out)
    assert out[1] == 0
    out2 = a.copy()
    records.Float64Record.merge(out, out2)      # the marker survives later merges
    assert out2[1] == 0


def test_merge_op_never_raises_into_mpi():
    """inf - inf in a non-finite channel under np.seterr(all='raise') must not
    escape the MPI callback (that aborts the job): it stays in its channel."""
    class Datatype:
        def Get_size(self):
            return 8 * 6

    a = record(2, [np.inf, 1.0], [0.0, 1.0])
    b = record(3, [np.inf, 2.0], [0.0, 2.0])
    with np.errstate(all="raise"):
        records._merge_op(records.Float64Record)(a.tobytes(), memoryview(b), Datatype())
    assert b[0] == 5 and np.isfinite(b[3]) and np.isfinite(b[5]) and not np.isfinite(b[4])


def compact(n, mean, var, code=1):
    local = (n, np.asarray(mean, np.float64), np.asarray(var, np.float64))
    return records.CompactRecord.pack(len(local[1]), local, code)


def test_compact_merge_is_symmetric_and_keeps_the_spread(rng):
    """The compact record: merge(a, b) == merge(b, a) bitwise, and the merged
    variance is the joined data's to float32 rounding, even at mean = 1e4 *
    std with the two groups' means 3 std apart."""
    xa = rng.normal(1e4, 1.0, (700, 3))
    xb = rng.normal(1e4 + 3.0, 1.0, (400, 3))
    a = compact(700, xa.mean(0), xa.var(0))
    b = compact(400, xb.mean(0), xb.var(0))
    ab, ba = b.copy(), a.copy()
    records.CompactRecord.merge(a, ab)
    records.CompactRecord.merge(b, ba)
    assert np.array_equal(ab, ba)
    n, code, mean, var = records.CompactRecord.unpack(ab, 3)
    joined = np.concatenate([xa, xb])
    assert n == 1100 and code == 1
    np.testing.assert_allclose(mean, joined.mean(0), rtol=1e-15)
    np.testing.assert_allclose(var, joined.var(0), rtol=2e-7)     # two float32 roundings
    assert records.CompactRecord.nbytes(3) == ab.nbytes == 8 + 12 * 3
    empty = compact(0, np.zeros(3), np.zeros(3))
    left, right = a.copy(), empty.copy()
    records.CompactRecord.merge(empty, left)
    records.CompactRecord.merge(a, right)
    assert np.array_equal(left, a) and np.array_equal(right, a)


def test_compact_record_carries_counts_rejections_and_dtype_disagreement():
    big = compact(3 * 10**9, np.ones(2), np.ones(2))      # beyond int32, exact
    out = compact(5, np.ones(2), np.ones(2))
    records.CompactRecord.merge(big, out)
    assert records.CompactRecord.unpack(out, 2)[:2] == (3 * 10**9 + 5, 1)
    rejected = records.CompactRecord.pack(2, None, 1)
    for x, y in ((out, rejected), (rejected, out)):
        got = y.copy()
        records.CompactRecord.merge(x, got)
        assert records.CompactRecord.unpack(got, 2)[0] < 0
    other = compact(4, np.ones(2), np.ones(2), code=2)
    got = other.copy()
    records.CompactRecord.merge(out, got)
    again = out.copy()
    records.CompactRecord.merge(got, again)                 # the marker survives
    assert records.CompactRecord.unpack(again, 2)[1] == records.MISMATCH


def test_compact_op_never_raises_into_mpi():
    class Datatype:
        def Get_size(self):
            return records.CompactRecord.nbytes(2)

    a = compact(2, [np.inf, 1.0], [0.0, 1.0])
    b = compact(3, [np.inf, 2.0], [0.0, 2.0])
    with np.errstate(all="raise"):
        records._merge_op(records.CompactRecord)(a.tobytes(), memoryview(b), Datatype())
    n, _, mean, var = records.CompactRecord.unpack(b, 2)
    assert n == 5 and np.isfinite(mean[1]) and np.isfinite(var[1]) and not np.isfinite(var[0])


@needs_mpi
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_comm_self_compact_is_batch_norm_to_float32_rounding(rng, dtype):
    x = rng.normal(3.0, 2.0, (6, 4, 5)).astype(dtype)
    w, b = rng.normal(size=4).astype(dtype), rng.normal(size=4).astype(dtype)
    rm, rv = np.zeros(4, dtype), np.ones(4, dtype)
    rm2, rv2 = rm.copy(), rv.copy()
    y, mean, inv, count = distributed.sync_batch_norm(x, w, b, rm, rv, comm=MPI.COMM_SELF,
                                                      compact_stats=True)
    ry, rmean, rinv = cynorm.batch_norm(x, w, b, rm2, rv2)
    assert count == 30 and mean.dtype == rmean.dtype
    np.testing.assert_array_equal(mean, rmean)                    # means travel in float64
    for a, r in ((y, ry), (inv, rinv), (rm, rm2), (rv, rv2)):
        np.testing.assert_allclose(a, r, rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="compact_stats"):
        distributed.sync_batch_norm(x, comm=MPI.COMM_SELF, compact_stats="yes")


def test_a_compact_record_read_as_float64_is_malformed():
    """Ranks that disagree on compact_stats: the float64 side cannot read the
    compact record, and says so instead of merging garbage."""
    for n in (0, 5, -1):
        rec = compact(n, np.ones(2), np.ones(2)) if n >= 0 else \
            records.CompactRecord.pack(2, None, 1)
        as64 = np.frombuffer(np.concatenate([rec, np.zeros(48 - rec.size, np.uint8)]).tobytes(),
                             np.float64).copy()
        for a, b in ((as64, record(3, np.ones(2), np.ones(2))),
                     (record(3, np.ones(2), np.ones(2)), as64.copy())):
            out = b.copy()
            records.Float64Record.merge(a, out)
            assert out[0] == records.MALFORMED
    # and the malformed marker outranks a rejection, either way round
    bad, rej = record(records.MALFORMED, np.ones(2), np.ones(2)), record(-1, np.ones(2),
                                                                        np.ones(2))
    for a, b in ((bad, rej), (rej, bad)):
        out = b.copy()
        records.Float64Record.merge(a, out)
        assert out[0] == records.MALFORMED


def test_merge_op_marks_what_it_cannot_merge():
    class Datatype:
        def Get_size(self):
            return records.CompactRecord.nbytes(2)

    b = compact(3, [1.0, 2.0], [1.0, 2.0])
    records._merge_op(records.CompactRecord)(b.tobytes()[:5], memoryview(b), Datatype())
    assert records.CompactRecord.unpack(b, 2)[0] == records.REJECTED


@needs_mpi
def test_compact_range_errors_instead_of_flushed_statistics(rng):
    x = rng.normal(0.0, 1e20, (4, 3))      # float64 variance 1e40: beyond float32
    with pytest.raises(ValueError, match="beyond its range"):
        distributed.sync_batch_norm(x, comm=MPI.COMM_SELF, compact_stats=True)
    _, _, inv, _ = distributed.sync_batch_norm(x, comm=MPI.COMM_SELF)
    np.testing.assert_allclose(inv, cynorm.batch_norm(x)[2], rtol=1e-12)
    tiny = rng.normal(0.0, 1e-25, (4, 3))  # variance 1e-50: below float32's normal range
    with pytest.raises(ValueError, match="below its normal range"):
        distributed.sync_batch_norm(tiny, comm=MPI.COMM_SELF, compact_stats=True, eps=0.0)
    with np.errstate(all="raise"):          # with eps it does not matter, and does not raise
        _, _, inv, _ = distributed.sync_batch_norm(tiny, comm=MPI.COMM_SELF,
                                                   compact_stats=True)
    np.testing.assert_allclose(inv, 1 / np.sqrt(1e-5), rtol=1e-7)


@needs_mpi
def test_bad_comm():
    x = np.ones((2, 3))
    with pytest.raises(TypeError, match="comm must be an mpi4py intracommunicator"):
        distributed.sync_batch_norm(x, comm="world")
    with pytest.raises(ValueError, match="COMM_NULL"):
        distributed.sync_batch_norm(x, comm=MPI.COMM_NULL)
    with pytest.raises(TypeError, match="comm must be an mpi4py"):
        distributed.sync_batch_norm_backward(x, x, None, np.zeros(3), np.ones(3), 2,
                                             comm=object())
    # inference does not communicate, but a wrong comm is still an error
    with pytest.raises(TypeError, match="comm must be an mpi4py"):
        distributed.sync_batch_norm(x, None, None, np.zeros(3), np.ones(3), training=False,
                                    comm=1)


@needs_mpi
def test_bad_arguments():
    x = np.ones((2, 3))
    self = MPI.COMM_SELF
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        distributed.sync_batch_norm(np.ones(3), comm=self)
    with pytest.raises(TypeError, match="x must"):
        distributed.sync_batch_norm(np.ones((2, 3), np.int64), comm=self)
    with pytest.raises(ValueError, match="weight"):
        distributed.sync_batch_norm(x, np.ones(4), comm=self)
    with pytest.raises(ValueError, match="required when training=False"):
        distributed.sync_batch_norm(x, training=False, comm=self)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        distributed.sync_batch_norm(np.ones((1, 3)), comm=self)
    _, mean, inv, count = distributed.sync_batch_norm(x, comm=self)
    with pytest.raises(TypeError, match="count must be an int"):
        distributed.sync_batch_norm_backward(x, x, None, mean, inv, 2.0, comm=self)
    with pytest.raises(ValueError, match="count must be the global batch's"):
        distributed.sync_batch_norm_backward(x, x, None, mean, inv, 1, comm=self)
    with pytest.raises(ValueError, match="grad_out"):
        distributed.sync_batch_norm_backward(np.ones((2, 4)), x, None, mean, inv, count,
                                             comm=self)
    with pytest.raises(ValueError, match="save_mean must have shape"):
        distributed.sync_batch_norm_backward(x, x, None, mean[:2], inv, count, comm=self)
    with pytest.raises(ValueError, match="output_mask"):
        distributed.sync_batch_norm_backward(x, x, None, mean, inv, count, comm=self,
                                             output_mask=(True,))
    with pytest.raises(TypeError, match="reduce_param_grads"):
        distributed.sync_batch_norm_backward(x, x, None, mean, inv, count, comm=self,
                                             reduce_param_grads="yes")


@needs_mpi
def test_running_stats_must_be_writable():
    rm = np.zeros(3)
    rm.flags.writeable = False
    with pytest.raises(ValueError, match="running_mean"):
        distributed.sync_batch_norm(np.ones((2, 3)), None, None, rm, np.ones(3),
                                    comm=MPI.COMM_SELF)


def test_cynorm_imports_without_mpi4py_and_says_what_to_install():
    code = (
        "import sys; sys.modules['mpi4py'] = None\n"    # as if not installed
        "import numpy as np, cynorm, cynorm.distributed as d\n"
        "y = d.sync_batch_norm(np.ones((2, 3)), None, None, np.zeros(3), np.ones(3),"
        " training=False)[0]\n"                         # inference needs no MPI
        "try:\n"
        "    d.sync_batch_norm(np.ones((2, 3)))\n"
        "except ImportError as e:\n"
        "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=str(HERE.parent))
    assert out.returncode == 0, out.stderr
    assert "pip install mpi4py mpich" in out.stdout
