"""The plan's grouping: which group runs each node, and the queries every pass, the code generator
and the traffic model ask of it. `Node.group` is the blueprint's planned grouping, read only where
the plan is seeded (validate) and checked (check_fusion); after that the plan's groups are the
truth, and the fusion pass may merge them.

Dependencies between groups are the data edges that cross groups plus the sequence state they
share: a group that reads a cache in a step (`latent:read`, `index:read`) runs after the group of
the same block that writes it (`latent:write`, `index:write`, `tail:update`)."""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Iterable

from kbpc.ir.records import Node, Tensor

if TYPE_CHECKING:
    from kbpc.ir.graph import Blueprint
    from kbpc.ir.plan import LoweredGroup

STATE_WRITERS = {"latent:read": ("latent:write",), "index:read": ("index:write", "tail:update")}


class Grouping:
    def __init__(self, bp: Blueprint, groups: Iterable[LoweredGroup]):
        self.bp = bp
        self.groups = {g.id: g for g in groups}
        self._of: dict[int, int] = {}
        for g in self.groups.values():
            for node_id in g.nodes:
                self._of[bp.node_by_id[node_id].order] = g.id

    def group_of(self, node: Node | int) -> int:
        """The id of the group that runs a node (a Node or its order)."""
        return self._of[node if isinstance(node, int) else node.order]

    def crosses(self, t: Tensor) -> bool:
        """Whether an edge leaves its producer's group (so it needs a buffer)."""
        return self._of[t.src] != self._of[t.dst]

    def crossing_edges(self) -> list[Tensor]:
        return [t for t in self.bp.tensors() if self.crosses(t)]

    def nodes(self, gid: int) -> list[Node]:
        return [self.bp.node_by_id[n] for n in self.groups[gid].nodes]

    def inputs(self, gid: int) -> list[Tensor]:
        """Edges from other groups into this one."""
        return [t for n in self.nodes(gid) for t in self.bp.inputs(n.order) if self._of[t.src] != gid]

    def outputs(self, gid: int) -> list[Tensor]:
        """Edges from this group to other groups."""
        return [t for n in self.nodes(gid) for t in self.bp.outputs(n.order) if self._of[t.dst] != gid]

    def dependencies(self) -> dict[int, set[int]]:
        """group id -> ids of the groups it must run after (within one step)."""
        deps: dict[int, set[int]] = {gid: set() for gid in self.groups}
        for t in self.bp.tensors():
            a, b = self._of[t.src], self._of[t.dst]
            if a != b:
                deps[b].add(a)
        writers: dict[tuple[str, str], set[int]] = defaultdict(set)
        for node in self.bp.nodes():
            for kind in node.state:
                writers[(node.block, kind)].add(self._of[node.order])
        for node in self.bp.nodes():
            gid = self._of[node.order]
            for kind in node.state:
                for w in STATE_WRITERS.get(kind, ()):
                    deps[gid] |= writers.get((node.block, w), set()) - {gid}
        return deps
