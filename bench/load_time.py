"""Time loading and checking a blueprint (front end only): median of several cold-ish runs.

    python3 bench/load_time.py [BLUEPRINT] [--runs N]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from kbpc.frontend.load import load_blueprint

SEED = Path(__file__).resolve().parents[1] / "examples" / "glm-5.3-flash-nvfp4-tp3-512k.decode1.graph.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("blueprint", nargs="?", type=Path, default=SEED)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        load_blueprint(args.blueprint)
        times.append(time.perf_counter() - t0)
    print(f"load+check {args.blueprint.name}: median {statistics.median(times) * 1e3:.0f} ms, "
          f"min {min(times) * 1e3:.0f} ms over {args.runs} runs")


if __name__ == "__main__":
    main()
