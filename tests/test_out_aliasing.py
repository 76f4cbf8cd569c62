"""out= arrays that are inputs, overlap inputs, or overlap each other.

For every op with ``out=``, every assignment of the op's outputs to None or
to one of its inputs of the same shape and dtype (exactly that array, or a
view of the same buffer shifted by one element) is run and compared bitwise
with the same call on fresh copies and no out=.  Two outputs in one memory,
or an output in the memory of a running statistic the op updates in place,
must raise ValueError naming both.
"""
import itertools

import ml_dtypes
import numpy as np
import pytest

import cynorm

F32, F64, BF16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16)


def _arr(rng, shape, dtype, positive=False):
    a = rng.standard_normal(shape)
    if positive:
        a = np.abs(a) + 0.5
    return a.astype(dtype)


# Each spec: (id, op, build(rng) -> (ordered dict of array inputs, kwargs),
# the names of the outputs, the inputs the op updates in place)
def _weight_norm_case(shape, dim, dtype):
    def build(rng):
        gdt = F32 if dtype.itemsize == 2 else dtype
        gshape = tuple(s if i == dim else 1 for i, s in enumerate(shape))
        return {"v": _arr(rng, shape, dtype), "g": _arr(rng, gshape, gdt)}, {"dim": dim}
    return build


def _weight_norm_backward_case(shape, dim, dtype):
    def build(rng):
        arrays, kw = _weight_norm_case(shape, dim, dtype)(rng)
        _, norm = cynorm.weight_norm_interface(arrays["v"], arrays["g"], dim)
        return {"grad_w": _arr(rng, shape, dtype), "saved_v": arrays["v"],
                "saved_g": arrays["g"], "saved_norm": norm}, kw
    return build


def _layer_norm_case(shape, ns, dtype):
    def build(rng):
        wdt = F32 if dtype.itemsize == 2 else dtype
        return ({"x": _arr(rng, shape, dtype), "weight": _arr(rng, ns, wdt),
                 "bias": _arr(rng, ns, wdt)}, {"normalized_shape": ns})
    return build


def _batch_norm_case(shape, axis, dtype, training):
    def build(rng):
        C = shape[axis]
        pdt = F32 if dtype.itemsize == 2 else dtype
        return ({"x": _arr(rng, shape, dtype), "weight": _arr(rng, C, pdt),
                 "bias": _arr(rng, C, pdt), "running_mean": _arr(rng, C, pdt),
                 "running_var": _arr(rng, C, pdt, positive=True)},
                {"training": training, "axis": axis})
    return build


def _bn_elemt_case(shape, dtype):
    def build(rng):
        C = shape[1]
        pdt = F32 if dtype.itemsize == 2 else dtype
        return ({"x": _arr(rng, shape, dtype), "weight": _arr(rng, C, pdt),
                 "bias": _arr(rng, C, pdt), "mean": _arr(rng, C, pdt),
                 "invstd": _arr(rng, C, pdt, positive=True)}, {})
    return build


def _bn_backward_elemt_case(shape, dtype):
    def build(rng):
        C = shape[1]
        pdt = F32 if dtype.itemsize == 2 else dtype
        return ({"grad_out": _arr(rng, shape, dtype), "x": _arr(rng, shape, dtype),
                 "mean": _arr(rng, C, pdt), "invstd": _arr(rng, C, pdt, positive=True),
                 "weight": _arr(rng, C, pdt), "sum_dy": _arr(rng, C, pdt),
                 "sum_dy_xmu": _arr(rng, C, pdt)}, {"count": np.array([shape[0] * 3])})
    return build


def _norm_except_dim(v, *, out=None, **kw):
    return cynorm.norm_except_dim(v, 2, out=out, **kw)


def _v_only(build):
    def only(rng):
        arrays, kw = build(rng)
        return {"v": arrays["v"]}, kw
    return only


SPECS = []
for dt in (F32, F64, BF16):
    for shape, dim in (((4, 1), 0), ((3,), 0), ((5, 3), 1)):
        SPECS += [
            (f"norm_except_dim-{shape}-{dt}", _norm_except_dim,
             _v_only(_weight_norm_case(shape, dim, dt)), ("out",), ()),
            (f"weight_norm-{shape}-{dt}", cynorm.weight_norm,
             _weight_norm_case(shape, dim, dt), ("out",), ()),
            (f"weight_norm_interface-{shape}-{dt}", cynorm.weight_norm_interface,
             _weight_norm_case(shape, dim, dt), ("w", "norm"), ()),
            (f"weight_norm_backward-{shape}-{dt}", cynorm.weight_norm_backward,
             _weight_norm_backward_case(shape, dim, dt), ("grad_v", "grad_g"), ()),
        ]
    for shape, ns in (((4, 1), (1,)), ((1,), (1,)), ((3,), (3,)), ((2, 3, 4), (4,))):
        SPECS.append((f"layer_norm-{shape}-{dt}", cynorm.layer_norm,
                      _layer_norm_case(shape, ns, dt), ("y", "mean", "rstd"), ()))
    for shape, axis in (((4, 3), 1), ((2, 3, 5), 1), ((2, 5, 3), -1), ((3, 3), 1)):
        for training in (True, False):
            SPECS.append((f"batch_norm-{shape}-{axis}-{training}-{dt}", cynorm.batch_norm,
                          _batch_norm_case(shape, axis, dt, training),
                          ("y", "save_mean", "save_invstd"),
                          ("running_mean", "running_var") if training else ()))
    for shape in ((4, 3), (2, 3, 5)):
        SPECS += [
            (f"batch_norm_elemt-{shape}-{dt}", cynorm.batch_norm_elemt,
             _bn_elemt_case(shape, dt), ("out",), ()),
            (f"batch_norm_backward_elemt-{shape}-{dt}", cynorm.batch_norm_backward_elemt,
             _bn_backward_elemt_case(shape, dt), ("out",), ()),
        ]


def _call(op, arrays, kw, outs, out_names):
    if outs is None:
        return op(**arrays, **kw)
    out = outs[0] if out_names == ("out",) else tuple(outs)
    return op(**arrays, **kw, out=out)


def _as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


def _copies(arrays):
    return {k: a.copy() for k, a in arrays.items()}


def _expected(op, arrays, kw, out_names):
    """The op's results and its in-place updates on private copies, no out=."""
    fresh = _copies(arrays)
    return _as_tuple(_call(op, fresh, kw, None, out_names)), fresh


def _assignments(arrays, reference, out_names):
    """Each output slot: None, or the name of an input of its shape and dtype."""
    choices = []
    for r in reference:
        same = [k for k, a in arrays.items()
                if r is not None and a.shape == r.shape and a.dtype == r.dtype and r.size]
        choices.append([None] + same)
    return [c for c in itertools.product(*choices) if any(c)]


def _check(spec_id, op, arrays, kw, out_names, updated, assign, make_out):
    ref, ref_arrays = _expected(op, arrays, kw, out_names)
    work = _copies(arrays)
    outs, named = [], []
    for slot, name in zip(out_names, assign):
        outs.append(None if name is None else make_out(work, name))
        named.append(name)
    taken = [n for n in named if n is not None]
    conflict = len(set(taken)) < len(taken) or any(n in updated for n in taken)
    if conflict:
        with pytest.raises(ValueError, match="share memory"):
            _call(op, work, kw, outs, out_names)
        return
    got = _as_tuple(_call(op, work, kw, outs, out_names))
    for i, (g, r) in enumerate(zip(got, ref)):
        if r is None:
            assert g is None
            continue
        if outs[i] is not None:
            assert g is outs[i], f"{spec_id} {assign}: result {i} is not the out= array"
        np.testing.assert_array_equal(g, r, err_msg=f"{spec_id} out={assign}: result {i}")
    for name in updated:       # the in-place running statistics
        np.testing.assert_array_equal(work[name], ref_arrays[name],
                                      err_msg=f"{spec_id} out={assign}: {name}")


@pytest.mark.parametrize("spec", SPECS, ids=[s[0] for s in SPECS])
def test_out_is_an_input(spec):
    spec_id, op, build, out_names, updated = spec
    arrays, kw = build(np.random.default_rng(7))
    ref, _ = _expected(op, arrays, kw, out_names)
    for assign in _assignments(arrays, ref, out_names):
        _check(spec_id, op, arrays, kw, out_names, updated, assign,
               lambda work, name: work[name])


def _shifted(work, name, by):
    """Replace work[name] by a view of a larger buffer holding the same values,
    and return an output-shaped view of that buffer shifted by `by` elements."""
    a = work[name]
    buf = np.zeros(a.size + 1, a.dtype)
    view = buf[max(0, -by):max(0, -by) + a.size].reshape(a.shape)
    view[...] = a
    work[name] = view
    return buf[max(0, by):max(0, by) + a.size].reshape(a.shape)


@pytest.mark.parametrize("by", [1, -1])
@pytest.mark.parametrize("spec", SPECS, ids=[s[0] for s in SPECS])
def test_out_overlaps_an_input(spec, by):
    spec_id, op, build, out_names, updated = spec
    arrays, kw = build(np.random.default_rng(8))
    ref, _ = _expected(op, arrays, kw, out_names)
    for assign in _assignments(arrays, ref, out_names):
        if sum(n is not None for n in assign) != 1:
            continue        # one overlapping output at a time
        _check(spec_id, op, arrays, kw, out_names, updated, assign,
               lambda work, name: _shifted(work, name, by))


def test_two_outputs_in_one_memory_are_refused():
    rng = np.random.default_rng(9)
    x = _arr(rng, (4, 1), F32)
    y = np.empty_like(x)
    with pytest.raises(ValueError, match=r"out\[1\] \(mean\) and out\[2\] \(rstd\) share memory"):
        cynorm.layer_norm(x, (1,), out=(None, y, y))
    buf = np.empty(9, np.float32)
    with pytest.raises(ValueError, match=r"out\[0\] \(y\) and out\[1\] \(mean\) share memory"):
        cynorm.layer_norm(x, (1,), out=(buf[:4].reshape(4, 1), buf[3:7].reshape(4, 1), None))
    v, g = _arr(rng, (3,), F32), _arr(rng, (3,), F32)
    w = np.empty(3, np.float32)
    with pytest.raises(ValueError, match="share memory"):
        cynorm.weight_norm_interface(v, g, 0, out=(w, w))


def test_interleaved_running_stats_are_not_a_conflict():
    """Views of one buffer that touch no common element are distinct arrays."""
    rng = np.random.default_rng(10)
    x = _arr(rng, (4, 3), F32)
    buf = np.ones(6, np.float32)
    rm, rv = np.ones(3, np.float32), np.ones(3, np.float32)
    ref = cynorm.batch_norm(x, None, None, rm, rv, training=True)
    got = cynorm.batch_norm(x, None, None, buf[0::2], buf[1::2], training=True)
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)
    np.testing.assert_array_equal(buf[0::2], rm)
    np.testing.assert_array_equal(buf[1::2], rv)


def test_running_stats_in_one_memory_are_refused():
    rng = np.random.default_rng(11)
    x = _arr(rng, (4, 3), F32)
    r = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="running_mean and running_var share memory"):
        cynorm.batch_norm(x, None, None, r, r, training=True)
    # inference only reads them: the same array for both is fine
    y, _, _ = cynorm.batch_norm(x, None, None, r, r, training=False)
    np.testing.assert_array_equal(y, cynorm.batch_norm(x, None, None, r.copy(), r.copy(),
                                                       training=False)[0])
    m, s = np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="running_mean and running_var share memory"):
        cynorm.batch_norm_gather_stats(m, s, [3, 4], r, r)
