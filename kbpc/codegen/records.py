"""Typed records the templates render. Nothing here knows a family's math: family lowerings
(kbpc/codegen/families/) turn a group into Launch records."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kbpc.codegen.args import Arg, ArenaPtr

if TYPE_CHECKING:
    from kbpc.codegen.collectives import TpStep


@dataclass(frozen=True)
class KernelInstance:
    """One instantiation of a kernels/ template: compiled in its own TU, launched through a typed
    host launcher `kbp_launch_<name>(grid, block, smem, stream, params...)`."""
    family: str
    header: str                      # kernels/<header>
    kernel: str                      # C++ name with template arguments
    params: tuple[str, ...]          # C++ parameter types, in order
    cluster: int = 0                 # the kernel's compile-time cluster width (__cluster_dims__), 0 if
                                     # none: the launcher opts a non-portable width (> 8) in

    @property
    def name(self) -> str:
        """Procedural: family, the kernel's template arguments, and a short hash of the whole."""
        base = re.sub(r"[^A-Za-z0-9]+", "_", self.kernel.removeprefix("kbp::")).strip("_")
        digest = hashlib.sha256(repr((self.header, self.kernel, self.params)).encode()).hexdigest()[:8]
        return f"{base[:80]}_{digest}"


@dataclass(frozen=True)
class Launch:
    instance: KernelInstance
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: tuple[Arg, ...]            # typed references (kbpc.codegen.args), rendered by render_args
    group: int
    nodes: tuple[str, ...]
    note: str = ""
    pdl: bool = False                # launched with programmatic dependent launch (launch pass)
    priority: bool = False           # launched at the highest priority (launch pass mark_priority)
    aside: tuple[str, ...] = ()      # off the group's stream (launch pass issue_aside): these nodes' groups wait for it


@dataclass(frozen=True)
class Collective:
    """A collective of the step (tensor parallelism): the in-place all-gather of one post-mix
    site's BF16 partials, `slot_bytes` per rank from `offset` of the collective region, issued on
    the group's stream before the launch that sums them (launch pass place_collectives)."""
    kind: str                        # "all_gather"
    offset: int
    slot_bytes: int
    ranks: int
    group: int
    nodes: tuple[str, ...]           # the post-mix node that reads it
    buffer: str                      # the partial output gathered (`<producer>.<output>`)


@dataclass(frozen=True)
class GroupCode:
    """What the step program does for one scheduled group."""
    group: int
    rule: str
    family: str
    stream: int
    waits: tuple[int, ...]
    record: int | None
    nodes: tuple[str, ...]
    launches: tuple[Launch | Collective, ...]
    urgent: bool = False             # the schedule's: on the modelled critical path


@dataclass(frozen=True)
class ProfileMark:
    """One mark of the serialized profile (kbp_profile_step): the event recorded after one launch
    (or collective) of the step, in the step's issue order, so a family's time is its own kernels'
    even where a fused group holds launches of several families."""
    group: int                       # the plan group the launch belongs to
    family: str                      # the launch's kernel family ("collective" for a collective)
    stream: int
    nodes: tuple[str, ...]           # the blueprint nodes the launch computes

    def to_json(self) -> dict:
        return {"group": self.group, "family": self.family, "stream": self.stream, "nodes": list(self.nodes)}


def profile_marks(groups: tuple[GroupCode, ...]) -> tuple[ProfileMark, ...]:
    """The marks of a step program's groups, in the order step.cu.j2 records them."""
    return tuple(ProfileMark(g.group, l.instance.family if isinstance(l, Launch) else "collective", g.stream, l.nodes)
                 for g in groups for l in g.launches)


@dataclass(frozen=True)
class WeightBinding:
    index: int
    name: str
    storage: str
    nbytes: int


@dataclass(frozen=True)
class StateBinding:
    index: int
    name: str
    nbytes: int
    storage: str


@dataclass(frozen=True)
class StepProgram:
    blueprint_id: str
    plan_digest: str
    command: str
    target: str
    streams: int
    events: int
    arena_bytes: int
    vocab: int
    logits_buffer: ArenaPtr          # the BF16 logits row
    logits_bytes: int
    groups: tuple[GroupCode, ...]
    weights: tuple[WeightBinding, ...]
    state: tuple[StateBinding, ...]
    headers: tuple[str, ...]         # kernels/ headers whose types the step uses
    instances: tuple[KernelInstance, ...]
    tp_rank: int = 0                 # tensor parallelism: this step's rank of tp_ranks
    tp_ranks: int = 1
    comm_bytes: int = 0              # the collective region (kbpc/codegen/collectives.py)
    collective_layout: TpStep | None = None   # read by the launch pass place_collectives
    stamps: bool = False             # a profiling build: every TU exports its phase-stamp log
