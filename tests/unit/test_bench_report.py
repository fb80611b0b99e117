"""`kbpc bench`'s outputs from a made-up profile (no GPU): the report follows its schema and adds
up, the Chrome/Perfetto trace has one track per stream with the groups end to end in launch order,
and the plot is a PNG. The GPU command that produces them for real is in the docstring of
tests/gpu/test_gpu_bench.py."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest

from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.runtime.bench_report import Measurement, bench_report, chrome_trace, plot_families, step_spread_ms
from kbpc.runtime.run_manifest import RunManifest
from kbpc.runtime.traffic import family_bytes

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "kbpc-bench.v1.schema.json"


@pytest.fixture(scope="module")
def fake(tiny_path):
    bp = load_blueprint(tiny_path)
    plan = json.loads(json.dumps(run_pipeline(bp, Options(max_context=64)).to_json()))
    order = sorted(plan["schedule"], key=lambda s: s["position"])
    group_ms = tuple(0.001 * (1 + i % 5) for i in range(len(order)))   # a made-up profile
    m = Measurement(context=16, step_seconds=(0.002, 0.001, 0.003), group_ms=group_ms, bandwidth=4.0e12,
                    bandwidth_source="given (--bandwidth)", device="sm_90 (fake, compute capability 9.0)")
    run = RunManifest(kind="lite", blueprint_id=bp.meta.blueprint_id, plan_digest="0" * 64, target="sm_90",
                      max_context=64, numerics="exact", index_cache="f32", libraries={"rank0": "lib/rank0/libkbp.so"}, weights=(),
                      state=(), checkpoint=None, launches=len(order), groups=len(order))
    return bp, plan, m, run


def test_report_adds_up_and_follows_the_schema(fake):
    bp, plan, m, run = fake
    fbytes = family_bytes(bp, plan, m.context)
    report = bench_report(run, plan, fbytes, m)
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    assert report["step_ms_median"] == pytest.approx(2.0)
    assert report["step_ms_spread"] == pytest.approx({"min": 1.0, "p10": 1.0, "p90": 3.0, "max": 3.0})
    assert sum(f["us"] for f in report["families"].values()) == pytest.approx(1e3 * sum(m.group_ms))
    assert sum(f["groups"] for f in report["families"].values()) == len(m.group_ms)
    assert report["floor_ms"] == pytest.approx(sum(fbytes.values()) / 4.0e12 * 1e3)
    assert report["bandwidth"]["source"] == "given (--bandwidth)"
    assert report["graph_edges"] is None   # the made-up measurement has no captured graph
    assert report["timed_step"] is None    # nor says what its steps covered
    from kbpc.runtime.bench import GREEDY_ON_GPU
    said = bench_report(run, plan, fbytes, dataclasses.replace(m, timed_step=GREEDY_ON_GPU))
    jsonschema.validate(said, json.loads(SCHEMA.read_text()))
    assert said["timed_step"] == GREEDY_ON_GPU


def test_report_carries_the_graph_edges(fake):
    """What kbp_graph_edges reported of the captured step (programmatic edges, all edges) goes into
    the report as it came, and the report still follows the schema."""
    bp, plan, m, run = fake
    report = bench_report(run, plan, family_bytes(bp, plan, m.context), dataclasses.replace(m, graph_edges=(817, 903)))
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    assert report["graph_edges"] == {"programmatic": 817, "total": 903}


def test_trace_has_a_track_per_stream_and_the_groups_end_to_end(fake):
    _, plan, m, _ = fake
    trace = chrome_trace(plan, m, "tiny")
    json.dumps(trace)
    tracks = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    streams = {s["stream"] for s in plan["schedule"]}
    assert set(tracks) == streams and all(tracks[s] == f"stream {s}" for s in streams)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(m.group_ms)
    for a, b in zip(spans, spans[1:]):
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=1e-3)
    stream_of = {s["group"]: s["stream"] for s in plan["schedule"]}
    assert all(e["tid"] == stream_of[e["args"]["group"]] for e in spans)


def test_plot_is_a_png(fake, tmp_path):
    pytest.importorskip("matplotlib")
    bp, plan, m, run = fake
    report = bench_report(run, plan, family_bytes(bp, plan, m.context), m)
    out = tmp_path / "families.png"
    plot_families(report, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_history_fills_an_fp32_latent_cache_with_values_not_codes():
    """kbpc bench fills the caches a long context would have written: E4M3 codes for the FP8
    latent cache, FP32 values for the --no-act-quant build's FP32 one (codes read as FP32 would
    be arbitrary bit patterns), nothing for state a context does not fill."""
    from kbpc.runtime.bench import history_rule

    assert history_rule("l3.attn.kv_write.latent_cache", "e4m3")[0] == 3
    assert history_rule("l3.attn.kv_write.latent_cache", "f32") == (0, 1.0, 0.0)
    assert history_rule("l3.attn.index.pool_keys", "f32") == (0, 1.0, 0.0)
    assert history_rule("l0.kda.short_conv.window", "f32") is None


def test_step_spread_by_nearest_rank():
    """10th and 90th percentiles by nearest rank: of 20 replays the 2nd and the 18th fastest; one
    replay is its own spread."""
    twenty = tuple(i * 1e-3 for i in range(20, 0, -1))   # 20 .. 1 ms, in any order
    assert step_spread_ms(twenty) == pytest.approx({"min": 1.0, "p10": 2.0, "p90": 18.0, "max": 20.0})
    assert step_spread_ms((0.005,)) == pytest.approx({"min": 5.0, "p10": 5.0, "p90": 5.0, "max": 5.0})
