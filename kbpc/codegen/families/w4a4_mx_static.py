"""w4a4_mx_static: routed-expert W4A4 GEMVs with a static NVFP4 activation scale
(kernels/w4a4_mx_static.cuh): glm_moe_w4a4_cs_gate_up_1_* and glm_moe_w4a4_cs_down_1_*.

gamma is the consumer expert node's `.input_scale` (a host value, WS[i]), as the reference's
act_quant takes it; the per-expert tensor scales `.weight_scale_2` stay a device array. Slot s of
the S = top_k x tokens routed slots reads its expert id from the top_k node's `topk_id` buffer
(device memory) and activation row s / act_div: the gate/up projection shares one row among a
token's slots (act_div = S / rows = top_k), the down projection has one row per slot (act_div 1).

The expert input is quantized once per step, not in every CTA of the slot GEMV (measured on the
H200: quantizing the 4096-wide row in each of the 2,048 CTAs made the gate/up launch take 40 us
against 27 us for the GEMV on quantized rows): an act_quant fused into the expert's group writes
its rows into the quantizer's scratch state (kbpc.ir.state.routed_quant_rows) with
w4a4_quant_rows_static, or, with rule moe_swiglu_down, w4a4_quant_swiglu_rows_static computes
the routed clamped SwiGLU (rounded to BF16 as glm_swiglu_clamp stores it) and quantizes it in
the same launch, or, with rule router_expert_quant, the fused router (glm_router_topk.py) quantizes
them beside its GEMV and routed_slots serves the merged group's slot GEMV. w4a4_gemv_moe_slots then
reads the rows (after rule moe_swiglu_down's quantizer, which releases its dependents only once
its own dependency wait has returned, in the form w4a4_gemv_moe_slots_after_quant that reads its
expert ids and puts its weights in flight before its wait: measured on an H200, 128-expert seed
shrink, kbpc bench 4.942 / 4.940 -> 4.922 / 4.920 ms at 1k, 5.123 -> 5.097 at 16k): one or two
16-row tiles per CTA (slot_tiles), many small CTAs, which leaves room on every SM for the shared expert running beside it on another stream. With rule moe_gate_up_swiglu
(opt-in) the gate/up launch also writes the down input (w4a4_gemv_moe_gate_up_swiglu: each slot's
last CTA runs the SwiGLU + quantizer on the slot's [gate | up] row read back from L2), so a MoE
layer's routed path is three launches (input quantizer, gate/up, down) instead of five.
Same bytes as the unfused chain in every form."""
from __future__ import annotations

from typing import TYPE_CHECKING

from kbpc.codegen.args import WeightScalar, lit
from kbpc.codegen.context import LowerCtx, Quant, flt
from kbpc.codegen.families._projection import BF16, BLOCK, materialized, require
from kbpc.codegen.families.w4a4_mx import MAX_K, fast_form, quant_split
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node, Tensor
from kbpc.ir.state import ROUTED_EXPERT_OPS as EXPERT_OPS

if TYPE_CHECKING:
    from kbpc.ir.graph import Blueprint

HEADER = "w4a4_mx_static.cuh"
W_PARAMS = ("const uint8_t*", "const uint8_t*", "const float*", f"{BF16}*", "int")
SWIGLU_OPS = ("swiglu_clamp", "silu_mul")


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    launches = []
    for node in ctx.nodes(group):
        if node.op_base == "act_quant":
            if materialized(ctx, ctx.output(node)):   # else lowered with the expert that reads it
                launches.append(_quant_rows(ctx, group, node))
        elif node.op_base in EXPERT_OPS:
            launches.extend(_expert(ctx, group, node))
        elif node.op_base not in SWIGLU_OPS:   # a fused SwiGLU is lowered with the down projection
            require(False, f"w4a4_mx_static has no kernel for op {node.op}", node)
    return launches


def gamma(ctx: LowerCtx, quant: Node) -> WeightScalar:
    """The static activation scale: the input_scale of the node consuming the quantized row."""
    consumer = ctx.bp.node(ctx.output(quant).dst)
    return ctx.weight_value(consumer, "input_scale")


def quant_rows_input(ctx: LowerCtx, node: Node) -> Tensor:
    """The BF16 input of an act_quant that w4a4_quant_rows_static's layout serves (else an error)."""
    x, q = ctx.input(node), ctx.output(node)
    k, rows = x.dim_value, ctx.rows(x)
    require(q.format == "nvfp4/g16" and k % 16 == 0, f"act_quant {x.format} -> {q.format}, K {k}", node)
    require((rows * k // 2 + rows * k // 16) % 4 == 0,
            f"K = {k}: the planar FP32 global scales would be unaligned", node)
    return x


def _quant_rows(ctx: LowerCtx, group: LoweredGroup, node: Node, out: Quant | None = None) -> Launch:
    """w4a4_quant_rows_static of the quantizer's BF16 input into its arena buffer or `out`."""
    x = quant_rows_input(ctx, node)
    k, rows = x.dim_value, ctx.rows(x)
    out = out or ctx.quant(ctx.output(node))
    inst = KernelInstance("w4a4_mx_static", HEADER, f"kbp::w4a4_quant_rows_static<{k}>",
                          (f"const {BF16}*", "float", "uint8_t*", "uint8_t*", "float*"))
    return Launch(inst, grid=(rows, quant_split(k), 1), block=BLOCK, smem=0,
                  args=(ctx.buf(x), gamma(ctx, node), out.codes, out.scales, out.globals),
                  group=group.id, nodes=(node.id,))


def _slots_args(fast: bool, tiles: int) -> str:
    """The slot GEMVs' template arguments after K: FAST and TILES, defaults left out."""
    return f", {'true' if fast else 'false'}, {tiles}" if tiles != 1 else (", true" if fast else "")


def slots_instance(k: int, fast: bool = False, tiles: int = 1) -> KernelInstance:
    """The routed slot GEMV over quantized rows (w4a4_gemv_moe_slots; `fast`: its FP32 accumulation;
    `tiles` 16-row tiles a CTA, slot_tiles)."""
    return KernelInstance("w4a4_mx_static", HEADER, f"kbp::w4a4_gemv_moe_slots<{k}{_slots_args(fast, tiles)}>",
                          ("const int*", "int", "const uint8_t*", "const uint8_t*", "const float*", *W_PARAMS))


def slot_tiles(k: int, n: int) -> int:
    """16-row tiles a slot-GEMV CTA takes: two where one tile leaves a lane at most two 128-wide
    chunks of weights in flight (K <= 2048, the MoE down projection of the seed), so that a lane
    holds four, as the gate/up's K = 4096 gives it, and the activation row is staged once for 32
    rows; one otherwise, or where N is not a multiple of 32. Measured on an H200 (the seed's down,
    8 slots, fast form): 13.85 -> 13.50 us alone, the down ending ~0.3 us sooner in the step."""
    return 2 if -(-k // 128) <= 16 and n % 32 == 0 else 1


def quant_swiglu_grid(k: int, rows: int) -> tuple[int, int, int]:
    """w4a4_quant_swiglu_rows_static's grid: one value a thread, 256-thread CTAs, a row per grid row."""
    return (-(-k // BLOCK[0]), rows, 1)


def quant_swiglu_instance(k: int) -> KernelInstance:
    """The routed SwiGLU + NVFP4 quantizer of the down projection's input (rule moe_swiglu_down)."""
    return KernelInstance("w4a4_mx_static", HEADER, f"kbp::w4a4_quant_swiglu_rows_static<{k}>",
                          (f"const {BF16}*", "float", "float", "uint8_t*", "uint8_t*", "float*"))


def scratch(ctx: LowerCtx, quant: Node) -> Quant:
    """The quantizer's scratch rows (kbpc.ir.state.routed_quant_rows)."""
    return Quant(ctx.state(f"{quant.id}.codes", "uint8_t"), ctx.state(f"{quant.id}.scales", "uint8_t"),
                 ctx.state(f"{quant.id}.g", "float"))


def _slot_shape(ctx: LowerCtx, node: Node, ids: Tensor, act_rows: int) -> tuple[int, int]:
    """(routed slots S, act_div)."""
    slots = ids.dim_value * ctx.rows(ids)
    require(slots % act_rows == 0, f"{slots} slots over {act_rows} activation rows", node)
    return slots, slots // act_rows


def expert_weights(ctx: LowerCtx, node: Node) -> tuple:
    """A routed expert node's stacked weights: codes, E4M3 scales, the per-expert FP32 tensor scales."""
    return ctx.weight(node), ctx.weight(node, "weight_scale"), ctx.weight(node, "weight_scale_2", "float")


def ids_ptr(ctx: LowerCtx, ids: Tensor, ctype: str = "const int"):
    """The top-k's expert ids: their buffer, or the top-k's ids state where no group but the one
    that writes them reads them (rule moe_experts)."""
    return ctx.buf(ids, ctype) if materialized(ctx, ids) else ctx.state(f"{ctx.bp.node(ids.src).id}.ids", ctype)


def expert_ids(ctx: LowerCtx, node: Node) -> Tensor:
    """A routed expert node's int32 expert ids (the top_k node's topk_id)."""
    ids = next((t for t in ctx.inputs(node) if t.format == "i32"), None)
    require(ids is not None, "a routed expert node needs the top_k ids input", node)
    return ids


def fused_input(ctx: LowerCtx, group: LoweredGroup, node: Node) -> tuple[Node, Tensor, Quant]:
    """(the act_quant fused into this group that quantizes the expert's input, that quantizer's
    input, the scratch rows it writes) of an expert node whose quantized input has no buffer."""
    a = ctx.input(node)
    quant = ctx.bp.node(a.src)
    require(quant.op_base == "act_quant" and quant.id in group.nodes,
            f"{a.id} has no buffer and is not a fused act_quant of this group", node)
    x = ctx.input(quant)
    require(x.dim_value == a.dim_value, f"act_quant width {x.dim_value} != expert K {a.dim_value}", node)
    return quant, x, scratch(ctx, quant)


def routed_slots(ctx: LowerCtx, group: LoweredGroup, node: Node, rows: Quant, act_rows: int,
                 after_quant: bool = False) -> Launch:
    """The expert node's slot GEMV (w4a4_gemv_moe_slots) over `act_rows` quantized rows;
    `after_quant`: right after a launch whose CTAs release their dependents only after their own
    wait (see _slots)."""
    ids = expert_ids(ctx, node)
    _, div = _slot_shape(ctx, node, ids, act_rows)
    return _slots(ctx, group, node, ids, rows, div, (node.id,), after_quant=after_quant)


def _expert(ctx: LowerCtx, group: LoweredGroup, node: Node) -> list[Launch]:
    """The expert GEMV over quantized rows, after the launch that quantizes them when the act_quant
    is fused into this group."""
    a = ctx.input(node)
    if materialized(ctx, a):
        return [routed_slots(ctx, group, node, ctx.quant(a), ctx.rows(a))]
    quant, x, rows = fused_input(ctx, group, node)
    if materialized(ctx, x):
        first = _quant_rows(ctx, group, quant, rows)
        epilogue = _swiglu_epilogue(ctx, group, node)
        if epilogue is not None:   # rule moe_gate_up_swiglu: the gate/up GEMV writes the down input
            ids = expert_ids(ctx, node)
            _, div = _slot_shape(ctx, node, ids, ctx.rows(x))
            return [first, _gate_up_swiglu(ctx, group, node, ids, rows, div, *epilogue)]
        return [first, routed_slots(ctx, group, node, rows, ctx.rows(x))]
    clamp, act, gu = _fused_swiglu(ctx, group, x)
    if not materialized(ctx, gu):   # rule moe_gate_up_swiglu: the gate/up launch's epilogue wrote the rows
        require(ctx.bp.node(gu.src).id in group.nodes, f"{gu.id} has no buffer and no producer in this group", clamp)
        slots, div = _slot_shape(ctx, node, expert_ids(ctx, node), gu.rows_per_token * ctx.plan.options.batch)
        require(div == 1, f"the gate/up epilogue writes one row per slot ({slots} slots)", node)
        return [routed_slots(ctx, group, node, rows, slots)]
    # rule moe_swiglu_down
    slots, div = _slot_shape(ctx, node, expert_ids(ctx, node), ctx.rows(gu))
    require(div == 1, f"a fused SwiGLU input needs one row per slot ({slots} slots, {ctx.rows(gu)} rows)", node)
    first = Launch(quant_swiglu_instance(x.dim_value), grid=quant_swiglu_grid(x.dim_value, slots), block=BLOCK, smem=0,
                   args=(ctx.buf(gu, f"const {BF16}"), flt(ctx.c.swiglu_limit), gamma(ctx, quant),
                         rows.codes, rows.scales, rows.globals),
                   group=group.id, nodes=(clamp.id, act.id, quant.id))
    return [first, _slots(ctx, group, node, expert_ids(ctx, node), rows, 1, (node.id,), after_quant=True)]


def static_quant_fits(bp: Blueprint, quant: Node) -> str | None:
    """Why w4a4_quant_rows_static's form cannot serve an act_quant (None: it can): one BF16 row of a
    multiple of 16 quantized to nvfp4/g16 for a routed expert GEMV of this family, whose
    `.input_scale` is the static global scale (kbpc.ir.weights)."""
    ins, outs = bp.inputs(quant.order), bp.outputs(quant.order)
    if len(ins) != 1 or ins[0].format != "bf16" or ins[0].dim_value % 16:
        return "the quantizer does not read one BF16 row of a multiple of 16"
    if len(outs) != 1 or outs[0].format != "nvfp4/g16":
        return "the quantizer does not write nvfp4/g16"
    expert = bp.node(outs[0].dst)
    if (expert.op_base not in EXPERT_OPS or expert.family != "w4a4_mx_static"
            or expert.precision.activation != "nvfp4/g16"):
        return f"the quantizer's reader {expert.id} is not a routed W4A4 GEMV with a static input scale"
    return None


def slots_after_quant_instance(k: int, fast: bool = False, tiles: int = 1) -> KernelInstance:
    """The down projection's slot GEMV right after w4a4_quant_swiglu_rows_static (which triggers
    its dependents only after its own wait): w4a4_gemv_moe_slots_after_quant reads its expert id
    and loads its weights before its wait."""
    return KernelInstance("w4a4_mx_static", HEADER,
                          f"kbp::w4a4_gemv_moe_slots_after_quant<{k}{_slots_args(fast, tiles)}>",
                          ("const int*", "const uint8_t*", "const uint8_t*", "const float*", *W_PARAMS))


def _slots(ctx: LowerCtx, group: LoweredGroup, node: Node, ids: Tensor, rows: Quant, div: int,
           nodes: tuple[str, ...], after_quant: bool = False) -> Launch:
    """The slot GEMV; `after_quant`: right after this group's w4a4_quant_swiglu_rows_static launch
    (one row per slot), whose trigger after its wait lets it read the ids before its own wait."""
    a, y = ctx.input(node), ctx.output(node)
    k, n = a.dim_value, y.dim_value
    require(k % 128 == 0 and n % 16 == 0, f"expert GEMV needs K % 128 == 0 and N % 16 == 0 (K {k}, N {n})", node)
    require(k <= MAX_K, f"the expert GEMV stages at most K = {MAX_K} activations (K {k})", node)
    slots = ids.dim_value * ctx.rows(ids)
    require(ctx.rows(y) == slots, f"output {y.id} has {ctx.rows(y)} rows for {slots} slots", node)
    weights = expert_weights(ctx, node)
    tiles = slot_tiles(k, n)
    rest = (rows.codes, rows.scales, rows.globals, *weights, ctx.buf(y), lit(n))
    if after_quant:   # one row per slot: the kernel takes no act_div
        require(div == 1, f"the down projection reads one row per slot ({slots} slots)", node)
        inst, args = slots_after_quant_instance(k, fast_form(ctx), tiles), (ids_ptr(ctx, ids), *rest)
        note = "expert ids and weights before the wait (after the quantizer's)"
    else:
        inst, args, note = slots_instance(k, fast_form(ctx), tiles), (ids_ptr(ctx, ids), lit(div), *rest), ""
    return Launch(inst, grid=(n // (16 * tiles), slots, 1), block=BLOCK, smem=0, args=args, group=group.id,
                  nodes=nodes, note=note)


def gate_up_swiglu_instance(k: int, i: int) -> KernelInstance:
    """The routed gate/up slot GEMV with the SwiGLU and the down input's quantizer in its epilogue."""
    return KernelInstance("w4a4_mx_static", HEADER, f"kbp::w4a4_gemv_moe_gate_up_swiglu<{k}, {i}>",
                          ("const int*", "int", "const uint8_t*", "const uint8_t*", "const float*", "const uint8_t*",
                           "const uint8_t*", "const float*", f"{BF16}*", "float", "float", "uint8_t*", "uint8_t*",
                           "float*", "unsigned int*"))


def _swiglu_epilogue(ctx: LowerCtx, group: LoweredGroup, gate_up: Node) -> tuple[Node, Node, Node] | None:
    """(clamp, silu_mul, the down input's act_quant) when the group holds the SwiGLU that reads this
    gate/up GEMV's output and the quantizer of its result, the output having no buffer (rule
    moe_gate_up_swiglu); None otherwise."""
    gu = ctx.output(gate_up)
    if materialized(ctx, gu) or gu.dst is None:
        return None
    clamp = ctx.bp.node(gu.dst)
    if clamp.op_base != "swiglu_clamp" or clamp.id not in group.nodes:
        return None
    act = ctx.bp.node(ctx.output(clamp).dst)
    quant = ctx.bp.node(ctx.output(act).dst)
    require(act.op_base == "silu_mul" and act.id in group.nodes and quant.op_base == "act_quant"
            and quant.id in group.nodes, f"{clamp.id}: the fused SwiGLU does not end in this group's quantizer",
            gate_up)
    return clamp, act, quant


def _gate_up_swiglu(ctx: LowerCtx, group: LoweredGroup, node: Node, ids: Tensor, rows: Quant, div: int,
                    clamp: Node, act: Node, quant: Node) -> Launch:
    """w4a4_gemv_moe_gate_up_swiglu: the slot GEMV into the node's [gate | up] scratch rows, each
    slot's last CTA writing the clamped SwiGLU, quantized with the down projection's gamma, into
    the down quantizer's scratch rows."""
    a, gu, h = ctx.input(node), ctx.output(node), ctx.output(act)
    k, n, i = a.dim_value, gu.dim_value, h.dim_value
    require(k % 128 == 0 and n == 2 * i and i % 16 == 0,
            f"gate/up epilogue needs K % 128 == 0 and N = 2I, I % 16 == 0 (K {k}, N {n}, I {i})", node)
    require(ctx.c.swiglu_limit > 0, f"swiglu_limit must be positive, got {ctx.c.swiglu_limit}", clamp)
    slots = ids.dim_value * ctx.rows(ids)
    out = scratch(ctx, quant)
    weights = expert_weights(ctx, node)
    return Launch(gate_up_swiglu_instance(k, i), grid=(n // 16, slots, 1), block=BLOCK, smem=0,
                  args=(ctx.buf(ids, "const int"), lit(div), rows.codes, rows.scales, rows.globals, *weights,
                        ctx.state(f"{node.id}.rows", BF16), flt(ctx.c.swiglu_limit), gamma(ctx, quant),
                        out.codes, out.scales, out.globals, ctx.state(f"{node.id}.arrive", "unsigned int")),
                  group=group.id, nodes=(node.id, clamp.id, act.id, quant.id),
                  note="the slot GEMV, then each slot's last CTA: SwiGLU and the down input's NVFP4 rows")


def _fused_swiglu(ctx: LowerCtx, group: LoweredGroup, h: Tensor) -> tuple[Node, Node, Tensor]:
    """(swiglu_clamp node, silu_mul node, the clamp's [gate | up] BF16 input) of the SwiGLU whose
    output h is fused into the down projection."""
    k = h.dim_value
    act = ctx.bp.node(h.src)
    require(act.op_base == "silu_mul" and act.id in group.nodes and h.format == "bf16",
            f"{h.id} has no buffer and is not a fused SwiGLU output of this group", act)
    clamp = ctx.bp.node(ctx.input(act).src)
    require(clamp.op_base == "swiglu_clamp" and clamp.id in group.nodes, f"{act.id} does not read a fused clamp", act)
    gu = ctx.input(clamp)
    require(gu.format == "bf16" and gu.dim_value == 2 * k,
            f"SwiGLU input {gu.id}: {gu.format} x {gu.dim_value}, want a BF16 [gate | up] row of {2 * k}", clamp)
    require(ctx.c.swiglu_limit > 0, f"swiglu_limit must be positive, got {ctx.c.swiglu_limit}", clamp)
    return clamp, act, gu
