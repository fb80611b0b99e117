"""w8a8_act_quant: dynamic FP8 E4M3 per-token activation quantization
(kernels/w8a8_act_quant.cuh): w8a8_act_quant_row_cluster<K, CL>, one CL-CTA cluster a row (row_cluster), or
w8a8_act_quant_row<K[, SPLIT]>, SPLIT CTAs per row (row_split), where the target has no clusters, both
writing the planar fp8/token buffer (codes [rows][K], then one FP32 scale per row) that the wxay GEMVs read."""
from __future__ import annotations

from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families._projection import BF16, BLOCK, materialized, require
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.targets import get_target

HEADER = "w8a8_act_quant.cuh"
PARAMS = (f"const {BF16}*", "uint8_t*", "float*")   # x, codes, scales (both forms)
RUN_VALUES = 4   # values a thread of w8a8_act_quant_row_cluster reads and encodes (one run)
# One thread-block cluster a row (w8a8_act_quant_row_cluster) where the target has clusters. H200,
# 128-expert seed shrink, 1k, replay timelines (bench/NOTES.md, thirty-second session): the DSA
# output quantizer (K = 16384) ends 4.4 us after the MLA decode instead of 8.4 with the 8-CTA split
# form, whose CTAs each read the whole row for its max (probes: ~1.7 us of it is the hand-off, ~3.2
# the row's loads and max, ~3.5 the encoding and stores); the DSA sublayer 61.1 -> 57.4 us.
ROW_CLUSTER = True


def row_cluster(k: int, max_cluster: int) -> int:
    """CTAs of w8a8_act_quant_row_cluster's cluster for a K-wide row: one run of four values a
    thread where the target's widest cluster allows, else the widest; 0 where the split form
    serves (no clusters, or one CTA would do)."""
    cl = min(-(-k // (RUN_VALUES * BLOCK[0])), max_cluster)
    return cl if ROW_CLUSTER and cl >= 2 else 0


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
        cl = row_cluster(k, get_target(ctx.plan.options.target).max_cluster)
        if cl:
            name, grid = f"kbp::w8a8_act_quant_row_cluster<{k}, {cl}>", (cl, rows, 1)
        else:
            split = row_split(k)
            name = f"kbp::w8a8_act_quant_row<{k}>" if split == 1 else f"kbp::w8a8_act_quant_row<{k}, {split}>"
            grid = (rows, split, 1)
        inst = KernelInstance("w8a8_act_quant", HEADER, name, PARAMS, cluster=cl)
        launches.append(Launch(inst, grid=grid, block=BLOCK, smem=0,
                               args=(ctx.buf(x), out.codes, out.scales), group=group.id, nodes=(node.id,)))
    return launches
