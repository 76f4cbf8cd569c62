"""Run under ``mpiexec -n W python mpi_sync_bn_worker.py OUT.json`` by
tests/test_distributed.py.

Every rank builds the same global batch from a fixed seed, takes its own
shard, runs cynorm.distributed on it, and compares with single-process
cynorm.batch_norm / batch_norm_backward on the whole (concatenated) batch.
Rank 0 writes, per case, the largest error over all ranks of each result,
scaled by max(1, max |reference|), and the facts the tests check (calls and
bytes per collective, running statistics equal on every rank).
"""
import json
import sys

import ml_dtypes
import numpy as np
from mpi4py import MPI

import cynorm
from cynorm.distributed import sync_batch_norm, sync_batch_norm_backward

WORLD = MPI.COMM_WORLD


class CountingComm(MPI.Intracomm):
    """The same communicator, recording every Allreduce the library makes."""

    def __new__(cls, comm):
        self = super().__new__(cls, comm)
        self.calls = []
        return self

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        spec = recvbuf if isinstance(recvbuf, (list, tuple)) else [recvbuf]
        nbytes = spec[0].nbytes if len(spec) == 1 else spec[1] * spec[2].Get_size()
        self.calls.append(int(nbytes))
        return super().Allreduce(sendbuf, recvbuf, op)

    def take(self):
        calls, self.calls = self.calls, []
        return calls


def scaled_error(a, ref):
    a = np.asarray(a, np.float64)
    ref = np.asarray(ref, np.float64)
    if a.shape != ref.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    same_nan = np.isnan(a) & np.isnan(ref)
    diff = np.where(same_nan, 0.0, np.abs(a - ref))
    return float(np.max(diff) / max(1.0, float(np.max(np.abs(np.where(same_nan, 0, ref))))))


def shard_bounds(rows, rank):
    start = sum(rows[:rank])
    return start, start + rows[rank]


def run_case(comm, rows, shape_tail, dtype, axis=1, offset=0.0, affine=True, running=True,
             mask=(True, True, True), seed=0, reduce=False, compact=False, drift=0.0):
    """One sync batch-norm step on comm (rows[r] rows on its rank r)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(seed)
    N = sum(rows)
    C = shape_tail[0] if axis == 1 else shape_tail[-1]
    x64 = rng.normal(offset, 2.0, (N,) + tuple(shape_tail))
    x64 += drift * np.arange(N).reshape((N,) + (1,) * len(shape_tail))   # shards differ
    dy64 = rng.normal(0.0, 1.0, x64.shape)
    coef = np.float32 if np.dtype(dtype).itemsize == 2 else dtype
    w = rng.normal(1.0, 0.5, C).astype(coef) if affine else None
    b = rng.normal(0.0, 0.5, C).astype(coef) if affine else None
    x, dy = x64.astype(dtype), dy64.astype(dtype)
    rm0 = rng.normal(0.0, 1.0, C).astype(coef)
    rv0 = rng.uniform(0.5, 2.0, C).astype(coef)

    ref_rm, ref_rv = (rm0.copy(), rv0.copy()) if running else (None, None)
    ref_y, ref_mean, ref_inv = cynorm.batch_norm(x, w, b, ref_rm, ref_rv, True, 0.1, 1e-5,
                                                 axis=axis)
    ref_gx, ref_gw, ref_gb = cynorm.batch_norm_backward(dy, x, w, None, None, ref_mean, ref_inv,
                                                        True, 1e-5, mask, axis=axis)

    lo, hi = shard_bounds(rows, rank)
    xs, dys = x[lo:hi], dy[lo:hi]
    x_before = xs.copy()
    rm, rv = (rm0.copy(), rv0.copy()) if running else (None, None)
    counting = CountingComm(comm)
    y, mean, inv, count = sync_batch_norm(xs, w, b, rm, rv, True, 0.1, 1e-5, axis=axis,
                                          comm=counting, compact_stats=compact)
    forward_calls = counting.take()
    gx, gw, gb = sync_batch_norm_backward(dys, xs, w, mean, inv, count, axis=axis,
                                          comm=counting, output_mask=mask,
                                          reduce_param_grads=reduce)
    backward_calls = counting.take()

    # the parameters' gradients are per-rank contributions: their sum is the whole batch's
    # (reduce_param_grads: already summed, and the same on every rank)
    def summed(g):
        if g is None or reduce:
            return g
        return comm.allreduce(g.astype(np.float64), op=MPI.SUM)

    errors = {
        "y": scaled_error(y, ref_y[lo:hi]),
        "save_mean": scaled_error(mean, ref_mean),
        "save_invstd": scaled_error(inv, ref_inv),
        "grad_x": scaled_error(gx, ref_gx[lo:hi]) if mask[0] else None,
        "grad_weight": scaled_error(summed(gw), ref_gw) if (mask[1] and affine) else None,
        "grad_bias": scaled_error(summed(gb), ref_gb) if (mask[2] and affine) else None,
    }
    if running:
        errors["running_mean"] = scaled_error(rm, ref_rm)
        errors["running_var"] = scaled_error(rv, ref_rv)
    facts = {
        "count": count,
        "expected_count": int(np.prod((N,) + tuple(shape_tail)) // C),
        "forward_calls": forward_calls,
        "backward_calls": backward_calls,
        "dtypes_ok": bool(y.dtype == x.dtype and y.shape == xs.shape
                          and (gx is None or (gx.dtype == x.dtype and gx.shape == xs.shape))),
        "input_unchanged": bool(np.array_equal(xs.view(np.uint8), x_before.view(np.uint8))),
    }
    shared = (mean, inv) + ((rm, rv) if running else ()) + ((gw, gb) if reduce else ())
    stats_bytes = b"".join(a.tobytes() for a in shared if a is not None)
    facts["stats_same_on_all_ranks"] = len(set(comm.allgather(stats_bytes))) == 1
    # worst over ranks
    merged = {}
    for k, v in errors.items():
        merged[k] = None if v is None else comm.allreduce(v, op=MPI.MAX)
    for k in ("dtypes_ok", "input_unchanged", "stats_same_on_all_ranks"):
        facts[k] = comm.allreduce(facts[k], op=MPI.LAND)
    facts["count_same_on_all_ranks"] = len(set(comm.allgather(count))) == 1
    return {"errors": merged, "facts": facts, "size": size,
            "dtype": np.dtype(dtype).name, "compact": compact}


def uneven(size, base):
    return [base[r % len(base)] for r in range(size)]


def main(out_path):
    size, rank = WORLD.Get_size(), WORLD.Get_rank()
    bf16 = ml_dtypes.bfloat16
    results = {}
    cases = {
        "even-float64": dict(rows=[4] * size, shape_tail=(6, 5, 3), dtype=np.float64),
        "even-float32": dict(rows=[4] * size, shape_tail=(6, 5, 3), dtype=np.float32),
        "uneven-float64": dict(rows=uneven(size, [5, 1, 3]), shape_tail=(3, 4, 2),
                               dtype=np.float64),
        "uneven-float32": dict(rows=uneven(size, [7, 2, 3]), shape_tail=(5, 3, 3),
                               dtype=np.float32),
        "zero-row-rank-float64": dict(rows=[0] + [3] * (size - 1), shape_tail=(4, 3),
                                      dtype=np.float64),
        "zero-row-last-rank-float32": dict(rows=[3] * (size - 1) + [0], shape_tail=(4, 3),
                                           dtype=np.float32),
        "channels-last-float64": dict(rows=uneven(size, [2, 3]), shape_tail=(3, 4, 5),
                                      dtype=np.float64, axis=-1),
        "channels-last-float32": dict(rows=uneven(size, [2, 3]), shape_tail=(3, 4, 5),
                                      dtype=np.float32, axis=-1),
        "2d-float64": dict(rows=uneven(size, [6, 1, 4]), shape_tail=(7,), dtype=np.float64),
        "no-affine-no-running-float64": dict(rows=[3] * size, shape_tail=(4, 5),
                                             dtype=np.float64, affine=False, running=False),
        "large-mean-float64": dict(rows=uneven(size, [4, 6]), shape_tail=(3, 8),
                                   dtype=np.float64, offset=1e6),
        "large-mean-float32": dict(rows=uneven(size, [4, 6, 5]), shape_tail=(3, 8),
                                   dtype=np.float32, offset=1e4),
        "bfloat16": dict(rows=uneven(size, [4, 2]), shape_tail=(3, 5), dtype=bf16),
        "float16": dict(rows=uneven(size, [4, 2]), shape_tail=(3, 5), dtype=np.float16),
        "no-grad-x-float64": dict(rows=[3] * size, shape_tail=(4, 5), dtype=np.float64,
                                  mask=(False, True, True)),
        "reduced-param-grads-float32": dict(rows=uneven(size, [4, 0, 2]), shape_tail=(5, 3),
                                            dtype=np.float32, reduce=True),
        "reduced-param-grads-no-grad-x-float64": dict(rows=uneven(size, [3, 2]),
                                                      shape_tail=(4, 5), dtype=np.float64,
                                                      mask=(False, True, True), reduce=True),
        # the compact record (compact_stats=True)
        "compact-uneven-float32": dict(rows=uneven(size, [7, 2, 3]), shape_tail=(5, 3, 3),
                                       dtype=np.float32, compact=True),
        "compact-zero-row-rank-float64": dict(rows=[0] + [3] * (size - 1), shape_tail=(4, 3),
                                              dtype=np.float64, compact=True),
        "compact-channels-last-bfloat16": dict(rows=uneven(size, [2, 3]), shape_tail=(3, 4, 5),
                                               dtype=bf16, axis=-1, compact=True),
        "compact-reduced-param-grads-float32": dict(rows=uneven(size, [4, 0, 2]),
                                                    shape_tail=(5, 3), dtype=np.float32,
                                                    reduce=True, compact=True),
        # at 1e4, the ranks' means several std apart: where float32 means would fail
        "compact-large-mean-float32": dict(rows=uneven(size, [4, 6, 5]), shape_tail=(3, 8),
                                           dtype=np.float32, offset=1e4, drift=1.0,
                                           compact=True),
    }
    for name, kw in cases.items():
        results[name] = run_case(WORLD, **kw)

    # a sub-communicator: even and odd ranks each synchronize among themselves
    color = rank % 2
    sub = WORLD.Split(color, rank)
    sub_result = run_case(sub, rows=uneven(sub.Get_size(), [3, 5]), shape_tail=(4, 3),
                          dtype=np.float64, seed=10 + color)
    groups = WORLD.allgather((color, sub_result))
    for c in sorted({g for g, _ in groups}):
        results[f"subcomm-group{c}"] = next(r for g, r in groups if g == c)
    sub.Free()

    results["all-empty"] = all_empty_case(WORLD)
    results["one-value-in-all"] = one_value_case(WORLD)
    results["eval"] = eval_case(WORLD)
    results["rejection"] = rejection_case(WORLD)
    results["dtype-mismatch"] = dtype_mismatch_case(WORLD)
    results["dtype-mismatch-compact"] = dtype_mismatch_case(WORLD, True)
    results["rejection-compact"] = rejection_case(WORLD, True)
    results["statistics-failure"] = statistics_failure_case(WORLD)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)


def all_empty_case(comm):
    """Every rank has zero rows: NaN statistics, count 0, running stats kept."""
    counting = CountingComm(comm)
    x = np.zeros((0, 3, 2))
    rm, rv = np.zeros(3), np.ones(3)
    y, mean, inv, count = sync_batch_norm(x, None, None, rm, rv, comm=counting)
    gx, gw, gb = sync_batch_norm_backward(x, x, np.ones(3), mean, inv, count, comm=counting)
    ok = (y.shape == (0, 3, 2) and count == 0 and np.all(np.isnan(mean))
          and np.all(np.isnan(inv)) and np.array_equal(rm, np.zeros(3))
          and np.array_equal(rv, np.ones(3)) and gx.shape == (0, 3, 2)
          and np.array_equal(gw, np.zeros(3)) and np.array_equal(gb, np.zeros(3)))
    return {"ok": comm.allreduce(bool(ok), op=MPI.LAND), "calls": len(counting.calls)}


def one_value_case(comm):
    """One value per channel in the whole batch: every rank raises the same error."""
    x = np.ones((1 if comm.Get_rank() == 0 else 0, 2))
    try:
        sync_batch_norm(x, comm=comm)
        message = None
    except ValueError as e:
        message = str(e)
    return {"messages": comm.allgather(message)}


def outcome(fn, errors=(ValueError,)):
    try:
        fn()
        return None
    except errors as e:
        return f"{type(e).__name__}: {e}"


def rejection_case(comm, compact=False):
    """One rank rejects its arguments: every rank raises (none hangs), and
    the next collective calls still work."""
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    x = np.random.default_rng(rank).normal(size=(3, 4))
    rm, rv = np.zeros(4), np.ones(4)
    if rank == last:
        rm.flags.writeable = False
    forward = comm.allgather(outcome(lambda: sync_batch_norm(x, None, None, rm, rv, comm=comm,
                                                             compact_stats=compact)))
    _, mean, inv, count = sync_batch_norm(x, comm=comm, compact_stats=compact)
    dy = np.ones((3, 5)) if rank == last else np.ones_like(x)       # wrong shape on one rank
    backward = comm.allgather(outcome(
        lambda: sync_batch_norm_backward(dy, x, None, mean, inv, count, comm=comm)))
    after = sync_batch_norm_backward(np.ones_like(x), x, None, mean, inv, count, comm=comm)
    return {"forward": forward, "backward": backward,
            "then_ok": comm.allreduce(after[0].shape == x.shape, op=MPI.LAND)}


def statistics_failure_case(comm):
    """The last rank's own statistics fail after its kernels ran (a channel
    variance of 1e-40 that compact_stats=True cannot carry with eps=1e-31):
    it raises before the collective, yet it still joins it, so the others
    raise too instead of hanging."""
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    x = np.random.default_rng(rank).normal(size=(3, 4)).astype(np.float32)
    if rank == last:
        x *= np.float32(1e-20)

    def step():
        sync_batch_norm(x, eps=1e-31, comm=comm, compact_stats=True)

    messages = comm.allgather(outcome(step))
    after = sync_batch_norm(np.ones((2, 4)) * rank, comm=comm)
    return {"messages": messages, "then_ok": comm.allreduce(after[3] == 2 * comm.Get_size(),
                                                            op=MPI.LAND)}


def dtype_mismatch_case(comm, compact=False):
    """An empty shard made as float64 in a float32 job: every rank raises."""
    rank = comm.Get_rank()
    x = np.zeros((0, 3)) if rank == 0 else np.ones((2, 3), np.float32)
    return {"messages": comm.allgather(outcome(
        lambda: sync_batch_norm(x, comm=comm, compact_stats=compact)))}


def eval_case(comm):
    """Inference: running statistics, no collective, gradients local."""
    rank = comm.Get_rank()
    shared = np.random.default_rng(100)          # parameters and running stats: replicated
    w, b = shared.normal(size=4), shared.normal(size=4)
    rm, rv = shared.normal(size=4), shared.uniform(0.5, 2, 4)
    rng = np.random.default_rng(101 + rank)      # data: each rank its own
    x = rng.normal(size=(2 + rank, 4, 3))
    dy = rng.normal(size=x.shape)
    counting = CountingComm(comm)
    y, mean, inv, count = sync_batch_norm(x, w, b, rm, rv, training=False, comm=counting)
    gx, gw, gb = sync_batch_norm_backward(dy, x, w, mean, inv, count, comm=counting)
    calls = comm.allreduce(len(counting.take()), op=MPI.SUM)
    ry, _, _ = cynorm.batch_norm(x, w, b, rm, rv, training=False)
    rgx, rgw, rgb = cynorm.batch_norm_backward(dy, x, w, rm, rv, None, None, False)
    err = max(scaled_error(a, r) for a, r in ((y, ry), (gx, rgx), (gw, rgw), (gb, rgb)))
    # with reduce_param_grads: one Allreduce, the ranks' summed parameter gradients
    _, sgw, sgb = sync_batch_norm_backward(dy, x, w, mean, inv, count, comm=counting,
                                           reduce_param_grads=True)
    reduced_calls = counting.take()
    err_sum = max(scaled_error(sgw, comm.allreduce(rgw, op=MPI.SUM)),
                  scaled_error(sgb, comm.allreduce(rgb, op=MPI.SUM)))
    return {"error": comm.allreduce(err, op=MPI.MAX), "count": count, "calls": calls,
            "reduced_error": comm.allreduce(err_sum, op=MPI.MAX),
            "reduced_calls": reduced_calls}


if __name__ == "__main__":
    main(sys.argv[1])
