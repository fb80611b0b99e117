"""plan_memory: the activation arena with liveness-based reuse, and the sequence state and caches.

Needs: the schedule. Guarantees: every tensor that crosses a group boundary (a non-fused edge) has
a buffer at a 256-byte aligned arena offset, and two buffers share bytes only if their live ranges
(producer position .. last reader position) do not overlap; `arena_bytes` is the peak, to compare
with the sum of all buffers. State buffers (conv windows, recurrent state, paged latent cache,
indexer caches) are sized for `options.max_context`."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

from kbpc.errors import KbpcError
from kbpc.frontend.checks import rows_multiplier
from kbpc.ir.formats import FORMATS
from kbpc.ir.plan import Buffer, Plan, StateBuffer

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
    placed, arena = _allocate(buffers)
    return dataclasses.replace(plan, buffers=tuple(sorted(placed, key=lambda b: (b.first_use, b.name))),
                               arena_bytes=arena, state=tuple(state_buffers(plan)))


def _allocate(buffers: list[Buffer]) -> tuple[list[Buffer], int]:
    """Greedy by size (largest first), first fit among offsets not live at the same time."""
    placed: list[Buffer] = []
    top = 0
    for b in sorted(buffers, key=lambda b: (-b.nbytes, b.first_use, b.name)):
        size = -(-b.nbytes // ALIGN) * ALIGN
        busy = sorted((p.offset, p.offset + -(-p.nbytes // ALIGN) * ALIGN) for p in placed
                      if not (p.last_use < b.first_use or b.last_use < p.first_use))
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append(dataclasses.replace(b, offset=offset))
        top = max(top, offset + size)
    return placed, top


def state_buffers(plan: Plan) -> list[StateBuffer]:
    bp, ctx, c = plan.blueprint, plan.options.max_context, plan.blueprint.config.constants
    out: list[StateBuffer] = []
    for node in bp.nodes():
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
            elif kind in ("conv:snapshot", "latent:read", "index:read"):
                continue   # snapshots are for multi-token verify; reads use the writer's buffers
            else:
                raise KbpcError(f"unknown state kind {kind!r}", f"node {node.id}")
    return out
