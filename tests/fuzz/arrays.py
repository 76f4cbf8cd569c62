"""Argument material for the fuzzers: dtypes, shapes, values and memory
layouts, drawn from one seeded numpy Generator (`Gen`).

Values are drawn in float64 and rounded to the array's dtype: the oracles
read the rounded values back, so what counts is the array actually passed.
"""
import math

import ml_dtypes
import numpy as np

F64 = np.dtype(np.float64)
F32 = np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
FLOATS = (F64, F32, BF16, F16)

# cynorm's dtype policy (README): math / statistics dtype, accepted parameter dtypes
STAT = {F64: F64, F32: F32, BF16: F32, F16: F32}
COEF = {F64: (F64,), F32: (F32,), BF16: (BF16, F32), F16: (F16, F32)}

# dtypes no op accepts as float data
WRONG_DTYPES = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.uint8), np.dtype(np.bool_),
                np.dtype(np.complex64), np.dtype(np.complex128), np.dtype(object),
                np.dtype(np.longdouble), np.dtype("U3"), np.dtype("M8[s]"), np.dtype(np.int8))

# finite magnitudes per dtype: (largest finite, smallest normal, smallest subnormal)
RANGE = {F64: (1.7976931348623157e308, 2.2250738585072014e-308, 5e-324),
         F32: (3.4028234663852886e38, 1.1754943508222875e-38, 1.401298464324817e-45),
         BF16: (3.3895313892515355e38, 1.1754943508222875e-38, 9.183549615799121e-41),
         F16: (65504.0, 6.103515625e-05, 5.960464477539063e-08)}

# a broadcast view claiming this many elements cannot be copied or allocated
HUGE_ELEMENTS = 2 ** 41

VALUE_STYLES = {          # style: weight
    "normal": 30, "ints": 5, "shifted": 7, "constant": 4, "zeros": 2, "big": 9, "tiny": 9,
    "mixed": 10, "special": 8, "wide": 5, "pair": 4, "top": 4, "subnormal": 4,
}
LAYOUTS = {"C": 50, "F": 10, "neg": 8, "strided": 8, "permuted": 6, "bcast": 4, "readonly": 6,
           "swapped": 4, "unaligned": 4}


def finite(dtype):
    return RANGE.get(np.dtype(dtype), RANGE[F64])


class Gen:
    """Seeded draws for one case.  Every method takes its randomness from
    `self.rng`, so a case is a pure function of (target, seed, index)."""

    def __init__(self, rng, moderate=False):
        self.rng = rng
        self.moderate = moderate      # jvp cases: well-conditioned values only

    # ---- small draws
    def p(self, prob):
        return bool(self.rng.random() < prob)

    def pick(self, seq):
        seq = list(seq)
        return seq[int(self.rng.integers(len(seq)))]

    def weighted(self, table):
        keys = list(table)
        w = np.array([table[k] for k in keys], float)
        return keys[int(self.rng.choice(len(keys), p=w / w.sum()))]

    def int(self, lo, hi):
        """An int in [lo, hi]."""
        return int(self.rng.integers(lo, hi + 1))

    def maybe(self, make, p_none):
        return None if self.p(p_none) else make()

    # ---- dtypes, shapes
    def dtype(self):
        return self.weighted({F64: 3, F32: 4, BF16: 2, F16: 2})

    def size(self, zero=0.04, one=0.2):
        r = self.rng.random()
        if r < zero:
            return 0
        if r < zero + one:
            return 1
        if self.p(0.08):
            return self.pick((8, 13, 17, 33, 64, 130))
        return self.int(2, 6)

    def rank(self, lo=0, hi=6):
        return self.pick(range(lo, hi + 1)) if self.p(0.3) else min(max(self.pick((1, 2, 2, 3, 3, 4)), lo), hi)

    def shape(self, rank=None, max_elems=4096, zero=0.04, one=0.2):
        rank = self.rank() if rank is None else rank
        shape = [self.size(zero, one) for _ in range(rank)]
        if self.moderate:
            max_elems = min(max_elems, 512)
        elif self.p(0.02) and rank:       # now and then a big one: threaded / fused kernel paths
            max_elems = 1 << 17
            shape[self.int(0, rank - 1)] = self.pick((1000, 4097, 9000))
        while math.prod(shape) > max_elems:
            i = int(np.argmax(shape))
            shape[i] = max(1, shape[i] // 2)
        return tuple(shape)

    # ---- values (float64, exactly representable after rounding to dtype)
    def magnitudes(self, n, lo, hi):
        """n magnitudes, log-uniform in [lo, hi]."""
        return np.exp(self.rng.uniform(np.log(lo), np.log(hi), n))

    def signs(self, n):
        return self.rng.choice([-1.0, 1.0], n)

    def values(self, shape, dtype, style=None):
        dtype = np.dtype(dtype)
        n = math.prod(shape)
        big, normal, sub = finite(dtype)
        if self.moderate:
            style = "ints" if style in ("ints", "zeros") else "normal"
        elif style is None:
            style = self.weighted(VALUE_STYLES)
        r = self.rng
        if style == "normal":
            scale = 1.0 if self.moderate else float(self.magnitudes(1, 1e-2, 1e2)[0])
            v = r.standard_normal(n) * scale
        elif style == "ints":
            v = r.integers(-3, 4, n).astype(float)
        elif style == "shifted":        # mean >> spread: cancellation in the variance
            v = self.pick((1e2, 1e4, 1e6 if dtype == F64 else 1e4)) + r.standard_normal(n)
        elif style == "constant":
            v = np.full(n, float(r.standard_normal()) * self.pick((1, 1e3, 1e-3)))
        elif style == "zeros":
            v = np.zeros(n)
        elif style == "big":            # 1e20 .. the dtype's largest finite
            v = self.signs(n) * self.magnitudes(n, min(1e20, big / 8), big)
            if self.p(0.5):
                v = np.abs(v)           # one sign: a huge mean too
        elif style == "tiny":           # around the smallest normal, subnormals included
            v = self.signs(n) * self.magnitudes(n, sub, max(normal * 1e8, 1e-30 if dtype != F16 else 1e-3))
        elif style == "mixed":          # ordinary values with a few extremes
            v = r.standard_normal(n)
            k = self.int(1, 3)
            extremes = [1e30, -1e30, 1e-30, sub, -sub, big, -big, normal]
            for _ in range(k):
                if n:
                    v[self.int(0, n - 1)] = self.pick(extremes)
        elif style == "special":        # NaN and infinities
            v = r.standard_normal(n)
            for _ in range(self.int(1, 2)):
                if n:
                    v[self.int(0, n - 1)] = self.pick((np.nan, np.inf, -np.inf))
        elif style == "top":            # within a factor 4 of the largest finite: the
            # products and partial sums a backward forms overflow
            v = self.signs(n) * self.magnitudes(n, big / 4, big)
        elif style == "subnormal":      # under the smallest normal, the subnormals
            v = self.signs(n) * self.magnitudes(n, sub, normal)
        elif style == "wide":           # any magnitude the dtype holds
            v = self.signs(n) * self.magnitudes(n, sub, big)
        elif style == "pair":           # the 3e20, 4e20 kind: spread and mean both huge
            base = self.pick((3e20, 1e30, big / 4, 1e-30, sub * 4))
            v = base * (1.0 + r.integers(0, 3, n) / 3.0)
        else:
            raise ValueError(style)
        with np.errstate(over="ignore"):
            v = np.clip(v, -big, big) if style not in ("special",) else v
        return v.reshape(shape)

    # ---- arrays in memory layouts
    def layout(self, ndim):
        if self.moderate:
            return self.pick(("C", "F", "neg", "strided"))
        return self.weighted(LAYOUTS)

    def array(self, shape, dtype, style=None, layout=None, values=None):
        """An ndarray of `shape`/`dtype` holding drawn values, in a drawn layout."""
        dtype = np.dtype(dtype)
        vals = self.values(shape, dtype, style) if values is None else np.asarray(values)
        with np.errstate(over="ignore", invalid="ignore"):
            a = vals.astype(dtype)
        return self.place(a, self.layout(a.ndim) if layout is None else layout)

    def place(self, a, layout):
        """a's values in memory laid out as `layout` (a view where it must be)."""
        nd = a.ndim
        if layout == "C" or nd == 0 and layout in ("F", "neg", "strided", "permuted", "bcast"):
            return np.array(a, order="C", copy=True)     # (np.ascontiguousarray makes 0-d 1-d)
        if layout == "F":
            return np.array(a, order="F", copy=True)
        if layout == "neg":
            rev = (slice(None, None, -1),) * nd
            return np.array(a[rev], order="C", copy=True)[rev]
        if layout == "strided":
            ax = self.int(0, nd - 1)
            shape = list(a.shape)
            shape[ax] = 2 * shape[ax] + 1
            big = np.zeros(shape, a.dtype)
            sl = tuple(slice(1, None, 2) if i == ax else slice(None) for i in range(nd))
            big[sl] = a
            return big[sl]
        if layout == "permuted":
            perm = self.rng.permutation(nd)
            return np.array(np.transpose(a, perm), order="C", copy=True).transpose(np.argsort(perm))
        if layout == "bcast":           # a zero stride: values equal along one axis
            ax = self.int(0, nd - 1)
            return np.broadcast_to(np.take(a, [0], axis=ax), a.shape) if a.shape[ax] \
                else np.array(a, order="C", copy=True)
        if layout == "readonly":
            c = np.array(a, copy=True)
            c.flags.writeable = False
            return c
        if layout == "swapped":         # non-native byte order (ml_dtypes has none)
            if a.dtype.kind != "f":
                return np.array(a, order="C", copy=True)
            return a.astype(a.dtype.newbyteorder())
        if layout == "unaligned":
            if a.dtype.itemsize == 1:
                return np.array(a, order="C", copy=True)
            buf = np.zeros(a.nbytes + 1, np.uint8)[1:]
            u = buf.view(a.dtype).reshape(a.shape)
            u[...] = a
            return u
        raise ValueError(layout)

    def huge(self, dtype, rank=None):
        """A read-only broadcast view claiming about 2**41 elements or more."""
        rank = self.int(1, 4) if rank is None else rank
        total = HUGE_ELEMENTS << self.int(0, 4)
        shape = [1] * rank
        shape[-1] = total
        if rank > 1 and self.p(0.5):
            shape[0], shape[-1] = 1 << 11, total >> 11
        with np.errstate(over="ignore", invalid="ignore"):
            one = np.asarray(self.values((), dtype, "normal")).astype(dtype)
        return np.broadcast_to(one, tuple(shape))

    def wrong_dtype_array(self, shape):
        dt = self.pick(WRONG_DTYPES)
        vals = self.rng.standard_normal(math.prod(shape)).reshape(shape)
        if dt.kind == "U":
            return np.full(shape, "ab", dt)
        if dt.kind == "M":
            return np.zeros(shape, dt)
        if dt.kind == "O":
            a = np.empty(shape, object)
            a.reshape(-1)[...] = [self.pick((1.5, 10 ** 400, "x", None))
                                  for _ in range(a.size)] if a.size else []
            return a
        return vals.astype(dt)

    def masked(self, a):
        a = np.asarray(a)
        return np.ma.masked_array(a, mask=self.rng.random(a.shape) < 0.3)

    def junk(self):
        """Something that is no array and no number."""
        return self.pick(("abc", b"\x00", object(), {"a": 1}, {1, 2}, [[1.0], [1.0, 2.0]],
                          [object()], lambda: 0, slice(1, 2), Ellipsis, complex(1, 2)))
