"""CUDNN_BIND_REQUIRE_GPU=1 (set by .ci/gpu_run) turns the GPU tests' "no
GPU" skip into a failure, so a GPU run cannot pass having checked nothing.
These run where there is no GPU (CI), which is where the switch matters."""
import os
import subprocess
import sys

import pytest

from test_cudnn_gpu import REASON, REQUIRE_GPU_VARIABLE, gpu_or_skip

pytestmark = pytest.mark.cudnn

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def test_the_switch_turns_no_gpu_into_a_failure():
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_GPU_VARIABLE}=1"):
        gpu_or_skip("no GPU: cudaGetDeviceCount found 0 devices", require=True)
    with pytest.raises(pytest.skip.Exception, match="no usable GPU: no GPU"):
        gpu_or_skip("no GPU: cudaGetDeviceCount found 0 devices", require=False)
    gpu_or_skip("", require=True)  # a usable GPU: nothing to say either way


def _run_one_gpu_test(require):
    """pytest, in a child, on one test of tests/test_cudnn_gpu.py; (rc, output)."""
    env = dict(os.environ)
    env.pop(REQUIRE_GPU_VARIABLE, None)
    if require:
        env[REQUIRE_GPU_VARIABLE] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         os.path.join(TESTS, "test_cudnn_gpu.py"), "-k", "impossible_allocation"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_gpu_tests_skip_without_the_switch_and_fail_with_it():
    if not REASON:
        pytest.skip("a GPU is usable here: the GPU tests run, so there is no skip to turn "
                    "into a failure (.ci/gpu_run runs them)")
    rc, out = _run_one_gpu_test(require=False)
    assert rc == 0 and "1 skipped" in out and "no usable GPU" in out, out
    rc, out = _run_one_gpu_test(require=True)
    assert rc != 0, out
    assert "1 error" in out and f"{REQUIRE_GPU_VARIABLE}=1: this run must have one" in out, out
    assert "skipped" not in out, out
