"""What `kbpc bench` makes of a measurement, with no GPU involved (so it is tested on the CPU with a
made-up profile): the report (schema kbpc-bench/v1), a Chrome/Perfetto trace of the profiled step
with one track per stream, and a plot of each family's time against its floor.

The profile is of one eager, serialized step (kbp_profile_step: an event after each launch, or after
each plan group in bundles before ABI 4, which have no step.marks in their manifest): the launches
ran one after another in issue order, so the trace lays them end to end, each on its stream's
track; the overlap the CUDA graph gets between streams is not in it. A family's time is its own
kernels' where the bundle marks launches (a fused group may hold launches of several families:
the routed gate/up GEMV runs in the router's group)."""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from kbpc.errors import KbpcError
from kbpc.runtime.run_manifest import ProfileMark, RunManifest
from kbpc.util.atomic import atomic_writer

SCHEMA = "kbpc-bench/v1"


@dataclass(frozen=True)
class Measurement:
    context: int                     # the sequence position measured at
    step_seconds: tuple[float, ...]  # each timed graph replay
    mark_ms: tuple[float, ...]       # the profiled step, per mark (launch, or group before ABI 4) in order
    bandwidth: float                 # bytes/s, the floors' yardstick
    bandwidth_source: str
    device: str
    graph_edges: tuple[int, int] | None = None   # (programmatic edges of the step graph, all its edges)
    timed_step: str = ""             # what one timed step includes (bench.timed_step_covers)


def profile_spans(run: RunManifest, plan: dict) -> list[ProfileMark]:
    """The profile's marks in order: the bundle's launches (manifest step.marks), or, for a bundle
    without them, its plan groups in launch order (marks of the group's family, no nodes)."""
    if run.marks:
        return list(run.marks)
    family_of = {g["id"]: g["family"] for g in plan["groups"]}
    return [ProfileMark(s["group"], family_of[s["group"]], s["stream"], ())
            for s in sorted(plan["schedule"], key=lambda s: s["position"])]


def step_spread_ms(seconds: tuple[float, ...]) -> dict[str, float]:
    """The timed replays' spread in ms: the fastest, the 10th and 90th percentiles (nearest rank)
    and the slowest, so a reader sees how far one step time is from the median it reports."""
    ms = sorted(x * 1e3 for x in seconds)

    def rank(q: float) -> float:
        return ms[min(len(ms) - 1, max(0, math.ceil(q * len(ms)) - 1))]
    return {"min": ms[0], "p10": rank(0.1), "p90": rank(0.9), "max": ms[-1]}


def bench_report(run: RunManifest, plan: dict, fbytes: dict[str, float], m: Measurement) -> dict:
    spans = profile_spans(run, plan)
    if len(spans) != len(m.mark_ms):
        raise KbpcError(f"the profile has {len(m.mark_ms)} marks where the bundle lists {len(spans)}", "bench")
    per_family: dict[str, float] = defaultdict(float)
    groups: dict[str, int] = defaultdict(int)
    for span, ms in zip(spans, m.mark_ms):
        per_family[span.family] += ms * 1e3
        groups[span.family] += 1
    per_us = m.bandwidth / 1e6
    step_bytes = sum(fbytes.values())
    median = statistics.median(m.step_seconds)
    floor_us = step_bytes / per_us
    return {
        "schema": SCHEMA, "blueprint_id": run.blueprint_id, "plan_digest": run.plan_digest, "target": run.target,
        "device": m.device, "bandwidth": {"bytes_per_s": m.bandwidth, "source": m.bandwidth_source},
        "context": m.context, "runs": len(m.step_seconds), "timed_step": m.timed_step or None,
        "step_ms_median": median * 1e3, "step_ms_spread": step_spread_ms(m.step_seconds), "tokens_per_s": 1.0 / median,
        "bytes_per_token": step_bytes, "floor_ms": floor_us / 1e3, "roofline_fraction": (floor_us / 1e6) / median,
        "launches_per_step": run.launches,
        "graph_edges": (None if m.graph_edges is None else
                        {"programmatic": m.graph_edges[0], "total": m.graph_edges[1]}),
        "profiled_step_ms": float(sum(m.mark_ms)),
        "profile_marks": "launch" if run.marks else "group",
        "families": {f: {"us": per_family[f], "groups": groups[f], "bytes": fbytes.get(f, 0.0),
                         "floor_us": fbytes.get(f, 0.0) / per_us,
                         "fraction": (fbytes.get(f, 0.0) / per_us) / per_family[f] if per_family[f] else None}
                     for f in sorted(per_family, key=lambda f: -per_family[f])},
    }


def chrome_trace(run: RunManifest, plan: dict, m: Measurement, title: str) -> dict:
    """The profiled step in the Chrome trace event format (chrome://tracing, ui.perfetto.dev): one
    process, one thread (track) per stream, one complete event per profile mark (launch), microseconds."""
    groups = {g["id"]: g for g in plan["groups"]}
    spans = profile_spans(run, plan)
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
                           "args": {"name": f"{title} (serialized profile)"}}]
    streams = sorted({s.stream for s in spans})
    events += [{"ph": "M", "name": "thread_name", "pid": 1, "tid": st, "args": {"name": f"stream {st}"}}
               for st in streams]
    t = 0.0
    for span, ms in zip(spans, m.mark_ms):
        g = groups[span.group]
        events.append({"ph": "X", "name": span.family, "cat": g.get("rule", ""), "pid": 1, "tid": span.stream,
                       "ts": round(t, 3), "dur": round(ms * 1e3, 3),
                       "args": {"group": g["id"], "rule": g.get("rule"), "group_family": g["family"]}})
        t += ms * 1e3
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"context": m.context, "device": m.device, "serialized": True}}


def plot_families(report: dict, path: Path) -> None:
    """A bar chart of each family's time in the profiled step against its bandwidth floor (PNG)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KbpcError("--plot needs matplotlib: pip install 'kbpc[plot]'", "--plot") from None
    names = list(report["families"])
    measured = [report["families"][f]["us"] for f in names]
    floors = [report["families"][f]["floor_us"] for f in names]
    fig, ax = plt.subplots(figsize=(10, max(3.0, 0.35 * len(names) + 1.5)))
    ys = range(len(names))
    ax.barh([y + 0.2 for y in ys], measured, height=0.4, label="measured (profiled step)")
    ax.barh([y - 0.2 for y in ys], floors, height=0.4, label="bandwidth floor")
    ax.set_yticks(list(ys), names)
    ax.invert_yaxis()
    ax.set_xlabel("µs per step")
    ax.set_title(f"{report['blueprint_id'][:60]} on {report['device'][:50]}, context {report['context']}: "
                 f"{report['tokens_per_s']:.1f} tok/s, {100 * report['roofline_fraction']:.0f}% of roofline",
                 fontsize=9)
    ax.legend(loc="lower right")
    fig.tight_layout()
    try:
        with atomic_writer(Path(path)) as fh:
            fig.savefig(fh, format="png", dpi=120)
    finally:
        plt.close(fig)
