"""Sequence state: the one home for the kinds of state a node keeps across steps and their sizes.

Kinds come from a node's `state` field in the blueprint (`conv:update`, `h:update`,
`latent:write`, `index:write`, `tail:update`, `index:read`; `conv:snapshot` and `latent:read` own
nothing: snapshots serve multi-token verify, reads use the writer's buffers). The fused
hyper-connection pre-mix also keeps per-row arrival counters and a mu workspace. Caches are sized
for the compile's max context."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kbpc.errors import KbpcError

if TYPE_CHECKING:
    from kbpc.ir.graph import Blueprint
    from kbpc.ir.plan import Options
    from kbpc.ir.records import Node


@dataclass(frozen=True)
class StateBuffer:
    name: str                         # owner node id + "." + what
    nbytes: int
    shape: tuple[int, ...]
    storage: str


def hc_pre_state(pre: Node, rows: int, mix_width: int) -> tuple[StateBuffer, StateBuffer]:
    """The fused pre-mix's arrival counters (zero between launches) and its mu workspace."""
    return (StateBuffer(f"{pre.id}.counters", rows * 4, (rows,), "i32"),
            StateBuffer(f"{pre.id}.mix", rows * mix_width * 4, (rows, mix_width), "f32"))


def _hc_pre(bp: Blueprint, node: Node, batch: int) -> tuple[StateBuffer, ...]:
    ins = bp.inputs(node.order)
    x = next(t for t in ins if bp.node(t.src).op in ("hc_post", "hc_expand"))
    width = next(t for t in ins if bp.node(t.src).op == "linear:hc_mix").dim_value
    return hc_pre_state(node, x.rows_per_token * batch, width)


def _of_kind(bp: Blueprint, node: Node, kind: str, ctx: int) -> tuple[StateBuffer, ...]:
    sym, c = bp.symbols, bp.config.constants
    if kind == "conv:update":
        ch = bp.inputs(node.order)[0].dim_value
        return (StateBuffer(f"{node.id}.window", ch * c.conv_width * 4, (ch, c.conv_width), "f32"),)
    if kind == "h:update":
        heads, d, dv = sym["lin_v_heads"], sym["lin_k_dim"], sym["lin_v_dim"]
        return (StateBuffer(f"{node.id}.state", heads * d * dv * 4, (heads, d, dv), "f32"),)
    if kind == "latent:write":
        width = bp.inputs(node.order)[0].dim_value
        pages = -(-ctx // c.latent_page_tokens)
        return (StateBuffer(f"{node.id}.latent_cache", pages * c.latent_page_tokens * width,
                            (pages, c.latent_page_tokens, width), "e4m3"),
                StateBuffer(f"{node.id}.block_table", pages * 4, (pages,), "i32"))
    if kind == "index:write":
        d, kp = sym["index_head_dim"], sym["index_kpool"]
        pools = -(-ctx // kp)
        return (StateBuffer(f"{node.id}.pool_keys", pools * d * 4, (pools, d), "f32"),)
    if kind == "tail:update":
        d, kp = sym["index_head_dim"], sym["index_kpool"]
        return (StateBuffer(f"{node.id}.tail_keys", kp * d * 2, (kp, d), "bf16"),
                StateBuffer(f"{node.id}.tail_gates", kp * d * 2, (kp, d), "bf16"))
    if kind == "index:read":   # scratch of the selection: scores per pool, chosen pools
        kp = sym["index_kpool"]
        pools, topk = -(-ctx // kp), sym["index_topk"] // kp
        return (StateBuffer(f"{node.id}.scores", pools * 4, (pools,), "f32"),
                StateBuffer(f"{node.id}.sel_pools", topk * 4, (topk,), "i32"))
    if kind in ("conv:snapshot", "latent:read"):
        return ()
    raise KbpcError(f"unknown state kind {kind!r}", f"node {node.id}")


def state_buffers(bp: Blueprint, options: Options) -> list[StateBuffer]:
    out: list[StateBuffer] = []
    for node in bp.nodes():
        if node.op == "hc_pre":
            out.extend(_hc_pre(bp, node, options.batch))
        for kind in node.state:
            out.extend(_of_kind(bp, node, kind, options.max_context))
    return out
