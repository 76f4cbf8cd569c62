"""References for the fuzzers: every op recomputed from the values actually
passed, in extended precision (np.longdouble: 64-bit significand and a
15-bit exponent on x86-64 Linux), never with cynorm, together with a
first-order bound on the rounding error of the computation the library
documents.

Error model (docs/guarantees.rst, the dtype policy): reductions accumulate in float64;
elementwise math runs in the math dtype (float64 for float64 data, float32
otherwise); results are rounded once to the output dtype.  An `EB` value
carries (v, e): the exact value and a bound e on |computed - v|; every
arithmetic operation done "at" a precision P adds P's rounding error
u*|result| + tiny (half the smallest subnormal).  A result passes when it
lies in [round(v - s*e), round(v + s*e)] rounded to the output dtype
(rounding is monotone, so overflow to inf and underflow to subnormals are
judged exactly), s a safety factor for the constants of the error model.
Where the reference is NaN or infinite the result must be non-finite too
(an infinite one with the same sign).

Range: float32 and 16-bit data get float64-range statistics (the library's
promise: a norm of [3e20, 4e20] is 5e20, not inf).  float64 data get no
such promise: groups whose squares or sums leave float64's normal range are
not judged (`f64_range_ok`), as PyTorch overflows there too.
"""
import contextlib
import math

import numpy as np

from .arrays import BF16, F16, F32, F64, STAT

LD = np.longdouble
CLD = np.clongdouble
# an extended format with float64-beyond range: the oracles need it for the
# extreme-value cases (x86-64 Linux has it; elsewhere those are narrowed)
WIDE = np.finfo(LD).maxexp >= 16384 and np.finfo(LD).nmant >= 63


class Prec:
    """A floating-point format: unit roundoff u, half its smallest subnormal
    (tiny), and its largest finite value (an elementwise intermediate beyond
    it overflows: that element is then not judged)."""

    def __init__(self, name, u, tiny, big=np.inf):
        self.name, self.u, self.tiny, self.big = name, LD(u), LD(tiny), LD(big)

    def wide(self):
        """The same rounding with no overflow (terms of float64-range reductions)."""
        return Prec(self.name + "-wide", self.u, self.tiny)


P64 = Prec("float64", 2.0 ** -53, LD(2) ** -1075, 1.7976931348623157e308)   # (2.0 ** -1075 == 0)
P32 = Prec("float32", 2.0 ** -24, 2.0 ** -150, 3.4028234663852886e38)
PREC = {F64: P64, F32: P32, BF16: Prec("bfloat16", 2.0 ** -8, 2.0 ** -134),
        F16: Prec("float16", 2.0 ** -11, 2.0 ** -25)}
EXACT = Prec("exact", 0.0, 0.0)
MARGIN = LD(2) ** -16       # intermediates this close to overflow may overflow in another order


def math_prec(dtype):
    """The precision cynorm computes elementwise math in for `dtype` data."""
    return P64 if np.dtype(dtype) == F64 else P32


_AT = [EXACT]


@contextlib.contextmanager
def at(prec):
    """Operations inside round at `prec`."""
    _AT.append(prec)
    try:
        yield
    finally:
        _AT.pop()


def ld(a):
    """An array's values exactly, as longdouble (complex stays complex)."""
    a = np.asarray(a)
    if a.dtype.kind == "c":
        return a.astype(CLD)
    if a.dtype.kind in "iub":
        return a.astype(LD)
    return a.astype(np.float64).astype(LD)


def _mul0(a, b):
    """a * b for error terms: 0 where a factor is 0 (an exact zero carries no
    error), but inf where either is inf (an unbounded operand may be inf,
    and inf * 0 is NaN)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(np.isinf(a) | np.isinf(b), LD(np.inf),
                        np.where((a == 0) | (b == 0), LD(0), a * b))


class EB:
    """A value with a bound on the error of computing it."""
    __slots__ = ("v", "e")

    def __init__(self, v, e=None):
        self.v = np.asarray(v)
        if self.v.dtype.kind not in "fc":
            self.v = self.v.astype(LD)
        self.e = np.zeros(self.v.shape, LD) if e is None else np.asarray(e, LD)

    @staticmethod
    def of(a):
        """An exact input."""
        return a if isinstance(a, EB) else EB(ld(a))

    def _r(self, v):
        """The rounding error of storing v at the current precision (inf
        where v overflows it: the element is not judged)."""
        p = _AT[-1]
        with np.errstate(over="ignore", invalid="ignore"):
            mag = np.abs(v)
            r = p.u * mag + p.tiny
            # another evaluation order may overflow a little earlier: a margin
            return np.where(mag > p.big * MARGIN, LD(np.inf), r) if np.isfinite(p.big) else r

    def rounded(self):
        """This value stored at the current precision."""
        with np.errstate(over="ignore", invalid="ignore"):
            return EB(self.v, self.e + self._r(self.v))

    def __add__(self, o):
        o = EB.of(o)
        with np.errstate(all="ignore"):
            v = self.v + o.v
            return EB(v, self.e + o.e + self._r(v))

    __radd__ = __add__

    def __neg__(self):
        return EB(-self.v, self.e)

    def __sub__(self, o):
        return self + (-EB.of(o))

    def __rsub__(self, o):
        return EB.of(o) - self

    def __mul__(self, o):
        o = EB.of(o)
        with np.errstate(all="ignore"):
            v = self.v * o.v
            e = _mul0(np.abs(self.v), o.e) + _mul0(np.abs(o.v), self.e) + _mul0(self.e, o.e)
            return EB(v, e + self._r(v))

    __rmul__ = __mul__

    def __truediv__(self, o):
        o = EB.of(o)
        with np.errstate(all="ignore"):
            v = self.v / o.v
            den = np.abs(o.v) - o.e
            e = np.where(den > 0, (self.e + _mul0(np.abs(v), o.e)) / np.where(den > 0, den, 1),
                         LD(np.inf))
            e = np.where((o.e == 0) & (self.e == 0), LD(0), e)
            return EB(v, e + self._r(v))

    def __rtruediv__(self, o):
        return EB.of(o) / self

    def __getitem__(self, idx):
        return EB(self.v[idx], self.e[idx])

    @property
    def shape(self):
        return self.v.shape

    def reshape(self, *shape):
        return EB(self.v.reshape(*shape), self.e.reshape(*shape))

    def moveaxis(self, a, b):
        return EB(np.moveaxis(self.v, a, b), np.moveaxis(self.e, a, b))

    def sum(self, axis=None, keepdims=False):
        """A reduction: n * u * sum|terms| for any summation order."""
        with np.errstate(all="ignore"):
            v = np.sum(self.v, axis=axis, keepdims=keepdims)
            n = self.v.size if axis is None else math.prod(
                np.atleast_1d(self.v.shape)[list(np.atleast_1d(axis))]) if self.v.ndim else 1
            p = _AT[-1]
            mag = np.sum(np.abs(self.v), axis=axis, keepdims=keepdims)
            e = np.sum(self.e, axis=axis, keepdims=keepdims) + p.u * n * mag + p.tiny * (n + 1)
            return EB(v, np.where(mag > p.big * MARGIN, LD(np.inf), e))   # partial sums may overflow

    def ksum(self, axis, keepdims, pm, wide=False):
        """A kernel reduction: terms formed in the math type pm and added a
        few at a time in it before each float64 accumulation (stats_loops.pxi.tp):
        (4 u_m + n u_64) * sum|terms|."""
        with np.errstate(all="ignore"):
            v = np.sum(self.v, axis=axis, keepdims=keepdims)
            n = self.v.size if axis is None else math.prod(
                np.atleast_1d(self.v.shape)[list(np.atleast_1d(axis))]) if self.v.ndim else 1
            mag = np.sum(np.abs(self.v), axis=axis, keepdims=keepdims)
            e = np.sum(self.e, axis=axis, keepdims=keepdims) + (4 * pm.u + (n + 2) * P64.u) * mag \
                + (pm.tiny + P64.tiny) * (n + 1)
            # partial sums in the math type may overflow: not judged, except
            # in the norms (wide: cynorm promises float64-range norms)
            return EB(v, e if wide else np.where(mag > pm.big * MARGIN, LD(np.inf), e))

    def mean(self, axis=None, keepdims=False):
        n = self.v.size if axis is None else math.prod(
            np.atleast_1d(self.v.shape)[list(np.atleast_1d(axis))])
        return self.sum(axis, keepdims) / n


def _unary(a, v, slope):
    """f(a) with value v and |f'| <= slope near a."""
    with np.errstate(all="ignore"):
        return EB(v, _mul0(slope, a.e) + a._r(v))


def sqrt(a):
    with np.errstate(all="ignore"):
        v = np.sqrt(a.v)
        mag = np.abs(a.v)
        den = np.sqrt(mag) + np.sqrt(np.maximum(mag - a.e, 0))
        e = np.where(a.e == 0, LD(0), np.where(den > 0, a.e / np.where(den > 0, den, 1), np.sqrt(a.e)))
        return EB(v, e + a._r(v))


def exp(a):
    """exp; results below the math type's smallest normal may flush to 0."""
    with np.errstate(all="ignore"):
        v = np.exp(a.v)
        e = np.where(a.e == 0, LD(0), np.abs(v) * np.expm1(a.e))
        p = _AT[-1]
        flush = LD(2) ** -125 if p.name.startswith("float32") else LD(2) ** -1021 if p.name.startswith(
            "float64") else LD(0)
        return EB(v, e + a._r(v) + np.where(np.abs(v) < flush, flush, LD(0)))


def log(a):
    with np.errstate(all="ignore"):
        v = np.log(a.v)
        mag = np.abs(a.v)
        e = np.where(a.e == 0, LD(0), np.where(a.e < mag, -np.log1p(-a.e / np.where(mag > 0, mag, 1)),
                                                LD(np.inf)))
        return EB(v, e + a._r(v))


def log1p(a):
    with np.errstate(all="ignore"):
        v = np.log1p(a.v)
        den = 1 + np.real(a.v) - a.e
        e = np.where(a.e == 0, LD(0), np.where(den > 0, a.e / np.where(den > 0, den, 1), LD(np.inf)))
        return EB(v, e + a._r(v))


def tanh(a):
    with np.errstate(all="ignore"):
        return _unary(a, np.tanh(a.v), LD(1))


def erfc(a):
    """erfc of real values (math.erfc in float64: far below float32 rounding)."""
    x = np.asarray(np.real(a.v), np.float64)
    v = (np.vectorize(math.erfc, otypes=[np.float64])(x) if x.size else x).astype(LD)
    slope = LD(2 / math.sqrt(math.pi))          # the largest |erfc'|
    with np.errstate(all="ignore"):
        return EB(v, _mul0(slope, a.e) + a._r(v) + LD(2.0 ** -52) * np.abs(v))


def cabs(a):
    """|a| for real data; the analytic continuation (sign of the real part)
    for the complex-step derivative."""
    s = np.where(np.real(a.v) < 0, -1, 1)
    return EB(a.v * s, a.e)


def where(cond, a, b):
    a, b = EB.of(a), EB.of(b)
    v = np.where(cond, a.v, b.v)
    return EB(v, np.where(cond, a.e, b.e))


def maximum_along(a, axis, keepdims=True):
    """The largest real part along axis (NaN if any is NaN), as an exact value."""
    with np.errstate(invalid="ignore"):
        m = np.max(np.real(a.v), axis=axis, keepdims=keepdims)
        e = np.max(a.e, axis=axis, keepdims=keepdims)
    return EB(m.astype(LD), e)


def matmul(a, b):
    a, b = EB.of(a), EB.of(b)
    with np.errstate(all="ignore"):
        v = a.v @ b.v
        k = a.v.shape[-1] if a.v.ndim else 1
        p = _AT[-1]
        mag = np.abs(a.v) @ np.abs(b.v)
        e = np.abs(a.v) @ b.e + a.e @ np.abs(b.v) + a.e @ b.e + p.u * k * mag + p.tiny * (k + 1)
        return EB(v, np.where(mag > p.big * MARGIN, LD(np.inf), e))


def powk(a, k):
    """|a|**k for a constant k > 0."""
    with np.errstate(all="ignore"):
        mag = np.abs(a.v)
        v = mag ** LD(k)
        slope = LD(k) * (mag + a.e) ** LD(k - 1) if k != 1 else LD(1)
        return EB(v, _mul0(slope, a.e) + a._r(v) * (2 + abs(k)))


# ---------------------------------------------------------------- the check

def _round_to(x, dtype):
    """longdouble values rounded to dtype (monotone), back as longdouble;
    16-bit types through float32, as cynorm stores them (README)."""
    dtype = np.dtype(dtype)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        y = np.asarray(x, LD).astype(np.float64)
        if dtype in (BF16, F16):
            y = y.astype(np.float32)
        return y.astype(dtype).astype(np.float64).astype(LD)


def judge(got, ref, dtype, safety=16.0, skip=None):
    """Elementwise: a boolean array, True where got (already of the right
    shape, any float dtype) is consistent with ref (EB) rounded to dtype."""
    g = ld(got)
    v = np.real(ref.v).astype(LD)
    with np.errstate(all="ignore"):
        # subnormal intermediates in another evaluation order lose bits: a slack of
        # 2**-20 of the smallest normal of the math type
        slack = LD(2) ** -1042 if np.dtype(dtype) == F64 else LD(2) ** -146
        e = ref.e * LD(safety) + PREC.get(np.dtype(dtype), P64).tiny + slack
        lo, hi = _round_to(v - e, dtype), _round_to(v + e, dtype)
        in_range = (lo <= g) & (g <= hi)
        ref_nonfinite = ~np.isfinite(v)
        ok_nonfinite = ~np.isfinite(g) & ~(np.isinf(v) & np.isinf(g) & (np.sign(v) != np.sign(g))
                                           & np.isfinite(e))
        big = LD(np.finfo(np.float32).max if np.dtype(dtype) in (BF16, F16) else
                 np.finfo(np.dtype(dtype)).max if np.dtype(dtype).kind == "f" else np.inf)
        vacuous = np.isfinite(v) & ~(e < big)         # a bound beyond the format: anything goes
        ok = np.where(ref_nonfinite, ok_nonfinite, in_range | vacuous)
    if skip is not None:
        ok = ok | np.broadcast_to(skip, ok.shape)
    return ok


def check(name, got, refs, dtype, shape=None, safety=16.0, skip=None):
    """Problems (a list of strings) of output `name`: its type, dtype, shape
    and values against `refs` (an EB or a list of alternative EBs: an
    element passes if it matches any)."""
    dtype = np.dtype(dtype)
    refs = refs if isinstance(refs, (list, tuple)) else [refs]
    shape = tuple(refs[0].v.shape) if shape is None else tuple(shape)
    if not isinstance(got, np.ndarray):
        return [f"{name}: expected an ndarray, got {type(got).__name__}"]
    if got.dtype != dtype:
        return [f"{name}: dtype {got.dtype}, expected {dtype}"]
    if got.shape != shape:
        return [f"{name}: shape {got.shape}, expected {shape}"]
    ok = np.zeros(shape, bool)
    for r in refs:
        ok |= judge(got, EB(np.broadcast_to(r.v, shape), np.broadcast_to(r.e, shape)), dtype, safety, skip)
    if ok.all():
        return []
    bad = np.argwhere(~ok) if ok.ndim else [()]
    i = tuple(bad[0])
    r = refs[0]
    rv = np.broadcast_to(np.real(r.v), shape)[i]
    re = np.broadcast_to(r.e, shape)[i] * LD(safety)
    return [f"{name}: {len(bad)} of {ok.size} values wrong, e.g. at {i}: got {got[i]!r}, "
            f"expected {float(rv):.9g} +- {float(re):.3g}"]


def same(name, got, expected):
    """Problems unless got equals expected exactly (data movement: no rounding)."""
    if not isinstance(got, np.ndarray):
        return [f"{name}: expected an ndarray, got {type(got).__name__}"]
    expected = np.asarray(expected)
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return [f"{name}: {got.dtype}{got.shape}, expected {expected.dtype}{expected.shape}"]
    floating = got.dtype.kind in "fc" or got.dtype == BF16
    a, b = (got.astype(np.float64), expected.astype(np.float64)) if got.dtype == BF16 else (got, expected)
    if not np.array_equal(a, b, equal_nan=floating):
        bad = np.argwhere(~((a == b) | (np.isnan(a) & np.isnan(b)))) if floating and a.ndim else []
        where = f" at {tuple(bad[0])}" if len(bad) else ""
        return [f"{name}: values differ from the expected data{where}"]
    return []


def f64_range_ok(sq, axis_n, dtype):
    """Groups whose data's squares stay in float64's normal range (always
    true for float32/16-bit data; float64 data beyond it are not judged).
    `sq` is a per-group bound of the largest square, axis_n the group size."""
    if np.dtype(dtype) != F64:
        return np.ones(np.shape(sq), bool)
    with np.errstate(all="ignore"):
        return (sq * max(axis_n, 1) < LD(1e300)) & ~((sq > 0) & (sq < LD(1e-290)))


# ---------------------------------------------------------------- statistics

def moments(X, axis, dtype):
    """(mean, biased var) of X (EB, exact data) along axis, keepdims, as
    cynorm computes them (stats_loops.pxi.tp): float64 sums of x - k and (x - k)^2
    for a shift k sampled from the group, the differences and squares formed
    in the math type and added a few at a time in it.  Error: a few u_m of
    the group's range (range^2 for the variance), plus n u_64."""
    n = math.prod(np.atleast_1d(X.shape)[list(np.atleast_1d(axis))]) if X.v.ndim else 1
    pm = math_prec(dtype)
    with np.errstate(all="ignore"):
        v = X.v
        # the mean from the group's first value k and the sum of v - k, as
        # the kernels shift: exact for constant data (a plain sum of many
        # equal values rounds even in long double, and its "variance" then
        # is that rounding)
        axes = tuple(int(a) % v.ndim for a in np.atleast_1d(axis)) if v.ndim else ()
        k = LD(0)
        if axes and n and v.size:
            moved = np.moveaxis(v, axes, range(v.ndim - len(axes), v.ndim))
            first = moved.reshape(moved.shape[:v.ndim - len(axes)] + (-1,))[..., :1]
            k = first.reshape([1 if i in axes else s for i, s in enumerate(v.shape)])
            k = np.where(np.isfinite(k), k, LD(0))
        mean = k + np.sum(v - k, axis=axis, keepdims=True) / LD(max(n, 1))
        d = v - mean
        var = np.sum(d * d, axis=axis, keepdims=True) / LD(max(n, 1))
        re = np.real(v)
        big = np.max(np.abs(re), axis=axis, keepdims=True, initial=0)
        rng = np.max(re, axis=axis, keepdims=True, initial=-np.inf) - np.min(
            re, axis=axis, keepdims=True, initial=np.inf) if re.size else big
        rng = np.where(np.isfinite(rng), rng, LD(np.inf))
        dev2 = np.max(np.abs(d) ** 2, axis=axis, keepdims=True, initial=0)
        u64 = P64.u * 4 * (n + 2)
        e_mean = 4 * pm.u * rng + u64 * big + P64.tiny
        e_var = 8 * pm.u * (np.abs(var) + rng * rng) + u64 * (np.abs(var) + dev2) + P64.tiny
    return EB(mean, e_mean), EB(var, e_var), big, dev2


def inv_sqrt(var, eps):
    with at(P64):
        return 1 / sqrt(var + eps)


def stat_variant(s, dtype):
    """A statistic as the library returns it (rounded to its dtype), exact from then on."""
    return EB(_round_to(np.real(s.v), dtype))


# ---------------------------------------------------------------- per-op references
#
# Each ref_* takes the arguments as the call got them (snapshots taken
# before it) and returns the expected outputs: a list with, per output,
# None (the output must be None) or Out(name, refs, dtype, shape, skip).

# Set by the runner for each case: float64 data reaching beyond [1e-150, 1e150]
# (squares and products of it leave float64's normal range: no promise, as in
# PyTorch), whose float64 outputs are then only checked for dtype and shape.
F64_EXTREME = False


def f64_extreme(arrays):
    for a in arrays:
        if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.dtype.itemsize == 8 and a.size \
                and a.size < 1 << 24:
            a = np.asarray(a)
            m = np.abs(a[np.isfinite(a)]).astype(np.float64)
            if m.size and (m.max() > 1e150 or ((m > 0) & (m < 1e-150)).any()):
                return True
    return False


class Out:
    def __init__(self, name, refs, dtype, shape=None, skip=None, exact=None):
        self.name, self.refs, self.dtype = name, refs, np.dtype(dtype)
        self.shape, self.skip, self.exact = shape, skip, exact

    def problems(self, got):
        if self.exact is not None:
            return same(self.name, got, self.exact)
        skip = True if (F64_EXTREME and self.dtype == F64) else self.skip
        return check(self.name, got, self.refs, self.dtype, self.shape, skip=skip)


def verify(expected, result, single=False):
    """Problems of `result` (op's return value) against the expected outputs."""
    if single:
        result = (result,)
    if not isinstance(result, tuple) or len(result) != len(expected):
        return [f"returned {type(result).__name__}"
                + (f" of length {len(result)}" if isinstance(result, tuple) else "")
                + f", expected a tuple of {len(expected)}" if not single else
                f"returned {type(result).__name__}"]
    problems = []
    for exp, got in zip(expected, result):
        if exp is None:
            if got is not None:
                problems.append(f"expected None, got {type(got).__name__}")
        else:
            problems += exp.problems(got)
    return problems


def data_dtype(x):
    """The dtype cynorm reads x as: np.asarray's, in native byte order
    (complex: a complex-step evaluation, where only values count)."""
    dt = np.asarray(x).dtype
    if dt.kind == "c":
        return F64
    return dt.newbyteorder("=") if dt.byteorder not in ("=", "|") else dt


def param_dtype(p, dt):
    """The dtype cynorm reads parameter p (a weight, bias or g) as, next to
    data of dtype dt: a list, tuple or Python number, which has no dtype of
    its own, as dt's math type; anything else as data_dtype reads it."""
    if isinstance(p, (list, tuple, float, int)):
        return STAT[dt]
    return data_dtype(p)


def _axis(d, ndim):
    return None if d is None else int(d) % max(ndim, 1)


def _keep_axes(ndim, dim):
    return tuple(i for i in range(ndim) if i != dim)


# ---- weight norm

def _p_norm(V, p, axes, pm=P64):
    """The p-norm of V over axes (keepdims): terms in the math type pm,
    float64 sums; and the largest |v|**p per group (the float64-range test)."""
    with np.errstate(all="ignore"):
        big = np.max(np.abs(np.real(V.v)), axis=axes, keepdims=True, initial=0) if V.v.size else \
            np.zeros([1 if i in axes else s for i, s in enumerate(V.v.shape)], LD)
    if math.isinf(p):
        m = np.max(np.abs(np.real(V.v)), axis=axes, keepdims=True, initial=0) if V.v.size else big
        if V.v.size:
            m = np.where(np.any(np.isnan(V.v), axis=axes, keepdims=True), LD(np.nan), m)
        return EB(m), np.zeros_like(big)
    with at(pm.wide()):
        terms = V * V if p == 2 else cabs(V) if p == 1 else powk(V, p)
    s = terms.ksum(axes, True, pm, wide=True)
    with at(P64):
        n = sqrt(s) if p == 2 else s if p == 1 else powk(s, 1.0 / p)
    with np.errstate(all="ignore"):
        return n, big ** LD(max(p, 1.0))


def ref_norm_except_dim(v, pow=2, dim=0):
    v = np.asarray(v)
    dt = data_dtype(v)
    d = _axis(dim, v.ndim)
    axes = tuple(range(v.ndim)) if d is None else _keep_axes(v.ndim, d)
    n, bigp = _p_norm(EB.of(v), float(pow), axes, math_prec(dt))
    shape = () if d is None else tuple(s if i == d else 1 for i, s in enumerate(v.shape))
    count = max(1, math.prod(v.shape) // max(1, (v.shape[d] if d is not None else 1)))
    skip = ~f64_range_ok(bigp, count, dt)
    return [Out("norm", n.reshape(shape), dt, shape, skip.reshape(shape) if skip.size else None)]


def _wn_parts(v, g, dim):
    v = np.asarray(v)
    dt = data_dtype(v)
    d = _axis(dim, v.ndim)
    axes = tuple(range(v.ndim)) if d is None else _keep_axes(v.ndim, d)
    kshape = tuple(1 for _ in v.shape) if d is None else tuple(
        s if i == d else 1 for i, s in enumerate(v.shape))
    V = EB.of(v)
    G = EB.of(np.asarray(g).reshape(kshape))
    norm, bigp = _p_norm(V, 2.0, axes, math_prec(dt))
    count = max(1, v.size // max(1, (v.shape[d] if d is not None else 1)))
    return v, dt, d, axes, kshape, V, G, norm, ~f64_range_ok(bigp, count, dt)


def ref_weight_norm_interface(v, g, dim=0):
    v, dt, d, axes, kshape, V, G, norm, skip = _wn_parts(v, g, dim)
    pm, sd = math_prec(dt), STAT[dt]

    def w_from(nrm):
        with at(P64):
            scale = G / nrm
        with at(pm):
            return V * scale.rounded()
    w = [w_from(norm), w_from(stat_variant(norm, sd))]
    gshape = np.shape(g)
    return [Out("w", w, dt, v.shape, skip),
            Out("norm", norm.reshape(gshape), sd, gshape, skip.reshape(gshape) if skip.size else None)]


def ref_weight_norm(v, g, dim=0):
    return ref_weight_norm_interface(v, g, dim)[:1]


def ref_weight_norm_backward(grad_w, saved_v, saved_g, saved_norm, dim=0):
    v, dt, d, axes, kshape, V, G, _, skip = _wn_parts(saved_v, saved_g, dim)
    pm = math_prec(dt)
    GW = EB.of(np.asarray(grad_w))
    N = EB.of(np.asarray(saved_norm).reshape(kshape))
    with at(pm):              # a gradient sum: its float32 terms may overflow (not judged then)
        prods = GW * V
    s = prods.ksum(axes, True, pm)
    with at(P64):
        grad_g = s / N
        a = G / N
        b = G * grad_g / (N * N)
    with at(pm):
        grad_v = GW * a.rounded() - V * b.rounded()
    g = np.asarray(saved_g)
    return [Out("grad_v", grad_v, dt, v.shape, skip),
            Out("grad_g", grad_g.reshape(g.shape), param_dtype(saved_g, dt), g.shape,
                skip.reshape(g.shape) if skip.size else None)]


# ---- layer norm

def _ln_rows(x, normalized_shape):
    x = np.asarray(x)
    k = 1 if np.ndim(normalized_shape) == 0 else len(tuple(normalized_shape))
    lead = x.shape[:x.ndim - k]
    M, N = math.prod(lead), math.prod(x.shape[x.ndim - k:])
    return x, lead, k, M, N


def ref_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    x, lead, k, M, N = _ln_rows(x, normalized_shape)
    dt = data_dtype(x)
    pm, sd = math_prec(dt), STAT[dt]
    stat_shape = lead + (1,) * k
    if N == 0 or M == 0:
        mean = EB(np.zeros(stat_shape, LD))
        rstd = EB(np.full(stat_shape, np.nan if M else 0, LD))
        return [Out("y", EB(np.zeros(x.shape, LD)), dt, x.shape), Out("mean", mean, sd, stat_shape),
                Out("rstd", rstd, sd, stat_shape)]
    X = EB.of(x).reshape(M, N)
    mean, var, big, dev2 = moments(X, 1, dt)
    rstd = inv_sqrt(var, float(eps))
    W = None if weight is None else EB.of(np.asarray(weight).reshape(1, N))
    B = None if bias is None else EB.of(np.asarray(bias).reshape(1, N))

    def y_from(mu, rs):
        with at(pm):
            y = (X - mu.rounded()) * rs.rounded()
            if W is not None:
                y = y * W
            if B is not None:
                y = y + B
        return y.reshape(x.shape)
    skip = ~f64_range_ok(np.maximum(big * big, dev2), N, dt)
    ys = [y_from(mean, rstd), y_from(stat_variant(mean, sd), stat_variant(rstd, sd))]
    yskip = np.broadcast_to(skip, (M, N)).reshape(x.shape)
    return [Out("y", ys, dt, x.shape, yskip),
            Out("mean", mean.reshape(stat_shape), sd, stat_shape, skip.reshape(stat_shape)),
            Out("rstd", rstd.reshape(stat_shape), sd, stat_shape, skip.reshape(stat_shape))]


def ref_layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight=None, bias=None,
                            output_mask=(True, True, True)):
    return _ref_row_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias,
                                  output_mask)


def _ref_row_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    """Layer norm's backward outputs, or (mean None: rows not centered) RMS
    norm's, whose output_mask has two entries."""
    x, lead, k, M, N = _ln_rows(x, normalized_shape)
    dt = data_dtype(x)
    pm, sd = math_prec(dt), STAT[dt]
    ns = x.shape[x.ndim - k:]
    X = EB.of(x).reshape(M, N)
    DY = EB.of(np.asarray(grad_out)).reshape(M, N)
    # the saved statistics, as the kernel reads them (rounded to the stats dtype)
    rs = EB(_round_to(ld(rstd).reshape(M, 1), sd))
    W = EB(np.ones((1, N), LD)) if weight is None else EB.of(np.asarray(weight).reshape(1, N))
    centered = mean is not None
    with at(pm):
        xc = X - EB(_round_to(ld(mean).reshape(M, 1), sd)) if centered else X
        xhat = xc * rs
        g = DY * W
        gx_terms = g * xhat
        dyx = DY * xhat
    Bm = gx_terms.ksum(1, True, pm) / max(N, 1)
    gw = dyx.ksum(0, False, pm)
    gb = DY.ksum(0, False, pm) if centered else None
    with at(pm):
        gx = rs * (g - g.ksum(1, True, pm) / max(N, 1) - xhat * Bm) if centered else \
            rs * (g - xhat * Bm)
        # kernels may form dy * w * (x - mean) before scaling by rstd: rows where
        # that overflows the math type are not judged
        raw = g * xc
        raw2 = rs * rs * g
        raw3 = raw2 * rs * xc
    rowbad = np.any(~np.isfinite(raw.e) | ~np.isfinite(raw2.e) | ~np.isfinite(raw3.e), axis=1,
                    keepdims=True) if raw.e.size else np.zeros((M, 1), bool)
    gx = EB(gx.v, np.where(rowbad, LD(np.inf), gx.e))
    skip = ~f64_range_ok(np.max(np.abs(X.v) ** 2, axis=1, keepdims=True, initial=0), N, dt) \
        if M and N else np.zeros((M, 1), bool)
    out = []
    if output_mask[0]:
        out.append(Out("grad_x", gx.reshape(x.shape) if M and N else EB(np.zeros(x.shape, LD)), dt,
                       x.shape, np.broadcast_to(skip, (M, N)).reshape(x.shape) if M and N else None))
    else:
        out.append(None)
    sums = (("grad_weight", gw, 1, weight),) + ((("grad_bias", gb, 2, bias),) if centered else ())
    for name, val, i, p in sums:
        if not output_mask[i]:
            out.append(None)
            continue
        odt = param_dtype(p, dt) if p is not None else dt
        v = val.reshape(ns) if M and N else EB(np.zeros(ns, LD))
        out.append(Out(name, v, odt, ns, None if np.all(~skip) else True))
    return out


# ---- batch norm

def mean_square(X, axis, dtype):
    """mean(x^2) of X (EB, exact data) along axis, keepdims, as cynorm computes
    RMS norm's (stats_loops.pxi.tp, unshifted): squares formed in the math type
    and added a few at a time in it, then float64 sums.  Error: a few u_m of
    the result, plus n u_64 and the squares' underflow."""
    n = X.v.shape[axis]
    pm = math_prec(dtype)
    with np.errstate(all="ignore"):
        v = np.real(X.v)
        ms = np.sum(v * v, axis=axis, keepdims=True) / LD(max(n, 1))
        e = 8 * pm.u * ms + P64.u * 4 * (n + 2) * ms + LD(n) * pm.tiny + P64.tiny
    return EB(ms, e)


def ref_rms_norm(x, normalized_shape, weight=None, eps=None):
    x, lead, k, M, N = _ln_rows(x, normalized_shape)
    dt = data_dtype(x)
    pm, sd = math_prec(dt), STAT[dt]
    if eps is None:
        eps = np.finfo(np.float64 if dt == F64 else np.float32).eps
    stat_shape = lead + (1,) * k
    if N == 0 or M == 0:
        rstd = EB(np.full(stat_shape, np.nan if M else 0, LD))
        return [Out("y", EB(np.zeros(x.shape, LD)), dt, x.shape), Out("rstd", rstd, sd, stat_shape)]
    X = EB.of(x).reshape(M, N)
    rstd = inv_sqrt(mean_square(X, 1, dt), float(eps))
    W = None if weight is None else EB.of(np.asarray(weight).reshape(1, N))

    def y_from(rs):
        with at(pm):
            y = X * rs.rounded()
            if W is not None:
                y = y * W
        return y.reshape(x.shape)
    big = np.max(np.abs(np.real(X.v)), axis=1, keepdims=True, initial=0)
    skip = ~f64_range_ok(big * big, N, dt)
    ys = [y_from(rstd), y_from(stat_variant(rstd, sd))]
    yskip = np.broadcast_to(skip, (M, N)).reshape(x.shape)
    return [Out("y", ys, dt, x.shape, yskip),
            Out("rstd", rstd.reshape(stat_shape), sd, stat_shape, skip.reshape(stat_shape))]


def ref_rms_norm_backward(grad_out, x, normalized_shape, rstd, weight=None,
                          output_mask=(True, True)):
    return _ref_row_norm_backward(grad_out, x, normalized_shape, None, rstd, weight, None,
                                  output_mask)


def stored_sum(x, residual):
    """x + residual as cynorm stores h: the math type's sum rounded to x's
    dtype (16-bit: a float32 sum, then one rounding)."""
    x, r = np.asarray(x), np.asarray(residual)
    dt = data_dtype(x)
    with np.errstate(all="ignore"):
        if dt in (BF16, F16):
            return (x.astype(np.float32) + r.astype(np.float32)).astype(dt)
        return (x.astype(dt) + r.astype(dt)).astype(dt)


def ref_add_layer_norm(x, residual, normalized_shape, weight=None, bias=None, eps=1e-5):
    h = stored_sum(x, residual)
    y, mean, rstd = ref_layer_norm(h, normalized_shape, weight, bias, eps)
    return [y, Out("h", None, h.dtype, h.shape, exact=h), mean, rstd]


def ref_add_rms_norm(x, residual, normalized_shape, weight=None, eps=None):
    h = stored_sum(x, residual)
    y, rstd = ref_rms_norm(h, normalized_shape, weight, eps)
    return [y, Out("h", None, h.dtype, h.shape, exact=h), rstd]


# the 16-bit storage formats with their largest finite values: a value stored
# beyond them is inf (an element near that is not judged)
STORED = {BF16: Prec("bfloat16", 2.0 ** -8, 2.0 ** -134, 3.3895313892515355e38),
          F16: Prec("float16", 2.0 ** -11, 2.0 ** -25, 65504.0), F32: P32, F64: P64}


def _plus_grad_h(outs, grad_h):
    """The backward's expected outputs with grad_h added to grad_x: after its
    rounding to the storage type, in the math type (the unfused composition's
    two roundings)."""
    gx = outs[0]
    if grad_h is None or gx is None:
        return outs
    refs = gx.refs if isinstance(gx.refs, (list, tuple)) else [gx.refs]
    DH = EB.of(np.asarray(grad_h)).reshape(tuple(gx.shape))
    summed = []
    for r in refs:
        with at(STORED[gx.dtype]):
            stored = r.rounded()
        with at(math_prec(gx.dtype)):
            summed.append(stored + DH)
    return [Out(gx.name, summed, gx.dtype, gx.shape, gx.skip)] + list(outs[1:])


def ref_add_layer_norm_backward(grad_out, grad_h, h, normalized_shape, mean, rstd, weight=None,
                                bias=None, output_mask=(True, True, True)):
    return _plus_grad_h(ref_layer_norm_backward(grad_out, h, normalized_shape, mean, rstd,
                                                weight, bias, output_mask), grad_h)


def ref_add_rms_norm_backward(grad_out, grad_h, h, normalized_shape, rstd, weight=None,
                              output_mask=(True, True)):
    return _plus_grad_h(ref_rms_norm_backward(grad_out, h, normalized_shape, rstd, weight,
                                              output_mask), grad_h)


def channels(a, axis):
    """a as (C, n) rows: the channel axis first, the rest flattened."""
    a = np.asarray(a)
    ax = axis % a.ndim
    C = a.shape[ax]
    n = math.prod(s for i, s in enumerate(a.shape) if i != ax)
    return EB.of(np.moveaxis(a, ax, 0).reshape(C, n)), ax


def from_channels(rows, shape, ax):
    moved = (shape[ax],) + tuple(s for i, s in enumerate(shape) if i != ax)
    return EB(np.moveaxis(rows.v.reshape(moved), 0, ax), np.moveaxis(rows.e.reshape(moved), 0, ax))


def expand_skip(skip, shape, ax):
    """A per-channel (C, 1) mask as a mask of x's shape."""
    C = shape[ax]
    n = math.prod(shape) // C if C else 0
    rows = np.broadcast_to(np.asarray(skip, bool).reshape(C, 1), (C, n))
    moved = (C,) + tuple(s for i, s in enumerate(shape) if i != ax)
    return np.moveaxis(rows.reshape(moved), 0, ax)


def _vec(a, C, fill):
    return EB(np.full((C, 1), fill, LD)) if a is None else EB.of(np.asarray(a).reshape(C, 1))


def _normalize(X, m, s, t, pm):
    """(x - m) * s + t with float64 coefficients rounded to the math type."""
    with at(pm):
        return (X - m.rounded()) * s.rounded() + t.rounded()


def bn_forward_rows(x, weight, bias, running_mean, running_var, training, momentum, eps, axis):
    """The expected (y rows, save_mean, save_invstd, new rm, new rv, skip) of batch_norm."""
    x = np.asarray(x)
    dt = data_dtype(x)
    pm, sd = math_prec(dt), STAT[dt]
    X, ax = channels(x, axis)
    C, n = X.shape
    W, B = _vec(weight, C, 1.0), _vec(bias, C, 0.0)
    if training:
        if n == 0:
            nan = EB(np.full((C, 1), np.nan, LD))
            return X, nan, nan, None, None, np.zeros((C, 1), bool)
        mean, var, big, dev2 = moments(X, 1, dt)
        inv = inv_sqrt(var, eps)
        skip = ~f64_range_ok(np.maximum(big * big, dev2), n, dt)

        def y_from(mu, iv):
            with at(P64):
                s = iv * W
            return _normalize(X, mu, s, B, pm)
        ys = [y_from(mean, inv), y_from(stat_variant(mean, sd), stat_variant(inv, sd))]
        rm = rv = None
        with at(P64):
            if running_mean is not None:
                rm = momentum * mean + (1.0 - momentum) * EB.of(np.asarray(running_mean).reshape(C, 1))
            if running_var is not None:
                rv = momentum * (var * (n / (n - 1))) + (1.0 - momentum) * EB.of(
                    np.asarray(running_var).reshape(C, 1))
        return ys, mean, inv, rm, rv, skip
    RM = EB.of(np.asarray(running_mean).reshape(C, 1))
    RV = EB.of(np.asarray(running_var).reshape(C, 1))
    inv = inv_sqrt(RV, eps)
    with at(P64):
        s = inv * W
    return [_normalize(X, RM, s, B, pm)], None, None, None, None, np.zeros((C, 1), bool)


def ref_batch_norm(x, weight=None, bias=None, running_mean=None, running_var=None, training=True,
                   momentum=0.1, eps=1e-5, axis=1):
    x = np.asarray(x)
    dt = data_dtype(x)
    sd = STAT[dt]
    ys, mean, inv, rm, rv, skip = bn_forward_rows(x, weight, bias, running_mean, running_var,
                                                  training, float(momentum), float(eps), axis)
    ax = axis % x.ndim
    C = x.shape[ax]
    yskip = expand_skip(skip, x.shape, ax)
    ys = ys if isinstance(ys, list) else [ys]
    out = [Out("y", [from_channels(y, x.shape, ax) for y in ys], dt, x.shape, yskip)]
    if training:
        out += [Out("save_mean", mean.reshape(C), sd, (C,), skip.reshape(C)),
                Out("save_invstd", inv.reshape(C), sd, (C,), skip.reshape(C))]
    else:
        out += [Out("save_mean", EB(np.zeros(0, LD)), sd, (0,)),
                Out("save_invstd", EB(np.zeros(0, LD)), sd, (0,))]
    return out, rm, rv, skip


def running_checks(name, before, after_ref, after, skip):
    """Problems of an in-place running statistic (after_ref None: unchanged)."""
    if not isinstance(before, np.ndarray) or not isinstance(after, np.ndarray):
        return []
    if F64_EXTREME and data_dtype(before) == F64 and after_ref is not None:
        skip = True
    if after_ref is None:
        return same(name + " (in place)", after, before)
    b = np.asarray(before)
    return check(name + " (in place)", after, after_ref.reshape(b.shape), data_dtype(b), b.shape,
                 skip=np.reshape(skip, b.shape) if np.ndim(skip) else skip)


def ref_bn_backward_core(grad_out, x, weight, mean, inv, training, axis, n_total=None,
                         sums=None):
    """grad_x (EB, x's shape), dotp and sum_dy (EB, (C, 1)) of
    grad_x = (dy - sum_dy/N - (x - mean) inv^2 dotp/N) inv w   (training)
    grad_x = dy inv w                                          (inference)."""
    x = np.asarray(x)
    dt = data_dtype(x)
    pm = math_prec(dt)
    X, ax = channels(x, axis)
    DY, _ = channels(grad_out, axis)
    C, n = X.shape
    M = EB.of(np.asarray(mean, np.float64).reshape(C, 1)) if not isinstance(mean, EB) else mean
    I = EB.of(np.asarray(inv, np.float64).reshape(C, 1)) if not isinstance(inv, EB) else inv
    W = _vec(weight, C, 1.0)
    with at(pm):              # gradient sums: their float32 terms may overflow (not judged then)
        prod = DY * (X - M.rounded())
    dotp = prod.ksum(1, True, pm)
    sum_dy = DY.ksum(1, True, pm)
    if sums is not None:
        sum_dy, dotp = sums
    N = n if n_total is None else n_total
    with at(P64):
        a = I * W
        if training:
            p = sum_dy / N
            q = dotp / N * I * I
    with at(pm):
        if training:
            gx = (DY - p.rounded() - (X - M.rounded()) * q.rounded()) * a.rounded()
        else:
            gx = DY * a.rounded()
    return from_channels(gx, x.shape, ax), dotp, sum_dy, C, n


def ref_batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd,
                            training, eps=1e-5, output_mask=(True, True, True), axis=1):
    x = np.asarray(x)
    dt = data_dtype(x)
    sd = STAT[dt]
    ax = axis % x.ndim
    C = x.shape[ax]
    if training:
        mean, inv = save_mean, save_invstd
    else:
        mean = np.asarray(running_mean)
        inv = inv_sqrt(EB.of(np.asarray(running_var).reshape(C, 1)), float(eps))
    gx, dotp, sum_dy, C, n = ref_bn_backward_core(grad_out, x, weight, mean, inv, training, axis)
    Iv = inv if isinstance(inv, EB) else EB.of(np.asarray(inv, np.float64).reshape(C, 1))
    with at(P64):
        gw = dotp * Iv if n else EB(np.zeros((C, 1), LD))
    gdt = param_dtype(weight, dt) if weight is not None else sd
    X, _ = channels(x, axis)
    big = np.max(np.abs(X.v), axis=1, initial=0) if X.v.size else np.zeros(C, LD)
    skip = ~f64_range_ok(big * big, n, dt)
    out = [Out("grad_x", gx, dt, x.shape) if output_mask[0] else None,
           Out("grad_weight", gw.reshape(C), gdt, (C,), skip) if output_mask[1] else None,
           Out("grad_bias", (sum_dy if n else EB(np.zeros((C, 1), LD))).reshape(C), gdt, (C,))
           if output_mask[2] else None]
    return out


def ref_batch_norm_stats(x, eps=1e-5, axis=1):
    x = np.asarray(x)
    dt = data_dtype(x)
    sd = STAT[dt]
    X, _ = channels(x, axis)
    C, n = X.shape
    if n == 0:
        nan = EB(np.full(C, np.nan, LD))
        return [Out("mean", nan, sd, (C,)), Out("invstd", nan, sd, (C,))]
    mean, var, big, dev2 = moments(X, 1, dt)
    inv = inv_sqrt(var, float(eps))
    skip = ~f64_range_ok(np.maximum(big * big, dev2), n, dt).reshape(C)
    return [Out("mean", mean.reshape(C), sd, (C,), skip), Out("invstd", inv.reshape(C), sd, (C,), skip)]


def ref_batch_norm_elemt(x, weight, bias, mean, invstd, eps=1e-5, axis=1):
    x = np.asarray(x)
    dt = data_dtype(x)
    X, ax = channels(x, axis)
    C = X.shape[0]
    M = EB.of(np.asarray(mean).reshape(C, 1))
    I = EB.of(np.asarray(invstd).reshape(C, 1))
    with at(P64):
        s = I * _vec(weight, C, 1.0)
    y = _normalize(X, M, s, _vec(bias, C, 0.0), math_prec(dt))
    return [Out("y", from_channels(y, x.shape, ax), dt, x.shape)]


def ref_batch_norm_backward_reduce(grad_out, x, mean, invstd, weight, input_g=True, weight_g=True,
                                   bias_g=True, axis=1):
    x = np.asarray(x)
    dt = data_dtype(x)
    sd = STAT[dt]
    _, dotp, sum_dy, C, n = ref_bn_backward_core(grad_out, x, weight, mean, invstd, True, axis)
    if n == 0:
        dotp = sum_dy = EB(np.zeros((C, 1), LD))
    I = EB.of(np.asarray(invstd).reshape(C, 1))
    with at(P64):
        gw = dotp * I
    gdt = param_dtype(weight, dt) if weight is not None else sd
    return [Out("sum_dy", sum_dy.reshape(C), sd, (C,)) if input_g else None,
            Out("sum_dy_xmu", dotp.reshape(C), sd, (C,)) if input_g else None,
            Out("grad_weight", gw.reshape(C), gdt, (C,)) if weight_g else None,
            Out("grad_bias", sum_dy.reshape(C), gdt, (C,)) if bias_g else None]


def ref_batch_norm_backward_elemt(grad_out, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count,
                                  axis=1):
    x = np.asarray(x)
    dt = data_dtype(x)
    X, ax = channels(x, axis)
    C = X.shape[0]
    total = float(np.sum(np.asarray(count, np.float64)))
    sums = (EB.of(np.asarray(sum_dy).reshape(C, 1)), EB.of(np.asarray(sum_dy_xmu).reshape(C, 1)))
    gx, _, _, _, _ = ref_bn_backward_core(grad_out, x, weight, mean, invstd, True, axis,
                                          n_total=total, sums=sums)
    return [Out("grad_x", gx, dt, x.shape)]


# ---------------------------------------------------------------- group norm

def _grouped(a, G, ax):
    """a (x's shape) as EB rows (N * G, D, HW): each sample's groups."""
    a = np.asarray(a)
    first = np.moveaxis(a, ax, 1)
    N, C = first.shape[:2]
    return EB.of(first.reshape(N * G, C // G, -1))


def _ungrouped(rows, shape, ax):
    moved = (shape[0], shape[ax]) + tuple(s for i, s in enumerate(shape) if i not in (0, ax))
    return EB(np.moveaxis(rows.v.reshape(moved), 1, ax), np.moveaxis(rows.e.reshape(moved), 1, ax))


def _group_param(a, N, G, D, fill):
    """A per-channel weight or bias as (N * G, D, 1), each sample's copy."""
    v = np.full(G * D, fill, LD) if a is None else np.asarray(a, np.float64).reshape(G * D)
    return EB.of(np.tile(v.reshape(G, D), (N, 1)).reshape(N * G, D, 1))


def _group_dims(x, num_groups, axis):
    ax = axis % x.ndim
    N, C = x.shape[0], x.shape[ax]
    G = int(num_groups)
    HW = math.prod(s for i, s in enumerate(x.shape) if i not in (0, ax))
    return ax, N, C, G, C // G if G else 0, HW


def ref_group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, axis=1, given=None):
    """group_norm's (y, mean, rstd); given: (mean, rstd) per (n, g) that
    normalize instead (instance norm from running statistics)."""
    x = np.asarray(x)
    dt = data_dtype(x)
    pm, sd = math_prec(dt), STAT[dt]
    ax, N, C, G, D, HW = _group_dims(x, num_groups, axis)
    if N * C == 0 or HW == 0:
        mean = EB(np.zeros((N, G), LD))
        rstd = EB(np.full((N, G), np.nan, LD))
        if given is not None:
            mean, rstd = (EB.of(np.asarray(a, np.float64).reshape(N, G)) for a in given)
        return [Out("y", EB(np.zeros(x.shape, LD)), dt, x.shape), Out("mean", mean, sd, (N, G)),
                Out("rstd", rstd, sd, (N, G))]
    X = _grouped(x, G, ax)
    W, B = _group_param(weight, N, G, D, 1.0), _group_param(bias, N, G, D, 0.0)
    if given is None:
        mean, var, big, dev2 = moments(X, (1, 2), dt)
        inv = inv_sqrt(var, float(eps))
        skip = ~f64_range_ok(np.maximum(big * big, dev2), D * HW, dt)
    else:
        mean, inv = (EB.of(np.asarray(a, np.float64).reshape(N * G, 1, 1)) for a in given)
        skip = np.zeros((N * G, 1, 1), bool)

    def y_from(mu, iv):
        with at(P64):
            s = iv * W
        return _ungrouped(_normalize(X, mu, s, B, pm), x.shape, ax)
    ys = [y_from(mean, inv)]
    if given is None:
        ys.append(y_from(stat_variant(mean, sd), stat_variant(inv, sd)))
    yskip = np.moveaxis(np.broadcast_to(skip, X.shape).reshape(
        (N, C) + tuple(s for i, s in enumerate(x.shape) if i not in (0, ax))), 1, ax)
    return [Out("y", ys, dt, x.shape, yskip),
            Out("mean", mean.reshape(N, G), sd, (N, G), skip.reshape(N, G)),
            Out("rstd", inv.reshape(N, G), sd, (N, G), skip.reshape(N, G))]


def ref_group_norm_backward(grad_out, x, mean, rstd, weight, num_groups,
                            output_mask=(True, True, True), axis=1, fixed=False):
    """group_norm_backward's (grad_x, grad_weight, grad_bias) from the saved
    statistics as the kernels read them (rounded to the stat dtype):
    grad_x = (dy * k - p) - (x - mean) * q per instance with k = w r,
    p = mean_g(w dy) r, q = mean_g(w dy (x - mean)) r^3 (fixed: p = q = 0)."""
    x = np.asarray(x)
    dt = data_dtype(x)
    pm, sd = math_prec(dt), STAT[dt]
    ax, N, C, G, D, HW = _group_dims(x, num_groups, axis)
    gdt = param_dtype(weight, dt) if weight is not None else dt
    if N * C == 0 or HW == 0:
        gx = EB(np.zeros(x.shape, LD))
        gw = gb = EB(np.zeros(C, LD))
    else:
        X, DY = _grouped(x, G, ax), _grouped(grad_out, G, ax)
        M = EB(_round_to(np.asarray(mean, np.float64), sd).astype(LD).reshape(N * G, 1, 1))
        I = EB(_round_to(np.asarray(rstd, np.float64), sd).astype(LD).reshape(N * G, 1, 1))
        W = _group_param(weight, N, G, D, 1.0)
        with at(pm):          # gradient sums: their float32 terms may overflow (not judged then)
            prod = DY * (X - M)
        s2 = prod.ksum(2, True, pm)
        s1 = DY.ksum(2, True, pm)
        with at(P64):
            gw = (s2 * I).reshape(N, C).sum(axis=0)
            gb = s1.reshape(N, C).sum(axis=0)
            k = W * I
            if fixed:
                p = q = EB(np.zeros((N * G, 1, 1), LD))
            else:
                p = (W * s1).sum(axis=1, keepdims=True) / (D * HW) * I
                q = (W * s2).sum(axis=1, keepdims=True) / (D * HW) * I * I * I
        with at(pm):
            gx = DY * k.rounded() - p.rounded()
            if not fixed:
                gx = gx - (X - M) * q.rounded()
        gx = _ungrouped(gx, x.shape, ax)
    return [Out("grad_x", gx, dt, x.shape) if output_mask[0] else None,
            Out("grad_weight", gw, gdt, (C,)) if output_mask[1] else None,
            Out("grad_bias", gb, gdt, (C,)) if output_mask[2] else None]


def ref_instance_norm(x, weight=None, bias=None, running_mean=None, running_var=None,
                      use_input_stats=True, momentum=0.1, eps=1e-5, axis=1):
    """instance_norm's (y, mean, rstd) and the running statistics after it
    (None: unchanged)."""
    x = np.asarray(x)
    ax = axis % x.ndim
    N, C = x.shape[0], x.shape[ax]
    HW = math.prod(s for i, s in enumerate(x.shape) if i not in (0, ax))
    if not use_input_stats:
        rm = np.asarray(running_mean, np.float64)
        with np.errstate(all="ignore"):
            r = 1.0 / np.sqrt(np.asarray(running_var, np.float64) + float(eps))
        given = (np.tile(rm, N), np.tile(r, N))
        return ref_group_norm(x, C, weight, bias, eps, axis, given), None, None
    outs = ref_group_norm(x, C, weight, bias, eps, axis)
    rm = rv = None
    if N * C and HW > 1:
        X = _grouped(x, C, ax)
        mean, var, _, _ = moments(X, (1, 2), data_dtype(x))
        with at(P64):
            if running_mean is not None:
                rm = momentum * mean.reshape(N, C).mean(axis=0) + (1.0 - momentum) * EB.of(
                    np.asarray(running_mean).reshape(C))
            if running_var is not None:
                rv = momentum * (var.reshape(N, C).mean(axis=0) * (HW / (HW - 1))) + (
                    1.0 - momentum) * EB.of(np.asarray(running_var).reshape(C))
    return outs, rm, rv


def ref_instance_norm_backward(grad_out, x, mean, rstd, weight=None, use_input_stats=True,
                               output_mask=(True, True, True), axis=1):
    x = np.asarray(x)
    C = x.shape[axis % x.ndim]
    return ref_group_norm_backward(grad_out, x, mean, rstd, weight, C, output_mask, axis,
                                   fixed=not use_input_stats)


def ref_batch_norm_gather_stats(mean, invstd, counts, running_mean=None, running_var=None,
                                momentum=0.1, eps=1e-5):
    m = np.asarray(mean)
    odt = data_dtype(m) if data_dtype(m).itemsize >= 4 else F32
    W, C = m.shape
    c = np.asarray(counts, np.float64).reshape(-1)
    keep = c > 0
    Mk = EB.of(m[keep])
    Ik = EB.of(np.asarray(invstd)[keep])
    ck = EB.of(c[keep].reshape(-1, 1))
    total = float(np.sum(c[keep]))
    if total == 0:
        nan = EB(np.full(C, np.nan, LD))
        return [Out("mean", nan, odt, (C,)), Out("invstd", nan, odt, (C,))], None, None
    with at(P64):
        mu = (ck * Mk).sum(0, keepdims=True) / total
        var_k = 1 / (Ik * Ik) - float(eps)
        d = Mk - mu
        m2 = (ck * (var_k + d * d)).sum(0, keepdims=True)
        var = m2 / total
        inv = 1 / sqrt(var + float(eps))
        rm = rv = None
        if running_mean is not None:
            mom = float(momentum)
            rm = mom * mu + (1.0 - mom) * EB.of(np.asarray(running_mean).reshape(1, C))
            rv = mom * (var * (total / (total - 1))) + (1.0 - mom) * EB.of(
                np.asarray(running_var).reshape(1, C))
    # Chan's pairwise merge in float64 instead of this direct sum: W more roundings
    widen = LD(W + 2)
    mu, inv = EB(mu.v, mu.e * widen), EB(inv.v, inv.e * widen)
    # a shard whose invstd exceeds 1/sqrt(eps) has a negative variance, one with invstd 0
    # or a non-finite mean an infinite one: the merged invstd is then 0 or NaN, either way
    with np.errstate(invalid="ignore"):
        bad = (np.any(~(np.real(var_k.v) - var_k.e > 0), axis=0)
               | np.any(~np.isfinite(np.real(Mk.v)) | (np.real(Ik.v) == 0), axis=0)) \
            if var_k.v.size else np.zeros(C, bool)
    return [Out("mean", mu.reshape(C), odt, (C,)), Out("invstd", inv.reshape(C), odt, (C,), skip=bad)], \
        (None if rm is None else EB(rm.v, rm.e * widen)), (None if rv is None else EB(rv.v, rv.e * widen))


# ---- softmax family (NumPy in the math dtype)

def _sm_dim(x, dim):
    return None if np.ndim(x) == 0 else int(dim) % np.ndim(x)


def ref_softmax(x, dim, half_to_float=False, log=False):
    x = np.asarray(x)
    dt = data_dtype(x)
    out_dt = F32 if half_to_float else dt
    pm = math_prec(dt)
    d = _sm_dim(x, dim)
    X = EB.of(x)
    if x.size == 0:
        return [Out("out", EB(np.zeros(x.shape, LD)), out_dt, x.shape)]
    s = X - maximum_along(X, d) if d is not None else X - EB(np.real(X.v))
    with at(pm):
        s = s.rounded()
        e = exp(s)
        tot = e.sum(d, keepdims=True) if d is not None else e
        y = s - log_(tot) if log else e / tot
    return [Out("out", y, out_dt, x.shape)]


def log_(a):
    return log(a)


def _input_dtype(output, input_dtype):
    return np.dtype(input_dtype)


def ref_softmax_backward_data(grad_output, output, dim, input_dtype, log=False):
    y = np.asarray(output)
    dt = data_dtype(y)
    pm = math_prec(dt)
    d = _sm_dim(y, dim)
    G, Y = EB.of(np.asarray(grad_output)), EB.of(y)
    with at(pm):
        if log:
            sg = G.sum(d, keepdims=True) if d is not None else G
            r = G - exp(Y) * sg
        else:
            gy = G * Y
            sgy = gy.sum(d, keepdims=True) if d is not None else gy
            r = Y * (G - sgy)
    return [Out("grad_input", r, _input_dtype(y, input_dtype), y.shape)]


# ---- nll losses (float64 sums, rounded to x's dtype)

def _nll_parts(x, target, weight, ignore_index, two_d):
    x = np.asarray(x)
    t = np.asarray(target).reshape(-1).astype(np.int64)
    if x.ndim == 1:
        rows, C = x.reshape(1, x.shape[0]), x.shape[0]
    else:
        C = x.shape[1]
        rows = np.moveaxis(x, 1, -1).reshape(t.size, C)
    valid = t != int(ignore_index)
    tt = np.where(valid, t, 0)
    K = t.size
    picked = np.zeros(K, LD)
    if C:
        picked = np.where(valid, ld(rows[np.arange(K), tt]), LD(0)) if K else picked
    w = np.ones(K, LD) if weight is None else (np.where(valid, ld(np.asarray(weight))[tt], LD(0))
                                               if C and K else np.zeros(K, LD))
    w = np.where(valid, w, LD(0))
    return x, t, valid, tt, rows, C, K, EB(picked), EB(w)


def ref_nll_loss_forward(x, target, weight=None, reduction="mean", ignore_index=-100, two_d=False):
    x, t, valid, tt, rows, C, K, P, Wt = _nll_parts(x, target, weight, ignore_index, two_d)
    dt = data_dtype(x)
    r = {"none": 0, "mean": 1, "sum": 2}.get(reduction, reduction)
    with at(P64):
        losses = -(Wt * P)
        losses = EB(np.where(valid, losses.v, LD(0)), losses.e)
        total = Wt.sum() if (r or x.ndim == 1) else EB(LD(0))
        if r == 0:
            out = losses.reshape(np.asarray(target).shape)
        elif r == 2:
            out = losses.sum()
        else:
            out = losses.sum() / total
    return [Out("output", out, dt, np.shape(out.v)), Out("total_weight", total, dt, ())]


def ref_nll_loss_backward(grad_output, x, target, weight, reduction, ignore_index, total_weight,
                          two_d=False):
    x, t, valid, tt, rows, C, K, P, Wt = _nll_parts(x, target, weight, ignore_index, two_d)
    dt = data_dtype(x)
    r = {"none": 0, "mean": 1, "sum": 2}.get(reduction, reduction)
    g = ld(grad_output).reshape(-1) if r == 0 else ld(grad_output).reshape(())
    with at(P64):
        scale = Wt * EB(g)
        if r == 1:
            scale = scale / EB.of(np.asarray(total_weight).reshape(()))
    gr = EB(np.zeros((K, C), scale.v.dtype), np.zeros((K, C), LD))
    if C and K:
        gr.v[np.arange(K), tt] = np.where(valid, -scale.v, LD(0))
        gr.e[np.arange(K), tt] = np.where(valid, scale.e, LD(0))
    if x.ndim == 1:
        res = gr.reshape(x.shape)
    else:
        moved = np.moveaxis(np.empty(x.shape, np.int8), 1, -1).shape
        res = EB(np.moveaxis(gr.v.reshape(moved), -1, 1), np.moveaxis(gr.e.reshape(moved), -1, 1))
    return [Out("grad_input", res, dt, x.shape)]


# ---- pointwise

def ref_trace(x):
    x = np.asarray(x)
    if x.dtype.kind in "iu":
        return [Out("trace", None, np.int64, (), exact=np.asarray(np.trace(x, dtype=np.int64)))]
    dt = data_dtype(x)
    n = min(x.shape)
    diag = EB.of(np.asarray([x[i, i] for i in range(min(n, 1 << 22))]) if n else np.zeros(0))
    with at(math_prec(dt)):
        s = diag.sum()
    return [Out("trace", s, dt, ())]


def ref_log_sigmoid_forward(x):
    x = np.asarray(x)
    dt = data_dtype(x)
    X = EB.of(x)
    with at(math_prec(dt)):
        z = exp(-cabs(X))
        out = where(np.real(X.v) < 0, X, EB(np.zeros(x.shape, LD))) - log1p(z)
    return [Out("output", out, dt, x.shape), Out("buffer", z, dt, x.shape)]


# ---------------------------------------------------------------- forward-mode derivatives
#
# The reference tangent of an op is its complex-step derivative: the
# reference above evaluated on x + i h t (complex longdouble), whose
# imaginary part over h is the directional derivative to the last bit (no
# cancellation).  The backward ops' saved statistics are recomputed from the
# input with eps held fixed (README: "treated as functions of the input").

H = LD(2) ** -400


def _outs_values(outs):
    """The value of each expected output (None for None outputs)."""
    vals = []
    for o in outs:
        if o is None:
            vals.append(None)
            continue
        r = o.refs[0] if isinstance(o.refs, (list, tuple)) else o.refs
        vals.append(np.asarray(o.exact, LD) if r is None else np.asarray(r.v))
    return vals


def _ln_backward_recomputed(grad_out, x, normalized_shape, mean, rstd, weight=None, bias=None,
                            output_mask=(True, True, True)):
    x0, lead, k, M, N = _ln_rows(x, normalized_shape)
    ns = x0.shape[x0.ndim - k:]
    X = ld(x0).reshape(M, N)
    DY = ld(np.asarray(grad_out)).reshape(M, N)
    W = np.ones((1, N), LD) if weight is None else ld(np.asarray(weight)).reshape(1, N)
    if M == 0 or N == 0:
        z = np.zeros(x0.shape, X.dtype)
        return [z if output_mask[0] else None, np.zeros(ns, X.dtype) if output_mask[1] else None,
                np.zeros(ns, X.dtype) if output_mask[2] else None]
    mu = X.mean(1, keepdims=True)
    var = ((X - mu) * (X - mu)).mean(1, keepdims=True)
    r0 = np.real(ld(rstd)).reshape(M, 1)
    eps0 = 1 / (r0 * r0) - np.real(var)             # the eps the saved rstd holds
    r = 1 / np.sqrt(var + eps0)
    xhat = (X - mu) * r
    g = DY * W
    gx = r * (g - g.mean(1, keepdims=True) - xhat * (g * xhat).mean(1, keepdims=True))
    return [gx.reshape(x0.shape) if output_mask[0] else None,
            (DY * xhat).sum(0).reshape(ns) if output_mask[1] else None,
            DY.sum(0).reshape(ns) if output_mask[2] else None]


def _bn_backward_recomputed(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd,
                            training, eps=1e-5, output_mask=(True, True, True), axis=1):
    x0 = np.asarray(x)
    ax = axis % x0.ndim
    C = x0.shape[ax]
    Xr, _ = channels(x0, axis)
    X = Xr.v
    n = X.shape[1]
    if training:
        if n == 0:
            mean = np.zeros((C, 1), X.dtype)
            inv = np.zeros((C, 1), X.dtype)
        else:
            mean = X.mean(1, keepdims=True)
            inv = 1 / np.sqrt(((X - mean) * (X - mean)).mean(1, keepdims=True) + LD(float(eps)))
    else:
        mean = ld(np.asarray(running_mean)).reshape(C, 1)
        inv = 1 / np.sqrt(ld(np.asarray(running_var)).reshape(C, 1) + LD(float(eps)))
    gx, dotp, sum_dy, _, _ = ref_bn_backward_core(grad_out, x0, weight, EB(mean), EB(inv), training,
                                                  axis)
    gw = dotp.v * inv if n else np.zeros((C, 1), X.dtype)
    return [gx.v if output_mask[0] else None, gw.reshape(C) if output_mask[1] else None,
            (sum_dy.v if n else np.zeros((C, 1), X.dtype)).reshape(C) if output_mask[2] else None]


def _wn_backward_recomputed(grad_w, saved_v, saved_g, saved_norm, dim=0):
    v = np.asarray(saved_v)
    d = _axis(dim, v.ndim)
    axes = tuple(range(v.ndim)) if d is None else _keep_axes(v.ndim, d)
    kshape = tuple(1 for _ in v.shape) if d is None else tuple(
        s if i == d else 1 for i, s in enumerate(v.shape))
    V, GW = ld(v), ld(np.asarray(grad_w))
    G = ld(np.asarray(saved_g)).reshape(kshape)
    N = np.sqrt((V * V).sum(axes, keepdims=True))
    s = (GW * V).sum(axes, keepdims=True)
    grad_g = s / N
    return [G / N * GW - G * grad_g / (N * N) * V, grad_g.reshape(np.shape(saved_g))]


def _values(ref):
    return lambda *a, **k: _outs_values(ref(*a, **k))


def _bn_values(*a, **k):
    outs, rm, rv, _ = ref_batch_norm(*a, **k)
    return _outs_values(outs), {"running_mean": None if rm is None else rm.v,
                                "running_var": None if rv is None else rv.v}


# op name -> function(**args) -> output values (and, for batch_norm, the
# in-place running statistics); the names are cynorm's
JVP_VALUES = {
    "layer_norm": _values(ref_layer_norm),
    "layer_norm_backward": _ln_backward_recomputed,
    "batch_norm": _bn_values,
    "batch_norm_backward": _bn_backward_recomputed,
    "weight_norm": _values(ref_weight_norm),
    "weight_norm_interface": _values(ref_weight_norm_interface),
    "weight_norm_backward": _wn_backward_recomputed,
    "trace": _values(ref_trace),
    "log_sigmoid_forward": _values(ref_log_sigmoid_forward),
    "softmax": _values(ref_softmax),
    "log_softmax": _values(lambda x, dim, half_to_float=False: ref_softmax(x, dim, half_to_float, log=True)),
    "softmax_backward_data": _values(ref_softmax_backward_data),
    "log_softmax_backward_data": _values(
        lambda grad_output, output, dim, input_dtype: ref_softmax_backward_data(
            grad_output, output, dim, input_dtype, log=True)),
    "nll_loss_forward": _values(ref_nll_loss_forward),
    "nll_loss2d_forward": _values(lambda *a, **k: ref_nll_loss_forward(*a, **k, two_d=True)),
    "nll_loss": _values(lambda *a, **k: ref_nll_loss_forward(*a, **k)[:1]),
    "nll_loss2d": _values(lambda *a, **k: ref_nll_loss_forward(*a, **k, two_d=True)[:1]),
    "nll_loss_backward": _values(ref_nll_loss_backward),
    "nll_loss2d_backward": _values(lambda *a, **k: ref_nll_loss_backward(*a, **k, two_d=True)),
    "cudnn_batch_norm_backward": lambda input, grad_output, weight, running_mean, running_var, save_mean,
    save_var, epsilon, reserveSpace=None: _bn_backward_recomputed(
        grad_output, input, weight, running_mean, running_var, save_mean, save_var, True, epsilon),
    "miopen_batch_norm_backward": lambda input, grad_output, weight, running_mean, running_var, save_mean,
    save_var, epsilon: _bn_backward_recomputed(
        grad_output, input, weight, running_mean, running_var, save_mean, save_var, True, epsilon),
    "aten.batch_norm_backward": lambda grad_out, input, weight, running_mean, running_var, save_mean,
    save_var, update, eps, output_mask, reserve=None: _bn_backward_recomputed(
        grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps,
        output_mask),
}


def _m(a):
    """max |a| (0 for None or empty)."""
    if a is None:
        return LD(0)
    a = np.abs(ld(a))
    a = a[np.isfinite(a)]
    return a.max(initial=0)


def _group_r(x, axes, eps):
    """The largest 1/sqrt(var + eps) and |x - mean| * that over the groups."""
    X = ld(x)
    if X.size == 0:
        return LD(0), LD(0)
    mu = X.mean(axis=axes, keepdims=True)
    r = 1 / np.sqrt(((X - mu) ** 2).mean(axis=axes, keepdims=True) + LD(float(eps)))
    return _m(r), _m((X - mu) * r)


def _ln_axes(x, ns):
    k = 1 if np.ndim(ns) == 0 else len(tuple(ns))
    return tuple(range(np.ndim(x) - k, np.ndim(x)))


def _bn_axes(x, axis):
    return tuple(i for i in range(np.ndim(x)) if i != axis % np.ndim(x))


def _norm_scales(x, axes, eps, t, w, tw, tb):
    """(y, mean, rstd) tangent magnitudes of a forward normalization."""
    r, xh = _group_r(x, axes, eps)
    T = _m(t)
    return [_norm_scale(x, axes, eps, t, w, tw, tb), T, 2 * r * r * (1 + xh) * T]


def _norm_scale(x, axes, eps, t, w, tw, tb, dy=None, tdy=None):
    """Magnitude of the rounding-relevant terms of a normalization's
    tangents (their exact values may cancel: a row of 2, a slice of 1)."""
    r, xh = _group_r(x, axes, eps)
    W = max(_m(w), LD(1)) if w is not None else LD(1)
    T = _m(t)
    if dy is None:
        return r * T * W * (2 + xh) + xh * _m(tw) + _m(tb)
    G, TG = _m(dy) * W, _m(tdy) * W + _m(dy) * _m(tw)
    return 4 * (r * TG * (1 + xh) + r * r * T * G * (1 + xh) * (1 + xh))


def _wn_scale(v, dim, tv, g=None, tg=None, gw=None, tgw=None):
    V = ld(v)
    d = _axis(dim, V.ndim)
    axes = tuple(range(V.ndim)) if d is None else _keep_axes(V.ndim, d)
    n = np.sqrt((V * V).sum(axis=axes)) if V.size else np.zeros(0, LD)
    n = n[(n > 0) & np.isfinite(n)]
    inv = 1 / n.min() if n.size else LD(0)
    size = max(1, V.size // max(1, n.size))
    base = inv * (_m(tv) * _m(g) * 3 + _m(tg) * _m(v))
    if gw is None:
        return base
    return size * inv * (base * _m(gw) * 3 + _m(g) * _m(tgw) * 3)


JVP_SCALE = {
    "layer_norm": lambda a, t: _norm_scales(a["x"], _ln_axes(a["x"], a["normalized_shape"]), a["eps"],
                                            t.get("x"), a["weight"], t.get("weight"), t.get("bias")),
    "batch_norm": lambda a, t: _norm_scales(a["x"], _bn_axes(a["x"], a["axis"]), a["eps"], t.get("x"),
                                            a["weight"], t.get("weight"), t.get("bias")),
    "layer_norm_backward": lambda a, t: [_norm_scale(
        a["x"], _ln_axes(a["x"], a["normalized_shape"]), 0, t.get("x"), a["weight"], t.get("weight"), None,
        a["grad_out"], t.get("grad_out")) * max(1, math.prod(np.shape(a["x"])))] * 3,
    "batch_norm_backward": lambda a, t: [_norm_scale(
        a["x"], _bn_axes(a["x"], a["axis"]), a["eps"], t.get("x"), a["weight"], t.get("weight"), None,
        a["grad_out"], t.get("grad_out")) * max(1, math.prod(np.shape(a["x"])))] * 3,
    "aten.batch_norm_backward": lambda a, t: [_norm_scale(
        a["input"], _bn_axes(a["input"], 1), a["eps"], t.get("input"), a["weight"], t.get("weight"), None,
        a["grad_out"], t.get("grad_out")) * max(1, math.prod(np.shape(a["input"])))] * 3,
    "weight_norm": lambda a, t: [_wn_scale(a["v"], a["dim"], t.get("v"), a["g"], t.get("g"))],
    "weight_norm_interface": lambda a, t: [_wn_scale(a["v"], a["dim"], t.get("v"), a["g"], t.get("g"))] * 2,
    "weight_norm_backward": lambda a, t: [_wn_scale(
        a["saved_v"], a["dim"], t.get("saved_v"), a["saved_g"], t.get("saved_g"), a["grad_w"],
        t.get("grad_w"))] * 2,
}
for _n in ("cudnn_batch_norm_backward", "miopen_batch_norm_backward"):
    JVP_SCALE[_n] = lambda a, t: [_norm_scale(
        a["input"], _bn_axes(a["input"], 1), a["epsilon"], t.get("input"), a["weight"], t.get("weight"),
        None, a["grad_output"], t.get("grad_output")) * max(1, math.prod(np.shape(a["input"])))] * 3


def _nll_condition(a, two_d=False):
    """(sum |w[target]| / |sum w[target]|)**2 for a weighted mean reduction:
    its total weight can cancel (mixed-sign weights), and the tangent, which
    divides by the total squared, feels the rounding of that sum squared;
    1 otherwise."""
    if a.get("weight") is None or a.get("reduction", "mean") not in ("mean", 1):
        return LD(1)
    w = _nll_parts(a["x"], a["target"], a["weight"], a.get("ignore_index", -100), two_d)[-1].v
    total = abs(w.sum())
    return (np.abs(w).sum() / total) ** 2 if total > 0 else LD(1)


# a factor on a rule's whole tolerance, for ops whose conditioning the
# scales above do not see
JVP_CONDITION = {
    "nll_loss_forward": _nll_condition,
    "nll_loss": _nll_condition,
    "nll_loss2d_forward": lambda a: _nll_condition(a, True),
    "nll_loss2d": lambda a: _nll_condition(a, True),
}


def complex_step(fn, args, tangents):
    """(output values, output tangents, in-place tangents) of fn(**args)
    along `tangents` (name -> array or None): Re and Im f(x + i h t) / h."""
    pert = dict(args)
    for name, t in tangents.items():
        if t is not None:
            pert[name] = ld(args[name]) + CLD(1j) * H * ld(t)
    with np.errstate(all="ignore"):
        res = fn(**pert)
    inplace = {}
    if isinstance(res, tuple) and len(res) == 2 and isinstance(res[1], dict):
        res, inplace = res
    val = [None if r is None else np.real(np.asarray(r, CLD)).astype(LD) for r in res]
    tan = [None if r is None else np.imag(np.asarray(r, CLD)).astype(LD) / H for r in res]
    inp = {k: None if v is None else np.imag(np.asarray(v, CLD)).astype(LD) / H for k, v in inplace.items()}
    return val, tan, inp


def jvp_problems(op_name, args, tangents, out_values, out_tangents, live_tangents, inplace_names,
                 dtype, rng):
    """Problems of a jvp's output tangents (and in-place tangents) against
    the complex-step reference.  Tolerance, per output: C u (S + Y d +
    |t_ref|), u the unit roundoff of the data's dtype (a rule may use the
    op's outputs, rounded to it), S the largest output tangent over two
    random directions of the same size (an estimate of |J| |t|), Y the
    largest output value and d the largest relative size of an input
    tangent; then rounding to the output's dtype.  Where the output itself
    is NaN or infinite (an empty mean, a zero total weight) the tangent is
    not judged."""
    fn = JVP_VALUES[op_name]
    _, ref, ref_inplace = complex_step(fn, args, tangents)
    val, _, _ = complex_step(fn, args, {})          # the outputs themselves, unperturbed
    scales = [np.zeros((), LD) if r is None else np.abs(r).max(initial=0) for r in ref]
    extra = JVP_SCALE.get(op_name)
    if extra is not None:
        with np.errstate(all="ignore"):
            scales = [s if k is None else s + LD(k) for s, k in zip(scales, extra(args, tangents))]
    d = LD(0)
    for name, t in tangents.items():
        if t is not None:
            tt, xx = np.abs(ld(t)), np.abs(ld(args[name]))
            xm = xx[np.isfinite(xx)].max(initial=0)
            if xm > 0:
                d = max(d, tt.max(initial=0) / xm)
    for _ in range(2):
        probe = {}
        for name, t in tangents.items():
            if t is not None:
                tt = ld(t)
                m = np.abs(tt).max(initial=0)
                p = rng.standard_normal(tt.shape).astype(LD)
                pm = np.abs(p).max(initial=0)
                probe[name] = (p * (m / pm) if pm > 0 else p * 0).astype(np.float64)
        _, pr, _ = complex_step(fn, args, probe)
        scales = [s if r is None else np.maximum(s, np.abs(r).max(initial=0)) for s, r in zip(scales, pr)]
    u = PREC[np.dtype(dtype)].u * 64
    if op_name in JVP_CONDITION:
        with np.errstate(all="ignore"):
            u = u * JVP_CONDITION[op_name](args)
    problems = []
    if not isinstance(out_tangents, tuple):
        out_tangents, out_values_t = (out_tangents,), (out_values,)
    else:
        out_values_t = out_values
    if len(out_tangents) != len(ref):
        return [f"tangents: {len(out_tangents)} entries, expected {len(ref)}"]
    for i, (t, r, s, o, v) in enumerate(zip(out_tangents, ref, scales, out_values_t, val)):
        name = f"tangent[{i}]"
        if r is None or o is None:
            if t is not None:
                problems.append(f"{name}: expected None (the output is None), got {type(t).__name__}")
            continue
        if not isinstance(t, np.ndarray):
            problems.append(f"{name}: expected an ndarray, got {type(t).__name__}")
            continue
        if not isinstance(o, np.ndarray) or t.shape != o.shape or t.dtype != o.dtype:
            problems.append(f"{name}: {t.dtype}{t.shape}, expected the output's "
                            f"{getattr(o, 'dtype', '?')}{getattr(o, 'shape', '?')}")
            continue
        vv = np.broadcast_to(v, t.shape)
        Y = np.abs(vv[np.isfinite(vv)]).max(initial=0)
        e = u * (LD(s) + Y * d + np.abs(r))
        problems += check(name, t, EB(np.broadcast_to(r, t.shape), np.broadcast_to(e, t.shape)),
                          t.dtype, t.shape, safety=1.0, skip=~np.isfinite(vv))
    for name, r in ref_inplace.items():
        if name not in inplace_names or r is None:
            continue
        t = live_tangents.get(name)
        if isinstance(t, np.ndarray):
            e = u * (np.abs(r).max(initial=0) + np.abs(r))
            problems += check(f"tangent of {name} (in place)", t,
                              EB(r.reshape(t.shape), np.asarray(e).reshape(t.shape)), t.dtype, t.shape,
                              safety=1.0)
    return problems


# ---------------------------------------------------------------- nested arrays

def nested_check(name, got, sizes, buffer_ref, dtype, exact=None):
    """Problems of a NestedArray result: its class, sizes, dtype and buffer
    (against an EB, or `exact` data)."""
    from cynorm.nested import NestedArray
    if not isinstance(got, NestedArray):
        return [f"{name}: expected a NestedArray, got {type(got).__name__}"]
    sizes = np.asarray(sizes, np.int64).reshape(np.shape(sizes))
    if got.sizes.shape != sizes.shape or not np.array_equal(got.sizes, sizes):
        return [f"{name}: sizes {got.sizes.tolist()} (shape {got.sizes.shape}), expected "
                f"{sizes.tolist()} (shape {sizes.shape})"]
    if got.dtype != np.dtype(dtype):
        return [f"{name}: dtype {got.dtype}, expected {np.dtype(dtype)}"]
    if exact is not None:
        return same(name + ".buffer", got.buffer, np.asarray(exact).astype(dtype).reshape(-1))
    return check(name + ".buffer", got.buffer, buffer_ref, dtype, (got.buffer.size,))


def concat(parts):
    """EBs (or arrays) of components as one flat EB."""
    parts = [p if isinstance(p, EB) else EB.of(p) for p in parts]
    if not parts:
        return EB(np.zeros(0, LD))
    return EB(np.concatenate([np.asarray(p.v, LD).reshape(-1) for p in parts]),
              np.concatenate([np.asarray(p.e, LD).reshape(-1) for p in parts]))


SQRT_2_PI = LD(2) / LD(np.pi)


def gelu_ref(X, approximate, pm):
    """GELU and its derivative's parts at pm; the errors include u |x|:
    1 + erf / 1 + tanh cancel for negative x."""
    with at(pm):
        if approximate == "tanh":
            inner = (X + X * X * X * 0.044715) * float(np.sqrt(2 / np.pi))
            t = tanh(inner)
            y = X * 0.5 * (t + 1.0)
        else:
            t = None
            phi = erfc(-X * float(1 / np.sqrt(2))) * 0.5
            y = X * phi
    pad = 8 * pm.u * np.abs(X.v) + pm.tiny
    return EB(y.v, y.e + pad)


def gelu_grad_ref(G, X, approximate, pm):
    with at(pm):
        if approximate == "tanh":
            k = float(np.sqrt(2 / np.pi))
            inner = (X + X * X * X * 0.044715) * k
            t = tanh(inner)
            d = (t + 1.0) * 0.5 + X * 0.5 * (1.0 - t * t) * k * (X * X * (3 * 0.044715) + 1.0)
        else:
            phi = erfc(-X * float(1 / np.sqrt(2))) * 0.5
            dens = exp(-(X * X) * 0.5) * float(1 / np.sqrt(2 * np.pi))
            d = phi + X * dens
        r = G * d
    pad = 8 * pm.u * np.abs(G.v) * (1 + np.abs(X.v)) + pm.tiny
    return EB(r.v, r.e + pad)


def silu_ref(X, pm):
    with at(pm):
        y = X / (exp(-X) + 1.0)
    return EB(y.v, y.e + 4 * pm.u * np.abs(X.v) + pm.tiny)


def silu_grad_ref(G, X, pm):
    with at(pm):
        s = 1.0 / (exp(-X) + 1.0)
        r = G * (s * (X * (1.0 - s) + 1.0))
    return EB(r.v, r.e + 8 * pm.u * np.abs(G.v) * (1 + np.abs(X.v)) + pm.tiny)
