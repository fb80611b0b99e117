"""bench/timeline_bandwidth.py on synthetic runs whose demand bands are worked out by hand."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from timeline_bandwidth import IDLE, Run, demand_profile, render, runs_of  # noqa: E402

BW = 100.0   # bytes per us


def test_bands_and_low_demand_owners():
    runs = [Run("boundary", 0.0, 4.0, 40.0),      # 10 B/us alone: low (0.1)
            Run("stream", 4.0, 10.0, 900.0),      # 90 B/us: high
            Run("side", 8.0, 4.0, 40.0),          # beside the stream: 100 B/us, still high
            Run("tail", 16.0, 2.0, 0.0)]          # after 2 us with no kernel: low
    r = demand_profile(runs, BW)
    assert r["span_us"] == 18.0 and r["bytes"] == 980.0
    assert r["band_us"] == {"low": 8.0, "mid": 0.0, "high": 10.0}
    rules = r["rules"]
    assert rules["boundary"]["low_demand_us"] == 4.0 and rules["stream"]["low_demand_us"] == 0.0
    assert rules["tail"]["low_demand_us"] == 2.0 and rules[IDLE]["low_demand_us"] == 2.0
    assert rules["stream"]["tb_per_s"] == pytest.approx(90.0 / 1e6)
    assert sum(p["low_demand_us"] for p in rules.values()) == r["band_us"]["low"]


def test_shared_low_time_and_mid_band():
    runs = [Run("a", 0.0, 10.0, 100.0), Run("b", 0.0, 10.0, 100.0),   # 20 B/us together: low, shared
            Run("c", 10.0, 10.0, 500.0)]                               # 50 B/us: mid
    r = demand_profile(runs, BW)
    assert r["band_us"] == {"low": 10.0, "mid": 10.0, "high": 0.0}
    assert r["rules"]["a"]["low_demand_us"] == r["rules"]["b"]["low_demand_us"] == 5.0
    assert "(no kernel)" not in r["rules"]
    text = render(r, 10)
    assert "a " in text and "demand under 25%" in text


def test_runs_start_when_ready_and_must_match_the_bundle():
    kernels = [{"launch": 1, "rule": "gemv", "family": "w4a16_gemv", "start_us": 2.0, "dur_us": 10.0, "late_us": -3.0},
               {"launch": 0, "rule": None, "family": "glm_mhc", "start_us": 0.0, "dur_us": 5.0, "late_us": 1.0}]
    runs = runs_of({"kernels": kernels}, [8.0, 70.0])
    assert runs == [Run("glm_mhc", 0.0, 5.0, 8.0), Run("gemv", 5.0, 7.0, 70.0)]   # PDL-early: from ready
    with pytest.raises(SystemExit):
        runs_of({"kernels": kernels}, [1.0])
