"""dense_bf16: one-row BF16 GEMV (kernels/dense_bf16.cuh), BF16 or FP32 output: the LM head, the
MoE router, the DSA indexer projections."""
from __future__ import annotations

from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    launches = []
    for node in ctx.nodes(group):
        x, y = ctx.input(node), ctx.output(node)
        k, n = x.dim_value, y.dim_value
        out = "float" if node.precision.output[0] == "f32" else "__nv_bfloat16"
        inst = KernelInstance("dense_bf16", "dense_bf16.cuh", f"kbp::dense_gemv_bf16<{k}, {out}>",
                              ("const __nv_bfloat16*", "const __nv_bfloat16*", f"{out}*", "int"))
        launches.append(Launch(inst, grid=(-(-n // 4), 1, 1), block=(256, 1, 1), smem=0,
                               args=(ctx.weight(node, ctype="__nv_bfloat16"), ctx.buf(x), ctx.buf(y, out), lit(n)),
                               group=group.id, nodes=(node.id,)))
    return launches
