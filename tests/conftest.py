import os

# An OpenMP thread that finished its region sleeps instead of spinning on a
# core that another process needs: CI builds beside the suite, and the
# suite may run in several processes (pytest -n 2), where spinning threads
# take the other process's core.  No result depends on it.  Set before
# cynorm (or torch) loads libgomp, which reads it once; xdist's workers
# inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import cynorm  # noqa: E402

DTYPES = [np.dtype(np.float64), np.dtype(np.float32),
          np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)]
DTYPE_IDS = [str(d) for d in DTYPES]


MARKERS = [
    "slow: long sweeps (run in CI; deselect with -m 'not slow')",
    "torch: parity tests against PyTorch (skipped when torch is not installed)",
    "cudnn: cudnn_bind tests (real libcudnn from the nvidia wheels, or the host stand-in; "
    "skipped without them unless CUDNN_BIND_REQUIRE_LIBRARY=1)",
    "gpu: need a CUDA GPU (skipped here, with the reason)",
    "mpi: cynorm.distributed (multi-process runs need mpi4py and mpiexec: the mpi extra)",
]


def pytest_configure(config):
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)


def pytest_report_header(config):
    cfg = cynorm.config()
    return [f"cynorm {cfg['version']}: {cfg['simd_compiled']}, openmp {cfg['openmp']}, "
            f"threads {cfg['threads']}, team policy {cynorm.get_team_policy()}"]


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)


@pytest.fixture
def restore_threads():
    n = cynorm.get_num_threads()
    yield
    cynorm.set_num_threads(n)


@pytest.fixture
def team_always():
    """Every kernel call wakes the thread team, whatever its size (the
    families' thresholds below which one thread runs are set aside), so
    small inputs exercise the parallel loops too; the team is never capped
    (the fixed team policy), even when other work holds the cores."""
    from cynorm._kernels import _runtime
    _runtime.set_parallel_min_bytes(0)
    policy = cynorm.set_team_policy("fixed")
    yield
    _runtime.set_parallel_min_bytes(None)
    cynorm.set_team_policy(policy)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request, team_always):
    """1 and 2 OpenMP threads, the team woken for every call."""
    old = cynorm.get_num_threads()
    cynorm.set_num_threads(request.param)
    yield request.param
    cynorm.set_num_threads(old)


def has_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


requires_torch = pytest.mark.skipif(not has_torch(), reason="torch is not installed "
                                    "(pip install torch==2.13.0 for the parity tests)")

IN_CI = bool(os.environ.get("CI"))
