"""glm_router_topk: sigmoid + correction-bias top-k routing (kernels/glm_router_topk.cuh):
glm_router_topk_rank_kda / _dsa, one router_topk launch per group. The FP32 logits come from the
router GEMV group; the weights (routed scale included) and the expert ids are the top_k node's
`topk_w` and `topk_id` buffers. E = the logits width, K = the slots per token."""
from __future__ import annotations

import numpy as np

from kbpc.codegen.context import LowerCtx, flt
from kbpc.codegen.families._projection import require
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup

HEADER = "glm_router_topk.cuh"
KERNEL_RENORM_EPS = np.float32(1e-20)   # the kernel's fixed renormalisation epsilon


def router_threads(experts: int) -> int:
    """kbp::router_threads: one thread per expert, whole warps."""
    return 32 * -(-experts // 32)


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    node = ctx.node(group, "top_k")
    z, w, ids = ctx.input(node), ctx.output(node, "topk_w"), ctx.output(node, "topk_id")
    e, k = z.dim_value, w.dim_value
    require(1 <= e <= 1024 and 1 <= k <= min(32, e), f"router_topk takes E <= 1024, K <= 32 (E {e}, K {k})", node)
    require(ids.dim_value == k and w.format == "f32" and ids.format == "i32" and z.format == "f32",
            f"router outputs {w.format} x {w.dim_value}, {ids.format} x {ids.dim_value}", node)
    require(np.float32(ctx.c.router_renorm_eps) == KERNEL_RENORM_EPS,
            f"router_renorm_eps {ctx.c.router_renorm_eps}: the kernel divides by (sum + 1e-20)", node)
    rows = ctx.rows(z)
    require(ctx.rows(w) == rows and ctx.rows(ids) == rows, f"row counts disagree ({rows} logits rows)", node)
    inst = KernelInstance("glm_router_topk", HEADER, f"kbp::router_topk<{e}, {k}>",
                          ("const float*", "const float*", "float", "float*", "int*"))
    args = (ctx.buf(z, "const float"), ctx.weight(node, "e_score_correction_bias", "float"),
            flt(ctx.c.routed_scale), ctx.buf(w, "float"), ctx.buf(ids, "int"))
    return [Launch(inst, grid=(rows, 1, 1), block=(router_threads(e), 1, 1), smem=0, args=args,
                   group=group.id, nodes=(node.id,))]
