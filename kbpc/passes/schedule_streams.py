"""schedule_streams: place independent groups on parallel streams, with events at the crossings,
and fix the launch order.

Needs: lowered groups and weight specs. Guarantees: every device group has a stream and a
position; a group launches after every group it reads, ordered within its stream by position and
across streams by an event recorded after the producer; host groups (the final argmax) are left to
the runner. The cost model is bytes moved over the target's bandwidth plus a launch latency, so
parallel branches (the shared expert beside the routed experts, the indexer beside the query
path) overlap; `critical_path_us` is the modelled step time and `serial_us` the one-stream time."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

from kbpc.ir.formats import FORMATS
from kbpc.ir.plan import Plan, ScheduledGroup
from kbpc.passes.ordering import group_dependencies

BANDWIDTH_BYTES_PER_US = 4.3e6   # 4.3 TB/s, measured H200 copy bandwidth (DESIGN.md)
LAUNCH_US = 0.76                 # per kernel node in a replayed CUDA graph (DESIGN.md)


def group_costs(plan: Plan) -> dict[int, float]:
    weight_bytes: dict[str, float] = defaultdict(float)
    for spec in plan.weights:
        weight_bytes[spec.node] += spec.bytes_per_token
    costs = {}
    for g in plan.groups:
        moved = sum(weight_bytes[n] for n in g.nodes)
        moved += sum(FORMATS[t.format].row_bytes(t.dim_value) for t in plan.grouping.inputs(g.id))
        costs[g.id] = moved / BANDWIDTH_BYTES_PER_US + LAUNCH_US * max(1, len(g.kernels))
    return costs


def schedule_streams(plan: Plan) -> Plan:
    deps = group_dependencies(plan)
    costs = group_costs(plan)
    device = [g for g in plan.groups if g.where == "device" or g.family == "embed_copy"]
    finish: dict[int, float] = {}
    stream_of: dict[int, int] = {}
    tail: list[int | None] = []        # last group on each stream
    ready: list[float] = []            # when each stream is free
    for g in device:
        d = [x for x in deps[g.id] if x in finish]
        start_deps = max((finish[x] for x in d), default=0.0)
        critical = max(d, key=lambda x: finish[x]) if d else None
        stream = _pick_stream(critical, d, tail, ready, start_deps, plan.options.max_streams, stream_of)
        if stream == len(tail):
            tail.append(None)
            ready.append(0.0)
        start = max(start_deps, ready[stream])
        finish[g.id] = start + costs[g.id]
        ready[stream], tail[stream] = finish[g.id], g.id
        stream_of[g.id] = stream
    return _emit(plan, device, deps, finish, stream_of, costs, len(tail))


def _pick_stream(critical, deps, tail, ready, start, max_streams, stream_of) -> int:
    if critical is not None and tail[stream_of[critical]] == critical:
        return stream_of[critical]           # continue the critical predecessor's stream
    for s, last in enumerate(tail):          # a stream whose last group we depend on
        if last in deps:
            return s
    idle = [s for s, r in enumerate(ready) if r <= start]
    if idle:
        return idle[0]
    if len(tail) < max_streams:
        return len(tail)
    return min(range(len(ready)), key=lambda s: ready[s])


def _emit(plan, device, deps, finish, stream_of, costs, streams) -> Plan:
    order = sorted(device, key=lambda g: (finish[g.id] - costs[g.id], g.id))
    position = {g.id: i for i, g in enumerate(order)}
    waits_on = _minimal_waits(order, deps, stream_of, position)
    needs_event = {d for ds in waits_on.values() for d in ds}
    event_of = {gid: i for i, gid in enumerate(sorted(needs_event, key=position.get))}
    schedule = [ScheduledGroup(group=g.id, position=position[g.id], stream=stream_of[g.id],
                               waits=tuple(sorted(event_of[d] for d in waits_on[g.id])),
                               record=event_of.get(g.id), cost_us=round(costs[g.id], 4))
                for g in order]
    return dataclasses.replace(plan, schedule=tuple(schedule), streams=streams,
                               critical_path_us=round(max(finish.values(), default=0.0), 3),
                               serial_us=round(sum(costs[g.id] for g in device), 3))


def _minimal_waits(order, deps, stream_of, position) -> dict[int, list[int]]:
    """group -> the producers on other streams whose events it waits for: only those its stream does
    not already know finished, through stream order and earlier waits (vector clocks: known[t] is
    the last position on stream t known finished). A redundant wait is not free: the launch after
    it gets a full dependency instead of programmatic dependent launch (launch_passes.mark_pdl)."""
    known_by_stream: dict[int, dict[int, int]] = defaultdict(dict)
    known_after: dict[int, dict[int, int]] = {}
    waits_on: dict[int, list[int]] = {}
    for g in order:
        s = stream_of[g.id]
        known = dict(known_by_stream[s])
        latest: dict[int, int] = {}    # the last producer on each other stream
        for d in deps[g.id]:
            if d in stream_of and stream_of[d] != s:
                t = stream_of[d]
                if t not in latest or position[d] > position[latest[t]]:
                    latest[t] = d
        chosen = []
        for d in sorted(latest.values(), key=position.get, reverse=True):   # the latest covers the most
            if known.get(stream_of[d], -1) >= position[d]:
                continue
            chosen.append(d)
            for t, p in known_after[d].items():
                known[t] = max(known.get(t, -1), p)
        known[s] = position[g.id]
        known_after[g.id] = known_by_stream[s] = known
        waits_on[g.id] = chosen
    return waits_on
