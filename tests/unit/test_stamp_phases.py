"""Phase stamps (kernels/kbp_stamps.cuh) on the CPU: the profiling build's generated sources (each
TU defines KBP_STAMPS and exports its log, the step program lists them in the manifest's order, a
product build's sources are unchanged), the manifest field the runner reads, the record layout the
runner copies, and bench/stamp_phases.py's matching and summary on synthetic records whose numbers
are worked out by hand."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from kbpc.codegen.emit import generate
from kbpc.errors import BundleError
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.runtime.run_manifest import RunManifest
from kbpc.runtime.stamps import RECORD, TIMES

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from stamp_phases import by_instance, chain_table, chains, chrome_trace, match_launches, summarize, table  # noqa: E402
from timeline_launches import LaunchRow  # noqa: E402


@pytest.fixture(scope="module")
def tiny_sources(tiny_path):
    plan = run_pipeline(load_blueprint(Path(tiny_path)), Options())
    return generate(plan, "x"), generate(plan, "x", stamps=True)


def test_stamp_build_sources(tiny_sources):
    plain, stamped = tiny_sources
    assert plain.files.keys() == stamped.files.keys()
    names = [inst.name for inst in stamped.step.instances]
    for inst in names:
        p, s = plain.files[f"src/kernels/{inst}.cu"], stamped.files[f"src/kernels/{inst}.cu"]
        assert "KBP_STAMPS" not in p and "kbp_stamps_" not in p
        # the define comes before any include, so every header of the TU sees it
        assert s.index("#define KBP_STAMPS 1") < s.index("#include")
        assert f'extern "C" cudaError_t kbp_stamps_{inst}(void** log, void** count)' in s
        # the launcher is the same text
        assert p[p.index("cudaError_t kbp_launch_"):] in s
    step = stamped.files["src/step.cu"]
    assert "kbp_stamp_logs" not in plain.files["src/step.cu"]
    calls = re.findall(r"if \(kbp_stamps_(\w+)\(&logs\[(\d+)\], &counts\[(\d+)\]\)", step)
    assert [c[0] for c in calls] == names
    assert [int(c[1]) for c in calls] == [int(c[2]) for c in calls] == list(range(len(names)))
    assert f"if (n != {len(names)}) return -1;" in step


def test_stamp_macros_vanish_without_the_define():
    """A product build's kernels: every stamp macro expands to a no-op expression statement."""
    text = (REPO / "kernels" / "kbp_stamps.cuh").read_text()
    plain = text[text.index("#else"):text.index("#endif")]
    for macro in ("KBP_STAMP_BEGIN()", "KBP_STAMP(i)", "KBP_STAMP_END()"):
        assert f"#define {macro} ((void)0)" in plain


def test_record_layout_matches_the_device_struct():
    text = (REPO / "kernels" / "kbp_stamps.cuh").read_text()
    assert RECORD.itemsize == 80 and "sizeof(StampRecord) == 80" in text
    assert f"kStampTimes = {TIMES}" in text
    assert [RECORD.fields[f][1] for f in ("grid", "block", "smid", "t")] == [0, 8, 12, 16]


def _manifest(step_extra: dict) -> dict:
    return {"kind": "lite", "blueprint_id": "b", "plan_digest": "d", "target": "sm_90",
            "options": {"max_context": 16}, "library": {"rank0": "lib/rank0/libkbp.so"},
            "weights": [], "state": [], "step": {"launches": 1, "groups": 1, **step_extra}}


def test_manifest_stamps_field():
    assert RunManifest.from_json(_manifest({})).stamps is None
    assert RunManifest.from_json(_manifest({"stamps": ["a", "b"]})).stamps == ("a", "b")
    for bad in ("a", [1], [None], {"a": 1}):
        with pytest.raises(BundleError, match="step.stamps"):
            RunManifest.from_json(_manifest({"stamps": bad}))


def _row(index, instance, kernel, grid=(2, 1, 1)) -> LaunchRow:
    return LaunchRow(index, index, "r", "f", 0, instance, kernel, grid, (32, 1, 1), True, False)


LAUNCHES = [_row(0, "bnd", "kbp::mhc::hc_boundary<4>"), _row(1, "sel", "kbp::dsa_index_select<1>"),
            _row(2, "bnd", "kbp::mhc::hc_boundary<4>"), _row(3, "sel", "kbp::dsa_index_select<1>")]


def _records(rows: list[tuple[int, int, list[int]]]) -> np.ndarray:
    out = np.zeros(len(rows), RECORD)
    for i, (grid, block, t) in enumerate(rows):
        out[i]["grid"], out[i]["block"] = grid, block
        out[i]["t"] = t
    return out


def _replay(shift: int = 0) -> dict[str, np.ndarray]:
    """Two sublayers: boundary (grid ids 10, 30) then select (20, 40); times in ns."""
    def t(*v):
        return [x + shift if x else 0 for x in v]
    bnd = _records([(30, 0, t(9000, 0, 0, 0, 0, 0, 0, 9500)), (10, 1, t(1000, 1100, 1200, 0, 0, 0, 0, 2000)),
                    (10, 0, t(1000, 1100, 1300, 0, 0, 0, 0, 1800)), (30, 1, t(9100, 0, 0, 0, 0, 0, 0, 9700))])
    sel = _records([(20, 0, t(1500, 1600, 2100, 3000, 3500, 0, 0, 3600)),
                    (20, 1, t(1600, 1700, 2100, 3200, 3600, 5000, 5500, 6000)),
                    (40, 0, t(9200, 9300, 9800, 10700, 11000, 0, 0, 11100)),
                    (40, 1, t(9300, 9400, 9800, 10900, 11200, 12000, 12400, 12700))])
    return {"bnd": bnd, "sel": sel, "idle": np.zeros(0, RECORD)}


def test_match_launches_groups_by_grid_in_start_order():
    matched, notes = match_launches(_replay(), LAUNCHES)
    assert notes == []
    assert [(m.launch, m.instance, m.grid, m.ctas) for m in matched] == \
        [(0, "bnd", 10, 2), (1, "sel", 20, 2), (2, "bnd", 30, 2), (3, "sel", 40, 2)]
    assert matched[1].first(3) == 3000 and matched[1].last(3) == 3200 and matched[1].last(5) == 5000
    assert matched[1].first(5) == 5000 and matched[2].first(1) is None


def test_summary_is_read_after_each_sublayers_boundary():
    summary = summarize([_replay(), _replay(shift=100_000)], LAUNCHES)
    assert summary["schema"] == "kbpc-replay-stamps/v1" and summary["notes"] == [] and summary["replays"] == 2
    first_sel = summary["launches"][1]
    assert first_sel["launch"] == 1 and first_sel["replays"] == 2
    # anchored at the first boundary's end (2000 ns): wait left at 2100 by both CTAs -> 0.1 us
    assert first_sel["phases"]["2"] == {"first": 0.1, "median": 0.1, "last": 0.1, "ctas": 2}
    assert first_sel["phases"]["5"] == {"first": 3.0, "median": 3.0, "last": 3.0, "ctas": 1}
    assert first_sel["phases"]["7"]["last"] == 4.0
    # the first boundary is read from the replay's first stamp (1000 ns)
    assert summary["launches"][0]["phases"]["7"]["last"] == 1.0
    second_sel = summary["launches"][3]
    # anchored at the second boundary's end (9700 ns)
    assert second_sel["phases"]["7"]["last"] == pytest.approx(3.0)
    per = {e["instance"]: e for e in by_instance(summary)}
    assert per["sel"]["launches"] == 2
    assert per["sel"]["phases"]["7"]["last"] == pytest.approx(3.5)      # median of 4.0 and 3.0
    text = table(summary, "dsa_index_select")
    assert "dsa_index_select" in text and "hc_boundary" not in text and "wait out" in text


def test_launch_count_mismatch_is_a_note():
    replay = _replay()
    replay["sel"] = replay["sel"][:2]          # one select launch stamped, two in the program
    summary = summarize([replay], LAUNCHES)
    assert [l["instance"] for l in summary["launches"]] == ["bnd", "bnd"]
    assert summary["notes"] == ["sel: 1 launches stamped, 2 in the step program (left out)"]
    replay = _replay()
    replay["ghost"] = replay["sel"]
    _, notes = match_launches(replay, LAUNCHES)
    assert notes == ["ghost: 4 stamp records but no launch of it in the step program"]


def test_chrome_trace_puts_each_cta_on_its_sm():
    replay = _replay()
    replay["sel"]["smid"] = [3, 4, 3, 4]
    trace = chrome_trace(replay, LAUNCHES, "t")
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == 8
    first_sel = [e for e in slices if e["name"] == "dsa_index_select" and e["args"]["launch"] == 1]
    assert sorted((e["tid"], e["args"]["block"], e["ts"], e["dur"]) for e in first_sel) == \
        [(3, 0, 0.5, 2.1), (4, 1, 0.6, 4.4)]
    assert first_sel[0]["args"]["phase 3"] in (2.0, 2.2)


def test_chains_follow_each_sublayer_in_launch_order():
    rows = [LaunchRow(i, i, rule, fam, 0, inst, kern, (2, 1, 1), (32, 1, 1), True, False)
            for i, (inst, kern, rule, fam) in enumerate(
                [("bnd", "kbp::mhc::hc_boundary<4>", "hc_boundary", "glm_mhc"),
                 ("sel", "kbp::dsa_index_select<1>", "dsa_select", "dsa_indexer"),
                 ("bnd", "kbp::mhc::hc_boundary<4>", "hc_boundary", "glm_mhc"),
                 ("sel", "kbp::dsa_index_select<1>", "dsa_select", "dsa_indexer")])]
    summary = summarize([_replay(), _replay(shift=100_000)], rows)
    chained = chains(summary, rows)
    assert list(chained) == ["dsa attention"]          # the last select opens no closed sublayer
    entry = chained["dsa attention"]
    assert entry["sublayers"] == 1 and list(entry["launches"]) == ["dsa_select #1", "hc_boundary #1"]
    assert entry["launches"]["dsa_select #1"]["7"] == {"first": 1.6, "median": 2.8, "last": 4.0}
    assert entry["launches"]["hc_boundary #1"]["7"]["last"] == pytest.approx(7.7)
    text = chain_table(chained)
    assert text.splitlines()[0].startswith("dsa attention (1 sublayers)")
    assert "dsa_select #1" in text and "end 1.60/2.80/4.00" in text


class _FakeCuda:
    """Device memory as a dict of byte arrays, and the order of the driver calls StampLogs makes."""

    def __init__(self, sizes: dict[int, int]):
        self.mem = {addr: np.zeros(n, np.uint8) for addr, n in sizes.items()}
        self.calls: list[str] = []
        cuda = self

        class Context:
            @staticmethod
            def synchronize():
                cuda.calls.append("sync")
        self.Context = Context

    def memset_d32(self, addr, value, count):
        self.calls.append("memset")
        self.mem[addr][:4 * count].view(np.uint32)[:] = value

    def memset_d8(self, addr, value, count):
        self.calls.append("memset")
        self.mem[addr][:count] = value

    def memcpy_dtoh(self, dst, addr):
        dst.view(np.uint8)[:] = self.mem[addr][:dst.nbytes]


def test_stamp_logs_clear_then_read():
    from kbpc.runtime.stamps import CAPACITY, StampLogs

    class Lib:
        @staticmethod
        def kbp_stamp_logs(logs, counts, n):
            for i in range(n):
                logs[i], counts[i] = 1000 * (i + 1), 1000 * (i + 1) + 8
            return 0
    cuda = _FakeCuda({1000: CAPACITY * 80, 1008: 4, 2000: CAPACITY * 80, 2008: 4})
    logs = StampLogs(Lib, cuda, ("a", "b"))
    records = _records([(7, 0, [5, 0, 0, 0, 0, 0, 0, 9]), (7, 1, [6, 0, 0, 0, 0, 0, 0, 0])])
    cuda.mem[1000][:records.nbytes] = records.view(np.uint8)
    cuda.mem[1008].view(np.uint32)[0] = 2
    got = {log.instance: log for log in logs.read()}
    assert got["a"].began == 2 and got["a"].records["block"].tolist() == [0]   # the CTA that never ended is dropped
    assert got["b"].began == 0 and got["b"].records.size == 0
    logs.clear()
    assert cuda.calls == ["memset"] * 4 + ["sync"]   # synchronized before the next step is enqueued
    assert not cuda.mem[1000].any() and cuda.mem[1008].view(np.uint32)[0] == 0
    with pytest.raises(BundleError, match="--stamps"):
        StampLogs(Lib, cuda, None)
