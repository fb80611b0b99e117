"""Helpers shared by the projection family lowerings (w4a16_gemv, w4a4_mx, w4a4_mx_static, wxay,
w8a8_act_quant): weight argument triples, the group's GEMM nodes, and the size checks the kernels'
launch contracts state (a violated one is a LoweringError, never a silently wrong launch)."""
from __future__ import annotations

from kbpc.codegen.context import LowerCtx, LoweringError
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node, Tensor
from kbpc.ir.buffers import buffer_name
from kbpc.targets import get_target

BF16 = "__nv_bfloat16"
BLOCK = (256, 1, 1)     # every projection kernel runs 256-thread CTAs


def require(ok: bool, what: str, where: Node | LoweredGroup) -> None:
    if not ok:
        where_s = f"node {where.id}" if isinstance(where, Node) else f"group {where.id} ({where.rule})"
        raise LoweringError(what, where_s)


def linears(ctx: LowerCtx, group: LoweredGroup) -> list[Node]:
    """The group's GEMM nodes (linear:*), in group order."""
    return [n for n in ctx.nodes(group) if n.op_base == "linear"]


def nvfp4_weight(ctx: LowerCtx, node: Node) -> tuple[str, str, str]:
    """(codes, E4M3 scales, host FP32 tensor scale) of a dense NVFP4 weight."""
    return (ctx.weight(node), ctx.weight(node, "weight_scale"), ctx.weight_value(node, "weight_scale_2"))


def fp8_weight(ctx: LowerCtx, node: Node) -> tuple[str, str]:
    """(E4M3 codes, FP32 per-channel scales) of an fp8/channel weight."""
    return ctx.weight(node), ctx.weight(node, "weight_scale", "float")


def one_row(ctx: LowerCtx, t: Tensor, node: Node) -> None:
    """The GEMV kernels take one activation row (a decode step of one token)."""
    require(ctx.rows(t) == 1, f"{t.id} has {ctx.rows(t)} rows; this GEMV kernel takes one", node)


def materialized(ctx: LowerCtx, t: Tensor) -> bool:
    """Whether an edge has an arena buffer (False: fused inside its group)."""
    name = buffer_name(ctx.bp, t)
    return any(b.name == name for b in ctx.plan.buffers)


def prefetch_row_bytes(ctx: LowerCtx, rows: int, row_bytes: int, side_fraction: float = 0.0) -> int:
    """PF of a projection launch (w4a16_gemv's fast forms): the first bytes of each of its `rows` weight rows (`row_bytes`
    long; `side_fraction` more per byte for parts prefetched beside them, as NVFP4's block scales)
    that its CTAs prefetch into L2 before pdl_wait, whole 128-byte lines, at most the target's
    l2_prefetch_bytes for the launch. Under PDL a projection's CTAs start while the kernel before
    it (often a latency-bound norm, quantizer or attention kernel) runs, so DRAM streams weights
    that would otherwise wait for the dependency; without PDL there is no such window (0)."""
    if not ctx.plan.options.pdl or rows <= 0:
        return 0
    budget = get_target(ctx.plan.options.target).l2_prefetch_bytes
    per_row = int(budget / (rows * (1.0 + side_fraction)))
    return min(row_bytes // 128 * 128, per_row // 128 * 128)

