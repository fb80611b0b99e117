"""glm_moe_layer: a whole MoE layer (the fused group of rule moe_layer: router, top-k, routed
experts with their quantizers and SwiGLU, the shared expert, the combine) as two launches of one
kernel instance, kbp::moe_layer (kernels/glm_moe_layer.cuh): phase 0 moe_gate_up (router GEMV and
top-k, the expert input quantized once, shared gate_up, routed gate_up with SwiGLU-clamp and the
down input's quantization in its epilogue), phase 1 moe_down (routed and shared down, the combine
in its epilogue). One instance, because what phase 0 hands to phase 1 (ids, weights, the
quantized down input, the shared down's FP32 input, the expert rows) has no arena buffer inside the
fused group: it lives in the instance's device memory. Edges that are materialized anyway (a reader
outside the group, or the debug arena) are passed as the kernel's taps and written there too.

Planning from the layer's sizes: the K split of each routed GEMV (more, smaller work items when
few tiles would leave SMs idle), the cp.async ring depth, the dynamic shared memory (the header's
moe_smem_bytes; an nvcc test checks that the two agree), and the grid (persistent: two CTAs per SM,
one when the staged activations leave no room for two; any grid is correct: work is claimed
dynamically)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kbpc.codegen.args import NULL, lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.families import w4a4_mx_static
from kbpc.codegen.families._projection import BF16, materialized, require
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node
from kbpc.targets import get_target

HEADER = "glm_moe_layer.cuh"
THREADS = 256
STAGE_BYTES = 32 * ((8 * 64 + 16) + (8 * 8 + 8))  # MOE_STAGE_BYTES: 32 rows x 8 chunks, padded
ACT_BYTES = 36                  # MOE_ACT_BYTES: a staged activation group (2 x 16) and its scale
SMEM_PER_SM = 226 * 1024        # usable shared memory of an sm_90 SM (228 KB less 1 KB per CTA)
MAX_STAGES = 4
CTAS_PER_SM = (2, 1)            # preferred CTAs per SM, then the fallback for large activations
MIN_ITEMS_PER_CTA = 2           # below this many routed items per CTA, split K
KERNEL_RENORM_EPS = np.float32(1e-20)   # router_topk_row's fixed renormalisation epsilon
CB, CU8, CF = f"const {BF16}*", "const uint8_t*", "const float*"
# kbp::moe_layer's parameters in order: (name, C++ type).
SIGNATURE = (
    ("phase", "int"), ("xn", CB), ("w_router", CB), ("bias", CF), ("routed_scale", "float"), ("gamma_gu", "float"),
    ("gu_codes", CU8), ("gu_scales", CU8), ("gu_sg", CF), ("gamma_dn", "float"), ("limit", "float"),
    ("dn_codes_w", CU8), ("dn_scales_w", CU8), ("dn_sg", CF), ("sh_codes", CU8), ("sh_scales", CU8),
    ("sh_sg", "float"), ("shd_codes", CU8), ("shd_scales", CU8), ("shd_sg", "float"), ("y", f"{BF16}*"),
    ("prefetch_rows", "int"), ("logits", "float*"), ("topk_w", "float*"), ("topk_id", "int*"),
    ("dn_codes", "uint8_t*"), ("dn_scales", "uint8_t*"), ("sh_x", "float*"), ("egu", f"{BF16}*"),
    ("sgu", f"{BF16}*"), ("edown", f"{BF16}*"), ("sdown", f"{BF16}*"))
PARAM_NAMES = tuple(n for n, _ in SIGNATURE)
PARAMS = tuple(t for _, t in SIGNATURE)


@dataclass(frozen=True)
class MoeLayerShape:
    hidden: int          # H: gate_up K, down N
    inter: int           # I: routed expert intermediate
    shared_inter: int    # ISH: shared expert intermediate (0: none)
    experts: int         # E
    top_k: int           # TOPK
    tokens: int = 1      # M

    def problems(self) -> list[str]:
        h, i, ish = self.hidden, self.inter, self.shared_inter
        out = []
        if h % 128 or i % 128 or h <= 0 or i <= 0:
            out.append(f"hidden {h} and expert intermediate {i} must be positive multiples of 128")
        if ish % 16 or ish < 0:
            out.append(f"shared intermediate {ish} must be a multiple of 16")
        if not 1 <= self.experts <= 1024 or not 1 <= self.top_k <= 32 or self.top_k > self.experts:
            out.append(f"{self.experts} experts, top {self.top_k}: need 1 <= top_k <= min(32, experts), experts <= 1024")
        if self.tokens < 1:
            out.append(f"{self.tokens} tokens")
        return out


@dataclass(frozen=True)
class MoePhasePlan:
    parts: int           # K split of the routed GEMV
    stages: int          # cp.async ring depth
    smem: int            # dynamic shared memory bytes
    grid: int


@dataclass(frozen=True)
class MoeLayerPlan:
    shape: MoeLayerShape
    gate_up: MoePhasePlan
    down: MoePhasePlan

    @property
    def kernel(self) -> str:
        s, g, d = self.shape, self.gate_up, self.down
        return (f"kbp::moe_layer<{s.hidden}, {s.inter}, {s.shared_inter}, {s.experts}, {s.top_k}, {s.tokens}, "
                f"{g.parts}, {g.stages}, {d.parts}, {d.stages}>")

    def instance(self) -> KernelInstance:
        return KernelInstance("glm_moe_layer", HEADER, self.kernel, PARAMS)


def pipe_smem_bytes(stages: int) -> int:
    """sizeof(MoePipeSmem<STAGES>), rounded to 16: pend (2+2 ints), meta (3 x STAGES ints), flag,
    part [8][32] floats."""
    return -(-(4 * (4 + 3 * stages + 1) + 4 * 8 * 32) // 16) * 16


def smem_bytes(stages: int, groups: int) -> int:
    """moe_smem_bytes<STAGES>(groups): the ring, the staged activation groups, the pipeline state."""
    return stages * STAGE_BYTES + -(-groups * ACT_BYTES // 16) * 16 + pipe_smem_bytes(stages)


def static_smem_bytes(shape: MoeLayerShape) -> int:
    """An upper bound of the kernel's static shared memory: the top-k's lists (router_topk_row),
    the staged logits, and under 1 KB of small buffers."""
    e, k = shape.experts, shape.top_k
    return 8 * -(-e // 32) * k + 8 * k + 4 * e + 1024


def _fit(groups: int, static: int, what: str) -> tuple[int, int]:
    """(ring stages, CTAs per SM): the deepest ring (2..MAX_STAGES) with two CTAs per SM, else one."""
    for ctas in CTAS_PER_SM:
        for stages in range(MAX_STAGES, 1, -1):
            if smem_bytes(stages, groups) + static <= SMEM_PER_SM // ctas:
                return stages, ctas
    raise LoweringError(f"{what}: {groups} staged activation groups leave no room for a 2-stage ring "
                        f"in {SMEM_PER_SM} bytes of shared memory", "glm_moe_layer")


def _parts(items: int, k: int, grid: int) -> int:
    """The smallest K split (1, 2, 4, 8; at most one part per 128-wide chunk) that gives every CTA
    of the grid MIN_ITEMS_PER_CTA routed items, or the largest allowed."""
    chunks, p = k // 128, 1
    while p < 8 and 2 * p <= chunks and items * p < MIN_ITEMS_PER_CTA * grid:
        p *= 2
    return p


def phase_plan(shape: MoeLayerShape, phase: int, parts: int, stages: int, grid: int) -> MoePhasePlan:
    """A phase with a given K split and ring depth (planned, or forced by a test)."""
    groups = shape.tokens * (shape.hidden // 16) if phase == 0 else shape.tokens * shape.top_k * (shape.inter // 16)
    return MoePhasePlan(parts, stages, smem_bytes(stages, groups), grid)


def plan_moe_layer(shape: MoeLayerShape, sms: int) -> MoeLayerPlan:
    """The two phases' launch plans for a GPU with `sms` multiprocessors."""
    if shape.problems():
        raise LoweringError("; ".join(shape.problems()), "glm_moe_layer")
    h, i, slots = shape.hidden, shape.inter, shape.tokens * shape.top_k
    static = static_smem_bytes(shape)
    s_gu, c_gu = _fit(shape.tokens * (h // 16), static, "moe_gate_up")
    s_dn, c_dn = _fit(slots * (i // 16), static, "moe_down")
    g_gu, g_dn = c_gu * sms, c_dn * sms
    return MoeLayerPlan(shape, phase_plan(shape, 0, _parts((i // 16) * slots, h, g_gu), s_gu, g_gu),
                        phase_plan(shape, 1, _parts((h // 32) * slots, i, g_dn), s_dn, g_dn))


# ------------------------------------------------------------------ lowering

def _roles(ctx: LowerCtx, group: LoweredGroup) -> dict[str, Node]:
    """The group's nodes by role (single ops by op; the shared linears by their role name)."""
    roles: dict[str, Node] = {}
    for node in ctx.nodes(group):
        role = node.op.split(":", 1)[1] if node.op_base == "linear" else node.op
        if role in ("act_quant", "swiglu_clamp", "silu_mul"):
            continue  # fused into the expert kernels: no launch of their own
        require(role not in roles, f"a MoE layer group has one {role} node", group)
        roles[role] = node
    for role in ("router", "top_k", "expert_gate_up", "expert_down", "blend"):
        require(role in roles, f"a MoE layer group needs a {role} node", group)
    require(("shared_gate_up" in roles) == ("shared_down" in roles), "a shared expert needs gate_up and down", group)
    return roles


def _shape(ctx: LowerCtx, r: dict[str, Node], group: LoweredGroup) -> MoeLayerShape:
    xn, logits = ctx.input(r["router"]), ctx.output(r["router"])
    ids = ctx.output(r["top_k"], "topk_id")
    down_in, y = ctx.input(r["expert_down"]), ctx.output(r["blend"])
    ish = ctx.input(r["shared_down"]).dim_value if "shared_down" in r else 0
    shape = MoeLayerShape(xn.dim_value, down_in.dim_value, ish, logits.dim_value, ids.dim_value, ctx.rows(y))
    require(not shape.problems(), "; ".join(shape.problems()), group)
    require(ctx.output(r["expert_gate_up"]).dim_value == 2 * shape.inter and y.dim_value == shape.hidden,
            f"gate_up width {ctx.output(r['expert_gate_up']).dim_value}, output {y.dim_value}", group)
    require(ctx.rows(xn) == shape.tokens, f"{ctx.rows(xn)} input rows for {shape.tokens} tokens", group)
    require(np.float32(ctx.c.router_renorm_eps) == KERNEL_RENORM_EPS,
            f"router_renorm_eps {ctx.c.router_renorm_eps}: the kernel divides by (sum + 1e-20)", group)
    require(ctx.c.swiglu_limit > 0, f"swiglu_limit must be positive, got {ctx.c.swiglu_limit}", group)
    return shape


def _tap(ctx: LowerCtx, node: Node, name: str | None, ctype: str):
    """An internal edge's buffer when it is materialized anyway, else NULL (the instance scratch)."""
    t = ctx.output(node, name)
    return ctx.buf(t, ctype) if materialized(ctx, t) else NULL


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    r = _roles(ctx, group)
    shape = _shape(ctx, r, group)
    plan = plan_moe_layer(shape, get_target(ctx.plan.options.target).sms)
    gu, dn, sh, shd = r["expert_gate_up"], r["expert_down"], r.get("shared_gate_up"), r.get("shared_down")

    def shared(node):
        if node is None:
            return NULL, NULL, flt(0.0)
        return ctx.weight(node), ctx.weight(node, "weight_scale"), ctx.weight_value(node, "weight_scale_2")

    top_k = r["top_k"]
    sh_codes, sh_scales, sh_sg = shared(sh)
    shd_codes, shd_scales, shd_sg = shared(shd)
    named = dict(
        xn=ctx.buf(ctx.input(r["router"]), f"const {BF16}"), w_router=ctx.weight(r["router"], ctype=BF16),
        bias=ctx.weight(top_k, "e_score_correction_bias", "float"), routed_scale=flt(ctx.c.routed_scale),
        gamma_gu=ctx.weight_value(gu, "input_scale"), gamma_dn=ctx.weight_value(dn, "input_scale"),
        limit=flt(ctx.c.swiglu_limit), sh_codes=sh_codes, sh_scales=sh_scales, sh_sg=sh_sg, shd_codes=shd_codes,
        shd_scales=shd_scales, shd_sg=shd_sg, y=ctx.buf(ctx.output(r["blend"])), prefetch_rows=lit(shape.hidden // 4),
        # taps: internal edges that are materialized anyway; the quantized / FP32 internals stay in scratch
        logits=_tap(ctx, r["router"], None, "float"), topk_w=_tap(ctx, top_k, "topk_w", "float"),
        topk_id=_tap(ctx, top_k, "topk_id", "int"), dn_codes=NULL, dn_scales=NULL, sh_x=NULL,
        egu=_tap(ctx, gu, None, BF16), sgu=_tap(ctx, sh, None, BF16) if sh else NULL,
        edown=_tap(ctx, dn, None, BF16), sdown=_tap(ctx, shd, None, BF16) if shd else NULL)
    named.update(zip(("gu_codes", "gu_scales", "gu_sg"), w4a4_mx_static.expert_weights(ctx, gu)))
    named.update(zip(("dn_codes_w", "dn_scales_w", "dn_sg"), w4a4_mx_static.expert_weights(ctx, dn)))
    args = tuple(named[n] for n in PARAM_NAMES[1:])
    inst, nodes = plan.instance(), tuple(group.nodes)
    return [Launch(inst, grid=(p.grid, 1, 1), block=(THREADS, 1, 1), smem=p.smem, args=(lit(phase), *args),
                   group=group.id, nodes=nodes, note=note)
            for phase, p, note in ((0, plan.gate_up, "moe_gate_up: router, top-k, shared and routed gate_up"),
                                   (1, plan.down, "moe_down: routed and shared down, combine"))]
