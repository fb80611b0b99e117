"""kda_o_norm: the KDA output norm, per-head RMSNorm x gamma x sigmoid(gate)
(kernels/kda_o_norm.cuh). gamma is (D,) shared by every head."""
from __future__ import annotations

from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup

BF = "__nv_bfloat16"


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    launches = []
    for node in ctx.nodes(group):
        o, gate, y = ctx.input(node, "core"), ctx.input(node, "g"), ctx.output(node)
        d = ctx.sym["lin_v_dim"]   # the reference's head_dim
        width = o.dim_value
        if width % d or gate.dim_value != width or y.dim_value != width or d % 32 or d > 1024:
            raise LoweringError(f"o_norm widths: o {width}, gate {gate.dim_value}, y {y.dim_value}, D={d}",
                                f"node {node.id}")
        rows = ctx.rows(y)
        inst = KernelInstance("kda_o_norm", "kda_o_norm.cuh", f"kbp::kda_o_norm_gated_bf16<{width // d}, {d}>",
                              ("const float*", "int", f"const {BF}*", "int", f"const {BF}*", "int", "float",
                               f"{BF}*", "int"))
        args = (ctx.buf(o, "float"), lit(width), ctx.buf(gate), lit(width), ctx.weight(node, ctype=BF), lit(0),
                flt(ctx.c.kda_norm_eps), ctx.buf(y), lit(width))
        launches.append(Launch(inst, grid=(width // d, rows, 1), block=(d, 1, 1), smem=0, args=args,
                               group=group.id, nodes=(node.id,)))
    return launches
