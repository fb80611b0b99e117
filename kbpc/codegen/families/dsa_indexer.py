"""dsa_indexer: the DSA lightning indexer (kernels/dsa_indexer.cuh), one decode row.

glm_index_store (kpool_compress): dsa_indexer_store writes the token's BF16 key and gate into the
`tail_keys`/`tail_gates` state (K_P rows: the incomplete pool) and, when the token completes a
pool, the pool key into `pool_keys`. The blueprint plans a second kernel for the pool-key store;
here one kernel does both.

glm_index_select_persisted (index_select): dsa_index_scores over the persisted pool keys, then
dsa_topk_select, which also expands the selected pools (and the tail pool) to token ids: two
launches for the blueprint's four (scores, a two-pass multi-CTA top-k, expansion). The scores and
the pool ids are scratch state of the select node: `<select>.scores` (FP32, one per pool of the
context) and `<select>.sel_pools` (i32, one per selected pool), which plan_memory must provide.

Geometry is read on the device: SEQ (cached tokens with this one) and POS (its position)."""
from __future__ import annotations

from kbpc.codegen.args import StepInput, lit
from kbpc.codegen.context import LowerCtx, LoweringError
from kbpc.codegen.families.dsa_state import block_node, one_row, state_buffer
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.buffers import buffer_elements

BF = "__nv_bfloat16"
SCORE_THREADS = 128      # dsa_index_scores: 4 warps, 32 pools per warp step
TOPK_THREADS = 1024      # DSA_TOPK_THREADS
STORE_PARAMS = (f"const {BF}*", f"const {BF}*", "const float*", f"{BF}*", f"{BF}*", "int", "float*",
                "const int32_t*")
SCORE_PARAMS = ("const float*", "const float*", "const float*", "const int32_t*", "const int32_t*", "float*")
TOPK_PARAMS = ("const float*", "const int32_t*", "const int32_t*", "int32_t*", "int32_t*")


def scratch_names(select_id: str) -> tuple[str, str]:
    """State buffers the select group needs as scratch: scores [pools] f32, pool ids [top-k] i32."""
    return f"{select_id}.scores", f"{select_id}.sel_pools"


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    launches = []
    for node in ctx.nodes(group):
        if node.op == "kpool_compress":
            launches.append(_store(ctx, group, node))
        elif node.op == "index_select":
            launches.extend(_select(ctx, group, node))
        else:
            raise LoweringError(f"dsa_indexer has no kernel for {node.op}", f"node {node.id}")
    return launches


def _store(ctx: LowerCtx, group: LoweredGroup, node) -> Launch:
    key, gate = ctx.input(node, op="layer_norm"), ctx.input(node, op="linear")
    one_row(ctx, node, key)
    d, kp = key.dim_value, ctx.sym["index_kpool"]
    if gate.dim_value != d:
        raise LoweringError(f"gate width {gate.dim_value} != key width {d}", f"node {node.id}")
    rows = state_buffer(ctx, f"{node.id}.tail_keys").shape[0]
    if rows % kp:
        raise LoweringError(f"tail rows {rows} are not whole pools of {kp}", f"node {node.id}")
    inst = KernelInstance("dsa_indexer", "dsa_indexer.cuh", f"kbp::dsa_indexer_store<{d}, {kp}>", STORE_PARAMS)
    args = (ctx.buf(key), ctx.buf(gate), ctx.weight(node, "slot_bias", ctype="float"),
            ctx.state(f"{node.id}.tail_keys", BF), ctx.state(f"{node.id}.tail_gates", BF), lit(rows),
            ctx.state(f"{node.id}.pool_keys", "float"), StepInput("POS"))
    return Launch(inst, grid=(1, 1, 1), block=(d, 1, 1), smem=0, args=args, group=group.id, nodes=(node.id,))


def _select(ctx: LowerCtx, group: LoweredGroup, node) -> list[Launch]:
    q, raw_w, sel = ctx.input(node, "iq"), ctx.input(node, "iw"), ctx.output(node)
    one_row(ctx, node, q)
    pool = block_node(ctx, node, "kpool_compress")
    heads, kp, topk = raw_w.dim_value, ctx.sym["index_kpool"], sel.dim_value   # the edge counts pools
    if q.dim_value % heads:
        raise LoweringError(f"index queries ({q.dim_value}) are not {heads} whole heads", f"node {node.id}")
    d = q.dim_value // heads
    if buffer_elements(ctx.bp, sel) != (topk + 1) * kp:
        raise LoweringError("selection buffer is not (top-k pools + 1) x K_P token ids", f"node {node.id}")
    capacity = state_buffer(ctx, f"{pool.id}.pool_keys").shape[0]
    scores, sel_pools = scratch_names(node.id)
    for name in (scores, sel_pools):
        if not any(s.name == name for s in ctx.plan.state):
            raise LoweringError(f"no scratch state buffer {name}: plan_memory must allocate it for "
                                f"index:read nodes", f"node {node.id}")
    pool_keys = ctx.state(f"{pool.id}.pool_keys", "float")
    score_inst = KernelInstance("dsa_indexer", "dsa_indexer.cuh", f"kbp::dsa_index_scores<{heads}, {d}, {kp}>",
                                SCORE_PARAMS)
    topk_inst = KernelInstance("dsa_indexer", "dsa_indexer.cuh", f"kbp::dsa_topk_select<{kp}, {topk}>",
                               TOPK_PARAMS)
    # Enough blocks for every pool of the context; those past the valid pools exit at once.
    blocks = max(1, -(-capacity // SCORE_THREADS))
    return [
        Launch(score_inst, grid=(blocks, 1, 1), block=(SCORE_THREADS, 1, 1), smem=0,
               args=(ctx.buf(q, "float"), ctx.buf(raw_w, "float"), pool_keys, StepInput("SEQ"), StepInput("POS"),
                     ctx.state(scores, "float")),
               group=group.id, nodes=(node.id,), note="scores"),
        Launch(topk_inst, grid=(1, 1, 1), block=(TOPK_THREADS, 1, 1), smem=0,
               args=(ctx.state(scores, "float"), StepInput("SEQ"), StepInput("POS"), ctx.state(sel_pools, "int32_t"),
                     ctx.buf(sel, "int32_t")),
               group=group.id, nodes=(node.id,), note="top-k + expansion"),
    ]
