"""layer_norm: BF16 LayerNorm with weight and bias (kernels/layer_norm.cuh), e.g. the DSA indexer's
key norm. The block size is the reference's rule, so the reduction order matches it."""
from __future__ import annotations

from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx, flt
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.reference.layer_norm import block_threads  # the reference's rule: same reduction order

BF = "__nv_bfloat16"


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    launches = []
    for node in ctx.nodes(group):
        x, y = ctx.input(node), ctx.output(node)
        d, threads = x.dim_value, block_threads(x.dim_value)
        inst = KernelInstance("layer_norm", "layer_norm.cuh", f"kbp::layer_norm_bf16<{d}, {threads}>",
                              (f"const {BF}*", "long", f"const {BF}*", f"const {BF}*", "float", f"{BF}*", "long"))
        args = (ctx.buf(x), lit(d), ctx.weight(node, ctype=BF), ctx.weight(node, "bias", BF),
                flt(ctx.c.layer_norm_eps), ctx.buf(y), lit(d))
        launches.append(Launch(inst, grid=(ctx.rows(x), 1, 1), block=(threads, 1, 1), smem=0, args=args,
                               group=group.id, nodes=(node.id,)))
    return launches
