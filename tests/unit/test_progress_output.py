"""CI logs: without a terminal a compile prints plain progress lines (each stage, objects done of
total) and reports are not cut at 80 columns; in a terminal the progress bar shows counts, elapsed
time and time left."""
from __future__ import annotations

import io

from click.testing import CliRunner
from rich.progress import MofNCompleteColumn, TimeRemainingColumn

from kbpc.cli import main
from kbpc.report.progress import CompileProgress


def _replay(progress: CompileProgress, total: int) -> None:
    with progress:
        for stage in ("front end", "passes", "code generation", "nvcc"):
            progress.stage(stage)
        progress.objects(total)
        for i in range(total):
            progress.object_done(f"src/kernels/k{i}.cu", cached=i % 3 == 0)
        progress.stage("bundle")


def test_lines_without_a_terminal():
    out = io.StringIO()
    progress = CompileProgress(terminal=False, stream=out)
    _replay(progress, 37)
    lines = out.getvalue().splitlines()
    assert all(line.startswith("kbpc: [") for line in lines)
    for stage in ("front end", "passes", "code generation", "nvcc", "bundle"):
        assert any(line.endswith(f"stage: {stage}") for line in lines)
    counts = [line for line in lines if "objects done" in line]
    assert 5 <= len(counts) <= 12                       # about one per tenth, not one per object
    assert counts[-1].endswith("37/37 objects done (13 from the cache, 24 compiled)")
    assert [name for name, _ in progress.stage_times()] == ["front end", "passes", "code generation", "nvcc",
                                                            "bundle"]
    assert all(seconds >= 0 for _, seconds in progress.stage_times())


def test_bar_in_a_terminal_shows_counts_and_time_left():
    progress = CompileProgress(terminal=True)
    columns = progress._progress.columns
    assert any(isinstance(c, MofNCompleteColumn) for c in columns)
    assert any(isinstance(c, TimeRemainingColumn) for c in columns)


def test_tables_are_not_cut_without_a_terminal(seed_path):
    result = CliRunner().invoke(main, ["inspect", str(seed_path)])   # CliRunner: not a terminal
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    assert max(len(line) for line in result.output.splitlines()) > 80
