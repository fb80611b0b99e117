"""How late the step's kernels start, from a replay timeline (`scripts/gpu-timeline.sh` JSON): for
every (rule, kernel, first launch after an event wait or not), the launches, the median and the sum
of start minus ready, where ready is when everything the launch depends on had ended (the previous
launch on its stream, and the launches that recorded the events it waited for). Large positive sums
are kernels that waited beyond their dependencies: for free SMs behind a wide kernel on another
stream, or for a launch; negative medians are kernels PDL let start early.

    python3 bench/timeline_delays.py TIMELINE.json [--step STEP.cu] [--top N]

Timelines written since this tool carry `late_us` per launch (medians over the replays of each
launch's own lateness). For an older timeline, --step names the step program it was recorded from
(the bundle's src/step.cu): lateness is then worked out from the median start and duration of each
launch, an approximation.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timeline_launches import TimelineError, launch_table  # noqa: E402
from timeline_summary import lateness  # noqa: E402


def late_by_launch(kernels: list[dict], step_cu: str | None) -> dict[int, float]:
    """launch index -> late_us: the timeline's own, or from its medians and the step program."""
    if all("late_us" in k for k in kernels):
        return {k["launch"]: k["late_us"] for k in kernels}
    if step_cu is None:
        raise TimelineError("this timeline has no late_us (recorded before bench/timeline_delays.py): "
                            "pass --step with the bundle's src/step.cu")
    rows = launch_table(step_cu, {})
    times = {k["launch"]: (k["start_us"], k["start_us"] + k["dur_us"]) for k in kernels}
    return lateness(times, rows)


def delays(kernels: list[dict], late: dict[int, float]) -> list[tuple[str, str, bool, int, float, float]]:
    """(rule, kernel, after_wait, launches, median late_us, sum of late_us), largest sum first."""
    by = defaultdict(list)
    for k in kernels:
        if k["launch"] in late:
            by[(k["rule"], k["kernel"], bool(k["after_wait"]))].append(late[k["launch"]])
    rows = [(r, n, w, len(v), statistics.median(v), sum(v)) for (r, n, w), v in by.items()]
    return sorted(rows, key=lambda x: -x[5])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("timeline", type=Path)
    ap.add_argument("--step", type=Path, help="the step program (src/step.cu) of an older timeline's bundle")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    kernels = json.loads(args.timeline.read_text())["kernels"]
    try:
        late = late_by_launch(kernels, args.step.read_text() if args.step else None)
    except TimelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{'rule':<34}{'kernel':<56}{'wait':>5}{'n':>5}{'median us':>11}{'sum us':>9}")
    for rule, kernel, waited, n, med, total in delays(kernels, late)[:args.top]:
        print(f"{rule[:33]:<34}{kernel[:55]:<56}{'W' if waited else '':>5}{n:>5}{med:>11.2f}{total:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
