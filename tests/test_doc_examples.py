"""Every Python code block of README.md and of the docs (docs/*.md, *.rst)
runs, as written, on real data.

A block runs on its own, in a fresh namespace (each must define what it
uses).  A comment line right before a block says how to run it instead:

    <!-- example: mpiexec -n 2 -->     (Markdown)  .. example: mpiexec -n 2   (reST)
        run as a script under `mpiexec -n 2`, as a user would start it;
    <!-- example: gpu cupy -->  /  <!-- example: gpu torch -->
        needs a CUDA GPU with cuDNN (and CuPy / a CUDA build of PyTorch):
        skipped, with the reason, without one.
    <!-- example: torch -->  /  <!-- example: jax -->
        needs PyTorch / JAX (CPU): skipped, with the reason, without it.

Run from a copy of the tests outside the checkout (the wheel's CI job) there
is no README to read: the tests then skip and say so.
"""
import os
import pathlib
import re
import subprocess
import sys

import pytest

from mpi_helpers import find_mpiexec, launch_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
REQUIRE_MPI = os.environ.get("CYNORM_REQUIRE_MPI") == "1"   # CI: missing MPI is a failure

MD_BLOCK = re.compile(r"(?:<!-- example: (?P<how>[^>]*?) -->\n)?```python\n(?P<code>.*?)```",
                      re.S)
RST_BLOCK = re.compile(r"(?:\.\. example: (?P<how>[^\n]*)\n\n)?\.\. code-block:: python\n"
                       r"(?:[ \t]+:[^\n]*\n)*\n(?P<code>(?:(?:[ \t]+[^\n]*)?\n)+)")


def _marks(how):
    # the suite's markers, so that a run deselecting MPI or cuDNN tests
    # (-m "not mpi and not cudnn": .ci/sanitize) deselects these examples too
    if how.startswith("mpiexec"):
        return [pytest.mark.mpi]
    if how.startswith("gpu"):
        return [pytest.mark.gpu, pytest.mark.cudnn]
    return []


def _blocks():
    files = [ROOT / "README.md"]
    docs = ROOT / "docs"
    if docs.is_dir():
        files += sorted(p for p in docs.rglob("*") if p.suffix in (".md", ".rst")
                        and "_build" not in p.parts)
    found = []
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        pattern = MD_BLOCK if path.suffix == ".md" else RST_BLOCK
        for k, match in enumerate(pattern.finditer(text)):
            code = match.group("code")
            if path.suffix == ".rst":
                lines = code.splitlines()
                indent = min((len(ln) - len(ln.lstrip()) for ln in lines if ln.strip()), default=0)
                code = "\n".join(ln[indent:] for ln in lines) + "\n"
            line = text.count("\n", 0, match.start("code")) + 1
            how = (match.group("how") or "").strip()
            found.append(pytest.param(code, how, marks=_marks(how),
                                      id=f"{path.relative_to(ROOT)}:{line}"))
    return found


BLOCKS = _blocks()


def test_the_readme_has_examples():
    if not (ROOT / "README.md").is_file():
        pytest.skip("README.md is not next to the tests (run from a checkout to test its examples)")
    assert len(BLOCKS) >= 5


def _run_under_mpiexec(code, how, tmp_path):
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        if REQUIRE_MPI:
            pytest.fail("CYNORM_REQUIRE_MPI=1 but mpi4py is not installed")
        pytest.skip("mpi4py is not installed (pip install mpi4py mpich)")
    launcher = find_mpiexec()
    if launcher is None:
        if REQUIRE_MPI:
            pytest.fail("CYNORM_REQUIRE_MPI=1 but no mpiexec was found")
        pytest.skip("no mpiexec next to this Python or on PATH (pip install mpi4py mpich)")
    script = tmp_path / "example.py"
    script.write_text(code)
    args = how.split()[1:]                 # "mpiexec -n 2" -> ["-n", "2"]
    proc = subprocess.run([launcher, *args, sys.executable, str(script)], capture_output=True,
                          text=True, timeout=300, env=launch_env())
    assert proc.returncode == 0, f"the example failed under {how}:\n{proc.stdout}\n{proc.stderr}"


def _skip_without_gpu(how):
    import cudnn_bind
    reason = cudnn_bind.unavailable_reason()
    if reason:
        pytest.skip(f"needs a CUDA GPU with cuDNN: {reason}")
    if "cupy" in how:
        pytest.importorskip("cupy", reason="needs CuPy")
    if "torch" in how:
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA build of PyTorch")


@pytest.mark.parametrize("code, how", BLOCKS)
def test_example_runs(code, how, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)        # an example that writes files writes them here
    if how.startswith("mpiexec"):
        _run_under_mpiexec(code, how, tmp_path)
        return
    if how.startswith("gpu"):
        _skip_without_gpu(how)
    elif how in ("torch", "jax"):
        pytest.importorskip(how, reason=f"needs {'PyTorch' if how == 'torch' else 'JAX'}")
    elif how:
        raise AssertionError(f"unknown example marker {how!r}")
    exec(compile(code, "<example>", "exec"), {"__name__": "__example__"})
