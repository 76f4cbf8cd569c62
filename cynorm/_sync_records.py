"""The forward reduction of cynorm.distributed: every rank's per-channel
(count, mean, spread) packed into one record, and the user-defined MPI op
that merges two records with Chan et al.'s pairwise update.

Two formats, picked by sync_batch_norm's ``compact_stats`` (the same on
every rank, as the record's size depends on it):

* default, 16 + 16*C bytes, all float64:
      [count, dtype code, mean (C), M2 = sum of squared deviations (C)]
  so float32 x keeps the accuracy of single-process batch_norm (whose
  statistics are float64 sums too).
* compact, 8 + 12*C bytes:
      [int64 4*count + dtype code, mean (C) float64, biased var (C) float32]
  The means stay float64 because the merge subtracts them: rounded to float32
  they would cost the variance up to ~1e-7 * |mean| / std * (spread of the
  ranks' means) / std (measured: 1.6e-4 at mean = 1e4 * std with shard means
  3 std apart, 1e-3 at 1e5).  The variance only enters sums of non-negative
  terms, so float32 costs it no more than a float32 rounding (~6e-8) when
  packed and per merge, whatever the mean, and float32 x gets the statistics
  of single-process batch_norm to an ulp or two.  Its range is float32's:
  sync_batch_norm raises for variances beyond it (above 3.4e38, or below
  1.2e-38 with eps < 1e-30) rather than return a flushed invstd.

A count < 0 marks a rank that rejected its arguments and a dtype code 0
ranks that disagree on the statistics' dtype (which sizes the backward's
buffer).  Both markers survive every merge, so all ranks learn of a failure
from the one collective and can raise together.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from cynorm.batchnorm_stats import chan_merge

REJECTED = -1
MALFORMED = -2      # not a record of this format: ranks disagree on C or compact_stats
DTYPE_CODES = {np.dtype(np.float32): 1, np.dtype(np.float64): 2}
MISMATCH = 0


def _worst(a, b):
    """The marker of a merge of two marked counts (symmetric)."""
    return min(a, b) if min(a, b) in (REJECTED, MALFORMED) else REJECTED


class Float64Record:
    """[count, dtype code, mean (C), M2 (C)], float64."""
    dtype = np.dtype(np.float64)
    header = 2          # float64 slots before the statistics

    @classmethod
    def nbytes(cls, C):
        return 8 * (cls.header + 2 * C)

    @classmethod
    def pack(cls, C, local, code):
        """The record of local = (n, mean, biased var), or of a rejection (None)."""
        record = np.zeros(cls.header + 2 * C)
        record[1] = code
        if local is None:
            record[0] = REJECTED
        elif local[0] > 0:
            n, mean, var = local
            record[0] = n
            record[cls.header:cls.header + C] = mean
            record[cls.header + C:] = var * n
        return record

    @staticmethod
    def reject(record):
        record[0] = REJECTED

    @staticmethod
    def check_local(var, eps):
        """Nothing float64 cannot carry."""

    @staticmethod
    def check_merged(mean, var):
        """Nothing float64 cannot carry."""

    @staticmethod
    def _valid(record):
        # a compact record read as float64 has a subnormal or huge count and
        # a mean in the dtype code's place: catch what can be caught cheaply
        n = record[0]
        return (n in (REJECTED, MALFORMED) or (n >= 0 and n == np.floor(n))) and \
            record[1] in (MISMATCH, 1.0, 2.0)

    @classmethod
    def merge(cls, a, b):
        """b <- the merge of records a and b (float64 arrays).

        Written symmetrically in a and b, so merge(a, b) and merge(b, a) give
        the same bits: every rank then ends with the same statistics whatever
        side of each pairwise exchange MPI put it on."""
        na, nb = a[0], b[0]
        if not (cls._valid(a) and cls._valid(b)):
            b[0] = MALFORMED
            return
        if a[1] != b[1]:
            b[1] = MISMATCH
        if na < 0 or nb < 0:
            b[0] = _worst(na, nb)
            return
        if na == 0:
            return
        if nb == 0:
            b[cls.header:] = a[cls.header:]
            b[0] = na
            return
        C = (len(b) - cls.header) // 2
        stats_a, stats_b = a[cls.header:].reshape(2, C), b[cls.header:].reshape(2, C)
        b[0], stats_b[0], stats_b[1] = chan_merge(na, stats_a[0], stats_a[1], nb, stats_b[0],
                                                  stats_b[1])

    @classmethod
    def unpack(cls, record, C):
        """(count, dtype code, mean, biased var) in float64 from a merged record."""
        total, code = record[0], record[1]
        if total <= 0:
            return int(total), code, None, None
        mean, m2 = record[cls.header:].reshape(2, C)
        return int(total), code, mean, np.maximum(m2 / total, 0.0)


class CompactRecord:
    """[int64 4*count + dtype code, mean (C) float64, var (C) float32], as bytes."""
    dtype = np.dtype(np.uint8)

    @staticmethod
    def nbytes(C):
        return 8 + 12 * C

    @staticmethod
    def _parts(record):
        """(header, mean, var) views of one record's bytes."""
        C = (len(record) - 8) // 12
        return (record[:8].view(np.int64), record[8:8 + 8 * C].view(np.float64),
                record[8 + 8 * C:].view(np.float32))

    @classmethod
    def pack(cls, C, local, code):
        record = np.zeros(cls.nbytes(C), np.uint8)
        if local is None:
            cls.reject(record)
            return record
        n, mean, var = local
        head, m, v = cls._parts(record)
        head[0] = 4 * n + code
        if n > 0:
            m[:] = mean
            # over float32's range: inf (check_merged raises); under it: subnormal
            # (check_local raised already if that mattered)
            with np.errstate(all="ignore"):
                v[:] = var
        return record

    @classmethod
    def reject(cls, record):
        cls._parts(record)[0][0] = REJECTED

    @staticmethod
    def check_local(var, eps):
        """A variance below float32's normal range would lose its digits in
        the record; that matters only when eps does not dwarf it."""
        tiny = np.finfo(np.float32).tiny
        if eps < 1e-30 and np.any((var > 0) & (var < tiny)):
            raise ValueError(f"compact_stats=True exchanges variances in float32, and this "
                             f"rank's shard has a channel variance below its normal range "
                             f"({tiny:.3g}) with eps={eps}; pass compact_stats=False (or "
                             f"eps >= 1e-30)")

    @staticmethod
    def check_merged(mean, var):
        """A finite channel whose variance overflowed float32 (in a pack or a merge)."""
        beyond = np.flatnonzero(np.isposinf(var) & np.isfinite(mean))
        if beyond.size:
            raise ValueError(f"sync_batch_norm: compact_stats=True exchanges variances in "
                             f"float32, and channel(s) {beyond[:8].tolist()} have a variance "
                             f"beyond its range (3.4e38); pass compact_stats=False")

    @classmethod
    def merge(cls, a, b):
        (ha, ma, va), (hb, mb, vb) = cls._parts(a), cls._parts(b)
        if ha[0] < 0 or hb[0] < 0:
            hb[0] = _worst(int(ha[0]), int(hb[0]))
            return
        (na, ca), (nb, cb) = divmod(int(ha[0]), 4), divmod(int(hb[0]), 4)
        hb[0] = 4 * (na + nb) + (ca if ca == cb else MISMATCH)
        if na == 0:
            return
        if nb == 0:
            mb[:], vb[:] = ma, va
            return
        n, mb[:], m2 = chan_merge(na, ma, va * np.float64(na), nb, mb.copy(),
                                  vb * np.float64(nb))
        vb[:] = m2 / n

    @classmethod
    def unpack(cls, record, C):
        head, mean, var = cls._parts(record)
        if head[0] < 0:
            return int(head[0]), None, None, None
        total, code = divmod(int(head[0]), 4)
        if total == 0:
            return 0, code, None, None
        return total, code, mean.copy(), np.maximum(var.astype(np.float64), 0.0)


FORMATS = {False: Float64Record, True: CompactRecord}     # by compact_stats


def _merge_op(fmt):
    def op(inbuf, inoutbuf, datatype):
        # an exception escaping a user-defined MPI op aborts the whole job, and
        # np.seterr(all="raise") would turn an inf - inf of a non-finite channel
        # into one: compute quietly, and mark the result rejected if all else fails
        try:
            size = datatype.Get_size() // fmt.dtype.itemsize     # one record's elements
            b = np.frombuffer(inoutbuf, fmt.dtype)
        except BaseException:   # noqa: BLE001 - nothing to mark, and nothing may propagate
            return
        try:
            a = np.frombuffer(inbuf, fmt.dtype)
            with np.errstate(all="ignore"):
                for start in range(0, len(b), size):
                    fmt.merge(a[start:start + size], b[start:start + size])
        except BaseException:   # noqa: BLE001 - nothing may propagate into MPI
            try:
                for start in range(0, len(b), size):
                    fmt.reject(b[start:start + size])
            except BaseException:   # noqa: BLE001
                pass
    return op


# (the values are mpi4py objects, typed Any: this module imports without mpi4py)
_ops: dict[type, Any] = {}                      # format -> MPI.Op
_datatypes: dict[tuple[type, int], Any] = {}    # (format, C) -> committed MPI datatype of a record


def reduction(MPI, fmt, C):
    """(MPI datatype of one record, the merge op) of format fmt for C channels.

    One record is one MPI element, so no MPI algorithm can split it into
    pieces that the merge would misread."""
    if fmt not in _ops:
        _ops[fmt] = MPI.Op.Create(_merge_op(fmt), commute=True)
    if (fmt, C) not in _datatypes:
        _datatypes[fmt, C] = MPI.BYTE.Create_contiguous(fmt.nbytes(C)).Commit()
    return _datatypes[fmt, C], _ops[fmt]
