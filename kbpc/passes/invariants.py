"""IR invariants, checked between passes in tests and under `kbpc compile --verify`:
acyclic graph, each node in exactly one group, legal precision per op, groups scheduled after every
group they depend on (within a stream by order, across streams through an event), arena buffers that
are live at the same time never overlap."""
from __future__ import annotations

import networkx as nx

from kbpc.errors import KbpcError
from kbpc.ir.formats import is_known
from kbpc.ir.plan import Plan


class InvariantError(KbpcError):
    """A pass broke an IR invariant (a compiler bug, not bad input)."""


def group_dependencies(plan: Plan) -> dict[int, set[int]]:
    """group id -> ids of the groups whose outputs it reads."""
    bp = plan.blueprint
    deps: dict[int, set[int]] = {g.id: set() for g in bp.groups}
    for t in bp.tensors():
        a, b = bp.node(t.src).group, bp.node(t.dst).group
        if a != b:
            deps[b].add(a)
    return deps


def check_invariants(plan: Plan, after: str) -> None:
    bp = plan.blueprint
    where = f"after pass {after}"
    if not nx.is_directed_acyclic_graph(bp.graph):
        raise InvariantError("the graph has a cycle", where)
    members: dict[str, int] = {}
    for g in plan.groups:
        for node_id in g.nodes:
            if node_id in members:
                raise InvariantError(f"node {node_id} is in groups {members[node_id]} and {g.id}", where)
            members[node_id] = g.id
    if plan.groups and len(members) != bp.graph.number_of_nodes():
        raise InvariantError(f"{bp.graph.number_of_nodes() - len(members)} nodes are in no group", where)
    for node in bp.nodes():
        p = node.precision
        for fmt in (p.weight, p.activation, *p.output):
            if fmt is not None and not is_known(fmt):
                raise InvariantError(f"node {node.id} has unknown format {fmt}", where)
    if plan.schedule:
        _check_schedule(plan, where)
    if plan.buffers:
        _check_arena(plan, where)


def _check_schedule(plan: Plan, where: str) -> None:
    """Every dependency is ordered before its reader: by stream order on one stream, through an
    event across streams. Vector clocks: clock[g][s] = the latest position on stream s known
    finished when g starts (its stream predecessor's clock, merged with the clocks of the events it
    waits for)."""
    pos = {s.group: s for s in plan.schedule}
    recorded = {s.record: s for s in plan.schedule if s.record is not None}
    clock: dict[int, dict[int, int]] = {}
    last_on: dict[int, int] = {}
    for s in sorted(plan.schedule, key=lambda x: x.position):
        known: dict[int, int] = {}
        sources = [pos_group for pos_group in (last_on.get(s.stream),) if pos_group is not None]
        for e in s.waits:
            if e not in recorded:
                raise InvariantError(f"group {s.group} waits for event {e}, which nothing records", where)
            if recorded[e].position >= s.position:
                raise InvariantError(f"group {s.group} waits for event {e} recorded later", where)
            sources.append(recorded[e].group)
        for g in sources:
            for stream, p in clock[g].items():
                known[stream] = max(known.get(stream, -1), p)
        clock[s.group] = {**known, s.stream: s.position}
        last_on[s.stream] = s.group
        for stream, p in known.items():
            clock[s.group][stream] = max(clock[s.group].get(stream, -1), p)
    for gid, deps in group_dependencies(plan).items():
        if gid not in pos:
            continue   # host groups (argmax) run in the runner after the step
        me = pos[gid]
        for d in deps:
            if d not in pos:
                raise InvariantError(f"device group {gid} reads host group {d}", where)
            dep = pos[d]
            if dep.position >= me.position:
                raise InvariantError(f"group {gid} is launched before group {d} it reads", where)
            before = clock[gid] if dep.stream != me.stream else {me.stream: me.position - 1}
            if before.get(dep.stream, -1) < dep.position:
                raise InvariantError(f"group {gid} (stream {me.stream}) reads group {d} "
                                     f"(stream {dep.stream}) with no event between them", where)


def _check_arena(plan: Plan, where: str) -> None:
    placed = sorted(plan.buffers, key=lambda b: b.offset)
    for i, a in enumerate(placed):
        if a.offset < 0 or a.offset + a.nbytes > plan.arena_bytes:
            raise InvariantError(f"buffer {a.name} lies outside the arena", where)
        for b in placed[i + 1:]:
            if b.offset >= a.offset + a.nbytes:
                break
            if not (a.last_use < b.first_use or b.last_use < a.first_use):
                raise InvariantError(f"buffers {a.name} and {b.name} overlap while both are live", where)
