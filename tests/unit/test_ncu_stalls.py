"""bench/ncu_stalls.py on a synthetic Nsight Compute source export whose sums are worked out by hand."""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from ncu_stalls import main, summarize, tables  # noqa: E402

HEADER = ("Address,Source,Warp Stall Sampling (All Samples),Instructions Executed,"
          "stall_barrier,stall_long_sb,stall_barrier (Not Issued)")
ROWS = ["0x0,LDG.E R1,10,8,0,10,0",      # region 0: 10 samples, all long_sb
        "0x10,PRMT R2,0,8,0,0,0",
        "0x20,BAR.SYNC 0x0,60,8,55,5,9",  # region 1: 60 of barrier and long_sb
        "0x30,FADD R3,2,4,0,0,0",         # region 1 too (windows of 2): 62 in all
        "0x40,EXIT,1,8,1,0,0"]             # region 2: 1 sample, under 2% of 73


def _export(tmp_path, *blocks):
    text = "==PROF== Connected to process 1\nsome program output, with, commas\n"
    text += "".join(f'"Kernel {i}"\n{HEADER}\n' + "\n".join(ROWS) + "\n" for i in range(blocks[0]))
    path = tmp_path / "sass.csv"
    path.write_text(text)
    return path


def test_reasons_and_regions_by_hand(tmp_path):
    ((header, rows),) = tables(_export(tmp_path, 1).read_text().splitlines())
    k = summarize(header, rows, windows=3, min_share=0.02)
    assert (k.instructions, k.samples) == (5, 73)
    assert k.reasons == [("barrier", 56), ("long_sb", 15)]      # the Not Issued column is not added twice
    assert [(r.first, round(r.share, 4), r.executed, r.top) for r in k.regions] == [
        (0, round(10 / 73, 4), 8, "LDG.E R1"), (2, round(62 / 73, 4), 8, "BAR.SYNC 0x0")]
    assert k.regions[1].reasons == [("barrier", 55), ("long_sb", 5)]


def test_every_kernel_of_the_export_and_json(tmp_path, capsys):
    path = _export(tmp_path, 2)
    assert main([str(path), "--windows", "3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert len(got) == 2 and all(k["samples"] == 73 for k in got)


def test_an_export_without_a_source_table_is_an_error(tmp_path, capsys):
    path = tmp_path / "details.txt"
    path.write_text("Duration,us,9.8\n")
    assert main([str(path)]) == 1
    assert "no source table" in capsys.readouterr().err
