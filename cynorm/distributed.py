"""Synchronized batch norm across processes, over MPI (mpi4py).

When a batch is sharded across processes (data-parallel training), batch
norm must normalize each channel with the statistics of the *global* batch.
Every rank calls these functions with its own shard, collectively:

    y, mean, invstd, count = sync_batch_norm(x_shard, weight, bias, rm, rv, comm=comm)
    ...
    gx, gw, gb = sync_batch_norm_backward(dy_shard, x_shard, weight, mean, invstd, count,
                                          comm=comm)

A training step costs exactly two collectives on ``comm``, each one
``Allreduce`` of a buffer whose size depends only on the channel count:

* forward: each rank's (count, mean, sum of squared deviations) per channel,
  merged with Chan et al.'s pairwise update (a user-defined MPI reduction),
  so the variance stays accurate when the mean is large against the spread;
  8 + 2*C*s bytes, s = 4 for 32- and 16-bit x, 8 for float64;
* backward: (sum dy, sum dy * (x - mean)) per channel, summed: 2*C*s bytes;
  skipped when grad_x is not asked for.

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
count, x dtype, eps, momentum and output_mask[0], as with any MPI
collective; a mismatch is an MPI error or a hang, not something one rank
can detect alone.

mpi4py is imported on first use (cynorm itself never needs it); install it
with ``pip install 'cynorm[mpi]'`` and start the processes with
``mpiexec -n 4 python train.py``.
"""
import numpy as np

from cynorm._arrays import big_out
from cynorm._dtypes import from_float64
from cynorm._validation import as_float_array, check_bool, check_int, check_mask, check_same
from cynorm.batchnorm import (
    affine, batch_norm_args, channel_input, channel_stat, channel_vector, grad_input_into,
    grad_sums, invstd_of, moments, normalize_into, prepare, update_running,
)

__all__ = ["sync_batch_norm", "sync_batch_norm_backward"]

_INSTALL_HINT = ("cynorm.distributed needs mpi4py and an MPI library: pip install 'cynorm[mpi]' "
                 "(mpi4py and MPICH from PyPI), or pip install mpi4py built against your "
                 "system's MPI")
_COUNT_BYTES = 8      # the packed statistics start with the count, as a float64


def _mpi():
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError) as e:   # no mpi4py, or no MPI library
        raise ImportError(f"{_INSTALL_HINT} ({e})") from e
    return MPI


def _communicator(comm):
    """(MPI module, the intracommunicator to use)."""
    MPI = _mpi()
    if comm is None:
        return MPI, MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise TypeError("comm must be an mpi4py intracommunicator (such as MPI.COMM_WORLD "
                        f"or one made by comm.Split), got {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL: this process is not in the group")
    if comm.Is_inter():
        raise TypeError("comm must be an intracommunicator, got an intercommunicator")
    return MPI, comm


# ---- the forward reduction: Chan's merge of per-rank moments ----------------

def _merge_moments(a, b, stat):
    """b <- the merge of packed (count, mean, M2) records a and b.

    Written symmetrically in a and b, so merge(a, b) and merge(b, a) give the
    same bits: every rank then ends with the same statistics whatever side of
    each pairwise exchange MPI put it on."""
    na = float(a[:_COUNT_BYTES].view(np.float64)[0])
    nb = float(b[:_COUNT_BYTES].view(np.float64)[0])
    if na == 0:
        return
    if nb == 0:
        b[:] = a
        return
    sa = a[_COUNT_BYTES:].view(stat).reshape(2, -1).astype(np.float64)
    sb = b[_COUNT_BYTES:].view(stat).reshape(2, -1)
    mb, m2b = sb.astype(np.float64)
    n = na + nb
    d = mb - sa[0]
    mean = sa[0] * (na / n) + mb * (nb / n)
    m2 = (sa[1] + m2b) + d * d * (na * nb / n)
    b[:_COUNT_BYTES].view(np.float64)[0] = n
    sb[0] = mean
    sb[1] = m2


def _merge_op_for(stat):
    def merge(inbuf, inoutbuf, datatype):
        size = datatype.Get_size()
        a = np.frombuffer(inbuf, np.uint8)
        b = np.frombuffer(inoutbuf, np.uint8)
        for start in range(0, b.nbytes, size):
            _merge_moments(a[start:start + size], b[start:start + size], stat)
    return merge


_ops = {}           # stat dtype -> MPI.Op
_datatypes = {}     # (C, stat dtype) -> committed MPI datatype


def _moments_reduction(MPI, C, stat):
    """(MPI datatype of one packed record, the merge op) for C channels.

    One record is one MPI element, so no MPI algorithm can split it into
    pieces that the merge would misread."""
    stat = np.dtype(stat)
    if stat not in _ops:
        _ops[stat] = MPI.Op.Create(_merge_op_for(stat), commute=True)
    key = (C, stat)
    if key not in _datatypes:
        element = MPI.DOUBLE if stat == np.float64 else MPI.FLOAT
        _datatypes[key] = MPI.Datatype.Create_struct(
            [1, 2 * C], [0, _COUNT_BYTES], [MPI.DOUBLE, element]).Commit()
    return _datatypes[key], _ops[stat]


def _global_moments(MPI, comm, n, mean, var, stat):
    """Allreduce of this rank's (n, mean, biased var): the global
    (count, mean, biased var), mean and var in float64 (rounded through stat)."""
    C = mean.shape[0]
    buf = np.zeros(_COUNT_BYTES + 2 * C * stat.itemsize, np.uint8)
    if n > 0:
        buf[:_COUNT_BYTES].view(np.float64)[0] = n
        stats = buf[_COUNT_BYTES:].view(stat).reshape(2, C)
        stats[0] = mean
        stats[1] = var * n
    datatype, op = _moments_reduction(MPI, C, stat)
    comm.Allreduce(MPI.IN_PLACE, [buf, 1, datatype], op=op)
    total = float(buf[:_COUNT_BYTES].view(np.float64)[0])
    mean, m2 = buf[_COUNT_BYTES:].view(stat).reshape(2, C).astype(np.float64)
    if total == 0:
        return 0, np.full(C, np.nan), np.full(C, np.nan)
    return int(total), mean, np.maximum(m2 / total, 0.0)


# ---- the public ops ----------------------------------------------------------

def sync_batch_norm(x, weight=None, bias=None, running_mean=None, running_var=None,
                    training=True, momentum=0.1, eps=1e-5, axis=1, *, comm=None):
    """Batch norm of this rank's shard with the statistics of the whole
    batch across the ranks of ``comm`` (collective: every rank calls it).

    Parameters
    ----------
    x : ndarray, rank >= 2 (float64, float32, bfloat16 or float16)
        This rank's shard; it may have no rows.  Every rank's x has the same
        channel count and dtype.
    weight, bias, running_mean, running_var, training, momentum, eps, axis :
        as in cynorm.batch_norm.  The running statistics are updated in place
        with the global batch's mean and unbiased variance.
    comm : mpi4py intracommunicator, default MPI.COMM_WORLD

    Returns
    -------
    y : ndarray, x's shape and dtype.
    save_mean, save_invstd : ndarray (C,), the global batch's statistics
        (inference: those of the running statistics); float64 for float64 x,
        float32 otherwise.
    count : int, values per channel in the global batch; None in inference.
        Pass all four to sync_batch_norm_backward.
    """
    (x, policy, axis, C, n, training, momentum, eps, weight, bias, rm, rv) = batch_norm_args(
        x, weight, bias, running_mean, running_var, training, momentum, eps, axis)
    stat = np.dtype(policy.stat)
    (kx,), transposed, dims = prepare([x], axis, ())
    ky, y = big_out(None, x.shape, x.dtype, transposed)
    if training:
        MPI, comm = _communicator(comm)
        local_mean, local_var = moments(kx, dims, policy) if n else (np.zeros(C), np.zeros(C))
        count, mean, var = _global_moments(MPI, comm, n, local_mean, local_var, stat)
        if count == 1:
            raise ValueError("Expected more than 1 value per channel when training, got 1 "
                             f"value per channel over the {comm.Get_size()} ranks of comm")
        save_mean = from_float64(mean, stat)
        save_invstd = from_float64(invstd_of(var, eps), stat)
    else:
        if comm is not None:
            _communicator(comm)
        count = None
        save_mean = from_float64(rm.astype(np.float64), stat)
        save_invstd = from_float64(invstd_of(rv.astype(np.float64), eps), stat)
    if n > 0:
        inv = save_invstd.astype(np.float64)
        normalize_into(kx, ky, save_mean.astype(np.float64), *affine(inv, weight, bias, C),
                       dims, policy)
    if training and count > 0:
        update_running(rm, rv, mean, var, count, momentum)
    return y, save_mean, save_invstd, count


def sync_batch_norm_backward(grad_out, x, weight, save_mean, save_invstd, count, axis=1, *,
                             comm=None, output_mask=(True, True, True), reduce_param_grads=False):
    """Gradients of sync_batch_norm for this rank's shard (collective when it
    communicates, see below: then every rank calls it).

    With N = count values per channel over all ranks, and sum_dy, dotp the
    sums of dy and dy * (x - mean) over the global batch:

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
    """
    x, policy, axis, C, n = channel_input(x, axis)
    grad_out, _ = as_float_array(grad_out, "grad_out")
    check_same(grad_out, "grad_out", x.shape, x.dtype, ref="x")
    mask = check_mask(output_mask)
    reduce_params = check_bool(reduce_param_grads, "reduce_param_grads")
    weight = channel_vector(weight, "weight", C, policy)
    mean = channel_stat(save_mean, "save_mean", C)
    inv = channel_stat(save_invstd, "save_invstd", C)
    training = count is not None
    if training:
        count = check_int(count, "count", "an int (the count sync_batch_norm returned) or None")
        if count < n or (n > 0 and count < 2):
            raise ValueError(f"count must be the global batch's values per channel that "
                             f"sync_batch_norm returned, got {count} with {n} on this rank")
    communicate = (training and mask[0]) or (reduce_params and (mask[1] or mask[2]))
    if communicate:
        MPI, comm = _communicator(comm)
    elif comm is not None:
        _communicator(comm)
    stat = np.dtype(policy.stat)
    gdtype = weight.dtype if weight is not None else stat
    (kdy, kx), transposed, dims = prepare([grad_out, x], axis, ())
    if n > 0 and (communicate or mask[1] or mask[2]):
        sum_dy, dotp = grad_sums(kdy, kx, mean, dims, policy)
    else:
        sum_dy, dotp = np.zeros(C), np.zeros(C)
    if communicate:
        sums = np.concatenate([sum_dy, dotp]).astype(stat)
        comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
        total_dy, total_dotp = sums.astype(np.float64).reshape(2, C)
    grad_x = None
    if mask[0]:
        kgx, grad_x = big_out(None, x.shape, x.dtype, transposed)
        a, zero = affine(inv, weight, None, C)
        if n > 0 and training:
            grad_input_into(kdy, kx, kgx, total_dy / count, mean, total_dotp / count * inv * inv,
                            a, dims, policy)
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
