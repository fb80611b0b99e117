"""dense_bf16: one-row BF16 GEMV (kernels/dense_bf16.cuh), BF16 or FP32 output: the LM head, the
MoE router, the DSA indexer projections. Small N takes dense_gemv_bf16_opc with 1 or 2 outputs per
CTA (the same bits on more SMs; `outputs_per_cta`)."""
from __future__ import annotations

from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.records import KernelInstance, Launch
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
        kernel = f"kbp::dense_gemv_bf16<{k}, {out}>" if opc == 4 else f"kbp::dense_gemv_bf16_opc<{k}, {out}, {opc}>"
        inst = KernelInstance("dense_bf16", "dense_bf16.cuh", kernel,
                              ("const __nv_bfloat16*", "const __nv_bfloat16*", f"{out}*", "int"))
        launches.append(Launch(inst, grid=(-(-n // opc), 1, 1), block=(64 * opc, 1, 1), smem=0,
                               args=(ctx.weight(node, ctype="__nv_bfloat16"), ctx.buf(x), ctx.buf(y, out), lit(n)),
                               group=group.id, nodes=(node.id,)))
    return launches
