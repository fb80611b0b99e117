"""rms_norm: RMSNorm of one row (kernels/rms_norm.cuh): rms_norm_vanilla (plain weight) and
norm::rms_norm (1 + weight), as the blueprint's kernel names say.

A group the fusion pass merged with the per-token FP8 quantizer that reads the norm's output
(rule rms_norm_fp8_quant) lowers to rms_norm_quant_fp8: the planar fp8/token buffer (codes, then
one FP32 scale per row) is written from the normed values in registers, and the BF16 normed row
only when a group outside reads it."""
from __future__ import annotations

from kbpc.codegen.args import NULL, lit
from kbpc.codegen.context import LowerCtx, flt
from kbpc.codegen.families._projection import materialized, require
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node
from kbpc.reference.rms_norm import block_threads  # the reference's rule: same reduction order

NORM_ONLY = 0   # RmsMode::kNormOnly
BF = "__nv_bfloat16"


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    nodes = ctx.nodes(group)
    quants = [n for n in nodes if n.op_base == "act_quant"]
    if quants:
        require(len(nodes) == 2 and len(quants) == 1 and nodes[0].op == "rms_norm",
                f"rms_norm has no fused kernel for the nodes {[n.op for n in nodes]}", group)
        return [_norm_quant(ctx, group, nodes[0], quants[0])]
    return [_norm(ctx, group, node) for node in nodes]


def _one_plus(node: Node) -> str:
    return "false" if node.kernel and "vanilla" in node.kernel else "true"


def _norm(ctx: LowerCtx, group: LoweredGroup, node: Node) -> Launch:
    x, y = ctx.input(node), ctx.output(node)
    d = x.dim_value
    threads = block_threads(d)
    inst = KernelInstance("rms_norm", "rms_norm.cuh", f"kbp::rms_norm<{d}, {threads}, {_one_plus(node)}, {NORM_ONLY}>",
                          (f"{BF}*", "long", "long", f"const {BF}*", "long", f"{BF}*", "long",
                           f"const {BF}*", "float", f"{BF}*", "long", "long"))
    return Launch(inst, grid=(1, 1, 1), block=(threads, 1, 1), smem=0,
                  args=(ctx.buf(x), lit(d), lit(0), NULL, lit(0), NULL, lit(0),
                        ctx.weight(node, ctype=BF), flt(ctx.c.rms_eps), ctx.buf(y), lit(d), lit(0)),
                  group=group.id, nodes=(node.id,))


def norm_quant_instance(d: int, one_plus: bool) -> KernelInstance:
    """rms_norm_quant_fp8 for rows of d (the reference's block size)."""
    return KernelInstance("rms_norm", "rms_norm.cuh",
                          f"kbp::rms_norm_quant_fp8<{d}, {block_threads(d)}, {str(one_plus).lower()}>",
                          (f"const {BF}*", "long", f"const {BF}*", "float", f"{BF}*", "long", "uint8_t*", "float*"))


def _norm_quant(ctx: LowerCtx, group: LoweredGroup, norm: Node, quant: Node) -> Launch:
    x, y, q = ctx.input(norm), ctx.output(norm), ctx.output(quant)
    d, rows = x.dim_value, ctx.rows(x)
    require(ctx.input(quant).src == norm.order, f"{quant.id} does not quantize {norm.id}'s output", quant)
    require(q.format == "fp8/token", f"act_quant to {q.format}: the fused form writes fp8/token", quant)
    require(d % 2 == 0 and rows * d % 4 == 0, f"D = {d}: BF16 pairs and 4-byte aligned FP32 scales", quant)
    out = ctx.quant(q)
    normed = ctx.buf(y) if materialized(ctx, y) else NULL
    inst = norm_quant_instance(d, _one_plus(norm) == "true")
    return Launch(inst, grid=(rows, 1, 1), block=(block_threads(d), 1, 1), smem=0,
                  args=(ctx.buf(x), lit(d), ctx.weight(norm, ctype=BF), flt(ctx.c.rms_eps), normed, lit(d),
                        out.codes, out.scales),
                  group=group.id, nodes=(norm.id, quant.id))
