"""moe_experts: a MoE layer's expert GEMVs after the fused router, each launch's tiles ending in the
next GEMV's input (kernels/moe_experts.cuh; fusion rules moe_expert_flow, moe_gate_up_flow,
moe_gate_up_pair and moe_experts).

- fused:moe_expert_flow (the nodes of moe_gate_up_pair): router_gemv_topk_quant, then
  moe_expert_flow, one grid whose CTAs take units by ticket: the routed gate/up's tiles (writing
  their BF16 values as flagged words), the SwiGLU quantizer's CTAs (each waiting for its words)
  and the down's tiles (their weights in flight first, then waiting for their slot's quantizer
  CTAs): the down streams while the gate/up's last tiles run, and the quantizer's launch and both
  full dependencies go. fused:moe_gate_up_flow: the same grid without the down's units
  (moe_gate_up_flow), then the down's slot GEMV in its after-quantizer form. Both opt-in (measured
  slower: the shared expert's down beside them gets its SMs only in the gaps between launches).

- fused:moe_gate_up_pair (router, top_k, the experts' input act_quant, expert_gate_up, the routed
  swiglu_clamp, silu_mul, the down input's act_quant and expert_down): router_gemv_topk_quant
  (glm_router_topk.py), then moe_gate_up_pair, whose CTAs each compute 16 gate rows and their 16
  up rows of one slot and write the clamped SwiGLU of those 16 positions as one NVFP4 group of
  the down projection's input into the quantizer's scratch rows (the bytes
  w4a4_quant_swiglu_rows_static writes), then the routed down's slot GEMV on them: the SwiGLU
  quantizer's launch and its dependency go, with no cross-CTA arrival (the opt-in
  moe_gate_up_swiglu's last-CTA epilogue measured slower for its fences). The quantizer belongs
  to the down projection's blueprint group, so the merge takes the down too.
- fused:moe_experts (the same, plus the shared expert's gate/up, clamp, silu_mul and down): four
  launches on one stream instead of the default rules' four plus two on a second stream:
  moe_router_shared (the fused router's CTAs, then the shared gate/up tiles, each writing its
  positions of the shared down's FP32 silu-clamp input into state: the compute-bound shared tiles
  fill the router's latency as they did from the second stream), moe_gate_up_shared_down (the
  shared down's tiles, then the routed gate/up's, into the gate/up node's [gate | up] state rows),
  w4a4_quant_swiglu_rows_static and the routed down's slot GEMV. The combine after them follows one
  stream, with no join on the shared expert's.

The shared expert keeps its exact W4A16 form in both numerics modes (as w4a16_gemv.py's pair does,
SHARED_PAIR_FAST); the routed GEMVs take the fast W4A4 form in numerics `fast`. Same bytes as the
unfused chain in each mode."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx, Quant, flt
from kbpc.codegen.families import glm_router_topk, w4a4_mx_static
from kbpc.codegen.families._projection import BF16, materialized, nvfp4_weight, one_row, require
from kbpc.codegen.families.w4a16_gemv import SILU_MAX_K
from kbpc.codegen.families.w4a4_mx import MAX_K, fast_form
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node, Tensor
from kbpc.ir.state import SHARED_DOWN_OP, SHARED_GATE_UP_OP

if TYPE_CHECKING:
    from kbpc.ir.graph import Blueprint

HEADER = "moe_experts.cuh"
PAIR_BLOCK = (512, 1, 1)     # a routed pair tile: 16 gate + 16 up rows, eight warps each
SLOT_BLOCK = (256, 1, 1)     # the slot GEMV's tile
ROUTED = ("int", "const uint8_t*", "const uint8_t*", "const float*", "const uint8_t*", "const uint8_t*",
          "const float*")
PAIR_PARAMS = ("const int*", *ROUTED, "float", "float", "uint8_t*", "uint8_t*", "float*")
ROUTER_SHARED_PARAMS = ("const uint8_t*", "const uint8_t*", "float", "float", "float*")
SHARED_DOWN_PARAMS = ("const float*", "const uint8_t*", "const uint8_t*", "float", f"{BF16}*")


def _fast(fast: bool) -> str:
    return ", true" if fast else ""


def pair_instance(k: int, i: int, fast: bool = False) -> KernelInstance:
    return KernelInstance("moe_experts", HEADER, f"kbp::moe_gate_up_pair<{k}, {i}{_fast(fast)}>", PAIR_PARAMS)


FLOW_PARAMS = ("const int*", *ROUTED, "float", "float", "uint8_t*", "uint8_t*", "float*", "const uint8_t*",
               "const uint8_t*", "const float*", f"{BF16}*", "unsigned int*", "unsigned int*")


def flow_instance(k: int, i: int, n: int, fast: bool, down_tiles: int) -> KernelInstance:
    """moe_expert_flow: the routed gate/up, SwiGLU quantizer and down as units of one grid."""
    return KernelInstance("moe_experts", HEADER,
                          f"kbp::moe_expert_flow<{k}, {i}, {n}, {'true' if fast else 'false'}, {down_tiles}>",
                          FLOW_PARAMS)


def gate_up_flow_instance(k: int, i: int, fast: bool) -> KernelInstance:
    """moe_gate_up_flow: the routed gate/up and the SwiGLU quantizer as units of one grid."""
    return KernelInstance("moe_experts", HEADER, f"kbp::moe_gate_up_flow<{k}, {i}{_fast(fast)}>",
                          (*PAIR_PARAMS, "unsigned int*", "unsigned int*"))


def gate_up_flow_units(i: int) -> int:
    """A slot's units in moe_gate_up_flow's grid: its gate/up tiles (16 of the 2I rows each) and
    SwiGLU quantizer CTAs (256 values each)."""
    return 2 * i // 16 + -(-i // 256)


def flow_units_per_slot(i: int, n: int, down_tiles: int) -> int:
    """A slot's units in moe_expert_flow's grid: moe_gate_up_flow's, then its down CTAs (16 x
    down_tiles rows each)."""
    return gate_up_flow_units(i) + n // (16 * down_tiles)


def router_opc(experts: int) -> int:
    """Router outputs per CTA of moe_router_shared: the fused router's choice, at least 2 (a shared
    tile needs a 64-thread group for its gate rows and one for its up rows; the logits' bits do
    not depend on it)."""
    return max(2, glm_router_topk.fused_outputs_per_cta(experts))


def router_shared_instance(hidden: int, experts: int, k: int, ish: int) -> KernelInstance:
    opc = router_opc(experts)
    return KernelInstance("moe_experts", HEADER, f"kbp::moe_router_shared<{hidden}, {experts}, {k}, {opc}, {ish}>",
                          glm_router_topk.FUSED_PARAMS + glm_router_topk.QUANT_PARAMS + ROUTER_SHARED_PARAMS)


def gate_up_shared_down_instance(k: int, ish: int, ns: int, fast: bool = False) -> KernelInstance:
    return KernelInstance("moe_experts", HEADER, f"kbp::moe_gate_up_shared_down<{k}, {ish}, {ns}{_fast(fast)}>",
                          (*w4a4_mx_static.slots_instance(k).params, *SHARED_DOWN_PARAMS))


@dataclass(frozen=True)
class _Routed:
    gate_up: Node
    chain: tuple[str, ...]   # the SwiGLU's clamp and silu_mul, the down input's quantizer
    quant: Node          # the down projection's input quantizer
    h: Tensor            # its quantized output (the down projection's input)
    k: int
    i: int
    slots: int
    div: int             # slots per activation row


@dataclass(frozen=True)
class _Shared:
    gate_up: Node
    chain: tuple[str, ...]   # the shared SwiGLU's clamp and silu_mul
    down: Node
    ish: int
    n: int


def _one(ctx: LowerCtx, group: LoweredGroup, pred) -> Node | None:
    found = [n for n in ctx.nodes(group) if pred(n)]
    require(len(found) <= 1, f"moe_experts: {len(found)} nodes where one was expected", group)
    return found[0] if found else None


def _chain_after(ctx: LowerCtx, group: LoweredGroup, producer: Node) -> tuple[Node, Node]:
    """(swiglu_clamp, silu_mul) of this group reading producer's output, in that order."""
    clamp = ctx.bp.node(ctx.output(producer).dst)
    require(clamp.op_base == "swiglu_clamp" and clamp.id in group.nodes, f"{producer.id} does not feed a clamp "
            "of this group", producer)
    act = ctx.bp.node(ctx.output(clamp).dst)
    require(act.op_base == "silu_mul" and act.id in group.nodes, f"{clamp.id} does not feed a silu_mul", clamp)
    require(ctx.c.swiglu_limit > 0, f"swiglu_limit must be positive, got {ctx.c.swiglu_limit}", clamp)
    return clamp, act


def _routed(ctx: LowerCtx, group: LoweredGroup, gate_up: Node, x: Tensor) -> _Routed:
    clamp, act = _chain_after(ctx, group, gate_up)
    quant = ctx.bp.node(ctx.output(act).dst)
    require(quant.op_base == "act_quant" and quant.id in group.nodes, f"{act.id} does not feed this group's "
            "quantizer", act)
    a, gu, h = ctx.input(gate_up), ctx.output(gate_up), ctx.output(quant)
    k, i = a.dim_value, ctx.output(act).dim_value
    require(k % 128 == 0 and k <= MAX_K and gu.dim_value == 2 * i and i % 16 == 0 and h.format == "nvfp4/g16",
            f"the gate/up pair needs K % 128 == 0, K <= {MAX_K}, N = 2I, I % 16 == 0 and an NVFP4 down input "
            f"(K {k}, N {gu.dim_value}, I {i}, {h.format})", gate_up)
    ids = w4a4_mx_static.expert_ids(ctx, gate_up)
    slots = ids.dim_value * ctx.rows(ids)
    rows = ctx.rows(x)
    require(slots % rows == 0, f"{slots} slots over {rows} activation rows", gate_up)
    return _Routed(gate_up, (clamp.id, act.id, quant.id), quant, h, k, i, slots, slots // rows)


def _shared(ctx: LowerCtx, group: LoweredGroup, x: Tensor) -> _Shared | None:
    gate_up = _one(ctx, group, lambda n: n.op == SHARED_GATE_UP_OP)
    down = _one(ctx, group, lambda n: n.op == SHARED_DOWN_OP)
    if gate_up is None and down is None:
        return None
    require(gate_up is not None and down is not None, "a shared expert needs its gate/up and its down", group)
    clamp, act = _chain_after(ctx, group, gate_up)
    xs, y = ctx.input(gate_up), ctx.output(down)
    require(ctx.input(down).src == act.order, f"{down.id} does not read {act.id}", down)
    require((xs.id, xs.src) == (x.id, x.src), f"{gate_up.id} does not read the router's input row", gate_up)
    one_row(ctx, xs, gate_up)
    ish, n = ctx.input(down).dim_value, y.dim_value
    require(ish % 16 == 0 and ish <= SILU_MAX_K and ctx.output(gate_up).dim_value == 2 * ish and n % 16 == 0,
            f"the shared expert needs I % 16 == 0, I <= {SILU_MAX_K}, a [gate | up] row of 2I and N % 16 == 0 "
            f"(I {ish}, N {n})", down)
    return _Shared(gate_up, (clamp.id, act.id), down, ish, n)


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    gate_up = _one(ctx, group, lambda n: n.op == "expert_gate_up")
    require(gate_up is not None, "a moe_experts group holds the routed gate/up GEMV", group)
    route, rows, x = glm_router_topk.router_quant_launch(ctx, group, gate_up)
    r = _routed(ctx, group, gate_up, x)
    down = _one(ctx, group, lambda n: n.op == "expert_down")
    shared = _shared(ctx, group, x)
    require(down is not None, "a moe_experts group holds the routed down GEMV", group)
    fast = fast_form(ctx)
    h = w4a4_mx_static.scratch(ctx, r.quant)
    ids = w4a4_mx_static.expert_ids(ctx, gate_up)
    ids_arg = w4a4_mx_static.ids_ptr(ctx, ids)
    pair_args = (ids_arg, lit(r.div), rows.codes, rows.scales, rows.globals,
                 *w4a4_mx_static.expert_weights(ctx, gate_up), flt(ctx.c.swiglu_limit),
                 w4a4_mx_static.gamma(ctx, r.quant), h.codes, h.scales, h.globals)
    require(ctx.input(down).id == r.h.id, f"{down.id} does not read the SwiGLU quantizer's NVFP4 rows", down)
    if group.rule == "fused:moe_gate_up_flow":
        require(shared is None, "moe_gate_up_flow takes the routed experts only", group)
        gq = Launch(gate_up_flow_instance(r.k, r.i, fast), grid=(r.slots * gate_up_flow_units(r.i), 1, 1),
                    block=SLOT_BLOCK, smem=0,
                    args=(*pair_args, ctx.state(f"{r.gate_up.id}.words", "unsigned int"),
                          ctx.state(f"{r.gate_up.id}.flow", "unsigned int")),
                    group=group.id, nodes=(r.gate_up.id, *r.chain),
                    note="gate/up tiles and SwiGLU quantizer units of one grid")
        return [route, gq, w4a4_mx_static.routed_slots(ctx, group, down, h, r.slots, after_quant=True)]
    if group.rule == "fused:moe_expert_flow":
        require(shared is None, "moe_expert_flow takes the routed experts only", group)
        return [route, _flow(ctx, group, r, down, h, pair_args, fast)]
    if shared is None:
        return [route, Launch(pair_instance(r.k, r.i, fast), grid=(r.i // 16, r.slots, 1), block=PAIR_BLOCK,
                              smem=0, args=pair_args, group=group.id, nodes=(r.gate_up.id, *r.chain),
                              note="16 gate + 16 up rows a CTA, their SwiGLU as one NVFP4 group of the down input"),
                w4a4_mx_static.routed_slots(ctx, group, down, h, r.slots)]
    return _with_shared(ctx, group, route, r, shared, down, h, ids_arg, rows, fast)


def _flow(ctx: LowerCtx, group: LoweredGroup, r: _Routed, down: Node, h: Quant, pair_args: tuple,
          fast: bool) -> Launch:
    """moe_expert_flow: the gate/up tiles, the SwiGLU quantizer's CTAs and the down's tiles of every
    slot in one grid, each unit waiting for the units it reads (kernels/moe_experts.cuh)."""
    y = ctx.output(down)
    n = y.dim_value
    require(r.i % 128 == 0 and r.i <= MAX_K and n % 16 == 0,
            f"the flow's down tiles need I % 128 == 0, I <= {MAX_K} and N % 16 == 0 (I {r.i}, N {n})", down)
    require(ctx.rows(y) == r.slots, f"output {y.id} has {ctx.rows(y)} rows for {r.slots} slots", down)
    tiles = w4a4_mx_static.slot_tiles(r.i, n)
    units = r.slots * flow_units_per_slot(r.i, n, tiles)
    return Launch(flow_instance(r.k, r.i, n, fast, tiles), grid=(units, 1, 1), block=SLOT_BLOCK, smem=0,
                  args=(*pair_args, *w4a4_mx_static.expert_weights(ctx, down), ctx.buf(y),
                        ctx.state(f"{r.gate_up.id}.words", "unsigned int"), ctx.state(f"{r.gate_up.id}.flow", "unsigned int")),
                  group=group.id, nodes=(r.gate_up.id, *r.chain, down.id),
                  note="gate/up tiles, SwiGLU quantizer and down tiles as units of one grid, each waiting for what "
                       "it reads")


def _with_shared(ctx: LowerCtx, group: LoweredGroup, route: Launch, r: _Routed, shared: _Shared, down: Node,
                 h: Quant, ids, rows: Quant, fast: bool) -> list[Launch]:
    """moe_router_shared (the router's CTAs, then the shared gate/up tiles), moe_gate_up_shared_down
    (the shared down's tiles, then the routed gate/up's), the SwiGLU quantizer, the routed down."""
    require(r.slots == r.div, f"the shared expert's launch forms take one token ({r.slots // r.div} rows)", group)
    experts, hidden = _top_k(ctx, group).dim_value, r.k
    opc = router_opc(experts)
    require(shared.ish % (2 * opc) == 0, f"the router launch's shared tiles take {2 * opc} positions each "
            f"(I {shared.ish})", group)
    silu_x = ctx.state(f"{shared.down.id}.silu_x", "float")
    first = Launch(router_shared_instance(hidden, experts, r.slots, shared.ish),
                   grid=(-(-experts // opc) + shared.ish // (2 * opc), 1, 1), block=(64 * opc, 1, 1), smem=0,
                   args=(*route.args, *nvfp4_weight(ctx, shared.gate_up), flt(ctx.c.swiglu_limit), silu_x),
                   group=group.id, nodes=(*route.nodes, shared.gate_up.id, *shared.chain),
                   note="the fused router's CTAs, then the shared gate/up tiles (the shared down's FP32 row)")
    gu = ctx.output(r.gate_up)

    def gu_rows(ctype: str):   # the [gate | up] rows: their buffer, or the gate/up node's state rows
        return ctx.buf(gu, ctype) if materialized(ctx, gu) else ctx.state(f"{r.gate_up.id}.rows", ctype)

    n = gu.dim_value
    second = Launch(gate_up_shared_down_instance(r.k, shared.ish, shared.n, fast),
                    grid=(shared.n // 16 + r.slots * (n // 16), 1, 1), block=SLOT_BLOCK, smem=0,
                    args=(ids, lit(r.div), rows.codes, rows.scales, rows.globals,
                          *w4a4_mx_static.expert_weights(ctx, r.gate_up),
                          gu_rows(BF16), lit(n), ctx.state(f"{shared.down.id}.silu_x", "const float"),
                          *nvfp4_weight(ctx, shared.down), ctx.buf(ctx.output(shared.down))),
                    group=group.id, nodes=(r.gate_up.id, shared.down.id),
                    note="the shared down's tiles, then the routed gate/up's")
    swiglu = Launch(w4a4_mx_static.quant_swiglu_instance(r.i), grid=w4a4_mx_static.quant_swiglu_grid(r.i, r.slots),
                    block=SLOT_BLOCK, smem=0,
                    args=(gu_rows(f"const {BF16}"), flt(ctx.c.swiglu_limit), w4a4_mx_static.gamma(ctx, r.quant),
                          h.codes, h.scales, h.globals),
                    group=group.id, nodes=r.chain)
    return [first, second, swiglu, w4a4_mx_static.routed_slots(ctx, group, down, h, r.slots)]


def _top_k(ctx: LowerCtx, group: LoweredGroup) -> Tensor:
    """The top-k's FP32 logits input (its width is the expert count)."""
    return ctx.input(next(n for n in ctx.nodes(group) if n.op == "top_k"))

def fits(bp: Blueprint, nodes: list[Node]) -> str | None:
    """Why moe_gate_up_pair (or, with the routed down and the shared expert among the nodes,
    moe_experts) cannot serve a merge (None: it can): the fused router with the experts' input
    quantizer serves the router part (glm_router_topk.fused_quant_fits), the routed [gate | up] rows
    feed the clamp alone, the SwiGLU feeds the NVFP4 quantizer of the down input, and the shapes
    are the kernels': K % 128 == 0, I % 16 == 0; the shared expert reads the router's input row,
    its I % 16 == 0 (at most SILU_MAX_K), one token."""
    by_op = {}
    for n in nodes:
        by_op.setdefault(n.op, []).append(n)
    gate_up = by_op["expert_gate_up"][0]
    (a,) = [t for t in bp.inputs(gate_up.order) if t.format != "i32"] or (None,)
    quant_in = bp.node(a.src) if a is not None else None
    if quant_in is None or quant_in not in nodes or quant_in.op_base != "act_quant":
        return "the routed gate/up GEMV does not read this merge's quantizer"
    why = glm_router_topk.fused_quant_fits(bp, [by_op["router"][0], by_op["top_k"][0], quant_in, gate_up])
    if why:
        return why
    why, i = _swiglu_chain(bp, nodes, gate_up, quant=True)
    if why:
        return why
    k = a.dim_value
    if k % 128 or k > MAX_K or i % 16:
        return f"the gate/up pair takes K % 128 == 0, K <= {MAX_K} and I % 16 == 0 (K {k}, I {i})"
    if SHARED_GATE_UP_OP not in by_op:
        return None
    sgu, sdown = by_op[SHARED_GATE_UP_OP][0], by_op[SHARED_DOWN_OP][0]
    xs, xr = bp.inputs(sgu.order)[0], bp.inputs(by_op["router"][0].order)[0]
    if (xs.id, xs.src) != (xr.id, xr.src) or xs.rows_per_token != 1:
        return "the shared expert does not read the router's one-token input row"
    why, ish = _swiglu_chain(bp, nodes, sgu, quant=False)
    if why:
        return why
    if bp.inputs(sdown.order)[0].dim_value != ish or ish % 16 or ish > SILU_MAX_K:
        return f"the shared down takes I % 16 == 0, I <= {SILU_MAX_K} (I {ish})"
    n = bp.outputs(sdown.order)[0].dim_value
    if n % 16:
        return f"the shared down's tiles take N % 16 == 0 (N {n})"
    experts = [t for t in bp.inputs(by_op["top_k"][0].order) if t.format != "i32"][0].dim_value
    opc = router_opc(experts)
    if ish % (2 * opc):
        return f"the router launch's shared tiles take {2 * opc} positions each ({experts} experts; I {ish})"
    return None


def _swiglu_chain(bp: Blueprint, nodes: list[Node], producer: Node, quant: bool) -> tuple[str | None, int]:
    """(why not, I): producer's [gate | up] BF16 row (2I) is read by a clamp of the merge alone, which
    feeds a silu_mul of the merge, which (quant) feeds an NVFP4 quantizer of the merge."""
    outs = bp.outputs(producer.order)
    if len(outs) != 1 or outs[0].format != "bf16" or outs[0].dst is None:
        return f"{producer.id}'s [gate | up] row is not one BF16 row read once", 0
    clamp = bp.node(outs[0].dst)
    act_out = bp.outputs(clamp.order)
    act = bp.node(act_out[0].dst) if len(act_out) == 1 and act_out[0].dst is not None else None
    if clamp not in nodes or clamp.op_base != "swiglu_clamp" or act not in nodes or act.op_base != "silu_mul":
        return f"{producer.id} does not feed a clamp and silu_mul of this merge", 0
    (h,) = bp.outputs(act.order) or (None,)
    if h is None or h.format != "bf16" or 2 * h.dim_value != outs[0].dim_value:
        return f"{act.id} does not write a BF16 row of half the [gate | up] width", 0
    if quant:
        q = bp.node(h.dst) if h.dst is not None else None
        if q not in nodes or q.op_base != "act_quant" or any(t.format != "nvfp4/g16" for t in bp.outputs(q.order)):
            return f"{act.id} does not feed an NVFP4 quantizer of this merge", 0
    return None, h.dim_value
