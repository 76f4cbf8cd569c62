"""The kernel sources stay readable: templates substitute variants and never
generate code, and no source file grows past what a reader takes in.

The sources are the files of cynorm/_kernels a person edits: the Tempita
templates (*.tp) and the hand-written .pyx, .pxd, .pxi and .h files; a file
rendered from a template (<name> beside <name>.tp) is not one."""
import importlib.util
import os
import re

import pytest

KERNELS = importlib.util.find_spec("cynorm._kernels").submodule_search_locations[0]
SOURCE_EXTS = (".tp", ".pyx", ".pxd", ".pxi", ".h")
MAX_LINES = 800


def _rendered(name, names):
    """Whether the file `name` was rendered from a template: its <name>.tp is
    beside it, or (a build output left by an older checkout, whose template
    is gone) its first lines say so."""
    if name.endswith(".tp"):
        return False
    if name + ".tp" in names:
        return True
    with open(os.path.join(KERNELS, name), encoding="utf-8") as f:
        head = "".join(f.readline() for _ in range(5))
    return re.search(r"(Generated|rendered) from \S+\.tp", head) is not None


def _sources():
    names = sorted(os.listdir(KERNELS))
    return [n for n in names if n.endswith(SOURCE_EXTS) and not _rendered(n, names)]


def _py_blocks(text):
    """The bodies of the {{py: ...}} blocks of a Tempita template."""
    return re.findall(r"\{\{py:(.*?)\}\}", text, flags=re.S)


def test_sources_found():
    names = _sources()
    assert "cn_elementwise.h.tp" in names and "cn_store_paths.h.tp" in names
    assert "common.pxd" in names                # hand-written
    assert "stats_loops.pxi" not in names      # rendered, not a source


@pytest.mark.parametrize("name", [n for n in _sources() if n.endswith(".tp")])
def test_templates_do_not_generate_code(name):
    # A {{py:}} block may hold comments and single assignments naming a
    # variant's parameters (isz = ITEMSIZE[sfx]); a function, a loop, an
    # import or string formatting there would be C or Cython built from
    # Python strings, which no reader or debugger can follow.
    with open(os.path.join(KERNELS, name), encoding="utf-8") as f:
        text = f.read()
    for block in _py_blocks(text):
        code = [line.strip() for line in block.splitlines()
                if line.strip() and not line.strip().startswith("#")]
        for line in code:
            assert not re.match(r"(def|class|for|while|import|from|lambda)\b", line), (
                f"{name}: {{{{py:}}}} block holds code: {line!r}")
            assert not re.search(r"%\s*\(|\.format\(|\bre\.|\bjoin\(", line), (
                f"{name}: {{{{py:}}}} block builds text: {line!r}")
            assert "=" in line, f"{name}: {{{{py:}}}} block holds more than assignments: {line!r}"


@pytest.mark.parametrize("name", _sources())
def test_source_files_stay_small(name):
    with open(os.path.join(KERNELS, name), encoding="utf-8") as f:
        lines = sum(1 for _ in f)
    assert lines <= MAX_LINES, f"{name}: {lines} lines (split it by job: CONTRIBUTING.md)"


# the Tempita names a kernel function's name may carry: the storage suffix
# (and the float type or row count of a variant); any other part of the name
# is literal text, so that grep finds the definition by its name
NAME_VARIANTS = {"sfx", "T", "R"}


@pytest.mark.parametrize("name", [n for n in _sources() if n.endswith(".tp")])
def test_function_names_are_greppable(name):
    with open(os.path.join(KERNELS, name), encoding="utf-8") as f:
        lines = f.read().splitlines()
    # on a definition's first line, every word (Tempita names included)
    # followed by "(": the function's name (and a keyword before a tuple
    # return type, which carries no Tempita name)
    definition = re.compile(r"^(?:cdef|cpdef|def|static|CN_PASS|CN_DRIVER)\b")
    word = re.compile(r"((?:\w|\{\{[^}]*\}\})+)\s*\(")
    for number, line in enumerate(lines, 1):
        if not definition.match(line):
            continue
        for found in word.findall(line):
            tokens = set(re.findall(r"\{\{\s*([^}]*?)\s*\}\}", found))
            assert tokens <= NAME_VARIANTS, (
                f"{name}:{number}: the name {found} is built from"
                f" {sorted(tokens - NAME_VARIANTS)}: write it out, so that grep finds it")
