"""The public API's type annotations: complete, shipped (py.typed), and
checked by mypy, both in the package itself and in users' code.

* every public function, and every public method of a public class, of
  cynorm, cynorm.aten, cynorm.nested, cynorm.distributed and cudnn_bind
  annotates each parameter and its return, and the annotations resolve;
* the installed packages carry py.typed (a type checker ignores the
  annotations of a package without it);
* mypy passes on the package (from a checkout: pyproject.toml's [tool.mypy]);
* mypy accepts typical user code (typing_cases/usage.py, which also runs)
  and rejects each misuse in typing_cases/misuse.py on the line that says so.
"""
import ast
import importlib
import importlib.resources
import inspect
import os
import pathlib
import re
import runpy
import subprocess
import sys
import sysconfig
import typing

import pytest

import cynorm

ROOT = pathlib.Path(__file__).resolve().parents[1]
CASES = pathlib.Path(__file__).resolve().parent / "typing_cases"
PUBLIC_MODULES = ["cynorm", "cynorm.aten", "cynorm.nested", "cynorm.distributed", "cudnn_bind"]
# dunder methods that are part of a public class's API when it defines them
PUBLIC_DUNDERS = {"__init__", "__len__", "__getitem__", "__iter__", "__enter__", "__exit__",
                  "__array__", "__cuda_array_interface__", "__dlpack__", "__dlpack_device__"}


def _public_callables():
    seen = set()
    for modname in PUBLIC_MODULES:
        module = importlib.import_module(modname)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.ismodule(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            if inspect.isclass(obj):
                if issubclass(obj, BaseException):
                    continue            # exceptions: constructed by the library
                for attr, member in vars(obj).items():
                    if attr.startswith("_") and attr not in PUBLIC_DUNDERS:
                        continue
                    if isinstance(member, property):
                        member = member.fget
                    elif isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    if inspect.isfunction(member):
                        yield f"{modname}.{name}.{attr}", member
            elif inspect.isfunction(obj):
                yield f"{modname}.{name}", obj
            elif callable(obj):
                raise AssertionError(f"{modname}.{name} is a {type(obj).__name__}, not a Python "
                                     "function: wrap it, so that it has annotations")


PUBLIC = list(_public_callables())


def test_the_public_api_is_enumerated():
    names = [n for n, _ in PUBLIC]
    assert "cynorm.weight_norm" in names and "cudnn_bind.batch_norm_forward_training" in names
    assert "cynorm.nested.NestedArray.to_padded" in names
    assert len(names) > 100


@pytest.mark.parametrize("name, func", PUBLIC, ids=[n for n, _ in PUBLIC])
def test_every_public_function_is_annotated(name, func):
    hints = typing.get_type_hints(func)       # raises if an annotation does not resolve
    params = list(inspect.signature(func).parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    missing = [p.name for p in params if p.name not in hints]
    assert not missing, f"{name}: parameters without a type: {missing}"
    assert "return" in hints, f"{name}: no return type"


def _stub_functions(path):
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.parametrize("module", ["_runtime", "_alloc"])
def test_the_compiled_modules_stubs_list_their_functions(module):
    compiled = importlib.import_module(f"cynorm._kernels.{module}")
    public = {n for n, f in vars(compiled).items() if callable(f) and not n.startswith("_")
              and getattr(f, "__module__", None) == compiled.__name__}
    stub = importlib.resources.files("cynorm._kernels") / f"{module}.pyi"
    assert stub.is_file(), f"{module}.pyi is not installed next to the module"
    assert _stub_functions(pathlib.Path(str(stub))) == public


@pytest.mark.parametrize("package", ["cynorm", "cudnn_bind"])
def test_py_typed_is_shipped(package):
    assert (importlib.resources.files(package) / "py.typed").is_file(), (
        f"{package} has no py.typed marker: type checkers would ignore its annotations")


def _mypy(args, cwd, env=None):
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed: pip install \".[test]\"")
    proc = subprocess.run([sys.executable, "-m", "mypy", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def test_mypy_passes_on_the_package(tmp_path):
    if not (ROOT / "pyproject.toml").is_file():
        pytest.skip("pyproject.toml is not next to the tests (run from a checkout to type-check "
                    "the package)")
    rc, out = _mypy(["--cache-dir", str(tmp_path / "cache")], cwd=ROOT)
    assert rc == 0, out


def _user_env():
    """mypy finds cynorm where these tests import it from: installed (it then
    needs py.typed) or, from a source checkout, through MYPYPATH."""
    parent = pathlib.Path(cynorm.__file__).resolve().parents[1]
    site = {pathlib.Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    env = dict(os.environ)
    env.pop("MYPYPATH", None)
    if parent not in site:
        env["MYPYPATH"] = str(parent)
    return env


@pytest.fixture(scope="module")
def user_cache(tmp_path_factory):
    """One mypy cache for the user files' checks (the same options): the
    second reads NumPy's and cynorm's analysis from the first's."""
    return tmp_path_factory.mktemp("mypy-user-cache")


def _check_user_file(name, tmp_path, cache):
    source = CASES / name
    target = tmp_path / name
    target.write_text(source.read_text())
    (tmp_path / "mypy.ini").write_text("[mypy]\n")
    # no config file: the checks a user gets by default; cynorm's own
    # modules are followed silently, as an installed package's are
    return _mypy(["--config-file", "mypy.ini", "--follow-imports=silent",
                  "--cache-dir", str(cache), name], cwd=tmp_path, env=_user_env())


def test_mypy_accepts_typical_use(tmp_path, user_cache):
    rc, out = _check_user_file("usage.py", tmp_path, user_cache)
    assert rc == 0, out


def test_the_typical_use_runs():
    runpy.run_path(str(CASES / "usage.py"), run_name="__typing_case__")


def test_mypy_rejects_each_misuse(tmp_path, user_cache):
    rc, out = _check_user_file("misuse.py", tmp_path, user_cache)
    lines = (CASES / "misuse.py").read_text().splitlines()
    expected = {i + 1 for i, line in enumerate(lines) if line.rstrip().endswith("# mypy: error")}
    reported = {int(m.group(1)) for m in re.finditer(r"^misuse\.py:(\d+): error", out, re.M)}
    assert rc != 0 and expected, out
    assert reported == expected, (f"misuses mypy missed: {sorted(expected - reported)}; "
                                  f"errors on lines not marked: {sorted(reported - expected)}\n{out}")
