"""The wheel-building configuration: the GitHub workflow is valid (against
the workflow JSON schema that check-jsonschema vendors) and builds what the
project promises; cibuildwheel's settings in pyproject.toml agree with it."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKFLOW = os.path.join(ROOT, ".github", "workflows", "wheels.yml")

pytestmark = pytest.mark.skipif(not os.path.exists(WORKFLOW), reason="not a source checkout")


def _workflow():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    with open(WORKFLOW) as f:
        return yaml.safe_load(f)


def _cibuildwheel():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli", reason="tomli is not installed")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["cibuildwheel"]


def test_workflow_matches_the_github_schema():
    pytest.importorskip("check_jsonschema", reason="check-jsonschema is not installed")
    out = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                          "vendor.github-workflows", WORKFLOW], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_workflow_builds_every_platform_and_the_sdist():
    wf = _workflow()
    jobs = wf["jobs"]
    matrix = jobs["wheels"]["strategy"]["matrix"]["include"]
    targets = {(m["os"].split("-")[0], m["archs"]) for m in matrix}
    assert {("ubuntu", "x86_64"), ("ubuntu", "aarch64"), ("macos", "arm64"),
            ("macos", "x86_64"), ("windows", "AMD64")} <= targets
    steps = jobs["wheels"]["steps"]
    assert any(str(s.get("uses", "")).startswith("pypa/cibuildwheel@") for s in steps)
    assert any(str(s.get("uses", "")).startswith("actions/upload-artifact@") for s in steps)
    sdist = " ".join(s.get("run", "") for s in jobs["sdist"]["steps"])
    assert "build --sdist" in sdist and "pytest" in sdist


def test_cibuildwheel_builds_cpython_310_to_313_portably_and_tests_each_wheel():
    cfg = _cibuildwheel()
    assert cfg["build"].split() == ["cp310-*", "cp311-*", "cp312-*", "cp313-*"]
    assert "pytest" in cfg["test-command"] and "{project}/tests" in cfg["test-command"]
    assert cfg["test-extras"] == ["test"]
    # where PyPI has an MPI runtime, the wheel's MPI tests run too
    (mpi,) = [o for o in cfg["overrides"] if "mpi" in o.get("test-extras", [])]
    assert "manylinux" in mpi["select"] and "test" in mpi["test-extras"]
    # a wheel must run on any CPU of its architecture
    assert cfg["environment"]["CYNORM_MARCH"] == "none"
    assert "delocate-wheel" in cfg["macos"]["repair-wheel-command"]
    assert "delvewheel" in cfg["windows"]["repair-wheel-command"]
