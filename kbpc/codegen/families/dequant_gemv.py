"""dequant_gemv: the `unquantized` variant of the projection families that quantize activations
(w8a8_act_quant, wxay, w4a4_mx, w4a4_mx_static), for builds without activation quantization
(Options.act_quant off, `kbpc compile --no-act-quant`: a debugging aid that compares kbpc with an
implementation that does not quantize activations, kbpc/reference/no_act_quant.py).

There an act_quant's output buffer carries its BF16 input row (kbpc.ir.buffers.carried_format): a
materialized one is filled by dq_row_copy, one fused into its reader's group is not written at all
(the reader reads the act_quant's input). Every linear and routed expert multiplies the BF16 row by
its dequantized NVFP4 or FP8 weight in FP32 (kernels/dequant_gemv.cuh), one launch each: speed is
not the point of this build."""
from __future__ import annotations

from kbpc.codegen.args import NULL, lit
from kbpc.codegen.context import LowerCtx, flt
from kbpc.codegen.families._projection import BF16, BLOCK, fp8_weight, materialized, nvfp4_weight, require
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node, Tensor
from kbpc.ir.state import ROUTED_EXPERT_OPS

HEADER = "dequant_gemv.cuh"
WARPS = 8   # kbp::DQ_WARPS: output values per CTA
OUT_TYPES = {"bf16": BF16, "f32": "float"}
NVFP4_PARAMS = (f"const {BF16}*", "const int*", "int", "const uint8_t*", "const uint8_t*", "const float*", "float")


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    launches = []
    for node in ctx.nodes(group):
        if node.op_base == "act_quant":
            if materialized(ctx, ctx.output(node)):
                launches.append(_copy(ctx, group, node))
        elif node.op_base == "linear":
            launches.append(_linear(ctx, group, node))
        elif node.op_base in ROUTED_EXPERT_OPS:
            launches.append(_experts(ctx, group, node))
        else:
            require(False, f"the unquantized variant of {group.family} has no kernel for op {node.op}", node)
    return launches


def activation(ctx: LowerCtx, group: LoweredGroup, node: Node) -> tuple[Tensor, tuple[str, ...]]:
    """(the BF16 row a projection reads, the nodes its launch runs): its input buffer, or the input
    of the act_quant fused into its group (that act_quant writes nothing in this build)."""
    x = ctx.input(node)
    if materialized(ctx, x):
        return x, (node.id,)
    quant = ctx.bp.node(x.src)
    require(quant.op_base == "act_quant" and quant.id in group.nodes,
            f"{x.id} has no buffer and is not the output of an act_quant in this group", node)
    row = ctx.input(quant)
    require(row.format == "bf16" and materialized(ctx, row), f"{row.id} is not a materialized BF16 row", quant)
    return row, (quant.id, node.id)


def _out_type(node: Node, y: Tensor) -> str:
    require(y.format in OUT_TYPES, f"output {y.id} is {y.format}; the dequantizing GEMV writes BF16 or FP32", node)
    return OUT_TYPES[y.format]


def _copy(ctx: LowerCtx, group: LoweredGroup, node: Node) -> Launch:
    x, q = ctx.input(node), ctx.output(node)
    require(x.format == "bf16", f"act_quant input {x.id} is {x.format}, not BF16", node)
    count = x.dim_value * ctx.rows(x)
    inst = KernelInstance("dequant_gemv", HEADER, f"kbp::dq_row_copy<{BF16}>", (f"const {BF16}*", f"{BF16}*", "int"))
    return Launch(inst, grid=(-(-count // 256), 1, 1), block=BLOCK, smem=0,
                  args=(ctx.buf(x), ctx.buf(q), lit(count)), group=group.id, nodes=(node.id,))


def _linear(ctx: LowerCtx, group: LoweredGroup, node: Node) -> Launch:
    (x, nodes), y = activation(ctx, group, node), ctx.output(node)
    k, n, rows, out = x.dim_value, y.dim_value, ctx.rows(x), _out_type(node, y)
    fmt = node.precision.weight
    if fmt == "nvfp4/g16":
        require(k % 16 == 0, f"an NVFP4 weight needs K % 16 == 0 (K {k})", node)
        codes, scales, scale2 = nvfp4_weight(ctx, node)
        inst = KernelInstance("dequant_gemv", HEADER, f"kbp::dq_gemv_nvfp4<{out}>",
                              (*NVFP4_PARAMS, f"{out}*", "int", "int"))
        args = (ctx.buf(x), NULL, lit(1), codes, scales, NULL, scale2, ctx.buf(y, out), lit(n), lit(k))
    elif fmt == "fp8/channel":
        inst = KernelInstance("dequant_gemv", HEADER, f"kbp::dq_gemv_fp8<{out}>",
                              (f"const {BF16}*", "const uint8_t*", "const float*", f"{out}*", "int", "int"))
        args = (ctx.buf(x), *fp8_weight(ctx, node), ctx.buf(y, out), lit(n), lit(k))
    else:
        require(False, f"weight format {fmt}: the dequantizing GEMV reads nvfp4/g16 or fp8/channel", node)
    return Launch(inst, grid=(-(-n // WARPS), rows, 1), block=BLOCK, smem=0, args=args,
                  group=group.id, nodes=nodes)


def _experts(ctx: LowerCtx, group: LoweredGroup, node: Node) -> Launch:
    """Slot s multiplies expert ids[s] with activation row s / act_div (act_div: slots per row)."""
    ids = next((t for t in ctx.inputs(node) if t.format == "i32"), None)
    require(ids is not None, "a routed expert node needs the top_k ids input", node)
    require(node.precision.weight == "nvfp4/g16", f"routed expert weights are {node.precision.weight}", node)
    (x, nodes), y = activation(ctx, group, node), ctx.output(node)
    k, n, out = x.dim_value, y.dim_value, _out_type(node, y)
    slots, rows = ids.dim_value * ctx.rows(ids), ctx.rows(x)
    require(k % 16 == 0 and slots % rows == 0 and ctx.rows(y) == slots,
            f"expert GEMV: K {k}, {slots} slots over {rows} rows, output rows {ctx.rows(y)}", node)
    inst = KernelInstance("dequant_gemv", HEADER, f"kbp::dq_gemv_nvfp4<{out}>", (*NVFP4_PARAMS, f"{out}*", "int", "int"))
    args = (ctx.buf(x), ctx.buf(ids, "const int"), lit(slots // rows), ctx.weight(node),
            ctx.weight(node, "weight_scale"), ctx.weight(node, "weight_scale_2", "float"), flt(0.0),
            ctx.buf(y, out), lit(n), lit(k))
    return Launch(inst, grid=(-(-n // WARPS), slots, 1), block=BLOCK, smem=0, args=args,
                  group=group.id, nodes=nodes)
