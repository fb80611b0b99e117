"""Helpers shared by the row-wise glue lowerings (glm_mhc, glm_swiglu_clamp, glm_moe_combine,
embed_copy): the vector width and grid of a kernel whose threads each own VEC consecutive
elements of one row, with the row on grid.y."""
from __future__ import annotations

from kbpc.codegen.context import LowerCtx
from kbpc.ir.records import Node, Tensor

BF16 = "__nv_bfloat16"


def vec_width(n: int, widest: int) -> int:
    """The widest of widest, widest/2, ..., 1 that divides a row of n elements (a 16-byte access
    at most: the kernels' launch contracts require n % VEC == 0)."""
    vec = widest
    while n % vec:
        vec //= 2
    return vec


def row_grid(n: int, threads: int, vec: int, rows: int) -> tuple[int, int, int]:
    """(ceil(n / (threads * vec)), rows, 1): the grid of a VEC-per-thread row kernel."""
    return (-(-n // (threads * vec)), rows, 1)


def split_inputs(ctx: LowerCtx, node: Node, *ops: str) -> tuple[list[Tensor], list[Tensor]]:
    """(inputs produced by a node whose op or op base is in ops, the other inputs)."""
    hit, rest = [], []
    for t in ctx.inputs(node):
        src = ctx.bp.node(t.src)
        (hit if src.op in ops or src.op_base in ops else rest).append(t)
    return hit, rest
