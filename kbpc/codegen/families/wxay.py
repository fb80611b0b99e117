"""wxay: FP8 E4M3 W8A8 rowscale one-row GEMVs (kernels/wxay.cuh): glm_w8a8_dsa_mb1_ku8,
glm_w8a8_index_kgate_1row (one linear: wxay_rowscale<K>) and glm_w8a8_dsa_proj_in_split4 (several
linears over one input: wxay_rowscale_split_list<K, NSEG>, the WxaySeg table passed by value as a
__grid_constant__ kernel parameter, up to WXAY_MAX_SEGS per launch). The activation is the planar
fp8/token buffer of w8a8_act_quant_row (codes, then one FP32 scale per row). Numerics `exact` runs the
kernels' exact form (FP64 chunk sums on the CUDA cores: the reference's bits); `fast` the FP8 tensor
cores, whose chunk sums round inside the MMA (measured: one BF16 unit in one output of the 45-layer
toy shrink's layer 23 at position 48)."""
from __future__ import annotations

from kbpc.codegen.args import Aggregate, lit
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families._projection import (BF16, BLOCK, fp8_weight, linears, materialized,
                                                one_row, require)
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node, Tensor

MAX_SEGS = 4   # WXAY_MAX_SEGS
HEADER = "wxay.cuh"


def _exact(ctx: LowerCtx) -> str:
    """The kernels' EXACT template argument: numerics `exact` takes the FP64 chunk sums (bit for bit
    the reference's order); `fast` the FP8 tensor cores (the chunk sum rounded inside the MMA)."""
    return ", true" if ctx.plan.options.numerics == "exact" else ""


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    gemms = linears(ctx, group)
    require(len(gemms) == len(group.nodes) and gemms, "a wxay group holds only linear nodes", group)
    x = ctx.input(gemms[0])
    for node in gemms:
        _check(ctx, node, x)
    if len(gemms) == 1:
        return [_rowscale(ctx, group, gemms[0], x)]
    return _split(ctx, group, gemms, x)


def _check(ctx: LowerCtx, node: Node, x: Tensor) -> None:
    xi, n = ctx.input(node), ctx.output(node).dim_value
    require(xi.id == x.id, "split GEMVs must share one input", node)
    require(x.format == "fp8/token", f"wxay reads an fp8/token activation, {x.id} is {x.format}", node)
    require(x.dim_value % 128 == 0 and n % 16 == 0,
            f"wxay needs K % 128 == 0 and N % 16 == 0 (K {x.dim_value}, N {n})", node)
    require(materialized(ctx, x), f"{x.id} is fused; wxay reads a quantized buffer", node)
    one_row(ctx, x, node)


def _rowscale(ctx: LowerCtx, group: LoweredGroup, node: Node, x: Tensor) -> Launch:
    k, y = x.dim_value, ctx.output(node)
    a = ctx.quant(x)
    inst = KernelInstance("wxay", HEADER, f"kbp::wxay_rowscale<{k}{_exact(ctx)}>",
                          ("const uint8_t*", "const float*", "const uint8_t*", "const float*", f"{BF16}*", "int"))
    return Launch(inst, grid=(y.dim_value // 16, 1, 1), block=BLOCK, smem=0,
                  args=(a.codes, a.scales, *fp8_weight(ctx, node), ctx.buf(y), lit(y.dim_value)),
                  group=group.id, nodes=(node.id,))


def _split(ctx: LowerCtx, group: LoweredGroup, gemms: list[Node], x: Tensor) -> list[Launch]:
    k, a = x.dim_value, ctx.quant(x)
    launches = []
    for i in range(0, len(gemms), MAX_SEGS):
        part = gemms[i:i + MAX_SEGS]
        segs = []
        for node in part:
            codes, scales = fp8_weight(ctx, node)
            y = ctx.output(node)
            segs.append(Aggregate("kbp::WxaySeg", (codes, scales, ctx.buf(y), lit(y.dim_value), lit(0))))
        table = f"kbp::WxaySegList<{len(part)}>"
        inst = KernelInstance("wxay", HEADER, f"kbp::wxay_rowscale_split_list<{k}, {len(part)}{_exact(ctx)}>",
                              (table, "const uint8_t*", "const float*"))
        grid = sum(ctx.output(n).dim_value // 16 for n in part)
        launches.append(Launch(inst, grid=(grid, 1, 1), block=BLOCK, smem=0,
                               args=(Aggregate(table, (Aggregate(None, tuple(segs)),)), a.codes, a.scales),
                               group=group.id, nodes=tuple(n.id for n in part)))
    return launches
