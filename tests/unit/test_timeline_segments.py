"""bench/timeline_segments.py on a synthetic timeline whose medians are worked out by hand."""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from timeline_segments import main, segments  # noqa: E402


def _timeline(tmp_path, kernels):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"kernels": [{"kernel": k, "start_us": s, "dur_us": d} for k, s, d in kernels]}))
    return str(path)


def test_durations_and_time_after_the_previous_end(tmp_path):
    # a(0..2), b(1..5): b adds 3 after a's end; a again (6..7): 2 after b; b (6.5..10): 3 after a
    path = _timeline(tmp_path, [("kbp::a<1>(int)", 0.0, 2.0), ("kbp::b", 1.0, 4.0),
                                ("kbp::a<1>(int)", 6.0, 1.0), ("kbp::b", 6.5, 3.5)])
    got = segments(path)
    assert got["kbp::a<1>"] == (2, 1.5, 2.0)      # durations 2, 1; after 2 (from 0), 2
    assert got["kbp::b"] == (2, 3.75, 3.0)        # durations 4, 3.5; after 3, 3


def test_side_by_side_and_usage(tmp_path, capsys):
    one = _timeline(tmp_path, [("kbp::a", 0.0, 2.0)])
    assert main([one, one]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("kbp::a") and line.count("after") == 2
    assert main([]) == 2


def test_kernels_of_either_timeline_are_listed(tmp_path, capsys):
    """A kernel only the second timeline has (a fused form) is listed too, absent in the first."""
    first = _timeline(tmp_path, [("kbp::a", 0.0, 2.0)])
    second = tmp_path / "u.json"
    second.write_text(json.dumps({"kernels": [{"kernel": "kbp::b", "start_us": 0.0, "dur_us": 1.0}]}))
    assert main([first, str(second)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    by_name = {line.split()[0]: line for line in lines}
    assert set(by_name) == {"kbp::a", "kbp::b"}
    assert "(absent)" in by_name["kbp::b"] and by_name["kbp::b"].index("(absent)") < by_name["kbp::b"].index("after")
