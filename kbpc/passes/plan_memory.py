"""plan_memory: the activation arena with liveness-based reuse, and the sequence state and caches.

Needs: the schedule. Guarantees: every tensor that crosses a group boundary (a non-fused edge) has
a buffer at a 256-byte aligned arena offset, and two buffers share bytes only if every use of one
happens before the other's producer starts (stream order or events: launch order alone is not
enough when streams run concurrently); `arena_bytes` is the peak, to compare with the sum of all
buffers. State buffers (conv windows, recurrent state, paged latent cache,
indexer caches) are sized for `options.max_context`."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from kbpc.ir.buffers import buffer_bytes, buffer_elements, buffer_name, buffer_rows, carried_format
from kbpc.ir.plan import Buffer, FusionRecord, Plan
from kbpc.ir.state import state_buffers
from kbpc.passes.ordering import HappensBefore

HOST = -1   # a reader on the host (the runner's argmax): after every group

ALIGN = 256


def plan_memory(plan: Plan) -> Plan:
    bp, grouping, batch, act_quant = plan.blueprint, plan.grouping, plan.options.batch, plan.options.act_quant
    pos = {s.group: s.position for s in plan.schedule}
    first: dict[str, int] = {}
    last: dict[str, int] = defaultdict(lambda: -1)
    info: dict[str, tuple[str, int, int, int]] = {}
    for t in grouping.crossing_edges():
        src, dst = grouping.group_of(t.src), grouping.group_of(t.dst)
        if src not in pos:
            continue   # produced on the host
        name = buffer_name(bp, t)
        elements = buffer_elements(bp, t) * buffer_rows(t, batch)
        info[name] = (carried_format(t, act_quant), elements, buffer_bytes(bp, t, batch, act_quant), src)
        first[name] = pos[src]
        reader = pos.get(dst, len(pos))   # host readers (argmax) read at the end
        last[name] = max(last[name], reader)
    buffers = [Buffer(name=n, format=f, elements=e, nbytes=b, producer_group=g,
                      first_use=first[n], last_use=last[n]) for n, (f, e, b, g) in info.items()]
    if plan.options.arena_reuse:
        aliases = in_place_concats(plan, buffers)
        placed, arena = _allocate(plan, _regions(buffers, aliases), aliases)
        placed += _place_aliases(buffers, aliases, {b.name: b.offset for b in placed})
    else:
        aliases, (placed, arena) = {}, _no_reuse(buffers)
    return dataclasses.replace(plan, buffers=tuple(sorted(placed, key=lambda b: (b.first_use, b.name))),
                               arena_bytes=arena, state=tuple(state_buffers(plan.blueprint, plan.options)),
                               fusions=plan.fusions + _alias_records(plan, aliases))


def in_place_concats(plan: Plan, buffers: list[Buffer]) -> dict[str, tuple[str, int]]:
    """Concat inputs that can be written in place: input buffer -> (the concat's output buffer,
    byte offset in it). A concat group (one concat node) qualifies when its output and inputs are
    one-row buffers of one format, every input is read by the concat alone, all come from one
    producer group, and each lands at a 256-byte aligned offset (the arena's alignment). The
    producer then writes the concatenated row directly and the concat copies nothing (its lowering
    emits no launch); the output buffer lives from that producer on."""
    bp, grouping = plan.blueprint, plan.grouping
    by_name = {b.name: b for b in buffers}
    readers: dict[str, set[int]] = defaultdict(set)
    for t in grouping.crossing_edges():
        readers[buffer_name(bp, t)].add(grouping.group_of(t.dst))
    aliases: dict[str, tuple[str, int]] = {}
    for g in plan.groups:
        nodes = grouping.nodes(g.id)
        if len(nodes) != 1 or nodes[0].op != "concat":
            continue
        ins, outs = bp.inputs(nodes[0].order), bp.outputs(nodes[0].order)
        out = by_name.get(buffer_name(bp, outs[0])) if len(outs) == 1 else None
        parts = [by_name.get(buffer_name(bp, t)) for t in ins]
        if out is None or not parts or any(p is None for p in parts):
            continue
        one_row = all(b.elements == t.dim_value for b, t in zip((out, *parts), (outs[0], *ins)))
        same = all(p.format == out.format for p in parts) and len({p.producer_group for p in parts}) == 1
        only_concat = all(readers[p.name] == {g.id} for p in parts)
        offsets = [sum(p.nbytes for p in parts[:i]) for i in range(len(parts))]
        if (one_row and same and only_concat and sum(p.nbytes for p in parts) == out.nbytes
                and all(o % ALIGN == 0 for o in offsets)):
            aliases.update({p.name: (out.name, o) for p, o in zip(parts, offsets)})
    return aliases


def _regions(buffers: list[Buffer], aliases: dict[str, tuple[str, int]]) -> list[Buffer]:
    """The buffers to allocate: a concat output written in place becomes one region that its
    inputs' producer starts; the inputs are placed inside it afterwards."""
    by_name = {b.name: b for b in buffers}
    start = {region: by_name[name] for name, (region, _) in aliases.items()}
    return [dataclasses.replace(b, producer_group=start[b.name].producer_group, first_use=start[b.name].first_use)
            if b.name in start else b for b in buffers if b.name not in aliases]


def _place_aliases(buffers: list[Buffer], aliases: dict[str, tuple[str, int]],
                   offsets: dict[str, int]) -> list[Buffer]:
    return [dataclasses.replace(b, offset=offsets[aliases[b.name][0]] + aliases[b.name][1],
                                alias_of=aliases[b.name][0]) for b in buffers if b.name in aliases]


def _alias_records(plan: Plan, aliases: dict[str, tuple[str, int]]) -> tuple[FusionRecord, ...]:
    """One report line per concat written in place (its group keeps no launch)."""
    concat_of = {buffer_name(plan.blueprint, t): plan.grouping.group_of(t.dst) for t in plan.grouping.crossing_edges()}
    groups = sorted({concat_of[name] for name in aliases})
    why = "the concat's inputs are written in place by their producer: the copy and its launch disappear"
    return tuple(FusionRecord("concat_in_place", (g,), True, why) for g in groups)


def buffer_users(plan: Plan, aliases: dict[str, tuple[str, int]] | None = None) -> dict[str, set[int]]:
    """Buffer name -> groups that touch it (producer and readers; HOST for a host reader). A concat
    input written in place and the output it lies in are one region: each has the region's users.
    `aliases` (input -> (output, offset)) defaults to the plan's placed buffers' alias_of."""
    grouping = plan.grouping
    scheduled = {s.group for s in plan.schedule}
    users: dict[str, set[int]] = defaultdict(set)
    for t in grouping.crossing_edges():
        src, dst = grouping.group_of(t.src), grouping.group_of(t.dst)
        if src not in scheduled:
            continue
        users[buffer_name(plan.blueprint, t)] |= {src, dst if dst in scheduled else HOST}
    if aliases is None:
        aliases = {b.name: (b.alias_of, 0) for b in plan.buffers if b.alias_of}
    for name, (region, _) in aliases.items():
        users[region] |= users[name]
    for name, (region, _) in aliases.items():
        users[name] = users[region]
    return users


def ordered(hb: HappensBefore, users: set[int], producer: int) -> bool:
    """Every group in `users` finishes before `producer` starts."""
    return HOST not in users and all(hb.before(u, producer) for u in users)


def _allocate(plan: Plan, buffers: list[Buffer], aliases: dict[str, tuple[str, int]]) -> tuple[list[Buffer], int]:
    """Greedy by size (largest first), first fit among offsets of the buffers that may be live at
    the same time as this one. A buffer's users occupy, per stream, positions up to need[s]; a
    producer runs after all of them if its vector clock covers need on every stream (vectorised
    over the placed buffers: the seed has ~1,300)."""
    hb = HappensBefore(plan.schedule)
    users = buffer_users(plan, aliases)
    streams = max((s.stream for s in plan.schedule), default=0) + 1
    order = sorted(buffers, key=lambda b: (-b.nbytes, b.first_use, b.name))
    n = len(order)
    need = np.full((n, streams), -1, np.int64)       # last user position per stream (-1: none)
    host = np.zeros(n, bool)                          # read on the host: never reusable
    clock = np.full((n, streams), -1, np.int64)       # producer's vector clock
    ppos = np.zeros(n, np.int64)
    pstream = np.zeros(n, np.int64)
    for k, b in enumerate(order):
        for g in users[b.name]:
            if g == HOST:
                host[k] = True
            else:
                sg = hb.pos[g]
                need[k, sg.stream] = max(need[k, sg.stream], sg.position)
        for st, p in hb.clock[b.producer_group].items():
            clock[k, st] = p
        ppos[k], pstream[k] = hb.pos[b.producer_group].position, hb.pos[b.producer_group].stream
    sidx = np.arange(streams)
    offsets = np.zeros(n, np.int64)
    ends = np.zeros(n, np.int64)
    placed: list[Buffer] = []
    top = 0
    for k, b in enumerate(order):
        size = -(-b.nbytes // ALIGN) * ALIGN
        if k:
            # placed p before b: all p's uses before b's producer (b's clock covers them)
            covered = (need[:k] < ppos[k]) & ((sidx == pstream[k]) | (clock[k] >= need[:k]))
            p_before_b = ~host[:k] & np.all((need[:k] < 0) | covered, axis=1)
            # b before placed p: all b's uses before p's producer
            covered = (need[k] < ppos[:k, None]) & ((sidx == pstream[:k, None]) | (clock[:k] >= need[k]))
            b_before_p = (not host[k]) & np.all((need[k] < 0) | covered, axis=1)
            live = ~(p_before_b | b_before_p)
            busy = sorted(zip(offsets[:k][live].tolist(), ends[:k][live].tolist()))
        else:
            busy = []
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        offsets[k], ends[k] = offset, offset + size
        placed.append(dataclasses.replace(b, offset=offset))
        top = max(top, offset + size)
    return placed, top


def _no_reuse(buffers: list[Buffer]) -> tuple[list[Buffer], int]:
    """Every buffer at its own offset, so after a step the arena holds every intermediate."""
    placed, top = [], 0
    for b in sorted(buffers, key=lambda b: (b.first_use, b.name)):
        placed.append(dataclasses.replace(b, offset=top))
        top += -(-b.nbytes // ALIGN) * ALIGN
    return placed, top
