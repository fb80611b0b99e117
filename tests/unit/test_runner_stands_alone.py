"""The runner stands alone: importing every module of kbpc.runtime (the runner, its backends,
bench, numerics) loads neither the compiler driver nor the code generator nor the passes, so a
machine that only runs bundles needs none of them and nothing the runner does can recompile."""
from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import kbpc.runtime

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("kbpc.compiler", "kbpc.codegen", "kbpc.passes", "kbpc.toolchain")


def test_runtime_imports_no_compiler():
    modules = sorted(f"kbpc.runtime.{m.name}" for m in pkgutil.iter_modules(kbpc.runtime.__path__))
    assert "kbpc.runtime.cuda_backend" in modules and "kbpc.runtime.bench" in modules
    code = ("import importlib, json, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kbpc.'))))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    loaded = json.loads(proc.stdout)
    offenders = [m for m in loaded if m.startswith(FORBIDDEN)]
    assert not offenders, f"kbpc.runtime pulls in {offenders}"


def test_runner_reads_a_typed_manifest():
    import pytest

    from kbpc.errors import BundleError
    from kbpc.runtime.run_manifest import RunManifest

    good = {"kind": "lite", "blueprint_id": "b", "plan_digest": "0" * 64, "target": "sm_90",
            "options": {"max_context": 64, "numerics": "fast"}, "library": {"rank0": "lib/rank0/libkbp.so"},
            "weights": [{"name": "w", "storage": "bf16", "shape": [2, 3], "bytes": 12}],
            "state": [{"name": "s", "bytes": 8, "shape": [2], "storage": "f32"}],
            "checkpoint": [{"name": "m.safetensors", "bytes": 10, "sha256": "a" * 64}],
            "step": {"launches": 3, "groups": 2}}
    run = RunManifest.from_json(good)
    assert (run.max_context, run.numerics, run.library(0), run.weights[0].shape) == (64, "fast",
                                                                                     "lib/rank0/libkbp.so", (2, 3))
    assert run.checkpoint[0].sha256 == "a" * 64
    for broken in ({**good, "kind": "fat"}, {**good, "options": {}}, {**good, "library": []},
                   {**good, "weights": [{"name": "w", "storage": "bf16", "shape": [-1], "bytes": 2}]},
                   {k: v for k, v in good.items() if k != "step"}):
        with pytest.raises(BundleError):
            RunManifest.from_json(broken)
    with pytest.raises(BundleError, match="rank 1"):
        run.library(1)
    assert run.marks is None   # a bundle from before ABI 4: the profile marks plan groups
    mark = {"group": 1, "family": "w4a4_mx_static", "stream": 0, "nodes": ["l1.moe.experts_gate_up"]}
    marked = RunManifest.from_json({**good, "step": {**good["step"], "marks": [mark]}})
    assert marked.marks[0].family == "w4a4_mx_static" and marked.marks[0].nodes == ("l1.moe.experts_gate_up",)
    for bad in ("marks", [{**mark, "group": -1}], [{**mark, "nodes": "n"}], [{**mark, "nodes": [3]}],
                [{**mark, "family": None}], [{k: v for k, v in mark.items() if k != "stream"}], [7]):
        with pytest.raises(BundleError):
            RunManifest.from_json({**good, "step": {**good["step"], "marks": bad}})
