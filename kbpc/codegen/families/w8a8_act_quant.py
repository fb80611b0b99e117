"""w8a8_act_quant: dynamic FP8 E4M3 per-token activation quantization
(kernels/w8a8_act_quant.cuh): w8a8_act_quant_row<K>, one CTA per row, writing the planar fp8/token
buffer (codes [rows][K], then one FP32 scale per row) that the wxay GEMVs read."""
from __future__ import annotations

from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families._projection import BF16, BLOCK, materialized, require
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup

HEADER = "w8a8_act_quant.cuh"


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
        inst = KernelInstance("w8a8_act_quant", HEADER, f"kbp::w8a8_act_quant_row<{k}>",
                              (f"const {BF16}*", "uint8_t*", "float*"))
        launches.append(Launch(inst, grid=(rows, 1, 1), block=BLOCK, smem=0,
                               args=(ctx.buf(x), out.codes, out.scales), group=group.id, nodes=(node.id,)))
    return launches
