"""The pure half of bench/replay_timeline.py: the launch table read from a bundle's generated
sources, profiler records matched to launches by name, and the summary of a synthetic trace of
replays whose numbers are worked out by hand (no torch, no GPU)."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from kbpc.codegen.emit import build_step, generate
from kbpc.codegen.records import Collective
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from timeline_launches import (KernelRecord, LaunchRow, TimelineError, kernel_names, launch_table,  # noqa: E402
                               match_replay, strip_signature)
from timeline_summary import chrome_trace, kernel_records, lateness, split_replays, summarize, table  # noqa: E402


def test_launch_table_is_the_step_program(tiny_path):
    plan = run_pipeline(load_blueprint(Path(tiny_path)), Options(pdl_across_events=True))
    files = generate(plan, "x").files
    rows = launch_table(files["src/step.cu"], kernel_names(files))
    step = build_step(plan, "x")
    want = [(g.group, g.stream, l.instance.name, l.instance.kernel, l.grid, l.block, l.pdl, l.priority,
             i == 0 and bool(g.waits))
            for g in step.groups for i, l in enumerate(g.launches) if not isinstance(l, Collective)]
    got = [(r.group, r.stream, r.instance, r.kernel, r.grid, r.block, r.pdl, r.priority, r.after_wait) for r in rows]
    assert got == want
    assert [r.index for r in rows] == list(range(len(rows)))
    assert {r.family for r in rows} == {g.family for g in step.groups if g.launches}
    # The events: waits attach to the stream's next launch, records to its last one.
    pending, last, want_waits, want_records = {}, {}, [], []
    for g in step.groups:
        pending.setdefault(g.stream, []).extend(g.waits)
        for launch in g.launches:
            if isinstance(launch, Collective):
                continue
            want_waits.append(tuple(pending.pop(g.stream, ())))
            want_records.append(())
            last[g.stream] = len(want_records) - 1
        if g.record is not None and g.stream in last:
            want_records[last[g.stream]] += (g.record,)
    assert [r.waits for r in rows] == want_waits and [r.records for r in rows] == want_records
    assert any(r.waits for r in rows) and any(r.records for r in rows)


def test_launch_table_refuses_other_text():
    with pytest.raises(TimelineError, match="no kernel launches"):
        launch_table("int main() {}\n", {})


def test_symbols_lose_return_type_parameters_and_spaces():
    assert strip_signature("void kbp::k<1, (kbp::M)2>(float const*, int)") == "kbp::k<1,(kbp::M)2>"
    assert strip_signature("kbp::k<4, true>") == "kbp::k<4,true>"


def _row(i, group, family, stream, kernel, after_wait=False, pdl=False, waits=(), records=()):
    return LaunchRow(i, group, f"rule_{family}", family, stream, f"inst{i}", kernel, (2, 1, 1), (128, 1, 1),
                     pdl, after_wait, waits, records)


# Four launches; kernel a<1> runs twice with the same shape (matched by start order), c's template
# argument is spelled differently by the demangler (matched by its template name alone). Launch 2
# waits for event 5, recorded after launch 0.
LAUNCHES = [_row(0, 0, "A", 0, "kbp::a<1>", records=(5,)), _row(1, 1, "B", 0, "kbp::b<2, true>", pdl=True),
            _row(2, 2, "A", 1, "kbp::a<1>", after_wait=True, waits=(5,)),
            _row(3, 3, "C", 0, "kbp::c<kbp::Mode::Fast>", pdl=True)]
SYMBOLS = ["void kbp::a<1>(float const*, int)", "void kbp::b<2, true>(float*)", "void kbp::a<1>(float const*, int)",
           "void kbp::c<(kbp::Mode)1>(float*)"]
# Replay-relative (start, end): 0 alone, then 2 beside 1, 3 starts before 1 ends (PDL); idle 10..11.
TIMES = [(0.0, 10.0), (12.0, 20.0), (11.0, 15.0), (19.0, 30.0)]
STREAM = [7, 7, 13, 7]


def _kineto(replays: int, correlation: bool = True) -> dict:
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 1.0, "dur": 2.0, "args": {}}]
    for r in range(replays):
        for k, (s, e) in enumerate(TIMES):
            e += r if k == 3 else 0.0                     # spans 30, 31, 32 us
            args = {"stream": STREAM[k], "grid": [2, 1, 1], "block": [128, 1, 1], "device": 0}
            if correlation:
                args["correlation"] = 100 + r
            events.append({"ph": "X", "cat": "kernel", "name": SYMBOLS[k], "pid": 0, "tid": STREAM[k],
                           "ts": 5000.0 + 1000.0 * r + s, "dur": e - s, "args": args})
    random.Random(3).shuffle(events)
    return {"traceEvents": events}


def test_records_match_their_launches():
    recs = [KernelRecord(SYMBOLS[k], 100 + s, 100 + e, STREAM[k], 1, (2, 1, 1), (128, 1, 1))
            for k, (s, e) in enumerate(TIMES)]
    order = [3, 1, 0, 2]
    got = match_replay([recs[i] for i in order], LAUNCHES)
    assert [g.index for g in got] == order
    stranger = KernelRecord("void other(int)", 0.0, 1.0, 7, 1)
    assert match_replay(recs + [stranger], LAUNCHES)[-1] is None


def test_replays_split_by_correlation_or_by_count():
    by_corr = split_replays(kernel_records(_kineto(3)), len(LAUNCHES))
    by_count = split_replays(kernel_records(_kineto(3, correlation=False)), len(LAUNCHES))
    for replays in (by_corr, by_count):
        assert [len(r) for r in replays] == [4, 4, 4]
        assert [r[0].start for r in replays] == [5000.0, 6000.0, 7000.0]
    with pytest.raises(TimelineError, match="not whole replays"):
        split_replays(kernel_records(_kineto(3))[:7], len(LAUNCHES))
    with pytest.raises(TimelineError, match="no kernel records"):
        split_replays([], 4)


def test_the_runner_greedy_kernel_is_not_a_graph_launch():
    """Each timed step ends with the runner's greedy kernel (runtime_stub/kbp_greedy.cu), launched
    after the graph: the timeline drops it, so the records split into whole replays again."""
    from replay_timeline import graph_records
    records = kernel_records(_kineto(3, correlation=False))
    greedy = [KernelRecord("(anonymous namespace)::greedy_bf16(unsigned short const*, int, "
                           "(anonymous namespace)::GreedyScratch*)", 5900.0 + 1000 * i, 5901.0 + 1000 * i, 7, None)
              for i in range(3)]
    with pytest.raises(TimelineError, match="not whole replays"):
        split_replays(records + greedy, len(LAUNCHES))
    assert [len(r) for r in split_replays(graph_records(records + greedy), len(LAUNCHES))] == [4, 4, 4]


def test_summary_of_a_synthetic_trace():
    s = summarize(split_replays(kernel_records(_kineto(3)), len(LAUNCHES)), LAUNCHES)
    assert s["replays"] == 3 and s["unmatched_records"] == 0
    assert s["step_span_us"]["each"] == [30.0, 31.0, 32.0] and s["step_span_us"]["median"] == 31.0
    assert s["idle_us"] == 1.0 and s["busy_us"] == 30.0 and s["median_replay"] == 1
    k = {x["launch"]: x for x in s["kernels"]}
    assert [k[i]["dur_us"] for i in range(4)] == [10.0, 8.0, 4.0, 12.0]
    assert [k[i]["gap_us"] for i in range(4)] == [0.0, 2.0, 11.0, -1.0]    # first on stream 1: from step start
    assert [k[i]["concurrent"] for i in range(4)] == [0, 2, 1, 1]
    # Lateness: 1 starts 2 us after 0 ended, 2 one us after event 5 (0's end), 3 one us before 1 ends.
    assert [k[i]["late_us"] for i in range(4)] == [0.0, 2.0, 1.0, -1.0]
    assert [x["launch"] for x in s["top_late"]] == [1, 2, 0, 3]
    assert k[2]["after_wait"] and k[3]["pdl"] and k[0]["family"] == "A"
    fam = s["families"]
    assert list(fam) == ["A", "C", "B"]                        # by busy time
    assert (fam["A"]["launches"], fam["A"]["busy_us"], fam["A"]["sole_us"]) == (2, 14.0, 11.0)
    assert (fam["B"]["busy_us"], fam["B"]["sole_us"]) == (8.0, 4.0)
    assert (fam["C"]["busy_us"], fam["C"]["sole_us"]) == (12.0, 11.0)
    assert [g["kernel"]["launch"] for g in s["top_gaps"]] == [2, 1, 0, 3]
    assert s["top_gaps"][1]["before"]["launch"] == 0 and s["top_gaps"][0]["before"] is None
    assert [g["kernel"]["launch"] for g in s["top_gaps_no_wait"]] == [1, 0, 3]
    assert s["idle_gaps"] == [{"at_us": 10.0, "idle_us": 1.0, "before": LAUNCHES[0].to_json(),
                               "after": LAUNCHES[2].to_json()}]
    text = table(s)
    assert "step span 31.0 us" in text and "    2.00  stream 0: A (group 0) -> B (group 1, launch 1) pdl" in text
    assert "1.00  at      10.0 us: A (group 0, stream 0) -> A (group 2, stream 1)" in text
    assert "    1.00  A (group 2, stream 1), launch 2 after an event wait" in text
    json.dumps(s)


def test_chrome_trace_has_a_track_per_plan_stream():
    replays = split_replays(kernel_records(_kineto(2)), len(LAUNCHES))
    trace = chrome_trace(replays, LAUNCHES, "t")
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert sorted(names.values()) == ["replays", "stream 0", "stream 1"]
    kernels = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["tid"] != 0]
    assert len(kernels) == 8 and min(e["ts"] for e in kernels) == 0.0
    assert {names[e["tid"]] for e in kernels if e["args"]["launch"] == 2} == {"stream 1"}
    assert sum(e["name"].startswith("replay") for e in trace["traceEvents"]) == 2


def test_lateness_counts_every_dependency():
    """A launch is ready when its stream's previous launch and every awaited event's launch have
    ended; an event nothing recorded counts as complete at the start; unmatched launches are skipped."""
    rows = [_row(0, 0, "A", 0, "kbp::a<1>", records=(1,)), _row(1, 1, "B", 1, "kbp::b<1>", records=(2,)),
            _row(2, 2, "C", 2, "kbp::c<1>", waits=(1, 2, 9)), _row(3, 3, "A", 2, "kbp::a<1>")]
    times = {0: (0.0, 4.0), 1: (0.0, 9.0), 2: (10.5, 12.0), 3: (11.0, 13.0)}
    assert lateness(times, rows) == {0: 0.0, 1: 0.0, 2: 1.5, 3: -1.0}
    assert lateness({k: v for k, v in times.items() if k != 1}, rows) == {0: 0.0, 2: 6.5, 3: -1.0}


def test_delays_cli_on_a_new_and_an_old_timeline(tmp_path, capsys):
    from timeline_delays import main  # noqa: PLC0415
    s = summarize(split_replays(kernel_records(_kineto(3)), len(LAUNCHES)), LAUNCHES)
    new = tmp_path / "new.json"
    new.write_text(json.dumps(s))
    assert main([str(new)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[1].split()[:2] == ["rule_B", "kbp::b<2,"] and text[1].split()[-2:] == ["2.00", "2.0"]
    assert any(line.split()[-1] == "-1.0" for line in text)
    old = tmp_path / "old.json"
    for k in s["kernels"]:
        del k["late_us"]
    old.write_text(json.dumps(s))
    assert main([str(old)]) == 2 and "--step" in capsys.readouterr().err
    step = tmp_path / "step.cu"
    step.write_text("\n".join([
        "    // group 0 (rule_A, A) on stream 0: n0",
        "    KBP_CHECK(kbp_launch_inst0(dim3(2, 1, 1), dim3(128, 1, 1), 0, streams[0], 0));",
        "    KBP_CHECK(cudaEventRecord(events[5], streams[0]));",
        "    // group 1 (rule_B, B) on stream 0: n1",
        "    KBP_CHECK(kbp_launch_inst1(dim3(2, 1, 1), dim3(128, 1, 1), 0, streams[0], 1));",
        "    // group 2 (rule_A, A) on stream 1: n2",
        "    KBP_CHECK(cudaStreamWaitEvent(streams[1], events[5], 0));",
        "    KBP_CHECK(kbp_launch_inst2(dim3(2, 1, 1), dim3(128, 1, 1), 0, streams[1], 0));",
        "    // group 3 (rule_C, C) on stream 0: n3",
        "    KBP_CHECK(kbp_launch_inst3(dim3(2, 1, 1), dim3(128, 1, 1), 0, streams[0], 1));"]))
    assert main([str(old), "--step", str(step)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[-2:] == ["2.00", "2.0"]
