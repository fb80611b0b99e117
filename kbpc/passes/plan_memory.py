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
from kbpc.ir.plan import Buffer, Plan
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
    placed, arena = _allocate(plan, buffers) if plan.options.arena_reuse else _no_reuse(buffers)
    return dataclasses.replace(plan, buffers=tuple(sorted(placed, key=lambda b: (b.first_use, b.name))),
                               arena_bytes=arena, state=tuple(state_buffers(plan.blueprint, plan.options)))


def buffer_users(plan: Plan) -> dict[str, set[int]]:
    """Buffer name -> groups that touch it (producer and readers; HOST for a host reader)."""
    grouping = plan.grouping
    scheduled = {s.group for s in plan.schedule}
    users: dict[str, set[int]] = defaultdict(set)
    for t in grouping.crossing_edges():
        src, dst = grouping.group_of(t.src), grouping.group_of(t.dst)
        if src not in scheduled:
            continue
        users[buffer_name(plan.blueprint, t)] |= {src, dst if dst in scheduled else HOST}
    return users


def ordered(hb: HappensBefore, users: set[int], producer: int) -> bool:
    """Every group in `users` finishes before `producer` starts."""
    return HOST not in users and all(hb.before(u, producer) for u in users)


def _allocate(plan: Plan, buffers: list[Buffer]) -> tuple[list[Buffer], int]:
    """Greedy by size (largest first), first fit among offsets of the buffers that may be live at
    the same time as this one. A buffer's users occupy, per stream, positions up to need[s]; a
    producer runs after all of them if its vector clock covers need on every stream (vectorised
    over the placed buffers: the seed has ~1,300)."""
    hb = HappensBefore(plan.schedule)
    users = buffer_users(plan)
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
