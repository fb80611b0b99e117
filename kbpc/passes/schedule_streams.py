"""schedule_streams: place independent groups on parallel streams, with events at the crossings,
and fix the launch order.

Needs: lowered groups and weight specs. Guarantees: every device group has a stream and a
position; a group launches after every group it reads, ordered within its stream by position and
across streams by an event recorded after the producer; host groups (the final argmax) are left to
the runner. The cost model is bytes moved over the target's bandwidth plus a launch latency, with a
floor for the ops whose launches are chains of dependent round trips rather than bytes, so
parallel branches (the shared expert beside the routed experts, the indexer beside the query
path) overlap; `critical_path_us` is the modelled step time and `serial_us` the one-stream time.
A group continues its critical predecessor's stream (and so starts early under programmatic
dependent launch, its CTAs resident first) only if no other successor of that predecessor has a
longer modelled path to the end of the step; the others wait on an event. A group without slack
in the model (its start plus its remaining path is the modelled step) is marked urgent: its
launches get the highest priority (kbpc/codegen/launch_passes.py mark_priority)."""
from __future__ import annotations

import dataclasses
import heapq
from collections import defaultdict

from kbpc.ir.formats import FORMATS
from kbpc.ir.plan import Plan, ScheduledGroup
from kbpc.passes.ordering import group_dependencies

BANDWIDTH_BYTES_PER_US = 4.3e6   # 4.3 TB/s, measured H200 copy bandwidth (DESIGN.md)
LAUNCH_US = 0.76                 # per kernel node in a replayed CUDA graph (DESIGN.md)
# In-step time of the ops whose launches are latency chains, which the byte model prices as one
# launch (H200, 128-expert seed shrink, replay timelines at 1k context, bench/NOTES.md): the DSA
# index select (scores, a cross-CTA top-k, the expansion: 14 us) and the sparse MLA decode (16 us).
# They make the indexer's path, not the query's up-projection, the DSA layer's longest. The latent
# write (a norm, the FP8 encoding and a paged store: 2.8 us, priced 2.5) is then no free
# predecessor, so the query up-projection gets a stream of its own instead of queueing behind it
# (twentieth session, bench/NOTES.md: at 1k q_b and the decode end 1.0 and 0.9 us sooner, a DSA
# layer 63.6 -> 62.9 us, the replay span 4988 -> 4975 us; at 16k, where the select is critical and
# its index store now meets q_b, a DSA layer 81.4 -> 82.0 us, the span 5181 -> 5184 us).
LATENCY_FLOOR_US = {"index_select": 14.0, "mla_attention": 16.0, "kv_write": 2.5}
URGENT_SLACK_US = 0.5            # a group whose modelled slack is below this is on the critical path


def group_costs(plan: Plan) -> dict[int, float]:
    weight_bytes: dict[str, float] = defaultdict(float)
    for spec in plan.weights:
        weight_bytes[spec.node] += spec.bytes_per_token
    op_of = {n.id: n.op for n in plan.blueprint.nodes()}
    costs = {}
    for g in plan.groups:
        moved = sum(weight_bytes[n] for n in g.nodes)
        moved += sum(FORMATS[t.format].row_bytes(t.dim_value) for t in plan.grouping.inputs(g.id))
        floor = sum(LATENCY_FLOOR_US.get(op_of.get(n, ""), 0.0) for n in g.nodes)
        costs[g.id] = max(moved / BANDWIDTH_BYTES_PER_US, floor) + LAUNCH_US * max(1, len(g.kernels))
    return costs


def _successors(device, deps: dict[int, set[int]]) -> dict[int, list[int]]:
    """group id -> the device groups that read it, in the device order."""
    ids = {g.id for g in device}
    succs: dict[int, list[int]] = defaultdict(list)
    for g in device:
        for d in deps[g.id]:
            if d in ids:
                succs[d].append(g.id)
    return succs


def remaining_path_us(device, deps: dict[int, set[int]], costs: dict[int, float],
                      succs: dict[int, list[int]] | None = None) -> dict[int, float]:
    """group id -> its cost plus the longest modelled path after it to the end of the step (succs:
    `_successors(device, deps)`, when the caller has it already)."""
    succs = _successors(device, deps) if succs is None else succs
    rank: dict[int, float] = {}
    for g in reversed(device):   # device is in a topological order
        rank[g.id] = costs[g.id] + max((rank[x] for x in succs[g.id]), default=0.0)
    return rank


def schedule_streams(plan: Plan) -> Plan:
    deps = group_dependencies(plan)
    costs = group_costs(plan)
    device = [g for g in plan.groups if g.where == "device" or g.family == "embed_copy"]
    succs = _successors(device, deps)
    rank = remaining_path_us(device, deps, costs, succs)
    heir = _heirs(device, deps, rank)
    finish: dict[int, float] = {}
    stream_of: dict[int, int] = {}
    tail: list[int | None] = []        # last group on each stream
    ready: list[float] = []            # when each stream is free
    for g in _in_start_order(device, deps, succs, rank, finish):
        d = [x for x in deps[g.id] if x in finish]
        start_deps = max((finish[x] for x in d), default=0.0)
        critical = max(d, key=lambda x: finish[x]) if d else None
        keep = critical is not None and heir.get(critical) == g.id
        stream = _pick_stream(critical, keep, d, tail, ready, start_deps, plan.options.max_streams, stream_of)
        if stream == len(tail):
            tail.append(None)
            ready.append(0.0)
        start = max(start_deps, ready[stream])
        finish[g.id] = start + costs[g.id]
        ready[stream], tail[stream] = finish[g.id], g.id
        stream_of[g.id] = stream
    return _emit(plan, device, deps, finish, stream_of, costs, rank, len(tail))


def _in_start_order(device, deps, succs, rank, finish):
    """The groups in list-scheduling order: next, of the groups whose producers are all placed, the
    one that can start first (its producers' modelled finish, read from `finish` once the caller has
    placed each yielded group; ties: the longer remaining path, then the blueprint's order), so a
    group never takes a stream before one that is ready earlier."""
    ids = {g.id for g in device}
    index = {g.id: i for i, g in enumerate(device)}
    producers = {g.id: {d for d in deps[g.id] if d in ids} for g in device}
    unplaced = {gid: len(ds) for gid, ds in producers.items()}
    heap = [(0.0, -rank[g.id], index[g.id]) for g in device if not producers[g.id]]
    heapq.heapify(heap)
    while heap:
        _, _, i = heapq.heappop(heap)
        g = device[i]
        yield g                                # the caller places it: finish[g.id] is set
        for u in succs[g.id]:
            unplaced[u] -= 1
            if not unplaced[u]:
                start = max(finish[d] for d in producers[u])
                heapq.heappush(heap, (start, -rank[u], index[u]))


def _heirs(device, deps, rank) -> dict[int, int]:
    """group id -> the successor that may continue its stream: the one with the longest remaining
    path (ties: the first in order)."""
    heir: dict[int, int] = {}
    for g in device:
        for d in deps[g.id]:
            if d not in heir or rank[g.id] > rank[heir[d]]:
                heir[d] = g.id
    return heir


def _pick_stream(critical, keep, deps, tail, ready, start, max_streams, stream_of) -> int:
    reserved = None
    if critical is not None and tail[stream_of[critical]] == critical:
        if keep:
            return stream_of[critical]       # continue the critical predecessor's stream
        reserved = stream_of[critical]       # left to the successor with the longer path
    for s, last in enumerate(tail):          # a stream whose last group we depend on
        if last in deps and s != reserved:
            return s
    idle = [s for s, r in enumerate(ready) if r <= start and s != reserved]
    if idle:
        return idle[0]
    if len(tail) < max_streams:
        return len(tail)
    others = [s for s in range(len(ready)) if s != reserved] or [reserved]
    return min(others, key=lambda s: ready[s])


def _emit(plan, device, deps, finish, stream_of, costs, rank, streams) -> Plan:
    order = sorted(device, key=lambda g: (finish[g.id] - costs[g.id], g.id))
    end = max(finish.values(), default=0.0)
    urgent = {g.id for g in device if end - (finish[g.id] - costs[g.id] + rank[g.id]) < URGENT_SLACK_US}
    position = {g.id: i for i, g in enumerate(order)}
    waits_on = _minimal_waits(order, deps, stream_of, position)
    needs_event = {d for ds in waits_on.values() for d in ds}
    event_of = {gid: i for i, gid in enumerate(sorted(needs_event, key=position.get))}
    schedule = [ScheduledGroup(group=g.id, position=position[g.id], stream=stream_of[g.id],
                               waits=tuple(sorted(event_of[d] for d in waits_on[g.id])),
                               record=event_of.get(g.id), cost_us=round(costs[g.id], 4),
                               urgent=g.id in urgent)
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
