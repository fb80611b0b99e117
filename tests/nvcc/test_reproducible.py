"""Same inputs and toolchain give the same bundle on any machine: the tiny example compiled by two
copies of kbpc in two directories, each with its own object cache and working directory, gives
byte-identical members (signature.json aside: ML-DSA-65 signatures are randomized), and the built
library holds no path of either copy, either cache or the CUDA installation."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kbpc.bundle.keystore import generate_keys

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _compile(checkout: Path, cache: Path, workdir: Path, blueprint: Path, key: Path) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    proc = subprocess.run([sys.executable, "-m", "kbpc.cli", "compile", str(blueprint), "-o", "tiny.kbp", "-j", "1",
                           "--key", str(key), "--cache-dir", str(cache)],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    return workdir / "tiny.kbp"


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist() if n != "signature.json"}


def test_two_checkouts_two_caches_same_bundle(tmp_path, tiny_path, build_cache, copy_repo):
    key = generate_keys(tmp_path / "keys").private
    clone = copy_repo(tmp_path / "elsewhere" / "kbpc-clone")
    first = _compile(REPO, build_cache, tmp_path / "a", tiny_path, key)
    second = _compile(clone, tmp_path / "cache-b", tmp_path / "b", clone / "examples" / "tiny.graph.json", key)
    a, b = _members(first), _members(second)
    assert sorted(a) == sorted(b)
    differ = [name for name in a if a[name] != b[name]]
    assert not differ, f"members differ between the two checkouts: {differ}"
    lib = a["lib/rank0/libkbp.so"]
    for path in (REPO, clone, build_cache, tmp_path, Path.home()):
        assert str(path).encode() not in lib, f"libkbp.so holds the path {path}"
    assert b"targets/x86_64-linux" not in lib, "libkbp.so holds a path of the CUDA installation"


def test_other_max_context_rebuilds_only_the_step(tmp_path, tiny_path, build_cache):
    key = generate_keys(tmp_path / "keys").private
    _compile(REPO, build_cache, tmp_path / "a", tiny_path, key)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "kbpc.cli", "compile", str(tiny_path), "-o", "short.kbp", "-j", "1",
                           "--key", str(key), "--cache-dir", str(build_cache), "--max-context", "77"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "(1 compiled, " in proc.stdout, proc.stdout
