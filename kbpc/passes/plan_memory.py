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

from kbpc.errors import KbpcError
from kbpc.frontend.checks import rows_multiplier
from kbpc.ir.formats import FORMATS
from kbpc.ir.plan import Buffer, Plan, StateBuffer
from kbpc.passes.ordering import HappensBefore

HOST = -1   # a reader on the host (the runner's argmax): after every group

ALIGN = 256


def buffer_name(bp, t) -> str:
    return f"{bp.node(t.src).id}.{t.id.rsplit('.', 1)[-1]}"


def buffer_elements(bp, t) -> int:
    """Values per token of one tensor. The indexer's selection edge counts pools; the buffer the
    decode reads holds token ids: (top-k pools + the tail pool) x tokens per pool."""
    if bp.node(t.src).op == "index_select":
        return (t.dim_value + 1) * bp.symbols["index_kpool"]
    return t.dim_value


def _rows(bp, t) -> int:
    mult = rows_multiplier(t.rows, bp.symbols, 1)
    if mult is None:
        ins = [rows_multiplier(i.rows, bp.symbols, 1) for i in bp.inputs(t.src)]
        mult = max((m for m in ins if m is not None), default=1)
    return mult


def plan_memory(plan: Plan) -> Plan:
    bp = plan.blueprint
    pos = {s.group: s.position for s in plan.schedule}
    first: dict[str, int] = {}
    last: dict[str, int] = defaultdict(lambda: -1)
    info: dict[str, tuple[str, int, int, int]] = {}
    for t in bp.tensors():
        src, dst = bp.node(t.src), bp.node(t.dst)
        if src.group == dst.group or src.group not in pos:
            continue   # fused inside a kernel, or produced on the host
        name = buffer_name(bp, t)
        rows = _rows(bp, t)
        elements = buffer_elements(bp, t)
        nbytes = FORMATS[t.format].row_bytes(elements) * rows
        info[name] = (t.format, elements * rows, nbytes, src.group)
        first[name] = pos[src.group]
        reader = pos.get(dst.group, len(pos))   # host readers (argmax) read at the end
        last[name] = max(last[name], reader)
    buffers = [Buffer(name=n, format=f, elements=e, nbytes=b, producer_group=g,
                      first_use=first[n], last_use=last[n]) for n, (f, e, b, g) in info.items()]
    placed, arena = _allocate(plan, buffers) if plan.options.arena_reuse else _no_reuse(buffers)
    return dataclasses.replace(plan, buffers=tuple(sorted(placed, key=lambda b: (b.first_use, b.name))),
                               arena_bytes=arena, state=tuple(state_buffers(plan)))


def buffer_users(plan: Plan) -> dict[str, set[int]]:
    """Buffer name -> groups that touch it (producer and readers; HOST for a host reader)."""
    bp = plan.blueprint
    scheduled = {s.group for s in plan.schedule}
    users: dict[str, set[int]] = defaultdict(set)
    for t in bp.tensors():
        src, dst = bp.node(t.src), bp.node(t.dst)
        if src.group == dst.group or src.group not in scheduled:
            continue
        name = buffer_name(bp, t)
        users[name] |= {src.group, dst.group if dst.group in scheduled else HOST}
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


def state_buffers(plan: Plan) -> list[StateBuffer]:
    bp, ctx, c = plan.blueprint, plan.options.max_context, plan.blueprint.config.constants
    out: list[StateBuffer] = []
    for node in bp.nodes():
        if node.op == "hc_pre":   # the fused pre-mix's per-row arrival counters and mu workspace
            ins = bp.inputs(node.order)
            x = next(t for t in ins if bp.node(t.src).op in ("hc_post", "hc_expand"))
            width = next(t for t in ins if bp.node(t.src).op == "linear:hc_mix").dim_value
            rows = _rows(bp, x)
            out.append(StateBuffer(f"{node.id}.counters", rows * 4, (rows,), "i32"))
            out.append(StateBuffer(f"{node.id}.mix", rows * width * 4, (rows, width), "f32"))
        for kind in node.state:
            if kind == "conv:update":
                ch = bp.inputs(node.order)[0].dim_value
                out.append(StateBuffer(f"{node.id}.window", ch * c.conv_width * 4, (ch, c.conv_width), "f32"))
            elif kind == "h:update":
                heads, d = bp.symbols["lin_v_heads"], bp.symbols["lin_k_dim"]
                dv = bp.symbols["lin_v_dim"]
                out.append(StateBuffer(f"{node.id}.state", heads * d * dv * 4, (heads, d, dv), "f32"))
            elif kind == "latent:write":
                width = bp.inputs(node.order)[0].dim_value
                pages = -(-ctx // c.latent_page_tokens)
                out.append(StateBuffer(f"{node.id}.latent_cache", pages * c.latent_page_tokens * width,
                                       (pages, c.latent_page_tokens, width), "e4m3"))
                out.append(StateBuffer(f"{node.id}.block_table", pages * 4, (pages,), "i32"))
            elif kind == "index:write":
                d, kp = bp.symbols["index_head_dim"], bp.symbols["index_kpool"]
                pools = -(-ctx // kp)
                out.append(StateBuffer(f"{node.id}.pool_keys", pools * d * 4, (pools, d), "f32"))
            elif kind == "tail:update":
                d, kp = bp.symbols["index_head_dim"], bp.symbols["index_kpool"]
                out.append(StateBuffer(f"{node.id}.tail_keys", kp * d * 2, (kp, d), "bf16"))
                out.append(StateBuffer(f"{node.id}.tail_gates", kp * d * 2, (kp, d), "bf16"))
            elif kind == "index:read":   # scratch of the selection: scores per pool, chosen pools
                kp = bp.symbols["index_kpool"]
                pools, topk = -(-ctx // kp), bp.symbols["index_topk"] // kp
                out.append(StateBuffer(f"{node.id}.scores", pools * 4, (pools,), "f32"))
                out.append(StateBuffer(f"{node.id}.sel_pools", topk * 4, (topk,), "i32"))
            elif kind in ("conv:snapshot", "latent:read"):
                continue   # snapshots are for multi-token verify; reads use the writer's buffers
            else:
                raise KbpcError(f"unknown state kind {kind!r}", f"node {node.id}")
    return out
