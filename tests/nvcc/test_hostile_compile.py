"""Issue 11.1 and 11.5 with the real compiler. A blueprint string that closes the C string literal
and adds a load-time constructor calling system(): rendered into the step program it compiles to
an object with exactly the benign object's symbols (no constructor, no system import) and the
string sits in kbp_step_info byte for byte. A whole compile of a blueprint whose file name carries
such a payload (the one hostile string the front end lets through: names are refused) links a
library that imports no system() and defines nothing the benign names do not. A constant that
does not fit a kernel's int parameter is a compile error, not a truncated argument."""
from __future__ import annotations

import functools
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbpc.toolchain.nvcc import compile_cuda
from kbpc.bundle.keystore import generate_keys
from kbpc.cli import main
from kbpc.codegen.emit import build_step, render
from kbpc.errors import BuildError
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.targets import get_target
from kbpc.testing.hostile_inputs import step_with_text

from conftest import TINY_BLUEPRINT

pytestmark = pytest.mark.nvcc

PAYLOAD = ('"; }; __attribute__((constructor)) static void kbpc_pwned() { system("touch /tmp/kbpc-pwned"); } '
           'static const char* kbpc_tail[] = { "\n#include <stdlib.h>\n*/ \\')


@functools.cache
def tiny_step():
    return build_step(run_pipeline(load_blueprint(TINY_BLUEPRINT), Options()), "kbpc compile tiny.graph.json")


def symbols(path: Path, *flags: str) -> set[str]:
    out = subprocess.run(["nm", *flags, str(path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def compiled_step(tmp: Path, text) -> Path:
    source = tmp / "step.cu"
    source.write_text(render(step_with_text(tiny_step(), text)).files["src/step.cu"])
    obj = tmp / "step.o"
    compile_cuda(source, obj, get_target("sm_90"), kind="obj")
    return obj


def test_hostile_strings_compile_to_the_benign_symbols(tmp_path):
    (tmp_path / "benign").mkdir()
    (tmp_path / "hostile").mkdir()
    benign = compiled_step(tmp_path / "benign", lambda field: "x")
    hostile = compiled_step(tmp_path / "hostile", lambda field: PAYLOAD)
    assert symbols(hostile) == symbols(benign)
    assert not any("pwned" in s or s == "system" for s in symbols(hostile))
    data = hostile.read_bytes()
    assert PAYLOAD.encode() + b"\0" in data   # the blueprint id, as data in kbp_step_info
    sections = subprocess.run(["readelf", "-S", str(hostile)], capture_output=True, text=True).stdout
    assert sections.count(".init_array") == subprocess.run(
        ["readelf", "-S", str(benign)], capture_output=True, text=True).stdout.count(".init_array")


@pytest.mark.slow
def test_blueprint_file_name_payload_builds_a_clean_library(tmp_path):
    name = 'x"; system("id"); \n#define X ??= $(id) *\\'   # a legal file name (no "/"), not a legal name
    hostile = tmp_path / name
    shutil.copyfile(TINY_BLUEPRINT, hostile)
    keys = generate_keys(tmp_path / "keys")
    out = tmp_path / "out.kbp"
    result = CliRunner().invoke(main, ["compile", str(hostile), "-o", str(out), "--key", str(keys.private),
                                       "--cache-dir", str(tmp_path / "cache"), "-j", "2"])
    assert result.exit_code == 0, result.output
    with zipfile.ZipFile(out) as zf:
        lib = tmp_path / "libkbp.so"
        lib.write_bytes(zf.read("lib/rank0/libkbp.so"))
        step = zf.read("src/step.cu").decode()
    assert "system" not in symbols(lib, "-D", "--undefined-only")
    defined = symbols(lib, "-D", "--defined-only")
    assert all(s.startswith(("kbp_", "_Z", "__")) or s in ("_init", "_fini") for s in defined), sorted(defined)
    header = step.splitlines()[:2]
    assert all(line.startswith("//") for line in header) and "%0A" in header[1]   # newline escaped


def test_constant_truncated_into_an_int_is_a_compile_error(tmp_path):
    source = tmp_path / "t.cu"
    source.write_text("#include <cuda_runtime.h>\n__global__ void k(int n) {}\n"
                      "void launch(int n) { k<<<1, 1>>>(n); }\nvoid step() { launch(1099511627776); }\n")
    with pytest.raises(BuildError, match="truncation"):
        compile_cuda(source, tmp_path / "t.o", get_target("sm_90"), kind="obj")
