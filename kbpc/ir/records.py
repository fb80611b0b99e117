"""Frozen IR records. Each is built once by the front end from validated JSON and never mutated;
passes produce new records with `dataclasses.replace`."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    weight: str | None
    activation: str | None
    output: tuple[str, ...]   # "bf16,f32,f32" in the JSON: one format per output


@dataclass(frozen=True)
class Node:
    id: str
    order: int                # the node's key in the graph and in edge endpoints
    layer: int | None
    block: str
    block_type: str
    kind: str | None
    op: str
    roles: tuple[str, ...]
    inserted: bool
    precision: Precision
    steps: tuple[str, ...]
    group: int
    kernel: str | None
    family: str | None
    point: tuple[tuple[str, str], ...]   # the kernel's variant point, sorted items
    compute: str | None
    numerics: str
    where: str                # "host" or "device"
    state: tuple[str, ...]    # e.g. ("index:write", "tail:update")

    @property
    def op_base(self) -> str:
        """`linear:q` -> `linear`."""
        return self.op.split(":", 1)[0]


@dataclass(frozen=True)
class Requant:
    src: str
    dst: str
    at: str


@dataclass(frozen=True)
class Tensor:
    """A tensor edge from one node to another (an id may fan out to several consumers)."""
    index: int                # position in the blueprint's edge list
    id: str
    src: int
    dst: int
    format: str
    rows: str | None          # "n", "n*top_k"; None: as the producer's input rows
    dim: str | None           # dim expression; None on quantized edges
    fused: bool
    dim_value: int
    bytes_per_token: int | None
    requant: Requant | None
    rows_per_token: int = 1   # rows resolved by the front end: rows = rows_per_token x batch


@dataclass(frozen=True)
class Group:
    id: int
    rule: str
    kernels: tuple[str, ...]
    where: str
    numerics: str
    compute: str | None
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class Layer:
    index: int
    kind: str
    template: str
    blocks: tuple[str, ...]
