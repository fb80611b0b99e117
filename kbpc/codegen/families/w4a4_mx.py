"""w4a4_mx: dynamic per-row NVFP4 activation quantization and the W4A4 one-row GEMV
(kernels/w4a4_mx.cuh): the dense MLP's w4a4_act_quant, w4a4_gate_up_1_8 and w4a4_down_1_8.

An act_quant node writes the planar nvfp4/g16 buffer (codes, E4M3 scales, one global scale per
row) that a later linear's w4a4_gemv reads; each node is its own launch. Numerics `exact` runs the
GEMV's exact form (FP64 chunk sums: the reference's bits), `fast` its FP32 accumulation (within
kbpc.reference.gemv_bounds.w4a4_fast_bound)."""
from __future__ import annotations

from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families._projection import (BF16, BLOCK, materialized, nvfp4_weight, one_row,
                                                require)
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node

HEADER = "w4a4_mx.cuh"
MAX_K = 38912   # kernels/w4a4_mx.cuh W4A4_MAX_K: the activation staging fits 48 KB of shared memory


def fast_form(ctx: LowerCtx) -> bool:
    """Whether the W4A4 GEMVs take their FAST form (numerics `fast`: FP32 accumulation)."""
    return ctx.plan.options.numerics == "fast"


def gemv_instance(k: int, fast: bool = False) -> KernelInstance:
    """The one-row GEMV (w4a4_gemv; `fast`: its FP32 accumulation)."""
    return KernelInstance("w4a4_mx", HEADER, f"kbp::w4a4_gemv<{k}{', true' if fast else ''}>",
                          ("const uint8_t*", "const uint8_t*", "const float*", "const uint8_t*",
                           "const uint8_t*", "float", f"{BF16}*", "int"))


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    launches = []
    for node in ctx.nodes(group):
        if node.op_base == "act_quant":
            launches.append(quant_rows(ctx, group, node))
        elif node.op_base == "linear":
            launches.append(gemv(ctx, group, node))
        else:
            require(False, f"w4a4_mx has no kernel for op {node.op}", node)
    return launches


def quant_rows(ctx: LowerCtx, group: LoweredGroup, node: Node) -> Launch:
    x, q = ctx.input(node), ctx.output(node)
    k = x.dim_value
    require(q.format == "nvfp4/g16", f"act_quant to {q.format} is not w4a4_mx's", node)
    require(k % 16 == 0, f"K = {k} is not a multiple of 16", node)
    require(materialized(ctx, q), f"{q.id} is fused; w4a4_quant_rows writes a buffer", node)
    rows = ctx.rows(x)
    require((rows * k // 2 + rows * k // 16) % 4 == 0,
            f"K = {k}: the planar FP32 global scales would be unaligned", node)
    out = ctx.quant(q)
    inst = KernelInstance("w4a4_mx", HEADER, f"kbp::w4a4_quant_rows<{k}>",
                          (f"const {BF16}*", "uint8_t*", "uint8_t*", "float*"))
    return Launch(inst, grid=(rows, quant_split(k), 1), block=BLOCK, smem=0,
                  args=(ctx.buf(x), out.codes, out.scales, out.globals), group=group.id, nodes=(node.id,))


def quant_split(k: int) -> int:
    """CTAs per row of w4a4_quant_rows<k> and w4a4_quant_rows_static<k>: one value a thread
    (kernels/w4a4_mx.cuh)."""
    return -(-k // BLOCK[0])


def gemv(ctx: LowerCtx, group: LoweredGroup, node: Node) -> Launch:
    x, y = ctx.input(node), ctx.output(node)
    k, n = x.dim_value, y.dim_value
    require(x.format == "nvfp4/g16", f"w4a4_gemv reads an nvfp4/g16 activation, {x.id} is {x.format}", node)
    require(k % 128 == 0 and n % 16 == 0, f"w4a4_gemv needs K % 128 == 0 and N % 16 == 0 (K {k}, N {n})", node)
    require(k <= MAX_K, f"w4a4_gemv stages at most K = {MAX_K} activations (K {k})", node)
    require(materialized(ctx, x), f"{x.id} is fused; w4a4_gemv reads a quantized buffer", node)
    one_row(ctx, x, node)
    a = ctx.quant(x)
    return Launch(gemv_instance(k, fast_form(ctx)), grid=(n // 16, 1, 1), block=BLOCK, smem=0,
                  args=(a.codes, a.scales, a.globals, *nvfp4_weight(ctx, node), ctx.buf(y), lit(n)),
                  group=group.id, nodes=(node.id,))
