"""The packages' modules import each other without cycles (a cycle makes the
import order matter and hides half-initialised modules), and no module
reaches into another module's private kernel handle."""
import ast
import importlib.util
import os

import pytest

PACKAGES = ("cynorm", "cudnn_bind")


def _modules():
    """{dotted module name: source path} of every .py module of PACKAGES, in
    the copy that imports (the source tree, or an installed wheel when the
    tests run from elsewhere)."""
    mods = {}
    for pkg in PACKAGES:
        (pkg_dir,) = importlib.util.find_spec(pkg).submodule_search_locations
        parent = os.path.dirname(pkg_dir)
        for root, _, files in os.walk(pkg_dir):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(root, f)
                    name = os.path.relpath(path, parent)[:-3].replace(os.sep, ".")
                    mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(path, mods):
    """The modules of `mods` that the module at `path` imports, anywhere in it
    (a function-level import closes a cycle as surely as a top-level one).
    `from pkg import sub` imports the submodule sub, not a cycle through
    pkg's __init__."""
    deps = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            deps.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
            deps.update(subs)
            if len(subs) < len(node.names):
                deps.add(node.module)
    return {d for d in deps if d in mods}


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    mods = _modules()
    assert "cynorm.batchnorm" in mods and "cudnn_bind._lib" in mods
    graph = {name: _imports(path, mods) - {name} for name, path in mods.items()}
    assert _cycles(graph) == []


@pytest.mark.parametrize("handle", ["_k", "_kernel"])
def test_no_module_uses_another_modules_kernel_handle(handle):
    """`_k` (a kernel module) and `_kernel` (its entry lookup) are private to
    the module that loads them: no `other._k` / `other._kernel` anywhere."""
    offenders = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.Attribute) and node.attr == handle:
                offenders.append(f"{name}: line {node.lineno}")
            elif isinstance(node, ast.ImportFrom) and any(a.name == handle for a in node.names):
                offenders.append(f"{name}: line {node.lineno}")
    assert offenders == []
