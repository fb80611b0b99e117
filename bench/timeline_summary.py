"""From a profiler's trace of replayed steps to the timeline summary, the Chrome/Perfetto trace and
a short table (the pure half of bench/replay_timeline.py; no torch, no GPU).

Input: the Chrome trace torch.profiler exports (Kineto), whose kernel events carry `cat: kernel`,
`ts`/`dur` in microseconds and args `stream`, `correlation`, `grid`, `block`. Every kernel of one
graph replay shares the correlation id of its cudaGraphLaunch, which splits the records into
replays; without it, records in start order are cut into replays of one step's launch count.

Per replay: the span (first kernel start to last kernel end), the time some kernel runs (busy)
and the time none does (idle: launch latency, dependency drain and refill, host gaps inside the
graph; the critical path's overhead, to a first approximation). Per launch (medians over the
replays): duration, the gap before it on its plan stream (negative where PDL let it start before
its predecessor ended), how many other kernels overlapped it, and how late it started: start minus
the time everything it depends on had ended (`lateness`: positive where it waited beyond its
dependencies, for launch latency or for free SMs; negative where PDL let it start early). Per
family: summed kernel time and the time it ran alone (nothing else on the GPU)."""
from __future__ import annotations

import bisect
import statistics
from collections import defaultdict

from timeline_launches import KernelRecord, LaunchRow, TimelineError, base_name, match_replay

SCHEMA = "kbpc-replay-timeline/v1"
TOP = 30


def kernel_records(trace: dict) -> list[KernelRecord]:
    """The kernel events of an exported Chrome trace (Kineto's format)."""
    out = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or str(e.get("cat", "")).lower() != "kernel":
            continue
        args = e.get("args", {})
        grid, block = args.get("grid"), args.get("block")
        corr = args.get("correlation", args.get("external id"))
        out.append(KernelRecord(name=str(e.get("name", "")), start=float(e["ts"]), end=float(e["ts"]) + float(e["dur"]),
                                stream=_int(args.get("stream", e.get("tid"))),
                                correlation=int(corr) if corr is not None else None,
                                grid=tuple(int(x) for x in grid) if grid else None,
                                block=tuple(int(x) for x in block) if block else None))
    return out


def _int(x) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return -1


def split_replays(records: list[KernelRecord], per_replay: int) -> list[list[KernelRecord]]:
    """One list per replay, in time order. By correlation id when every group holds one step's
    launches; else consecutive runs of `per_replay` records in start order."""
    if not records:
        raise TimelineError("the trace holds no kernel records")
    by_corr: dict[int | None, list[KernelRecord]] = defaultdict(list)
    for r in records:
        by_corr[r.correlation].append(r)
    if None not in by_corr and all(len(v) == per_replay for v in by_corr.values()):
        replays = list(by_corr.values())
    elif len(records) % per_replay == 0:
        ordered = sorted(records, key=lambda r: r.start)
        replays = [ordered[i:i + per_replay] for i in range(0, len(ordered), per_replay)]
    else:
        raise TimelineError(f"{len(records)} kernel records are not whole replays of {per_replay} launches "
                            f"({len(by_corr)} launching calls): other kernels ran while profiling, or the profiler "
                            "dropped records (try fewer --replays)")
    return sorted((sorted(r, key=lambda x: x.start) for r in replays), key=lambda rs: rs[0].start)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def _sole_time(recs: list[KernelRecord], fam: list[str]) -> dict[str, float]:
    """Per family, the time one of its kernels ran with no other kernel running."""
    edges = sorted([(r.start, 1, i) for i, r in enumerate(recs)] + [(r.end, -1, i) for i, r in enumerate(recs)],
                   key=lambda x: (x[0], x[1]))
    active: set[int] = set()
    sole: dict[str, float] = defaultdict(float)
    last = None
    for t, kind, i in edges:
        if last is not None and len(active) == 1:
            sole[fam[next(iter(active))]] += t - last
        (active.add if kind == 1 else active.discard)(i)
        last = t
    return sole


def replay_view(recs: list[KernelRecord], matched: list[LaunchRow | None]) -> dict:
    """One replay's numbers (times relative to its first kernel's start)."""
    t0, t1 = min(r.start for r in recs), max(r.end for r in recs)
    busy = _union([(r.start, r.end) for r in recs])
    track = [f"stream {m.stream}" if m else f"profiler stream {r.stream}" for r, m in zip(recs, matched)]
    fam = [m.family if m else base_name(r.name) for r, m in zip(recs, matched)]
    starts = sorted(r.start for r in recs)
    ends = sorted(r.end for r in recs)
    gap, prev_end = {}, {}
    for i in sorted(range(len(recs)), key=lambda i: recs[i].start):
        gap[i] = recs[i].start - prev_end.get(track[i], t0)
        prev_end[track[i]] = max(prev_end.get(track[i], t0), recs[i].end)
    concurrent = [bisect.bisect_left(starts, r.end) - bisect.bisect_right(ends, r.start) - (r.end > r.start)
                  for r in recs]
    idle = [(a[1], b[0]) for a, b in zip(busy, busy[1:])]
    return {"t0": t0, "span": t1 - t0, "busy": sum(e - s for s, e in busy), "idle": idle, "track": track,
            "family": fam, "gap": gap, "concurrent": [max(0, c) for c in concurrent],
            "sole": _sole_time(recs, fam)}


def lateness(times: dict[int, tuple[float, float]], launches: list[LaunchRow]) -> dict[int, float]:
    """launch index -> its start minus its ready time, for the launches in `times` (index -> (start,
    end)). Ready: the end of the previous launch on its stream and of the launches after which the
    events its stream waited for were recorded (LaunchRow.waits / records; an event the table does
    not date counts as complete at the step's start). Unmatched launches are skipped."""
    frontier: dict[int, float] = defaultdict(float)
    event_end: dict[int, float] = {}
    out = {}
    for row in launches:
        if row.index not in times:
            continue
        ready = max([frontier[row.stream]] + [event_end.get(e, 0.0) for e in row.waits])
        start, end = times[row.index]
        out[row.index] = start - ready
        frontier[row.stream] = max(ready, end)
        for e in row.records:
            event_end[e] = frontier[row.stream]
    return out


def _median(xs) -> float:
    xs = list(xs)
    return float(statistics.median(xs)) if xs else 0.0


def _around(recs, matched, t: float, before: bool) -> dict | None:
    """The kernel that ended last at or before t (before) or started first at or after t."""
    pick = [i for i, r in enumerate(recs) if (r.end <= t if before else r.start >= t)]
    if not pick:
        return None
    i = max(pick, key=lambda i: recs[i].end) if before else min(pick, key=lambda i: recs[i].start)
    m = matched[i]
    return m.to_json() if m else {"kernel": recs[i].name, "profiler_stream": recs[i].stream}


def summarize(replays: list[list[KernelRecord]], launches: list[LaunchRow]) -> dict:
    matched = [match_replay(r, launches) for r in replays]
    views = [replay_view(r, m) for r, m in zip(replays, matched)]
    per_launch: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for recs, ms, v in zip(replays, matched, views):
        times = {m.index: (r.start - v["t0"], r.end - v["t0"]) for r, m in zip(recs, ms) if m is not None}
        late = lateness(times, launches)
        for i, (r, m) in enumerate(zip(recs, ms)):
            if m is not None:
                d = per_launch[m.index]
                d["dur"].append(r.end - r.start)
                d["gap"].append(v["gap"][i])
                d["concurrent"].append(v["concurrent"][i])
                d["start"].append(r.start - v["t0"])
                d["late"].append(late[m.index])
    kernels = []
    for row in launches:
        d = per_launch.get(row.index)
        if d:
            kernels.append({**row.to_json(), "dur_us": _median(d["dur"]), "gap_us": _median(d["gap"]),
                            "concurrent": _median(d["concurrent"]), "start_us": _median(d["start"]),
                            "late_us": _median(d["late"])})
    fam_count: dict[str, int] = defaultdict(int)
    for row in launches:
        fam_count[row.family] += 1
    totals = []
    for recs, v in zip(replays, views):
        tot: dict[str, float] = defaultdict(float)
        for r, f in zip(recs, v["family"]):
            tot[f] += r.end - r.start
        totals.append(tot)
    names = {f for tot in totals for f in tot}
    spans = [v["span"] for v in views]
    rep = min(range(len(views)), key=lambda i: abs(spans[i] - _median(spans)))   # the median replay
    families = {f: {"launches": fam_count.get(f, 0), "busy_us": _median(t.get(f, 0.0) for t in totals),
                    "sole_us": _median(v["sole"].get(f, 0.0) for v in views)}
                for f in names}
    gaps = sorted(kernels, key=lambda k: -k["gap_us"])[:TOP]
    prev_on_stream: dict[int, int] = {}
    before_of = {}
    for row in launches:
        before_of[row.index] = prev_on_stream.get(row.stream)
        prev_on_stream[row.stream] = row.index
    v = views[rep]

    def gap(k: dict) -> dict:
        before = before_of[k["launch"]]
        return {"gap_us": k["gap_us"], "stream": k["stream"], "kernel": k,
                "before": launches[before].to_json() if before is not None else None}

    same_stream = [k for k in sorted(kernels, key=lambda k: -k["gap_us"]) if not k["after_wait"]][:TOP]
    idle = sorted(v["idle"], key=lambda g: g[0] - g[1])[:TOP]
    return {
        "schema": SCHEMA, "replays": len(replays), "launches_per_replay": len(launches),
        "unmatched_records": sum(m is None for ms in matched for m in ms),
        "step_span_us": {"median": _median(spans), "min": min(spans), "max": max(spans), "each": spans},
        "busy_us": _median(v["busy"] for v in views),
        "idle_us": _median(v["span"] - v["busy"] for v in views),
        "median_replay": rep,
        "families": dict(sorted(families.items(), key=lambda kv: -kv[1]["busy_us"])),
        "kernels": kernels,
        "top_gaps": [gap(k) for k in gaps],
        "top_gaps_no_wait": [gap(k) for k in same_stream],
        "top_late": sorted(kernels, key=lambda k: -k["late_us"])[:TOP],
        "idle_gaps": [{"at_us": s - v["t0"], "idle_us": e - s, "before": _around(replays[rep], matched[rep], s, True),
                       "after": _around(replays[rep], matched[rep], e, False)} for s, e in idle],
    }


def chrome_trace(replays: list[list[KernelRecord]], launches: list[LaunchRow], title: str) -> dict:
    """Every replay on one time axis (microseconds from the first kernel), one track per plan
    stream (records no launch matched go on a track per profiler stream), a track of replay spans."""
    t0 = min(r.start for rs in replays for r in rs)
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": title}}]
    tids: dict[str, int] = {"replays": 0}
    for n, recs in enumerate(replays):
        start, end = min(r.start for r in recs), max(r.end for r in recs)
        events.append({"ph": "X", "name": f"replay {n}", "pid": 1, "tid": 0, "ts": round(start - t0, 3),
                       "dur": round(end - start, 3), "args": {"span_us": round(end - start, 3)}})
        for r, m in zip(recs, match_replay(recs, launches)):
            track = f"stream {m.stream}" if m else f"profiler stream {r.stream}"
            tid = tids.setdefault(track, len(tids))
            args = {**(m.to_json() if m else {}), "symbol": r.name, "profiler_stream": r.stream, "replay": n}
            events.append({"ph": "X", "name": m.family if m else base_name(r.name), "cat": m.rule if m else "unmatched",
                           "pid": 1, "tid": tid, "ts": round(r.start - t0, 3), "dur": round(r.end - r.start, 3),
                           "args": args})
    events += [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": track}}
               for track, tid in tids.items()]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"replays": len(replays)}}


def _label(launch: dict | None) -> str:
    if launch and "family" in launch:
        return f"{launch['family']} (group {launch['group']}, stream {launch['stream']})"
    return str(launch)


def table(summary: dict, families: int = 12, gaps: int = 10) -> str:
    s = summary
    span = s["step_span_us"]["median"]
    lines = [f"step span {span:.1f} us (median of {s['replays']} replays, min {s['step_span_us']['min']:.1f}, "
             f"max {s['step_span_us']['max']:.1f}); kernels running {s['busy_us']:.1f} us, none running "
             f"{s['idle_us']:.1f} us ({100 * s['idle_us'] / span if span else 0:.1f}%); "
             f"{s['unmatched_records']} records matched no launch",
             f"{'family':<28}{'launches':>9}{'busy us':>10}{'alone us':>10}{'busy/span':>10}"]
    for f, d in list(s["families"].items())[:families]:
        lines.append(f"{f[:27]:<28}{d['launches']:>9}{d['busy_us']:>10.1f}{d['sole_us']:>10.1f}"
                     f"{100 * d['busy_us'] / span if span else 0:>9.1f}%")
    lines.append("largest gaps before a kernel after its stream predecessor, no event wait between "
                 "(median us; pdl: launched with PDL):")
    for g in s["top_gaps_no_wait"][:gaps]:
        k, b = g["kernel"], g["before"]
        prev = f"{b['family']} (group {b['group']})" if b else "step start"
        lines.append(f"  {g['gap_us']:8.2f}  stream {g['stream']}: {prev} -> {k['family']} (group {k['group']}, "
                     f"launch {k['launch']}){' pdl' if k['pdl'] else ''}")
    lines.append("latest starts after everything a kernel depends on had ended (median us; "
                 "bench/timeline_delays.py sums them by kernel):")
    for k in s.get("top_late", [])[:gaps]:
        lines.append(f"  {k['late_us']:8.2f}  {_label(k)}, launch {k['launch']}"
                     f"{' after an event wait' if k['after_wait'] else ''}")
    lines.append("largest times with no kernel running (median replay; the kernels on either side):")
    for g in s["idle_gaps"][:gaps]:
        lines.append(f"  {g['idle_us']:8.2f}  at {g['at_us']:9.1f} us: {_label(g['before'])} -> {_label(g['after'])}")
    return "\n".join(lines)
