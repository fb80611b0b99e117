"""The Plan: what the passes produce from a Blueprint and what code generation consumes.

Every pass is a pure function Plan -> Plan (`dataclasses.replace`); fields a pass has not filled
yet are empty tuples / None. The plan digest covers everything that changes generated code."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from functools import cached_property

from kbpc.errors import KbpcError
from kbpc.ir.graph import Blueprint
from kbpc.ir.grouping import Grouping
from kbpc.ir.limits import MAX_DIM
from kbpc.ir.parallel import RankShard, TensorParallel
from kbpc.ir.state import INDEX_CACHE_KINDS, StateBuffer
from kbpc.ir.weights import WeightSpec
from kbpc.targets import get_target


NUMERICS_MODES = ("exact", "fast")


@dataclass(frozen=True)
class Options:
    """Compile options; frozen and hashable (part of the build-cache key)."""
    target: str = "sm_90"
    tp: int = 1
    max_context: int = 4096
    max_streams: int = 4
    arena_reuse: bool = True          # False: every buffer its own bytes (debugging intermediates)
    numerics: str = "fast"            # exact: bit-exact vs the reference; fast: stated bounds (DESIGN)
    pdl: bool = True                  # programmatic dependent launch between a stream's kernels
    pdl_across_events: bool = True    # PDL also for a launch after a cross-stream event wait (measured faster)
    fuse: bool = True                 # merge groups across the blueprint's boundaries (fuse_groups)
    skip_fusions: tuple[str, ...] = ()   # fusion rules not to apply (kbpc/passes/fusion_rules.py names)
    add_fusions: tuple[str, ...] = ()    # opt-in fusion rules to apply as well
    batch: int = 1                    # tokens per step (decode rows); only 1 is lowered today
    index_cache: str = "f32"          # dsa_indexer pool keys: f32, or fp8 (rotated E4M3, kbpc/ir/state.py)
    act_quant: bool = True            # False: the debugging build without activation quantization
                                      # (kbpc/reference/no_act_quant.py; the `unquantized` variants)

    def __post_init__(self):
        get_target(self.target)
        if self.numerics not in NUMERICS_MODES:
            raise KbpcError(f"numerics must be one of {', '.join(NUMERICS_MODES)}, got {self.numerics!r}",
                            "--numerics")
        if self.index_cache not in INDEX_CACHE_KINDS:
            raise KbpcError(f"index cache must be one of {', '.join(INDEX_CACHE_KINDS)}, got {self.index_cache!r}",
                            "--index-cache")
        if self.batch != 1:
            raise KbpcError(f"batch {self.batch}: only batch-1 decode is lowered", "--batch")
        if self.max_streams < 1:
            raise KbpcError(f"max streams must be >= 1, got {self.max_streams}", "--max-streams")
        if self.tp < 1:
            raise KbpcError(f"tensor-parallel size must be >= 1, got {self.tp}", "--tp")
        if not self.act_quant and self.tp > 1:
            raise KbpcError("--no-act-quant builds one GPU's step (a debugging aid); drop --tp", "--no-act-quant")
        if not 1 <= self.max_context <= MAX_DIM:   # positions reach the kernels as 32-bit ints
            raise KbpcError(f"max context must be from 1 to {MAX_DIM}, got {self.max_context}", "--max-context")


@dataclass(frozen=True)
class LoweredGroup:
    """One kernel group of the blueprint after precision lowering: the kernels that run it here."""
    id: int
    rule: str
    family: str                       # the group's main family (its kernels' family)
    nodes: tuple[str, ...]            # node ids
    kernels: tuple[str, ...]          # the blueprint's kernel names (planned target)
    variant: str                      # kbpc's implementation on this target
    where: str                        # device | host
    requants: tuple[str, ...] = ()    # explicit requantizations this group performs ("a->b@edge")
    fused_from: tuple[int, ...] = ()  # the blueprint groups the fusion pass merged into this one


@dataclass(frozen=True)
class FusionRecord:
    """One candidate of the fusion pass: the groups of a rule's match, and whether they were merged
    (and why, or why not)."""
    rule: str
    groups: tuple[int, ...]
    applied: bool
    reason: str


@dataclass(frozen=True)
class Buffer:
    """A materialized tensor: one producer output, read by later groups."""
    name: str                         # producer node id + "." + output name
    format: str
    elements: int                     # per token (dim_value x rows multiplier)
    nbytes: int
    producer_group: int
    last_use: int                     # schedule position of the last reader (inclusive)
    first_use: int                    # schedule position of the producer
    offset: int = -1                  # arena offset (memory planning)
    alias_of: str = ""                # a concat input written in place: the concat output it lies in


@dataclass(frozen=True)
class ScheduledGroup:
    group: int
    position: int                     # launch order
    stream: int
    waits: tuple[int, ...]            # event ids this group waits for before launching
    record: int | None                # event id recorded after it, if another stream needs it
    cost_us: float                    # model: bytes / bandwidth + launch latency
    urgent: bool = False              # on the modelled critical path: its launches go first


@dataclass(frozen=True)
class Plan:
    blueprint: Blueprint = field(repr=False, compare=False, hash=False)
    options: Options
    groups: tuple[LoweredGroup, ...] = ()
    weights: tuple[WeightSpec, ...] = ()
    schedule: tuple[ScheduledGroup, ...] = ()
    streams: int = 1
    critical_path_us: float = 0.0
    serial_us: float = 0.0
    buffers: tuple[Buffer, ...] = ()
    arena_bytes: int = 0
    state: tuple[StateBuffer, ...] = ()
    fusions: tuple[FusionRecord, ...] = ()
    notes: tuple[str, ...] = ()
    parallel: TensorParallel | None = None    # tp > 1: the split (split_tensor_parallel)
    shard: RankShard | None = None            # a rank's own plan: which rank, what it holds

    @cached_property
    def grouping(self) -> Grouping:
        """Which group runs each node, and the queries passes ask of it (kbpc/ir/grouping.py)."""
        return Grouping(self.blueprint, self.groups)

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("blueprint")
        data["blueprint_id"] = self.blueprint.meta.blueprint_id
        data["symbols"] = self.blueprint.symbols
        data["config"] = self.blueprint.config.to_json()
        return data

    @property
    def digest(self) -> str:
        """SHA-256 of the canonical plan JSON: stable across runs and machines."""
        body = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(body).hexdigest()
