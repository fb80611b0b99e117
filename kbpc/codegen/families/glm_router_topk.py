"""glm_router_topk: sigmoid + correction-bias top-k routing (kernels/glm_router_topk.cuh).

- glm_router_topk_rank_kda / _dsa: one router_topk launch per group. The FP32 logits come from the
  router GEMV group; the weights (routed scale included) and the expert ids are the top_k node's
  `topk_w` and `topk_id` buffers. E = the logits width, K = the slots per token.
- fused:router_gemv_topk (the router node + top_k, kbpc/passes/fusion_rules.py): one
  router_gemv_topk launch, the router GEMV in the dense_bf16 family's device code and order (the
  same logits bits) over ceil(E / OPC) x rows CTAs, then the top-k in the last CTA to finish. The
  logits go to their buffer when a group outside reads them, else to the top_k node's scratch
  state; the arrival counter is state too (kbpc.ir.state.router_state: zero at reset, left zero).
- fused:router_expert_quant (router, top_k, the routed experts' act_quant and expert_gate_up):
  router_gemv_topk_quant, the fused router whose CTAs also quantize the router's input row to
  NVFP4 with the experts' static scale into the quantizer's scratch rows (the bytes
  w4a4_quant_rows_static writes), then the slot GEMV as w4a4_mx_static lowers it (routed_slots).
  With ROUTER_CLUSTER, router_cluster_topk_quant instead: the same bytes, the logits meeting in
  distributed shared memory (one cluster a token) instead of an L2 arrival."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kbpc.codegen.context import LowerCtx, Quant, flt
from kbpc.codegen.families import w4a4_mx_static
from kbpc.codegen.families._projection import materialized, require
from kbpc.codegen.families.dense_bf16 import outputs_per_cta
from kbpc.codegen.families.dsa_state import state_buffer
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node, Tensor
from kbpc.ir.state import ROUTED_EXPERT_OPS, router_state
from kbpc.targets import get_target

if TYPE_CHECKING:
    from kbpc.ir.graph import Blueprint

HEADER = "glm_router_topk.cuh"
KERNEL_RENORM_EPS = np.float32(1e-20)   # the kernel's fixed renormalisation epsilon
MAX_EXPERTS, MAX_SLOTS = 1024, 32       # router_topk_row's limits
# The fused top-k's CTA plays at most this many experts a thread (while 256 threads allow): its
# ranking is serial per expert, and it runs in one CTA after the whole GEMV (the step's latency).
FUSED_EXPERTS_PER_THREAD = 1
FUSED_PARAMS = ("const __nv_bfloat16*", "const __nv_bfloat16*", "const float*", "float", "float*",
                "unsigned int*", "float*", "int*")
QUANT_PARAMS = ("float", "uint8_t*", "uint8_t*", "float*")   # gamma, codes, scales, global scales
# The fused quantizing router as one thread-block cluster a token (router_cluster_topk_quant):
# ceil(E / CLUSTER_LOGITS) CTAs, one 64-thread group a logit, or the target's widest cluster with
# more logits a group where E exceeds CLUSTER_LOGITS clusters.
# H200, 128-expert seed shrink (16-CTA clusters), 1k, replay timelines: the router ends 4.85 us
# after the hc boundary instead of 7.11, but alone it gains nothing (the routed gate/up then ends
# at the same time, 30.9 against 31.0 us, the exact shared expert's gate/up holding SMs beside it;
# `kbpc bench` 4.811 / 4.775 against 4.765 / 4.766 ms). With the shared expert out of the way it
# pays: in probes without the shared expert 4.687 ms against 4.758 with the last-CTA router, the tensor-core shared pair
# (w4a16_gemv.SHARED_PAIR_FAST) with it 4.739 / 4.744 against 4.772 / 4.805 with neither, 16k
# 4.946 / 4.969 against 4.969 / 4.985 (bench/NOTES.md, thirty-first session). Logits bit-equal.
# Past 128 experts (a group then takes several logits): the seed's 288 experts, 20 layers, with
# the fast pair, 2.355 / 2.324 ms a step against 2.387 / 2.372 with the last-CTA router.
ROUTER_CLUSTER = True
CLUSTER_LOGITS = 8


def router_threads(experts: int) -> int:
    """kbp::router_threads: one thread per expert, whole warps."""
    return 32 * -(-experts // 32)


def fused_outputs_per_cta(experts: int) -> int:
    """Router outputs per CTA of the fused kernel: the dense GEMV's choice (kbpc.codegen.families.
    dense_bf16.outputs_per_cta), raised until the last CTA's 64 * OPC threads play at most
    FUSED_EXPERTS_PER_THREAD experts each in the top-k (4 at most: 256 threads)."""
    opc = outputs_per_cta(experts)
    while opc < 4 and FUSED_EXPERTS_PER_THREAD * 64 * opc < router_threads(experts):
        opc *= 2
    return opc


def fused_instance(hidden: int, experts: int, k: int) -> KernelInstance:
    opc = fused_outputs_per_cta(experts)
    return KernelInstance("glm_router_topk", HEADER, f"kbp::router_gemv_topk<{hidden}, {experts}, {k}, {opc}>",
                          FUSED_PARAMS)


def fused_quant_instance(hidden: int, experts: int, k: int) -> KernelInstance:
    """router_gemv_topk_quant: the fused router that also quantizes its input (rule router_expert_quant)."""
    opc = fused_outputs_per_cta(experts)
    return KernelInstance("glm_router_topk", HEADER,
                          f"kbp::router_gemv_topk_quant<{hidden}, {experts}, {k}, {opc}>", FUSED_PARAMS + QUANT_PARAMS)


def router_cluster(experts: int, max_cluster: int) -> int:
    """CTAs of router_cluster_topk_quant's cluster for `experts` logits on a target whose clusters
    hold max_cluster CTAs (CLUSTER_LOGITS a CTA, more where the cluster is full), or 0 where the
    last-CTA form serves (ROUTER_CLUSTER off)."""
    return min(-(-experts // CLUSTER_LOGITS), max_cluster) if ROUTER_CLUSTER else 0


def cluster_threads(experts: int, cl: int) -> int:
    """kbp::router_cluster_threads: a 64-thread group a logit, at most 8 groups a CTA."""
    return 64 * min(-(-experts // cl), CLUSTER_LOGITS)


def cluster_quant_instance(hidden: int, experts: int, k: int, cl: int) -> KernelInstance:
    return KernelInstance("glm_router_topk", HEADER,
                          f"kbp::router_cluster_topk_quant<{hidden}, {experts}, {k}, {cl}>",
                          FUSED_PARAMS + QUANT_PARAMS, cluster=cl)


@dataclass(frozen=True)
class _TopK:
    node: Node
    logits: Tensor
    weights: Tensor
    ids: Tensor
    experts: int
    slots: int
    rows: int


def _top_k(ctx: LowerCtx, group: LoweredGroup) -> _TopK:
    node = ctx.node(group, "top_k")
    z, w, ids = ctx.input(node), ctx.output(node, "topk_w"), ctx.output(node, "topk_id")
    e, k = z.dim_value, w.dim_value
    require(1 <= e <= MAX_EXPERTS and 1 <= k <= min(MAX_SLOTS, e),
            f"router_topk takes E <= {MAX_EXPERTS}, K <= {MAX_SLOTS} (E {e}, K {k})", node)
    require(ids.dim_value == k and w.format == "f32" and ids.format == "i32" and z.format == "f32",
            f"router outputs {w.format} x {w.dim_value}, {ids.format} x {ids.dim_value}", node)
    require(np.float32(ctx.c.router_renorm_eps) == KERNEL_RENORM_EPS,
            f"router_renorm_eps {ctx.c.router_renorm_eps}: the kernel divides by (sum + 1e-20)", node)
    rows = ctx.rows(w)
    require(ctx.rows(ids) == rows and (not materialized(ctx, z) or ctx.rows(z) == rows),
            f"row counts disagree ({rows} weight rows)", node)
    return _TopK(node, z, w, ids, e, k, rows)


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    t = _top_k(ctx, group)
    nodes = ctx.nodes(group)
    routers = [n for n in nodes if n.op == "router"]
    quants = [n for n in nodes if n.op_base == "act_quant"]
    experts = [n for n in nodes if n.op == "expert_gate_up"]
    require(len(nodes) == 1 + len(routers) + len(quants) + len(experts) and len(routers) <= 1
            and len(quants) == len(experts) <= len(routers),
            f"glm_router_topk has no kernel for the nodes {sorted(n.op for n in nodes)}", group)
    if experts:
        return _fused_quant(ctx, group, routers[0], t, experts[0])
    if routers:
        return [_fused(ctx, group, routers[0], t)]
    inst = KernelInstance("glm_router_topk", HEADER, f"kbp::router_topk<{t.experts}, {t.slots}>",
                          ("const float*", "const float*", "float", "float*", "int*"))
    args = (ctx.buf(t.logits, "const float"), ctx.weight(t.node, "e_score_correction_bias", "float"),
            flt(ctx.c.routed_scale), ctx.buf(t.weights, "float"), ctx.buf(t.ids, "int"))
    return [Launch(inst, grid=(t.rows, 1, 1), block=(router_threads(t.experts), 1, 1), smem=0, args=args,
                   group=group.id, nodes=(t.node.id,))]


def _fused(ctx: LowerCtx, group: LoweredGroup, router: Node, t: _TopK) -> Launch:
    """router_gemv_topk: the router GEMV of every row and its top-k in one launch."""
    require(t.logits.src == router.order, f"{t.node.id} does not read {router.id}'s logits", t.node)
    x = ctx.input(router)
    h = x.dim_value
    require(h % 8 == 0 and router.precision.weight == "bf16" and x.format == "bf16",
            f"the fused router reads BF16 rows of a multiple of 8 (got {x.format} x {h}, weight "
            f"{router.precision.weight})", router)
    require(ctx.rows(x) == t.rows, f"row counts disagree ({ctx.rows(x)} input rows, {t.rows} weight rows)", router)
    scratch, arrive = router_state(t.node, t.rows, t.experts)
    require(state_buffer(ctx, scratch.name).shape == scratch.shape, f"state {scratch.name} does not hold "
            f"{t.rows} rows of {t.experts} logits", t.node)
    logits = ctx.buf(t.logits, "float") if materialized(ctx, t.logits) else ctx.state(scratch.name, "float")
    inst = fused_instance(h, t.experts, t.slots)
    opc = fused_outputs_per_cta(t.experts)
    args = (ctx.weight(router, ctype="__nv_bfloat16"), ctx.buf(x),
            ctx.weight(t.node, "e_score_correction_bias", "float"), flt(ctx.c.routed_scale), logits, ctx.state(arrive.name, "unsigned int"), ctx.buf(t.weights, "float"),
            w4a4_mx_static.ids_ptr(ctx, t.ids, "int"))
    return Launch(inst, grid=(-(-t.experts // opc), t.rows, 1), block=(64 * opc, 1, 1), smem=0, args=args,
                  group=group.id, nodes=(router.id, t.node.id))


def _fused_quant(ctx: LowerCtx, group: LoweredGroup, router: Node, t: _TopK, expert: Node) -> list[Launch]:
    """router_gemv_topk_quant (the fused router, its CTAs also quantizing the router's input into the
    act_quant's scratch rows as w4a4_quant_rows_static would), then the experts' slot GEMV on them."""
    route, rows, x = _route_quant(ctx, group, router, t, expert)
    return [route, w4a4_mx_static.routed_slots(ctx, group, expert, rows, ctx.rows(x))]


def router_quant_launch(ctx: LowerCtx, group: LoweredGroup, expert: Node) -> tuple[Launch, Quant, Tensor]:
    """(router_gemv_topk_quant's launch for a group holding the router, its top_k and the act_quant of
    the routed gate/up GEMV `expert`, the quantized rows it writes, their BF16 source row): what a
    merged MoE group (kbpc/codegen/families/moe_experts.py) launches first."""
    nodes = ctx.nodes(group)
    routers = [n for n in nodes if n.op == "router"]
    require(len(routers) == 1, f"a fused router group holds one router node, found {len(routers)}", group)
    return _route_quant(ctx, group, routers[0], _top_k(ctx, group), expert)


def _route_quant(ctx: LowerCtx, group: LoweredGroup, router: Node, t: _TopK,
                 expert: Node) -> tuple[Launch, Quant, Tensor]:
    quant, x, rows = w4a4_mx_static.fused_input(ctx, group, expert)
    w4a4_mx_static.quant_rows_input(ctx, quant)   # the separate quantizer's layout requirements
    xr = ctx.input(router)
    require((x.id, x.src) == (xr.id, xr.src), f"{quant.id} does not quantize {router.id}'s input", quant)
    ids = w4a4_mx_static.expert_ids(ctx, expert)
    require(ids.src == t.node.order, f"{expert.id} does not read {t.node.id}'s expert ids", expert)
    route = _fused(ctx, group, router, t)
    route = dataclasses.replace(route, instance=fused_quant_instance(xr.dim_value, t.experts, t.slots),
                                args=(*route.args, w4a4_mx_static.gamma(ctx, quant), rows.codes, rows.scales,
                                      rows.globals),
                                nodes=(*route.nodes, quant.id))
    cl = router_cluster(t.experts, get_target(ctx.plan.options.target).max_cluster)
    if cl:   # (whole NVFP4 groups: quant_rows_input above; K <= 32 slots: fused_fits)
        route = dataclasses.replace(route, instance=cluster_quant_instance(xr.dim_value, t.experts, t.slots, cl),
                                    grid=(cl, t.rows, 1), block=(cluster_threads(t.experts, cl), 1, 1))
    return route, rows, x


def fused_fits(bp: Blueprint, nodes: list[Node]) -> str | None:
    """Why router_gemv_topk cannot serve a router + top_k pair (None: it can): the top_k reads the
    router's FP32 logits, the router is a BF16 x BF16 GEMV of a multiple-of-8 row, and the sizes
    are within router_topk_row's limits."""
    router = next(n for n in nodes if n.op == "router")
    top_k = next(n for n in nodes if n.op == "top_k")
    logits = [t for t in bp.inputs(top_k.order) if t.format != "i32"]
    if len(logits) != 1 or logits[0].src != router.order or logits[0].format != "f32":
        return "the top-k does not read the router's FP32 logits"
    if (router.precision.weight, router.precision.activation) != ("bf16", "bf16"):
        return f"the router is {router.precision.weight} x {router.precision.activation}, not a BF16 GEMV"
    h = bp.inputs(router.order)[0].dim_value
    if h % 8:
        return f"router input width {h} is not a multiple of 8"
    e = logits[0].dim_value
    k = max((t.dim_value for t in bp.outputs(top_k.order)), default=0)
    if not (1 <= e <= MAX_EXPERTS and 1 <= k <= min(MAX_SLOTS, e)):
        return f"{e} experts, top {k}: the top-k takes E <= {MAX_EXPERTS}, K <= {MAX_SLOTS}"
    return None


def fused_quant_fits(bp: Blueprint, nodes: list[Node]) -> str | None:
    """Why router_gemv_topk_quant cannot serve a router + top_k + act_quant + expert_gate_up merge
    (None: it can): the router + top_k pair fits the fused router (fused_fits), the act_quant reads
    the router's own input (the same tensor from the same producer) and w4a4_quant_rows_static's
    form serves it (nvfp4/g16 with the expert's static scale), and the expert GEMV reads that
    quantizer's rows and this top-k's ids."""
    router = next(n for n in nodes if n.op == "router")
    top_k = next(n for n in nodes if n.op == "top_k")
    quant = next(n for n in nodes if n.op_base == "act_quant")
    expert = next(n for n in nodes if n.op_base in ROUTED_EXPERT_OPS)
    why = fused_fits(bp, [router, top_k])
    if why:
        return why
    xr, xq = bp.inputs(router.order)[0], bp.inputs(quant.order)
    if len(xq) != 1 or (xq[0].id, xq[0].src) != (xr.id, xr.src):
        return f"{quant.id} does not quantize {router.id}'s input"
    why = w4a4_mx_static.static_quant_fits(bp, quant)
    if why:
        return why
    srcs = {t.src for t in bp.inputs(expert.order)}
    if srcs != {quant.order, top_k.order}:
        return f"{expert.id} does not read {quant.id}'s rows and {top_k.id}'s ids alone"
    return None
