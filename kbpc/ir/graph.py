"""The IR graph: a networkx MultiDiGraph keyed by node `order`, one `Node` record per node
(attribute "node") and one `Tensor` record per edge (attribute "tensor", key = edge index), plus
the blueprint's groups, layers, solved symbols and metadata. Passes query it through this class."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterator

import networkx as nx

from kbpc.ir.config import ModelConfig
from kbpc.ir.records import Group, Layer, Node, Tensor


@dataclass(frozen=True)
class BlueprintMeta:
    source: str               # file the blueprint came from
    schema: str
    blueprint_id: str
    lineage: str
    revision: int
    arm: dict[str, Any]
    explain: dict[str, Any]
    collapsed: dict[str, Any]
    provenance: dict[str, Any]


@dataclass(frozen=True, eq=False)
class Blueprint:
    meta: BlueprintMeta
    graph: nx.MultiDiGraph
    groups: tuple[Group, ...]           # indexed by group id
    layers: tuple[Layer, ...]
    symbols: dict[str, int]
    config: ModelConfig
    raw: dict[str, Any] = field(repr=False)   # the parsed JSON, for shrink and the bundle

    def node(self, order: int) -> Node:
        return self.graph.nodes[order]["node"]

    def nodes(self) -> Iterator[Node]:
        """All nodes in `order`."""
        for order in self.node_orders:
            yield self.graph.nodes[order]["node"]

    @cached_property
    def node_orders(self) -> tuple[int, ...]:
        return tuple(sorted(self.graph.nodes))

    @cached_property
    def node_by_id(self) -> dict[str, Node]:
        return {n.id: n for n in self.nodes()}

    def tensors(self) -> Iterator[Tensor]:
        """All edges in blueprint order."""
        return iter(self._tensors)

    @cached_property
    def _tensors(self) -> tuple[Tensor, ...]:
        return tuple(sorted((d["tensor"] for _, _, d in self.graph.edges(data=True)),
                            key=lambda t: t.index))

    def inputs(self, order: int) -> list[Tensor]:
        return sorted((d["tensor"] for _, _, d in self.graph.in_edges(order, data=True)),
                      key=lambda t: t.index)

    def outputs(self, order: int) -> list[Tensor]:
        return sorted((d["tensor"] for _, _, d in self.graph.out_edges(order, data=True)),
                      key=lambda t: t.index)

    def group_nodes(self, group_id: int) -> list[Node]:
        return [self.node(o) for o in self.groups[group_id].nodes]

    @property
    def device_groups(self) -> list[Group]:
        return [g for g in self.groups if g.where == "device"]
