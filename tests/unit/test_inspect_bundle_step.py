"""`kbpc inspect BUNDLE`: the manifest's step record as one readable line and its fusion report as
tables (the launches before and after fusion, each rule applied, each kind of candidate left apart
with its reason), and any other shape an untrusted bundle's manifest may hold shown without a crash
and without reading its strings as markup."""
from __future__ import annotations

import json

import pytest
from rich.console import Console

from kbpc.bundle.container import Member, open_bundle, write_bundle
from kbpc.bundle.keys import Keyring, Signer
from kbpc.bundle.keystore import generate_keys
from kbpc.report.inspect_bundle import fusion_line, render_bundle_summary, step_line, summarize_bundle

REASON = "opt-in (--fuse-rule moe_layer): measured slower in the step [/] [bold]x[/bold]"
STEP = {"arena_bytes": 317952, "critical_path_us": 3366.899, "events": 150, "groups": 524, "kernel_instances": 34,
        "launches": 650, "priority_launches": 500, "serial_us": 3695.562, "streams": 3, "vocab": 154880,
        "fusion": {"launches_before": 1000, "launches_after": 650, "applied": {"hc_boundary": 48, "kda_conv_gates": 34},
                   "left_apart": [{"rule": "moe_layer", "groups": [1, 2], "applied": False, "reason": REASON}] * 3
                   + [{"rule": "moe_combine_hc", "groups": [9], "applied": False, "reason": "not convex"}]}}


def _summary(tmp_path, step) -> dict:
    keys = generate_keys(tmp_path / "keys")
    path = tmp_path / "model.kbp"
    manifest = {"blueprint_id": "bp", "plan_digest": "ab" * 32, "target": "sm_90", "tp_size": 1, "kind": "lite",
                "step": step}
    write_bundle(path, manifest, [Member("graph.json", b"{}")], Signer.load(keys.private))
    with open_bundle(path, Keyring.load(keys.public)) as b:
        return summarize_bundle(b)


def _text(summary: dict) -> str:
    console = Console(record=True, width=400)
    render_bundle_summary(summary, console)
    return console.export_text()


def test_step_and_fusion_are_readable(tmp_path):
    s = _summary(tmp_path, STEP)
    assert s["step"] == STEP and json.loads(json.dumps(s))["step"] == STEP   # --json keeps the record whole
    text = _text(s)
    assert ("650 launches in 524 groups on 3 streams (150 events, 500 at high priority); 34 kernel instances; "
            "vocabulary 154,880; arena 317.95 KB; modelled critical path 3,366.9 us (serial 3,695.6 us)") in text
    assert "1,000 -> 650 launches per step; 2 rules applied (82 merges), 4 candidates left apart" in text
    assert "Fusion rules applied" in text and "hc_boundary" in text and "48" in text
    rows = [line for line in text.splitlines() if "moe_layer" in line]
    assert len(rows) == 1 and " 3 " in rows[0] and REASON in rows[0]   # one row per rule and reason, markup literal
    assert text.index("moe_layer") < text.index("moe_combine_hc")      # the most frequent refusal first


@pytest.mark.parametrize("step", [
    None, "a string [/]", [1, 2, {"x": 3}], {"launches": "many", "groups": True, "fusion": "none"},
    {"launches": 3, "fusion": {"applied": [1], "left_apart": {}}},
    {"fusion": {"applied": {"r": "x"}, "left_apart": [1, "two", {"rule": ["x"], "reason": {"a": 1}}]}},
    {"critical_path_us": 1e308, "serial_us": "slow", "extra": {"nested": [None]}},
])
def test_any_step_shape_renders(tmp_path, step):
    """What an untrusted bundle's manifest may hold instead of the compiler's record: shown as it is,
    never a crash, never markup."""
    text = _text(_summary(tmp_path, step))
    assert "Bundle" in text
    if isinstance(step, str):
        assert step in text


def test_step_line_and_fusion_line_by_themselves():
    assert step_line({"launches": 5}) == "5 launches"
    assert step_line({}) == "-" and step_line(7) == "7"
    assert fusion_line({"applied": {}, "left_apart": []}) == "0 rules applied (0 merges), 0 candidates left apart"
    assert fusion_line({"applied": {}}) is None and fusion_line(None) is None
