"""The bit grid: every kernel's outputs over a fixed grid of calls, saved so
that a rewrite of the kernels proves itself bitwise against the build before.

    python benchmarks/bit_grid.py save before.npz [--threads 1,2] [--fuzz-cases 200]
    python benchmarks/bit_grid.py compare before.npz [--threads 1,2] [--fuzz-cases 200]

`save` runs the grid on the cynorm this interpreter imports and writes every
output (as raw bytes) to an .npz; `compare` runs it again and reports each
output whose bytes differ (with the largest difference in units of the
dtype's last place), each output missing on either side, and exits 1 if any.

The grid has two parts:

* structured: every public op of the kernel families (weight norm, layer
  norm, batch norm and its split-statistics ops, the nested ops, softmax and
  friends, the JVP rules) x dtype (float32, float64, bfloat16, float16) x
  path: rows, columns, fused, segments, channels-last, middle dims,
  dim=None, eval/training, with and without affine parameters, on small,
  tail-crossing (lane and block edges) and multi-block / multi-chunk shapes;
  and every norm on data holding NaNs of both signs and infinities, with
  NaN weights and biases (specials_grid: the NaNs' bits too);
* fuzz: the first --fuzz-cases cases of every target of tests/fuzz (a fixed
  seed), called in this process: their outputs, or the class and message of
  the error they raise.

Each part runs at every thread count in --threads (outputs must be the same
at each: the determinism rule).  The grid runs only the public API, so the
same script compares any two builds.

--cross-platform (on both save and compare) compares builds for different
CPUs (x86-64 against aarch64, .ci/aarch64): the structured part only (the
fuzz part's inputs are not the same bits on both: its generator draws them
with NumPy's exp and log, SIMD routines of their own on x86-64), every NaN
stored with its sign bit clear (the NaN an invalid operation creates is
negative on x86-64 and positive on Arm: no build can change that), and the
outputs of PLATFORM_DEPENDENT reported but not counted.
"""
import argparse
import hashlib
import contextlib
import io
import os
import re
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

DEFAULT_FUZZ_SEED = 20261124
# outputs up to this size are kept whole (a difference is then reported in
# ulps); larger ones by their SHA-256
KEEP_BYTES = 1 << 16
# --cross-platform: NaNs stored with the sign bit clear
CANONICAL_NANS = False
# --cross-platform: outputs whose bits are not the kernels' own, by key
# (regular expression) and why; a difference in them is listed, not counted
PLATFORM_DEPENDENT = [
    (r"/nested/[^/]+/\d+/[^/]+/gelu(_tanh|_backward)?/",
     "libm's erf, erff and tanhf (activations.pyx.tp): glibc's aarch64 build "
     "contracts them to FMAs, its x86-64 build does not (1 ulp in erf/erff, "
     "up to 3 in tanhf; more in gelu_backward where its two terms cancel)"),
    (r"/nested/[^/]+/\d+/\d+/softmax(_backward)?/1/",
     "nested softmax along a dim other than the last: NumPy's exp "
     "(nested/reductions.py), a SIMD routine of NumPy's own on x86-64"),
]


def _dtypes():
    import ml_dtypes
    return [np.float32, np.float64, ml_dtypes.bfloat16, np.float16]


def _name(dt):
    return np.dtype(dt).name


def _math(dt):
    return np.float64 if np.dtype(dt) == np.float64 else np.float32


class Grid:
    """Collects outputs under string keys."""

    def __init__(self):
        self.out = {}

    def put(self, key, res):
        if key in self.out:
            raise KeyError(f"duplicate grid key {key}")
        self._put(key, res, 0)

    def _put(self, key, res, depth):
        from cynorm.nested import NestedArray
        if isinstance(res, (tuple, list)):
            for i, r in enumerate(res):
                self._put(f"{key}/{i}", r, depth + 1)
        elif isinstance(res, NestedArray):
            self._put(f"{key}/buffer", res.buffer, depth + 1)
            self._put(f"{key}/offsets", np.asarray(res.offsets), depth + 1)
        elif res is None:
            self.out[key] = np.zeros(0, np.uint8)
        elif isinstance(res, np.ndarray) or np.isscalar(res):
            a = np.asarray(res)
            if CANONICAL_NANS:
                a = _nan_sign_clear(a)
            raw = np.ascontiguousarray(a).tobytes()
            if len(raw) > KEEP_BYTES:      # large outputs: their digest
                raw = b"sha256:" + hashlib.sha256(raw).digest()
            self.out[key] = np.frombuffer(raw, np.uint8).copy()
            self.out[key + "::dtype"] = np.frombuffer(
                f"{a.dtype.str}{a.shape}".encode(), np.uint8).copy()
        else:
            self.out[key] = np.frombuffer(repr(res).encode(), np.uint8).copy()

    def error(self, key, exc):
        self.out[key + "::error"] = np.frombuffer(
            f"{type(exc).__name__}: {exc}".encode(), np.uint8).copy()


def _nan_sign_clear(a):
    """a with every NaN's sign bit clear (a copy where it has a NaN)."""
    if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
        return a
    nan = np.isnan(a)
    if not nan.any():
        return a
    a = np.array(a)
    bits = a.view(f"u{a.dtype.itemsize}")
    bits[nan] &= bits.dtype.type(np.iinfo(bits.dtype).max >> 1)     # all but the sign bit
    return a


def _data(rng, shape, dt, scale=1.0, offset=0.0):
    return np.asarray(rng.standard_normal(shape) * scale + offset).astype(dt)


# ------------------------------------------------------------------ structured grid

# (shape, dim): rows (fused and not), columns (one and several column tasks),
# rows with A > 1, middle dims, dim=None; lengths across the 16-lane, 64-element
# block and 32768-element chunk edges
WN_CASES = [
    ((64, 300), 0), ((4, 300), 0), ((9, 1), 0), ((16, 40000), 0), ((2, 70001), 0),
    ((300, 64), 1), ((2048, 33), 1), ((5, 7, 9), 1), ((3, 9000), 1), ((40, 3, 129), 1),
    ((7, 17), 1), ((33, 65), 0), ((1, 1), 0), ((100, 3, 5), 2), ((6, 6), None),
    ((300, 301), None), ((63,), 0), ((0, 5), 1),
]


def weight_norm_grid(grid, rng):
    import cynorm
    for dt in _dtypes():
        for shape, dim in WN_CASES:
            key = f"wn/{_name(dt)}/{shape}/{dim}"
            v = _data(rng, shape, dt, scale=float(rng.choice([1e-3, 1.0, 1e3])))
            gshape = () if dim is None else tuple(
                s if i == (dim % len(shape)) else 1 for i, s in enumerate(shape))
            g = _data(rng, gshape, _math(dt))
            gw = _data(rng, shape, dt)
            for p in (2, 1, 3, np.inf, 0.5):
                grid.put(f"{key}/norm_except_dim/p{p}", cynorm.norm_except_dim(v, p, dim))
            w, n = cynorm.weight_norm_interface(v, g, dim)
            grid.put(f"{key}/interface", (w, n))
            grid.put(f"{key}/weight_norm", cynorm.weight_norm(v, g, dim))
            grid.put(f"{key}/backward", cynorm.weight_norm_backward(gw, v, g, n, dim))
            tv, tg = _data(rng, shape, dt), _data(rng, gshape, _math(dt))
            grid.put(f"{key}/jvp", cynorm.jvp(cynorm.weight_norm_interface, (v, g, dim),
                                              (tv, tg, None)))
            grid.put(f"{key}/jvp_backward", cynorm.jvp(
                cynorm.weight_norm_backward, (gw, v, g, n, dim),
                (_data(rng, shape, dt), tv, tg, None, None)))


# (shape, normalized_shape): N across lane, block and chunk edges; M across
# the backward's row blocks
LN_CASES = [
    ((64, 300), (300,)), ((7, 5, 33), (5, 33)), ((3, 70000), (70000,)), ((1000, 8), (8,)),
    ((1, 1), (1,)), ((5, 15), (15,)), ((9, 17), (17,)), ((3, 63), (63,)), ((4, 65), (65,)),
    ((2, 129), (129,)), ((513, 64), (64,)), ((4100, 3), (3,)), ((16, 2, 1024), (2, 1024)),
    ((0, 8), (8,)),
]


def layer_norm_grid(grid, rng):
    import cynorm
    for dt in _dtypes():
        for shape, ns in LN_CASES:
            key = f"ln/{_name(dt)}/{shape}"
            x = _data(rng, shape, dt, scale=3.0, offset=float(1e3 * rng.standard_normal()))
            w, b = _data(rng, ns, _math(dt)), _data(rng, ns, _math(dt))
            for affine in ("wb", "w", "none"):
                ww = None if affine == "none" else w
                bb = b if affine == "wb" else None
                y, m, r = cynorm.layer_norm(x, ns, ww, bb)
                grid.put(f"{key}/{affine}/forward", (y, m, r))
                dy = _data(rng, shape, dt)
                for mask in ((True, True, True), (True, False, False), (False, True, True)):
                    grid.put(f"{key}/{affine}/backward/{mask}", cynorm.layer_norm_backward(
                        dy, x, ns, m, r, ww, bb, output_mask=mask))
                grid.put(f"{key}/{affine}/jvp", cynorm.jvp(
                    cynorm.layer_norm, (x, ns, ww, bb),
                    (_data(rng, shape, dt), None, None if ww is None else _data(rng, ns, _math(dt)),
                     None if bb is None else _data(rng, ns, _math(dt)))))
                grid.put(f"{key}/{affine}/jvp_backward", cynorm.jvp(
                    cynorm.layer_norm_backward, (dy, x, ns, m, r, ww, bb),
                    (_data(rng, shape, dt), _data(rng, shape, dt), None, None, None,
                     None if ww is None else _data(rng, ns, _math(dt)), None)))


def rms_norm_grid(grid, rng):
    import cynorm
    for dt in _dtypes():
        for shape, ns in LN_CASES:
            key = f"rms/{_name(dt)}/{shape}"
            x = _data(rng, shape, dt, scale=3.0, offset=float(rng.standard_normal()))
            w = _data(rng, ns, _math(dt))
            for ww in (w, None):
                affine = "w" if ww is not None else "none"
                y, r = cynorm.rms_norm(x, ns, ww)
                grid.put(f"{key}/{affine}/forward", (y, r))
                dy = _data(rng, shape, dt)
                for mask in ((True, True), (True, False), (False, True)):
                    grid.put(f"{key}/{affine}/backward/{mask}", cynorm.rms_norm_backward(
                        dy, x, ns, r, ww, output_mask=mask))
                grid.put(f"{key}/{affine}/jvp", cynorm.jvp(
                    cynorm.rms_norm, (x, ns, ww),
                    (_data(rng, shape, dt), None, None if ww is None else _data(rng, ns, _math(dt)))))
                grid.put(f"{key}/{affine}/jvp_backward", cynorm.jvp(
                    cynorm.rms_norm_backward, (dy, x, ns, r, ww),
                    (_data(rng, shape, dt), _data(rng, shape, dt), None, None,
                     None if ww is None else _data(rng, ns, _math(dt)))))


def add_norm_grid(grid, rng):
    import cynorm
    for dt in _dtypes():
        for shape, ns in LN_CASES:
            key = f"add/{_name(dt)}/{shape}"
            x, res = _data(rng, shape, dt, scale=3.0), _data(rng, shape, dt)
            w, b = _data(rng, ns, _math(dt)), _data(rng, ns, _math(dt))
            dy, dh = _data(rng, shape, dt), _data(rng, shape, dt)
            y, h, m, r = cynorm.add_layer_norm(x, res, ns, w, b)
            grid.put(f"{key}/layer/forward", (y, h, m, r))
            grid.put(f"{key}/layer/backward", cynorm.add_layer_norm_backward(dy, dh, h, ns, m, r, w, b))
            y, h, r = cynorm.add_rms_norm(x, res, ns, w)
            grid.put(f"{key}/rms/forward", (y, h, r))
            grid.put(f"{key}/rms/backward", cynorm.add_rms_norm_backward(dy, dh, h, ns, r, w))
            grid.put(f"{key}/rms/backward_x", cynorm.add_rms_norm_backward(
                dy, dh, h, ns, r, None, output_mask=(True, False)))


# (shape, axis): N,C,H,W short and long rows, channels-last, 2-D (columns),
# middle dims, a single sample, large A (column blocks), odd widths
BN_CASES = [
    ((32, 64, 7, 7), 1), ((8, 3, 500), 1), ((4096, 64), 1), ((8, 9, 9, 32), -1),
    ((2, 700, 3), 1), ((16, 128, 14, 14), 1), ((1, 5, 33), 1), ((3, 4, 1), 1),
    ((64, 33), 1), ((7, 17, 65), 1), ((2, 3, 40000), 1), ((4, 6, 6, 100), 3),
    ((5000, 7), 1), ((2, 8), 1), ((3, 2, 5, 7), 2), ((16, 1030), 1), ((600, 3, 2, 41), -1),
]


def batch_norm_grid(grid, rng):
    import cynorm
    for dt in _dtypes():
        md = _math(dt)
        for shape, axis in BN_CASES:
            key = f"bn/{_name(dt)}/{shape}/{axis}"
            x = _data(rng, shape, dt, scale=2.0, offset=5.0)
            C = shape[axis]
            w, b = _data(rng, C, md), _data(rng, C, md)
            dy = _data(rng, shape, dt)
            for affine in ("wb", "none"):
                ww, bb = (w, b) if affine == "wb" else (None, None)
                rm, rv = np.zeros(C, md), np.ones(C, md)
                y, sm, si = cynorm.batch_norm(x, ww, bb, rm, rv, True, 0.1, 1e-5, axis)
                grid.put(f"{key}/{affine}/train", (y, sm, si, rm, rv))
                grid.put(f"{key}/{affine}/eval",
                         cynorm.batch_norm(x, ww, bb, rm, rv, False, 0.1, 1e-5, axis))
                for train in (True, False):
                    for mask in ((True, True, True), (True, False, False), (False, True, True)):
                        grid.put(f"{key}/{affine}/backward/{train}/{mask}",
                                 cynorm.batch_norm_backward(dy, x, ww, rm, rv, sm, si, train, 1e-5,
                                                            mask, axis))
                rm2, rv2 = np.zeros(C, md), np.ones(C, md)
                grid.put(f"{key}/{affine}/jvp", cynorm.jvp(
                    cynorm.batch_norm, (x, ww, bb, rm2, rv2, True, 0.1, 1e-5, axis),
                    (_data(rng, shape, dt), None if ww is None else _data(rng, C, md),
                     None if bb is None else _data(rng, C, md), None, None, None, None, None,
                     None)))
            mean, invstd = cynorm.batch_norm_stats(x, 1e-5, axis)
            grid.put(f"{key}/stats", (mean, invstd))
            grid.put(f"{key}/elemt", cynorm.batch_norm_elemt(x, w, b, mean, invstd, 1e-5, axis))
            red = cynorm.batch_norm_backward_reduce(dy, x, mean, invstd, w, True, True, True, axis)
            grid.put(f"{key}/backward_reduce", red)
            count = np.full(1, x.size // C, np.int32)
            grid.put(f"{key}/backward_elemt", cynorm.batch_norm_backward_elemt(
                dy, x, mean, invstd, w, red[0], red[1], count, axis))


def nested_grid(grid, rng):
    import cynorm
    from cynorm import nested
    lengths_sets = [[1, 2, 3], [17, 0, 64, 65, 5], [300, 1, 33], [1025, 4, 2000]]
    for dt in _dtypes():
        for li, lengths in enumerate(lengths_sets):
            for width in (None, 8, 33):
                shape_of = (lambda n: (n,)) if width is None else (lambda n: (n, width))
                comps = [_data(rng, shape_of(n), dt) for n in lengths]
                a = nested.nested_array(comps)
                g = nested.nested_array([_data(rng, shape_of(n), dt) for n in lengths])
                key = f"nested/{_name(dt)}/{li}/{width}"
                for dim in ((1, -1) if width is not None else (1,)):
                    s = nested.softmax(a, dim)
                    grid.put(f"{key}/softmax/{dim}", s)
                    grid.put(f"{key}/softmax_backward/{dim}", nested.softmax_backward(g, s, dim))
                    try:
                        grid.put(f"{key}/sum/{dim}", nested.sum(a, dim))
                    except (ValueError, TypeError) as exc:
                        grid.error(f"{key}/sum/{dim}", exc)
                for fn in ("relu", "silu", "gelu"):
                    grid.put(f"{key}/{fn}", getattr(nested, fn)(a))
                grid.put(f"{key}/gelu_tanh", nested.gelu(a, approximate="tanh"))
                grid.put(f"{key}/silu_backward", nested.silu_backward(g, a))
                grid.put(f"{key}/gelu_backward", nested.gelu_backward(g, a))
                if width is not None:
                    w, b = _data(rng, (width,), _math(dt)), _data(rng, (width,), _math(dt))
                    y, m, r = nested.layer_norm(a, (width,), w, b)
                    grid.put(f"{key}/layer_norm", (y, m, r))
                    grid.put(f"{key}/layer_norm_backward",
                             nested.layer_norm_backward(g, a, (width,), m, r, w, b))


def softmax_grid(grid, rng):
    import cynorm
    for dt in (np.float32, np.float64):
        for shape in ((5, 7), (3, 1000), (2, 3, 65), (4097,)):
            x = _data(rng, shape, dt, scale=3.0)
            g = _data(rng, shape, dt)
            for dim in range(-1, len(shape)):
                key = f"softmax/{_name(dt)}/{shape}/{dim}"
                y = cynorm.softmax(x, dim)
                ly = cynorm.log_softmax(x, dim)
                grid.put(f"{key}/softmax", y)
                grid.put(f"{key}/log_softmax", ly)
                grid.put(f"{key}/softmax_backward", cynorm.softmax_backward_data(g, y, dim, dt))
                grid.put(f"{key}/log_softmax_backward",
                         cynorm.log_softmax_backward_data(g, ly, dim, dt))
        x = _data(rng, (9, 300), dt)
        grid.put(f"log_sigmoid/{_name(dt)}", cynorm.log_sigmoid_forward(x))


# (channels-first shape, groups): each of the kernels' shapes (groups, samples,
# instances; short and long rows), at both channel axes
GN_CASES = [((2, 6, 3, 4), 3), ((3, 8, 50), 2), ((6, 64, 7, 7), 64), ((4, 32, 8, 8), 8),
            ((2, 4, 200, 400), 1), ((2, 48, 96, 80), 3), ((5, 4), 2)]


def group_norm_grid(grid, rng):
    import cynorm
    for dt in _dtypes():
        for shape, G in GN_CASES:
            for axis in (1, -1):
                key = f"gn/{_name(dt)}/{shape}/{G}/{axis}"
                x = _data(rng, shape, dt, scale=3.0, offset=float(rng.standard_normal()))
                if axis == -1:
                    x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
                C = shape[1]
                w, b = _data(rng, (C,), _math(dt)), _data(rng, (C,), _math(dt))
                y, m, r = cynorm.group_norm(x, G, w, b, axis=axis)
                grid.put(f"{key}/forward", (y, m, r))
                dy = _data(rng, x.shape, dt)
                grid.put(f"{key}/backward", cynorm.group_norm_backward(dy, x, m, r, w, G,
                                                                       axis=axis))
                rm, rv = _data(rng, (C,), _math(dt)), np.abs(_data(rng, (C,), _math(dt))) + 0.5
                for use in (True, False):
                    if use and x.size // max(C, 1) < 2 * shape[0]:
                        continue        # one position per instance: no running update
                    out = cynorm.instance_norm(x, w, b, rm, rv, use, 0.1, 1e-5, axis)
                    grid.put(f"{key}/instance/{use}", out + (rm.copy(), rv.copy()))
                    grid.put(f"{key}/instance_backward/{use}", cynorm.instance_norm_backward(
                        dy, x, out[1], out[2], w, use, axis=axis))
                grid.put(f"{key}/jvp", cynorm.jvp(
                    cynorm.group_norm, (x, G, w, b),
                    (_data(rng, x.shape, dt), None, _data(rng, (C,), _math(dt)), None),
                    axis=axis))


def _specials(rng, shape, dt, axis=-1):
    """Data with NaNs of both signs and infinities of both signs, placed so
    that along `axis` some slices are clean, some hold one NaN, some NaNs of
    both signs (their order each way), some +inf and -inf together, some one
    infinity: NaN statistics, NaN coefficients and NaN passing through."""
    x = np.asarray(rng.standard_normal(shape) * 2 + 1, np.float64)
    x = np.moveaxis(x, axis, -1)            # a view: writes go to x's memory
    lead = x.reshape(-1, x.shape[-1]) if x.size else x.reshape(0, 1)
    n = lead.shape[-1]
    for i in range(lead.shape[0]):
        kind = i % 6
        if kind == 1:
            lead[i, (7 * i) % n] = np.nan
        elif kind == 2:
            lead[i, (3 * i) % n], lead[i, (5 * i + 1) % n] = np.nan, -np.nan
        elif kind == 3:
            lead[i, (5 * i + 1) % n], lead[i, (3 * i) % n] = np.nan, -np.nan
        elif kind == 4:
            lead[i, (3 * i) % n], lead[i, (5 * i + 1) % n] = np.inf, -np.inf
        elif kind == 5:
            lead[i, (11 * i) % n] = -np.inf
    x = np.moveaxis(x, -1, axis)
    return np.ascontiguousarray(x).astype(dt)


def specials_grid(grid, rng):
    """Every kernel family on data holding NaNs and infinities: the NaNs'
    signs are part of the bits, and must not depend on the compiler, the SIMD
    level or the path (compare a gcc and a clang build, or two levels)."""
    import cynorm
    for dt in _dtypes():
        md = _math(dt)
        for shape in ((12, 7), (24, 300), (6, 2100)):
            key = f"special/{_name(dt)}/{shape}"
            x = _specials(rng, shape, dt)
            N = shape[-1]
            w, b = _data(rng, N, md), _data(rng, N, md)
            dy = _specials(rng, shape, dt, axis=0)
            y, m, r = cynorm.layer_norm(x, N, w, b)
            grid.put(f"{key}/ln", (y, m, r))
            grid.put(f"{key}/ln_backward", cynorm.layer_norm_backward(dy, x, N, m, r, w, b))
            yr, rr = cynorm.rms_norm(x, N, w)
            grid.put(f"{key}/rms", (yr, rr))
            grid.put(f"{key}/rms_backward", cynorm.rms_norm_backward(dy, x, N, rr, w))
            res = _data(rng, shape, dt)
            grid.put(f"{key}/add_ln", cynorm.add_layer_norm(x, res, N, w, b))
            # NaNs of both signs meeting in the add
            neg = -x.astype(np.float64)
            grid.put(f"{key}/add_rms_nans", cynorm.add_rms_norm(x, neg.astype(dt), N, w))
            # a NaN weight and a NaN bias (of the other sign) in one column
            wnan, bnan = w.copy(), b.copy()
            wnan[1], bnan[1], bnan[2] = np.nan, -np.nan, np.nan
            y, m, r = cynorm.layer_norm(x, N, wnan, bnan)
            grid.put(f"{key}/ln_nan_params", (y, m, r))
            grid.put(f"{key}/ln_nan_params_backward",
                     cynorm.layer_norm_backward(dy, x, N, m, r, wnan, bnan))
            grid.put(f"{key}/rms_nan_params", cynorm.rms_norm(x, N, wnan))
            for dim in (0, 1):
                g = _data(rng, (shape[0], 1) if dim == 0 else (1, N), md) + 2
                g.ravel()[1] = -np.nan
                wn, nn = cynorm.weight_norm_interface(x, g, dim)
                grid.put(f"{key}/wn/{dim}", (wn, nn))
                grid.put(f"{key}/wn_backward/{dim}",
                         cynorm.weight_norm_backward(dy, x, g, nn, dim))
        for shape, axis in (((4, 12, 5, 7), 1), ((4, 5, 7, 12), -1), ((300, 24), 1),
                            ((2, 12, 2100), 1)):
            key = f"special/{_name(dt)}/bn/{shape}/{axis}"
            C = shape[axis]
            x = _specials(rng, shape, dt, axis=0 if axis == -1 else -1)
            dy = _specials(rng, shape, dt, axis=axis)
            w, b = _data(rng, C, md), _data(rng, C, md)
            w[1], b[1], b[2] = np.nan, -np.nan, -np.nan
            rm, rv = np.zeros(C, md), np.ones(C, md)
            y, sm, si = cynorm.batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5, axis)
            grid.put(f"{key}/train", (y, sm, si, rm, rv))
            grid.put(f"{key}/eval", cynorm.batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5, axis))
            for train in (True, False):
                grid.put(f"{key}/backward/{train}", cynorm.batch_norm_backward(
                    dy, x, w, rm, rv, sm, si, train, 1e-5, (True, True, True), axis))
            if len(shape) == 4:
                G = 3
                y, m, r = cynorm.group_norm(x, G, w, b, axis=axis)
                grid.put(f"{key}/gn", (y, m, r))
                grid.put(f"{key}/gn_backward", cynorm.group_norm_backward(dy, x, m, r, w, G,
                                                                          axis=axis))
                rm, rv = np.zeros(C, md), np.ones(C, md)
                out = cynorm.instance_norm(x, w, b, rm, rv, True, 0.1, 1e-5, axis)
                grid.put(f"{key}/in", out + (rm, rv))
                grid.put(f"{key}/in_backward", cynorm.instance_norm_backward(
                    dy, x, out[1], out[2], w, True, axis=axis))


STRUCTURED = [weight_norm_grid, layer_norm_grid, batch_norm_grid, nested_grid, softmax_grid,
              rms_norm_grid, add_norm_grid, group_norm_grid, specials_grid]


def structured(grid, prefix):
    for part in STRUCTURED:
        rng = np.random.default_rng([20261124, STRUCTURED.index(part)])
        sub = Grid()
        part(sub, rng)
        for k, v in sub.out.items():
            grid.out[f"{prefix}/{k}"] = v


# ------------------------------------------------------------------ fuzz grid

def fuzz(grid, prefix, cases, seed):
    sys.path.insert(0, ROOT)
    from tests.fuzz import cases as fc
    for name, tgt in sorted(fc.TARGETS.items()):
        if name.startswith("cudnn_bind") or "sync_batch_norm" in name:
            continue            # device and MPI targets: not kernels of this build
        if name == "cynorm.thread_team_info":
            continue            # counters of this process's regions, not results
        if tgt.unavailable():
            continue
        for i in range(cases):
            key = f"{prefix}/fuzz/{name}/{i}"
            c = tgt.case(seed, i)
            try:
                with contextlib.redirect_stdout(io.StringIO()):     # show_config and friends
                    res = c.call()
            except Exception as exc:            # the error is part of the grid
                grid.error(key, exc)
                continue
            finally:
                if c.after is not None:
                    c.after()
            grid.put(key, res)


def run(threads, fuzz_cases, seed):
    import cynorm
    grid = Grid()
    for t in threads:
        cynorm.set_num_threads(t)
        t0 = time.perf_counter()
        structured(grid, f"t{t}")
        t1 = time.perf_counter()
        if fuzz_cases:
            fuzz(grid, f"t{t}", fuzz_cases, seed)
        print(f"threads={t}: structured {t1 - t0:.1f} s, fuzz {time.perf_counter() - t1:.1f} s",
              file=sys.stderr)
    return grid.out


def ulps(a_bytes, b_bytes, dtype_key):
    """Largest difference in units in the last place, for float outputs of
    the same length (None when not comparable)."""
    meta = dtype_key.decode() if isinstance(dtype_key, bytes) else dtype_key
    kinds = {"<f4": np.int32, "<f8": np.int64, "<f2": np.int16, "<V2": np.int16}
    for code, it in kinds.items():
        if (meta.startswith(code) and len(a_bytes) == len(b_bytes) and len(a_bytes)
                and len(a_bytes) % np.dtype(it).itemsize == 0):
            ia = np.frombuffer(a_bytes, it).astype(np.int64)
            ib = np.frombuffer(b_bytes, it).astype(np.int64)
            return int(np.max(np.abs(ia - ib)))
    return None


def compare(saved, now, cross_platform=False):
    bad = 0
    known = {}
    for key in sorted(set(saved) | set(now)):
        if key.endswith("::dtype"):
            continue
        if key not in saved or key not in now:
            print(f"{'missing in new' if key not in now else 'new only'}: {key}")
            bad += 1
            continue
        a, b = saved[key], now[key]
        if a.shape != b.shape or not np.array_equal(a, b):
            meta = bytes(saved.get(key + "::dtype", np.zeros(0, np.uint8))).decode()
            u = ulps(a.tobytes(), b.tobytes(), meta)
            extra = f"  max {u} ulp" if u is not None else ""
            if key.endswith("::error"):
                extra = f"\n    before: {bytes(a).decode()}\n    after:  {bytes(b).decode()}"
            why = next((w for pat, w in PLATFORM_DEPENDENT if re.search(pat, key)),
                       None) if cross_platform else None
            if why is not None:
                known[why] = known.get(why, 0) + 1
                continue
            print(f"differs: {key} [{meta}]{extra}")
            bad += 1
    for why, count in known.items():
        print(f"platform-dependent, not counted: {count} outputs ({why})")
    n = sum(1 for k in saved if not k.endswith("::dtype"))
    print(f"{n} outputs compared, {bad} differ or are missing")
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("save", "compare"))
    ap.add_argument("path")
    ap.add_argument("--threads", default="1,2", help="thread counts to run the grid at")
    ap.add_argument("--fuzz-cases", type=int, default=200,
                    help="cases per fuzz target (0: structured grid only)")
    ap.add_argument("--fuzz-seed", type=int, default=DEFAULT_FUZZ_SEED)
    ap.add_argument("--cross-platform", action="store_true",
                    help="builds for different CPUs: structured part only, NaN signs cleared, "
                         "PLATFORM_DEPENDENT outputs not counted (use on save and compare)")
    args = ap.parse_args(argv)
    if args.cross_platform:
        global CANONICAL_NANS
        CANONICAL_NANS = True
        args.fuzz_cases = 0
    threads = [int(t) for t in args.threads.split(",")]
    import cynorm
    print(f"cynorm from {os.path.dirname(cynorm.__file__)}, SIMD {cynorm.config()['simd_compiled']}",
          file=sys.stderr)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run(threads, args.fuzz_cases, args.fuzz_seed)
    if args.action == "save":
        np.savez_compressed(args.path, **out)
        print(f"{sum(1 for k in out if not k.endswith('::dtype'))} outputs saved to {args.path}")
        return 0
    with np.load(args.path) as f:
        saved = {k: f[k] for k in f.files}
    return 1 if compare(saved, out, args.cross_platform) else 0


if __name__ == "__main__":
    sys.exit(main())
