"""Where the replayed step streams bytes and where DRAM waits, from a replay timeline
(`scripts/gpu-timeline.sh` JSON) and the bundle it was recorded from.

Each launch's bytes (kbpc/runtime/traffic.py `mark_bytes`: the weights and sequence state of the
nodes it computes, and its group's activation buffers) are spread evenly over its run in the
median replay, from when its dependencies had ended (a launch that programmatic dependent launch
started early spends the time before that mostly waiting in its pdl_wait; the timeline's
`late_us` is start minus ready) to its end; their sum over the launches running at a moment is
the step's DRAM demand then.
The report gives:
- the step's bytes over its span (the share of the bandwidth the whole step averages);
- the span split by demand: under LOW of the bandwidth (latency-bound: what runs is waiting on
  hand-offs, reductions, launches), between, and over HIGH (streaming);
- per rule (the launch's fusion rule or group form), its bytes, its launches' summed run time,
  its in-step bandwidth (bytes over run time), and the low-demand time it holds: each moment under
  LOW is shared evenly by the launches running then, or booked to "(no kernel)". That last column
  is the step's latency budget by owner: what to shorten, or to overlap with weight streams.

    PYTHONPATH=. python3 bench/timeline_bandwidth.py TIMELINE.json BUNDLE.kbp --trust KEY.pub.json \\
        [--bandwidth 4.3] [--top 25] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

IDLE = "(no kernel)"


@dataclass(frozen=True)
class Run:
    name: str        # what the report groups by (the launch's rule)
    start: float     # us in the median replay
    dur: float       # us
    nbytes: float    # bytes the launch moves per step


def demand_profile(runs: list[Run], bandwidth: float, low: float = 0.25, high: float = 0.75) -> dict:
    """`bandwidth` in bytes per us. Sweeps the elementary intervals between run starts and ends."""
    edges = sorted({t for r in runs for t in (r.start, r.start + r.dur)})
    band = {"low": 0.0, "mid": 0.0, "high": 0.0}
    low_time: dict[str, float] = defaultdict(float)
    for t0, t1 in zip(edges, edges[1:]):
        live = [r for r in runs if r.start <= t0 and r.start + r.dur >= t1 and r.dur > 0]
        demand = sum(r.nbytes / r.dur for r in live) / bandwidth
        width = t1 - t0
        if demand < low:
            band["low"] += width
            owners = [r.name for r in live] or [IDLE]
            for name in owners:
                low_time[name] += width / len(owners)
        elif demand > high:
            band["high"] += width
        else:
            band["mid"] += width
    per: dict[str, dict] = defaultdict(lambda: {"launches": 0, "bytes": 0.0, "run_us": 0.0})
    for r in runs:
        p = per[r.name]
        p["launches"] += 1
        p["bytes"] += r.nbytes
        p["run_us"] += r.dur
    for name, p in per.items():
        p["tb_per_s"] = p["bytes"] / p["run_us"] / 1e6 if p["run_us"] > 0 else 0.0
        p["low_demand_us"] = low_time.get(name, 0.0)
    if IDLE in low_time:
        per[IDLE] = {"launches": 0, "bytes": 0.0, "run_us": 0.0, "tb_per_s": 0.0, "low_demand_us": low_time[IDLE]}
    span = (max(r.start + r.dur for r in runs) - min(r.start for r in runs)) if runs else 0.0
    total = sum(r.nbytes for r in runs)
    return {"span_us": span, "bytes": total, "mean_tb_per_s": total / span / 1e6 if span else 0.0,
            "bandwidth_tb_per_s": bandwidth / 1e6, "low": low, "high": high, "band_us": band,
            "rules": dict(per)}


def runs_of(timeline: dict, launch_bytes: list[float]) -> list[Run]:
    kernels = timeline["kernels"]
    if len(kernels) != len(launch_bytes):
        raise SystemExit(f"the timeline has {len(kernels)} launches, the bundle marks {len(launch_bytes)}: "
                         "not the bundle it was recorded from")
    out = []
    for k, b in zip(sorted(kernels, key=lambda k: k["launch"]), launch_bytes):
        start, end = float(k["start_us"]), float(k["start_us"]) + float(k["dur_us"])
        ready = min(start - min(float(k.get("late_us", 0.0)), 0.0), end)   # after an early start: its wait
        out.append(Run(k.get("rule") or k["family"], ready, end - ready, float(b)))
    return out


def bundle_launch_bytes(bundle: Path, trust: list[Path], context: int) -> list[float]:
    from kbpc.bundle.keystore import trusted_keyring
    from kbpc.runtime.bundle_model import load_bundle_model
    from kbpc.runtime.traffic import mark_bytes

    model = load_bundle_model(bundle, trusted_keyring(tuple(trust)))
    try:
        plan = model.bundle.read_json("plan.json")
        if not model.run.marks:
            raise SystemExit("the bundle has no per-launch profile marks (built before they existed)")
        return mark_bytes(model.blueprint, plan, context, model.run.marks)
    finally:
        model.bundle.close()


def render(report: dict, top: int) -> str:
    b = report["band_us"]
    span = report["span_us"] or 1.0
    lines = [f"step span {report['span_us']:.1f} us, {report['bytes'] / 1e6:.1f} MB: "
             f"{report['mean_tb_per_s']:.2f} TB/s on average ({100 * report['mean_tb_per_s'] / report['bandwidth_tb_per_s']:.1f}%"
             f" of {report['bandwidth_tb_per_s']:.2f})",
             f"demand under {100 * report['low']:.0f}% of the bandwidth {b['low']:.1f} us ({100 * b['low'] / span:.1f}%), "
             f"between {b['mid']:.1f} us ({100 * b['mid'] / span:.1f}%), over {100 * report['high']:.0f}% "
             f"{b['high']:.1f} us ({100 * b['high'] / span:.1f}%)",
             f"{'rule':<44} {'launches':>8} {'MB':>8} {'run us':>9} {'TB/s':>6} {'low-demand us':>14}"]
    rows = sorted(report["rules"].items(), key=lambda kv: -kv[1]["low_demand_us"])
    for name, p in rows[:top]:
        lines.append(f"{name[:44]:<44} {p['launches']:>8} {p['bytes'] / 1e6:>8.1f} {p['run_us']:>9.1f} "
                     f"{p['tb_per_s']:>6.2f} {p['low_demand_us']:>14.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("timeline", type=Path)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--trust", type=Path, action="append", default=[], help="trusted public key file(s)")
    ap.add_argument("--bandwidth", type=float, default=4.3, help="TB/s the demand is measured against")
    ap.add_argument("--low", type=float, default=0.25)
    ap.add_argument("--high", type=float, default=0.75)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    timeline = json.loads(args.timeline.read_text())
    launch_bytes = bundle_launch_bytes(args.bundle, args.trust, int(timeline.get("context", 1024)))
    report = demand_profile(runs_of(timeline, launch_bytes), args.bandwidth * 1e6, args.low, args.high)
    print(render(report, args.top))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
