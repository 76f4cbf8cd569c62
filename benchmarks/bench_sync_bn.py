"""Synchronized batch norm: cynorm.distributed (MPI) vs PyTorch's SyncBatchNorm (gloo).

    python benchmarks/bench_sync_bn.py                 # 2 processes, 1 thread each
    python benchmarks/bench_sync_bn.py --quick         # smoke run: 5 repeats
    python benchmarks/bench_sync_bn.py --procs 3 --threads 1

It launches ``mpiexec -n P`` of itself.  Every process joins both MPI
(mpi4py) and a torch.distributed gloo group, and each step runs on this
rank's shard of the global batch (the batch-norm benchmark's shapes, split
along N), with both libraries timed in the same processes, interleaved:

* cynorm: sync_batch_norm + sync_batch_norm_backward, with the default
  float64 statistics record and with compact_stats=True (variances in
  float32: 8 + 12*C bytes instead of 16 + 16*C);
* torch:  torch.nn.modules._functions.SyncBatchNorm (what nn.SyncBatchNorm
  runs) forward + autograd backward, on gloo.  PyTorch has no CPU kernels for
  the five split-statistics ops it calls (batch_norm_stats, ..._elemt, ...:
  CUDA only, and nn.SyncBatchNorm refuses CPU tensors), so this script gives
  it CPU stand-ins built from torch's own CPU kernels (see torch_cpu_split_ops):
  batch_norm_update_stats for the statistics, native_batch_norm in inference
  form for elemt, native_batch_norm_backward for backward_reduce, and
  native_batch_norm + addcmul_ for backward_elemt (two passes).  Its Python
  code, collectives and autograd run unchanged.

A step's time is the slowest rank's, from a barrier to the end of the
backward; the table gives medians.  The last column times torch's fused
CPU batch norm (native_batch_norm + its backward) on the shard with no
synchronization at all: a floor for any torch CPU sync step.  Two settings:

* "BN step": forward + backward, parameter gradients left per rank (PyTorch's
  SyncBatchNorm semantics; the data-parallel gradient all-reduce is counted
  in the next setting);
* "BN step + param-grad sync": also the all-reduce of (grad_weight, grad_bias)
  that data-parallel training does every step; cynorm gets them summed from
  its backward Allreduce (reduce_param_grads=True), torch all-reduces them.

Bytes: the payload of every collective per rank per step, counted from the
buffers each library hands to its collectives (cynorm's are recorded as it
calls them), and the bytes each rank sends with a bandwidth-optimal
algorithm: all-gather of s bytes per rank: (P-1)*s; all-reduce of s bytes:
2*(P-1)/P*s (cynorm's forward record is one indivisible MPI element, merged
by recursive doubling: ceil(log2 P)*s).
"""
import argparse
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EPS = 1e-5
MOMENTUM = 0.1
# the global batches of benchmarks/bench_norms.py's batch-norm cases
CASES = [((32, 64, 56, 56), "NCHW"), ((32, 64, 56, 56), "NHWC"), ((128, 256, 14, 14), "NCHW"),
         ((4096, 1024), "NC")]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_cpu_split_ops(torch):
    """Install CPU versions of the split-statistics ops SyncBatchNorm calls
    (torch ships them for CUDA only), each from torch's fastest CPU kernel."""
    def bcast(v, ref):
        return v.view((1, -1) + (1,) * (ref.dim() - 2))

    def stats(x, eps):
        # batch_norm_update_stats has a CPU kernel: mean and biased var, one pass
        mean, var = torch.batch_norm_update_stats(x, None, None, 0.0)
        return mean, torch.rsqrt(var + eps)

    def gather_stats_with_counts(x, mean_all, invstd_all, rm, rv, momentum, eps, counts):
        c = counts.to(torch.float64).view(-1, 1)
        m, v = mean_all.double(), 1.0 / invstd_all.double() ** 2 - eps
        n = c.sum()
        mean = (c * m).sum(0) / n
        var = (c * (v + (m - mean) ** 2)).sum(0) / n
        if rm is not None:
            rm.mul_(1 - momentum).add_(momentum * mean.to(rm.dtype))
            rv.mul_(1 - momentum).add_(momentum * (var * n / (n - 1)).to(rv.dtype))
        return mean.to(mean_all.dtype), torch.rsqrt(var + eps).to(mean_all.dtype)

    def elemt(x, weight, bias, mean, invstd, eps):
        var = 1.0 / (invstd.double() ** 2) - eps
        return torch.native_batch_norm(x, weight, bias, mean, var.to(mean.dtype), False, 0.0,
                                       eps)[0]

    def backward_reduce(dy, x, mean, invstd, weight, input_g, weight_g, bias_g):
        _, gw, gb = torch.ops.aten.native_batch_norm_backward(
            dy, x, None, None, None, mean, invstd, True, 0.0, [False, True, True])
        return (gb, gw / invstd, gw if weight_g else None, gb if bias_g else None)

    def backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
        # grad_x = a * dy - a * q * (x - mean) - a * p with a = invstd * weight,
        # p = sum_dy / n, q = invstd^2 * sum_dy_xmu / n: the last two terms are
        # one per-channel affine map of x (native_batch_norm in inference
        # form, unit variance), then one addcmul_ adds a * dy: two passes
        n = count.sum().item()
        a = invstd if weight is None else invstd * weight
        q = invstd * invstd * sum_dy_xmu / n
        unit = torch.full_like(mean, 1.0 - 1e-5)
        g = torch.native_batch_norm(x, -a * q, -a * sum_dy / n, mean, unit, False, 0.0,
                                    1e-5)[0]
        return g.addcmul_(dy, bcast(a, dy))

    torch.batch_norm_stats = stats
    torch.batch_norm_gather_stats_with_counts = gather_stats_with_counts
    torch.batch_norm_elemt = elemt
    torch.batch_norm_backward_reduce = backward_reduce
    torch.batch_norm_backward_elemt = backward_elemt


def shard_rows(N, size, rank):
    base, extra = divmod(N, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def worker(args):
    from mpi4py import MPI
    import torch
    import torch.distributed as dist
    from torch.nn.modules._functions import SyncBatchNorm as TorchSyncBN

    import cynorm
    from cynorm.distributed import sync_batch_norm, sync_batch_norm_backward

    torch_cpu_split_ops(torch)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    port = world.bcast(free_port() if rank == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size)
    group = dist.group.WORLD
    torch.set_num_threads(args.threads)
    cynorm.set_num_threads(args.threads)

    class CountingComm(MPI.Intracomm):
        def __new__(cls, comm):
            self = super().__new__(cls, comm)
            self.sent = []
            return self

        def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
            spec = recvbuf if isinstance(recvbuf, (list, tuple)) else [recvbuf]
            nbytes = spec[0].nbytes if len(spec) == 1 else spec[1] * spec[2].Get_size()
            self.sent.append(("allreduce-record" if len(spec) > 1 else "allreduce", nbytes))
            return super().Allreduce(sendbuf, recvbuf, op)

    comm = CountingComm(world)
    results = []
    rng = np.random.default_rng(0)
    for shape, layout in CASES:
        if args.quick and shape != (128, 256, 14, 14):
            continue
        N, C = shape[0], shape[1]
        lo, hi = shard_rows(N, size, rank)
        local = (hi - lo,) + shape[1:]
        x = rng.standard_normal(local, dtype=np.float32) * 2 + 0.5
        dy = rng.standard_normal(local, dtype=np.float32)
        w = rng.standard_normal(C, dtype=np.float32)
        b = rng.standard_normal(C, dtype=np.float32)
        axis = 1
        if layout == "NHWC":
            x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
            dy = np.ascontiguousarray(np.moveaxis(dy, 1, -1))
            axis = -1
        rm, rv = np.zeros(C, np.float32), np.ones(C, np.float32)

        def as_torch(a):
            t = torch.from_numpy(a)
            return t.permute(0, 3, 1, 2) if layout == "NHWC" else t   # channels_last view

        tx, tdy = as_torch(x).requires_grad_(True), as_torch(dy)
        tw = torch.from_numpy(w.copy()).requires_grad_(True)
        tb = torch.from_numpy(b.copy()).requires_grad_(True)
        trm, trv = torch.zeros(C), torch.ones(C)

        def cynorm_step(reduce_params, compact=False):
            y, mean, inv, count = sync_batch_norm(x, w, b, rm, rv, True, MOMENTUM, EPS, axis,
                                                  comm=comm, compact_stats=compact)
            return (y,) + sync_batch_norm_backward(dy, x, w, mean, inv, count, axis, comm=comm,
                                                   reduce_param_grads=reduce_params)

        def torch_step(sync_params):
            tx.grad = tw.grad = tb.grad = None
            y = TorchSyncBN.apply(tx, tw, tb, trm, trv, EPS, MOMENTUM, group, size)
            y.backward(tdy)
            if sync_params:      # what data-parallel training does with BN's parameters
                flat = torch.cat([tw.grad, tb.grad])
                dist.all_reduce(flat, group=group)
                return y, tx.grad, flat[:C], flat[C:]
            return y, tx.grad, tw.grad, tb.grad

        def torch_local_step():
            # no synchronization at all: torch's fused CPU batch norm on this
            # rank's shard alone, the floor for any torch CPU sync step
            y, mean, inv = torch.native_batch_norm(tx.detach(), tw.detach(), tb.detach(), trm,
                                                   trv, True, MOMENTUM, EPS)
            return (y,) + torch.ops.aten.native_batch_norm_backward(
                tdy, tx.detach(), tw.detach(), trm, trv, mean, inv, True, EPS,
                [True, True, True])

        # agreement of the two (global statistics, this rank's grad_x, parameter grads)
        cy = cynorm_step(True)
        ty = torch_step(True)
        err = 0.0
        for a, t in zip(cy, ty):
            t = t.detach()
            if layout == "NHWC" and t.ndim == 4:
                t = t.permute(0, 2, 3, 1)
            t = t.numpy()
            err = max(err, float(np.max(np.abs(a - t)) / max(1e-30, np.max(np.abs(t)))))
        err = world.allreduce(err, op=MPI.MAX)

        # payload per rank per step: cynorm's as recorded, torch's from its code
        calls = {}
        for key, compact in (("cynorm", False), ("cynorm_compact", True)):
            comm.sent.clear()
            cynorm_step(False, compact)
            calls[key] = list(comm.sent)
        comm.sent.clear()
        s = 4
        torch_calls = [("allgather", (2 * C + 1) * s), ("allreduce", 2 * C * s)]

        reps = 5 if args.quick else args.reps
        row = {"shape": list(shape), "layout": layout, "C": C, "rel_err": err}
        for setting, flag in (("step", False), ("step+params", True)):
            fns = {"cynorm": lambda: cynorm_step(flag),
                   "cynorm_compact": lambda: cynorm_step(flag, True),
                   "torch": lambda: torch_step(flag)}
            if not flag:
                fns["torch_local"] = torch_local_step
            times = {k: [] for k in fns}
            for f in fns.values():            # warm up
                f()
                f()
            for r in range(reps):
                order = list(fns) if r % 2 == 0 else list(fns)[::-1]
                for k in order:
                    world.Barrier()
                    t0 = time.perf_counter()
                    out = fns[k]()
                    dt = time.perf_counter() - t0
                    del out
                    times[k].append(world.allreduce(dt, op=MPI.MAX))
            row[setting] = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            row[setting + "_quartiles"] = {
                k: [float(np.percentile(v, 25)) * 1e3, float(np.percentile(v, 75)) * 1e3]
                for k, v in times.items()}
        param_sync = ("allreduce", 2 * C * s)
        # cynorm's parameter gradients come summed from the backward's Allreduce
        row["bytes"] = {"step": dict(calls, torch=torch_calls),
                        "step+params": dict(calls, torch=torch_calls + [param_sync])}
        results.append(row)
    dist.destroy_process_group()
    if rank == 0:
        with open(args.json, "w") as f:
            json.dump({"procs": size, "threads": args.threads, "results": results,
                       "mpi": MPI.Get_library_version().splitlines()[0].strip(),
                       "torch": torch.__version__}, f)


def sent_bytes(calls, P):
    """Bytes one rank sends with bandwidth-optimal algorithms (see the docstring)."""
    total = 0.0
    for kind, s in calls:
        if kind == "allgather":
            total += (P - 1) * s
        elif kind == "allreduce-record":
            total += math.ceil(math.log2(P)) * s
        else:
            total += 2 * (P - 1) / P * s
    return total


def table(data):
    P = data["procs"]
    libs = ("cynorm", "cynorm_compact", "torch")
    lines = [f"{P} processes x {data['threads']} thread(s); {data['mpi']}; torch "
             f"{data['torch']} gloo.  Medians of the slowest rank's step time (ms); "
             "\"compact\": compact_stats=True.", "",
             "| global batch | layout | setting | cynorm ms | compact ms | torch ms | "
             "speed-up | payload B/rank cynorm | compact | torch | sent B/rank cynorm | "
             "compact | torch | max rel diff | torch unsynced BN ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["results"]:
        for setting, label in (("step", "BN step"), ("step+params", "BN step + param-grad sync")):
            t, calls = r[setting], r["bytes"][setting]
            speedup = "/".join(f"{t['torch'] / t[k]:.2f}" for k in libs[:2])
            lines.append(
                f"| {tuple(r['shape'])} | {r['layout']} | {label} | "
                + " | ".join(f"{t[k]:.2f}" for k in libs) + f" | **{speedup}x** | "
                + " | ".join(str(sum(s for _, s in calls[k])) for k in libs) + " | "
                + " | ".join(f"{sent_bytes(calls[k], P):.0f}" for k in libs)
                + f" | {r['rel_err']:.1e} | "
                + (f"{t['torch_local']:.2f} |" if "torch_local" in t else "|"))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads per process")
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="write the raw results here")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    launcher = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep
                            + os.environ.get("PATH", ""))
    if launcher is None:
        sys.exit("no mpiexec: pip install 'cynorm[mpi]'")
    out = args.json or os.path.join(tempfile.mkdtemp(), "sync_bn.json")
    cmd = [launcher, "-n", str(args.procs), sys.executable, os.path.abspath(__file__),
           "--worker", "--json", out, "--threads", str(args.threads), "--reps", str(args.reps)]
    if args.quick:
        cmd.append("--quick")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    subprocess.run(cmd, check=True, env=env)
    with open(out) as f:
        print(table(json.load(f)))


if __name__ == "__main__":
    main()
