"""glm_swiglu_clamp: the clamp (swiglu_clamp) and act (silu_mul) nodes of a glm_swiglu_clamp group
as one swiglu_clamp launch (kernels/glm_swiglu_clamp.cuh): the FP32 [ghat | uhat] edge between them
stays on chip, the BF16 silu(ghat) * uhat row crosses the group boundary. The gate/up rows are
[gate (INTER) | up (INTER)]; for routed experts a row is a top_k slot (rows = tokens x top_k)."""
from __future__ import annotations

from kbpc.codegen.args import NULL, lit
from kbpc.codegen.context import LowerCtx, flt
from kbpc.codegen.families._projection import require
from kbpc.codegen.families._rows import BF16, row_grid, vec_width
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup

HEADER = "glm_swiglu_clamp.cuh"
THREADS = 128
VEC = 8                 # 16-byte BF16 loads
OUT_BF16 = "kbp::SwiGluOut::kBF16"
PARAMS = (f"const {BF16}*", f"const {BF16}*", "long", "void*", "long", "float", "float*", "size_t")


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    clamp, act = ctx.node(group, "swiglu_clamp"), ctx.node(group, "silu_mul")
    gu, y = ctx.input(clamp), ctx.output(act)
    inter = y.dim_value
    require(ctx.input(act).src == clamp.order, f"{act.id} does not read {clamp.id}", act)
    require(gu.dim_value == 2 * inter and gu.format == "bf16" and y.format == "bf16",
            f"gate_up {gu.format} x {gu.dim_value} -> {y.format} x {inter}", clamp)
    require(ctx.c.swiglu_limit > 0, f"swiglu_limit must be positive, got {ctx.c.swiglu_limit}", clamp)
    rows = ctx.rows(gu)
    require(ctx.rows(y) == rows, f"{y.id} has {ctx.rows(y)} rows, {gu.id} {rows}", act)
    vec = vec_width(inter, VEC)
    inst = KernelInstance("glm_swiglu_clamp", HEADER, f"kbp::swiglu_clamp<{inter}, {vec}, {OUT_BF16}, false>",
                          PARAMS)
    gate = ctx.buf(gu, f"const {BF16}")
    args = (gate, gate.plus(inter), lit(2 * inter), ctx.buf(y, "void"), lit(inter),
            flt(ctx.c.swiglu_limit), NULL, lit(0))
    return [Launch(inst, grid=row_grid(inter, THREADS, vec, rows), block=(THREADS, 1, 1), smem=0, args=args,
                   group=group.id, nodes=(clamp.id, act.id))]
