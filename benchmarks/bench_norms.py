"""Layer norm, RMS norm, group norm, instance norm and batch norm: cynorm vs PyTorch (CPU), NumPy, ONNX Runtime and JAX, in one process, interleaved.

    python benchmarks/bench_norms.py                  # both allocation settings, 1 and 2 threads
    python benchmarks/bench_norms.py --quick          # smoke run: 5 repeats
    python benchmarks/bench_norms.py --ops layer_norm --dtypes float32 --threads 2
    python benchmarks/bench_norms.py --no-cynorm      # torch and NumPy only
    python benchmarks/bench_norms.py --cases cache    # the cache-resident shapes only

Each allocation setting and thread count runs in its own child process,
pinned to that many CPUs (XLA sizes JAX's thread pool from them):
  (a) default   - every library allocates as it normally does;
  (b) faultfree - MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736, so
                  freed memory is reused and fresh outputs cost no page faults.
Ops: layer norm forward/backward over the last axis (weight and bias), RMS
norm forward/backward over the last axis (weight; torch: _fused_rms_norm, and
autograd's gradients of F.rms_norm, as it has no CPU backward op), group
norm (32 groups; torch.native_group_norm and its backward) and instance norm
(torch.instance_norm, autograd's gradients) stored channels first or last
(ONNX Runtime: GroupNormalization / InstanceNormalization on N,C,...), batch
norm forward in training and in eval mode and backward (training), on NCHW,
channels-last (NHWC storage; cynorm gets the N,H,W,C array with axis=-1,
torch a channels_last tensor) and (N, C) inputs.  bfloat16 inputs get float32
weight, bias and running statistics (--ln-param-dtype input: bfloat16 ones
for layer norm).

Per case and thread count it prints the median ms of cynorm (fresh outputs,
and out= when cynorm accepts it), torch, NumPy (float32 only) and, for the
float32 forward cases it runs (layer norm, RMS norm, batch norm in inference
on N,C,... layouts), ONNX Runtime (peers.py: a one-node model, CPU execution
provider, intra_op_num_threads = the thread count), for every forward case
JAX (jit-compiled formulas; `pip install '.[bench]'` installs both), the
ratios torch/cynorm, ORT/cynorm and JAX/cynorm, the minimal bytes moved (each input read once, each output
written once), the GB/s and % of STREAM triad that implies, and whether the
case is DRAM-bound (> 16 MiB moved).  DRAM-bound cases start every timed
call with cold caches (_common.CacheEvictor; --warm skips it).  cynorm
functions that do not exist yet (or that raise on a case) are skipped; the
script then times torch and NumPy alone.  In the first setting every library's outputs are checked once
against a float64 NumPy computation on the same inputs.
"""
import argparse
import gc
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
from _common import (  # noqa: E402
    HERE, SETTINGS, CacheEvictor, cpu_snapshot, median_ms, other_cpu_share, run_child, setting_heading,
    stream_bounds, stream_triad_gbs, time_interleaved, tune_threads,
)

EPS = 1e-5
MOMENTUM = 0.1
DRAM_BYTES = 16 << 20          # more than this moved: counted as DRAM-bound
BUSY_WARN = 0.05               # warn when other processes take more of the CPUs than this
DTYPES = ["float32", "bfloat16"]
OPS = ["layer_norm_fwd", "layer_norm_bwd", "rms_norm_fwd", "rms_norm_bwd", "add_layer_norm_fwd",
       "add_layer_norm_bwd", "add_rms_norm_fwd", "add_rms_norm_bwd", "group_norm_fwd",
       "group_norm_bwd", "instance_norm_fwd", "instance_norm_bwd", "batch_norm_fwd_train",
       "batch_norm_fwd_eval", "batch_norm_bwd"]
OP_LABEL = {"layer_norm_fwd": "LN fwd", "layer_norm_bwd": "LN bwd", "rms_norm_fwd": "RMS fwd",
            "rms_norm_bwd": "RMS bwd", "add_layer_norm_fwd": "add+LN fwd",
            "add_layer_norm_bwd": "add+LN bwd", "add_rms_norm_fwd": "add+RMS fwd",
            "add_rms_norm_bwd": "add+RMS bwd", "group_norm_fwd": "GN fwd",
            "group_norm_bwd": "GN bwd", "instance_norm_fwd": "IN fwd", "instance_norm_bwd": "IN bwd",
            "batch_norm_fwd_train": "BN fwd train",
            "batch_norm_fwd_eval": "BN fwd eval", "batch_norm_bwd": "BN bwd"}
OP_ALIASES = {"fwd": "_fwd", "bwd": "_bwd", "forward": "_fwd", "backward": "_bwd", "train": "_train",
              "eval": "_eval"}          # --ops tokens; "ln" / "rms" / "bn" / "add" prefixes: layer_norm /
                                        # rms_norm / batch_norm / the fused add_ forms
# (family, logical shape, layout).  Layer norm normalizes over the last axis;
# batch norm's channel axis is 1 of the logical shape.
CASES = [
    ("layer_norm", (8192, 1024), "last axis"),
    ("layer_norm", (32768, 256), "last axis"),
    ("layer_norm", (64, 16384), "last axis"),
    ("rms_norm", (2048, 4096), "last axis"),      # LLaMA-7B: tokens x hidden
    ("add_rms_norm", (2048, 4096), "last axis"),
    ("add_layer_norm", (8192, 1024), "last axis"),
    ("group_norm", (8, 320, 64, 64), "NCHW"),     # a Stable Diffusion UNet block, 32 groups
    ("group_norm", (8, 320, 64, 64), "NHWC"),
    ("instance_norm", (2, 64, 32, 32, 32), "NCDHW"),   # an InstanceNorm3d volume
    ("instance_norm", (2, 64, 32, 32, 32), "NDHWC"),
    ("batch_norm", (32, 64, 56, 56), "NCHW"),
    ("batch_norm", (32, 64, 56, 56), "NHWC"),
    ("batch_norm", (128, 256, 14, 14), "NCHW"),
    ("batch_norm", (4096, 1024), "NC"),
]
# the shapes most layers have: data that stays in the L2/L3 (a few hundred KiB
# to 2 MiB), where the per-call cost and the thread team's wake-up show
CACHE_CASES = [
    ("layer_norm", (64, 768), "last axis"),
    ("layer_norm", (512, 768), "last axis"),
    ("rms_norm", (64, 4096), "last axis"),
    ("add_rms_norm", (64, 4096), "last axis"),
    ("add_layer_norm", (512, 768), "last axis"),
    ("group_norm", (2, 320, 16, 16), "NCHW"),
    ("group_norm", (2, 320, 16, 16), "NHWC"),
    ("group_norm", (2, 1280, 8, 8), "NCHW"),      # the UNet's lowest resolution: short rows
    ("group_norm", (2, 1280, 8, 8), "NHWC"),
    ("instance_norm", (8, 64, 16, 16), "NCHW"),
    ("instance_norm", (8, 64, 16, 16), "NHWC"),
    ("batch_norm", (8, 64, 14, 14), "NCHW"),
    ("batch_norm", (8, 64, 14, 14), "NHWC"),
    ("batch_norm", (32, 256, 7, 7), "NCHW"),
    ("batch_norm", (64, 512), "NC"),
]
CASE_SETS = {"all": CASES + CACHE_CASES, "dram": CASES, "cache": CACHE_CASES}
CYNORM_FUNCS = ["layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward",
                "add_layer_norm", "add_layer_norm_backward", "add_rms_norm", "add_rms_norm_backward",
                "group_norm", "group_norm_backward", "instance_norm", "instance_norm_backward",
                "batch_norm", "batch_norm_backward"]
# max |out - ref| / max |ref| (ref: float64 on the same inputs) above which a check is reported
CHECK_TOL = {"float32": 1e-3, "bfloat16": 2e-2}


# --------------------------------------------------------------------------- #
# plain NumPy implementations: timed in float32, the accuracy reference in float64
def numpy_layer_norm(x, w, b, eps=EPS):
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    rstd = 1.0 / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + eps)
    return xc * rstd * w + b, mean, rstd


def numpy_layer_norm_backward(dy, x, mean, rstd, w):
    xhat = (x - mean) * rstd
    g = dy * w
    dx = rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx, np.sum(dy * xhat, axis=0), np.sum(dy, axis=0)


def numpy_rms_norm(x, w, eps=EPS):
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * rstd * w, rstd


def numpy_rms_norm_backward(dy, x, rstd, w):
    xhat = x * rstd
    g = dy * w
    return rstd * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True)), np.sum(dy * xhat, axis=0)


def numpy_batch_norm_train(x, w, b, rm, rv, axes, bshape, momentum=MOMENTUM, eps=EPS):
    n = x.size // w.size
    mean = x.mean(axis=axes)
    xc = x - mean.reshape(bshape)
    var = np.mean(xc * xc, axis=axes)
    invstd = 1.0 / np.sqrt(var + eps)
    y = xc * (invstd * w).reshape(bshape) + b.reshape(bshape)
    rm *= 1 - momentum
    rm += momentum * mean
    rv *= 1 - momentum
    rv += (momentum * n / (n - 1)) * var
    return y, mean, invstd


def numpy_batch_norm_eval(x, w, b, rm, rv, bshape, eps=EPS):
    scale = w / np.sqrt(rv + eps)
    return x * scale.reshape(bshape) + (b - rm * scale).reshape(bshape)


def numpy_batch_norm_backward(dy, x, w, mean, invstd, axes, bshape):
    n = x.size // w.size
    xhat = (x - mean.reshape(bshape)) * invstd.reshape(bshape)
    db = np.sum(dy, axis=axes)
    dw = np.sum(dy * xhat, axis=axes)
    dx = (w * invstd).reshape(bshape) * (dy - (db / n).reshape(bshape) - xhat * (dw / n).reshape(bshape))
    return dx, dw, db


# --------------------------------------------------------------------------- #
# cases: per op the callables to time, bytes moved and the accuracy checks
def rel_err(got, ref):
    """max |got - ref| / max |ref| in float64; got: array or torch tensor, ref: float64 array."""
    import torch
    if isinstance(got, torch.Tensor):
        got = got.detach().double()
        if got.ndim == 4 and tuple(got.shape) != ref.shape and tuple(got.permute(0, 2, 3, 1).shape) == ref.shape:
            got = got.permute(0, 2, 3, 1)          # channels_last N,C,H,W vs the N,H,W,C reference
        got = got.contiguous().numpy()
    got = np.asarray(got).astype(np.float64).ravel()
    ref = np.asarray(ref, dtype=np.float64).ravel()
    if got.size != ref.size:
        return float("inf")
    if got.size == 0:
        return 0.0
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))


def to_torch(a, channels_last=False):
    """A torch copy of array `a` (bfloat16 bits kept; N,H,W,C -> channels_last N,C,H,W)."""
    import ml_dtypes
    import torch
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        t = torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a.copy())
    return t.permute(0, 3, 1, 2) if channels_last else t


def f64(*arrays):
    return tuple(np.asarray(a).astype(np.float64) for a in arrays)


class Op:
    """One op of one case: callables by library, bytes moved, checks, notes."""

    def __init__(self, nbytes, size_bytes, ref=None, names=()):
        self.fns = {}
        self.bytes = nbytes
        self.size_bytes = size_bytes   # of the main input: sets the repeat count
        self.ref = ref                 # float64 reference outputs (None: no checks)
        self.names = names
        self.check = {}
        self.notes = {}
        self.peers = {}                # name -> make(threads): the callable at that thread count

    def add_peer(self, name, built):
        """Register a peer from its builder's (make, why); check its first result."""
        make, why = built
        if make is None:
            self.notes[name] = why
            return
        self.peers[name] = make
        res = make(None)()
        self.check_against_ref(name, tuple(res) if isinstance(res, (tuple, list)) else (res,))

    def try_cynorm(self, name, fn):
        """Register cynorm callable `fn` if a first call works; return its result."""
        try:
            res = fn()
        except Exception as e:  # noqa: BLE001 - any failure: skip this library here
            self.notes[name] = f"{type(e).__name__}: {e}"
            return None
        self.fns[name] = fn
        return res

    def check_against_ref(self, lib, got):
        """Record max |got - ref| / max |ref| per output of library `lib`."""
        if self.ref is not None and got is not None:
            self.check[lib] = {k: rel_err(g, r) for k, g, r in zip(self.names, got, self.ref)}


def cynorm_out_call(op, call, fresh):
    """Register cynorm's out= variant: out=(all outputs), else out=first output."""
    outs = tuple(np.empty_like(o) if isinstance(o, np.ndarray) else None for o in fresh)
    errors = []
    for out in (outs, outs[0]):
        try:
            res = call(out)
            first = res[0] if isinstance(res, tuple) else res
            if not np.shares_memory(first, outs[0]):
                raise ValueError("result is not the out= array")
        except Exception as e:  # noqa: BLE001
            errors.append(f"{type(e).__name__}: {e}")
            continue
        op.fns["cynorm_out"] = lambda: call(out)
        return
    op.notes["cynorm_out"] = " / ".join(errors)


def layer_norm_case(cn, shape, dtype, ops, rng, use_out, ln_param_dtype, checks):
    import ml_dtypes
    import torch
    aten = torch.ops.aten
    npdt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    pdt = np.dtype(np.float32) if ln_param_dtype == "float32" else npdt
    M, D = shape
    x32 = rng.standard_normal(shape, dtype=np.float32) * 2 + 0.5
    dy32 = rng.standard_normal(shape, dtype=np.float32)
    w32 = rng.random(D, dtype=np.float32) + 0.5
    b32 = rng.standard_normal(D, dtype=np.float32)
    x, dy, w, b = x32.astype(npdt), dy32.astype(npdt), w32.astype(pdt), b32.astype(pdt)
    tx, tdy, tw, tb = map(to_torch, (x, dy, w, b))
    tfwd = torch.native_layer_norm(tx, [D], tw, tb, EPS)
    _, tmean, trstd = tfwd
    xs, ps = npdt.itemsize, pdt.itemsize
    ss = trstd.element_size()            # mean / rstd: torch's dtype (float32 unless all bfloat16)
    nx = M * D * xs
    ref_fwd = ref_bwd = None
    if checks:                           # float64 on the same (rounded) inputs
        x64, dy64, w64, b64 = f64(x, dy, w, b)
        ref_fwd = numpy_layer_norm(x64, w64, b64)
        ref_bwd = numpy_layer_norm_backward(dy64, x64, ref_fwd[1], ref_fwd[2], w64)
        del x64, dy64
    if dtype == "float32":
        nx32, ndy32, nw32, nb32 = x32.copy(), dy32.copy(), w32.copy(), b32.copy()
        _, nmean, nrstd = numpy_layer_norm(nx32, nw32, nb32)
    has = (lambda f: cn is not None and hasattr(cn, f))
    fn = {}

    if "layer_norm_fwd" in ops:
        # reads x, weight, bias; writes y, mean, rstd
        op = fn["layer_norm_fwd"] = Op(2 * nx + 2 * D * ps + 2 * M * ss, nx, ref_fwd, ("y", "mean", "rstd"))
        op.fns["torch"] = lambda: torch.native_layer_norm(tx, [D], tw, tb, EPS)
        op.check_against_ref("torch", tfwd)
        op.add_peer("onnxruntime", peers.ort_layer_norm(x, w, b, EPS))
        op.add_peer("jax", peers.jax_layer_norm(x, w, b, EPS))
        if has("layer_norm"):
            res = op.try_cynorm("cynorm", lambda: cn.layer_norm(x, (D,), w, b, EPS))
            op.check_against_ref("cynorm", res)
            if res is not None and use_out:
                cynorm_out_call(op, lambda out: cn.layer_norm(x, (D,), w, b, EPS, out=out), res)
        elif cn is not None:
            op.notes["cynorm"] = "cynorm.layer_norm missing"
        if dtype == "float32":
            op.fns["numpy"] = lambda: numpy_layer_norm(nx32, nw32, nb32)
            op.check_against_ref("numpy", op.fns["numpy"]())

    if "layer_norm_bwd" in ops:
        # reads dy, x, mean, rstd, weight; writes grad_x, grad_weight, grad_bias
        op = fn["layer_norm_bwd"] = Op(3 * nx + 2 * M * ss + 3 * D * ps, nx, ref_bwd,
                                       ("grad_x", "grad_weight", "grad_bias"))
        mask = [True, True, True]
        op.fns["torch"] = lambda: aten.native_layer_norm_backward(tdy, tx, [D], tmean, trstd, tw, tb, mask)
        op.check_against_ref("torch", op.fns["torch"]())
        if has("layer_norm") and has("layer_norm_backward"):
            try:
                _, cmean, crstd = cn.layer_norm(x, (D,), w, b, EPS)
            except Exception as e:  # noqa: BLE001
                op.notes["cynorm"] = f"forward failed: {type(e).__name__}: {e}"
            else:
                res = op.try_cynorm("cynorm", lambda: cn.layer_norm_backward(dy, x, (D,), cmean, crstd, w, b))
                op.check_against_ref("cynorm", res)
        elif cn is not None:
            op.notes["cynorm"] = "cynorm.layer_norm / layer_norm_backward missing"
        if dtype == "float32":
            op.fns["numpy"] = lambda: numpy_layer_norm_backward(ndy32, nx32, nmean, nrstd, nw32)
            op.check_against_ref("numpy", op.fns["numpy"]())
    return fn


def rms_norm_case(cn, shape, dtype, ops, rng, use_out, checks):
    """RMS norm over the last axis, float32 weight (for bfloat16 x too); torch's
    backward is autograd's over F.rms_norm (PyTorch has no CPU backward op)."""
    import ml_dtypes
    import torch
    npdt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    M, D = shape
    x32 = rng.standard_normal(shape, dtype=np.float32) * 2 + 0.5
    dy32 = rng.standard_normal(shape, dtype=np.float32)
    w32 = rng.random(D, dtype=np.float32) + 0.5
    x, dy, w = x32.astype(npdt), dy32.astype(npdt), w32
    tx, tdy, tw = map(to_torch, (x, dy, w))
    nx = M * D * npdt.itemsize
    ref_fwd = ref_bwd = None
    if checks:
        x64, dy64, w64 = f64(x, dy, w)
        ref_fwd = numpy_rms_norm(x64, w64)
        ref_bwd = numpy_rms_norm_backward(dy64, x64, ref_fwd[1], w64)
        del x64, dy64
    if dtype == "float32":
        nx32, ndy32, nw32 = x32.copy(), dy32.copy(), w32.copy()
        _, nrstd = numpy_rms_norm(nx32, nw32)
    has = (lambda f: cn is not None and hasattr(cn, f))
    fn = {}
    import warnings
    warnings.filterwarnings("ignore", "Mismatch dtype")     # torch: bfloat16 x, float32 weight

    if "rms_norm_fwd" in ops:
        # reads x, weight; writes y, rstd
        op = fn["rms_norm_fwd"] = Op(2 * nx + 4 * D + 4 * M, nx, ref_fwd, ("y", "rstd"))
        op.fns["torch"] = lambda: torch._fused_rms_norm(tx, [D], tw, EPS)
        op.check_against_ref("torch", op.fns["torch"]())
        op.add_peer("onnxruntime", peers.ort_rms_norm(x, w, EPS))
        op.add_peer("jax", peers.jax_rms_norm(x, w, EPS))
        if has("rms_norm"):
            res = op.try_cynorm("cynorm", lambda: cn.rms_norm(x, (D,), w, EPS))
            op.check_against_ref("cynorm", res)
            if res is not None and use_out:
                cynorm_out_call(op, lambda out: cn.rms_norm(x, (D,), w, EPS, out=out), res)
        elif cn is not None:
            op.notes["cynorm"] = "cynorm.rms_norm missing"
        if dtype == "float32":
            op.fns["numpy"] = lambda: numpy_rms_norm(nx32, nw32)
            op.check_against_ref("numpy", op.fns["numpy"]())

    if "rms_norm_bwd" in ops:
        # reads dy, x, rstd, weight; writes grad_x, grad_weight
        op = fn["rms_norm_bwd"] = Op(3 * nx + 4 * M + 8 * D, nx, ref_bwd, ("grad_x", "grad_weight"))
        gx_, gw_ = tx.clone().requires_grad_(), tw.clone().requires_grad_()
        ty = torch.nn.functional.rms_norm(gx_, [D], gw_, EPS)
        op.fns["torch"] = lambda: torch.autograd.grad(ty, (gx_, gw_), tdy, retain_graph=True)
        op.check_against_ref("torch", op.fns["torch"]())
        if has("rms_norm") and has("rms_norm_backward"):
            crstd = cn.rms_norm(x, (D,), w, EPS)[1]
            res = op.try_cynorm("cynorm", lambda: cn.rms_norm_backward(dy, x, (D,), crstd, w))
            op.check_against_ref("cynorm", res)
        elif cn is not None:
            op.notes["cynorm"] = "cynorm.rms_norm / rms_norm_backward missing"
        if dtype == "float32":
            op.fns["numpy"] = lambda: numpy_rms_norm_backward(ndy32, nx32, nrstd, nw32)
            op.check_against_ref("numpy", op.fns["numpy"]())
    return fn


def add_norm_case(cn, family, shape, dtype, ops, rng, use_out, checks):
    """h = x + residual and its layer norm (add_layer_norm) or RMS norm
    (add_rms_norm) over the last axis, float32 parameters; torch runs the
    composition, forward and autograd's backward from the gradients of y
    and h.  Checked outputs: y and h; grad_input and grad_weight."""
    import ml_dtypes
    import torch
    npdt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    centered = family == "add_layer_norm"
    M, D = shape
    x32, r32, dy32, dh32 = (rng.standard_normal(shape, dtype=np.float32) for _ in range(4))
    w = rng.random(D, dtype=np.float32) + 0.5
    b = rng.standard_normal(D, dtype=np.float32) if centered else None
    x, res, dy, dh = (a.astype(npdt) for a in (x32, r32, dy32, dh32))
    tx, tres, tdy, tdh, tw = map(to_torch, (x, res, dy, dh, w))
    tb = to_torch(b) if centered else None
    nx = M * D * npdt.itemsize
    params = (w, b) if centered else (w,)
    F = torch.nn.functional

    def tnorm(h, w_):
        return F.layer_norm(h, [D], w_, tb, EPS) if centered else F.rms_norm(h, [D], w_, EPS)

    def ref_norm(h, w_):                 # float64 y (and the stats the backward needs)
        if centered:
            y, mean, rstd = numpy_layer_norm(h, w_, b.astype(np.float64))
            return y, (mean, rstd)
        y, rstd = numpy_rms_norm(h, w_)
        return y, (rstd,)
    ref_fwd = ref_bwd = None
    h_st = (x.astype(np.float32) + res.astype(np.float32)).astype(npdt)     # h as stored
    if checks:
        h64, dy64, dh64 = f64(h_st, dy, dh)
        y64, st = ref_norm(h64, w.astype(np.float64))
        ref_fwd = (y64, h64)
        if centered:
            gx, gw, _ = numpy_layer_norm_backward(dy64, h64, *st, w.astype(np.float64))
        else:
            gx, gw = numpy_rms_norm_backward(dy64, h64, *st, w.astype(np.float64))
        ref_bwd = (gx + dh64, gw)
    has = (lambda f: cn is not None and hasattr(cn, f))
    fn = {}
    import warnings
    warnings.filterwarnings("ignore", "Mismatch dtype")     # torch: bfloat16 x, float32 weight

    if family + "_fwd" in ops:
        # reads x, residual, the parameters; writes y, h and the statistics
        op = fn[family + "_fwd"] = Op(4 * nx + 4 * D * len(params), nx, ref_fwd, ("y", "h"))
        op.fns["torch"] = lambda: (lambda h: (tnorm(h, tw), h))(tx + tres)
        op.check_against_ref("torch", op.fns["torch"]())
        op.add_peer("onnxruntime", peers.ort_add_norm(x, res, w, b, EPS))
        op.add_peer("jax", peers.jax_add_norm(x, res, w, b, EPS))
        if has(family):
            f = getattr(cn, family)
            res0 = op.try_cynorm("cynorm", lambda: f(x, res, (D,), *params, eps=EPS))
            op.check_against_ref("cynorm", res0)
            if res0 is not None and use_out:
                cynorm_out_call(op, lambda out: f(x, res, (D,), *params, eps=EPS, out=out), res0)
        elif cn is not None:
            op.notes["cynorm"] = f"cynorm.{family} missing"

    if family + "_bwd" in ops:
        # reads dy, dh, h, the statistics, weight; writes grad_input, grad_weight
        op = fn[family + "_bwd"] = Op(4 * nx + 8 * D, nx, ref_bwd, ("grad_input", "grad_weight"))
        gx_, gr_, gw_ = (a.clone().requires_grad_() for a in (tx, tres, tw))
        th = gx_ + gr_
        ty = tnorm(th, gw_)
        op.fns["torch"] = lambda: torch.autograd.grad((ty, th), (gx_, gw_), (tdy, tdh),
                                                      retain_graph=True)
        op.check_against_ref("torch", op.fns["torch"]())
        if has(family) and has(family + "_backward"):
            _, ch, *stats = getattr(cn, family)(x, res, (D,), *params, eps=EPS)
            fb = getattr(cn, family + "_backward")
            bargs = (dy, dh, ch, (D,), *stats, *params)
            res0 = op.try_cynorm("cynorm", lambda: fb(*bargs))
            op.check_against_ref("cynorm", res0)
        elif cn is not None:
            op.notes["cynorm"] = f"cynorm.{family} / {family}_backward missing"
    return fn


def group_norm_case(cn, family, shape, layout, dtype, ops, rng, use_out, checks):
    """Group norm with 32 groups (family group_norm) or instance norm (a group
    per channel) of N,C,... data stored channels first or last (cynorm: the
    N,...,C array with axis=-1; torch: a channels_last tensor), float32
    weight and bias.  torch: native_group_norm and its backward;
    instance_norm and autograd's gradients of it (no running statistics)."""
    import ml_dtypes
    import torch
    npdt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    N, C = shape[:2]
    HW = int(np.prod(shape[2:]))
    G = C if family == "instance_norm" else 32
    last = layout in ("NHWC", "NDHWC")
    arr_shape = (N,) + tuple(shape[2:]) + (C,) if last else shape
    axis = -1 if last else 1
    x32 = rng.standard_normal(arr_shape, dtype=np.float32) * 2 + 0.5
    dy32 = rng.standard_normal(arr_shape, dtype=np.float32)
    w32 = rng.random(C, dtype=np.float32) + 0.5
    b32 = rng.standard_normal(C, dtype=np.float32)
    x, dy = x32.astype(npdt), dy32.astype(npdt)

    def tview(a):
        t = to_torch(a)
        return t.permute(0, a.ndim - 1, *range(1, a.ndim - 1)) if last else t
    tx, tdy = tview(x), tview(dy)
    tw, tb = to_torch(w32), to_torch(b32)
    nx = x.nbytes
    has = (lambda f: cn is not None and hasattr(cn, f))
    ref_fwd = ref_bwd = None
    if checks:
        from cynorm import reference
        x64, dy64 = f64(x, dy)
        ref_fwd = reference.group_norm(x64, G, w32, b32, EPS, axis)
        ref_bwd = reference.group_norm_backward(dy64, x64, ref_fwd[1], ref_fwd[2], w32, G, axis)
        del x64, dy64
    fwd, bwd = f"{family}_fwd", f"{family}_bwd"
    fn = {}
    tm, tr = torch.native_group_norm(tx, tw, tb, N, C, HW, G, EPS)[1:]

    if fwd in ops:
        # reads x, weight, bias; writes y, mean, rstd
        op = fn[fwd] = Op(2 * nx + 8 * C + 8 * N * G, nx, ref_fwd, ("y", "mean", "rstd"))
        if family == "instance_norm":
            op.fns["torch"] = lambda: torch.instance_norm(tx, tw, tb, None, None, True, MOMENTUM,
                                                          EPS, False)
            op.check_against_ref("torch", (torch_layout(op.fns["torch"](), last),))
        else:
            op.fns["torch"] = lambda: torch.native_group_norm(tx, tw, tb, N, C, HW, G, EPS)
            res = op.fns["torch"]()
            op.check_against_ref("torch", (torch_layout(res[0], last),) + tuple(res[1:]))
        if not last:
            op.add_peer("onnxruntime", peers.ort_group_norm(x, w32, b32, G, EPS))
        else:
            op.notes["onnxruntime"] = "ONNX's norms take the channels on axis 1"
        op.add_peer("jax", peers.jax_group_norm(x, w32, b32, G, EPS, last))
        name = family
        if has(name):
            call = (lambda: cn.instance_norm(x, w32, b32, axis=axis)) if family == "instance_norm" \
                else (lambda: cn.group_norm(x, G, w32, b32, EPS, axis))
            res = op.try_cynorm("cynorm", call)
            op.check_against_ref("cynorm", res)
            if res is not None and use_out:
                cynorm_out_call(op, (lambda out: cn.instance_norm(x, w32, b32, axis=axis, out=out))
                                if family == "instance_norm" else
                                (lambda out: cn.group_norm(x, G, w32, b32, EPS, axis, out=out)),
                                res)
        elif cn is not None:
            op.notes["cynorm"] = f"cynorm.{name} missing"

    if bwd in ops:
        # reads dy, x, mean, rstd, weight; writes grad_x, grad_weight, grad_bias
        op = fn[bwd] = Op(3 * nx + 8 * N * G + 12 * C, nx, ref_bwd,
                          ("grad_x", "grad_weight", "grad_bias"))
        if family == "instance_norm":
            gx_, gw_, gb_ = (t.detach().clone().requires_grad_() for t in (tx, tw, tb))
            ty = torch.instance_norm(gx_, gw_, gb_, None, None, True, MOMENTUM, EPS, False)
            op.fns["torch"] = lambda: torch.autograd.grad(ty, (gx_, gw_, gb_), tdy,
                                                          retain_graph=True)
        else:
            op.fns["torch"] = lambda: torch.ops.aten.native_group_norm_backward(
                tdy, tx, tm, tr, tw, N, C, HW, G, [True, True, True])
        res = op.fns["torch"]()
        op.check_against_ref("torch", (torch_layout(res[0], last),) + tuple(res[1:]))
        back = family + "_backward"
        if has(family) and has(back):
            if family == "instance_norm":
                _, cm, cr = cn.instance_norm(x, w32, b32, axis=axis)
                call = (lambda: cn.instance_norm_backward(dy, x, cm, cr, w32, axis=axis))
            else:
                _, cm, cr = cn.group_norm(x, G, w32, b32, EPS, axis)
                call = (lambda: cn.group_norm_backward(dy, x, cm, cr, w32, G, axis=axis))
            res = op.try_cynorm("cynorm", call)
            op.check_against_ref("cynorm", res)
        elif cn is not None:
            op.notes["cynorm"] = f"cynorm.{family} / {back} missing"
    return fn


def torch_layout(t, last):
    """A torch result in the layout of cynorm's array (N,...,C when last)."""
    return t.permute(0, *range(2, t.ndim), 1) if last and t.ndim > 2 else t


def batch_norm_case(cn, shape, layout, dtype, ops, rng, use_out, checks):
    import ml_dtypes
    import torch
    aten = torch.ops.aten
    npdt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    C = shape[1]
    channels_last = layout == "NHWC"
    if channels_last:                  # stored N, H, W, C
        arr_shape = (shape[0],) + tuple(shape[2:]) + (C,)
        axis = -1
    else:
        arr_shape, axis = shape, 1
    caxis = axis % len(arr_shape)
    axes = tuple(i for i in range(len(arr_shape)) if i != caxis)
    bshape = tuple(C if i == caxis else 1 for i in range(len(arr_shape)))
    x32 = rng.standard_normal(arr_shape, dtype=np.float32) * 2 + 0.5
    dy32 = rng.standard_normal(arr_shape, dtype=np.float32)
    w32 = rng.random(C, dtype=np.float32) + 0.5
    b32 = rng.standard_normal(C, dtype=np.float32)
    rm32 = rng.standard_normal(C, dtype=np.float32) * np.float32(0.1)
    rv32 = rng.random(C, dtype=np.float32) + 0.5
    x, dy = x32.astype(npdt), dy32.astype(npdt)
    w, b, rm, rv = w32.copy(), b32.copy(), rm32.copy(), rv32.copy()
    tx, tdy = to_torch(x, channels_last), to_torch(dy, channels_last)
    tw, tb, trm, trv = map(to_torch, (w32, b32, rm32, rv32))
    if channels_last:
        assert tx.is_contiguous(memory_format=torch.channels_last) and tuple(tx.shape) == tuple(shape)
    nx = x.nbytes
    cb = C * 4
    has = (lambda f: cn is not None and hasattr(cn, f))
    if dtype == "float32":
        nx32, ndy32, nw32, nb32 = x32.copy(), dy32.copy(), w32.copy(), b32.copy()
        nrm32, nrv32 = rm32.copy(), rv32.copy()

    def fresh_stats():
        return rm32.copy(), rv32.copy()

    def reset_stats():                 # every library's running stats back to the initial ones
        for a in (rm, trm.numpy()) + ((nrm32,) if dtype == "float32" else ()):
            a[:] = rm32
        for a in (rv, trv.numpy()) + ((nrv32,) if dtype == "float32" else ()):
            a[:] = rv32

    ref_train = ref_eval = ref_bwd = None
    if checks:                         # float64 on the same (rounded) inputs
        x64, dy64, w64, b64, rm64, rv64 = f64(x, dy, w32, b32, rm32, rv32)
        ref_eval = (numpy_batch_norm_eval(x64, w64, b64, rm64, rv64, bshape),)
        ref_train = numpy_batch_norm_train(x64, w64, b64, rm64, rv64, axes, bshape) + (rm64, rv64)
        ref_bwd = numpy_batch_norm_backward(dy64, x64, w64, ref_train[1], ref_train[2], axes, bshape)
        del x64, dy64
    # a training forward from fresh running stats for torch's backward
    tsm, tsi = torch.native_batch_norm(tx, tw, tb, *map(torch.from_numpy, fresh_stats()), True, MOMENTUM, EPS)[1:]
    fn = {}

    if "batch_norm_fwd_train" in ops:
        # reads x, weight, bias, running stats; writes y, save_mean, save_invstd, running stats
        op = fn["batch_norm_fwd_train"] = Op(2 * nx + 8 * cb, nx, ref_train,
                                             ("y", "save_mean", "save_invstd", "running_mean", "running_var"))
        op.fns["torch"] = lambda: torch.native_batch_norm(tx, tw, tb, trm, trv, True, MOMENTUM, EPS)
        reset_stats()
        op.check_against_ref("torch", tuple(op.fns["torch"]()) + (trm, trv))
        op.add_peer("jax", peers.jax_batch_norm(x, w32, b32, rm32, rv32, EPS, MOMENTUM, axis, True))
        if has("batch_norm"):
            def call_train(out=None):
                return cn.batch_norm(x, w, b, rm, rv, training=True, momentum=MOMENTUM, eps=EPS,
                                     axis=axis, **({} if out is None else {"out": out}))
            reset_stats()
            res = op.try_cynorm("cynorm", call_train)
            if res is not None:
                op.check_against_ref("cynorm", tuple(res) + (rm, rv))
                if use_out:
                    cynorm_out_call(op, call_train, res)
        elif cn is not None:
            op.notes["cynorm"] = "cynorm.batch_norm missing"
        if dtype == "float32":
            op.fns["numpy"] = lambda: numpy_batch_norm_train(nx32, nw32, nb32, nrm32, nrv32, axes, bshape)
            reset_stats()
            op.check_against_ref("numpy", tuple(op.fns["numpy"]()) + (nrm32, nrv32))

    if "batch_norm_fwd_eval" in ops:
        # reads x, weight, bias, running stats; writes y
        op = fn["batch_norm_fwd_eval"] = Op(2 * nx + 4 * cb, nx, ref_eval, ("y",))
        reset_stats()
        op.fns["torch"] = lambda: torch.native_batch_norm(tx, tw, tb, trm, trv, False, MOMENTUM, EPS)
        op.check_against_ref("torch", op.fns["torch"]())
        op.add_peer("onnxruntime", peers.ort_batch_norm_eval(x, w32.copy(), b32.copy(), rm32.copy(),
                                                             rv32.copy(), EPS, channels_last))
        op.add_peer("jax", peers.jax_batch_norm(x, w32, b32, rm32, rv32, EPS, MOMENTUM, axis, False))
        if has("batch_norm"):
            def call_eval(out=None):
                return cn.batch_norm(x, w, b, rm, rv, training=False, momentum=MOMENTUM, eps=EPS,
                                     axis=axis, **({} if out is None else {"out": out}))
            res = op.try_cynorm("cynorm", call_eval)
            if res is not None:
                op.check_against_ref("cynorm", res)
                if use_out:
                    cynorm_out_call(op, call_eval, res)
        elif cn is not None:
            op.notes["cynorm"] = "cynorm.batch_norm missing"
        if dtype == "float32":
            op.fns["numpy"] = lambda: numpy_batch_norm_eval(nx32, nw32, nb32, nrm32, nrv32, bshape)
            op.check_against_ref("numpy", (op.fns["numpy"](),))

    if "batch_norm_bwd" in ops:
        # reads dy, x, weight, save_mean, save_invstd; writes grad_x, grad_weight, grad_bias
        op = fn["batch_norm_bwd"] = Op(3 * nx + 5 * cb, nx, ref_bwd, ("grad_x", "grad_weight", "grad_bias"))
        mask = [True, True, True]
        op.fns["torch"] = lambda: aten.native_batch_norm_backward(tdy, tx, tw, trm, trv, tsm, tsi, True, EPS, mask)
        op.check_against_ref("torch", op.fns["torch"]())
        if has("batch_norm") and has("batch_norm_backward"):
            try:
                _, csm, csi = cn.batch_norm(x, w, b, *fresh_stats(), training=True, momentum=MOMENTUM, eps=EPS,
                                            axis=axis)
            except Exception as e:  # noqa: BLE001
                op.notes["cynorm"] = f"forward failed: {type(e).__name__}: {e}"
            else:
                res = op.try_cynorm("cynorm", lambda: cn.batch_norm_backward(
                    dy, x, w, rm, rv, csm, csi, True, eps=EPS, output_mask=(True, True, True), axis=axis))
                op.check_against_ref("cynorm", res)
        elif cn is not None:
            op.notes["cynorm"] = "cynorm.batch_norm / batch_norm_backward missing"
        if dtype == "float32":
            _, nsm, nsi = numpy_batch_norm_train(nx32, nw32, nb32, *fresh_stats(), axes, bshape)
            op.fns["numpy"] = lambda: numpy_batch_norm_backward(ndy32, nx32, nw32, nsm, nsi, axes, bshape)
            op.check_against_ref("numpy", op.fns["numpy"]())
    return fn


# --------------------------------------------------------------------------- #
# one allocation setting, run in a child process
def family_case(cn, family, shape, layout, dtype, ops, rng, use_out, ln_param_dtype, checks):
    """The ops of one op family on one case (CASES' rows): {op name: its timed calls}."""
    if family == "layer_norm":
        return layer_norm_case(cn, shape, dtype, ops, rng, use_out, ln_param_dtype, checks)
    if family == "rms_norm":
        return rms_norm_case(cn, shape, dtype, ops, rng, use_out, checks)
    if family.startswith("add_"):
        return add_norm_case(cn, family, shape, dtype, ops, rng, use_out, checks)
    if family in ("group_norm", "instance_norm"):
        return group_norm_case(cn, family, shape, layout, dtype, ops, rng, use_out, checks)
    return batch_norm_case(cn, shape, layout, dtype, ops, rng, use_out, checks)


def pin_to(threads):
    """Run this process on `threads` CPUs (of those it may use), so that a
    library that sizes its pool from them (XLA) gets that many; False where
    it cannot (no sched_setaffinity, or fewer CPUs)."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < threads:
        return False
    os.sched_setaffinity(0, cpus[:threads])
    return True


def run_setting(args):
    if len(args.threads) == 1:         # before anything imports JAX
        pin_to(args.threads[0])
    import torch
    cn = None
    if not args.no_cynorm:
        try:
            import cynorm as cn
        except Exception as e:  # noqa: BLE001 - e.g. half-built in place
            print(f"cynorm not importable, timing torch and NumPy only: {e}", file=sys.stderr)
    if cn is not None and args.tune and args.threads[0] > 1:
        tune_threads(cn, args.threads[0])
    results = []
    rng = np.random.default_rng(0)
    evictors = {} if args.warm else {t: CacheEvictor(t) for t in args.threads}
    order = 0
    for family, shape, layout in CASE_SETS[args.cases]:
        ops = [op for op in args.ops if op.startswith(family)]
        if not ops:
            continue
        for dtype in args.dtypes:
            case = family_case(cn, family, shape, layout, dtype, ops, rng, not args.no_out,
                               args.ln_param_dtype, not args.no_check)
            for threads in args.threads:
                torch.set_num_threads(threads)
                if cn is not None:
                    cn.set_num_threads(threads)
                for opname in ops:
                    op = case[opname]
                    fns = {k: op.fns[k] for k in ("cynorm", "cynorm_out", "torch", "numpy")
                           if k in op.fns and (not args.only or k in args.only)}
                    for k, make in op.peers.items():
                        if not args.only or k in args.only:
                            try:
                                fns[k] = make(threads)
                            except RuntimeError as e:      # JAX in an unpinned process
                                op.notes[k] = str(e)
                    small = op.size_bytes < (8 << 20)
                    reps = args.repeats * (8 if small else 1)
                    inner = 20 if op.size_bytes < (1 << 20) else 1
                    samples = time_interleaved(fns, reps, inner,
                                               before=cold_caches(evictors.get(threads), op))
                    ms = {k: median_ms(s) for k, s in samples.items()}
                    order += 1
                    results.append({
                        "order": order, "threads": threads, "op": opname, "family": family,
                        "shape": list(shape), "layout": layout, "dtype": dtype,
                        "bytes": op.bytes, "dram_bound": op.bytes > DRAM_BYTES, "repeats": reps,
                        "ms": ms, "check": op.check, "notes": op.notes,
                    })
                    print(f"  {threads} thr {OP_LABEL[opname]:12s} {dtype:8s} {str(tuple(shape)):18s} {layout:9s} "
                          + "  ".join(f"{k} {v:.3f}" for k, v in ms.items()) + " ms", file=sys.stderr, flush=True)
            del case
            gc.collect()
    results.sort(key=lambda r: (r["threads"], r["order"]))
    return results


def cold_caches(evictor, op):
    """time_interleaved's `before` for op: evictor (a CacheEvictor, or None
    for warm timing) run before every call of a DRAM-bound op, writing the
    op's share of written bytes (its one output is the size of its input)."""
    if evictor is None or op.bytes <= DRAM_BYTES:
        return None
    share = op.size_bytes / op.bytes
    return lambda: evictor(dirty=share)


# --------------------------------------------------------------------------- #
# parent: run the settings, print
def fmt(v, spec=".3f"):
    return "–" if v is None else format(v, spec)


def table(setting, results, stream):
    have_out = any("cynorm_out" in r["ms"] for r in results)
    have_ort = any("onnxruntime" in r["ms"] for r in results)
    have_jax = any("jax" in r["ms"] for r in results)
    lines = ["", setting_heading(setting), ""]
    head = ["thr", "op", "dtype", "shape", "layout", "MiB moved", "DRAM", "cynorm ms"]
    head += ["cynorm out= ms"] * have_out + ["torch ms", "numpy ms"] + ["ORT ms"] * have_ort
    head += ["JAX ms"] * have_jax
    head += ["torch/cynorm"] + ["torch/cynorm out="] * have_out + ["ORT/cynorm"] * have_ort
    head += ["JAX/cynorm"] * have_jax
    head += ["cynorm GB/s (% STREAM)", "torch GB/s (% STREAM)"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        ms = r["ms"]
        c, co, t, n = (ms.get(k) for k in ("cynorm", "cynorm_out", "torch", "numpy"))
        bw = stream[str(r["threads"])]

        def gbs(v):
            if v is None:
                return "–"
            g = r["bytes"] / (v / 1e3) / 1e9
            return f"{g:.1f} ({100 * g / bw:.0f} %)"
        row = [str(r["threads"]), OP_LABEL[r["op"]], r["dtype"], str(tuple(r["shape"])), r["layout"],
               f"{r['bytes'] / 2**20:.1f}", "yes" if r["dram_bound"] else "no", fmt(c)]
        o, j = ms.get("onnxruntime"), ms.get("jax")
        row += [fmt(co)] * have_out + [fmt(t), fmt(n)] + [fmt(o)] * have_ort + [fmt(j)] * have_jax
        row += [fmt(t / c if c and t else None, ".2f")]
        row += [fmt(t / co if co and t else None, ".2f")] * have_out
        row += [fmt(o / c if c and o else None, ".2f")] * have_ort
        row += [fmt(j / c if c and j else None, ".2f")] * have_jax + [gbs(c), gbs(t)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def anomalies(all_results, busy=None):
    """Markdown bullets: cynorm slower than torch, ONNX Runtime or JAX (worst first),
    NumPy faster than cynorm, outputs off the float64 reference, calls not
    timed, busy machine."""
    out, skipped, checked, slow, numpy_fast, peer_fast = [], {}, set(), [], [], []
    timed = 0
    for setting, results in all_results.items():
        for r in results:
            case = f"{OP_LABEL[r['op']]} {r['dtype']} {tuple(r['shape'])} {r['layout']}"
            where = f"{setting}, {r['threads']} thr, {case}"
            ms = r["ms"]
            c, co, t, n = (ms.get(k) for k in ("cynorm", "cynorm_out", "torch", "numpy"))
            if c is not None:
                timed += 1
                if c > t or (co is not None and co > t):
                    outr = f" (out= {t / co:.2f})" if co is not None else ""
                    slow.append((min(t / c, t / co if co else t / c),
                                 f"  - {where}: torch/cynorm {t / c:.2f}{outr}; cynorm {c:.3f} ms, torch {t:.3f} ms"))
                if n is not None and n < c:
                    numpy_fast.append(f"  - {where}: NumPy {n:.3f} ms, cynorm {c:.3f} ms")
                for lib, label in (("onnxruntime", "ORT"), ("jax", "JAX")):
                    o = ms.get(lib)
                    if o is not None and o < c:
                        peer_fast.append((o / c, f"  - {where}: {label}/cynorm {o / c:.2f}; cynorm "
                                                 f"{c:.3f} ms, {label} {o:.3f} ms"))
            for lib, errs in r["check"].items():
                bad = {k: e for k, e in errs.items() if not e <= CHECK_TOL[r["dtype"]]}
                if bad and (lib, case) not in checked:      # checked once per case
                    checked.add((lib, case))
                    out.append(f"- {case}: {lib} off the float64 reference (max |diff| / max |ref| > "
                               f"{CHECK_TOL[r['dtype']]:g}): " + ", ".join(f"{k} {e:.2g}" for k, e in bad.items()))
            for lib, note in r["notes"].items():
                cases = skipped.setdefault((lib, note), [])
                if case not in cases:          # once per case, not per setting / thread count
                    cases.append(case)
    for setting, share in (busy or {}).items():
        if share > BUSY_WARN:
            out.append(f"- {setting}: other processes took {100 * share:.0f} % of the CPUs during the run: "
                       "its timings (above all at the largest thread count) are unreliable")
    if slow:
        out.append(f"- cynorm slower than torch in {len(slow)} of {timed} timed cases (worst first):")
        out += [line for _, line in sorted(slow)]
    if peer_fast:
        out.append(f"- ONNX Runtime or JAX faster than cynorm in {len(peer_fast)} case(s) (worst first):")
        out += [line for _, line in sorted(peer_fast)]
    if numpy_fast:
        out.append(f"- NumPy faster than cynorm in {len(numpy_fast)} case(s):")
        out += numpy_fast
    for (lib, note), cases in skipped.items():
        shown = "; ".join(cases[:4]) + (f"; ... ({len(cases)} cases)" if len(cases) > 4 else "")
        out.append(f"- {lib.replace('_out', ' out=')} not timed on {shown}: {note}")
    return out


def parse_ops(spec):
    if spec in ("", "all"):
        return list(OPS)
    chosen = set()
    for tok in spec.split(","):
        tok = tok.strip().lower()
        for short, full in (("ln", "layer_norm"), ("rms", "rms_norm"), ("bn", "batch_norm"),
                            ("add", "add_"), ("gn", "group_norm"), ("in", "instance_norm")):
            if (tok == short or tok.startswith(short + "_")) and not tok.startswith(full):
                tok = full + tok[len(short):]
        tok = OP_ALIASES.get(tok, tok)
        # a family's name selects its ops (layer_norm: not add_layer_norm's); other tokens match
        # anywhere in the name
        hits = [op for op in OPS if op.startswith(tok)] or [op for op in OPS if tok in op]
        if not hits:
            raise SystemExit(f"--ops: {tok!r} matches none of {', '.join(OPS)}")
        chosen.update(hits)
    return [op for op in OPS if op in chosen]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="ops: " + ", ".join(OPS) + " (--ops takes substrings: "
                                       "layer_norm, rms_norm, add_layer_norm, add_rms_norm, "
                                       "group_norm, instance_norm, batch_norm, fwd, bwd, train, "
                                       "eval; ln, rms, add, gn, in, bn)")
    p.add_argument("--repeats", type=int, help="interleaved repeats per case (default 15, --quick 5; "
                   "x8 when the input is under 8 MiB)")
    p.add_argument("--quick", action="store_true", help="smoke run: 5 repeats")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated: float32,bfloat16")
    p.add_argument("--ops", default="all", help="comma-separated op names or substrings (default all)")
    p.add_argument("--settings", default=",".join(SETTINGS), help="allocation settings: default,faultfree")
    p.add_argument("--cases", choices=sorted(CASE_SETS), default="all",
                   help="dram: the large shapes; cache: the cache-resident ones (default all)")
    p.add_argument("--no-cynorm", action="store_true", help="time torch and NumPy only")
    p.add_argument("--no-out", action="store_true", help="skip cynorm's out= variant")
    p.add_argument("--only", default="", help=argparse.SUPPRESS)   # child: time only these (comma-separated)
    p.add_argument("--no-check", action="store_true", help="skip the float64 accuracy checks")
    p.add_argument("--warm", action="store_true", help="time DRAM-bound cases without evicting the "
                   "caches before each call")
    p.add_argument("--tune", action="store_true", help="cynorm.tune_threads() at each thread "
                   "count before timing (this machine's thread-team thresholds)")
    p.add_argument("--ln-param-dtype", choices=["float32", "input"], default="float32",
                   help="layer norm weight/bias dtype for bfloat16 inputs (default float32)")
    p.add_argument("--json", default=os.path.join(HERE, "results", "norms_latest.json"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.threads = [int(t) for t in args.threads.split(",")]
    args.dtypes = [d.strip() for d in args.dtypes.split(",")]
    for d in args.dtypes:
        if d not in DTYPES:
            raise SystemExit(f"--dtypes: {d!r} is not one of {', '.join(DTYPES)}")
    args.ops = parse_ops(args.ops)
    args.only = [k for k in args.only.split(",") if k]
    if args.repeats is None:
        args.repeats = 5 if args.quick else 15
    if args.child:
        json.dump(run_setting(args), sys.stdout)
        return

    import torch
    cyinfo = "cynorm: skipped (--no-cynorm)"
    if not args.no_cynorm:
        try:
            import cynorm
            missing = [f for f in CYNORM_FUNCS if not hasattr(cynorm, f)]
            cyinfo = (f"cynorm {cynorm.__version__} ({cynorm.config()['simd_compiled']})"
                      + (f" [missing: {', '.join(missing)}: not timed]" if missing else ""))
        except Exception as e:  # noqa: BLE001
            cyinfo = f"cynorm not importable ({e}): not timed"
    print(f"{cyinfo}, torch {torch.__version__}, numpy {np.__version__}; {os.cpu_count()} CPUs; "
          f"median of {args.repeats} interleaved repeats (x8 for inputs < 8 MiB); NumPy float32 only; "
          f"bfloat16 with float32 {'weight/bias/running stats' if args.ln_param_dtype == 'float32' else 'batch norm weight/bias/running stats, bfloat16 layer norm weight/bias'}")
    stream = {}
    for t in args.threads:
        gbs, how = stream_triad_gbs(t)
        stream[str(t)] = gbs
        print(f"STREAM triad ({how}), {t} thread(s): {gbs:.1f} GB/s")
        bounds = stream_bounds(t)
        if bounds:
            print(f"  stream_bounds.c, {t} thread(s): "
                  + ", ".join(f"{k} {v:.1f}" for k, v in bounds.items() if k != "triad_nt") + " GB/s")
    load = os.getloadavg()
    print(f"load average before the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("MiB moved: minimal traffic, inputs read once and outputs written once; DRAM: > 16 MiB moved"
          + ("" if args.warm else f"; DRAM cases start every timed call with cold caches (a pass "
             f"over {CacheEvictor.size_mib()} MiB first, a share of it written)"), flush=True)
    child_args = ["--repeats", str(args.repeats),
                  "--dtypes", ",".join(args.dtypes), "--ops", ",".join(args.ops),
                  "--ln-param-dtype", args.ln_param_dtype, "--cases", args.cases]
    child_args += ["--no-cynorm"] * args.no_cynorm + ["--no-out"] * args.no_out + ["--warm"] * args.warm
    child_args += ["--tune"] * args.tune
    all_results, busy = {}, {}
    for i, setting in enumerate(args.settings.split(",")):
        print(f"[{setting}] running ...", file=sys.stderr, flush=True)
        before = cpu_snapshot()
        # one child per thread count, pinned to as many CPUs: XLA (JAX) sizes its
        # pool once, from the CPUs the process may use.  The same data in every
        # child: the first child of the first setting checks it.
        all_results[setting] = sorted(
            (r for k, t in enumerate(args.threads)
             for r in run_child(__file__, setting,
                                child_args + ["--threads", str(t)]
                                + ([] if i == 0 and k == 0 and not args.no_check else ["--no-check"]),
                                capture_stderr=False)),
            key=lambda r: (r["threads"], r["order"]))
        busy[setting] = other_cpu_share(before, cpu_snapshot())
        print(table(setting, all_results[setting], stream), flush=True)
        print(f"\nOther processes (and hypervisor steal) used {100 * busy[setting]:.0f} % of the "
              f"{os.cpu_count()} CPUs during this setting's run.", flush=True)
    notes = anomalies(all_results, busy)
    print("\n### Anomalies\n")
    print("\n".join(notes) if notes else "none")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"header": cyinfo, "torch": torch.__version__, "numpy": np.__version__,
                   "repeats": args.repeats, "quick": args.quick, "loadavg": load, "other_cpu_share": busy, "stream_gbs": stream,
                   "results": all_results, "anomalies": notes}, f, indent=1)
    print(f"\njson: {os.path.relpath(args.json)}")


if __name__ == "__main__":
    main()
