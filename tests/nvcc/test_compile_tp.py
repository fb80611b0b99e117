"""`kbpc compile --tp 2` on a machine without a GPU: one library per rank, each with the NCCL
runtime and linked against NCCL by its soname (a tp = 1 library has neither), one signed bundle
that verifies, and a manifest that maps the ranks to their libraries and records the split."""
from __future__ import annotations

import json
import shutil
import subprocess
import zipfile

import pytest
from click.testing import CliRunner

from kbpc.bundle.keystore import generate_keys
from kbpc.cli import main
from kbpc.toolchain.library import TP_RUNTIME, runtime_sources

pytestmark = pytest.mark.nvcc


@pytest.fixture(scope="module")
def tp_bundle(tmp_path_factory, tiny_path, build_cache):
    keys = generate_keys(tmp_path_factory.mktemp("keys"))
    out = tmp_path_factory.mktemp("out") / "tiny-tp2.kbp"
    result = CliRunner().invoke(main, ["compile", str(tiny_path), "-o", str(out), "--tp", "2", "--numerics", "exact",
                                       "--key", str(keys.private), "--cache-dir", str(build_cache), "--verify"])
    assert result.exit_code == 0, result.output
    return out, keys


def test_tp_bundle_holds_one_library_per_rank(tp_bundle, tmp_path):
    out, keys = tp_bundle
    verified = CliRunner().invoke(main, ["verify", str(out), "--trust", str(keys.public)])
    assert verified.exit_code == 0, verified.output
    with zipfile.ZipFile(out) as zf:
        names = set(zf.namelist())
        manifest = json.loads(zf.read("manifest.json"))
        zf.extractall(tmp_path, [n for n in names if n.startswith("lib/")])
    assert manifest["tp_size"] == 2
    assert manifest["library"] == {"rank0": "lib/rank0/libkbp.so", "rank1": "lib/rank1/libkbp.so"}
    assert {"src/rank0/step.cu", "src/rank1/step.cu", "src/runtime_stub/kbp_tp.cu",
            "src/include/tp_collective.cuh"} <= names
    tp = manifest["tp"]
    assert tp["ranks"] == 2 and len(tp["per_rank"]) == 2 and len(tp["sites"]) == len(tp["partials"])
    assert tp["comm_bytes"] == sum(2 * s["slot_bytes"] for s in tp["sites"])
    if shutil.which("readelf"):
        for r in range(2):
            dyn = subprocess.run(["readelf", "-d", str(tmp_path / f"lib/rank{r}/libkbp.so")], capture_output=True,
                                 text=True, check=True).stdout
            assert "[libnccl.so.2]" in dyn and "RUNPATH" not in dyn and "RPATH" not in dyn


def test_inspect_shows_bytes_per_rank_and_collectives(tp_bundle):
    out, keys = tp_bundle
    result = CliRunner().invoke(main, ["inspect", str(out), "--trust", str(keys.public), "--json"])
    assert result.exit_code == 0, result.output
    tp = json.loads(result.output)["tp"]
    assert tp["collectives_per_step"] == len(tp["partials"]) + 1
    assert all(r["weight_bytes_per_token"] > 0 and r["collective_bytes_per_step"] > 0 for r in tp["per_rank"])


def test_unsplit_builds_leave_nccl_out():
    assert f"runtime_stub/{TP_RUNTIME}" not in runtime_sources()
    assert f"runtime_stub/{TP_RUNTIME}" in runtime_sources(tensor_parallel=True)
