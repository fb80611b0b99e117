"""Progress of a compile on stderr (stdout stays for the result or the JSON report).

In a terminal: a live display of the stage and a bar of objects with counts, elapsed time and time
left. Without one (CI logs, pipes): plain lines that a log keeps, one per stage and one per tenth
of the objects (or every 15 seconds), each with the counts and the time so far."""
from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from kbpc.report.render import console
from kbpc.toolchain.library import BuildEvents

_LINE_EVERY_S = 15.0


class CompileProgress(BuildEvents):
    """Shows a compile's progress and records each stage's duration (for the build report)."""

    def __init__(self, terminal: bool | None = None, stream: TextIO | None = None):
        err = console(stderr=True)
        self.terminal = err.is_terminal if terminal is None else terminal
        self._stream = stream or sys.stderr
        self._stages: list[tuple[str, float]] = []
        self._t0 = time.perf_counter()
        self._total = self._done = self._cached = 0
        self._last_line = 0.0
        self._progress = None
        self._lock = threading.Lock()   # objects are reported from the nvcc worker threads
        if self.terminal:
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                                      console=err, transient=True)

    def __enter__(self) -> "CompileProgress":
        if self._progress is not None:
            self._progress.__enter__()
            self._stage_task = self._progress.add_task("starting", total=None)
            self._objects_task = self._progress.add_task("objects", total=None, visible=False)
        return self

    def __exit__(self, *exc) -> None:
        self._close_stage()
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def _line(self, text: str) -> None:
        print(f"kbpc: [{time.perf_counter() - self._t0:6.1f} s] {text}", file=self._stream, flush=True)

    def _close_stage(self) -> None:
        now = time.perf_counter()
        if self._stages and self._stages[-1][1] < 0:
            self._stages[-1] = (self._stages[-1][0], now + self._stages[-1][1])

    def stage(self, name: str) -> None:
        self._close_stage()
        self._stages.append((name, -time.perf_counter()))
        if self._progress is not None:
            self._progress.update(self._stage_task, description=name)
        else:
            self._line(f"stage: {name}")

    def objects(self, total: int) -> None:
        self._total = total
        self._last_line = time.perf_counter()
        if self._progress is not None:
            self._progress.update(self._objects_task, total=total, visible=True)
        else:
            self._line(f"nvcc: {total} objects to build or take from the cache")

    def object_done(self, name: str, cached: bool) -> None:
        with self._lock:
            self._done += 1
            self._cached += cached
            if self._progress is not None:
                self._progress.update(self._objects_task, advance=1,
                                      description=f"objects ({self._cached} cached) {name.rsplit('/', 1)[-1][:40]}")
                return
            now = time.perf_counter()
            step = max(1, -(-self._total // 10))   # a line per tenth
            if self._done == self._total or self._done % step == 0 or now - self._last_line >= _LINE_EVERY_S:
                self._last_line = now
                self._line(f"nvcc: {self._done}/{self._total} objects done ({self._cached} from the cache, "
                           f"{self._done - self._cached} compiled)")

    def stage_times(self) -> list[tuple[str, float]]:
        return [(name, max(0.0, t)) for name, t in self._stages]
