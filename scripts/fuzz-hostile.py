#!/usr/bin/env python3
"""A larger hostile-input campaign (issue 11): mutated bundles, signatures, manifests, blueprints,
configs, keys and keyrings fed to the kbpc commands that read them (kbpc/testing/hostile.py), in
worker processes under a memory limit, and the figures: cases tried, refused cleanly, accepted
(the mutation left the input valid), crashed, hung.

    scripts/fuzz-hostile.py --cases 5000 --seed 0 [--memory-gib 2] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHUNK = 500   # cases per worker process: a leak or a limit hit stays local to one chunk


def run_chunk(cases: int, seed: int, memory_bytes: int, per_case_seconds: int) -> dict:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    cmd = [sys.executable, "-m", "kbpc.testing.hostile", "--cases", str(cases), "--seed", str(seed),
           "--per-case-seconds", str(per_case_seconds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, cwd=REPO,
                          timeout=cases * per_case_seconds + 120)
    if proc.returncode != 0:
        return {"tried": cases, "refused": 0, "accepted": 0, "crashed": cases, "hung": 0, "worst_seconds": 0,
                "failures": [f"worker for seed {seed} exited {proc.returncode}: {proc.stderr[-500:]}"]}
    return json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-gib", type=float, default=2.0, help="address-space limit per worker")
    parser.add_argument("--per-case-seconds", type=int, default=20, help="a case over this is hung")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    total = {"tried": 0, "refused": 0, "accepted": 0, "crashed": 0, "hung": 0, "worst_seconds": 0.0,
             "by_kind": {}, "failures": []}
    t0 = time.perf_counter()
    done, chunk_index = 0, 0
    while done < args.cases:
        n = min(CHUNK, args.cases - done)
        part = run_chunk(n, args.seed * 100003 + chunk_index, int(args.memory_gib * (1 << 30)),
                         args.per_case_seconds)
        for key in ("tried", "refused", "accepted", "crashed", "hung"):
            total[key] += part[key]
        total["worst_seconds"] = max(total["worst_seconds"], part["worst_seconds"])
        for kind, count in part.get("by_kind", {}).items():
            total["by_kind"][kind] = total["by_kind"].get(kind, 0) + count
        total["failures"] += part["failures"]
        done += n
        chunk_index += 1
        print(f"  {done}/{args.cases} cases, {total['crashed']} crashed, {total['hung']} hung", file=sys.stderr)
    total["wall_seconds"] = round(time.perf_counter() - t0, 1)
    total["memory_limit_gib"] = args.memory_gib
    print(f"cases tried:      {total['tried']}  ({', '.join(f'{k} {v}' for k, v in total['by_kind'].items())})")
    print(f"refused cleanly:  {total['refused']}")
    print(f"accepted (valid): {total['accepted']}")
    print(f"crashed:          {total['crashed']}")
    print(f"hung (> {args.per_case_seconds} s):   {total['hung']}")
    print(f"slowest case:     {total['worst_seconds']:.2f} s; wall {total['wall_seconds']} s; "
          f"memory limit {args.memory_gib} GiB per worker")
    for failure in total["failures"][:20]:
        print(f"  {failure}")
    if args.json:
        args.json.write_text(json.dumps(total, indent=1) + "\n")
    return 1 if total["crashed"] or total["hung"] else 0


if __name__ == "__main__":
    sys.exit(main())
