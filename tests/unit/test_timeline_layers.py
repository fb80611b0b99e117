"""bench/timeline_layers.py on a synthetic timeline whose sublayer spans are worked out by hand."""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from timeline_layers import (after_ready, by_neighbours, chain_table, kind_of, launch_chains,  # noqa: E402
                             main, sublayers, table)


def _k(family, start, dur):
    return {"family": family, "start_us": start, "dur_us": dur, "kernel": f"kbp::{family}"}


STEP = [_k("embed_copy", 0.0, 1.0), _k("glm_mhc", 1.0, 2.0),                       # boundary ends at 3
        _k("w4a16_gemv", 2.5, 10.0), _k("kda_recurrent", 12.0, 3.0),               # KDA attention
        _k("glm_mhc", 15.0, 2.0),                                                    # ends at 17: 14
        _k("glm_router_topk", 16.0, 5.0), _k("w4a16_gemv", 17.5, 4.0),             # MoE (shared beside)
        _k("w4a4_mx_static", 21.0, 9.0), _k("glm_mhc", 30.0, 3.0),                 # ends at 33: 16
        _k("glm_mla_decode", 34.0, 10.0), _k("glm_mhc", 44.0, 2.0),                # DSA: ends at 46: 13
        _k("glm_mhc", 46.0, 1.0),                                                    # nothing between: other, 1
        _k("dense_bf16", 47.0, 20.0)]                                                # the LM head: no span


def test_spans_between_boundaries_named_by_their_families():
    assert sublayers(STEP) == [("kda attention", 14.0), ("moe", 16.0), ("dsa attention", 13.0), ("other", 1.0)]
    assert kind_of({"w4a4_mx", "w8a8_act_quant"}) == "dense mlp" and kind_of({"kda_fused"}) == "kda attention"


def test_table_and_side_by_side(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"kernels": STEP + [_k("kda_recurrent", 67.0, 1.0), _k("glm_mhc", 68.0, 2.0)]}))
    got = table(str(path))
    assert got["kda attention"] == (2, 18.5, 14.0, 23.0)   # 14, then 47 -> 70 = 23
    assert main([str(path), str(path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["kda", "dsa", "moe", "other"]
    assert all(line.count("median") == 2 for line in lines)
    assert main([]) == 2


def test_chains_end_each_launch_after_the_opening_boundary(tmp_path, capsys):
    """--chain: every launch of a sublayer by rule (its family without one) and occurrence, with the
    time it ends after the opening boundary's end; medians over the sublayers of a kind."""
    rules = dict(enumerate(["embed", "hc", "proj", "rec", "hc", "router", "shared", "down", "hc"]))
    step = [dict(k, rule=rules.get(i, ""), stream=1 if rules.get(i) == "shared" else 0) for i, k in enumerate(STEP)]
    chains = launch_chains(step)
    assert [kind for kind, _ in chains] == ["kda attention", "moe", "dsa attention", "other"]
    assert chains[0][1] == [("proj #1", 0, 9.5), ("rec #1", 0, 12.0), ("hc #1", 0, 14.0)]
    assert chains[1][1] == [("router #1", 0, 4.0), ("shared #1", 1, 4.5), ("down #1", 0, 13.0), ("hc #1", 0, 16.0)]
    assert chains[2][1] == [("glm_mla_decode #1", 0, 11.0), ("glm_mhc #1", 0, 13.0)]   # no rule: the family
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"kernels": step + [_k("w4a4_mx_static", 52.0, 20.0), _k("glm_mhc", 72.0, 2.0)]}))
    moe = chain_table(str(path))["moe"]
    assert moe[0] == 2 and moe[1]["w4a4_mx_static #1"] == (-1, 25.0) and moe[1]["hc #1"] == (0, 16.0)
    assert main(["--chain", str(path), str(path)]) == 0
    out = capsys.readouterr().out
    assert "moe (2 / 2 sublayers)" in out and out.count("router #1") == 1
    starts = launch_chains(step, "start")   # the same launches, each at its start
    assert [[key for key, _, _ in rows] for _, rows in starts] == [[key for key, _, _ in rows] for _, rows in chains]
    assert all(s <= e for (_, a), (_, b) in zip(starts, chains) for (_, _, s), (_, _, e) in zip(a, b))
    assert chain_table(str(path), "start")["moe"][1]["hc #1"][1] < moe[1]["hc #1"][1]
    assert main(["--chain", "--starts", str(path)]) == 0
    out = capsys.readouterr().out
    assert "median start .. end" in out and out.count(" .. ") >= 4


def test_json_summary_of_any_number_of_timelines(tmp_path, capsys):
    """--json: per file the step span, the per-kind spans and the per-kind chains, as one list."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"kernels": STEP, "step_span_us": {"median": 70.0, "min": 69.0, "max": 72.0, "each": [70.0]}}))
    assert main(["--json", str(path), str(path), str(path)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert len(got) == 3 and got[0]["step_span_us"] == {"median": 70.0, "min": 69.0, "max": 72.0}
    assert got[0]["sublayers"]["moe"] == {"count": 1, "median_us": 16.0, "min_us": 16.0, "max_us": 16.0}
    kda = got[0]["chains"]["kda attention"]
    assert kda["count"] == 1 and [r["launch"] for r in kda["launches"]] == ["w4a16_gemv #1", "kda_recurrent #1",
                                                                             "glm_mhc #1"]
    assert kda["launches"][-1]["end_us"] == 14.0
    assert main(["--json"]) == 2


def test_gates_issued_aside_are_not_boundaries():
    """The gates + Sinkhorn kernel a boundary leaves to the extra stream (family glm_mhc, rule
    aside:...) runs inside the next sublayer: it neither closes it nor names it."""
    aside = dict(_k("glm_mhc", 3.5, 1.0), rule="aside:fused:hc_boundary")
    assert sublayers(STEP[:2] + [aside] + STEP[2:]) == sublayers(STEP)


def test_kernel_after_it_is_ready(tmp_path, capsys):
    """--kernel: medians of a kernel's lateness (the timeline's late_us), duration and end after ready."""
    def k(name, late, dur):
        return {"family": "f", "kernel": name, "start_us": 0.0, "dur_us": dur, "late_us": late}
    kernels = [k("select", 0.0, 10.0), k("kbp::decode<1>", 1.0, 5.0), k("kbp::decode<1>", 0.5, 4.0),
               k("kbp::decode<1>", 0.25, 7.0)]
    got = after_ready(kernels, "decode")
    assert got == {"count": 3, "start_after_us": 0.5, "duration_us": 5.0, "end_after_us": 6.0}
    assert after_ready(kernels, "nothing") == {"count": 0}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"kernels": kernels}))
    assert main(["--kernel", "decode", str(path)]) == 0
    assert "3 x decode: starts 0.50 us after it is ready, runs 5.00 us, ends 6.00 us" in capsys.readouterr().out
    assert main(["--kernel", "decode"]) == 2


def test_neighbours_group_a_kernel_by_what_runs_before_and_after_it(tmp_path, capsys):
    """--neighbours: the launches of a kernel grouped by the kernels before and after each on its
    stream (another stream's launches in between do not count), with after_ready's medians."""
    def k(kernel, stream, late, dur):
        return {"kernel": f"kbp::{kernel}<4>", "stream": stream, "late_us": late, "dur_us": dur,
                "family": "x", "start_us": 0.0}
    step = [k("proj", 0, -5.0, 20.0), k("hc_boundary", 0, 0.5, 9.0), k("six_seg", 0, -7.0, 26.0),
            k("shared", 1, 7.0, 11.0), k("hc_boundary", 0, 0.4, 6.0), k("router", 0, -4.0, 12.0),
            k("proj", 0, -5.0, 20.0), k("hc_boundary", 0, 0.6, 8.0), k("six_seg", 0, -7.0, 26.0),
            k("hc_boundary", 0, 0.2, 5.0)]
    got = by_neighbours(step, "hc_boundary")
    assert got[("proj", "six_seg")] == {"count": 2, "start_after_us": 0.55, "duration_us": 8.5, "end_after_us": 9.05}
    assert got[("six_seg", "router")]["duration_us"] == 6.0 and got[("six_seg", "")]["count"] == 1
    assert sum(r["count"] for r in got.values()) == 4
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"kernels": step}))
    assert main(["--neighbours", "hc_boundary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "after proj" in out and "before six_seg" in out and "runs   8.50" in out
    assert main(["--neighbours", "hc_boundary"]) == 2
