"""glm_moe_layer: a whole MoE layer in two launches (kernels/glm_moe_layer.cuh): moe_gate_up (router
GEMV + top-k, the expert input's quantization, routed gate_up + SwiGLU-clamp + the down input's
quantization, shared gate_up) and moe_down (routed down, shared down, combine).

This module plans the launches from the layer's sizes: the K split P of the routed GEMVs (more,
smaller work items when few tiles would leave SMs idle), the cp.async ring depth, the dynamic
shared memory (the formula of moe_smem_bytes in the header; an nvcc test checks that the two
agree) and the grid (persistent: two CTAs per SM, one when the staged activations leave no room
for two; any grid is correct, the work is claimed dynamically)."""
from __future__ import annotations

from dataclasses import dataclass

from kbpc.codegen.context import LoweringError

THREADS = 256
ROWS = 32                       # MOE_ROWS: weight rows per routed item
STAGE_BYTES = ROWS * ((8 * 64 + 16) + (8 * 8 + 8))  # MOE_STAGE_BYTES
ACT_BYTES = 36                  # MOE_ACT_BYTES: a staged activation group (2 x 16) and its scale
SMEM_PER_SM = 226 * 1024        # usable shared memory of an sm_90 SM (228 KB less 1 KB per CTA)
MAX_STAGES = 4
CTAS_PER_SM = (2, 1)            # preferred CTAs per SM, then the fallback for large activations
MIN_ITEMS_PER_CTA = 2           # below this many routed items per CTA, split K
SM_COUNT = {"sm_90": 132, "sm_100": 148, "sm_120": 84, "sm_121": 48}  # per target (the largest part)


@dataclass(frozen=True)
class MoeLayerShape:
    hidden: int          # H: gate_up K, down N
    inter: int           # I: routed expert intermediate
    shared_inter: int    # ISH: shared expert intermediate (0: none)
    experts: int         # E
    top_k: int           # TOPK
    tokens: int = 1      # M

    def check(self) -> None:
        h, i, ish = self.hidden, self.inter, self.shared_inter
        problems = []
        if h % 128 or i % 128:
            problems.append(f"hidden {h} and expert intermediate {i} must be multiples of 128")
        if ish % 16:
            problems.append(f"shared intermediate {ish} must be a multiple of 16")
        if not 1 <= self.experts <= 1024 or not 1 <= self.top_k <= 32 or self.top_k > self.experts:
            problems.append(f"{self.experts} experts, top {self.top_k}: 1 <= top_k <= 32, experts <= 1024")
        if self.tokens < 1:
            problems.append(f"{self.tokens} tokens")
        if problems:
            raise LoweringError("; ".join(problems), "glm_moe_layer")


@dataclass(frozen=True)
class MoeKernelPlan:
    kernel: str          # C++ name with template arguments
    parts: int           # P
    stages: int          # STAGES
    smem: int            # dynamic shared memory bytes
    grid: int


def pipe_smem_bytes(stages: int) -> int:
    """sizeof(MoePipeSmem<STAGES>), rounded to 16: pend (2+2 ints), meta (3 x STAGES ints), flag,
    part [8][32] floats."""
    return -(-(4 * (4 + 3 * stages + 1) + 4 * 8 * 32) // 16) * 16


def smem_bytes(stages: int, groups: int) -> int:
    """moe_smem_bytes<STAGES>(groups): the ring, the staged activation groups, the pipeline state."""
    return stages * STAGE_BYTES + -(-groups * ACT_BYTES // 16) * 16 + pipe_smem_bytes(stages)


def static_smem_bytes(shape: MoeLayerShape) -> int:
    """An upper bound of the kernels' static shared memory: the top-k's lists (router_topk_row),
    the staged logits, and under 1 KB of small buffers."""
    e, k = shape.experts, shape.top_k
    return 8 * -(-e // 32) * k + 8 * k + 4 * e + 1024


def _fit(groups: int, static: int, what: str) -> tuple[int, int]:
    """(ring stages, CTAs per SM): the deepest ring (2..MAX_STAGES) with two CTAs per SM, else
    with one."""
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


def gate_up_plan(shape: MoeLayerShape, parts: int, stages: int, grid: int) -> MoeKernelPlan:
    h, i, m = shape.hidden, shape.inter, shape.tokens
    name = f"kbp::moe_gate_up<{h}, {i}, {shape.shared_inter}, {shape.experts}, {shape.top_k}, {m}, {parts}, {stages}>"
    return MoeKernelPlan(name, parts, stages, smem_bytes(stages, m * (h // 16)), grid)


def down_plan(shape: MoeLayerShape, parts: int, stages: int, grid: int) -> MoeKernelPlan:
    h, i, slots = shape.hidden, shape.inter, shape.tokens * shape.top_k
    name = f"kbp::moe_down<{h}, {i}, {shape.shared_inter}, {shape.top_k}, {shape.tokens}, {parts}, {stages}>"
    return MoeKernelPlan(name, parts, stages, smem_bytes(stages, slots * (i // 16)), grid)


def plan_moe_layer(shape: MoeLayerShape, sms: int) -> tuple[MoeKernelPlan, MoeKernelPlan]:
    """(moe_gate_up, moe_down) launch plans for a GPU with `sms` multiprocessors."""
    shape.check()
    h, i, slots = shape.hidden, shape.inter, shape.tokens * shape.top_k
    s_gu, c_gu = _fit(shape.tokens * (h // 16), static_smem_bytes(shape), "moe_gate_up")
    s_dn, c_dn = _fit(slots * (i // 16), 1024, "moe_down")
    g_gu, g_dn = c_gu * sms, c_dn * sms
    return (gate_up_plan(shape, _parts((i // 16) * slots, h, g_gu), s_gu, g_gu),
            down_plan(shape, _parts((h // 32) * slots, i, g_dn), s_dn, g_dn))
