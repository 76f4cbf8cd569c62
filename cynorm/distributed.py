"""Synchronized batch norm across processes, over MPI (mpi4py).

When a batch is sharded across processes (data-parallel training), batch
norm must normalize each channel with the statistics of the *global* batch.
Every rank calls these functions with its own shard, collectively::

    y, mean, invstd, count = sync_batch_norm(x_shard, weight, bias, rm, rv, comm=comm)
    ...
    gx, gw, gb = sync_batch_norm_backward(dy_shard, x_shard, weight, mean, invstd, count,
                                          comm=comm)

A training step costs exactly two collectives on ``comm``, each one
``Allreduce`` of a buffer whose size depends only on the channel count:

* forward: each rank's (count, mean, spread) per channel, merged with Chan
  et al.'s pairwise update (a user-defined MPI reduction).  By default all in
  float64, so the variance keeps single-process accuracy when the mean is
  large against the spread: 16 + 16*C bytes; compact_stats=True sends the
  variance in float32, 8 + 12*C bytes (see cynorm._sync_records);
* backward: (sum dy, sum dy * (x - mean)) per channel, summed in the
  statistics' dtype (float32, float64 for float64 x), behind a flag:
  (1 + 2*C) * s bytes, s = 4 or 8.  It runs when grad_x is asked for in
  training, or when reduce_param_grads=True asks for summed grad_weight or
  grad_bias; otherwise the backward is local.

Shards may differ in size, and a rank may hold no rows at all (it still takes
part in both collectives).  The running statistics are updated from the
reduced values, so they are identical on every rank.  ``grad_weight`` and
``grad_bias`` are this rank's contributions, as in PyTorch's SyncBatchNorm:
the data-parallel all-reduce of the parameters' gradients sums them.  With
``reduce_param_grads=True`` they come back already summed over the ranks,
from the backward's one Allreduce, which saves that all-reduce of 2*C values.
Inference (``training=False``) uses the running statistics and communicates
nothing.

Every rank of ``comm`` must make the same calls with the same channel
count, ``training`` (and count None or not), eps, momentum, compact_stats,
output_mask and reduce_param_grads, as with any MPI collective.  A rank that
rejects its other arguments (a weight of the wrong shape, a read-only
running_mean, ...) still takes part in the collective, marked, and then
every rank raises ValueError; so do ranks whose x dtypes disagree.  Errors in x itself, axis,
training or comm are raised before the collective, on that rank only.

Ranks on one node share its cores: at a communicator's first collective
use here (training, or a backward that communicates), each rank
counts the communicator's ranks on its node (``comm.Split_type`` with
``MPI.COMM_TYPE_SHARED``, a collective of that first call) and, unless the
user chose a thread count (``OMP_NUM_THREADS``, ``cynorm.set_num_threads``
or a threadpoolctl limit), runs cynorm's kernels on cores // ranks threads
(at least one) from then on, for calls from the calling thread.  Otherwise
every rank would start a team as wide as the node, and the teams would wait
on each other's threads.  Where the launcher binds each rank to cores of its
own (fewer than the node has), the count it gives is kept.

mpi4py is imported on first use (cynorm itself never needs it); install it
with ``pip install mpi4py mpich`` (``pip install '.[mpi]'`` from a cynorm
checkout installs the same) and start the processes with
``mpiexec -n 4 python train.py``.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from cynorm._arrays import big_out
from cynorm._channels import (
    affine, batch_norm_args, channel_input, channel_stat, channel_vector, grad_input_into,
    grad_sums, invstd_of, moments, normalize_into, prepare, update_running,
)
from cynorm._dtypes import from_float64
from cynorm._threads import share_node_cores
from cynorm._typing import Array, ArrayLike, Axis, OutputMask, Real
from cynorm._validation import as_float_array, check_bool, check_int, check_mask, check_same
from cynorm.batchnorm import batch_norm
from cynorm import _sync_records as records

__all__ = ["sync_batch_norm", "sync_batch_norm_backward"]

_INSTALL_HINT = ("cynorm.distributed needs mpi4py and an MPI library: pip install mpi4py mpich "
                 "(MPICH from PyPI, Linux and Apple-silicon macOS; impi-rt on Windows; "
                 "pip install '.[mpi]' from a cynorm checkout installs the same), or "
                 "pip install mpi4py built against your system's MPI")


def _mpi():
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError) as e:   # no mpi4py, or no MPI library
        raise ImportError(f"{_INSTALL_HINT} ({e})") from e
    return MPI


def _communicator(comm, collective=True):
    """(MPI module, the intracommunicator to use).  collective: the caller
    is about to communicate on it, so at its first use here this rank takes
    its share of the node's cores (_share_cores); False only validates (the
    local paths, which communicate nothing)."""
    MPI = _mpi()
    if comm is None:
        comm = MPI.COMM_WORLD
    elif not isinstance(comm, MPI.Comm):
        raise TypeError("comm must be an mpi4py intracommunicator (such as MPI.COMM_WORLD "
                        f"or one made by comm.Split), got {type(comm).__name__}")
    elif comm == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL: this process is not in the group")
    elif comm.Is_inter():
        raise TypeError("comm must be an intracommunicator, got an intercommunicator")
    if collective:
        _share_cores(MPI, comm)
    return MPI, comm


_RANKS_ON_NODE_KEY = None    # the MPI attribute caching a communicator's ranks on this node


def _share_cores(MPI, comm):
    """At comm's first use by this module (every rank of comm is then in the
    same collective call): count comm's ranks on this node with the
    shared-memory split, cache the count on comm (an MPI attribute, freed
    with comm), and give this rank its share of the node's cores, unless the
    user chose a thread count (cynorm._threads.share_node_cores)."""
    global _RANKS_ON_NODE_KEY
    if _RANKS_ON_NODE_KEY is None:
        _RANKS_ON_NODE_KEY = MPI.Comm.Create_keyval()
    if comm.Get_attr(_RANKS_ON_NODE_KEY) is not None:
        return
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    ranks = node.Get_size()
    node.Free()
    comm.Set_attr(_RANKS_ON_NODE_KEY, ranks)
    share_node_cores(ranks)


# ---- the two collectives -------------------------------------------------------

def _global_moments(MPI, comm, fmt, C, local, stat):
    """Allreduce of this rank's (n, mean, biased var), or of a rejection
    (local None), in record format fmt: the global (count, mean, biased var)
    in float64."""
    record = fmt.pack(C, local, records.DTYPE_CODES[stat])
    datatype, op = records.reduction(MPI, fmt, C)
    comm.Allreduce(MPI.IN_PLACE, [record, 1, datatype], op=op)
    if local is None:
        return None
    total, code, mean, var = fmt.unpack(record, C)
    if total == records.MALFORMED:
        raise ValueError("sync_batch_norm: the ranks of comm sent statistics of different "
                         "formats or sizes; every rank must pass the same channel count and "
                         "compact_stats")
    if total < 0:
        raise ValueError("sync_batch_norm: another rank of comm rejected its arguments (its "
                         "own error says why); nothing was computed")
    if code == records.MISMATCH:
        raise ValueError("sync_batch_norm: the ranks of comm passed x of different dtypes "
                         "(statistics in float32 on some, float64 on others); every shard, "
                         "an empty one too, must have the same dtype")
    if total == 0:
        return 0, np.full(C, np.nan), np.full(C, np.nan)
    fmt.check_merged(mean, var)     # the same record on every rank: all raise or none
    return total, mean, var


def _global_sums(MPI, comm, C, local, stat):
    """Allreduce (sum) of this rank's (sum_dy, dotp) in the statistics' dtype,
    or of a rejection (local None), behind a count of rejecting ranks."""
    buf = np.zeros(1 + 2 * C, stat)
    if local is None:
        buf[0] = 1
    else:
        buf[1:1 + C], buf[1 + C:] = local
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    if local is None:
        return None
    if buf[0] != 0:
        raise ValueError("sync_batch_norm_backward: another rank of comm rejected its "
                         "arguments (its own error says why); nothing was computed")
    return buf[1:1 + C].astype(np.float64), buf[1 + C:].astype(np.float64)


# ---- the public ops ----------------------------------------------------------

# `comm` is an mpi4py communicator (mpi4py.MPI.Comm) or None; it is typed Any
# because cynorm.distributed imports without mpi4py (importing mpi4py.MPI
# would also initialize MPI), and the signature must resolve without it.

def sync_batch_norm(x: ArrayLike, weight: Optional[ArrayLike] = None,
                    bias: Optional[ArrayLike] = None, running_mean: Optional[ArrayLike] = None,
                    running_var: Optional[ArrayLike] = None, training: bool = True,
                    momentum: Real = 0.1, eps: Real = 1e-5, axis: Axis = 1, *,
                    comm: Any = None, compact_stats: bool = False,
                    ) -> tuple[Array, Array, Array, Optional[int]]:
    """Batch norm of this rank's shard with the whole batch's statistics.

    The batch is sharded across the ranks of ``comm``; this is a collective
    operation: every rank calls it.

    In training, one Allreduce on `comm` merges every rank's per-channel
    (count, mean, spread); each rank then normalizes its own shard with the
    global statistics.  Inference (``training=False``) is batch_norm's
    inference on this rank's shard and communicates nothing.

    Parameters
    ----------
    x : array_like
        This rank's shard, rank >= 2, float64, float32, bfloat16 or float16;
        it may have no rows.  Every rank's x has the same channel count and
        dtype.
    weight : array_like, optional
        Per-channel scale, shape (C,), as in cynorm.batch_norm.
    bias : array_like, optional
        Per-channel shift, shape (C,), as in cynorm.batch_norm.
    running_mean : numpy.ndarray, optional
        As in cynorm.batch_norm (required in inference).  In training it is
        **updated in place** with the global batch's mean, identically on
        every rank.
    running_var : numpy.ndarray, optional
        As in cynorm.batch_norm (required in inference).  In training it is
        **updated in place** with the global batch's unbiased variance,
        identically on every rank.
    training : bool, default True
        As in cynorm.batch_norm; the same on every rank.
    momentum : float, default 0.1
        As in cynorm.batch_norm; the same on every rank.
    eps : float, default 1e-5
        As in cynorm.batch_norm; the same on every rank.
    axis : int, default 1
        The channel axis, as in cynorm.batch_norm.
    comm : mpi4py.MPI.Comm, optional
        The intracommunicator of the ranks sharing the batch (not an
        intercommunicator); None (the default) is ``MPI.COMM_WORLD``.  Not
        used in inference except to be checked when given.
    compact_stats : bool, default False
        The same on every rank.  Exchange each channel's variance in float32
        (its mean stays float64): 8 + 12*C bytes instead of 16 + 16*C.  The
        variance then carries ~6e-8 of relative rounding when packed and per
        merge (about log2 of the ranks' count merges), whatever the mean: a
        float32 x gets the statistics of single-process batch_norm to an ulp
        or two; a float64 x gets float32 accuracy in the variance.  float32's
        range applies too: a variance above 3.4e38 raises ValueError on every
        rank, and so does a nonzero one below 1.2e-38 when eps < 1e-30.  See
        cynorm._sync_records.

    Returns
    -------
    y : numpy.ndarray
        This rank's normalized shard, x's shape and dtype.
    save_mean : numpy.ndarray
        The global batch's per-channel mean (inference: the running mean),
        shape (C,); float64 for float64 x, float32 otherwise.
    save_invstd : numpy.ndarray
        The global batch's ``1 / sqrt(biased var + eps)`` (inference: that
        of the running variance), as `save_mean`.
    count : int or None
        Values per channel in the global batch; None in inference.  Pass
        save_mean, save_invstd and count to sync_batch_norm_backward.

    Raises
    ------
    ImportError
        If mpi4py or an MPI library is missing: in training, or in inference
        with `comm` given.
    TypeError
        If `comm` is not an mpi4py intracommunicator, `compact_stats` is not
        a bool, or an argument has a wrong type or dtype (as in
        cynorm.batch_norm).
    ValueError
        If `comm` is ``MPI.COMM_NULL``, an argument is rejected as in
        cynorm.batch_norm, another rank of `comm` rejected its arguments, the
        ranks' x dtypes, channel counts or compact_stats disagree, the global
        batch has 1 value per channel, or (compact_stats) a variance is out
        of float32's range.

    Notes
    -----
    Errors in x itself, axis, training or comm are raised before the
    collective, on that rank only.  A rank that rejects its other arguments
    still takes part in the collective, marked, and then every rank raises
    ValueError.
    """
    return _sync_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps,
                            axis, comm, compact_stats)


def _sync_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps, axis,
                     comm, compact_stats):
    """sync_batch_norm (unannotated: x and the others are rebound to the
    checked arrays)."""
    # What decides the collective (x's channel count, training, comm) is
    # checked first; an error there is raised on this rank alone.  Any later
    # rejection still takes part in the Allreduce, marked, so every rank raises.
    x, policy, _, C, _ = channel_input(x, axis)
    stat = np.dtype(policy.stat)
    fmt = records.FORMATS[check_bool(compact_stats, "compact_stats")]
    if not check_bool(training, "training"):
        return _inference(x, weight, bias, running_mean, running_var, momentum, eps, axis, comm,
                          stat)
    MPI, comm = _communicator(comm)
    try:
        (x, policy, axis, C, n, _, momentum, eps, weight, bias, rm, rv) = batch_norm_args(
            x, weight, bias, running_mean, running_var, True, momentum, eps, axis)
        (kx,), order, dims = prepare([x], axis, ())
        local_mean, local_var = moments(kx, dims, policy, eps) if n else (np.zeros(C), np.zeros(C))
        fmt.check_local(local_var, eps)
    except Exception:   # noqa: BLE001 - whatever this rank raises, join first: never hang
        _global_moments(MPI, comm, fmt, C, None, stat)
        raise
    count, mean, var = _global_moments(MPI, comm, fmt, C, (n, local_mean, local_var), stat)
    if count == 1:
        raise ValueError("Expected more than 1 value per channel when training, got 1 "
                         f"value per channel over the {comm.Get_size()} ranks of comm")
    save_mean = from_float64(mean, stat)
    save_invstd = from_float64(invstd_of(var, eps), stat)
    ky, y = big_out(None, x.shape, x.dtype, order)
    if n > 0:
        # as batch_norm: the float64 mean (save_mean is its rounding), the saved invstd
        inv = save_invstd.astype(np.float64)
        normalize_into(kx, ky, mean, *affine(inv, weight, bias, C), dims, policy)
    if count > 0:
        update_running(rm, rv, mean, var, count, momentum)
    return y, save_mean, save_invstd, count


def _inference(x, weight, bias, running_mean, running_var, momentum, eps, axis, comm, stat):
    """sync_batch_norm with training=False: batch_norm's inference, local."""
    y, _, _ = batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps,
                         axis=axis)
    if comm is not None:
        _communicator(comm, collective=False)
    return (y, from_float64(np.asarray(running_mean, np.float64), stat),
            from_float64(invstd_of(np.asarray(running_var, np.float64), eps), stat), None)


def sync_batch_norm_backward(grad_out: ArrayLike, x: ArrayLike, weight: Optional[ArrayLike],
                             save_mean: ArrayLike, save_invstd: ArrayLike,
                             count: Optional[int], axis: Axis = 1, *, comm: Any = None,
                             output_mask: OutputMask = (True, True, True),
                             reduce_param_grads: bool = False,
                             ) -> tuple[Optional[Array], Optional[Array], Optional[Array]]:
    """Gradients of sync_batch_norm for this rank's shard.

    Collective when it communicates (see below): then every rank calls it.

    With N = count values per channel over all ranks, and sum_dy, dotp the
    sums of dy and dy * (x - mean) over the global batch::

        grad_x = (dy - sum_dy / N - (x - mean) * invstd**2 * dotp / N) * invstd * weight
                 (inference, count None: dy * invstd * weight)
        grad_weight, grad_bias = this rank's dotp * invstd and sum_dy

    save_mean, save_invstd and count are what sync_batch_norm returned;
    output_mask selects (grad_x, grad_weight, grad_bias), the others are None.
    grad_weight and grad_bias have weight's dtype (the statistics' dtype
    without weight).

    reduce_param_grads=True returns grad_weight and grad_bias summed over the
    ranks instead (the whole batch's, identical on every rank), from the same
    Allreduce that grad_x needs: leave weight and bias out of your own
    gradient all-reduce then (divide by comm's size if you average gradients).

    It communicates (one Allreduce of 2*C statistics-dtype values) when
    training with grad_x asked for, or with reduce_param_grads and grad_weight
    or grad_bias asked for; otherwise it is local.

    Parameters
    ----------
    grad_out : array_like
        This rank's dy, x's shape and dtype.
    x : array_like
        This rank's shard, as given to sync_batch_norm.
    weight : array_like or None
        Per-channel scale, shape (C,): x's dtype, or float32 when x is
        16-bit.  None stands for ones.
    save_mean : array_like
        sync_batch_norm's save_mean, shape (C,), any supported floating
        dtype.
    save_invstd : array_like
        sync_batch_norm's save_invstd, as `save_mean`.
    count : int or None
        sync_batch_norm's count: the global batch's values per channel
        (training), or None (inference).  The same on every rank.
    axis : int, default 1
        The channel axis, as given to sync_batch_norm.
    comm : mpi4py.MPI.Comm, optional
        The intracommunicator of the ranks sharing the batch; None (the
        default) is ``MPI.COMM_WORLD``.  Checked when given even if the call
        does not communicate.
    output_mask : sequence of 3 bool, default (True, True, True)
        Which of (grad_x, grad_weight, grad_bias) to compute; the same on
        every rank.
    reduce_param_grads : bool, default False
        Return grad_weight and grad_bias summed over the ranks; the same on
        every rank.

    Returns
    -------
    grad_x : numpy.ndarray or None
        x's shape and dtype; None when ``output_mask[0]`` is False.
    grad_weight : numpy.ndarray or None
        Shape (C,), weight's dtype (float64 for float64 x, float32 otherwise
        when weight is None): this rank's contribution, or the sum over the
        ranks with `reduce_param_grads`; None when ``output_mask[1]`` is
        False.
    grad_bias : numpy.ndarray or None
        As `grad_weight`; None when ``output_mask[2]`` is False.

    Raises
    ------
    ImportError
        If mpi4py or an MPI library is missing, when the call communicates
        or `comm` is given.
    TypeError
        If `comm` is not an mpi4py intracommunicator, an array argument has
        an unsupported or mismatched dtype, `count` is not an int or None,
        `axis` is not an int, or `output_mask` or `reduce_param_grads` is
        not of the documented type.
    ValueError
        If `comm` is ``MPI.COMM_NULL``, x has rank < 2, `axis` is out of
        range, grad_out's shape is not x's, a per-channel argument is None
        or has the wrong shape, `output_mask` does not have 3 entries,
        `count` cannot be the global count sync_batch_norm returned (it is
        below this rank's values per channel, or below 2 while this rank
        holds values), or another rank of `comm` rejected its arguments.
    """
    return _sync_backward(grad_out, x, weight, save_mean, save_invstd, count, axis, comm,
                          output_mask, reduce_param_grads)


def _sync_backward(grad_out, x, weight, save_mean, save_invstd, count, axis, comm, output_mask,
                   reduce_param_grads):
    """sync_batch_norm_backward (unannotated: x and the others are rebound
    to the checked arrays)."""
    # as in sync_batch_norm: what decides the collective is checked first, a
    # later rejection still takes part in it, marked, so every rank raises
    x, policy, axis, C, n = channel_input(x, axis)
    mask = check_mask(output_mask)
    reduce_params = check_bool(reduce_param_grads, "reduce_param_grads")
    training = count is not None
    communicate = (training and mask[0]) or (reduce_params and (mask[1] or mask[2]))
    if communicate:
        MPI, comm = _communicator(comm)
    elif comm is not None:
        _communicator(comm, collective=False)
    stat = np.dtype(policy.stat)
    try:
        grad_out, _ = as_float_array(grad_out, "grad_out")
        check_same(grad_out, "grad_out", x.shape, x.dtype, ref="x")
        weight = channel_vector(weight, "weight", C, policy)
        mean = channel_stat(save_mean, "save_mean", C)
        inv = channel_stat(save_invstd, "save_invstd", C)
        if training:
            count = check_int(count, "count",
                              "an int (the count sync_batch_norm returned) or None")
            if count < n or (n > 0 and count < 2):
                raise ValueError(f"count must be the global batch's values per channel that "
                                 f"sync_batch_norm returned, got {count} with {n} on this rank")
        (kdy, kx), order, dims = prepare([grad_out, x], axis, ())
        if n > 0 and (communicate or mask[1] or mask[2]):
            sum_dy, dotp = grad_sums(kdy, kx, mean, dims, policy)
        else:
            sum_dy, dotp = np.zeros(C), np.zeros(C)
    except Exception:   # noqa: BLE001 - as in sync_batch_norm: never leave the others hanging
        if communicate:
            _global_sums(MPI, comm, C, None, stat)
        raise
    gdtype = weight.dtype if weight is not None else stat
    if communicate:
        total_dy, total_dotp = _global_sums(MPI, comm, C, (sum_dy, dotp), stat)
    grad_x = None
    if mask[0]:
        kgx, grad_x = big_out(None, x.shape, x.dtype, order)
        a, zero = affine(inv, weight, None, C)
        if n > 0 and training:
            with np.errstate(divide="ignore", invalid="ignore"):   # eps = 0, constant channel
                grad_input_into(kdy, kx, kgx, total_dy / count, mean,
                                total_dotp / count * inv * inv, a, dims, policy)
        elif n > 0:
            normalize_into(kdy, kgx, zero, a, zero, dims, policy)
    if reduce_params and communicate:
        sum_dy, dotp = total_dy, total_dotp
        empty = count == 0
    else:
        empty = n == 0
    with np.errstate(over="ignore", invalid="ignore"):   # float16 sums above 65504: inf
        grad_weight = (from_float64(np.zeros(C) if empty else dotp * inv, gdtype)
                       if mask[1] else None)
        grad_bias = from_float64(sum_dy, gdtype) if mask[2] else None
    return grad_x, grad_weight, grad_bias
