"""Collectives of a rank's step (tensor parallelism, kbpc/ir/parallel.py).

The collective region: every post-mix site of the step owns `ranks` slots of one symmetric
region (the same layout on every rank; NCCL registers it as a window, runtime_stub/kbp_tp.cu).
A rank's sublayer writes its BF16 partial output into its own slot (LowerCtx.buf gives the
producer a CommPtr instead of its arena buffer); the all-gather (a `Collective` launch placed by
`place_collectives` right before the launch that reads the site) fills the other slots; the
post-mix kernel reads RankParts<R> over the slots and sums them in rank order (`rank_parts`). One
collective per post-mix is as few as the math allows: every post-mix reads the full sum.

Expert-parallel MoE blocks get one more launch after their router: own_experts (tp_collective.cuh)
turns the routed ids into this rank's local ids (others -1)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kbpc.codegen.args import Aggregate, ArenaPtr, CommPtr, lit, walk
from kbpc.codegen.records import Collective, KernelInstance, Launch, StepProgram
from kbpc.ir.plan import Options, Plan

SLOT_ALIGN = 256
BF16 = "__nv_bfloat16"
OWN_HEADER = "tp_collective.cuh"
OWN_BLOCK = 64


@dataclass(frozen=True)
class CommSite:
    buffer: str                      # the partial output (`<producer>.<output>`)
    offset: int                      # slot 0 in the collective region
    slot_bytes: int


@dataclass(frozen=True)
class OwnExperts:
    ids: ArenaPtr                    # the router's topk_id buffer (int32 slots)
    slots: int
    base: int
    count: int


@dataclass(frozen=True)
class TpStep:
    rank: int
    ranks: int
    sites: tuple[CommSite, ...]
    comm_bytes: int
    experts: tuple[OwnExperts, ...]

    def site(self, buffer: str) -> CommSite | None:
        return next((s for s in self.sites if s.buffer == buffer), None)

    def slot(self, site: CommSite, rank: int, ctype: str = BF16) -> CommPtr:
        return CommPtr(site.offset + rank * site.slot_bytes, ctype)


def tp_step(plan: Plan) -> TpStep | None:
    """The collective layout of a rank's plan (None for an unsplit plan)."""
    shard = plan.shard
    if shard is None or shard.ranks == 1:
        return None
    buffers = {b.name: b for b in plan.buffers}
    sites, offset = [], 0
    for name in shard.partials:
        slot = -(-buffers[name].nbytes // SLOT_ALIGN) * SLOT_ALIGN
        sites.append(CommSite(name, offset, slot))
        offset += slot * shard.ranks
    experts = []
    for ex in shard.experts:
        ids = buffers.get(f"{ex.router}.topk_id")
        if ids is None:
            raise ValueError(f"expert parallelism rewrites {ex.router}'s ids in their buffer, and they have none "
                             "(fused into the experts' launch?)")
        experts.append(OwnExperts(ArenaPtr(ids.name, ids.offset, "int"), ids.elements, ex.base, ex.count))
    return TpStep(shard.rank, shard.ranks, tuple(sites), offset, tuple(experts))


def rank_parts(tp: TpStep | None, own: ArenaPtr | CommPtr, buffer: str) -> tuple[int, Aggregate]:
    """(R, RankParts<R>{...}) for a post-mix reading the partial output `buffer`: every rank's
    slot in rank order, or the one buffer as is (R = 1) without tensor parallelism."""
    site = tp.site(buffer) if tp is not None else None
    if site is None:
        return 1, Aggregate("kbp::mhc::RankParts<1>", (Aggregate(None, (own,)),))
    ptrs = tuple(tp.slot(site, r, f"const {BF16}") for r in range(tp.ranks))
    return tp.ranks, Aggregate(f"kbp::mhc::RankParts<{tp.ranks}>", (Aggregate(None, ptrs),))


def place_collectives(step: StepProgram, options: Options, tp: TpStep | None) -> StepProgram:
    """An all-gather before the first launch that reads another rank's slot of a site, and the
    ownership rewrite of each expert-parallel router's ids right after the launch that writes
    them. Without tensor parallelism the step is unchanged."""
    if tp is None:
        return step
    placed: set[str] = set()
    owned = {e.ids.buffer: e for e in tp.experts}
    instance = KernelInstance("tp", OWN_HEADER, "kbp::tp::own_experts<int>", ("int*", "int", "int", "int"))
    groups = []
    for g in step.groups:
        out: list = []
        for launch in g.launches:
            for site in _sites_read(tp, launch):
                if site.buffer not in placed:
                    placed.add(site.buffer)
                    out.append(Collective("all_gather", site.offset, site.slot_bytes, tp.ranks, g.group,
                                          launch.nodes, site.buffer))
            out.append(launch)
        for buffer, ex in owned.items():
            writers = [i for i, l in enumerate(out) if isinstance(l, Launch) and _writes(l, buffer)]
            if writers:
                own = Launch(instance, grid=(-(-ex.slots // OWN_BLOCK), 1, 1), block=(OWN_BLOCK, 1, 1), smem=0,
                             args=(ex.ids, lit(ex.slots), lit(ex.base), lit(ex.count)), group=g.group,
                             nodes=out[writers[-1]].nodes, note="expert parallel: local expert ids")
                out.insert(writers[-1] + 1, own)
        groups.append(dataclasses.replace(g, launches=tuple(out)))
    missing = {s.buffer for s in tp.sites} - placed
    if missing:
        raise ValueError(f"partial outputs no launch sums: {sorted(missing)}")
    instances = {i.name: i for i in step.instances}
    if tp.experts:
        instances[instance.name] = instance
    headers = sorted({*step.headers, *((OWN_HEADER,) if tp.experts else ())})
    return dataclasses.replace(step, groups=tuple(groups), instances=tuple(instances[k] for k in sorted(instances)),
                               headers=tuple(headers), tp_rank=tp.rank, tp_ranks=tp.ranks,
                               comm_bytes=tp.comm_bytes)


def _sites_read(tp: TpStep, launch) -> list[CommSite]:
    if not isinstance(launch, Launch):
        return []
    found = []
    ptrs = [a for arg in launch.args for a in walk(arg) if isinstance(a, CommPtr)]
    for site in tp.sites:
        own = site.offset + tp.rank * site.slot_bytes
        span = range(site.offset, site.offset + tp.ranks * site.slot_bytes)
        if any(p.offset in span and p.offset != own for p in ptrs):
            found.append(site)
    return found


def _writes(launch: Launch, buffer: str) -> bool:
    """Whether a launch takes a non-const pointer into `buffer` (the ids' producer)."""
    return any(isinstance(a, ArenaPtr) and a.buffer == buffer and not a.ctype.startswith("const")
               for arg in launch.args for a in walk(arg))
