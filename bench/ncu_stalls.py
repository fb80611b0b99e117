"""Where a kernel's warps wait, from Nsight Compute's per-instruction source page.

Reads the CSV that `ncu ... --section SourceCounters --page source --csv --print-source sass` writes
(lines before the table, such as the profiled program's own output, are skipped; each kernel's table
starts at its `Address` header row) and prints, per kernel:
  - the warp-stall samples by reason (the `stall_*` columns, issued and not issued together);
  - the code regions holding at least --min-share of the samples: the code split into --windows
    equal runs of instructions, each with its share, how often its first instruction ran, the
    instruction with the most samples and the three largest reasons.
Samples count warps, so in a kernel whose warps all live to the end a region's share is its share
of the time; a region that few warps execute weighs less than its time. Sample finely with
`--warp-sampling-interval 0` (a short kernel gets a few hundred samples otherwise).

Usage: python3 bench/ncu_stalls.py SASS.csv [--windows 40] [--min-share 0.02] [--json]
(the GPU side: scripts/gpu-ncu.sh, with BUNDLE for a kernel inside a step).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import asdict, dataclass, field

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


@dataclass
class Region:
    first: int          # index of its first instruction
    share: float        # of the kernel's samples
    executed: int       # warp-level executions of its first instruction
    top: str            # the instruction with the most samples
    reasons: list[tuple[str, int]]


@dataclass
class KernelStalls:
    instructions: int
    samples: int
    reasons: list[tuple[str, int]]
    regions: list[Region] = field(default_factory=list)


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def tables(lines: list[str]) -> list[tuple[list[str], list[list[str]]]]:
    """(header, rows) of every source table in the export."""
    out: list[tuple[list[str], list[list[str]]]] = []
    for row in csv.reader(lines):
        if row and row[0] == "Address":
            out.append((row, []))
        elif out and len(row) == len(out[-1][0]):
            out[-1][1].append(row)
    return out


def summarize(header: list[str], rows: list[list[str]], windows: int = 40, min_share: float = 0.02) -> KernelStalls:
    col = {name: i for i, name in enumerate(header)}
    if SAMPLES not in col:
        raise ValueError(f"no '{SAMPLES}' column: export with --section SourceCounters")
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples = [_num(r[col[SAMPLES]]) for r in rows]
    total = sum(samples)

    def by_reason(part: list[list[str]]) -> list[tuple[str, int]]:
        counts = {h.removeprefix("stall_"): int(sum(_num(r[col[h]]) for r in part)) for h in reasons}
        return sorted(((k, v) for k, v in counts.items() if v), key=lambda kv: -kv[1])

    result = KernelStalls(len(rows), int(total), by_reason(rows))
    step = max(1, -(-len(rows) // max(1, windows)))
    for first in range(0, len(rows), step):
        part, got = rows[first:first + step], samples[first:first + step]
        if not total or sum(got) < min_share * total:
            continue
        top = part[max(range(len(part)), key=lambda i: got[i])][col["Source"]].strip()
        result.regions.append(Region(first, sum(got) / total, int(_num(part[0][col[EXECUTED]]))
                                     if EXECUTED in col else 0, top, by_reason(part)[:3]))
    return result


def render(k: KernelStalls) -> str:
    lines = [f"{k.instructions} instructions, {k.samples} samples: "
             + ", ".join(f"{name} {n}" for name, n in k.reasons[:10])]
    for r in k.regions:
        why = ", ".join(f"{name} {n}" for name, n in r.reasons)
        lines.append(f"  @{r.first:<6d} {100 * r.share:5.1f}%  ran {r.executed:<6d} {r.top[:56]:56s} {why}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--windows", type=int, default=40, help="code regions the instructions are split into")
    ap.add_argument("--min-share", type=float, default=0.02, help="smallest share of the samples a region printed holds")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args(argv)
    with open(args.csv, encoding="utf-8", errors="replace") as f:
        found = tables(f.read().splitlines())
    if not found:
        print(f"{args.csv}: no source table (an 'Address' header row)", file=sys.stderr)
        return 1
    kernels = [summarize(h, rows, args.windows, args.min_share) for h, rows in found]
    if args.json:
        print(json.dumps([asdict(k) for k in kernels], indent=1))
    else:
        print("\n\n".join(f"kernel {i}: {render(k)}" for i, k in enumerate(kernels)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
