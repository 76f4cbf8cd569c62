"""Thread control: set/get, OMP_NUM_THREADS, threadpoolctl; the GIL is released."""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import cynorm
from helpers import needs_openmp


def test_a_serial_build_warns_and_stays_at_one_thread(restore_threads, monkeypatch):
    """set_num_threads(n > 1) on a build without OpenMP: a RuntimeWarning, and
    the count stays 1 (the OpenMP runtime's stand-in answers 1)."""
    from cynorm import _threads
    monkeypatch.setattr(_threads, "_OPENMP", False)
    with pytest.warns(RuntimeWarning, match=r"set_num_threads\(3\) has no effect: this cynorm "
                      "was built without OpenMP"):
        cynorm.set_num_threads(3)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cynorm.set_num_threads(1)  # one thread: nothing to warn about


@needs_openmp
def test_set_and_get(restore_threads):
    cynorm.set_num_threads(1)
    assert cynorm.get_num_threads() == 1
    cynorm.set_num_threads(3)
    assert cynorm.get_num_threads() == 3


@needs_openmp
def test_omp_num_threads_is_followed():
    code = "import cynorm; print(cynorm.get_num_threads())"
    env = dict(os.environ, OMP_NUM_THREADS="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, cwd=os.path.dirname(__file__))
    assert out.stdout.strip() == "3"


@needs_openmp
def test_threadpoolctl_limits_take_effect(restore_threads):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    cynorm.set_num_threads(2)
    info = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "openmp"]
    assert info, "the OpenMP runtime cynorm links is not visible to threadpoolctl"
    with threadpoolctl.threadpool_limits(limits=1, user_api="openmp"):
        assert cynorm.get_num_threads() == 1
    assert cynorm.get_num_threads() == 2


@needs_openmp
def test_threadpoolctl_limit_changes_the_work_split(restore_threads):
    """threadpoolctl's limit reaches the kernels (they ask OpenMP for the
    thread count at every call), and the answer does not change.  No timing
    is asserted: a CPU-over-wall check failed on a loaded machine."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if os.cpu_count() < 2:
        pytest.skip("needs 2 CPUs")
    v = np.random.default_rng(0).standard_normal((2048, 4096)).astype(np.float32)
    g = np.ones(2048, np.float32)
    cynorm.set_num_threads(2)
    with threadpoolctl.threadpool_limits(limits=1, user_api="openmp"):
        assert cynorm.get_num_threads() == 1
        one = cynorm.weight_norm(v, g, 0)
    assert cynorm.get_num_threads() == 2
    two = cynorm.weight_norm(v, g, 0)
    np.testing.assert_array_equal(one, two)


def test_kernels_release_the_gil():
    """A Python thread keeps running while a long kernel call is in flight."""
    v = np.random.default_rng(1).standard_normal((4096, 4096)).astype(np.float32)
    g = np.ones(4096, np.float32)
    out = np.empty_like(v)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.0005)

    t = threading.Thread(target=ticker)
    cynorm.weight_norm(v, g, 1, out=out)     # warm up
    t.start()
    time.sleep(0.01)
    start = time.perf_counter()
    for _ in range(5):
        cynorm.weight_norm(v, g, 1, out=out)
    end = time.perf_counter()
    stop.set()
    t.join()
    during = [x for x in ticks if start <= x <= end]
    # with the GIL held, the ticker could not run at all during the calls
    assert len(during) >= 3, (len(during), end - start)
