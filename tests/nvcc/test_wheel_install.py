"""The package as a user installs it: build the wheel from a copy of the repository, install it into
a fresh virtual environment and compile the tiny example from an unrelated directory. The kernels/,
runtime_stub/ and templates/ folders must come from the wheel (package data), not the checkout."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

_NOT_SOURCES = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                      ".hypothesis", "*.kbp", "bench")


def _run(cmd: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    # without PYTHONPATH: the installed wheel is under test, not a checkout on the path
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_wheel_installs_and_compiles_from_elsewhere(tmp_path, tiny_path, build_cache):
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=_NOT_SOURCES)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(src)], tmp_path)
    wheel = next((tmp_path / "dist").glob("kbpc-*.whl"))
    shutil.rmtree(src)  # nothing of the checkout copy is left to fall back on
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)  # dependencies from this environment
    bin_dir = env_dir / "bin"
    _run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _run([str(bin_dir / "python"), "-c",
                  "import json, kbpc, kbpc.toolchain.assets as a; print(json.dumps([kbpc.__file__, "
                  "str(a.KERNELS_DIR), str(a.RUNTIME_STUB_DIR), str(a.TEMPLATES_DIR)]))"], work)
    for path in json.loads(where.stdout):
        assert Path(path).is_relative_to(env_dir), path
    _run([str(bin_dir / "kbpc"), "keygen", "-o", str(work / "keys")], work)
    _run([str(bin_dir / "kbpc"), "compile", str(tiny_path), "-o", "tiny.kbp", "-j", "1", "--key",
          str(work / "keys" / "signing-key.json"), "--cache-dir", str(build_cache)], work)
    _run([str(bin_dir / "kbpc"), "verify", "tiny.kbp", "--trust", str(work / "keys" / "signing-key.pub.json")],
         work)
