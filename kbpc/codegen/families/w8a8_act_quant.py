"""w8a8_act_quant: dynamic FP8 E4M3 per-token activation quantization
(kernels/w8a8_act_quant.cuh): w8a8_act_quant_row<K[, SPLIT]>, SPLIT CTAs per row (row_split),
writing the planar fp8/token buffer (codes [rows][K], then one FP32 scale per row) that the wxay GEMVs read."""
from __future__ import annotations

from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families._projection import BF16, BLOCK, materialized, require
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup

HEADER = "w8a8_act_quant.cuh"


def row_split(k: int) -> int:
    """CTAs per row: one per 256-vector slice, so a thread encodes one 8-value vector. The correctly
    rounded division per value is the kernel's latency (one 256-thread CTA took ~10 us for a
    16384-wide row in the step on an H200); every CTA re-reads the row from L2 for the exact max."""
    return -(-(k // 8) // BLOCK[0])


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    launches = []
    for node in ctx.nodes(group):
        require(node.op_base == "act_quant", f"w8a8_act_quant has no kernel for op {node.op}", node)
        x, q = ctx.input(node), ctx.output(node)
        k, rows = x.dim_value, ctx.rows(x)
        require(q.format == "fp8/token", f"act_quant to {q.format}: only fp8/token (per row) is lowered", node)
        require(k % 8 == 0, f"K = {k} is not a multiple of 8", node)
        require(rows * k % 4 == 0, f"K = {k}: the planar FP32 scales would be unaligned", node)
        require(materialized(ctx, q), f"{q.id} is fused; w8a8_act_quant_row writes a buffer", node)
        out = ctx.quant(q)
        split = row_split(k)
        name = f"kbp::w8a8_act_quant_row<{k}>" if split == 1 else f"kbp::w8a8_act_quant_row<{k}, {split}>"
        inst = KernelInstance("w8a8_act_quant", HEADER, name, (f"const {BF16}*", "uint8_t*", "float*"))
        launches.append(Launch(inst, grid=(rows, split, 1), block=BLOCK, smem=0,
                               args=(ctx.buf(x), out.codes, out.scales), group=group.id, nodes=(node.id,)))
    return launches
