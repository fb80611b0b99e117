"""rms_norm: RMSNorm of one row (kernels/rms_norm.cuh): rms_norm_vanilla (plain weight) and
norm::rms_norm (1 + weight), as the blueprint's kernel names say."""
from __future__ import annotations

from kbpc.codegen.args import NULL, lit
from kbpc.codegen.context import LowerCtx, flt
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.reference.rms_norm import block_threads  # the reference's rule: same reduction order

NORM_ONLY = 0   # RmsMode::kNormOnly


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    launches = []
    for node in ctx.nodes(group):
        x, y = ctx.input(node), ctx.output(node)
        d = x.dim_value
        one_plus = "false" if node.kernel and "vanilla" in node.kernel else "true"
        threads = block_threads(d)
        bf = "__nv_bfloat16"
        inst = KernelInstance("rms_norm", "rms_norm.cuh", f"kbp::rms_norm<{d}, {threads}, {one_plus}, {NORM_ONLY}>",
                              (f"{bf}*", "long", "long", f"const {bf}*", "long", f"{bf}*", "long",
                               f"const {bf}*", "float", f"{bf}*", "long", "long"))
        launches.append(Launch(inst, grid=(1, 1, 1), block=(threads, 1, 1), smem=0,
                               args=(ctx.buf(x), lit(d), lit(0), NULL, lit(0), NULL, lit(0),
                                     ctx.weight(node, ctype=bf), flt(ctx.c.rms_eps), ctx.buf(y), lit(d), lit(0)),
                               group=group.id, nodes=(node.id,)))
    return launches
