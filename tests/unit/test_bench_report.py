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
from kbpc.errors import KbpcError
from kbpc.runtime.run_manifest import ProfileMark, RunManifest
from kbpc.runtime.traffic import family_bytes

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "kbpc-bench.v1.schema.json"


def _fake(bp, per_launch: bool):
    """A plan, a made-up profile of it and the run manifest: marks per launch (what a bundle's
    manifest lists since ABI 4) or, with per_launch False, per plan group (earlier bundles)."""
    from kbpc.codegen.emit import build_step
    from kbpc.codegen.records import profile_marks

    plan_obj = run_pipeline(bp, Options(max_context=64))
    plan = json.loads(json.dumps(plan_obj.to_json()))
    order = sorted(plan["schedule"], key=lambda s: s["position"])
    marks = None
    if per_launch:   # as the manifest carries them: JSON, parsed by RunManifest
        doc = [m.to_json() for m in profile_marks(build_step(plan_obj, "x").groups)]
        marks = tuple(ProfileMark(d["group"], d["family"], d["stream"], tuple(d["nodes"])) for d in doc)
    n = len(marks) if marks else len(order)
    mark_ms = tuple(0.001 * (1 + i % 5) for i in range(n))   # a made-up profile
    m = Measurement(context=16, step_seconds=(0.002, 0.001, 0.003), mark_ms=mark_ms, bandwidth=4.0e12,
                    bandwidth_source="given (--bandwidth)", device="sm_90 (fake, compute capability 9.0)")
    run = RunManifest(kind="lite", blueprint_id=bp.meta.blueprint_id, plan_digest="0" * 64, target="sm_90",
                      max_context=64, numerics="exact", index_cache="f32", libraries={"rank0": "lib/rank0/libkbp.so"}, weights=(),
                      state=(), checkpoint=None, launches=n, groups=len(order), marks=marks)
    return bp, plan, m, run


@pytest.fixture(scope="module", params=[True, False], ids=["launch-marks", "group-marks"])
def fake(tiny_path, request):
    return _fake(load_blueprint(tiny_path), request.param)


def test_launch_marks_count_each_kernel_under_its_own_family(tiny_path):
    """With marks per launch the families are the launches' kernel families (a fused group's
    launches of other families counted apart), their bytes add up to the same step total as the
    groups', and the report says which marks it read."""
    bp = load_blueprint(tiny_path)
    _, plan, m, run = _fake(bp, True)
    _, _, m_g, run_g = _fake(bp, False)
    by_launch = family_bytes(bp, plan, m.context, run.marks)
    by_group = family_bytes(bp, plan, m.context)
    assert sum(by_launch.values()) == pytest.approx(sum(by_group.values()))
    timed = {mk.group for mk in run.marks}
    unlaunched = {g["family"] for g in plan["groups"] if g["id"] not in timed}
    assert unlaunched == {"argmax_host"}   # the host's argmax: bytes in the floor, no launch to time
    assert set(by_launch) == {mk.family for mk in run.marks} | unlaunched
    moved = [f for f in by_launch if by_launch[f] != pytest.approx(by_group.get(f, 0.0))]
    assert "w4a4_mx_static" in moved   # the routed gate/up's weights, launched in the router's group
    report = bench_report(run, plan, by_launch, m)
    assert report["profile_marks"] == "launch" and bench_report(run_g, plan, by_group, m_g)["profile_marks"] == "group"
    for family, row in report["families"].items():
        mine = [i for i, mk in enumerate(run.marks) if mk.family == family]
        assert row["groups"] == len(mine) and row["us"] == pytest.approx(1e3 * sum(m.mark_ms[i] for i in mine))
    with pytest.raises(KbpcError, match="marks"):
        bench_report(run, plan, by_launch, dataclasses.replace(m, mark_ms=m.mark_ms[:-1]))


def test_report_adds_up_and_follows_the_schema(fake):
    bp, plan, m, run = fake
    fbytes = family_bytes(bp, plan, m.context, run.marks)
    report = bench_report(run, plan, fbytes, m)
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    assert report["step_ms_median"] == pytest.approx(2.0)
    assert report["step_ms_spread"] == pytest.approx({"min": 1.0, "p10": 1.0, "p90": 3.0, "max": 3.0})
    assert sum(f["us"] for f in report["families"].values()) == pytest.approx(1e3 * sum(m.mark_ms))
    assert sum(f["groups"] for f in report["families"].values()) == len(m.mark_ms)
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
    report = bench_report(run, plan, family_bytes(bp, plan, m.context, run.marks),
                          dataclasses.replace(m, graph_edges=(817, 903)))
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    assert report["graph_edges"] == {"programmatic": 817, "total": 903}


def test_trace_has_a_track_per_stream_and_the_marks_end_to_end(fake):
    _, plan, m, run = fake
    trace = chrome_trace(run, plan, m, "tiny")
    json.dumps(trace)
    tracks = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    streams = {mk.stream for mk in run.marks} if run.marks else {s["stream"] for s in plan["schedule"]}
    assert set(tracks) == streams and all(tracks[s] == f"stream {s}" for s in streams)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(m.mark_ms)
    for a, b in zip(spans, spans[1:]):
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=1e-3)
    if run.marks:
        assert [(e["tid"], e["name"], e["args"]["group"]) for e in spans] == [
            (mk.stream, mk.family, mk.group) for mk in run.marks]
    else:
        stream_of = {s["group"]: s["stream"] for s in plan["schedule"]}
        assert all(e["tid"] == stream_of[e["args"]["group"]] for e in spans)


def test_plot_is_a_png(fake, tmp_path):
    pytest.importorskip("matplotlib")
    bp, plan, m, run = fake
    report = bench_report(run, plan, family_bytes(bp, plan, m.context, run.marks), m)
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
