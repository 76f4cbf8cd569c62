"""cynorm's declaration of XLA's FFI binary interface (cn_xla_ffi.h) against
the header of the installed jaxlib: every struct size, field offset and
constant the handlers rely on, checked by a C compiler."""
import os
import shutil
import subprocess
import sys

import pytest

jax = pytest.importorskip("jax")

KERNELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "cynorm", "_kernels")

# (cynorm's struct, XLA's struct, [(cynorm's field, XLA's field)])
STRUCTS = [
    ("cn_ffi_ext", "XLA_FFI_Extension_Base",
     [("struct_size", "struct_size"), ("type", "type"), ("next", "next")]),
    ("cn_ffi_version", "XLA_FFI_Api_Version",
     [("struct_size", "struct_size"), ("extension_start", "extension_start"),
      ("major_version", "major_version"), ("minor_version", "minor_version")]),
    ("cn_ffi_error_args", "XLA_FFI_Error_Create_Args",
     [("struct_size", "struct_size"), ("extension_start", "extension_start"),
      ("message", "message"), ("errc", "errc")]),
    ("cn_ffi_api", "XLA_FFI_Api",
     [("struct_size", "struct_size"), ("extension_start", "extension_start"),
      ("api_version", "api_version"), ("internal_api", "internal_api"),
      ("error_create", "XLA_FFI_Error_Create")]),
    ("cn_ffi_buffer", "XLA_FFI_Buffer",
     [("struct_size", "struct_size"), ("extension_start", "extension_start"),
      ("dtype", "dtype"), ("data", "data"), ("rank", "rank"), ("dims", "dims")]),
    ("cn_ffi_list", "XLA_FFI_Args",
     [("struct_size", "struct_size"), ("extension_start", "extension_start"),
      ("size", "size"), ("types", "types"), ("items", "args")]),
    ("cn_ffi_list", "XLA_FFI_Rets",
     [("struct_size", "struct_size"), ("extension_start", "extension_start"),
      ("size", "size"), ("types", "types"), ("items", "rets")]),
    ("cn_ffi_bytes", "XLA_FFI_ByteSpan", [("ptr", "ptr"), ("len", "len")]),
    ("cn_ffi_scalar", "XLA_FFI_Scalar", [("dtype", "dtype"), ("value", "value")]),
    ("cn_ffi_attrs", "XLA_FFI_Attrs",
     [("struct_size", "struct_size"), ("extension_start", "extension_start"),
      ("size", "size"), ("types", "types"), ("names", "names"), ("attrs", "attrs")]),
    ("cn_ffi_frame", "XLA_FFI_CallFrame",
     [("struct_size", "struct_size"), ("extension_start", "extension_start"), ("api", "api"),
      ("ctx", "ctx"), ("stage", "stage"), ("args", "args"), ("rets", "rets"),
      ("attrs", "attrs")]),
    ("cn_ffi_metadata", "XLA_FFI_Metadata",
     [("struct_size", "struct_size"), ("api_version", "api_version"), ("traits", "traits"),
      ("state_type_id", "state_type_id")]),
    ("cn_ffi_metadata_ext", "XLA_FFI_Metadata_Extension",
     [("extension_base", "extension_base"), ("metadata", "metadata")]),
]

# structs cynorm reads whole (not only a head): sizes equal, not just a prefix
WHOLE = {"cn_ffi_ext", "cn_ffi_version", "cn_ffi_buffer", "cn_ffi_list", "cn_ffi_bytes",
         "cn_ffi_scalar", "cn_ffi_attrs", "cn_ffi_metadata_ext"}

CONSTANTS = [
    ("CN_FFI_EXTENSION_METADATA", "XLA_FFI_Extension_Metadata"),
    ("CN_FFI_STAGE_EXECUTE", "XLA_FFI_ExecutionStage_EXECUTE"),
    ("CN_FFI_BUFFER", "XLA_FFI_ArgType_BUFFER"),
    ("CN_FFI_BUFFER", "XLA_FFI_RetType_BUFFER"),
    ("CN_FFI_ATTR_SCALAR", "XLA_FFI_AttrType_SCALAR"),
    ("CN_FFI_INVALID_ARGUMENT", "XLA_FFI_Error_Code_INVALID_ARGUMENT"),
    ("CN_FFI_RESOURCE_EXHAUSTED", "XLA_FFI_Error_Code_RESOURCE_EXHAUSTED"),
    ("CN_FFI_F16", "XLA_FFI_DataType_F16"),
    ("CN_FFI_F32", "XLA_FFI_DataType_F32"),
    ("CN_FFI_F64", "XLA_FFI_DataType_F64"),
    ("CN_FFI_BF16", "XLA_FFI_DataType_BF16"),
    ("CN_FFI_PRED", "XLA_FFI_DataType_PRED"),
    ("CN_FFI_S32", "XLA_FFI_DataType_S32"),
    ("CN_FFI_S64", "XLA_FFI_DataType_S64"),
]


def program():
    lines = ["#include <stddef.h>", '#include "xla/ffi/api/c_api.h"', '#include "cn_xla_ffi.h"']
    for ours, theirs, fields in STRUCTS:
        size = "==" if ours in WHOLE else "<="
        lines.append(f"_Static_assert(sizeof({ours}) {size} sizeof({theirs}), "
                     f'"size of {ours} vs {theirs}");')
        for a, b in fields:
            lines.append(f"_Static_assert(offsetof({ours}, {a}) == offsetof({theirs}, {b}), "
                         f'"{ours}.{a} vs {theirs}.{b}");')
            lines.append(f"_Static_assert(sizeof((({ours}*)0)->{a}) == sizeof((({theirs}*)0)->{b}), "
                         f'"size of {ours}.{a} vs {theirs}.{b}");')
    for a, b in CONSTANTS:
        lines.append(f'_Static_assert({a} == {b}, "{a} vs {b}");')
    lines.append("int main(void) { return XLA_FFI_API_MAJOR; }")
    return "\n".join(lines) + "\n"


def test_declarations_match_jaxlibs_header(tmp_path):
    include = jax.ffi.include_dir() if hasattr(jax, "ffi") else None
    if include is None or not os.path.exists(os.path.join(include, "xla/ffi/api/c_api.h")):
        pytest.skip("this jaxlib ships no XLA FFI header")
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "abi.c"
    src.write_text(program())
    proc = subprocess.run([*cc.split(), "-std=c11", f"-I{include}", f"-I{KERNELS}", "-c", str(src),
                           "-o", str(tmp_path / "abi.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_check_fails_on_a_wrong_declaration(tmp_path):
    """The program above is able to fail: a field at another offset is caught."""
    include = jax.ffi.include_dir() if hasattr(jax, "ffi") else None
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if include is None or cc is None or sys.platform == "win32":
        pytest.skip("no XLA FFI header or no C compiler")
    src = tmp_path / "abi.c"
    src.write_text(program().replace("offsetof(cn_ffi_buffer, data) ==",
                                     "offsetof(cn_ffi_buffer, rank) =="))
    proc = subprocess.run([*cc.split(), "-std=c11", f"-I{include}", f"-I{KERNELS}", "-c", str(src),
                           "-o", str(tmp_path / "abi.o")], capture_output=True, text=True)
    assert proc.returncode != 0 and "cn_ffi_buffer.data" in proc.stderr
