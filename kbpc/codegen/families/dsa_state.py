"""Shared lookups for the DSA families (latent write, indexer, decode): the state buffers a
node reads belong to the writer node of the same attention block, as in kbpc.reference.ops."""
from __future__ import annotations

from kbpc.codegen.context import LowerCtx, LoweringError
from kbpc.ir.state import StateBuffer
from kbpc.ir.records import Node


def block_node(ctx: LowerCtx, node: Node, op: str) -> Node:
    """The one `op` node of node's block (e.g. the kv_write whose latent cache a decode reads)."""
    found = [n for n in ctx.bp.nodes() if n.block == node.block and (n.op == op or n.op_base == op)]
    if len(found) != 1:
        raise LoweringError(f"expected one {op} node in block {node.block}, found {len(found)}",
                            f"node {node.id}")
    return found[0]


def state_buffer(ctx: LowerCtx, name: str) -> StateBuffer:
    for s in ctx.plan.state:
        if s.name == name:
            return s
    raise LoweringError(f"no state buffer {name}")


def one_row(ctx: LowerCtx, node: Node, t) -> None:
    """The indexer kernels serve one decode row per launch."""
    if ctx.rows(t) != 1:
        raise LoweringError(f"{node.op} lowers one row per step, edge {t.id} has {ctx.rows(t)}",
                            f"node {node.id}")
