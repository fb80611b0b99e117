"""Per-family in-step medians from a replay timeline (`scripts/gpu-timeline.sh` JSON): for every
kernel name, the median duration and the median time from the end of the launch before it (in launch
order) to its own end: what the kernel adds to the step where it sits on the critical path.

    python3 bench/timeline_segments.py TIMELINE.json [OTHER.json]   # two files: side by side
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict


def segments(path: str) -> dict[str, tuple[int, float, float]]:
    """kernel name -> (launches, median duration us, median end-after-previous-end us)."""
    kernels = json.load(open(path))["kernels"]
    dur, after = defaultdict(list), defaultdict(list)
    prev_end = 0.0
    for k in kernels:
        end = k["start_us"] + k["dur_us"]
        name = k["kernel"].split("(")[0]
        dur[name].append(k["dur_us"])
        after[name].append(end - prev_end)
        prev_end = end
    return {n: (len(dur[n]), statistics.median(dur[n]), statistics.median(after[n])) for n in dur}


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__)
        return 2
    tables = [segments(p) for p in argv]
    # every kernel of either timeline (one a fusion replaced is absent from the other), by what it
    # adds to the first (or, absent there, the second)
    weight = {n: t[n][0] * t[n][2] for t in reversed(tables) for n in t}
    names = sorted(weight, key=lambda n: -weight[n])
    for n in names:
        cols = "".join(f"  {t[n][0]:4d} x dur {t[n][1]:7.2f} after {t[n][2]:7.2f}" if n in t else "  (absent)" + " " * 33
                       for t in tables)
        print(f"{n[:64]:64s}{cols}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
