"""Deliberately broken targets, registered only with CYNORM_FUZZ_SELFTEST=1:
tests/test_fuzz.py checks that the driver classifies each of them."""
import ctypes
import os
import signal
import time

import numpy as np

from .cases import new, target


def _crash(x):
    os.kill(os.getpid(), signal.SIGSEGV)


def _hang(x):
    time.sleep(3600)


def _modifies(x):
    x[...] = 0.0
    return x.copy()


def _wrong(x):
    return x * 2.0


def _keyerror(x):
    raise KeyError("x")


def _unnamed(x):
    raise ValueError("something is wrong")


def _outside(x, *, out):
    # write one element past the end of out (into its guard bytes)
    ptr = out.__array_interface__["data"][0] + out.nbytes
    ctypes.memset(ptr, 0x11, out.itemsize)
    out[...] = x
    return out


def _simple(name, fn, expect="ok", with_out=False):
    def gen(g):
        c = new(name, g)
        c.add("x", np.arange(6.0))
        c.want(expect)
        if with_out:
            parent = np.zeros(8)
            c.watch.append(parent)
            c.add("out", parent[1:7], kw=True)
            c.out = c.args[-1]
            c.out_slots = [(None, c.args[-1].value)]
        c.oracle = lambda s, res, live: [] if np.array_equal(res, s["x"]) else ["result differs from x"]
        return c
    return target(name, lambda: fn)(gen)


_simple("selftest.crash", _crash)
_simple("selftest.hang", _hang)
_simple("selftest.modifies", _modifies)
_simple("selftest.wrong", _wrong)
_simple("selftest.keyerror", _keyerror)
_simple("selftest.unnamed", _unnamed, expect="error")
_simple("selftest.outside", _outside, with_out=True)
