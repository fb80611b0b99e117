"""Progress of a compile on stderr (stdout stays for the result or the JSON report)."""
from __future__ import annotations

import time

from rich.progress import Progress

from kbpc.report.render import console
from kbpc.toolchain.library import BuildEvents


class CompileProgress(BuildEvents):
    """A rich progress display of the stages and objects; records each stage's duration."""

    def __init__(self):
        self._stages: list[tuple[str, float]] = []
        self._progress = Progress(console=console(stderr=True), transient=True)
        self._stage = self._objects = None

    def __enter__(self) -> "CompileProgress":
        self._progress.__enter__()
        self._stage = self._progress.add_task("starting", total=None)
        self._objects = self._progress.add_task("nvcc", total=None, visible=False)
        return self

    def __exit__(self, *exc) -> None:
        self.stage(None)
        self._progress.__exit__(*exc)

    def stage(self, name: str | None) -> None:
        now = time.perf_counter()
        if self._stages and self._stages[-1][1] < 0:   # close the running stage
            self._stages[-1] = (self._stages[-1][0], now + self._stages[-1][1])
        if name is not None:
            self._stages.append((name, -now))
            self._progress.update(self._stage, description=name)

    def objects(self, total: int) -> None:
        self._progress.update(self._objects, total=total, visible=True)

    def object_done(self, name: str, cached: bool) -> None:
        self._progress.update(self._objects, advance=1, description=f"nvcc {name.rsplit('/', 1)[-1][:48]}")

    def stage_times(self) -> list[tuple[str, float]]:
        return [(name, max(0.0, t)) for name, t in self._stages]
