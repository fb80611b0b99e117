"""w4a4_mx_static: routed-expert W4A4 GEMVs with a static NVFP4 activation scale
(kernels/w4a4_mx_static.cuh): glm_moe_w4a4_cs_gate_up_1_* and glm_moe_w4a4_cs_down_1_*.

gamma is the consumer expert node's `.input_scale` (a host value, WS[i]), as the reference's
act_quant takes it; the per-expert tensor scales `.weight_scale_2` stay a device array. Slot s of
the S = top_k x tokens routed slots reads its expert id from the top_k node's `topk_id` buffer
(device memory) and activation row s / act_div: the gate/up projection shares one row among a
token's slots (act_div = S / rows = top_k), the down projection has one row per slot (act_div 1).

When the act_quant is fused into the expert's group (its output has no buffer), one launch of
w4a4_gemv_moe_slots_bf16 quantizes inside each CTA (same bytes as the two-kernel path); a
materialized quantized buffer is written by w4a4_quant_rows_static and read by w4a4_gemv_moe_slots."""
from __future__ import annotations

from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families._projection import BF16, BLOCK, materialized, require
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node, Tensor

HEADER = "w4a4_mx_static.cuh"
EXPERT_OPS = ("expert_gate_up", "expert_down")
W_PARAMS = ("const uint8_t*", "const uint8_t*", "const float*", f"{BF16}*", "int")


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    launches = []
    for node in ctx.nodes(group):
        if node.op_base == "act_quant":
            q = ctx.output(node)
            if materialized(ctx, q):   # else fused into the consumer's launch below
                launches.append(_quant_rows(ctx, group, node))
        elif node.op_base in EXPERT_OPS:
            launches.append(_slots(ctx, group, node))
        else:
            require(False, f"w4a4_mx_static has no kernel for op {node.op}", node)
    return launches


def _gamma(ctx: LowerCtx, quant: Node) -> str:
    """The static activation scale: the input_scale of the node consuming the quantized row."""
    consumer = ctx.bp.node(ctx.output(quant).dst)
    return ctx.weight_value(consumer, "input_scale")


def _quant_rows(ctx: LowerCtx, group: LoweredGroup, node: Node) -> Launch:
    x, q = ctx.input(node), ctx.output(node)
    k, rows = x.dim_value, ctx.rows(x)
    require(q.format == "nvfp4/g16" and k % 16 == 0, f"act_quant {x.format} -> {q.format}, K {k}", node)
    require((rows * k // 2 + rows * k // 16) % 4 == 0,
            f"K = {k}: the planar FP32 global scales would be unaligned", node)
    out = ctx.quant(q)
    inst = KernelInstance("w4a4_mx_static", HEADER, f"kbp::w4a4_quant_rows_static<{k}>",
                          (f"const {BF16}*", "float", "uint8_t*", "uint8_t*", "float*"))
    return Launch(inst, grid=(rows, 1, 1), block=BLOCK, smem=0,
                  args=(ctx.buf(x), _gamma(ctx, node), out.codes, out.scales, out.globals),
                  group=group.id, nodes=(node.id,))


def _slot_shape(ctx: LowerCtx, node: Node, ids: Tensor, act_rows: int) -> tuple[int, int]:
    """(routed slots S, act_div)."""
    slots = ids.dim_value * ctx.rows(ids)
    require(slots % act_rows == 0, f"{slots} slots over {act_rows} activation rows", node)
    return slots, slots // act_rows


def _slots(ctx: LowerCtx, group: LoweredGroup, node: Node) -> Launch:
    ids = next((t for t in ctx.inputs(node) if t.format == "i32"), None)
    require(ids is not None, "a routed expert node needs the top_k ids input", node)
    a, y = ctx.input(node), ctx.output(node)
    k, n = a.dim_value, y.dim_value
    require(k % 128 == 0 and n % 16 == 0, f"expert GEMV needs K % 128 == 0 and N % 16 == 0 (K {k}, N {n})", node)
    weights = (ctx.weight(node), ctx.weight(node, "weight_scale"), ctx.weight(node, "weight_scale_2", "float"))
    ids_ptr = ctx.buf(ids, "const int")
    if materialized(ctx, a):
        slots, div = _slot_shape(ctx, node, ids, ctx.rows(a))
        q = ctx.quant(a)
        inst = KernelInstance("w4a4_mx_static", HEADER, f"kbp::w4a4_gemv_moe_slots<{k}>",
                              ("const int*", "int", "const uint8_t*", "const uint8_t*", "const float*", *W_PARAMS))
        args = (ids_ptr, lit(div), q.codes, q.scales, q.globals, *weights, ctx.buf(y), lit(n))
        nodes: tuple[str, ...] = (node.id,)
    else:   # fused act_quant: quantize the BF16 row inside each CTA
        quant = ctx.bp.node(a.src)
        require(quant.op_base == "act_quant" and quant.id in group.nodes,
                f"{a.id} has no buffer and is not a fused act_quant of this group", node)
        x = ctx.input(quant)
        require(x.dim_value == k, f"act_quant width {x.dim_value} != expert K {k}", node)
        slots, div = _slot_shape(ctx, node, ids, ctx.rows(x))
        inst = KernelInstance("w4a4_mx_static", HEADER, f"kbp::w4a4_gemv_moe_slots_bf16<{k}>",
                              ("const int*", "int", f"const {BF16}*", "float", *W_PARAMS))
        args = (ids_ptr, lit(div), ctx.buf(x), _gamma(ctx, quant), *weights, ctx.buf(y), lit(n))
        nodes = (quant.id, node.id)
    require(ctx.rows(y) == slots, f"output {y.id} has {ctx.rows(y)} rows for {slots} slots", node)
    return Launch(inst, grid=(n // 16, slots, 1), block=BLOCK, smem=0, args=args, group=group.id, nodes=nodes)
