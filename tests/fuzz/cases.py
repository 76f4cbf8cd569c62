"""The fuzz targets: one small generator per public function, and TARGETS.

A generator draws a valid call (`Case`) for its target from a `Gen`, then
`finish()` may break one argument (a mutation: wrong dtype, shape, type,
value, a masked array, a huge broadcast view ...) and may add `out=`
arrays, some aliasing the inputs.  Every mutation says what it must lead
to: "error" (a TypeError/ValueError naming an argument), "either" (that, or
a correct result) or "ok".  A call that returns is judged by the case's
oracle against the extended-precision references of `oracles`.
"""
import math
import zlib

import numpy as np

from . import oracles as O
from .arrays import BF16, COEF, F16, F32, F64, FLOATS, STAT, WRONG_DTYPES, Gen, finite

TARGETS = {}

RANK = {"ok": 0, "either": 1, "error": 2}


class Arg:
    __slots__ = ("name", "value", "kw", "kind", "spec")

    def __init__(self, name, value, kw, kind, spec):
        self.name, self.value, self.kw, self.kind, self.spec = name, value, kw, kind, spec


class Case:
    """One call: fn(*positional, **keywords) and how to judge it."""

    def __init__(self, target, g):
        self.target, self.g = target, g
        self.args = []
        self.expect = "ok"
        self.notes = []
        self.huge = False
        self.inplace = set()    # argument paths the call may modify (running stats; out= always)
        self.out = None         # the out= argument, if given
        self.aliased = False    # out= shares memory with an input or another output
        self.out_slots = []     # (result index, array) for given out arrays
        self.watch = []         # extra arrays whose memory is compared (guard bytes)
        self.oracle = None      # oracle(args: dict of snapshots, result) -> problems
        self.after = None       # restores global state after the call
        self.accept = ()        # exception classes accepted besides TypeError/ValueError
        self.extra_names = ()   # more words an error message may name
        self.fn = None

    # ---- arguments
    def add(self, name, value, kind=None, kw=False, **spec):
        self.args.append(Arg(name, value, kw, kind, spec))
        return value

    def arg(self, name):
        for a in self.args:
            if a.name == name:
                return a
        raise KeyError(name)

    def value(self, name, default=None):
        for a in self.args:
            if a.name == name:
                return a.value
        return default

    def set(self, name, value):
        self.arg(name).value = value

    def call(self):
        """fn(*args): positional up to the first keyword argument, by name after it."""
        pos, kws = [], {}
        for a in self.args:
            if a.kw or kws:
                kws[a.name] = a.value
            else:
                pos.append(a.value)
        return self.fn(*pos, **kws)

    def want(self, expect, note=None):
        """Raise the expected outcome to at least `expect`."""
        if RANK[expect] > RANK[self.expect]:
            self.expect = expect
        if note:
            self.notes.append(note)


def target(name, resolve, unavailable=None):
    """Register gen(g) -> Case as the generator of `name`; resolve() returns
    the function (called lazily: cudnn_bind may be absent); unavailable()
    says why the target cannot run here (None: it can)."""
    def deco(gen):
        TARGETS[name] = Target(name, resolve, gen, unavailable)
        return gen
    return deco


class Target:
    def __init__(self, name, resolve, gen, unavailable=None):
        self.name, self.resolve, self.gen, self._unavailable = name, resolve, gen, unavailable

    def unavailable(self):
        return self._unavailable() if self._unavailable else None

    def case(self, seed, index):
        rng = np.random.default_rng([seed, index, zlib.crc32(self.name.encode())])
        g = Gen(rng)
        c = self.gen(g)
        c.fn = self.resolve()
        return c


def new(name, g):
    return Case(name, g)


# ------------------------------------------------------------------ shared pieces

def scalar_eps(g):
    if g.moderate:
        return 1e-5
    return g.pick((1e-5, 1e-5, 1e-3, 0.0, 1e-12, 1e-30, 0.5, 1, np.float32(1e-5), 1e10))


def draw_eps(g, c, name="eps", kw=None):
    return c.add(name, scalar_eps(g), "eps", kw=g.p(0.5) if kw is None else kw)


def ns_form(g, ns):
    """normalized_shape spelled as an int, tuple, list or array."""
    if len(ns) == 1 and g.p(0.4):
        return g.pick((int(ns[0]), np.int64(ns[0])))
    return g.pick((tuple(ns), list(ns), np.array(ns, np.int64), tuple(np.int32(s) for s in ns)))


def coef_style(g):
    return g.weighted({"normal": 8, "ints": 2, "big": 1, "tiny": 1, "special": 1, "mixed": 1,
                       "zeros": 1})


def coef(g, shape, dtypes, style=None):
    return g.array(shape, g.pick(dtypes), style or coef_style(g))


def positive(g, shape, dtype, style=None):
    """Values > 0 mostly (variances, invstd, norms), some zero / non-finite."""
    s = style or g.weighted({"normal": 8, "big": 1, "tiny": 1, "special": 1, "zeros": 1})
    with np.errstate(over="ignore", invalid="ignore"):
        return g.place(np.abs(g.values(shape, dtype, s)).astype(dtype), g.layout(len(shape)))


# ------------------------------------------------------------------ mutations

def _other_shape(g, shape, accepted):
    """A shape not among `accepted`."""
    for _ in range(20):
        s = list(shape)
        r = g.int(0, 2)
        if r == 0 or not s:
            s.append(g.int(1, 3))
        elif r == 1:
            s.pop(g.int(0, len(s) - 1))
        else:
            i = g.int(0, len(s) - 1)
            s[i] = s[i] + g.int(1, 3)
        s = tuple(s)
        if s not in accepted:
            return s
    return tuple(shape) + (7, 7)


def _array_like(a):
    return isinstance(a, np.ndarray)


def mutate_array(g, c, a):
    """Break (or reshape harmlessly) one array argument; the spec says what
    it accepts: dtypes, shapes, optional, updatable, huge, unused (an
    argument the call ignores: anything goes)."""
    before = c.expect
    _mutate_array(g, c, a)
    if a.spec.get("unused") and c.expect == "error" and before != "error":
        c.expect = "either"


def _mutate_array(g, c, a):
    v = a.value
    spec = a.spec
    dtypes = spec.get("dtypes")            # None: any float dtype
    shapes = spec.get("shapes")            # None: not checked here
    if _array_like(v):
        base = np.asarray(v)
        choices = ["wrong_kind", "masked", "junk", "swapped", "readonly", "layout", "list"]
    elif shapes is not None and dtypes is not None:   # None given: a valid array of an accepted shape
        base = np.zeros(shapes[0], dtypes[0])
        choices = ["wrong_kind", "masked", "junk", "swapped", "readonly", "layout", "list"]
    else:
        base = np.zeros((2,), F64)
        choices = ["wrong_kind", "masked", "junk"]
    shape = base.shape
    if dtypes is not None:
        choices += ["other_float"] * 2
    if shapes is not None:
        choices += ["shape"] * 2
    if spec.get("optional"):
        choices.append("none")
    else:
        choices.append("none_required")
    if spec.get("huge"):
        choices.append("huge")
    kind = g.pick(choices)
    upd = spec.get("updatable")
    if kind == "wrong_kind":
        a.value = g.wrong_dtype_array(shape)
        c.want("error", f"{a.name}: dtype {a.value.dtype}")
    elif kind == "masked":
        a.value = g.masked(base)
        c.want("error", f"{a.name}: a masked array")
    elif kind == "junk":
        a.value = g.junk()
        c.want("error", f"{a.name}: {type(a.value).__name__} {a.value!r:.40}")
    elif kind == "none":
        a.value = None
        c.notes.append(f"{a.name}: None")
    elif kind == "none_required":
        a.value = None
        c.want("error", f"{a.name}: None (required)")
    elif kind == "swapped":
        if base.dtype.kind == "f" and base.dtype.byteorder in ("=", "<", ">"):
            a.value = g.place(base, "swapped")
            c.want("error" if upd else "ok", f"{a.name}: byte-swapped {a.value.dtype}")
        else:
            c.notes.append(f"{a.name}: unchanged")
    elif kind == "readonly":
        a.value = g.place(base, "readonly")
        c.want("error" if upd else "ok", f"{a.name}: read-only")
    elif kind == "layout":
        lay = g.pick(("F", "neg", "strided", "permuted", "unaligned", "bcast"))
        if upd and lay == "bcast":
            lay = "neg"
        a.value = g.place(base, lay)
        c.notes.append(f"{a.name}: {lay} layout")
    elif kind == "list":
        a.value = base.astype(np.float64).tolist() if base.dtype.kind == "f" else base.tolist()
        ok = not upd and (dtypes is None or F64 in dtypes) and base.dtype == F64
        c.want("either" if ok else "error" if upd else "either", f"{a.name}: a Python list")
    elif kind == "other_float":
        wrong = [d for d in FLOATS if d not in dtypes]
        if wrong:
            d = g.pick(wrong)
            a.value = g.place(base.astype(d), "C")
            c.want("error", f"{a.name}: dtype {d} (expected {' or '.join(map(str, dtypes))})")
    elif kind == "shape":
        s = _other_shape(g, shape, shapes)
        a.value = g.array(s, base.dtype if base.dtype in FLOATS else F64)
        same_size = spec.get("size_only") and math.prod(s) == math.prod(shape)
        c.want("either" if same_size else "error", f"{a.name}: shape {s}")
    elif kind == "huge":
        a.value = g.huge(base.dtype if base.dtype in FLOATS else F32, rank=max(1, len(shape)))
        c.huge = True
        c.want("either", f"{a.name}: broadcast view of shape {a.value.shape}")


# scalar mutations: (value, expected) per kind
EPS_BAD = [(-1e-5, "error"), (float("nan"), "error"), (float("inf"), "either"), (10 ** 400, "error"),
           (-10 ** 400, "error"), ("1e-5", "error"), (None, "error"), (True, "error"), (1j, "error"),
           (np.float32(1e-3), "ok"), (0, "ok"), (2, "ok"), (np.array(1e-5), "either"),
           (1e300, "ok"), (-0.0, "ok"), (np.float16(0.01), "ok"), (np.int64(1), "ok")]
REAL_BAD = [(float("nan"), "error"), (float("inf"), "error"), (10 ** 400, "error"), ("0.1", "error"),
            (None, "error"), (True, "error"), (np.float16(0.5), "ok"), (-1.5, "ok"), (0, "ok"),
            (1, "ok"), (3.0, "ok"), (1j, "error"), (np.array(0.1), "either")]
FLAG_BAD = [(1, "error"), ("True", "error"), (None, "error"), (np.True_, "ok"), (np.False_, "ok"),
            (np.array(True), "either"), (0.0, "error")]
MASK_BAD = [((True, True), "error"), ((True,) * 4, "error"), ((1, 0, 1), "error"), ("abc", "error"),
            (None, "error"), (5, "error"), ([True, False, True], "ok"),
            (np.array([True, True, False]), "ok"), ((np.True_, np.False_, np.True_), "ok"),
            ((True, None, True), "error")]


def mutate_scalar(g, c, a, table):
    value, expect = g.pick(table)
    a.value = value
    c.want(expect, f"{a.name}={value!r:.40}")


def mutate_axis(g, c, a):
    """An axis/dim: out of range, wrong type (ndim in the spec)."""
    nd = a.spec.get("ndim", 1)
    lo = a.spec.get("lo", -nd)
    hi = a.spec.get("hi", nd - 1)
    r = g.int(0, 7)
    if r <= 2:
        a.value = g.pick((hi + 1, hi + 2, lo - 1, lo - 3, 10 ** 400, -10 ** 400, 2 ** 63))
        c.want("error", f"{a.name}={a.value} (out of range)")
    elif r <= 4:
        a.value = g.pick((1.0, "1", True, [0], np.float64(0), 0j))
        c.want("error", f"{a.name}={a.value!r}")
    elif r == 5 and a.spec.get("none_ok") is not None:
        a.value = None
        c.want(a.spec["none_ok"], f"{a.name}=None")
    else:
        if hi >= lo:
            a.value = g.pick((np.int64, np.int32, int))(g.int(lo, hi))
            c.want("either" if a.spec.get("dependent") else "ok", f"{a.name}={a.value!r}")


def mutate(g, c):
    """Break one argument of c (that has a kind)."""
    cands = [a for a in c.args if a.kind is not None]
    if not cands:
        return
    a = g.pick(cands)
    if a.kind == "array":
        mutate_array(g, c, a)
    elif a.kind == "eps":
        mutate_scalar(g, c, a, EPS_BAD)
    elif a.kind == "real":
        mutate_scalar(g, c, a, REAL_BAD)
    elif a.kind == "flag":
        old = a.value
        value, expect = g.pick(FLAG_BAD)
        if expect == "ok" and bool(value) != bool(old):
            expect = "either"           # the other mode has other requirements
        a.value = value
        c.want(expect, f"{a.name}={value!r}")
    elif a.kind == "mask":
        mutate_scalar(g, c, a, MASK_BAD if a.spec.get("n", 3) == 3 else
                      [((True,) * 3, "error"), ((1, 1), "error"), (None, "error"), ([True, True], "ok")])
    elif a.kind == "axis":
        mutate_axis(g, c, a)
    elif a.kind == "custom":
        a.spec["mutate"](g, c, a)


def finish(g, c, p_mutate=0.35):
    if g.moderate or getattr(g, "no_mutate", False):    # a jvp's primal case / a base case
        return c
    if g.p(p_mutate):
        mutate(g, c)
    return c


# ------------------------------------------------------------------ out= arrays

def guarded(g, shape, dtype, order="C"):
    """A fresh array inside a larger one filled with a pattern (guard bytes
    before and after); returns (array, parent)."""
    n = math.prod(shape)
    pad = g.int(1, 5)
    parent = np.empty(n + 2 * pad, dtype)
    parent.view(np.uint8)[...] = 0x5A
    inner = parent[pad:pad + n]
    arr = inner.reshape(shape, order="F" if order == "F" else "C")
    return arr, parent


def _compatible(a, shape, dtype, order):
    if not isinstance(a, np.ndarray) or a.shape != tuple(shape) or a.dtype != dtype:
        return False
    if not a.flags.writeable:
        return False
    return a.flags.c_contiguous or (order in ("CF", "any") and a.flags.f_contiguous) \
        or order == "any"


def add_out(g, c, slots, single=False, p=0.55, kw_name="out", result_index=None):
    """Maybe give out=: slots is a list of (name, shape, dtype, order) with
    order "C", "CF" (either contiguous order) or "any" (any strides).  Entries may be None,
    fresh, guard-padded, an input itself, a view overlapping an input, or
    the same array twice."""
    if g.moderate or getattr(g, "no_out", False) or not g.p(p):
        return
    if g.p(0.1):
        c.add(kw_name, None, kw=True)
        return
    entries = []
    inputs = [a for a in c.args if isinstance(a.value, np.ndarray) and a.kind == "array"]
    for i, (name, shape, dtype, order) in enumerate(slots):
        dtype = np.dtype(dtype)
        r = g.rng.random()
        if not single and r < 0.25:
            entries.append(None)
            continue
        same_in = [a for a in inputs if _compatible(a.value, shape, dtype, order)]
        earlier = [e for e in entries if e is not None and _compatible(e, shape, dtype, order)]
        if r < 0.45 and same_in:
            a = g.pick(same_in)
            entries.append(a.value)
            c.notes.append(f"out[{i}] ({name}) is {a.name}")
            c.aliased = True
            c.want("either")
        elif r < 0.55 and earlier:
            entries.append(g.pick(earlier))
            c.notes.append(f"out[{i}] ({name}) is an earlier out entry")
            c.aliased = True
            c.want("either")
        elif r < 0.65:
            ov = _overlapping(g, c, inputs, shape, dtype)
            if ov is None:
                entries.append(_stale(shape, dtype))
            else:
                entries.append(ov)
                c.aliased = True
                c.want("either")
        elif r < 0.85:
            arr, parent = guarded(g, tuple(shape), dtype,
                                  g.pick(("C", "F")) if order in ("CF", "any") else "C")
            c.watch.append(parent)
            entries.append(arr)
        else:
            fo = "F" if order in ("CF", "any") and g.p(0.4) else "C"
            entries.append(_stale(shape, dtype, fo))
    value = entries[0] if single else tuple(entries)
    if g.p(0.12):
        value = _break_out(g, c, value, slots, single)
    c.add(kw_name, value, kw=True)
    c.out = c.args[-1]
    if isinstance(value, tuple) and not single:
        c.out_slots = [(i, e) for i, e in enumerate(value) if isinstance(e, np.ndarray)]
    elif single and isinstance(value, np.ndarray):
        c.out_slots = [(result_index, value)]


def _stale(shape, dtype, order="C"):
    """A fresh out= array holding NaN (deterministic, and any element the op
    forgets to write shows)."""
    a = np.empty(shape, dtype, order=order)
    a[...] = np.nan
    return a


def _overlapping(g, c, inputs, shape, dtype):
    """Make an input of the same dtype and size a view into a shared buffer,
    and return an out view shifted by a few elements in that buffer."""
    n = math.prod(shape)
    cands = [a for a in inputs if a.value.dtype == dtype and a.value.size == n and n > 1
             and not a.spec.get("updatable")]
    if not cands:
        return None
    a = g.pick(cands)
    shift = g.int(1, max(1, n - 1))
    buf = np.zeros(n + shift, dtype)
    lo, hi = (0, shift) if g.p(0.5) else (shift, 0)
    inp = buf[lo:lo + n].reshape(a.value.shape)
    inp[...] = a.value
    if not a.value.flags.writeable:
        pass
    a.value = inp
    out = buf[hi:hi + n].reshape(shape)
    c.notes.append(f"out overlaps {a.name} (shifted {shift})")
    return out


def _break_out(g, c, value, slots, single):
    """A bad out=: wrong type, length, shape, dtype, order, read-only."""
    name, shape, dtype, order = slots[0] if single else g.pick(slots)
    dtype = np.dtype(dtype)
    r = g.int(0, 7)
    if r == 0:
        bad = g.pick(([], "out", 3, [None] * len(slots)))
        c.want("error", f"out={bad!r:.30}")
        return bad
    if r == 1 and not single:
        c.want("error", "out of the wrong length")
        return tuple(value) + (None,) if g.p(0.5) else tuple(value)[:-1]
    if r == 2:
        bad_arr = _stale(_other_shape(g, tuple(shape), [tuple(shape)]), dtype)
        c.want("error", f"out ({name}) of shape {bad_arr.shape}")
    elif r == 3:
        d = g.pick([x for x in FLOATS + WRONG_DTYPES[:4] if x != dtype])
        bad_arr = np.zeros(shape, d)
        c.want("error", f"out ({name}) of dtype {d}")
    elif r == 4 and math.prod(shape) > 1 and len(shape) >= 1 and order != "any":
        big = _stale(tuple(shape[:-1]) + (2 * shape[-1],), dtype)
        bad_arr = big[..., ::2]
        if bad_arr.flags.c_contiguous or bad_arr.flags.f_contiguous:
            return value
        c.want("error", f"out ({name}) not contiguous")
    elif r == 5:
        bad_arr = _stale(shape, dtype)
        bad_arr.flags.writeable = False
        c.want("error", f"out ({name}) read-only")
    elif r == 6 and dtype.kind == "f" and dtype not in (BF16,):
        bad_arr = _stale(shape, dtype.newbyteorder())
        c.want("error", f"out ({name}) byte-swapped")
    elif r == 7 and order == "C" and len([s for s in shape if s > 1]) > 1 and math.prod(shape):
        bad_arr = _stale(shape, dtype, "F")
        c.want("error", f"out ({name}) F-ordered (must be C)")
    elif r == 7:
        bad_arr = np.ma.masked_array(_stale(shape, dtype), mask=False)
        c.want("error", f"out ({name}) a masked array")
    else:
        return value
    if single:
        return bad_arr
    entries = list(value)
    entries[[s[0] for s in slots].index(name)] = bad_arr
    return tuple(entries)


def out_identity(c, result):
    """Problems unless each given out array is returned as such."""
    probs = []
    for i, arr in c.out_slots:
        got = result if i is None else (
            result[i] if isinstance(result, tuple) and i < len(result) else None)
        if got is not arr:
            probs.append(f"out[{i}] was given but the result {'' if i is None else f'[{i}] '}is "
                         f"{'another array' if isinstance(got, np.ndarray) else type(got).__name__}")
    return probs


# ================================================================== cynorm: weight norm
import cynorm  # noqa: E402


def draw_dim(g, nd, none_p=0.2):
    if nd == 0 or g.p(none_p):
        return None
    d = g.int(-nd, nd - 1)
    return g.pick((int, int, np.int64, np.intp))(d)


def kept(shape, dim):
    return tuple(1 for _ in shape) if dim is None else tuple(
        s if i == dim % len(shape) else 1 for i, s in enumerate(shape))


def per_channel_shapes(shape, dim):
    """The shapes g / saved_norm may have (README: keepdims or 1-D; dim=None: (), (1,), all ones)."""
    if dim is None:
        return list(dict.fromkeys([(), (1,), kept(shape, None)]))
    return list(dict.fromkeys([(shape[dim % len(shape)],), kept(shape, dim)]))


POW_GOOD = (2, 2, 1, 3, 0.5, 1.5, 4, np.inf, np.float32(2), 2.0, np.int64(3), 0.01)
POW_BAD = [(0, "error"), (-1, "error"), (float("nan"), "error"), ("2", "error"), (None, "error"),
           (True, "error"), (2j, "error"), (10 ** 400, "error"), (-np.inf, "error"),
           (np.float16(2), "ok"), (np.array(2.0), "either")]


def _wn_base(g, c, vname="v"):
    dt = g.dtype()
    shape = g.shape(rank=g.pick((0, 1, 1, 2, 2, 3, 4, 5)))
    nd = len(shape)
    dim = draw_dim(g, nd)
    return dt, shape, nd, dim, per_channel_shapes(shape, dim)


@target("cynorm.norm_except_dim", lambda: cynorm.norm_except_dim)
def gen_norm_except_dim(g):
    c = new("cynorm.norm_except_dim", g)
    dt, shape, nd, dim, _ = _wn_base(g, c)
    c.add("v", g.array(shape, dt), "array", huge=True)
    c.add("pow", g.pick(POW_GOOD), "custom", kw=g.p(0.3),
          mutate=lambda g, c, a: mutate_scalar(g, c, a, POW_BAD))
    c.add("dim", dim, "axis", kw=g.p(0.3), ndim=nd, none_ok="either", dependent=True)
    oshape = () if dim is None else kept(shape, dim)
    add_out(g, c, [("norm", oshape, dt, "C")], single=True)
    c.oracle = lambda s, res, live: O.verify(O.ref_norm_except_dim(s["v"], s["pow"], s["dim"]), res,
                                             single=True) + out_identity(c, res)
    return finish(g, c)


def _wn_forward(name, interface):
    def gen(g):
        c = new(name, g)
        dt, shape, nd, dim, shapes = _wn_base(g, c)
        c.add("v", g.array(shape, dt), "array", huge=True)
        gs = g.pick(shapes)
        c.add("g", coef(g, gs, COEF[dt]), "array", dtypes=COEF[dt], shapes=shapes)
        c.add("dim", dim, "axis", kw=g.p(0.3), ndim=nd, none_ok="either", dependent=True)
        if interface:
            add_out(g, c, [("w", shape, dt, "CF"), ("norm", gs, STAT[dt], "C")])
        else:
            add_out(g, c, [("w", shape, dt, "CF")], single=True)
        ref = O.ref_weight_norm_interface if interface else O.ref_weight_norm
        c.oracle = lambda s, res, live: O.verify(ref(s["v"], s["g"], s["dim"]), res,
                                                 single=not interface) + out_identity(c, res)
        return finish(g, c)
    return gen


target("cynorm.weight_norm", lambda: cynorm.weight_norm)(_wn_forward("cynorm.weight_norm", False))
target("cynorm.weight_norm_interface", lambda: cynorm.weight_norm_interface)(
    _wn_forward("cynorm.weight_norm_interface", True))


def np_norm(v, dim):
    """The 2-norm over every axis but dim, keepdims, in float64 (NumPy)."""
    v64 = np.asarray(v, np.float64)
    axes = tuple(range(v64.ndim)) if dim is None else tuple(
        i for i in range(v64.ndim) if i != dim % v64.ndim)
    with np.errstate(all="ignore"):
        return np.sqrt(np.sum(v64 * v64, axis=axes, keepdims=True))


@target("cynorm.weight_norm_backward", lambda: cynorm.weight_norm_backward)
def gen_weight_norm_backward(g):
    c = new("cynorm.weight_norm_backward", g)
    dt, shape, nd, dim, shapes = _wn_base(g, c)
    gs = g.pick(shapes)
    v = g.array(shape, dt)
    c.add("grad_w", g.array(shape, dt), "array", huge=True)
    c.add("saved_v", v, "array")
    c.add("saved_g", coef(g, gs, COEF[dt]), "array", dtypes=COEF[dt], shapes=shapes)
    sd = STAT[dt]
    if g.moderate or g.p(0.7):
        with np.errstate(all="ignore"):
            norm = g.place(np_norm(v, dim).reshape(gs).astype(sd), "C" if g.moderate else g.layout(len(gs)))
    else:
        norm = positive(g, gs, sd)
    c.add("saved_norm", norm, "array", dtypes=(sd,), shapes=shapes)
    c.add("dim", dim, "axis", kw=g.p(0.3), ndim=nd, none_ok="either", dependent=True)
    add_out(g, c, [("grad_v", shape, dt, "CF"), ("grad_g", gs, O.data_dtype(c.value("saved_g")), "C")])
    c.oracle = lambda s, res, live: O.verify(O.ref_weight_norm_backward(
        s["grad_w"], s["saved_v"], s["saved_g"], s["saved_norm"], s["dim"]), res) + out_identity(c, res)
    return finish(g, c)


# ================================================================== cynorm: layer norm

def mut_ns(g, c, a):
    """Break normalized_shape (spec lenient: an empty nested array, which any
    shape fits)."""
    before = c.expect
    _mut_ns(g, c, a)
    if a.spec.get("lenient") and c.expect == "error" and before != "error":
        c.expect = "either"


def _mut_ns(g, c, a):
    ns, nd = a.spec["ns"], a.spec["ndim"]
    r = g.int(0, 6)
    if r == 0:
        a.value = g.pick(((), []))
        c.want("error", "normalized_shape=()")
    elif r == 1:
        bad = list(ns)
        bad[g.int(0, len(bad) - 1)] += g.int(1, 3)
        a.value = tuple(bad)
        c.want("error", f"normalized_shape={a.value}")
    elif r == 2:
        a.value = g.pick((float(ns[-1]), True, "3", None, 10 ** 400, -1, [1.5], (ns[-1], None)))
        c.want("error", f"normalized_shape={a.value!r:.30}")
    elif r == 3:
        # more axes than x has, or a last axis that is not x's last
        a.value = ((g.int(1, 3),) + tuple(ns) if len(ns) >= nd
                   else tuple(ns) + ((ns[-1] + 1) if len(ns) else 1,))
        c.want("error", f"normalized_shape={a.value} (longer)")
    elif r == 4 and len(ns) > 1:
        a.value = tuple(ns[1:])
        c.want("either", f"normalized_shape={a.value} (fewer axes)")
    else:
        a.value = g.pick((tuple(ns), list(ns), np.array(ns), np.array(ns, np.uint8) if max(ns, default=0) < 256
                          else tuple(ns)))
        c.notes.append(f"normalized_shape={a.value!r}")


def _ln_shape(g, rank_lo=1):
    shape = g.shape(rank=g.int(rank_lo, 5))
    k = g.int(1, len(shape))
    ns = shape[len(shape) - k:]
    return shape, k, ns, shape[:len(shape) - k] + (1,) * k


def _affine_args(g, c, dt, ns, p_none=0.3):
    for name in ("weight", "bias"):
        v = g.maybe(lambda: coef(g, ns, COEF[dt]), p_none)
        c.add(name, v, "array", kw=g.p(0.2), dtypes=COEF[dt], shapes=[tuple(ns)], optional=True)


@target("cynorm.layer_norm", lambda: cynorm.layer_norm)
def gen_layer_norm(g):
    c = new("cynorm.layer_norm", g)
    dt = g.dtype()
    shape, k, ns, stat_shape = _ln_shape(g)
    c.add("x", g.array(shape, dt), "array", huge=True)
    c.add("normalized_shape", ns_form(g, ns), "custom", mutate=mut_ns, ns=ns, ndim=len(shape))
    _affine_args(g, c, dt, ns)
    draw_eps(g, c)
    sd = STAT[dt]
    add_out(g, c, [("y", shape, dt, "CF"), ("mean", stat_shape, sd, "C"), ("rstd", stat_shape, sd, "C")])
    c.oracle = lambda s, res, live: O.verify(O.ref_layer_norm(
        s["x"], s["normalized_shape"], s["weight"], s["bias"], s["eps"]), res) + out_identity(c, res)
    return finish(g, c)


def true_ln_stats(x, k, eps=1e-5):
    x64 = np.asarray(x, np.float64)
    axes = tuple(range(x64.ndim - k, x64.ndim))
    with np.errstate(all="ignore"):
        mean = x64.mean(axis=axes, keepdims=True) if x64.size else np.zeros(
            x64.shape[:x64.ndim - k] + (1,) * k)
        var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True) if x64.size else mean
        return mean, 1 / np.sqrt(var + eps)


def stat_array(g, values, shape, dtype, p_true=0.7, positive_only=False):
    """Saved statistics: the true values (rounded), or drawn ones."""
    with np.errstate(all="ignore"):
        if g.moderate or g.p(p_true):
            a = np.asarray(values).reshape(shape).astype(dtype)
        else:
            a = positive(g, shape, dtype) if positive_only else g.array(shape, dtype)
    return g.place(np.asarray(a), g.layout(len(shape))) if not g.moderate else np.array(a, order="C", copy=True)


def _ln_backward_args(g, c, x, dt, shape, k, ns, stat_shape):
    """The arguments of a layer-norm backward after its input x (or h):
    normalized_shape, mean, rstd (x's, or drawn), weight, bias, output_mask."""
    c.add("normalized_shape", ns_form(g, ns), "custom", mutate=mut_ns, ns=ns, ndim=len(shape))
    mean, rstd = true_ln_stats(x, k)
    M = math.prod(shape[:len(shape) - k])
    shapes = [stat_shape, (M,)]
    sshape = g.pick(shapes)
    sd = _stat_dtype(g, dt)
    c.add("mean", stat_array(g, mean, sshape, sd), "array", shapes=shapes)
    c.add("rstd", stat_array(g, rstd, sshape, sd, positive_only=True), "array", shapes=shapes)
    _affine_args(g, c, dt, ns)
    c.add("output_mask", tuple(g.p(0.8) for _ in range(3)), "mask", kw=g.p(0.3))


@target("cynorm.layer_norm_backward", lambda: cynorm.layer_norm_backward)
def gen_layer_norm_backward(g):
    c = new("cynorm.layer_norm_backward", g)
    dt = g.dtype()
    shape, k, ns, stat_shape = _ln_shape(g)
    x = g.array(shape, dt)
    c.add("grad_out", g.array(shape, dt), "array", huge=True)
    c.add("x", x, "array")
    _ln_backward_args(g, c, x, dt, shape, k, ns, stat_shape)
    c.oracle = lambda s, res, live: O.verify(O.ref_layer_norm_backward(
        s["grad_out"], s["x"], s["normalized_shape"], s["mean"], s["rstd"], s["weight"], s["bias"],
        tuple(s["output_mask"])), res)
    return finish(g, c)


# ================================================================== cynorm: RMS norm

# eps=None is valid for RMS norm (the math type's epsilon)
EPS_OR_NONE_BAD = [(v, "ok" if v is None else e) for v, e in EPS_BAD]


def mut_eps_or_none(g, c, a):
    mutate_scalar(g, c, a, EPS_OR_NONE_BAD)


def _rms_weight(g, c, dt, ns):
    v = g.maybe(lambda: coef(g, ns, COEF[dt]), 0.3)
    c.add("weight", v, "array", kw=g.p(0.2), dtypes=COEF[dt], shapes=[tuple(ns)], optional=True)


def _rms_args(g, c, dt, shape, ns):
    """An RMS-norm forward's arguments after x (and residual):
    normalized_shape, weight, eps (None or drawn)."""
    c.add("normalized_shape", ns_form(g, ns), "custom", mutate=mut_ns, ns=ns, ndim=len(shape))
    _rms_weight(g, c, dt, ns)
    c.add("eps", None if g.p(0.4) else scalar_eps(g), "custom", mutate=mut_eps_or_none,
          kw=g.p(0.5))


def _rms_backward_args(g, c, x, dt, shape, k, ns, stat_shape):
    """An RMS-norm backward's arguments after its input x (or h):
    normalized_shape, rstd (x's, or drawn), weight, output_mask."""
    c.add("normalized_shape", ns_form(g, ns), "custom", mutate=mut_ns, ns=ns, ndim=len(shape))
    x64 = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        ms = (x64 * x64).mean(axis=tuple(range(len(shape) - k, len(shape))), keepdims=True) \
            if x64.size else np.zeros(stat_shape)
        rstd = 1 / np.sqrt(ms + 1e-5)
    M = math.prod(shape[:len(shape) - k])
    shapes = [stat_shape, (M,)]
    c.add("rstd", stat_array(g, rstd, g.pick(shapes), _stat_dtype(g, dt), positive_only=True),
          "array", shapes=shapes)
    _rms_weight(g, c, dt, ns)
    c.add("output_mask", tuple(g.p(0.8) for _ in range(2)), "mask", kw=g.p(0.3), n=2)


@target("cynorm.rms_norm", lambda: cynorm.rms_norm)
def gen_rms_norm(g):
    c = new("cynorm.rms_norm", g)
    dt = g.dtype()
    shape, k, ns, stat_shape = _ln_shape(g)
    c.add("x", g.array(shape, dt), "array", huge=True)
    _rms_args(g, c, dt, shape, ns)
    add_out(g, c, [("y", shape, dt, "CF"), ("rstd", stat_shape, STAT[dt], "C")])
    c.oracle = lambda s, res, live: O.verify(O.ref_rms_norm(
        s["x"], s["normalized_shape"], s["weight"], s["eps"]), res) + out_identity(c, res)
    return finish(g, c)


@target("cynorm.rms_norm_backward", lambda: cynorm.rms_norm_backward)
def gen_rms_norm_backward(g):
    c = new("cynorm.rms_norm_backward", g)
    dt = g.dtype()
    shape, k, ns, stat_shape = _ln_shape(g)
    x = g.array(shape, dt)
    c.add("grad_out", g.array(shape, dt), "array", huge=True)
    c.add("x", x, "array")
    _rms_backward_args(g, c, x, dt, shape, k, ns, stat_shape)
    c.oracle = lambda s, res, live: O.verify(O.ref_rms_norm_backward(
        s["grad_out"], s["x"], s["normalized_shape"], s["rstd"], s["weight"],
        tuple(s["output_mask"])), res)
    return finish(g, c)


# ================================================================== cynorm: residual-fused norms

def _residual_args(g, c, shape, dt):
    c.add("x", g.array(shape, dt), "array", huge=True)
    c.add("residual", g.array(shape, dt), "array", dtypes=[dt], shapes=[tuple(shape)], huge=True)


@target("cynorm.add_layer_norm", lambda: cynorm.add_layer_norm)
def gen_add_layer_norm(g):
    c = new("cynorm.add_layer_norm", g)
    dt = g.dtype()
    shape, k, ns, stat_shape = _ln_shape(g)
    _residual_args(g, c, shape, dt)
    c.add("normalized_shape", ns_form(g, ns), "custom", mutate=mut_ns, ns=ns, ndim=len(shape))
    _affine_args(g, c, dt, ns)
    draw_eps(g, c)
    sd = STAT[dt]
    add_out(g, c, [("y", shape, dt, "CF"), ("h", shape, dt, "CF"), ("mean", stat_shape, sd, "C"),
                   ("rstd", stat_shape, sd, "C")])
    c.oracle = lambda s, res, live: O.verify(O.ref_add_layer_norm(
        s["x"], s["residual"], s["normalized_shape"], s["weight"], s["bias"], s["eps"]),
        res) + out_identity(c, res)
    return finish(g, c)


@target("cynorm.add_rms_norm", lambda: cynorm.add_rms_norm)
def gen_add_rms_norm(g):
    c = new("cynorm.add_rms_norm", g)
    dt = g.dtype()
    shape, k, ns, stat_shape = _ln_shape(g)
    _residual_args(g, c, shape, dt)
    _rms_args(g, c, dt, shape, ns)
    add_out(g, c, [("y", shape, dt, "CF"), ("h", shape, dt, "CF"),
                   ("rstd", stat_shape, STAT[dt], "C")])
    c.oracle = lambda s, res, live: O.verify(O.ref_add_rms_norm(
        s["x"], s["residual"], s["normalized_shape"], s["weight"], s["eps"]),
        res) + out_identity(c, res)
    return finish(g, c)


def _grad_h_args(g, c, shape, dt):
    """grad_out, grad_h (optional) and h; returns h."""
    h = g.array(shape, dt)
    c.add("grad_out", g.array(shape, dt), "array", huge=True)
    c.add("grad_h", g.maybe(lambda: g.array(shape, dt), 0.3), "array", dtypes=[dt],
          shapes=[tuple(shape)], optional=True)
    c.add("h", h, "array")
    return h


@target("cynorm.add_layer_norm_backward", lambda: cynorm.add_layer_norm_backward)
def gen_add_layer_norm_backward(g):
    c = new("cynorm.add_layer_norm_backward", g)
    dt = g.dtype()
    shape, k, ns, stat_shape = _ln_shape(g)
    h = _grad_h_args(g, c, shape, dt)
    _ln_backward_args(g, c, h, dt, shape, k, ns, stat_shape)
    c.oracle = lambda s, res, live: O.verify(O.ref_add_layer_norm_backward(
        s["grad_out"], s["grad_h"], s["h"], s["normalized_shape"], s["mean"], s["rstd"],
        s["weight"], s["bias"], tuple(s["output_mask"])), res)
    return finish(g, c)


@target("cynorm.add_rms_norm_backward", lambda: cynorm.add_rms_norm_backward)
def gen_add_rms_norm_backward(g):
    c = new("cynorm.add_rms_norm_backward", g)
    dt = g.dtype()
    shape, k, ns, stat_shape = _ln_shape(g)
    h = _grad_h_args(g, c, shape, dt)
    _rms_backward_args(g, c, h, dt, shape, k, ns, stat_shape)
    c.oracle = lambda s, res, live: O.verify(O.ref_add_rms_norm_backward(
        s["grad_out"], s["grad_h"], s["h"], s["normalized_shape"], s["rstd"], s["weight"],
        tuple(s["output_mask"])), res)
    return finish(g, c)


# ================================================================== cynorm: batch norm

def _bn_shape(g):
    shape = g.shape(rank=g.int(2, 5))
    nd = len(shape)
    axis = g.pick((1, 1, -1, g.int(-nd, nd - 1)))
    return shape, nd, axis, shape[axis % nd], math.prod(shape) // max(shape[axis % nd], 1) \
        if shape[axis % nd] else math.prod(s for i, s in enumerate(shape) if i != axis % nd)


def running_array(g, C, dtype, var=False, training=True):
    vals = np.abs(g.values((C,), dtype, "normal")) if var else g.values((C,), dtype, "normal")
    if g.p(0.15):
        vals = g.values((C,), dtype)
        vals = np.abs(vals) if var else vals
    with np.errstate(over="ignore"):
        a = vals.astype(dtype)
    lay = g.pick(("C", "C", "C", "neg", "strided", "unaligned")) if training else g.layout(1)
    return g.place(a, lay)


def _bn_params(g, c, dt, C, training, rm_optional=True):
    _affine_args(g, c, dt, (C,))
    for name, var in (("running_mean", False), ("running_var", True)):
        opt = training and rm_optional
        v = g.maybe(lambda: running_array(g, C, g.pick(COEF[dt]), var, training), 0.3 if opt else 0.0)
        c.add(name, v, "array", kw=g.p(0.2), dtypes=COEF[dt], shapes=[(C,)], optional=opt,
              updatable=training)


def _axis_arg(g, c, axis, nd):
    c.add("axis", axis, "axis", kw=g.p(0.5), ndim=nd, none_ok="error", dependent=True)


def _is_zero(v):
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)) \
        and v == 0


def running_problems(c, s, live, refs, skip):
    """Problems of the running statistics an op updates in place: refs the
    expected (running_mean, running_var) after it (None: unchanged)."""
    probs = []
    for name, ref in zip(("running_mean", "running_var"), refs):
        after = live[name]
        if c.aliased and isinstance(after, np.ndarray) and any(
                np.shares_memory(after, o) for _, o in c.out_slots):
            continue        # an out= array overlapping it was written: the aliasing is the caller's
        probs += O.running_checks(name, s[name], ref, after, skip)
    return probs


@target("cynorm.batch_norm", lambda: cynorm.batch_norm)
def gen_batch_norm(g):
    c = new("cynorm.batch_norm", g)
    dt = g.dtype()
    shape, nd, axis, C, n = _bn_shape(g)
    training = g.p(0.7)
    c.add("x", g.array(shape, dt), "array", huge=True)
    _bn_params(g, c, dt, C, training, rm_optional=True)
    c.add("training", training, "flag", kw=g.p(0.3))
    c.add("momentum", g.pick((0.1, 0.1, 0.0, 1.0, 0.5, np.float32(0.3))), "real", kw=g.p(0.5))
    draw_eps(g, c)
    _axis_arg(g, c, axis, nd)
    c.inplace |= {"running_mean", "running_var"}     # updated in place in training
    sd = STAT[dt]
    st = (C,) if training else (0,)
    add_out(g, c, [("y", shape, dt, "CF"), ("save_mean", st, sd, "C"), ("save_invstd", st, sd, "C")])

    def oracle(s, res, live):
        outs, rm, rv, skip = O.ref_batch_norm(s["x"], s["weight"], s["bias"], s["running_mean"],
                                              s["running_var"], s["training"], s["momentum"],
                                              s["eps"], s["axis"])
        tr = bool(s["training"])
        return (O.verify(outs, res) + out_identity(c, res)
                + running_problems(c, s, live, (rm, rv) if tr else (None, None), skip))
    c.oracle = oracle
    c = finish(g, c)
    tr = c.value("training")
    if not (isinstance(tr, (bool, np.bool_)) and tr):      # only training updates them
        c.inplace -= {"running_mean", "running_var"}
    elif n == 1 and c.value("x") is not None and np.shape(c.value("x")) == shape:
        c.one_value = True
        if not getattr(g, "defer_one_value", False):    # sync_batch_norm decides after its mutation
            c.want("error", "one value per channel in training")
    if not getattr(g, "no_out", False) and isinstance(tr, (bool, np.bool_)) and tr and _is_zero(c.value("eps")):
        c.want("error", "eps=0 in training (README: as torch.nn.functional.batch_norm)")
    return c


# ================================================================== cynorm: group norm, instance norm

def _gn_shape(g):
    """(shape, ndim, axis, C, num_groups): channels first (axis 1) or last."""
    shape = g.shape(rank=g.int(2, 5))
    nd = len(shape)
    axis = g.pick((1, 1, -1, nd - 1))
    C = shape[axis % nd]
    divisors = [d for d in range(1, C + 1) if C % d == 0] if C else [1, 2, 3]
    return shape, nd, axis, C, g.pick(divisors)


def mut_groups(g, c, a):
    C = a.spec["C"]
    bad = [0, -1, 1.0, True, "2", None] + ([C + 1] if C else []) + \
        [d for d in range(2, C) if C % d][:2]
    a.value = g.pick(bad)
    c.want("error", f"num_groups={a.value!r}")


def _gn_groups_arg(g, c, G, C):
    c.add("num_groups", g.pick((int, np.int64, np.int32))(G), "custom", mutate=mut_groups, C=C)


@target("cynorm.group_norm", lambda: cynorm.group_norm)
def gen_group_norm(g):
    c = new("cynorm.group_norm", g)
    dt = g.dtype()
    shape, nd, axis, C, G = _gn_shape(g)
    c.add("x", g.array(shape, dt), "array", huge=True)
    _gn_groups_arg(g, c, G, C)
    _affine_args(g, c, dt, (C,))
    draw_eps(g, c)
    c.add("axis", axis, "axis", kw=g.p(0.5), ndim=nd, none_ok="error", dependent=True)
    N = shape[0]
    sd = STAT[dt]
    add_out(g, c, [("y", shape, dt, "any"), ("mean", (N, G), sd, "C"),
                   ("rstd", (N, G), sd, "C")])
    c.oracle = lambda s, res, live: O.verify(O.ref_group_norm(
        s["x"], s["num_groups"], s["weight"], s["bias"], s["eps"], s["axis"]),
        res) + out_identity(c, res)
    return finish(g, c)


def _gn_backward_args(g, c, dt, shape, axis, G, stat_name):
    """A group-norm backward's arguments grad_out, x, mean, rstd (x's own or
    drawn); G groups per sample."""
    x = g.array(shape, dt)
    c.add("grad_out", g.array(shape, dt), "array", huge=True)
    c.add("x", x, "array")
    x64 = np.moveaxis(np.asarray(x, np.float64), axis % len(shape), 1)
    N = shape[0]
    with np.errstate(all="ignore"):
        rows = x64.reshape(N * G, -1) if N * G else np.zeros((0, 1))
        mean = rows.mean(axis=1) if rows.shape[1] else np.zeros(N * G)
        rstd = 1 / np.sqrt(((rows - mean[:, None]) ** 2).mean(axis=1) + 1e-5) \
            if rows.shape[1] else np.full(N * G, np.nan)
    shapes = [(N, G), (N * G,)]
    sd = _stat_dtype(g, dt)
    c.add("mean", stat_array(g, mean, g.pick(shapes), sd), "array", shapes=shapes)
    c.add("rstd", stat_array(g, rstd, g.pick(shapes), sd, positive_only=True), "array",
          shapes=shapes)


@target("cynorm.group_norm_backward", lambda: cynorm.group_norm_backward)
def gen_group_norm_backward(g):
    c = new("cynorm.group_norm_backward", g)
    dt = g.dtype()
    shape, nd, axis, C, G = _gn_shape(g)
    _gn_backward_args(g, c, dt, shape, axis, G, "group")
    c.add("weight", g.maybe(lambda: coef(g, (C,), COEF[dt]), 0.3), "array", dtypes=COEF[dt],
          shapes=[(C,)], optional=True)
    _gn_groups_arg(g, c, G, C)
    c.add("output_mask", tuple(g.p(0.8) for _ in range(3)), "mask", kw=g.p(0.3))
    c.add("axis", axis, "axis", kw=g.p(0.5), ndim=nd, none_ok="error", dependent=True)
    c.oracle = lambda s, res, live: O.verify(O.ref_group_norm_backward(
        s["grad_out"], s["x"], s["mean"], s["rstd"], s["weight"], s["num_groups"],
        tuple(s["output_mask"]), s["axis"]), res)
    return finish(g, c)


@target("cynorm.instance_norm", lambda: cynorm.instance_norm)
def gen_instance_norm(g):
    c = new("cynorm.instance_norm", g)
    dt = g.dtype()
    shape, nd, axis, C, _ = _gn_shape(g)
    use_input_stats = g.p(0.7)
    c.add("x", g.array(shape, dt), "array", huge=True)
    _affine_args(g, c, dt, (C,))
    for name, var in (("running_mean", False), ("running_var", True)):
        v = g.maybe(lambda: running_array(g, C, g.pick(COEF[dt]), var, use_input_stats),
                    0.4 if use_input_stats else 0.0)
        c.add(name, v, "array", kw=g.p(0.2), dtypes=COEF[dt], shapes=[(C,)],
              optional=use_input_stats, updatable=use_input_stats)
    c.add("use_input_stats", use_input_stats, "flag", kw=g.p(0.3))
    c.add("momentum", g.pick((0.1, 0.1, 0.0, 1.0, 0.5)), "real", kw=g.p(0.5))
    draw_eps(g, c)
    c.add("axis", axis, "axis", kw=g.p(0.5), ndim=nd, none_ok="error", dependent=True)
    c.inplace |= {"running_mean", "running_var"}
    N = shape[0]
    sd = STAT[dt]
    add_out(g, c, [("y", shape, dt, "any"), ("mean", (N, C), sd, "C"),
                   ("rstd", (N, C), sd, "C")])

    def oracle(s, res, live):
        outs, rm, rv = O.ref_instance_norm(s["x"], s["weight"], s["bias"], s["running_mean"],
                                           s["running_var"], s["use_input_stats"],
                                           s["momentum"], s["eps"], s["axis"])
        used = bool(s["use_input_stats"])
        return (O.verify(outs, res) + out_identity(c, res)
                + running_problems(c, s, live, (rm, rv) if used else (None, None), False))
    c.oracle = oracle
    c = finish(g, c)
    used = c.value("use_input_stats")
    if not (isinstance(used, (bool, np.bool_)) and used):
        c.inplace -= {"running_mean", "running_var"}
    elif (c.value("running_mean") is not None or c.value("running_var") is not None) \
            and isinstance(c.value("x"), np.ndarray) and c.value("x").shape == shape \
            and math.prod(shape) // max(shape[0] * C, 1) < 2 and shape[0] * C:
        c.want("error", "fewer than 2 spatial positions with running statistics to update")
    return c


@target("cynorm.instance_norm_backward", lambda: cynorm.instance_norm_backward)
def gen_instance_norm_backward(g):
    c = new("cynorm.instance_norm_backward", g)
    dt = g.dtype()
    shape, nd, axis, C, _ = _gn_shape(g)
    _gn_backward_args(g, c, dt, shape, axis, C, "instance")
    c.add("weight", g.maybe(lambda: coef(g, (C,), COEF[dt]), 0.3), "array", dtypes=COEF[dt],
          shapes=[(C,)], optional=True)
    c.add("use_input_stats", g.p(0.7), "flag", kw=g.p(0.3))
    c.add("output_mask", tuple(g.p(0.8) for _ in range(3)), "mask", kw=g.p(0.3))
    c.add("axis", axis, "axis", kw=g.p(0.5), ndim=nd, none_ok="error", dependent=True)
    c.oracle = lambda s, res, live: O.verify(O.ref_instance_norm_backward(
        s["grad_out"], s["x"], s["mean"], s["rstd"], s["weight"], s["use_input_stats"],
        tuple(s["output_mask"]), s["axis"]), res)
    return finish(g, c)


def true_bn_stats(x, axis, eps=1e-5):
    x64 = np.asarray(x, np.float64)
    ax = axis % x64.ndim
    C = x64.shape[ax]
    rows = np.moveaxis(x64, ax, 0).reshape(C, math.prod(s for i, s in enumerate(x64.shape) if i != ax))
    with np.errstate(all="ignore"):
        mean = rows.mean(axis=1) if rows.shape[1] else np.full(rows.shape[0], np.nan)
        var = ((rows - mean[:, None]) ** 2).mean(axis=1) if rows.shape[1] else mean
        return mean, 1 / np.sqrt(var + eps), var


def _stat_dtype(g, dt):
    return STAT[dt] if g.moderate else g.pick((STAT[dt],) * 4 + FLOATS)


@target("cynorm.batch_norm_backward", lambda: cynorm.batch_norm_backward)
def gen_batch_norm_backward(g):
    c = new("cynorm.batch_norm_backward", g)
    dt = g.dtype()
    shape, nd, axis, C, n = _bn_shape(g)
    training = g.p(0.7)
    x = g.array(shape, dt)
    c.add("grad_out", g.array(shape, dt), "array", huge=True)
    c.add("x", x, "array")
    c.add("weight", g.maybe(lambda: coef(g, (C,), COEF[dt]), 0.3), "array", dtypes=COEF[dt],
          shapes=[(C,)], optional=True)
    for name, var in (("running_mean", False), ("running_var", True)):
        v = g.maybe(lambda: running_array(g, C, g.pick(COEF[dt]), var, False), 0.5 if training else 0)
        c.add(name, v, "array", dtypes=COEF[dt], shapes=[(C,)], optional=training, unused=training)
    mean, inv, _ = true_bn_stats(x, axis)
    sd = _stat_dtype(g, dt)
    if training:
        c.add("save_mean", stat_array(g, mean, (C,), sd), "array", shapes=[(C,)])
        c.add("save_invstd", stat_array(g, inv, (C,), sd, positive_only=True), "array", shapes=[(C,)])
    else:
        c.add("save_mean", g.pick((None, np.zeros(0, STAT[dt]))))
        c.add("save_invstd", g.pick((None, np.zeros(0, STAT[dt]))))
    c.add("training", training, "flag")
    draw_eps(g, c)
    c.add("output_mask", tuple(g.p(0.8) for _ in range(3)), "mask", kw=g.p(0.3))
    _axis_arg(g, c, axis, nd)
    c.oracle = lambda s, res, live: O.verify(O.ref_batch_norm_backward(
        s["grad_out"], s["x"], s["weight"], s["running_mean"], s["running_var"], s["save_mean"],
        s["save_invstd"], s["training"], s["eps"], tuple(s["output_mask"]), s["axis"]), res)
    return finish(g, c)


def _aten_backward(name, resolve, kind):
    """The ATen adapters: cudnn/miopen (training formula) and aten.batch_norm_backward."""
    def gen(g):
        c = new(name, g)
        dt = g.dtype()
        shape = g.shape(rank=g.int(2, 5))
        C = shape[1]
        training = g.p(0.7) if kind == "aten" else True
        x = g.array(shape, dt)
        dy = g.array(shape, dt)
        if kind == "aten":
            c.add("grad_out", dy, "array")
            c.add("input", x, "array")
        else:
            c.add("input", x, "array")
            c.add("grad_output", dy, "array")
        c.add("weight", g.maybe(lambda: coef(g, (C,), COEF[dt]), 0.2), "array", dtypes=COEF[dt],
              shapes=[(C,)], optional=True)
        for nm, var in (("running_mean", False), ("running_var", True)):
            v = g.maybe(lambda: running_array(g, C, g.pick(COEF[dt]), var, False), 0.5 if training else 0)
            c.add(nm, v, "array", dtypes=COEF[dt], shapes=[(C,)], optional=training, unused=training)
        mean, inv, _ = true_bn_stats(x, 1)
        sd = _stat_dtype(g, dt)
        c.add("save_mean", stat_array(g, mean, (C,), sd), "array", shapes=[(C,)], optional=not training,
              unused=not training)
        c.add("save_var", stat_array(g, inv, (C,), sd, positive_only=True), "array", shapes=[(C,)],
              optional=not training, unused=not training)
        if kind == "aten":
            c.add("update", training, "flag")
            draw_eps(g, c, kw=False)
            c.add("output_mask", tuple(g.p(0.8) for _ in range(3)), "mask")
            if g.p(0.3):
                c.add("reserve", g.pick((None, np.zeros(3, np.uint8), "anything")), kw=g.p(0.5))
        else:
            draw_eps(g, c, name="epsilon", kw=False)
            if kind == "cudnn" and g.p(0.5):
                c.add("reserveSpace", g.pick((None, np.zeros(3, np.uint8), object())))

        def oracle(s, res, live):
            if kind == "aten":
                return O.verify(O.ref_batch_norm_backward(
                    s["grad_out"], s["input"], s["weight"], s["running_mean"], s["running_var"],
                    s["save_mean"], s["save_var"], s["update"], s["eps"], tuple(s["output_mask"]), 1), res)
            return O.verify(O.ref_batch_norm_backward(
                s["grad_output"], s["input"], s["weight"], s["running_mean"], s["running_var"],
                s["save_mean"], s["save_var"], True, s["epsilon"], (True, True, True), 1), res)
        c.oracle = oracle
        return finish(g, c)
    return target(name, resolve)(gen)


_aten_backward("cynorm.cudnn_batch_norm_backward", lambda: cynorm.cudnn_batch_norm_backward, "cudnn")
_aten_backward("cynorm.miopen_batch_norm_backward", lambda: cynorm.miopen_batch_norm_backward, "miopen")
_aten_backward("cynorm.aten.batch_norm_backward", lambda: cynorm.aten.batch_norm_backward, "aten")


@target("cynorm.batch_norm_stats", lambda: cynorm.batch_norm_stats)
def gen_batch_norm_stats(g):
    c = new("cynorm.batch_norm_stats", g)
    dt = g.dtype()
    shape, nd, axis, C, n = _bn_shape(g)
    c.add("x", g.array(shape, dt), "array", huge=True)
    draw_eps(g, c)
    _axis_arg(g, c, axis, nd)
    c.oracle = lambda s, res, live: O.verify(O.ref_batch_norm_stats(s["x"], s["eps"], s["axis"]), res)
    return finish(g, c)


def mut_counts(g, c, a):
    W = a.spec["W"]
    r = g.int(0, 5)
    if r == 0:
        a.value = np.array([-1.0] + [2.0] * (W - 1))
        c.want("error", "counts with a negative entry")
    elif r == 1 and W:
        a.value = np.array([g.pick((np.nan, np.inf))] * W)
        c.want("error", "counts not finite")
    elif r == 2:
        a.value = np.ones(W + 1)
        c.want("error", "counts of the wrong length")
    elif r == 3:
        a.value = g.pick((["a"] * W, np.array([10 ** 400] * W, dtype=object), np.ones(W, complex), "3"))
        c.want("error" if W or isinstance(a.value, str) else "either", f"counts={a.value!r:.40}")
    elif r == 4:
        a.value = np.ones((W, 1))
        c.want("error", "counts 2-D")
    else:
        a.value = np.asarray(a.value, np.float64) * g.pick((0.5, 1.0, 2.0 ** 50))
        c.want("either", "counts scaled")


@target("cynorm.batch_norm_gather_stats", lambda: cynorm.batch_norm_gather_stats)
def gen_batch_norm_gather_stats(g):
    c = new("cynorm.batch_norm_gather_stats", g)
    dt = g.dtype()
    W, C = g.int(0, 5), g.size(zero=0.05)
    eps = scalar_eps(g) if not g.p(0.5) else 1e-5
    counts = np.array([g.pick((0, 1, 2, 3, 7, 100)) for _ in range(W)], np.int64)
    if g.p(0.6):     # statistics of real shards
        means, invs = np.zeros((W, C)), np.zeros((W, C))
        for k in range(W):
            shard = g.values((max(int(counts[k]), 1), C), dt)
            with np.errstate(all="ignore"):
                means[k] = shard.mean(0)
                invs[k] = 1 / np.sqrt(shard.var(0) + float(eps))
        sd = STAT[dt]
        with np.errstate(over="ignore"):
            m, s = means.astype(sd), invs.astype(sd)
    else:
        sd = g.pick(FLOATS)
        m, s = g.values((W, C), sd).astype(sd), np.abs(g.values((W, C), sd)).astype(sd)
    c.add("mean", g.place(m, g.layout(2)), "array", shapes=[(W, C)])
    c.add("invstd", g.place(s, g.layout(2)), "array", shapes=[(W, C)])
    cform = g.pick((counts, counts.astype(float), counts.tolist(), counts.astype(np.uint8)))
    c.add("counts", cform, "custom", mutate=mut_counts, W=W)
    rdt = STAT[sd] if sd in STAT else F32
    total = float(counts.sum())
    if g.p(0.5):
        for name, var in (("running_mean", False), ("running_var", True)):
            c.add(name, running_array(g, C, g.pick(COEF.get(sd, (F32,))), var), "array",
                  shapes=[(C,)], optional=False, updatable=True, kw=g.p(0.3))
        c.inplace |= {"running_mean", "running_var"}
    else:
        c.add("running_mean", None, kw=True)
        c.add("running_var", None, kw=True)
    c.add("momentum", g.pick((0.1, 0.0, 1.0, 0.3)), "real", kw=True)
    c.add("eps", eps, "eps", kw=True)

    def oracle(s, res, live):
        outs, rm, rv = O.ref_batch_norm_gather_stats(s["mean"], s["invstd"], s["counts"],
                                                     s["running_mean"], s["running_var"],
                                                     s["momentum"], s["eps"])
        return (O.verify(outs, res)
                + O.running_checks("running_mean", s["running_mean"], rm, live["running_mean"], None)
                + O.running_checks("running_var", s["running_var"], rv, live["running_var"], None))
    c.oracle = oracle
    c = finish(g, c)
    if c.value("running_mean") is not None and c.value("running_var") is not None:
        try:
            tot = float(np.sum(np.asarray(c.value("counts"), np.float64)))
        except (TypeError, ValueError, OverflowError):
            tot = None
        if tot is not None and 0 < tot <= 1:
            c.want("error", f"{tot:g} values in all, with running statistics")
    if not c.notes and c.value("running_var") is not None and g.p(0.1):
        c.set(g.pick(("running_mean", "running_var")), None)
        c.want("error", "one of running_mean / running_var without the other")
    return c


@target("cynorm.batch_norm_elemt", lambda: cynorm.batch_norm_elemt)
def gen_batch_norm_elemt(g):
    c = new("cynorm.batch_norm_elemt", g)
    dt = g.dtype()
    shape, nd, axis, C, n = _bn_shape(g)
    x = g.array(shape, dt)
    c.add("x", x, "array", huge=True)
    c.add("weight", g.maybe(lambda: coef(g, (C,), COEF[dt]), 0.3), "array", dtypes=COEF[dt],
          shapes=[(C,)], optional=True)
    c.add("bias", g.maybe(lambda: coef(g, (C,), COEF[dt]), 0.3), "array", dtypes=COEF[dt],
          shapes=[(C,)], optional=True)
    mean, inv, _ = true_bn_stats(x, axis)
    sd = _stat_dtype(g, dt)
    c.add("mean", stat_array(g, mean, (C,), sd), "array", shapes=[(C,)])
    c.add("invstd", stat_array(g, inv, (C,), sd, positive_only=True), "array", shapes=[(C,)])
    draw_eps(g, c)
    _axis_arg(g, c, axis, nd)
    add_out(g, c, [("y", shape, dt, "CF")], single=True)
    c.oracle = lambda s, res, live: O.verify(O.ref_batch_norm_elemt(
        s["x"], s["weight"], s["bias"], s["mean"], s["invstd"], s["eps"], s["axis"]), res,
        single=True) + out_identity(c, res)
    return finish(g, c)


@target("cynorm.batch_norm_backward_reduce", lambda: cynorm.batch_norm_backward_reduce)
def gen_batch_norm_backward_reduce(g):
    c = new("cynorm.batch_norm_backward_reduce", g)
    dt = g.dtype()
    shape, nd, axis, C, n = _bn_shape(g)
    x = g.array(shape, dt)
    c.add("grad_out", g.array(shape, dt), "array", huge=True)
    c.add("x", x, "array")
    mean, inv, _ = true_bn_stats(x, axis)
    sd = _stat_dtype(g, dt)
    c.add("mean", stat_array(g, mean, (C,), sd), "array", shapes=[(C,)])
    c.add("invstd", stat_array(g, inv, (C,), sd, positive_only=True), "array", shapes=[(C,)])
    c.add("weight", g.maybe(lambda: coef(g, (C,), COEF[dt]), 0.3), "array", dtypes=COEF[dt],
          shapes=[(C,)], optional=True)
    kw = g.p(0.3)
    for name in ("input_g", "weight_g", "bias_g"):
        c.add(name, g.p(0.8), "flag", kw=kw)
    _axis_arg(g, c, axis, nd)
    c.oracle = lambda s, res, live: O.verify(O.ref_batch_norm_backward_reduce(
        s["grad_out"], s["x"], s["mean"], s["invstd"], s["weight"], s["input_g"], s["weight_g"],
        s["bias_g"], s["axis"]), res)
    return finish(g, c)


def mut_count(g, c, a):
    r = g.int(0, 4)
    if r == 0:
        a.value = g.pick((0, 0.0, [0, 0], np.zeros(3)))
        c.want("error", f"count={a.value!r} (adds up to 0)")
    elif r == 1:
        a.value = g.pick((-3, [-1, 5], float("nan"), float("inf"), [np.inf]))
        c.want("error", f"count={a.value!r}")
    elif r == 2:
        a.value = g.pick(("4", None, [[1, 2], [3, 4]], [1j], np.array([10 ** 400], object)))
        c.want("error", f"count={a.value!r:.30}")
    elif r == 3:
        a.value = g.pick((np.int64(7), 2.5, np.array([3, 4], np.uint8), (2, 5), 10 ** 400))
        c.want("either", f"count={a.value!r:.30}")
    else:
        a.value = True
        c.want("either", "count=True")


@target("cynorm.batch_norm_backward_elemt", lambda: cynorm.batch_norm_backward_elemt)
def gen_batch_norm_backward_elemt(g):
    c = new("cynorm.batch_norm_backward_elemt", g)
    dt = g.dtype()
    shape, nd, axis, C, n = _bn_shape(g)
    x = g.array(shape, dt)
    dy = g.array(shape, dt)
    c.add("grad_out", dy, "array", huge=True)
    c.add("x", x, "array")
    mean, inv, _ = true_bn_stats(x, axis)
    sd = _stat_dtype(g, dt)
    c.add("mean", stat_array(g, mean, (C,), sd), "array", shapes=[(C,)])
    c.add("invstd", stat_array(g, inv, (C,), sd, positive_only=True), "array", shapes=[(C,)])
    c.add("weight", g.maybe(lambda: coef(g, (C,), COEF[dt]), 0.3), "array", dtypes=COEF[dt],
          shapes=[(C,)], optional=True)
    with np.errstate(all="ignore"):
        d64, x64 = np.asarray(dy, np.float64), np.asarray(x, np.float64)
        ax = axis % nd
        m = math.prod(s for i, s in enumerate(shape) if i != ax)
        rd = np.moveaxis(d64, ax, 0).reshape(C, m)
        rx = np.moveaxis(x64, ax, 0).reshape(C, m)
        sdy = rd.sum(1)
        sdx = (rd * (rx - np.nan_to_num(mean)[:, None])).sum(1)
    if g.p(0.3):
        sdy, sdx = g.values((C,), F64), g.values((C,), F64)
    c.add("sum_dy", g.place(sdy.astype(sd), "C"), "array", shapes=[(C,)])
    c.add("sum_dy_xmu", g.place(sdx.astype(sd), "C"), "array", shapes=[(C,)])
    cnt = max(n, 1) * g.pick((1, 1, 2, 3))
    c.add("count", g.pick((cnt, [cnt], np.array([n, cnt], np.int64), float(cnt), np.int32(cnt))),
          "custom", mutate=mut_count)
    _axis_arg(g, c, axis, nd)
    add_out(g, c, [("grad_x", shape, dt, "CF")], single=True)
    c.oracle = lambda s, res, live: O.verify(O.ref_batch_norm_backward_elemt(
        s["grad_out"], s["x"], s["mean"], s["invstd"], s["weight"], s["sum_dy"], s["sum_dy_xmu"],
        s["count"], s["axis"]), res, single=True) + out_identity(c, res)
    return finish(g, c)


# ================================================================== cynorm: softmax, nll, pointwise

def _sm_forward(name, resolve, log):
    def gen(g):
        c = new(name, g)
        dt = g.dtype()
        shape = g.shape()
        nd = len(shape)
        # README: the softmax ops copy a broadcast view before reading it, so
        # one claiming 2**41 elements fails fast (MemoryError), any dtype
        c.add("x", g.array(shape, dt), "array", huge=True)
        c.add("dim", g.int(-max(nd, 1), max(nd, 1) - 1), "axis", ndim=max(nd, 1), none_ok="error")
        h2f = g.p(0.4) and dt in (BF16, F16)
        if g.p(0.6) or h2f:
            c.add("half_to_float", h2f, "flag", kw=g.p(0.5))
        c.oracle = lambda s, res, live: O.verify(O.ref_softmax(
            s["x"], s["dim"], s.get("half_to_float", False), log=log), res, single=True)
        c = finish(g, c)
        h = c.value("half_to_float")
        if isinstance(h, (bool, np.bool_)) and h and isinstance(c.value("x"), np.ndarray) \
                and c.value("x").dtype.kind == "f" and O.data_dtype(c.value("x")) not in (BF16, F16):
            c.want("error", "half_to_float=True with non-16-bit x")
        return c
    return target(name, resolve)(gen)


_sm_forward("cynorm.softmax", lambda: cynorm.softmax, False)
_sm_forward("cynorm.log_softmax", lambda: cynorm.log_softmax, True)


def mut_input_dtype(g, c, a):
    bad = g.pick(("int32", "foo", None, 10 ** 400, complex, np.bool_, [1], "float128"))
    a.value = bad
    c.want("error", f"input_dtype={bad!r}")


def _sm_backward(name, resolve, log):
    def gen(g):
        c = new(name, g)
        dt = g.dtype()
        shape = g.shape()
        nd = len(shape)
        d = g.int(-max(nd, 1), max(nd, 1) - 1)
        if g.p(0.6) and nd:
            with np.errstate(all="ignore"):
                z = g.values(shape, F64, "normal")
                e = np.exp(z - z.max(axis=d, keepdims=True)) if z.size else z
                y = (np.log(e / e.sum(axis=d, keepdims=True)) if log else e / e.sum(axis=d, keepdims=True)) \
                    if z.size else z
            out = g.place(y.astype(dt), g.layout(nd))
        else:
            out = g.array(shape, dt)
        c.add("grad_output", g.array(shape, dt), "array", huge=True)
        c.add("output", out, "array")
        c.add("dim", d, "axis", ndim=max(nd, 1), none_ok="error")
        in_dt = dt if not (dt == F32 and g.p(0.3)) else g.pick((BF16, F16))
        c.add("input_dtype", g.pick((in_dt, str(in_dt), in_dt.type)), "custom", mutate=mut_input_dtype)
        c.oracle = lambda s, res, live: O.verify(O.ref_softmax_backward_data(
            s["grad_output"], s["output"], s["dim"], s["input_dtype"], log=log), res, single=True)
        return finish(g, c)
    return target(name, resolve)(gen)


_sm_backward("cynorm.softmax_backward_data", lambda: cynorm.softmax_backward_data, False)
_sm_backward("cynorm.log_softmax_backward_data", lambda: cynorm.log_softmax_backward_data, True)


REDUCTIONS = ("none", "mean", "sum", 0, 1, 2, np.int64(1))
REDUCTION_BAD = [("bogus", "error"), (3, "error"), (-1, "error"), (None, "error"), (True, "error"),
                 (1.0, "error"), ("MEAN", "error"), (np.int8(2), "ok"), (10 ** 400, "error")]
IGNORE_BAD = [(1.0, "error"), (True, "error"), ("x", "error"), (None, "error"),
              (10 ** 400, "either"), (np.int64(-100), "either"), (-1, "either")]


def mut_target(g, c, a):
    t = np.asarray(a.value)
    C = a.spec["C"]
    r = g.int(0, 4)
    if r == 0:
        a.value = t.astype(g.pick((np.float64, np.float32, np.bool_, object)))
        c.want("error", f"target of dtype {a.value.dtype}")
    elif r == 1 and t.size:
        bad = t.copy().astype(np.int64)
        v = g.pick((C, C + 5, -5, 2 ** 62, -2 ** 62))
        bad.reshape(-1)[g.int(0, bad.size - 1)] = v
        a.value = bad
        c.want("either" if v == c.value("ignore_index") else "error", f"target holds {v}")
    elif r == 2:
        a.value = np.zeros(_other_shape(g, t.shape, [t.shape]), np.int64)
        c.want("error", f"target of shape {a.value.shape}")
    elif r == 3:
        a.value = t.astype(g.pick((np.uint8, np.int8, np.int16, np.uint64))) if (t >= 0).all() \
            and (t < 100).all() else t
        c.notes.append(f"target of dtype {np.asarray(a.value).dtype}")
    else:
        a.value = t.tolist()
        c.want("either", "target as a list")     # an empty list is float64


def _nll_problem(g, c, two_d, xname="x"):
    dt = g.dtype()
    C = g.size(zero=0.05)
    if two_d:
        N, H, W = g.size(), g.size(), g.size()
        shape, tshape = (N, C, H, W), (N, H, W)
    elif g.p(0.2):
        shape, tshape = (C,), ()
    else:
        N = g.size()
        shape, tshape = (N, C), (N,)
    with np.errstate(all="ignore"):
        x = g.array(shape, dt)
    ignore = g.pick((-100, -100, -1, 0, 2))
    n = math.prod(tshape)
    t = g.rng.integers(0, max(C, 1), n) if C else np.full(n, ignore)
    if n and g.p(0.3):
        t[g.int(0, n - 1)] = ignore
    if not C:
        t[:] = ignore
    t = t.reshape(tshape).astype(g.pick((np.int64, np.int64, np.int32, np.intp)))
    c.add(xname, x, "array", huge=False)
    c.add("target", t, "custom", mutate=mut_target, C=C)
    w = g.maybe(lambda: g.array((C,), dt, coef_style(g)), 0.4)
    return dt, x, t, w, ignore, tshape


def _nll_forward(name, resolve, two_d, full):
    def gen(g):
        c = new(name, g)
        dt, x, t, w, ignore, tshape = _nll_problem(g, c, two_d)
        c.add("weight", w, "array", dtypes=(dt,), shapes=[(x.shape[1] if x.ndim > 1 else x.shape[0],)],
              optional=True, kw=g.p(0.3))
        c.add("reduction", g.pick(REDUCTIONS), "custom", kw=g.p(0.3),
              mutate=lambda g, c, a: mutate_scalar(g, c, a, REDUCTION_BAD))
        c.add("ignore_index", ignore, "custom", kw=g.p(0.3),
              mutate=lambda g, c, a: mutate_scalar(g, c, a, IGNORE_BAD))

        def oracle(s, res, live):
            exp = O.ref_nll_loss_forward(s["x"], s["target"], s["weight"], s["reduction"],
                                         s["ignore_index"], two_d)
            return O.verify(exp if full else exp[:1], res, single=not full)
        c.oracle = oracle
        return finish(g, c)
    return target(name, resolve)(gen)


_nll_forward("cynorm.nll_loss_forward", lambda: cynorm.nll_loss_forward, False, True)
_nll_forward("cynorm.nll_loss2d_forward", lambda: cynorm.nll_loss2d_forward, True, True)
_nll_forward("cynorm.nll_loss", lambda: cynorm.nll_loss, False, False)
_nll_forward("cynorm.nll_loss2d", lambda: cynorm.nll_loss2d, True, False)


def _nll_backward(name, resolve, two_d):
    def gen(g):
        c = new(name, g)
        red = g.pick(REDUCTIONS)
        r = {"none": 0, "mean": 1, "sum": 2}.get(red, red)
        go = c.add("grad_output", None)
        dt, x, t, w, ignore, tshape = _nll_problem(g, c, two_d)
        c.set("grad_output", g.array(tshape if r == 0 else (), g.pick((dt, dt, F64, F32))))
        c.arg("grad_output").kind, c.arg("grad_output").spec = "array", {
            "shapes": [tshape if r == 0 else ()]}
        del go
        c.add("weight", w, "array", dtypes=(dt,), shapes=[(x.shape[1] if x.ndim > 1 else x.shape[0],)],
              optional=True)
        # another reduction changes grad_output's shape: ok or an error
        c.add("reduction", red, "custom", mutate=lambda g, c, a: mutate_scalar(
            g, c, a, [(v, "either" if e == "ok" else e) for v, e in REDUCTION_BAD]))
        c.add("ignore_index", ignore, "custom", mutate=lambda g, c, a: mutate_scalar(g, c, a, IGNORE_BAD))
        tw = np.asarray(float(np.sum(np.abs(g.values((3,), F64)))) if g.p(0.8) else 0.0,
                        g.pick((dt, F64, F32)))
        c.add("total_weight", tw, "array", shapes=[()])
        c.oracle = lambda s, res, live: O.verify(O.ref_nll_loss_backward(
            s["grad_output"], s["x"], s["target"], s["weight"], s["reduction"], s["ignore_index"],
            s["total_weight"], two_d), res, single=True)
        c = finish(g, c)
        if not c.notes and r != 0 and x.ndim > 1 and g.p(0.05):
            c.set("reduction", "none")
            c.want("error", "grad_output 0-d for reduction none")
        return c
    return target(name, resolve)(gen)


_nll_backward("cynorm.nll_loss_backward", lambda: cynorm.nll_loss_backward, False)
_nll_backward("cynorm.nll_loss2d_backward", lambda: cynorm.nll_loss2d_backward, True)


@target("cynorm.trace", lambda: cynorm.trace)
def gen_trace(g):
    c = new("cynorm.trace", g)
    shape = g.shape(rank=2)
    r = g.rng.random() if not g.moderate else 1.0
    if r < 0.15:
        x = g.rng.integers(-1000, 1000, shape).astype(g.pick((np.int32, np.int64, np.uint8, np.int16)))
        if x.dtype == np.uint8:
            x = np.abs(x).astype(np.uint8)
    elif r < 0.2:
        x = g.huge(g.dtype(), rank=2)
        c.huge = True
    else:
        x = g.array(shape, g.dtype())
    c.add("x", x, "custom", mutate=mut_trace)
    c.oracle = lambda s, res, live: O.verify(O.ref_trace(s["x"]), res, single=True)
    return finish(g, c)


def mut_trace(g, c, a):
    r = g.int(0, 3)
    if r == 0:
        a.value = np.ones(g.shape(rank=g.pick((0, 1, 3, 4))), F32)
        c.want("error", f"x of shape {a.value.shape}")
    elif r == 1:
        a.value = np.ones((2, 2), g.pick((bool, complex, object, "U2")))
        c.want("error", f"x of dtype {a.value.dtype}")
    elif r == 2:
        a.value = g.masked(np.ones((3, 3), F32))
        c.want("error", "x masked")
    else:
        a.value = g.pick(([[1.0, 2.0], [3.0, 4.0]], [[1, 2], [3, 4]], "ab", None, 3.0))
        c.want("either", f"x={a.value!r}")


@target("cynorm.log_sigmoid_forward", lambda: cynorm.log_sigmoid_forward)
def gen_log_sigmoid_forward(g):
    c = new("cynorm.log_sigmoid_forward", g)
    c.add("x", g.array(g.shape(), g.dtype()), "array", huge=True)
    c.oracle = lambda s, res, live: O.verify(O.ref_log_sigmoid_forward(s["x"]), res)
    return finish(g, c)


# ================================================================== cynorm.jvp

def _jvp_name(op):
    mod = op.__module__
    return ("aten." if mod == "cynorm.aten" else "") + op.__name__


def _float_array(v):
    return isinstance(v, np.ndarray) and v.dtype in FLOATS


def mut_tangents(g, c, a):
    """Break the tangents: wrong shape/dtype, one for a non-differentiable
    argument, the wrong count or type."""
    tans = list(a.value)
    prim = c.value("primals")
    rule = a.spec["rule"]
    diff = [i for i, p in enumerate(prim) if _float_array(p) and rule.name_of(i) not in rule.nondiff]
    nondiff = [i for i, p in enumerate(prim) if i not in diff and rule.name_of(i) not in rule.ignored]
    r = g.int(0, 6)
    if r == 0 and diff:
        i = g.pick(diff)
        p = prim[i]
        tans[i] = np.zeros(_other_shape(g, p.shape, [p.shape]), p.dtype)
        c.want("error", f"tangents[{i}] of shape {tans[i].shape}")
    elif r == 1 and diff:
        i = g.pick(diff)
        p = prim[i]
        d = g.pick([x for x in FLOATS + (np.dtype(np.int64),) if x != p.dtype])
        tans[i] = np.zeros(p.shape, d)
        c.want("error", f"tangents[{i}] of dtype {d}")
    elif r == 2 and nondiff:
        i = g.pick(nondiff)
        p = prim[i]
        tans[i] = np.zeros(np.shape(p), np.asarray(p).dtype if isinstance(p, np.ndarray) else F64) \
            if isinstance(p, np.ndarray) else g.pick((np.zeros(3), 1.0, np.zeros(())))
        c.want("error", f"a tangent for {rule.name_of(i)} (not differentiable)")
    elif r == 3:
        tans = tans + [None] if g.p(0.5) else tans[:-1]
        c.want("error", f"{len(tans)} tangents for {len(prim)} primals")
        a.value = tuple(tans)
        return
    elif r == 4:
        a.value = g.pick(({"x": 1}, np.zeros(3), None, "t"))
        c.want("error", f"tangents={a.value!r:.30}")
        return
    elif r == 5 and diff:
        i = g.pick(diff)
        tans[i] = g.masked(np.zeros(prim[i].shape, prim[i].dtype))
        c.want("either", f"tangents[{i}] masked")
    else:
        tans = list(tans)
        c.notes.append("tangents as a list")
        a.value = tans
        return
    a.value = tuple(tans)


def mut_op(g, c, a):
    a.value = g.pick((np.add, cynorm.nested.relu, lambda *x: x, "layer_norm", None, 3))
    c.want("error", f"op={a.value!r:.40}")


def mut_primals(g, c, a):
    a.value = g.pick((np.zeros(3), "abc", None, {"x": 1}))
    c.want("error", f"primals={a.value!r:.30}")


def _jvp_target(op):
    name = _jvp_name(op)
    tname = "cynorm.jvp." + name
    base_name = "cynorm." + name

    def gen(g):
        base = TARGETS[base_name].gen(Gen(g.rng, moderate=True))
        rule = cynorm.jvp_rules[op]
        c = new(tname, g)
        c.base = base
        pos, kws = [], {}
        for a in base.args:
            if a.kw or kws:
                kws[a.name] = a.value
            else:
                pos.append(a)
        primals = tuple(a.value for a in pos)
        tans = []
        mg = Gen(g.rng, moderate=True)
        for i, a in enumerate(pos):
            ok = _float_array(a.value) and a.name not in rule.nondiff
            tans.append(mg.array(a.value.shape, a.value.dtype, layout=g.pick(("C", "F", "neg")))
                        if ok and g.p(0.75) else None)
        c.add("op", op, "custom", mutate=mut_op)
        c.add("primals", primals if g.p(0.9) else list(primals), "custom", mutate=mut_primals)
        c.add("tangents", tuple(tans), "custom", mutate=mut_tangents, rule=rule)
        for k, v in kws.items():
            c.add(k, v, kw=True)
        c.want(base.expect)
        c.names = [a.name for a in pos]
        c.extra_names = tuple(c.names) + tuple(f"tangents[{i}]" for i in range(len(pos)))
        if base_name == "cynorm.batch_norm" and base.value("training") is True:
            for i, a in enumerate(pos):
                if a.name in ("running_mean", "running_var"):
                    c.inplace |= {f"primals[{i}]", f"tangents[{i}]"}
            c.inplace |= {"running_mean", "running_var"} & set(kws)
        c.inplace_names = {"running_mean", "running_var"}
        dt = O.data_dtype(primals[1] if base_name.endswith(("backward", "backward_data")) and
                          not base_name.endswith(("cudnn_batch_norm_backward",
                                                  "miopen_batch_norm_backward")) else primals[0])

        def oracle(s, res, live):
            if not (isinstance(res, tuple) and len(res) == 2):
                return [f"returned {type(res).__name__}, expected (outputs, tangents)"]
            outs, touts = res
            args = dict(zip(c.names, s["primals"]))
            args.update({k: s[k] for k in kws})
            live_args = dict(zip(c.names, live["primals"]))
            live_args.update({k: live[k] for k in kws})
            probs = base.oracle(args, outs, live_args)
            tmap = {n: t for n, t in zip(c.names, s["tangents"]) if n not in rule.ignored}
            live_t = dict(zip(c.names, live["tangents"]))
            if isinstance(outs, tuple) != isinstance(touts, tuple):
                return probs + [f"tangents have another structure than the outputs ({type(touts).__name__})"]
            pargs = {k: v for k, v in args.items()}
            return probs + O.jvp_problems(name, pargs, tmap, outs, touts, live_t,
                                          c.inplace_names if base.value("training", False) is True else (),
                                          dt, np.random.default_rng(0))
        c.oracle = oracle
        return finish(g, c, p_mutate=0.3)
    target(tname, lambda: cynorm.jvp)(gen)


for _op in list(cynorm.jvp_rules):
    if _jvp_name(_op) in O.JVP_VALUES:
        _jvp_target(_op)


# ================================================================== cynorm.nested
import cynorm.nested as nt  # noqa: E402


def comp_shapes(g, n=None, k=None, trailing=(), lead_min=0):
    """Component shapes: n components of ndim k, ending in `trailing`."""
    n = g.pick((0, 1, 2, 3, 3, 4)) if n is None else n
    k = g.pick((1, 1, 2, 2, 3)) if k is None else k
    k = max(k, len(trailing) + lead_min)
    free = k - len(trailing)
    return [tuple(g.size(zero=0.1, one=0.15) for _ in range(free)) + tuple(trailing) for _ in range(n)], k


def make_nested(g, shapes, k, dtype):
    comps = [g.values(s, dtype).astype(dtype) for s in shapes]
    sizes = np.array(shapes, np.int64).reshape(len(shapes), k)
    buf = np.concatenate([c.reshape(-1) for c in comps]) if comps else np.zeros(0, dtype)
    return nt.NestedArray(np.ascontiguousarray(buf.astype(dtype)), sizes)


def like_nested(g, x, dtype=None):
    """Another NestedArray of x's structure."""
    dtype = x.dtype if dtype is None else dtype
    with np.errstate(over="ignore"):
        buf = g.values((x.buffer.size,), dtype).astype(dtype)
    return nt.NestedArray(np.ascontiguousarray(buf), x.sizes)


def comps(x):
    return [np.asarray(c) for c in x.unbind()]


def mut_nested(g, c, a):
    """Break a NestedArray argument: a dense array, another structure or dtype."""
    x = a.value
    r = g.int(0, 3)
    if r == 0 or not isinstance(x, nt.NestedArray):
        a.value = g.pick((np.zeros((2, 3)), [np.zeros(3)], None, "x"))
        c.want("either" if a.spec.get("dense_ok") and isinstance(a.value, (np.ndarray, list)) else "error",
               f"{a.name}={describe_short(a.value)}")
    elif r == 1 and a.spec.get("structured"):
        shapes, k = comp_shapes(g, n=len(x) + 1, k=x.ndim - 1)
        a.value = make_nested(g, shapes, k, x.dtype)
        c.want("error", f"{a.name} of another structure")
    elif r == 2 and a.spec.get("structured"):
        d = g.pick([f for f in FLOATS if f != x.dtype])
        a.value = nt.NestedArray(x.buffer.astype(d), x.sizes)
        c.want("error" if a.spec.get("dtype_strict", True) else "either", f"{a.name} of dtype {d}")
    else:
        a.value = g.pick((np.asarray(x.buffer), x.unbind()))
        c.want("either" if a.spec.get("dense_ok") else "error", f"{a.name} as a plain array/list")


def describe_short(v):
    return f"{type(v).__name__}"


def mut_cdim(g, c, a):
    nd = a.spec["ndim"]
    v = g.pick(((0,) if not a.spec.get("dim0_ok") else ()) + (nd, nd + 2, -nd - 1, 1.0, "1", True, None,
                                                               10 ** 400))
    a.value = v
    c.want("error", f"{a.name}={v!r:.20}")


def _nested_dtype(g):
    return g.dtype()


def nested_target(name, fn):
    return target("cynorm.nested." + name, fn)


@nested_target("nested_array", lambda: nt.nested_array)
def gen_nested_array(g):
    c = new("cynorm.nested.nested_array", g)
    dt = _nested_dtype(g)
    shapes, k = comp_shapes(g)
    src = [g.array(s, g.pick((dt, dt, F64)) if g.p(0.2) else dt) for s in shapes]
    if g.p(0.15):
        src = [np.asarray(a).astype(g.pick((np.int32, np.int64))) for a in src]
    given = g.pick((None, None, dt, str(dt), dt.type))
    if len({np.asarray(a).dtype for a in src}) > 1 and given is None:
        given = dt
    r = g.rng.random()
    if r < 0.1 and len(src) > 1:
        src[0] = np.zeros((2,) * (k + 1), dt)
        c.want("error", "components of different ndim")
    elif r < 0.15 and len(src) > 1:
        other = np.asarray(src[1]).dtype.newbyteorder("=")    # byte order is converted
        src[0] = np.asarray(src[0]).astype(F16 if other != F16 else F32)
        given = None
        c.want("error", "components of different dtypes, no dtype=")
    elif r < 0.2:
        given = g.pick((np.int32, "complex64", "float128", object, "foo"))
        c.want("error", f"dtype={given!r}")
    elif r < 0.25:
        src = g.pick((np.zeros((2, 3)), "abc", (np.zeros(2), np.zeros(3)), None))
        c.want("error" if not isinstance(src, tuple) else "ok", f"arrays={type(src).__name__}")
    elif r < 0.3:
        src = [g.masked(np.asarray(a)) for a in src] if src else src
        c.want("either", "masked components")
    c.add("arrays", src)
    if given is not None or g.p(0.5):
        c.add("dtype", given, kw=g.p(0.5))

    def oracle(s, res, live):
        arrs = [np.asarray(a) for a in s["arrays"]]
        dtype = np.dtype(s.get("dtype")) if s.get("dtype") is not None else (
            arrs[0].dtype if arrs else F64)
        if dtype.kind in "iub":
            dtype = F64
        dtype = dtype.newbyteorder("=")      # a NestedArray holds native data
        sizes = np.array([a.shape for a in arrs], np.int64).reshape(len(arrs), arrs[0].ndim if arrs else 0)
        with np.errstate(all="ignore"):
            data = np.concatenate([a.reshape(-1).astype(dtype) for a in arrs]) if arrs else np.zeros(0, dtype)
        return O.nested_check("result", res, sizes, None, dtype, exact=data)
    c.oracle = oracle
    return c


@nested_target("NestedArray", lambda: nt.NestedArray)
def gen_nested_init(g):
    c = new("cynorm.nested.NestedArray", g)
    dt = _nested_dtype(g)
    shapes, k = comp_shapes(g)
    x = make_nested(g, shapes, k, dt)
    buf, sizes = x.buffer.copy(), np.array(x.sizes)
    r = g.rng.random()
    if r < 0.1:
        buf = g.pick((np.zeros((2, 2), dt), np.zeros(buf.size * 2 + 2, dt)[::2][:buf.size] if buf.size > 1
                      else np.zeros((1, 1), dt)))
        c.want("error", "buffer not 1-D contiguous")
    elif r < 0.18:
        buf = buf.astype(g.pick((np.int64, np.complex64, object)))
        c.want("error", f"buffer of dtype {buf.dtype}")
    elif r < 0.26 and sizes.size:
        sizes = sizes.copy()
        sizes.reshape(-1)[0] += g.pick((1, -10, 5))
        same_count = (sizes >= 0).all() and int(np.prod(sizes, axis=1).sum()) == buf.size
        c.want("either" if same_count else "error", "sizes not matching the buffer")
    elif r < 0.32:
        sizes = g.pick((sizes.astype(float) if sizes.size else np.ones((1, 1)), sizes.reshape(-1) if sizes.size
                        else np.zeros(3, np.int64), "3", None))
        c.want("error", "sizes malformed")
    elif r < 0.36:
        buf = buf.tolist()
        c.want("error", "buffer a list")
    c.add("buffer", buf)
    if g.p(0.2) and isinstance(sizes, np.ndarray):
        sizes = sizes.tolist()
        if not sizes:
            c.want("either", "sizes=[] (no component ndim)")
    c.add("sizes", sizes)

    def oracle(s, res, live):
        if not isinstance(res, nt.NestedArray):
            return [f"expected a NestedArray, got {type(res).__name__}"]
        probs = []
        if res.buffer is not live["buffer"]:
            probs.append("the buffer was copied (NestedArray wraps it)")
        sz = np.asarray(s["sizes"], np.int64)
        numels = np.prod(sz, axis=1) if sz.size else np.zeros(len(sz), np.int64)
        offs = np.concatenate(([0], np.cumsum(numels)[:-1])).astype(np.int64) if len(sz) else np.zeros(0, np.int64)
        if not np.array_equal(res.sizes, sz) or not np.array_equal(res.offsets, offs) or len(res) != len(sz):
            probs.append(f"sizes/offsets/len wrong: {res.sizes.tolist()} {res.offsets.tolist()} {len(res)}")
        if res.ndim != sz.shape[1] + 1:
            probs.append(f"ndim {res.ndim}, expected {sz.shape[1] + 1}")
        return probs
    c.oracle = oracle
    return c


@nested_target("from_padded", lambda: nt.from_padded)
def gen_from_padded(g):
    c = new("cynorm.nested.from_padded", g)
    dt = _nested_dtype(g)
    n, k = g.int(0, 4), g.int(1, 3)
    maxs = tuple(g.size(zero=0.05) for _ in range(k))
    padded = g.array((n,) + maxs, dt)
    sizes = np.array([[g.int(0, m) for m in maxs] for _ in range(n)], np.int64).reshape(n, k)
    r = g.rng.random()
    if r < 0.1 and sizes.size:
        sizes = sizes.copy()
        sizes[0, 0] = maxs[0] + 1
        c.want("error", "sizes beyond padded")
    elif r < 0.15 and sizes.size:
        sizes = sizes.copy()
        sizes[0, 0] = -1
        c.want("error", "negative sizes")
    elif r < 0.2:
        sizes = sizes.astype(float)
        c.want("error" if sizes.size else "either", "float sizes")
    elif r < 0.25:
        sizes = np.zeros((n + 1, k), np.int64)
        c.want("error", "sizes of the wrong shape")
    c.add("padded", padded, "array")
    c.add("sizes", sizes)

    def oracle(s, res, live):
        p, sz = np.asarray(s["padded"]), np.asarray(s["sizes"])
        parts = [p[(i,) + tuple(slice(0, int(v)) for v in row)] for i, row in enumerate(sz)]
        data = np.concatenate([q.reshape(-1) for q in parts]) if parts else np.zeros(0, p.dtype)
        return O.nested_check("result", res, sz, None, O.data_dtype(p), exact=data)
    c.oracle = oracle
    return finish(g, c, p_mutate=0.15)


def _nested_input(g, c, name="x", trailing=(), k=None, lead_min=0, dt=None, n=None, structured=False,
                  method=False):
    """A NestedArray argument; `structured`: another nested argument must
    match it; `method`: it is self of a method (not broken)."""
    dt = _nested_dtype(g) if dt is None else dt
    shapes, k = comp_shapes(g, n=n, k=k, trailing=trailing, lead_min=lead_min)
    x = make_nested(g, shapes, k, dt)
    if method:
        c.add(name, x)
    else:
        c.add(name, x, "custom", mutate=mut_nested, structured=structured)
    return x, dt


@nested_target("NestedArray.__getitem__", lambda: nt.NestedArray.__getitem__)
def gen_nested_getitem(g):
    c = new("cynorm.nested.NestedArray.__getitem__", g)
    x, dt = _nested_input(g, c, "self", method=True)
    n = len(x)
    i = g.int(-n - 2, n + 1) if g.p(0.9) else g.pick((1.0, "0", None, True, np.int64(0), slice(0, 1)))
    c.add("i", i)
    if isinstance(i, (int, np.integer)) and not isinstance(i, bool):
        if not -n <= i < n:
            c.want("error")
    else:
        c.want("error" if not isinstance(i, np.integer) else "ok", f"i={i!r}")
    c.accept = (IndexError,)     # the sequence protocol: x[i] out of range is an IndexError

    def oracle(s, res, live):
        j = int(s["i"]) % n
        exp = comps(s["self"])[j]
        probs = O.same("x[i]", res, exp)
        if isinstance(res, np.ndarray) and res.size and not np.shares_memory(res, live["self"].buffer):
            probs.append("x[i] is not a view of the buffer")
        return probs
    c.oracle = oracle
    return finish(g, c, p_mutate=0.1)


@nested_target("NestedArray.unbind", lambda: nt.NestedArray.unbind)
def gen_nested_unbind(g):
    c = new("cynorm.nested.NestedArray.unbind", g)
    _nested_input(g, c, "self", method=True)

    def oracle(s, res, live):
        exp = comps(s["self"])
        if not isinstance(res, list) or len(res) != len(exp):
            return [f"unbind returned {type(res).__name__} of {len(res) if hasattr(res, '__len__') else '?'}"]
        return [p for r, e in zip(res, exp) for p in O.same("component", r, e)]
    c.oracle = oracle
    return finish(g, c, p_mutate=0.1)


@nested_target("NestedArray.to_padded", lambda: nt.NestedArray.to_padded)
def gen_nested_to_padded(g):
    c = new("cynorm.nested.NestedArray.to_padded", g)
    x, dt = _nested_input(g, c, "self", method=True)
    c.add("fill", g.pick((0.0, -1.0, float("nan"), 1e30, 3)))
    full = (len(x),) + x.max_sizes()
    r = g.rng.random()
    if r < 0.5:
        c.add("output_size", None)
    elif r < 0.8:
        c.add("output_size", tuple(s + g.int(0, 2) for s in full))
    else:
        bad = list(full) + [1] if g.p(0.5) else [max(0, s - 1) for s in full]
        c.add("output_size", tuple(bad))
        if tuple(bad) != full:
            c.want("either" if len(bad) == len(full) and all(b >= f for b, f in zip(bad, full)) else "error",
                   f"output_size={bad}")

    def oracle(s, res, live):
        cs = comps(s["self"])
        shape = (len(cs),) + (tuple(int(m) for m in np.max([q.shape for q in cs], axis=0)) if cs
                              else (0,) * (s["self"].ndim - 1))
        if s["output_size"] is not None:
            shape = tuple(int(v) for v in s["output_size"])
        with np.errstate(all="ignore"):
            exp = np.full(shape, s["fill"], dtype=s["self"].dtype)
        for i, q in enumerate(cs):
            exp[(i,) + tuple(slice(0, v) for v in q.shape)] = q
        return O.same("padded", res, exp)
    c.oracle = oracle
    return finish(g, c, p_mutate=0.1)


@nested_target("NestedArray.like", lambda: nt.NestedArray.like)
def gen_nested_like(g):
    c = new("cynorm.nested.NestedArray.like", g)
    x, dt = _nested_input(g, c, "self", method=True)
    buf = g.values((x.buffer.size,), dt).astype(dt)
    r = g.rng.random()
    if r < 0.15:
        buf = np.zeros(x.buffer.size + 1, dt)
        c.want("error", "buffer of another size")
    elif r < 0.25:
        buf = buf.astype(np.int32)
        c.want("error", "int buffer")
    c.add("buffer", buf)

    def oracle(s, res, live):
        return O.nested_check("result", res, s["self"].sizes, None, O.data_dtype(s["buffer"]),
                              exact=s["buffer"])
    c.oracle = oracle
    return c


def _pointwise(name, fn, ref, n_in=1, params=()):
    """nested relu/silu/gelu (+ backward) and threshold(_backward)."""
    def gen(g):
        c = new("cynorm.nested." + name, g)
        if n_in == 2:
            x, dt = _nested_input(g, c, "grad", structured=True)
            c.add("self", like_nested(g, x), "custom", mutate=mut_nested, structured=True)
        else:
            x, dt = _nested_input(g, c, "x")
        for pname, draw, bad in params:
            c.add(pname, draw(g), "custom", kw=g.p(0.3),
                  mutate=lambda g, c, a, bad=bad: mutate_scalar(g, c, a, bad))

        def oracle(s, res, live):
            xs = s["self"] if n_in == 2 else s["x"]
            return ref(s, xs, res)
        c.oracle = oracle
        return finish(g, c, p_mutate=0.3)
    return nested_target(name, fn)(gen)


APPROX = (lambda g: g.pick(("none", "tanh")),
          [("erf", "error"), (None, "error"), (0, "error"), ("TANH", "error"), ("none", "ok")])
REAL_T = [(float("nan"), "error"), (float("inf"), "error"), (10 ** 400, "error"), ("0", "error"),
          (None, "error"), (True, "error"), (np.float32(0.5), "ok"), (-3, "ok")]


def _pw_ref(kind):
    def ref(s, xs, res):
        dt = xs.dtype
        pm = O.math_prec(dt)
        X = O.EB.of(xs.buffer)
        if kind == "gelu":
            y = O.gelu_ref(X, s.get("approximate", "none"), pm)
        elif kind == "silu":
            y = O.silu_ref(X, pm)
        elif kind == "gelu_backward":
            y = O.gelu_grad_ref(O.EB.of(s["grad"].buffer), X, s.get("approximate", "none"), pm)
        elif kind == "silu_backward":
            y = O.silu_grad_ref(O.EB.of(s["grad"].buffer), X, pm)
        else:   # threshold / relu / threshold_backward: exact; the threshold may be rounded to dtype
            t = float(s.get("threshold", 0.0))
            x64 = xs.buffer.astype(np.float64)
            tr = float(np.asarray(t).astype(dt)) if np.isfinite(t) else t
            if kind == "threshold_backward":
                src = s["grad"].buffer
                a = np.where(x64 <= t, 0, src).astype(dt)
                b = np.where(x64 <= tr, 0, src).astype(dt)
            else:
                v = np.asarray(float(s.get("value", 0.0))).astype(dt)
                a = np.where(x64 <= t, v, xs.buffer).astype(dt)
                b = np.where(x64 <= tr, v, xs.buffer).astype(dt)
            if not isinstance(res, nt.NestedArray):
                return [f"expected a NestedArray, got {type(res).__name__}"]
            pa = O.nested_check("result", res, xs.sizes, None, dt, exact=a)
            return pa if pa and O.nested_check("result", res, xs.sizes, None, dt, exact=b) else []
        return O.nested_check("result", res, xs.sizes, y, dt)
    return ref


_pointwise("relu", lambda: nt.relu, _pw_ref("relu"))
_pointwise("silu", lambda: nt.silu, _pw_ref("silu"))
_pointwise("gelu", lambda: nt.gelu, _pw_ref("gelu"), params=[("approximate",) + APPROX])
_pointwise("threshold", lambda: nt.threshold, _pw_ref("threshold"),
           params=[("threshold", lambda g: g.pick((0.0, 0.5, -1.0, 1e-30, 2)), REAL_T),
                   ("value", lambda g: g.pick((0.0, -1.0, 7.5, 1e30)), REAL_T)])
_pointwise("silu_backward", lambda: nt.silu_backward, _pw_ref("silu_backward"), n_in=2)
_pointwise("gelu_backward", lambda: nt.gelu_backward, _pw_ref("gelu_backward"), n_in=2,
           params=[("approximate",) + APPROX])
_pointwise("threshold_backward", lambda: nt.threshold_backward, _pw_ref("threshold_backward"), n_in=2,
           params=[("threshold", lambda g: g.pick((0.0, 0.5, -1.0)), REAL_T)])


def _component_dim(g, c, x, name="dim"):
    nd = x.ndim
    d = g.int(1, nd - 1) if nd > 1 else 1
    if g.p(0.3):
        d -= nd
    c.add(name, d, "custom", mutate=mut_cdim, ndim=nd)
    return d % nd


@nested_target("softmax", lambda: nt.softmax)
def gen_nested_softmax(g):
    c = new("cynorm.nested.softmax", g)
    x, dt = _nested_input(g, c, "x")
    _component_dim(g, c, x)

    def oracle(s, res, live):
        xs = s["x"]
        d = int(s["dim"]) % xs.ndim - 1
        parts = [O.ref_softmax(q, d)[0].refs for q in comps(xs)]
        return O.nested_check("result", res, xs.sizes, O.concat(parts), xs.dtype)
    c.oracle = oracle
    return finish(g, c, p_mutate=0.3)


@nested_target("softmax_backward", lambda: nt.softmax_backward)
def gen_nested_softmax_backward(g):
    c = new("cynorm.nested.softmax_backward", g)
    x, dt = _nested_input(g, c, "grad", structured=True)
    c.add("output", like_nested(g, x), "custom", mutate=mut_nested, structured=True)
    _component_dim(g, c, x)

    def oracle(s, res, live):
        y = s["output"]
        d = int(s["dim"]) % y.ndim - 1
        parts = [O.ref_softmax_backward_data(gq, yq, d, y.dtype)[0].refs
                 for gq, yq in zip(comps(s["grad"]), comps(y))]
        return O.nested_check("result", res, y.sizes, O.concat(parts), y.dtype)
    c.oracle = oracle
    return finish(g, c, p_mutate=0.3)


def mut_dims(g, c, a):
    nd = a.spec["ndim"]
    v = g.pick(((1, 1), (), [], 0, (0,), nd, 1.0, "1", None, (1, nd + 3)))
    a.value = v
    # dim 0 / None: a sum over the components, valid where they agree in the
    # kept dims (sum_backward then needs a dense grad)
    c.want("either" if v is None or v == 0 or v == (0,) else "error", f"dims={v!r}")


def _sum_dims(g, x):
    nd = x.ndim
    if nd < 2:
        return 1
    ds = sorted(set(g.int(1, nd - 1) for _ in range(g.int(1, nd - 1))))
    if len(ds) == 1 and g.p(0.5):
        return ds[0]
    return tuple(ds) if g.p(0.6) else list(ds)


def _summed_sizes(sizes, cd, keepdim):
    sizes = np.array(sizes, np.int64)
    if keepdim:
        sizes[:, list(cd)] = 1
        return sizes
    return np.delete(sizes, list(cd), axis=1)


def _cd(dims, nd):
    dims = (dims,) if isinstance(dims, (int, np.integer)) else dims
    return tuple(sorted({int(d) % nd - 1 for d in dims}))


def _batch_cd(dims, nd):
    """(over_batch, component dims) of sum's dims (None: every dim)."""
    if dims is None:
        return True, tuple(range(nd - 1))
    dims = (dims,) if isinstance(dims, (int, np.integer)) else dims
    w = {int(d) % nd for d in dims}
    return 0 in w, tuple(sorted(d - 1 for d in w if d))


def _batch_sum_ok(x, cd):
    """Whether a sum over dim 0 and component dims cd is defined: the
    components agree in the kept dims (none kept: always)."""
    keep = [j for j in range(x.ndim - 1) if j not in cd]
    if not keep:
        return True
    kept = np.asarray(x.sizes)[:, keep]
    return len(x) > 0 and bool(np.all(kept == kept[0]))


def _batch_sum_ref(xs, cd, keepdim):
    """EB of the dense sum over dim 0 and component dims cd."""
    keep = [j for j in range(xs.ndim - 1) if j not in cd]
    kept = tuple(int(s) for s in xs.sizes[0, keep]) if keep else ()
    with O.at(O.P64):
        parts = [O.EB.of(q).sum(cd).reshape(kept) if cd else O.EB.of(q) for q in comps(xs)]
        if parts:
            stacked = O.EB(np.stack([p.v for p in parts]), np.stack([p.e for p in parts]))
            total = stacked.sum(0)
        else:
            total = O.EB(np.zeros(kept, O.LD))
    if keepdim:
        it = iter(kept)
        total = total.reshape((1,) + tuple(1 if j in cd else next(it) for j in range(xs.ndim - 1)))
    return total


@nested_target("sum", lambda: nt.sum)
def gen_nested_sum(g):
    c = new("cynorm.nested.sum", g)
    x, dt = _nested_input(g, c, "x")
    dims = _sum_dims(g, x)
    refused = False
    if g.p(0.25):             # over dim 0 too: a dense sum over the components
        dims = None if g.p(0.4) else (0,) + ((dims,) if isinstance(dims, int) else tuple(dims))
        refused = not _batch_sum_ok(x, _batch_cd(dims, x.ndim)[1])
        if refused:
            c.want("error", "dims with 0: the components differ in a kept dim")
    # dims that are already an error stay as they are (a mutation to a valid
    # dims would leave the error expected)
    c.add("dims", dims, None if refused else "custom", mutate=mut_dims, ndim=x.ndim)
    c.add("keepdim", g.p(0.4), kw=g.p(0.5))

    def oracle(s, res, live):
        xs = s["x"]
        over_batch, cdb = _batch_cd(s["dims"], xs.ndim)
        if over_batch:
            return O.check("result", res, _batch_sum_ref(xs, cdb, bool(s["keepdim"])), xs.dtype)
        cd = _cd(s["dims"], xs.ndim)
        parts = []
        for q in comps(xs):
            with O.at(O.P64):
                parts.append(O.EB.of(q).sum(cd, keepdims=bool(s["keepdim"])))
        return O.nested_check("result", res, _summed_sizes(xs.sizes, cd, bool(s["keepdim"])),
                              O.concat(parts), xs.dtype)
    c.oracle = oracle
    return finish(g, c, p_mutate=0.3)


@nested_target("sum_backward", lambda: nt.sum_backward)
def gen_nested_sum_backward(g):
    c = new("cynorm.nested.sum_backward", g)
    dt = _nested_dtype(g)
    shapes, k = comp_shapes(g, k=g.pick((1, 2, 3)))
    self_ = make_nested(g, shapes, k, dt)
    dims = _sum_dims(g, self_)
    keep = g.p(0.4)
    cd = _cd(dims, self_.ndim)
    gsizes = _summed_sizes(self_.sizes, cd, keep).reshape(len(self_), -1) if len(self_) else \
        np.zeros((0, k if keep else k - len(cd)), np.int64)
    grad = make_nested(g, [tuple(r) for r in gsizes], gsizes.shape[1], dt)
    c.add("grad", grad, "custom", mutate=mut_nested, structured=True)
    c.add("self", self_, "custom", mutate=mut_nested, structured=True)
    c.add("dims", dims, "custom", mutate=mut_dims, ndim=self_.ndim)
    c.add("keepdim", keep)

    def oracle(s, res, live):
        sf = s["self"]
        cdd = _cd(s["dims"], sf.ndim)
        parts = []
        for gq, sq in zip(comps(s["grad"]), comps(sf)):
            kept = tuple(1 if j in cdd else v for j, v in enumerate(sq.shape))
            parts.append(np.broadcast_to(gq.reshape(kept), sq.shape))
        data = np.concatenate([p.reshape(-1) for p in parts]) if parts else np.zeros(0, sf.dtype)
        return O.nested_check("result", res, sf.sizes, None, sf.dtype, exact=data)
    c.oracle = oracle
    return finish(g, c, p_mutate=0.3)


def mut_index(g, c, a):
    v = g.pick((10 ** 6, -10 ** 6, 1.0, "0", None, True, 10 ** 400))
    a.value = v
    c.want("error", f"index={v!r:.20}")


@nested_target("select", lambda: nt.select)
def gen_nested_select(g):
    c = new("cynorm.nested.select", g)
    x, dt = _nested_input(g, c, "x", n=g.pick((1, 2, 3, 4)))
    nd = x.ndim
    d = g.pick((0, 0) + tuple(range(1, nd)))
    if d and x.ndim > 1:
        lo = int(x.sizes[:, d - 1].min()) if len(x) else 0
    else:
        lo = len(x)
    idx = g.int(-lo, lo - 1) if lo and g.p(0.85) else g.pick((lo, -lo - 1, lo + 5))
    c.add("dim", d - nd if g.p(0.2) and d else d, "custom", mutate=mut_cdim, ndim=nd, dim0_ok=True)
    c.add("index", idx, "custom", mutate=mut_index)
    if not -lo <= idx < lo:
        c.want("error", f"index {idx} out of range")

    def oracle(s, res, live):
        xs = s["x"]
        dd = int(s["dim"]) % xs.ndim
        i = int(s["index"])
        if dd == 0:
            probs = O.same("select(x, 0, i)", res, comps(xs)[i])
            if isinstance(res, np.ndarray) and res.size and not np.shares_memory(res, live["x"].buffer):
                probs.append("select(x, 0, i) is not a view of the buffer")
            return probs
        parts = [np.take(q, i % q.shape[dd - 1], axis=dd - 1) for q in comps(xs)]
        sizes = np.delete(np.asarray(xs.sizes), dd - 1, axis=1)
        data = np.concatenate([p.reshape(-1) for p in parts]) if parts else np.zeros(0, xs.dtype)
        return O.nested_check("result", res, sizes, None, xs.dtype, exact=data)
    c.oracle = oracle
    return finish(g, c, p_mutate=0.3)


@nested_target("select_backward", lambda: nt.select_backward)
def gen_nested_select_backward(g):
    c = new("cynorm.nested.select_backward", g)
    dt = _nested_dtype(g)
    shapes, k = comp_shapes(g, n=g.pick((1, 2, 3)), k=g.pick((1, 2, 3)))
    self_ = make_nested(g, shapes, k, dt)
    nd = self_.ndim
    d = g.pick((0,) + tuple(range(1, nd)))
    if d == 0:
        i = g.int(0, len(self_) - 1)
        grad = g.array(self_.component_shape(i), dt)
        lo = len(self_)
    else:
        lo = int(self_.sizes[:, d - 1].min())
        i = g.int(0, lo - 1) if lo else 0
        gs = np.delete(np.asarray(self_.sizes), d - 1, axis=1)
        grad = make_nested(g, [tuple(r) for r in gs], gs.shape[1], dt)
        if not lo:
            c.want("error", "no index in range")
    c.add("grad", grad)
    # dim 0: grad is one dense component, cast into self's dtype (no dtype rule)
    c.add("self", self_, "custom", mutate=mut_nested, structured=d != 0, dtype_strict=False)
    c.add("dim", d, "custom", mutate=mut_cdim, ndim=nd, dim0_ok=True)
    c.add("index", i, "custom", mutate=mut_index)

    def oracle(s, res, live):
        sf = s["self"]
        dd = int(s["dim"]) % sf.ndim
        idx = int(s["index"])
        out = [np.zeros(q.shape, sf.dtype) for q in comps(sf)]
        if dd == 0:
            out[idx % len(out)][...] = s["grad"]
        else:
            for o, gq in zip(out, comps(s["grad"])):
                sl = [slice(None)] * o.ndim
                sl[dd - 1] = idx % o.shape[dd - 1]
                o[tuple(sl)] = gq
        data = np.concatenate([o.reshape(-1) for o in out]) if out else np.zeros(0, sf.dtype)
        return O.nested_check("result", res, sf.sizes, None, sf.dtype, exact=data)
    c.oracle = oracle
    return finish(g, c, p_mutate=0.3)


def mut_dense_either(g, c, a):
    """A dense matrix argument broken: its shape may still fit (either)."""
    before = c.expect
    a.spec.update(shapes=[np.shape(a.value)])
    mutate_array(g, c, a)
    if c.expect == "error" and before != "error" and a.value is not None and _array_like(a.value) \
            and np.asarray(a.value).dtype.newbyteorder("=") in FLOATS:    # byte order is converted
        c.expect = "either"


def _rows2(parts, k):
    """Components (..., k) stacked as (rows, k)."""
    rows = [q.reshape(int(np.prod(q.shape[:-1])), k) for q in parts]
    return np.concatenate(rows) if rows else np.zeros((0, k))


def _dense_arg(g, shape, dt):
    d = g.pick((dt, F32)) if dt in (BF16, F16) else dt
    return g.array(shape, d, "normal" if g.p(0.7) else None)


def _mm_ref(A, B, pm):
    with O.at(pm):
        return O.matmul(A, B)


@nested_target("matmul", lambda: nt.matmul)
def gen_nested_matmul(g):
    c = new("cynorm.nested.matmul", g)
    dt = _nested_dtype(g)
    kf = g.size(zero=0.05)
    if g.p(0.45):   # nested @ dense (k, m)
        shapes, k = comp_shapes(g, k=g.pick((2, 3)), trailing=(kf,), lead_min=1)
        a = make_nested(g, shapes, k, dt)
        b = _dense_arg(g, (kf, g.size(zero=0.05)), dt)
        dense = True
    elif g.p(0.35):  # nested (n_i, k) @ dense (B, k, m): component i @ b[i] (B = 1: b[0])
        n = g.int(0, 3)
        a = make_nested(g, [(g.size(zero=0.1), kf) for _ in range(n)], 2, dt)
        b = _dense_arg(g, (g.pick((n, 1)), kf, g.size(zero=0.05)), dt)
        dense = True
    else:          # nested @ nested, component by component
        n = g.int(0, 3)
        ashapes = [(g.size(), g.size(zero=0.05)) for _ in range(n)]
        bshapes = [(s[1], g.size(zero=0.05)) for s in ashapes]
        a = make_nested(g, ashapes, 2, dt)
        b = make_nested(g, bshapes, 2, dt)
        dense = False
    c.add("a", a, "custom", mutate=mut_nested)
    c.add("b", b, "custom", mutate=mut_dense_either if dense else mut_nested, dense_ok=True)

    def oracle(s, res, live):
        A, Bv = s["a"], s["b"]
        pm = O.math_prec(A.dtype)
        if isinstance(Bv, nt.NestedArray):
            parts = [_mm_ref(O.EB.of(p.astype(np.float64)), O.EB.of(q.astype(np.float64)), pm)
                     for p, q in zip(comps(A), comps(Bv))]
            sizes = np.array([p.shape[:-1] + q.shape[-1:] for p, q in zip(comps(A), comps(Bv))],
                             np.int64).reshape(len(A), 2)
        elif np.ndim(Bv) == 3:
            Bb = np.asarray(Bv)
            parts = [_mm_ref(O.EB.of(p), O.EB.of(Bb[0] if len(Bb) == 1 else Bb[i]), pm)
                     for i, p in enumerate(comps(A))]
            sizes = np.array(A.sizes)
            if len(sizes):
                sizes[:, -1] = Bb.shape[2]
        else:
            Bm = O.EB.of(np.asarray(Bv))
            parts = [_mm_ref(O.EB.of(p), Bm, pm) for p in comps(A)]
            sizes = np.array(A.sizes)
            if len(sizes):
                sizes[:, -1] = np.shape(Bv)[1]
        return O.nested_check("result", res, sizes, O.concat(parts), A.dtype)
    c.oracle = oracle
    return finish(g, c, p_mutate=0.3)


@nested_target("linear", lambda: nt.linear)
def gen_nested_linear(g):
    c = new("cynorm.nested.linear", g)
    dt = _nested_dtype(g)
    kin, kout = g.size(zero=0.05), g.size(zero=0.05)
    x, _ = _nested_input(g, c, "x", trailing=(kin,), dt=dt)
    c.add("weight", _dense_arg(g, (kout, kin), dt), "custom", mutate=mut_dense_either)
    c.add("bias", g.maybe(lambda: _dense_arg(g, (kout,), dt), 0.3), "array", shapes=[(kout,)], optional=True,
          dtypes=(dt, F32) if dt in (BF16, F16) else (dt,))

    def oracle(s, res, live):
        xs = s["x"]
        pm = O.math_prec(xs.dtype)
        W = np.asarray(s["weight"])
        parts = []
        for q in comps(xs):
            y = _mm_ref(O.EB.of(q), O.EB.of(W.T), pm)
            if s["bias"] is not None:
                with O.at(pm):
                    y = y + O.EB.of(np.asarray(s["bias"]))
            parts.append(y)
        sizes = np.array(xs.sizes)
        if len(sizes):
            sizes[:, -1] = W.shape[0]
        return O.nested_check("result", res, sizes, O.concat(parts), xs.dtype)
    c.oracle = oracle
    return finish(g, c, p_mutate=0.3)


@nested_target("linear_backward", lambda: nt.linear_backward)
def gen_nested_linear_backward(g):
    c = new("cynorm.nested.linear_backward", g)
    dt = _nested_dtype(g)
    kin, kout = g.size(zero=0.05), g.size(zero=0.05)
    shapes, k = comp_shapes(g, trailing=(kin,))
    x = make_nested(g, shapes, k, dt)
    go = make_nested(g, [s[:-1] + (kout,) for s in shapes], k, dt)
    c.add("input", x, "custom", mutate=mut_nested)
    c.add("grad_output", go, "custom", mutate=mut_nested)
    c.add("weight", _dense_arg(g, (kout, kin), dt), "custom", mutate=mut_dense_either)
    c.add("output_mask", tuple(g.p(0.8) for _ in range(3)), "mask")

    def oracle(s, res, live):
        xs, gs = s["input"], s["grad_output"]
        W = np.asarray(s["weight"])
        pm = O.math_prec(xs.dtype)
        mask = tuple(s["output_mask"])
        rows = sum(int(np.prod(q.shape[:-1])) for q in comps(xs))
        X2 = O.EB.of(_rows2(comps(xs), W.shape[1]))
        G2 = O.EB.of(_rows2(comps(gs), W.shape[0]))
        del rows
        out = []
        if mask[0]:
            gi = _mm_ref(G2, O.EB.of(W), pm)
            sizes = np.array(xs.sizes)
            out.append(("gi", gi, sizes))
        probs = []
        res = res if isinstance(res, tuple) and len(res) == 3 else None
        if res is None:
            return ["expected a tuple of 3"]
        if mask[0]:
            probs += O.nested_check("grad_input", res[0], xs.sizes, out[0][1].reshape(-1), xs.dtype)
        elif res[0] is not None:
            probs.append("grad_input: expected None")
        wdt = O.data_dtype(W)
        if mask[1]:
            gw = _mm_ref(O.EB(G2.v.T, G2.e.T), X2, pm)
            probs += O.check("grad_weight", res[1], gw, wdt)
        elif res[1] is not None:
            probs.append("grad_weight: expected None")
        if mask[2]:
            gb = G2.ksum(0, False, O.P64) if G2.v.size else O.EB(np.zeros(W.shape[0], O.LD))
            probs += O.check("grad_bias", res[2], gb, wdt)
        elif res[2] is not None:
            probs.append("grad_bias: expected None")
        return probs
    c.oracle = oracle
    return finish(g, c, p_mutate=0.3)


@nested_target("matmul_backward", lambda: nt.matmul_backward)
def gen_nested_matmul_backward(g):
    c = new("cynorm.nested.matmul_backward", g)
    dt = _nested_dtype(g)
    kf, m = g.size(zero=0.05), g.size(zero=0.05)
    if g.p(0.45):
        shapes, k = comp_shapes(g, k=g.pick((2, 3)), trailing=(kf,), lead_min=1)
        self_ = make_nested(g, shapes, k, dt)
        other = _dense_arg(g, (kf, m), dt)
        grad = make_nested(g, [s[:-1] + (m,) for s in shapes], k, dt)
    elif g.p(0.35):  # a dense (B, k, m) batch of matrices
        n = g.int(0, 3)
        rows = [g.size(zero=0.1) for _ in range(n)]
        self_ = make_nested(g, [(r, kf) for r in rows], 2, dt)
        other = _dense_arg(g, (g.pick((n, 1)), kf, m), dt)
        grad = make_nested(g, [(r, m) for r in rows], 2, dt)
    else:
        n = g.int(0, 3)
        ash = [(g.size(), g.size(zero=0.05)) for _ in range(n)]
        bsh = [(s[1], g.size(zero=0.05)) for s in ash]
        self_ = make_nested(g, ash, 2, dt)
        other = make_nested(g, bsh, 2, dt)
        grad = make_nested(g, [(a[0], b[1]) for a, b in zip(ash, bsh)], 2, dt)
    c.add("grad", grad, "custom", mutate=mut_nested)
    c.add("self", self_, "custom", mutate=mut_nested)
    c.add("other", other)
    c.add("output_mask", (g.p(0.85), g.p(0.85)), "mask", n=2)

    def oracle(s, res, live):
        G, S, Ot = s["grad"], s["self"], s["other"]
        pm = O.math_prec(S.dtype)
        mask = tuple(s["output_mask"])
        if not (isinstance(res, tuple) and len(res) == 2):
            return ["expected a tuple of 2"]
        probs = []
        if isinstance(Ot, nt.NestedArray):
            if mask[0]:
                parts = [_mm_ref(O.EB.of(gq), O.EB.of(np.swapaxes(oq, -1, -2)), pm)
                         for gq, oq in zip(comps(G), comps(Ot))]
                probs += O.nested_check("grad_self", res[0], S.sizes, O.concat(parts), S.dtype)
            if mask[1]:
                parts = [_mm_ref(O.EB.of(np.swapaxes(sq, -1, -2)), O.EB.of(gq), pm)
                         for sq, gq in zip(comps(S), comps(G))]
                probs += O.nested_check("grad_other", res[1], Ot.sizes, O.concat(parts), Ot.dtype)
        elif np.ndim(Ot) == 3:
            Ob = np.asarray(Ot)
            if mask[0]:
                parts = [_mm_ref(O.EB.of(gq), O.EB.of((Ob[0] if len(Ob) == 1 else Ob[i]).T), pm)
                         for i, gq in enumerate(comps(G))]
                probs += O.nested_check("grad_self", res[0], S.sizes, O.concat(parts), S.dtype)
            if mask[1]:
                if len(Ob) == 1:      # one matrix for every component: all rows at once
                    S2 = _rows2(comps(S), Ob.shape[1])
                    G2 = _rows2(comps(G), Ob.shape[2])
                    go = _mm_ref(O.EB.of(S2.T), O.EB.of(G2), pm).reshape(Ob.shape)
                elif len(Ob):
                    per = [_mm_ref(O.EB.of(sq.T), O.EB.of(gq), pm) for sq, gq in zip(comps(S), comps(G))]
                    go = O.EB(np.stack([p.v for p in per]), np.stack([p.e for p in per]))
                else:
                    go = O.EB(np.zeros(Ob.shape, O.LD))
                probs += O.check("grad_other", res[1], go, O.data_dtype(Ob))
        else:
            Om = np.asarray(Ot)
            if mask[0]:
                parts = [_mm_ref(O.EB.of(gq), O.EB.of(Om.T), pm) for gq in comps(G)]
                probs += O.nested_check("grad_self", res[0], S.sizes, O.concat(parts), S.dtype)
            if mask[1]:
                k = Om.shape[0]
                S2 = _rows2(comps(S), k)
                G2 = _rows2(comps(G), Om.shape[1])
                go = _mm_ref(O.EB.of(S2.T), O.EB.of(G2), pm)
                probs += O.check("grad_other", res[1], go, O.data_dtype(Om))
        for i in (0, 1):
            if not mask[i] and res[i] is not None:
                probs.append(f"output {i}: expected None")
        return probs
    c.oracle = oracle
    return finish(g, c, p_mutate=0.3)


def _nested_ln_args(g, c, name="x"):
    dt = _nested_dtype(g)
    kt = g.int(1, 2)
    ns = tuple(g.size(zero=0.05) for _ in range(kt))
    shapes, k = comp_shapes(g, k=kt + g.int(0, 1), trailing=ns)
    x = make_nested(g, shapes, k, dt)
    return x, dt, ns


@nested_target("layer_norm", lambda: nt.layer_norm)
def gen_nested_layer_norm(g):
    c = new("cynorm.nested.layer_norm", g)
    x, dt, ns = _nested_ln_args(g, c)
    c.add("x", x, "custom", mutate=mut_nested)
    c.add("normalized_shape", ns_form(g, ns), "custom", mutate=mut_ns, ns=ns, ndim=x.ndim - 1,
          lenient=len(x) == 0)
    _affine_args(g, c, dt, ns)
    draw_eps(g, c)

    def oracle(s, res, live):
        xs = s["x"]
        nsv = s["normalized_shape"]
        ns2 = (int(nsv),) if np.ndim(nsv) == 0 else tuple(int(v) for v in nsv)
        N = math.prod(ns2)
        M = xs.buffer.size // N if N else sum(int(np.prod(q.shape[:q.ndim - len(ns2)])) for q in comps(xs))
        rows = xs.buffer.reshape(M, N)
        outs = O.ref_layer_norm(rows, (N,), None if s["weight"] is None else np.asarray(s["weight"]).reshape(N),
                                None if s["bias"] is None else np.asarray(s["bias"]).reshape(N), s["eps"])
        if not (isinstance(res, tuple) and len(res) == 3):
            return ["expected (y, mean, rstd)"]
        y = outs[0]
        refs = y.refs if isinstance(y.refs, list) else [y.refs]
        probs = []
        if not isinstance(res[0], nt.NestedArray):
            return ["y: expected a NestedArray"]
        if not np.array_equal(res[0].sizes, xs.sizes):
            probs.append("y: sizes differ from x's")
        probs += O.check("y.buffer", res[0].buffer.reshape(M, N), refs, xs.dtype, (M, N), skip=y.skip)
        for i, o in ((1, outs[1]), (2, outs[2])):
            probs += O.check(o.name, res[i], o.refs.reshape(M), o.dtype, (M,),
                             skip=None if o.skip is None else np.asarray(o.skip).reshape(M))
        return probs
    c.oracle = oracle
    return finish(g, c, p_mutate=0.3)


@nested_target("layer_norm_backward", lambda: nt.layer_norm_backward)
def gen_nested_layer_norm_backward(g):
    c = new("cynorm.nested.layer_norm_backward", g)
    x, dt, ns = _nested_ln_args(g, c)
    N = math.prod(ns)
    M = x.buffer.size // N if N else sum(int(np.prod(np.asarray(s)[:len(s) - len(ns)])) for s in x.sizes)
    rows = x.buffer.reshape(M, N).astype(np.float64)
    with np.errstate(all="ignore"):
        mean = rows.mean(1) if N else np.zeros(M)
        rstd = 1 / np.sqrt(((rows - mean[:, None]) ** 2).mean(1) + 1e-5) if N else np.full(M, np.nan)
    c.add("grad", like_nested(g, x), "custom", mutate=mut_nested, structured=True)
    c.add("input", x, "custom", mutate=mut_nested, structured=True)
    c.add("normalized_shape", ns_form(g, ns), "custom", mutate=mut_ns, ns=ns, ndim=x.ndim - 1,
          lenient=len(x) == 0)
    sd = STAT[dt]
    c.add("mean", mean.astype(sd), "array", shapes=[(M,)], unused=M == 0, size_only=True)
    c.add("rstd", rstd.astype(sd), "array", shapes=[(M,)], unused=M == 0, size_only=True)
    _affine_args(g, c, dt, ns)
    c.add("output_mask", tuple(g.p(0.8) for _ in range(3)), "mask")

    def oracle(s, res, live):
        xs, gs = s["input"], s["grad"]
        outs = O.ref_layer_norm_backward(gs.buffer.reshape(M, N), xs.buffer.reshape(M, N), (N,),
                                         np.asarray(s["mean"]).reshape(M, 1),
                                         np.asarray(s["rstd"]).reshape(M, 1),
                                         None if s["weight"] is None else np.asarray(s["weight"]).reshape(N),
                                         None if s["bias"] is None else np.asarray(s["bias"]).reshape(N),
                                         tuple(s["output_mask"]))
        if not (isinstance(res, tuple) and len(res) == 3):
            return ["expected a tuple of 3"]
        probs = []
        if not isinstance(res[0], nt.NestedArray):
            return ["grad_input: expected a NestedArray (zeros when masked off)"]
        if outs[0] is None:
            probs += O.same("grad_input (masked off: zeros)", res[0].buffer, np.zeros(xs.buffer.size, xs.dtype))
        else:
            probs += O.check("grad_input", res[0].buffer.reshape(M, N), outs[0].refs.reshape(M, N), xs.dtype,
                             (M, N), skip=None if outs[0].skip is None else np.asarray(outs[0].skip).reshape(M, N))
        # a normalized_shape accepted with fewer (size-1) axes shapes the parameter gradients
        try:
            ns_out = tuple(int(d) for d in np.reshape(np.asarray(s["normalized_shape"]), -1))
        except (TypeError, ValueError):
            ns_out = ns
        # an empty nested array accepts any normalized_shape (its gradients
        # are zeros of that shape); otherwise one of N elements
        empty_any = M == 0 and math.prod(ns_out) != N
        ns_out = ns_out if math.prod(ns_out) == N or empty_any else ns
        for i in (1, 2):
            if outs[i] is None:
                if res[i] is not None:
                    probs.append(f"output {i}: expected None")
            elif empty_any:
                probs += O.same(outs[i].name, res[i], np.zeros(ns_out, outs[i].dtype))
            else:
                probs += O.check(outs[i].name, res[i], outs[i].refs.reshape(ns_out), outs[i].dtype,
                                 ns_out, skip=outs[i].skip)
        return probs
    c.oracle = oracle
    return finish(g, c, p_mutate=0.3)


# ================================================================== cynorm.distributed (one rank)
import importlib.util  # noqa: E402


def _no_mpi():
    return None if importlib.util.find_spec("mpi4py") else "mpi4py is not installed (pip install mpi4py mpich)"


def _comm(kind):
    from mpi4py import MPI
    return {"self": MPI.COMM_SELF, "world": MPI.COMM_WORLD, "null": MPI.COMM_NULL, "none": None}[kind]


class _Comm:
    """A communicator chosen by name, resolved in the worker (mpi4py
    initializes MPI on import)."""

    def __init__(self, kind):
        self.kind = kind

    def __repr__(self):
        return f"MPI.COMM_{self.kind.upper()}"


def _resolve_comm(c):
    a = next((a for a in c.args if a.name == "comm"), None)
    if a is not None and isinstance(a.value, _Comm):
        a.value = _comm(a.value.kind)


def mut_comm(g, c, a):
    v = g.pick(("null", "junk", "junk2"))
    if v == "null":
        a.value = _Comm("null")
        c.want("error", "comm=MPI.COMM_NULL")
    else:
        a.value = g.pick(("COMM_WORLD", 0, object()))
        c.want("error", f"comm={a.value!r:.30}")


class _SyncCase(Case):
    def call(self):
        _resolve_comm(self)
        return Case.call(self)


@target("cynorm.distributed.sync_batch_norm", lambda: cynorm.distributed.sync_batch_norm, unavailable=_no_mpi)
def gen_sync_batch_norm(g):
    g.no_out = g.no_mutate = g.defer_one_value = True
    base = TARGETS["cynorm.batch_norm"].gen(g)
    g.no_mutate = g.defer_one_value = False
    c = _SyncCase("cynorm.distributed.sync_batch_norm", g)
    c.args, c.expect, c.notes, c.huge, c.inplace = base.args, base.expect, base.notes, base.huge, base.inplace
    c.add("comm", _Comm(g.pick(("self", "self", "world", "none"))), "custom", kw=True, mutate=mut_comm)
    compact = g.p(0.3)
    c.add("compact_stats", compact, "flag", kw=True)
    x = c.value("x")
    if compact and isinstance(x, np.ndarray) and O.data_dtype(x) in FLOATS and 0 < x.size < 1 << 24:
        a = np.abs(x.astype(np.float64))
        eps = c.value("eps")
        tiny_eps = not isinstance(eps, (int, float, np.integer, np.floating)) or eps < 1e-30
        if not np.all(np.isfinite(a)) or a.max() > 1e17 or tiny_eps or np.any((a > 0) & (a < 1e-17)):
            c.want("either", "compact_stats: the variance may leave float32's range")
            c.compact_extreme = True

    def oracle(s, res, live):
        if not (isinstance(res, tuple) and len(res) == 4):
            return ["expected (y, save_mean, save_invstd, count)"]
        tr = bool(s["training"])
        x = np.asarray(s["x"])
        outs, rm, rv, skip = O.ref_batch_norm(s["x"], s["weight"], s["bias"], s["running_mean"],
                                              s["running_var"], s["training"], s["momentum"],
                                              s["eps"], s["axis"])
        if s["compact_stats"]:     # variances exchanged in float32: y to float32 accuracy
            y = outs[0]
            b = 0 if s["bias"] is None else O.LD(np.abs(np.asarray(s["bias"], np.float64)).max(initial=0))
            y.refs = [O.EB(r.v, r.e + 8 * O.P32.u * (np.abs(r.v) + b)) for r in y.refs]
        probs = O.verify(outs[:1], res[:1])
        ax = s["axis"] % x.ndim
        C = x.shape[ax]
        sd = STAT[O.data_dtype(x)]
        n = x.size // C if C else math.prod(d for i, d in enumerate(x.shape) if i != ax)
        if tr:
            wide = 4 * O.P32.u if s["compact_stats"] else 0
            for i, o in ((1, outs[1]), (2, outs[2])):
                r = o.refs
                probs += O.check(o.name, res[i], O.EB(r.v, r.e + wide * np.abs(r.v)), sd, (C,), skip=o.skip)
            if res[3] != n or isinstance(res[3], bool):
                probs.append(f"count: {res[3]!r}, expected {n}")
            if s["compact_stats"] and rv is not None:
                rv = O.EB(rv.v, rv.e + 8 * O.P32.u * np.abs(rv.v))
                if getattr(c, "compact_extreme", False):      # a float32-flushed variance
                    rv = O.EB(rv.v, np.full(rv.v.shape, O.LD(np.inf)))
            probs += O.running_checks("running_mean", s["running_mean"], rm, live["running_mean"], skip)
            probs += O.running_checks("running_var", s["running_var"], rv, live["running_var"], skip)
        else:
            rvv = O.ld(np.asarray(s["running_var"])) + O.LD(float(s["eps"]))
            with np.errstate(all="ignore"):
                inv = 1 / np.sqrt(rvv)
            probs += O.check("save_mean", res[1], O.EB(O.ld(np.asarray(s["running_mean"]))), sd, (C,))
            probs += O.check("save_invstd", res[2], O.EB(inv, 4 * O.P64.u * np.abs(inv)), sd, (C,))
            if res[3] is not None:
                probs.append(f"count: {res[3]!r}, expected None in inference")
        return probs
    c.oracle = oracle
    c = finish(g, c, p_mutate=0.15)
    tr = c.value("training")
    if isinstance(tr, (bool, np.bool_)) and tr:
        c.inplace |= {"running_mean", "running_var"}
        if getattr(base, "one_value", False) and np.shape(c.value("x")) == np.shape(x):
            c.want("error", "one value per channel in training")
    else:
        c.inplace -= {"running_mean", "running_var"}
    return c


@target("cynorm.distributed.sync_batch_norm_backward", lambda: cynorm.distributed.sync_batch_norm_backward,
        unavailable=_no_mpi)
def gen_sync_batch_norm_backward(g):
    c = _SyncCase("cynorm.distributed.sync_batch_norm_backward", g)
    dt = g.dtype()
    shape, nd, axis, C, n = _bn_shape(g)
    training = g.p(0.7)
    x = g.array(shape, dt)
    c.add("grad_out", g.array(shape, dt), "array", huge=True)
    c.add("x", x, "array")
    c.add("weight", g.maybe(lambda: coef(g, (C,), COEF[dt]), 0.3), "array", dtypes=COEF[dt],
          shapes=[(C,)], optional=True)
    mean, inv, _ = true_bn_stats(x, axis)
    sd = _stat_dtype(g, dt)
    c.add("save_mean", stat_array(g, mean, (C,), sd), "array", shapes=[(C,)])
    c.add("save_invstd", stat_array(g, inv, (C,), sd, positive_only=True), "array", shapes=[(C,)])
    count = (n * g.pick((1, 1, 2)) if n else g.pick((0, 2))) if training else None
    c.add("count", count, "custom", mutate=lambda g, c, a: mutate_scalar(
        g, c, a, [(-1, "error"), (1.5, "error"), ("3", "error"), (True, "error"), (max(n - 1, 0), "either"),
                  (10 ** 30, "either"), (np.int64(max(n, 2)), "either")]))
    _axis_arg(g, c, axis, nd)
    c.add("comm", _Comm(g.pick(("self", "self", "world", "none"))), "custom", kw=True, mutate=mut_comm)
    c.add("output_mask", tuple(g.p(0.8) for _ in range(3)), "mask", kw=True)
    c.add("reduce_param_grads", g.p(0.3), "flag", kw=True)

    def oracle(s, res, live):
        xx = np.asarray(s["x"])
        cnt = s["count"]
        tr = cnt is not None
        gx, dotp, sum_dy, CC, nn = O.ref_bn_backward_core(s["grad_out"], xx, s["weight"], s["save_mean"],
                                                         s["save_invstd"], tr, s["axis"],
                                                         n_total=float(cnt) if tr else None)
        mask = tuple(s["output_mask"])
        I = O.EB.of(np.asarray(s["save_invstd"], np.float64).reshape(CC, 1))
        # README: grad_weight/grad_bias are this rank's sums (summed over the ranks with
        # reduce_param_grads); zeros for an empty batch: the global one when reduced
        reduced = bool(s["reduce_param_grads"]) and (mask[1] or mask[2])
        empty = (cnt == 0) if reduced else nn == 0
        with O.at(O.P64):
            gw = dotp * I if not empty else O.EB(np.zeros((CC, 1), O.LD))
        gdt = O.param_dtype(s["weight"], O.data_dtype(xx)) if s["weight"] is not None else STAT[O.data_dtype(xx)]
        exp = [O.Out("grad_x", gx, O.data_dtype(xx), xx.shape) if mask[0] else None,
               O.Out("grad_weight", gw.reshape(CC), gdt, (CC,)) if mask[1] else None,
               O.Out("grad_bias", sum_dy.reshape(CC) if not (nn == 0 and not reduced) else
                     O.EB(np.zeros(CC, O.LD)), gdt, (CC,))
               if mask[2] else None]
        if mask[0] and nn == 0:
            exp[0] = O.Out("grad_x", O.EB(np.zeros(xx.shape, O.LD)), O.data_dtype(xx), xx.shape)
        return O.verify(exp, res)
    c.oracle = oracle
    c = finish(g, c, p_mutate=0.3)
    cnt = c.value("count")
    if isinstance(cnt, (int, np.integer)) and not isinstance(cnt, bool) and (cnt < n or (n > 0 and cnt < 2)):
        c.want("error", "count below the local batch")
    return c


# ================================================================== cudnn_bind (host side)

def _cudnn_unavailable():
    try:
        import cudnn_bind
        from cudnn_bind import _lib
        _lib.get()
    except Exception as e:   # noqa: BLE001
        return f"cudnn_bind cannot load cuDNN here ({type(e).__name__}: {str(e)[:120]})"
    return None


def _cudnn_gpu_present():
    """The batch-norm entry points are fuzzed with fake device arrays (null
    pointers): only where no GPU can run them."""
    why = _cudnn_unavailable()
    if why:
        return why
    import cudnn_bind
    if cudnn_bind.is_available():
        return "a GPU is present: fake device arrays would reach cuDNN (run tests/test_cudnn_gpu.py)"
    return None


def _cudnn_case(name, g):
    import cudnn_bind
    c = new(name, g)
    c.accept = (cudnn_bind.CudnnBindError,)   # CudaError / CudnnError / CudnnUnavailableError
    return c


class FakeDevice:
    """An object exporting __cuda_array_interface__ (data pointer 0: no
    driver call is made for it)."""

    def __init__(self, cai):
        self._cai = cai

    @property
    def __cuda_array_interface__(self):
        return self._cai

    def __repr__(self):
        return f"FakeDevice({self._cai!r:.80})"


def fake_cai(g, shape, dtype="float32", order="C"):
    size = {"float32": 4, "float64": 8, "float16": 2, "uint8": 1}.get(dtype, 4)
    typestr = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "uint8": "|u1"}.get(dtype, "<f4")
    st = []
    acc = size
    dims = range(len(shape) - 1, -1, -1) if order == "C" else range(len(shape))
    strides = [0] * len(shape)
    for i in dims:
        strides[i] = acc
        acc *= max(shape[i], 1)
    del st
    cai = {"shape": tuple(shape), "typestr": typestr, "data": (0, False), "version": 3,
           "strides": tuple(strides) if g.p(0.5) or order != "C" else None}
    return cai


def break_cai(g, cai):
    cai = dict(cai)
    r = g.int(0, 8)
    if r == 0:
        cai.pop(g.pick(("shape", "typestr", "data")))
    elif r == 1:
        cai["typestr"] = g.pick((">f4", "<f3", "<i4", "<c8", 5, None))
    elif r == 2:
        cai["shape"] = g.pick((5, None, ("a",), (2.5, 3), (-1, 3)))
    elif r == 3:
        cai["strides"] = g.pick(((3,), (1, 2, 3, 4, 5, 6, 7), "x", (6, 5)))
    elif r == 4:
        cai["data"] = g.pick((None, 0, (None, False), ("x", False), ()))
    elif r == 5:
        cai["data"] = (g.pick((-1, 2 ** 70)), False)
    elif r == 6:
        return g.pick((None, [], "cai", 3))
    else:
        cai["data"] = (0, True)
    return cai


@target("cudnn_bind.memory.as_view", lambda: __import__("cudnn_bind.memory").memory.as_view,
        unavailable=_cudnn_unavailable)
def gen_as_view(g):
    c = _cudnn_case("cudnn_bind.memory.as_view", g)
    shape = tuple(g.size(zero=0.1) for _ in range(g.int(1, 4)))
    dt = g.pick(("float32", "float64", "float16"))
    cai = fake_cai(g, shape, dt)
    if g.p(0.5):
        bad = break_cai(g, cai)
        c.want("either", "malformed __cuda_array_interface__")
        obj = FakeDevice(bad)
    else:
        obj = FakeDevice(cai)
    if g.p(0.1):
        obj = g.pick((np.zeros(3), 5, None, "x", object()))
        c.want("error", f"obj={type(obj).__name__}")
    c.add("obj", obj)
    c.add("name", "x")
    c.extra_names = ("x",)

    def oracle(s, res, live):
        v = res
        cai2 = obj.__cuda_array_interface__
        probs = []
        if tuple(v.shape) != tuple(cai2["shape"]):
            probs.append(f"shape {v.shape}, expected {cai2['shape']}")
        if v.dtype != dt and cai2.get("typestr") in ("<f4", "<f8", "<f2"):
            probs.append(f"dtype {v.dtype}, expected {dt}")
        return probs
    c.oracle = oracle
    return c


@target("cudnn_bind.TensorDescriptor", lambda: __import__("cudnn_bind").TensorDescriptor,
        unavailable=_cudnn_unavailable)
def gen_tensor_descriptor(g):
    c = _cudnn_case("cudnn_bind.TensorDescriptor", g)
    nd = g.int(1, 6)
    shape = [g.int(1, 5) for _ in range(nd)]
    strides = list(np.cumprod([1] + shape[::-1])[:-1][::-1])
    strides = [int(x) for x in strides]
    dt = g.pick(("float32", "float64", "float16", "bfloat16"))
    r = g.rng.random()
    import cudnn_bind
    c.accept = (cudnn_bind.CudnnError,)     # cuDNN's own BAD_PARAM for odd strides
    if r < 0.1:
        shape[g.int(0, nd - 1)] = g.pick((0, -3, 2 ** 31, 2 ** 40))
        c.want("error", "bad size")
        c.accept = ()                       # must be refused before cuDNN (no int32 wrap)
    elif r < 0.15:
        dt = g.pick(("int8", None, "float128", 3))
        c.want("error", f"dtype={dt!r}")
    elif r < 0.2:
        strides = g.pick((None, strides[:-1], [0] * nd, [-1] * nd, [2 ** 40] * nd))
        c.want("either", f"strides={strides!r}")
        if strides and strides[0] == 2 ** 40:
            c.accept = ()
    elif r < 0.25:
        shape = shape + [1, 1, 1, 1]
        strides = strides + [1, 1, 1, 1]
        c.want("either", "many dims")
    elif r < 0.3:
        shape = g.pick(([2.5, 3], "abc", [[1]]))
        c.want("error", f"shape={shape!r}")
    c.add("shape", tuple(shape) if isinstance(shape, list) else shape)
    c.add("strides", tuple(strides) if isinstance(strides, list) else strides)
    c.add("dtype", dt)
    if g.p(0.3):
        pad = g.pick((4, 5, 8, 0, -1, 9))
        c.add("pad", pad)
        if not 4 <= pad <= 8:
            c.want("either", f"pad={pad}")

    def oracle(s, res, live):
        code, dims, st = res.get()
        pad = s.get("pad", 4)
        exp = list(s["shape"]) + [1] * max(0, pad - len(s["shape"]))
        codes = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 9}
        probs = []
        if tuple(dims) != tuple(exp):
            probs.append(f"dims {dims}, expected {tuple(exp)}")
        if code != codes.get(s["dtype"]):
            probs.append(f"data type {code}, expected {codes.get(s['dtype'])}")
        res.close()
        return probs
    c.oracle = oracle
    return c


@target("cudnn_bind.ActivationDescriptor", lambda: __import__("cudnn_bind").ActivationDescriptor,
        unavailable=_cudnn_unavailable)
def gen_activation_descriptor(g):
    c = _cudnn_case("cudnn_bind.ActivationDescriptor", g)
    mode = g.pick((1, 1, 0, 2, 5, -1, 2 ** 40, "relu", None, 1.0))
    coef = g.pick((0.0, 0.0, 1.5, float("nan"), 10 ** 400, "x", None))
    c.add("mode", mode)
    c.add("coef", coef)
    if mode not in (0, 1, 2, 3, 4, 5) or isinstance(mode, float) or coef in ("x", None) \
            or coef == 10 ** 400 or coef != coef:
        c.want("either")
    c.oracle = lambda s, res, live: [] if res.value.value else ["descriptor has a null handle"]
    c.after = None
    return c


@target("cudnn_bind.derive_bn_descriptor", lambda: __import__("cudnn_bind").derive_bn_descriptor,
        unavailable=_cudnn_unavailable)
def gen_derive_bn(g):
    import cudnn_bind
    c = _cudnn_case("cudnn_bind.derive_bn_descriptor", g)
    nd = g.int(4, 5)
    shape = tuple(g.int(1, 5) for _ in range(nd))
    strides = tuple(int(x) for x in np.cumprod((1,) + shape[::-1])[:-1][::-1])
    desc = cudnn_bind.TensorDescriptor(shape, strides, "float32")
    mode = g.pick((0, 1, 2, 1, 3, -1, "spatial", None, True))
    if g.p(0.1):
        desc.close()
        c.want("error", "closed descriptor")
    elif g.p(0.1):
        desc = g.pick((None, "desc", np.zeros(3)))
        c.want("error", "not a descriptor")
    if mode not in (0, 1, 2) or isinstance(mode, bool):
        c.want("either" if isinstance(mode, (bool, str)) else "error", f"mode={mode!r}")
    c.add("x_desc", desc)
    c.add("mode", mode)

    def oracle(s, res, live):
        code, dims, st = res.get()
        m = {"per_activation": 0, "spatial": 1, "spatial_persistent": 2}.get(s["mode"], s["mode"])
        m = int(m)
        exp = (1, shape[1]) + ((1,) * (nd - 2) if m != 0 else shape[2:])
        res.close()
        return [] if tuple(dims) == exp else [f"dims {dims}, expected {exp}"]
    c.oracle = oracle
    return c


@target("cudnn_bind.choose_mode", lambda: __import__("cudnn_bind").choose_mode,
        unavailable=_cudnn_unavailable)
def gen_choose_mode(g):
    c = _cudnn_case("cudnn_bind.choose_mode", g)
    c.add("ndim", g.int(2, 5))
    c.add("layout", g.pick(("contiguous", "channels_last")))
    c.add("training", g.p(0.5))

    def oracle(s, res, live):
        exp = 2 if s["training"] and s["layout"] == "channels_last" and s["ndim"] >= 4 else 1
        return [] if res == exp else [f"mode {res!r}, expected {exp}"]
    c.oracle = oracle
    return c


def _reset_cudnn():
    import cudnn_bind
    cudnn_bind.reset()


@target("cudnn_bind.load", lambda: __import__("cudnn_bind").load, unavailable=_cudnn_unavailable)
def gen_cudnn_load(g):
    import glob
    import os
    c = _cudnn_case("cudnn_bind.load", g)
    libm = (glob.glob("/lib/x86_64-linux-gnu/libm.so.6") + glob.glob("/usr/lib*/libm.so.6") + [None])[0]
    paths = ["/nonexistent/libcudnn.so.9", "/", os.path.dirname(__file__), __file__, "", "a\0b", b"/nonexistent",
             3, [], "libcudnn_not_there.so"] + ([libm] if libm else [])
    p = g.pick(paths)
    c.add("path", p)
    if g.p(0.3):
        c.add("cudart", g.pick(("/nonexistent/libcudart.so", "", 3, None)))
    c.want("error" if p is not None else "either", f"path={p!r}")
    c.after = _reset_cudnn
    c.oracle = lambda s, res, live: []
    return c


@target("cudnn_bind.can_use_cudnn", lambda: __import__("cudnn_bind").can_use_cudnn,
        unavailable=_cudnn_unavailable)
def gen_can_use_cudnn(g):
    c = _cudnn_case("cudnn_bind.can_use_cudnn", g)
    shape = tuple(g.size(zero=0.05) for _ in range(g.int(2, 5)))
    C = shape[1]

    def arr(shp, dt="float32"):
        return g.pick((FakeDevice(fake_cai(g, shp, dt)), FakeDevice(fake_cai(g, shp, dt)), np.zeros(shp, dt),
                       None, "x"))
    c.add("x", arr(shape, g.pick(("float32", "float16", "float64"))))
    for name in ("weight", "bias", "running_mean", "running_var"):
        c.add(name, arr((C,)))
    c.add("training", g.pick((True, False, 1, None)))
    c.add("eps", g.pick((1e-5, 0.0, -1.0, 10 ** 400, "1e-5", None, float("nan"))))
    c.want("either")

    def oracle(s, res, live):
        if not (isinstance(res, tuple) and len(res) == 2 and isinstance(res[0], bool) and isinstance(res[1], str)):
            return [f"expected (bool, str), got {res!r:.60}"]
        return [] if res[0] == (res[1] == "") else [f"inconsistent answer {res!r:.80}"]
    c.oracle = oracle
    return c


def _bn_entry(name):
    def gen(g):
        import cudnn_bind
        c = _cudnn_case("cudnn_bind." + name, g)
        shape = [g.size(zero=0.05) for _ in range(g.int(1, 6))]
        if len(shape) > 1 and g.p(0.8):
            shape[1] = max(shape[1], 1)
        shape = tuple(shape)
        C = shape[1] if len(shape) > 1 else 1
        dt = g.pick(("float32", "float64", "float16"))
        pdt = "float64" if dt == "float64" else "float32"
        order = g.pick(("C", "C", "F"))

        def dev(shp, d):
            cai = fake_cai(g, shp, d, order if shp == shape else "C")
            return FakeDevice(break_cai(g, cai) if g.p(0.1) else cai)
        x = dev(shape, dt)
        w, b = dev((C,), pdt if g.p(0.9) else g.pick(("float16", "float64", "float32"))), dev((C,), pdt)
        if name == "batch_norm_backward":
            c.add("x", x)
            c.add("dy", dev(shape, dt))
            c.add("weight", w)
            c.add("save_mean", dev((C,), pdt))
            c.add("save_invstd", dev((C,), pdt))
            c.add("eps", g.pick((1e-5, -1.0, 10 ** 400, "x", 0.0)))
            c.add("reserve", g.pick((None, dev((0,), "uint8"), np.zeros(3))))
        else:
            c.add("x", x)
            c.add("weight", g.pick((w, w, None)))
            c.add("bias", g.pick((b, b, None)))
            c.add("running_mean", g.pick((dev((C,), pdt), None)))
            c.add("running_var", g.pick((dev((C,), pdt), None)))
            c.add("eps", g.pick((1e-5, -1.0, 10 ** 400, "x", 0.0)), kw=True)
        if g.p(0.2):
            c.add("mode", g.pick(("spatial", "bogus", 7, None, 1)), kw=True)
        if g.p(0.1):
            c.add("handle", g.pick((None, "h", 0)), kw=True)
        if g.p(0.1):
            c.add("stream", g.pick((None, "s", 0, -1)), kw=True)
        c.want("either")             # no driver here: a valid call ends in CudaError
        c.oracle = lambda s, res, live: ["returned a result without a GPU"]
        del cudnn_bind
        return c
    return target("cudnn_bind." + name, lambda: getattr(__import__("cudnn_bind"), name),
                  unavailable=_cudnn_gpu_present)(gen)


for _n in ("batch_norm_forward_training", "batch_norm_forward_inference", "batch_norm_backward"):
    _bn_entry(_n)


@target("cudnn_bind.DeviceArray", lambda: __import__("cudnn_bind").DeviceArray,
        unavailable=_cudnn_gpu_present)
def gen_device_array(g):
    c = _cudnn_case("cudnn_bind.DeviceArray", g)
    shape = g.pick(((2, 3), (0,), (4,), (-1, 2), (2.5,), "ab", None, (2 ** 62, 2 ** 62)))
    c.add("shape", shape)
    c.add("dtype", g.pick(("float32", "float64", "bfloat16", "int7", None, np.float16)))
    if g.p(0.3):
        c.add("strides", g.pick(((1,), (3, 1), None, "x")))
    c.want("either")
    c.oracle = lambda s, res, live: ["allocated device memory without a GPU"]
    return c


# ================================================================== cynorm: threads, cache, config, jvp registry

_OPENMP_BUILD = bool(cynorm._kernels.load("_runtime").build_info()["openmp"])


def _restore_threads(n):
    return lambda: cynorm.set_num_threads(n)


@target("cynorm.set_num_threads", lambda: cynorm.set_num_threads)
def gen_set_num_threads(g):
    c = new("cynorm.set_num_threads", g)
    v, exp = g.pick([(1, "ok"), (2, "ok"), (3, "ok"), (np.int64(2), "ok"), (0, "error"), (-1, "error"),
                     (2.0, "error"), (True, "error"), ("2", "error"), (None, "error"), (10 ** 400, "either")])
    c.add("n", v)
    c.want(exp)
    c.after = _restore_threads(cynorm.get_num_threads())

    def oracle(s, res, live):
        got = cynorm.get_num_threads()
        # a serial build runs one thread whatever is asked (and warns)
        want = int(s["n"]) if _OPENMP_BUILD else 1
        return [] if res is None and got == want else [f"returned {res!r}; get_num_threads() = {got}"]
    c.oracle = oracle
    return c


@target("cynorm.get_num_threads", lambda: cynorm.get_num_threads)
def gen_get_num_threads(g):
    c = new("cynorm.get_num_threads", g)
    c.oracle = lambda s, res, live: [] if isinstance(res, int) and res >= 1 else [f"returned {res!r}"]
    return c


_FAMILIES = ("rows", "elementwise", "channels", "row_grads", "columns", "exp")


def _restore_thresholds():
    old = cynorm.get_thread_thresholds()
    return lambda: cynorm.set_thread_thresholds(old)


def _thresholds_oracle(res):
    if not isinstance(res, dict) or tuple(res) != _FAMILIES:
        return [f"returned {res!r}, not the six families' thresholds"]
    return [f"{k}: {v!r}" for k, v in res.items() if type(v) is not int or v < 0]


@target("cynorm.get_thread_thresholds", lambda: cynorm.get_thread_thresholds)
def gen_get_thread_thresholds(g):
    c = new("cynorm.get_thread_thresholds", g)
    c.oracle = lambda s, res, live: _thresholds_oracle(res)
    return c


@target("cynorm.set_thread_thresholds", lambda: cynorm.set_thread_thresholds)
def gen_set_thread_thresholds(g):
    c = new("cynorm.set_thread_thresholds", g)
    v, exp = g.pick([(None, "ok"), ({}, "ok"), ({"rows": 1000}, "ok"), ({"exp": np.int64(0)}, "ok"),
                     ({"columns": 1 << 40, "channels": 7}, "ok"), ({"bogus": 1}, "error"),
                     ({"rows": -1}, "error"), ({"rows": 1.5}, "error"), ({"rows": True}, "error"),
                     ({"rows": 10 ** 400}, "error"), ({"rows": 5, "row": 5}, "error"),
                     ([("rows", 1)], "error"), (5, "error"), ("rows", "error")])
    c.add("thresholds", v)
    c.want(exp)
    c.after = _restore_thresholds()

    def oracle(s, res, live):
        problems = _thresholds_oracle(res)
        now = cynorm.get_thread_thresholds()
        want = s["thresholds"] or {}
        problems += [f"{k} is {now[k]}, set {v}" for k, v in want.items() if now[k] != int(v)]
        return problems
    c.oracle = oracle
    return c


@target("cynorm.tune_threads", lambda: cynorm.tune_threads)
def gen_tune_threads(g):
    # one thread (nothing to measure) or bad arguments: the measurement's
    # seconds of timing stay in tests/test_tune_threads.py
    c = new("cynorm.tune_threads", g)
    bad = False
    threads, e = g.pick([(1, False), (np.int64(1), False), (0, True), (-2, True), (2.0, True),
                         ("1", True), (True, True)])
    c.add("threads", threads)
    bad |= e
    if g.p(0.5):
        repeats, e = g.pick([(1, False), (15, False), (0, True), (1001, True), (2.5, True),
                             (None, True)])
        c.add("repeats", repeats, kw=True)
        bad |= e
    if g.p(0.5):
        apply, e = g.pick([(True, False), (False, False), (np.bool_(True), False), (1, True),
                           ("yes", True), (None, True)])
        c.add("apply", apply, kw=True)
        bad |= e
    c.want("error" if bad else "ok")
    c.after = _restore_thresholds()

    def oracle(s, res, live):
        return _thresholds_oracle(res) + (
            [] if res == cynorm.get_thread_thresholds() else ["one thread changed the thresholds"])
    c.oracle = oracle
    return c


_TEAM_INFO_KEYS = {"policy", "available", "cap", "held_for_s", "regions", "late_regions"}


def _restore_team_policy():
    old = cynorm.get_team_policy()
    return lambda: cynorm.set_team_policy(old)


@target("cynorm.get_team_policy", lambda: cynorm.get_team_policy)
def gen_get_team_policy(g):
    c = new("cynorm.get_team_policy", g)
    c.oracle = lambda s, res, live: [] if res in ("adaptive", "fixed") else [f"returned {res!r}"]
    return c


@target("cynorm.set_team_policy", lambda: cynorm.set_team_policy)
def gen_set_team_policy(g):
    c = new("cynorm.set_team_policy", g)
    adaptive = "ok" if cynorm.thread_team_info()["available"] else "error"
    v, exp = g.pick([("fixed", "ok"), ("adaptive", adaptive), ("Fixed", "error"), ("", "error"),
                     (None, "error"), (1, "error"), (b"fixed", "error"), (["fixed"], "error")])
    c.add("policy", v)
    c.want(exp)
    c.after = _restore_team_policy()

    def oracle(s, res, live):
        now = cynorm.get_team_policy()
        return [] if res in ("adaptive", "fixed") and now == s["policy"] else [
            f"returned {res!r}; get_team_policy() = {now!r}"]
    c.oracle = oracle
    return c


@target("cynorm.thread_team_info", lambda: cynorm.thread_team_info)
def gen_thread_team_info(g):
    c = new("cynorm.thread_team_info", g)

    def oracle(s, res, live):
        if not isinstance(res, dict) or set(res) != _TEAM_INFO_KEYS:
            return [f"returned {res!r}"]
        return [f"{k}: {res[k]!r}" for k in ("cap", "regions", "late_regions")
                if type(res[k]) is not int or res[k] < 0]
    c.oracle = oracle
    return c


def _restore_cache():
    info = cynorm.alloc_cache_info()
    limit = info.get("limit") if isinstance(info, dict) else None
    return (lambda: cynorm.set_alloc_cache_limit(limit)) if isinstance(limit, int) else None


@target("cynorm.set_alloc_cache_limit", lambda: cynorm.set_alloc_cache_limit)
def gen_set_alloc_cache_limit(g):
    c = new("cynorm.set_alloc_cache_limit", g)
    v, exp = g.pick([(0, "ok"), (1 << 20, "ok"), (1 << 30, "ok"), (-1, "error"), (1.5, "error"),
                     ("1", "error"), (None, "error"), (True, "either"), (10 ** 400, "either"), (2 ** 63, "either")])
    c.add("limit", v)
    c.want(exp)
    c.after = _restore_cache()
    c.oracle = lambda s, res, live: []
    return c


@target("cynorm.alloc_cache_info", lambda: cynorm.alloc_cache_info)
def gen_alloc_cache_info(g):
    c = new("cynorm.alloc_cache_info", g)
    c.oracle = lambda s, res, live: [] if isinstance(res, dict) else [f"returned {type(res).__name__}"]
    return c


@target("cynorm.clear_alloc_cache", lambda: cynorm.clear_alloc_cache)
def gen_clear_alloc_cache(g):
    c = new("cynorm.clear_alloc_cache", g)
    c.oracle = lambda s, res, live: []
    return c


@target("cynorm.config", lambda: cynorm.config)
def gen_config(g):
    c = new("cynorm.config", g)
    c.oracle = lambda s, res, live: [] if isinstance(res, dict) and "version" in res else [f"returned {res!r:.60}"]
    return c


@target("cynorm.show_config", lambda: cynorm.show_config)
def gen_show_config(g):
    c = new("cynorm.show_config", g)
    c.oracle = lambda s, res, live: []
    return c


def _register_and_call(op, rule, nondiff=(), ignored=()):
    """register_jvp(op, ...)(rule), then jvp(op, (x,), (t,)) with it."""
    cynorm.register_jvp(op, nondiff=nondiff, ignored=ignored)(rule)
    x = np.arange(3.0)
    return cynorm.jvp(op, (x,), (np.ones(3),))


def _fresh_op(x):
    return 2 * x


@target("cynorm.register_jvp", lambda: _register_and_call)
def gen_register_jvp(g):
    c = new("cynorm.register_jvp", g)
    c.extra_names = ("x", "tangents[0]")      # the jvp call made with the registered rule
    op = g.pick((_fresh_op, _fresh_op, np.sin, 3, None, "op"))
    rule = g.pick(((lambda p, t, k: (2 * p[0], 2 * t[0])),) * 3 + (None, 5))
    c.add("op", op)
    c.add("rule", rule)
    if g.p(0.3):
        c.add("nondiff", g.pick(((), ("x",), "x", 3)))
    if not callable(op) or not callable(rule):
        c.want("error", "op or rule not callable")
    elif len(c.args) > 2:
        c.want("either", f"nondiff={c.value('nondiff')!r}")

    def undo():
        cynorm.jvp_rules.pop(op, None) if callable(op) else None
    c.after = undo

    def oracle(s, res, live):
        (o, t) = res
        return O.same("output", o, 2 * np.arange(3.0)) + O.same("tangent", t, 2 * np.ones(3))
    c.oracle = oracle
    return c


# self-test targets (CYNORM_FUZZ_SELFTEST=1): a crash, a hang, a wrong answer ...
import os as _os  # noqa: E402
if _os.environ.get("CYNORM_FUZZ_SELFTEST"):
    from . import selftest  # noqa: F401,E402
