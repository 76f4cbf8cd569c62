"""The output block cache: reuse, bounds, switching off, thread safety."""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import cynorm
from cynorm._kernels import _alloc


@pytest.fixture
def cache():
    info = cynorm.alloc_cache_info()
    cynorm.clear_alloc_cache()
    yield
    cynorm.set_alloc_cache_limit(info["limit"])
    cynorm.clear_alloc_cache()


def test_freed_large_output_is_reused(cache):
    v = np.ones((1024, 1024), np.float32)
    g = np.ones(1024, np.float32)
    w = cynorm.weight_norm(v, g, 0)
    ptr = w.ctypes.data
    del w
    info = cynorm.alloc_cache_info()
    assert info["blocks"] == 1 and info["held"] == 4 << 20
    hits = info["hits"]
    w2 = cynorm.weight_norm(v, g, 0)
    assert w2.ctypes.data == ptr
    assert cynorm.alloc_cache_info()["hits"] == hits + 1
    np.testing.assert_allclose(w2, 1 / 32, rtol=1e-6)


def test_small_outputs_bypass_the_cache(cache):
    before = cynorm.alloc_cache_info()
    w = cynorm.weight_norm(np.ones((16, 16), np.float32), np.ones(16, np.float32), 0)
    del w
    after = cynorm.alloc_cache_info()
    assert after["blocks"] == 0 and after["misses"] == before["misses"]


def test_limit_bounds_what_is_kept(cache):
    cynorm.set_alloc_cache_limit(6 << 20)
    arrays = [_alloc.empty((1 << 20,), np.float32, 4 << 20) for _ in range(3)]
    del arrays
    info = cynorm.alloc_cache_info()
    assert info["held"] <= 6 << 20 and info["blocks"] == 1
    cynorm.set_alloc_cache_limit(0)
    assert cynorm.alloc_cache_info()["held"] == 0
    a = _alloc.empty((1 << 20,), np.float32, 4 << 20)
    del a
    assert cynorm.alloc_cache_info()["blocks"] == 0


def test_at_most_slots_blocks(cache):
    cynorm.set_alloc_cache_limit(1 << 30)
    n = cynorm.alloc_cache_info()["slots"] + 3
    arrays = [_alloc.empty((1 << 18,), np.float32, 1 << 20) for _ in range(n)]
    del arrays
    assert cynorm.alloc_cache_info()["blocks"] == cynorm.alloc_cache_info()["slots"]


def test_other_numpy_allocations_are_untouched(cache):
    try:
        from numpy._core.multiarray import get_handler_name
    except ImportError:  # pragma: no cover - NumPy 1.x layout
        from numpy.core.multiarray import get_handler_name
    w = cynorm.weight_norm(np.ones((1024, 1024), np.float32), np.ones(1024, np.float32), 0)
    assert get_handler_name(w) == "cynorm_block_cache"
    assert get_handler_name(w + 1) != "cynorm_block_cache"
    a = np.empty(1 << 22, np.uint8)
    assert get_handler_name(a) != "cynorm_block_cache"
    del a
    assert cynorm.alloc_cache_info()["blocks"] == 0


def test_concurrent_allocation_and_free(cache):
    cynorm.set_alloc_cache_limit(64 << 20)

    def work(i):
        total = 0.0
        for k in range(50):
            a = _alloc.empty(((1 + (i + k) % 3) << 18,), np.float32, (1 + (i + k) % 3) << 20)
            a[:] = i
            total += float(a[::4096].sum())
            assert (a[::4096] == i).all()
            del a
        return total

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(work, range(16)))
    info = cynorm.alloc_cache_info()
    assert info["held"] <= 64 << 20


def test_env_switch_turns_the_cache_off():
    code = "import cynorm; print(cynorm.alloc_cache_info()['limit'])"
    here = os.path.dirname(__file__)
    run = lambda val: subprocess.run([sys.executable, "-c", code], env=dict(os.environ, CYNORM_ALLOC_CACHE=val),
                                     capture_output=True, text=True, cwd=here)
    assert run("off").stdout.strip() == "0"
    assert run("1048576").stdout.strip() == "1048576"
    bad = run("lots")
    assert bad.returncode != 0 and "CYNORM_ALLOC_CACHE must be a byte count" in bad.stderr


# ---- OutsideCache: calls whose outputs skip the cache (cynorm.torch's) -----

def _counts():
    info = cynorm.alloc_cache_info()
    return info["hits"], info["misses"]


def test_outside_cache_calls_take_numpys_allocator(cache):
    v, g = np.ones((1024, 1024), np.float32), np.ones(1024, np.float32)
    outside = _alloc.OutsideCache(cynorm.weight_norm)
    assert outside.__wrapped__ is cynorm.weight_norm
    before = _counts()
    for _ in range(3):
        w = outside(v, g, 0)
        np.testing.assert_allclose(w, 1 / 32, rtol=1e-6)
        del w
    assert _counts() == before and cynorm.alloc_cache_info()["blocks"] == 0
    # a call outside it uses the cache again (a miss, then a hit)
    cynorm.weight_norm(v, g, 0)         # (freed at once, into the cache)
    cynorm.weight_norm(v, g, 0)
    assert _counts() == (before[0] + 1, before[1] + 1)


def test_outside_cache_restores_the_cache_after_an_error(cache):
    v, g = np.ones((1024, 1024), np.float32), np.ones(1024, np.float32)
    outside = _alloc.OutsideCache(cynorm.weight_norm)
    with pytest.raises(ValueError):
        outside(v, g, 5)            # dim out of range
    before = _counts()
    cynorm.weight_norm(v, g, 0)
    assert _counts() == (before[0], before[1] + 1)


def test_outside_cache_is_per_thread(cache):
    # while one thread is inside an OutsideCache call, another thread's
    # outputs still go through the cache
    import threading
    entered, release = threading.Event(), threading.Event()

    def hold():
        entered.set()
        assert release.wait(30)
        return np.empty(1 << 20, np.float32)     # NumPy's own: not counted

    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(_alloc.OutsideCache(hold))
        assert entered.wait(30)
        before = _counts()
        a = _alloc.empty((1 << 20,), np.float32, 4 << 20)
        assert _counts() == (before[0], before[1] + 1)
        release.set()
        held.result()
    del a
