"""`kbpc compile` end to end on a machine without a GPU: the tiny example and the seed build for
sm_90 and sm_121, the result verifies, a second compile is byte-identical (signatures aside) and
comes from the object cache, and a tampered bundle is refused by verify, inspect and run."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbpc.bundle.keys import generate_keys
from kbpc.cli import main

pytestmark = pytest.mark.nvcc


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return generate_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def compile_(blueprint: Path, out: Path, keys, cache, *extra) -> None:
    result = CliRunner().invoke(main, ["compile", str(blueprint), "-o", str(out), "--key", str(keys.private),
                                       "--cache-dir", str(cache), "--verify", *extra])
    assert result.exit_code == 0, result.output
    assert out.exists()


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist() if n != "signature.json"}


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory, tiny_path, keys, cache):
    out = tmp_path_factory.mktemp("out") / "tiny.kbp"
    compile_(tiny_path, out, keys, cache)
    return out


def test_tiny_compiles_verifies_and_reproduces(tiny_bundle, tiny_path, keys, cache, tmp_path):
    result = CliRunner().invoke(main, ["verify", str(tiny_bundle), "--trust", str(keys.public)])
    assert result.exit_code == 0, result.output
    again = tmp_path / "again.kbp"
    compile_(tiny_path, again, keys, cache)
    assert members(again) == members(tiny_bundle)
    manifest = json.loads(members(again)["manifest.json"])
    assert manifest["target"] == "sm_90" and manifest["kind"] == "lite"
    assert any(m["path"] == "lib/rank0/libkbp.so" for m in manifest["members"])


def test_tiny_for_sm121(tiny_path, keys, cache, tmp_path):
    out = tmp_path / "tiny121.kbp"
    compile_(tiny_path, out, keys, cache, "--target", "sm_121")
    assert json.loads(members(out)["manifest.json"])["target"] == "sm_121"


def test_tampered_bundle_is_refused_everywhere(tiny_bundle, keys, tmp_path):
    data = bytearray(tiny_bundle.read_bytes())
    data[len(data) // 3] ^= 0x01
    bad = tmp_path / "bad.kbp"
    bad.write_bytes(bytes(data))
    for args in (["verify", str(bad)], ["inspect", str(bad)], ["run", str(bad), "--max-new-tokens", "1"]):
        result = CliRunner().invoke(main, [*args, "--trust", str(keys.public)])
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output


def test_failed_compile_leaves_nothing(tiny_path, keys, cache, tmp_path):
    out = tmp_path / "never.kbp"
    result = CliRunner().invoke(main, ["compile", str(tiny_path), "-o", str(out), "--key", str(keys.private),
                                       "--cache-dir", str(cache), "--tp", "3"])
    assert result.exit_code == 2 and "does not split over 3 ranks" in result.output
    assert not out.exists() and not list(tmp_path.glob("*.kbp*"))


def test_bundle_runs_on_reference_backend(tiny_bundle, keys):
    result = CliRunner().invoke(main, ["run", str(tiny_bundle), "--trust", str(keys.public), "--backend",
                                       "reference", "--max-new-tokens", "2", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["backend"] == "reference"


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm_90", "sm_121"])
def test_seed_compiles(seed_path, keys, cache, tmp_path, target):
    out = tmp_path / f"seed-{target}.kbp"
    compile_(seed_path, out, keys, cache, "--target", target)
    manifest = json.loads(members(out)["manifest.json"])
    assert manifest["step"]["groups"] == 908 and manifest["target"] == target
