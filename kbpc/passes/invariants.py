"""IR invariants, checked between passes in tests and under `kbpc compile --verify`:
acyclic graph, each node in exactly one group, legal precision per op, groups scheduled after every
group they depend on (within a stream by order, across streams through an event), arena buffers that
are live at the same time never overlap."""
from __future__ import annotations

import networkx as nx

from kbpc.errors import KbpcError
from kbpc.ir.formats import is_known
from kbpc.ir.plan import Plan
from kbpc.passes.ordering import HappensBefore, group_dependencies
from kbpc.passes.plan_memory import buffer_users, ordered


class InvariantError(KbpcError):
    """A pass broke an IR invariant (a compiler bug, not bad input)."""


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
    """Every dependency (data or shared state) is ordered before its reader: by stream order on
    one stream, through an event across streams."""
    hb = HappensBefore(plan.schedule)
    if hb.missing_events:
        g, e = hb.missing_events[0]
        raise InvariantError(f"group {g} waits for event {e}, which no earlier group records", where)
    for gid, deps in group_dependencies(plan).items():
        if gid not in hb.pos:
            continue   # host groups (argmax) run in the runner after the step
        for d in deps:
            if d not in hb.pos:
                raise InvariantError(f"device group {gid} reads host group {d}", where)
            if hb.pos[d].position >= hb.pos[gid].position:
                raise InvariantError(f"group {gid} is launched before group {d} it reads", where)
            if not hb.before(d, gid):
                raise InvariantError(f"group {gid} (stream {hb.pos[gid].stream}) reads group {d} "
                                     f"(stream {hb.pos[d].stream}) with no event between them", where)


def _check_arena(plan: Plan, where: str) -> None:
    """Buffers sharing arena bytes must be ordered: every use of one happens before the other's
    producer starts (stream order or events), not merely earlier in launch order."""
    hb = HappensBefore(plan.schedule)
    users = buffer_users(plan)
    placed = sorted(plan.buffers, key=lambda b: b.offset)
    for i, a in enumerate(placed):
        if a.offset < 0 or a.offset + a.nbytes > plan.arena_bytes:
            raise InvariantError(f"buffer {a.name} lies outside the arena", where)
        for b in placed[i + 1:]:
            if b.offset >= a.offset + a.nbytes:
                break
            if a.alias_of == b.name or b.alias_of == a.name:
                if not (a.alias_of and _inside(a, b)) and not (b.alias_of and _inside(b, a)):
                    raise InvariantError(f"concat input {a.name if a.alias_of else b.name} leaves its region", where)
                continue
            if a.alias_of and a.alias_of == b.alias_of:
                raise InvariantError(f"concat inputs {a.name} and {b.name} overlap", where)
            if not (ordered(hb, users[a.name], b.producer_group) or ordered(hb, users[b.name], a.producer_group)):
                raise InvariantError(f"buffers {a.name} and {b.name} overlap while both are live", where)


def _inside(part, region) -> bool:
    return region.offset <= part.offset and part.offset + part.nbytes <= region.offset + region.nbytes
