"""cynorm.torch's compiled operators (cynorm/_torch_ops.cpp): layer norm and
RMS norm, their residual-fused forms, batch, group and instance norm, with
their autograd formulas in C++, built against the installed torch the first
time an eager call needs them, kept in a cache directory, loaded into
PyTorch and bound to cynorm's kernels.

Where they cannot be built (no C++ compiler, PyTorch's headers missing) or
are turned off (``CYNORM_TORCH_NATIVE=0``), cynorm.torch runs the same
kernels through its Python autograd Functions: the same results, a higher
cost per call.  ``cynorm.torch.native_status()`` says which (docs/torch.rst,
"Cost per call").

Environment:

* ``CYNORM_TORCH_NATIVE`` -- ``0`` turns the compiled operators off.
* ``CYNORM_CACHE_DIR`` -- where the built library is kept (default
  ``$XDG_CACHE_HOME/cynorm``, else ``~/.cache/cynorm``; where that cannot
  be written, a folder in the temporary directory); one file per torch
  version and source.
* ``CXX`` -- the C++ compiler (default ``c++``).
"""
from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Optional

_HERE = Path(__file__).resolve().parent
SOURCE = _HERE / "_torch_ops.cpp"
HEADER = _HERE / "_kernels" / "cn_native_abi.h"

_ops: Optional[Any] = None
_status = "not loaded yet: the first eager call that needs gradients builds or loads them"
_tried = False


def cache_dir() -> Path:
    d = os.environ.get("CYNORM_CACHE_DIR")
    if d:
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cynorm"


def _command(torch: Any, out: Path) -> list[str]:
    from torch.utils import cpp_extension
    cxx = shlex.split(os.environ.get("CXX") or "c++")
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    cmd = cxx + [str(SOURCE), "-o", str(out), "-shared", "-fPIC", "-O2", "-std=c++20",
                 "-fvisibility=hidden", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-I", str(HEADER.parent)]
    for d in cpp_extension.include_paths():
        cmd += ["-isystem", d]
    for d in cpp_extension.library_paths():
        cmd += ["-L", d, f"-Wl,-rpath,{d}"]
    if sys.platform == "darwin":
        cmd += ["-undefined", "dynamic_lookup"]
    return cmd + ["-lc10", "-ltorch_cpu", "-ltorch"]


def _scratch_file(folders: list[Path]) -> tuple[Path, str]:
    """A new empty file in the first of folders that can be written, and
    that folder: the library is built there, beside its final name, and
    renamed into it (processes building at once each finish their own
    file, and none loads a partial one)."""
    for folder in folders[:-1]:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
            os.close(fd)
            return folder, tmp
        except OSError:
            pass
    folders[-1].mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folders[-1])
    os.close(fd)
    return folders[-1], tmp


def _library(torch: Any) -> Path:
    """The built library for this torch and source, built now if absent."""
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), HEADER.read_bytes(), torch.__version__.encode(),
                 str(getattr(torch.version, "git_version", "")).encode(),
                 os.environ.get("CXX", "").encode()):
        key.update(part)
        key.update(b"\0")
    name = f"cynorm_torch_ops-{key.hexdigest()[:20]}.so"
    # the cache directory, or where it cannot be written the temporary one
    user = f"cynorm-{os.getuid()}" if hasattr(os, "getuid") else "cynorm"
    folders = [cache_dir(), Path(tempfile.gettempdir()) / user]
    for folder in folders:
        if (folder / name).exists():
            return folder / name
    folder, tmp = _scratch_file(folders)
    path = folder / name
    try:
        run = subprocess.run(_command(torch, Path(tmp)), capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"the C++ compiler failed (exit {run.returncode}): "
                               + (run.stderr.strip().splitlines() or ["no message"])[-1])
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load(torch: Any, tables: tuple[int, int]) -> Optional[Any]:
    """torch.ops.cynorm_native, built or loaded and bound to the kernels'
    tables (layer_norm.native_abi(), batch_norm.native_abi()), or None
    (status() says why).  Tried once a process."""
    global _ops, _status, _tried
    if _tried:
        return _ops
    _tried = True
    if os.environ.get("CYNORM_TORCH_NATIVE", "1").strip() == "0":
        _status = "off (CYNORM_TORCH_NATIVE=0): eager calls run cynorm's Python Functions"
        return None
    if sys.platform == "win32":
        _status = ("unavailable on Windows (built with GCC or Clang only): eager calls run "
                   "cynorm's Python Functions")
        return None
    try:
        path = _library(torch)
        torch.ops.load_library(str(path))
        torch.ops.cynorm_native.bind(*tables)
    except Exception as e:      # noqa: BLE001 -- any failure leaves the Python path
        _status = (f"unavailable ({e}): eager calls run cynorm's Python Functions; "
                   "CYNORM_TORCH_NATIVE=0 skips the attempt")
        warnings.warn(f"cynorm.torch: its compiled operators are {_status}", RuntimeWarning,
                      stacklevel=3)
        return None
    _ops = torch.ops.cynorm_native
    _status = f"loaded from {path}"
    return _ops


def status() -> str:
    return _status
