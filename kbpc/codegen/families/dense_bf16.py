"""dense_bf16: one-row BF16 GEMV (kernels/dense_bf16.cuh), BF16 or FP32 output: the LM head, the
MoE router, the DSA indexer projections. Small N takes dense_gemv_bf16_opc with 1 or 2 outputs per
CTA (the same bits on more SMs; `outputs_per_cta`).

A projection that only feeds an unranked select's scores (kbpc.ir.ops.unranked_scores_reader: the
index queries and head weights in numerics `fast`) takes dense_gemv_bf16_scores_only, which reads
SEQ and POS and idles while that select lists every valid pool without scoring (contexts up to
index_topk tokens); past that it computes the same bits."""
from __future__ import annotations

from kbpc.codegen.args import StepInput, lit
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.ops import unranked_scores_reader
from kbpc.ir.plan import LoweredGroup

MIN_CTAS = 264           # two CTAs per SM of a 132-SM part before CTAs get fewer outputs


def outputs_per_cta(n: int) -> int:
    """4 (the 256-thread kernel) unless that leaves fewer than MIN_CTAS CTAs; then 2 or 1."""
    for opc in (4, 2):
        if -(-n // opc) >= MIN_CTAS:
            return opc
    return 1


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    launches = []
    for node in ctx.nodes(group):
        x, y = ctx.input(node), ctx.output(node)
        k, n = x.dim_value, y.dim_value
        out = "float" if node.precision.output[0] == "f32" else "__nv_bfloat16"
        opc = outputs_per_cta(n)
        args = (ctx.weight(node, ctype="__nv_bfloat16"), ctx.buf(x), ctx.buf(y, out), lit(n))
        select = unranked_scores_reader(ctx.bp, node, ctx.plan.options.numerics)
        if select is not None:
            inst = scores_only_instance(k, out, opc, ctx.sym["index_kpool"], ctx.output(select).dim_value)
            args += (StepInput("SEQ"), StepInput("POS"))
        else:
            inst = instance(k, out, opc)
        launches.append(Launch(inst, grid=(-(-n // opc), 1, 1), block=(64 * opc, 1, 1), smem=0, args=args,
                               group=group.id, nodes=(node.id,)))
    return launches


PARAMS = ("const __nv_bfloat16*", "const __nv_bfloat16*")


def instance(k: int, out: str, opc: int) -> KernelInstance:
    kernel = f"kbp::dense_gemv_bf16<{k}, {out}>" if opc == 4 else f"kbp::dense_gemv_bf16_opc<{k}, {out}, {opc}>"
    return KernelInstance("dense_bf16", "dense_bf16.cuh", kernel, (*PARAMS, f"{out}*", "int"))


def scores_only_instance(k: int, out: str, opc: int, kp: int, topk_pools: int) -> KernelInstance:
    """The kernel that idles while its unranked select (kp tokens a pool, top topk_pools) lists every pool."""
    return KernelInstance("dense_bf16", "dense_bf16.cuh",
                          f"kbp::dense_gemv_bf16_scores_only<{k}, {out}, {opc}, {kp}, {topk_pools}>",
                          (*PARAMS, f"{out}*", "int", "const int32_t*", "const int32_t*"))
