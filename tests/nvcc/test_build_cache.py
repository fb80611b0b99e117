"""The object cache heals: a damaged or empty cached object is evicted and rebuilt (the bundle is
the same as from a clean cache), and the library link refuses undefined symbols instead of
signing a library that fails when it is loaded."""
from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbpc.bundle.keystore import generate_keys
from kbpc.cli import main
from kbpc.errors import BuildError
from kbpc.targets import get_target
from kbpc.toolchain.library import _link
from kbpc.toolchain.nvcc import compile_cuda

pytestmark = pytest.mark.nvcc


def _compile(tiny: Path, out: Path, key: Path, cache: Path) -> str:
    result = CliRunner().invoke(main, ["compile", str(tiny), "-o", str(out), "--key", str(key), "--cache-dir",
                                       str(cache), "-j", "1"])
    assert result.exit_code == 0, result.output
    return result.output


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist() if n != "signature.json"}


def test_damaged_objects_are_rebuilt(tmp_path, tiny_path, build_cache):
    key = generate_keys(tmp_path / "keys").private
    _compile(tiny_path, tmp_path / "first.kbp", key, build_cache)
    cache = shutil.copytree(build_cache, tmp_path / "cache")
    entries = sorted((cache / "obj").glob("*.kbo"))
    entries[0].write_bytes(b"")                       # a crash after creating the file
    raw = bytearray(entries[1].read_bytes())
    raw[len(raw) // 2] ^= 0x40                        # a flipped bit
    entries[1].write_bytes(bytes(raw))
    out = _compile(tiny_path, tmp_path / "again.kbp", key, cache)
    assert "(2 compiled, " in out, out
    assert _members(tmp_path / "again.kbp") == _members(tmp_path / "first.kbp")


def test_link_refuses_undefined_symbols(tmp_path):
    src = tmp_path / "uses_missing.cu"
    src.write_text('extern "C" int kbp_not_defined_anywhere(void);\n'
                   'extern "C" int kbp_entry(void) { return kbp_not_defined_anywhere(); }\n')
    obj = tmp_path / "uses_missing.o"
    compile_cuda(src, obj, get_target("sm_90"), kind="obj")
    with pytest.raises(BuildError, match="kbp_not_defined_anywhere"):
        _link((obj,), tmp_path / "lib.so", get_target("sm_90"))
    assert not (tmp_path / "lib.so").exists()
