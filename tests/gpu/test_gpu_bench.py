"""`kbpc bench` on the GPU with every output: the JSON report (schema kbpc-bench/v1, the copy
bandwidth measured at start), the Chrome/Perfetto trace and the per-family plot. By hand:

    kbpc compile examples/tiny.graph.json -o out/tiny.kbp --max-context 256 --key out/keys/signing-key.json
    kbpc bench out/tiny.kbp --trust out/keys/signing-key.pub.json --context 64 --runs 10 \\
        --trace out/step.json --plot out/families.png --json-out out/bench.json
"""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from kbpc.bundle.keys import Signer
from kbpc.bundle.keystore import generate_keys
from kbpc.cli import main
from kbpc.compiler import CompileRequest, compile_bundle
from kbpc.ir.plan import Options

pytestmark = pytest.mark.gpu

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "kbpc-bench.v1.schema.json"


def test_bench_writes_report_trace_and_plot(tmp_path, tiny_path):
    pytest.importorskip("matplotlib")
    keys = generate_keys(tmp_path / "keys")
    bundle = tmp_path / "tiny.kbp"
    compile_bundle(CompileRequest(blueprint=Path(tiny_path), output=bundle, options=Options(max_context=256),
                                  signer=Signer.load(keys.private), cache_dir=tmp_path / "cache"))
    trace, plot = tmp_path / "step.json", tmp_path / "families.png"
    result = CliRunner().invoke(main, ["bench", str(bundle), "--trust", str(keys.public), "--context", "64",
                                       "--runs", "10", "--trace", str(trace), "--plot", str(plot), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    assert report["bandwidth"]["source"].startswith("measured")
    # The default build launches with PDL: capture made some of the step graph's edges programmatic.
    edges = report["graph_edges"]
    assert 0 < edges["programmatic"] <= edges["total"]
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["name"] == "thread_name" for e in events)
    # one profile mark per launch: the trace has a span per launch, the families count launches
    assert report["profile_marks"] == "launch"
    assert len([e for e in events if e["ph"] == "X"]) == report["launches_per_step"]
    assert sum(f["groups"] for f in report["families"].values()) == report["launches_per_step"]
    assert plot.read_bytes()[:4] == b"\x89PNG"
