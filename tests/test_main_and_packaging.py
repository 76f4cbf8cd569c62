"""The main job, cudnn_bind's availability report, and the README/CI contract."""
import os
import re
import subprocess
import sys

import pytest

import cudnn_bind
import cynorm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_main_job_quick_run_passes():
    out = subprocess.run([sys.executable, "-m", "cynorm", "--quick"], capture_output=True, text=True,
                         timeout=300, cwd=os.path.dirname(__file__))
    assert out.returncode == 0, out.stdout + out.stderr
    for needle in ("compiler", "openmp", "simd_compiled", "threads", "dtypes", "cudnn",
                   "weight_norm_interface", "weight_norm_backward", "norm_except_dim", "all checks passed"):
        assert needle in out.stdout
    rows = [l for l in out.stdout.splitlines() if l.strip().startswith(("norm_except_dim", "weight_norm"))]
    assert len(rows) == 12 and all(l.rstrip().endswith("ok") for l in rows)


def test_busy_note_says_when_times_are_not_to_be_trusted():
    from cynorm.__main__ import busy_note, others_share
    assert busy_note(None) is None and busy_note(0.1) is None
    note = busy_note(0.6)
    assert "60%" in note and "not to be trusted" in note and "idle machine" in note
    # others = all CPUs' busy seconds minus this process's: (14 - 10) - (2 - 1) = 3 of 2 * 2
    assert others_share((10.0, 1.0), (14.0, 2.0), 2.0, 2) == 0.75
    assert others_share((10.0, 1.0), (10.5, 1.6), 2.0, 2) == 0.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="busy loops via sh; /proc/stat")
def test_main_job_warns_when_other_processes_hold_the_cpus():
    """Every CPU busy with a loop of another process: the job still passes,
    and says that its times are not to be trusted."""
    cmd = ["timeout", "300", "sh", "-c", "while :; do :; done"]
    loops = [subprocess.Popen(cmd, start_new_session=True) for _ in range(os.cpu_count() or 1)]
    try:
        out = subprocess.run([sys.executable, "-m", "cynorm", "--quick", "--dtypes", "float32"],
                             capture_output=True, text=True, timeout=300,
                             cwd=os.path.dirname(__file__))
    finally:
        for p in loops:
            os.killpg(p.pid, 9)
            p.wait()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all checks passed" in out.stdout
    assert "not to be trusted" in out.stdout, out.stdout


def test_main_job_rejects_unknown_dtype():
    out = subprocess.run([sys.executable, "-m", "cynorm", "--dtypes", "int8"], capture_output=True,
                         text=True, cwd=os.path.dirname(__file__))
    assert out.returncode == 2 and "unknown dtype(s) int8" in out.stderr



@pytest.mark.parametrize("threads", ["0", "-2"])
def test_main_job_rejects_a_thread_count_below_one(threads):
    """A usage error naming the option, not a traceback."""
    out = subprocess.run([sys.executable, "-m", "cynorm", "--threads", threads],
                         capture_output=True, text=True, cwd=os.path.dirname(__file__))
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"--threads: n must be >= 1, got {threads}" in out.stderr
    assert "Traceback" not in out.stderr


def test_main_job_prints_its_version():
    out = subprocess.run([sys.executable, "-m", "cynorm", "--version"], capture_output=True,
                         text=True, cwd=os.path.dirname(__file__))
    assert out.returncode == 0 and out.stdout.strip() == f"cynorm {cynorm.__version__}"

def test_show_config_lists_the_build(capsys):
    cynorm.show_config()
    text = capsys.readouterr().out
    for key in ("version", "compiler", "openmp", "threads", "simd_compiled", "dtypes", "cudnn"):
        assert re.search(rf"^\s+{key}\s", text, re.M), key


def test_cudnn_bind_says_why_it_is_unavailable():
    reason = cudnn_bind.unavailable_reason()
    assert cudnn_bind.is_available() == (reason == "")
    if reason:  # these machines: no library, or no driver / GPU
        assert re.match(r"no (cuDNN library|NVIDIA driver|GPU)|the CUDA runtime failed", reason)
    assert isinstance(cudnn_bind.describe(), str)


def test_cudnn_library_path_from_env(monkeypatch):
    monkeypatch.setenv("CUDNN_BIND_LIBRARY", "/nonexistent/libcudnn.so.9")
    cudnn_bind.reset()
    try:
        # a named library that does not load is an error, not a silent fallback
        with pytest.raises(cudnn_bind.CudnnUnavailableError, match="/nonexistent/libcudnn.so.9"):
            cudnn_bind.version()
        assert cudnn_bind.unavailable_reason().startswith("no cuDNN library")
        assert cudnn_bind.is_available() is False
    finally:
        monkeypatch.delenv("CUDNN_BIND_LIBRARY")
        cudnn_bind.reset()


def test_a_failed_load_does_not_stick(monkeypatch):
    monkeypatch.delenv("CUDNN_BIND_LIBRARY", raising=False)
    cudnn_bind.reset()
    before = cudnn_bind.unavailable_reason()      # what the default search finds here
    try:
        with pytest.raises(cudnn_bind.CudnnUnavailableError,
                           match="/bad/path/libcudnn.so.9.*check the path given"):
            cudnn_bind.load("/bad/path/libcudnn.so.9")
        # later calls search again, as if load had not been called
        assert "/bad/path" not in cudnn_bind.unavailable_reason()
        assert cudnn_bind.unavailable_reason() == before
    finally:
        cudnn_bind.reset()


def test_the_unavailable_message_says_how_to_get_a_library(monkeypatch):
    from cudnn_bind import _lib
    monkeypatch.delenv("CUDNN_BIND_LIBRARY", raising=False)
    monkeypatch.setattr(_lib, "cudnn_candidates", lambda path=None: ["libcudnn_absent.so.9"])
    cudnn_bind.reset()
    try:
        reason = cudnn_bind.unavailable_reason()
        assert reason.startswith("no cuDNN library (libcudnn) could be loaded (libcudnn_absent.so.9")
        assert reason.count("pip install --no-deps nvidia-cudnn-cu12 nvidia-cuda-runtime-cu12") == 1
        assert "$CUDNN_BIND_LIBRARY" in reason
        # python -m cynorm's report: the configuration's cudnn line says it once
        assert cudnn_bind.describe() == f"cuDNN unavailable: {reason}"
    finally:
        cudnn_bind.reset()


def test_main_job_reports_cudnn_once_and_times_medians():
    out = subprocess.run([sys.executable, "-m", "cynorm", "--quick", "--dtypes", "float32"],
                         capture_output=True, text=True, timeout=300, cwd=os.path.dirname(__file__))
    assert out.returncode == 0, out.stdout + out.stderr
    reason = cudnn_bind.unavailable_reason()
    if reason:
        assert out.stdout.count(reason) == 1, out.stdout
    assert "cudnn_bind.is_available() = " in out.stdout
    assert "the median of 5 calls" in out.stdout


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, ".ci", "run")), reason="not a source checkout")
def test_ci_runs_the_readme_test_command():
    readme = open(os.path.join(ROOT, "README.md")).read()
    commands = re.findall(r"```bash\n(.+?)\n```", readme)
    # the two commands of "Set up", then the docs build of "API reference"
    assert len(commands) == 3, commands
    assert "python -m cynorm" in commands[0]
    assert "sphinx-build -W" in commands[2]
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert commands[1] in ci.splitlines()
    assert commands[2] in ci.splitlines()


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, ".ci", "run")), reason="not a source checkout")
def test_main_job_runs_from_the_checkout_root():
    """The README's first command runs `python -m cynorm` where the user
    cloned: the checkout's cynorm/ (unbuilt in a fresh clone) comes first."""
    out = subprocess.run([sys.executable, "-m", "cynorm", "--quick", "--dtypes", "float32"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all checks passed" in out.stdout


def test_every_package_directory_is_listed_in_pyproject():
    # a subpackage missing from [tool.setuptools] packages is left out of the
    # wheel and only fails once installed
    pyproject = os.path.join(ROOT, "pyproject.toml")
    if not os.path.exists(pyproject):
        pytest.skip("run against an installed wheel: no pyproject.toml next to the tests")
    listed = set(re.search(r'^packages = \[(.*)\]', open(pyproject).read(), re.M).group(1)
                 .replace('"', "").replace(" ", "").split(","))
    found = set()
    for top in ("cynorm", "cudnn_bind"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            if "__init__.py" in files and "__pycache__" not in dirpath:
                found.add(os.path.relpath(dirpath, ROOT).replace(os.sep, "."))
    assert found == listed
