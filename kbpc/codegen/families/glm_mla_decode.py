"""glm_mla_decode: sparse MLA decode (kernels/glm_mla_decode.cuh) of the absorbed queries over the
paged FP8 latent cache that the block's kv_write fills, at the token ids the indexer selected.

Split over the attended tokens: CTA (w, hg, row) is warp w of the family's order (ORDER_WARPS
warps, groups of ORDER_GROUP entries) for HPC heads, so each latent row is read once per head
group instead of once per head, and the grid fills the GPU; the partial states are merged across
CTAs by the order's halving tree, so the output is bit-exact in both numerics modes. The merge
scratch is state of the attend node (kbpc/ir/state.py, kind latent:read)."""
from __future__ import annotations

from kbpc.codegen.args import StepInput, lit
from kbpc.codegen.context import LowerCtx, LoweringError
from kbpc.codegen.families.dsa_state import block_node, state_buffer
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.buffers import buffer_elements
from kbpc.ir.plan import LoweredGroup
from kbpc.reference.glm_mla_decode import ORDER_GROUP, ORDER_WARPS

THREADS = 256            # MLA_SPLIT_THREADS
MAX_HEADS_PER_CTA = 4    # heads a CTA attends for (its registers hold their queries)
BF = "__nv_bfloat16"
PARAMS = (f"const {BF}*", "const uint8_t*", "const int32_t*", "int", "const int32_t*", "int",
          "const int32_t*", "float", f"{BF}*", "float*", "uint32_t*")


def heads_per_cta(heads: int) -> int:
    """The largest power of two <= MAX_HEADS_PER_CTA that divides the head count."""
    hpc = MAX_HEADS_PER_CTA
    while heads % hpc:
        hpc //= 2
    return hpc


def decode_instance(latent: int, hpc: int) -> KernelInstance:
    return KernelInstance("glm_mla_decode", "glm_mla_decode.cuh",
                          f"kbp::glm_mla_decode_split<{latent}, {ORDER_WARPS}, {ORDER_GROUP}, {hpc}>", PARAMS)


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    node = ctx.node(group, "mla_attention")
    q, sel, out = ctx.input(node, op="linear"), ctx.input(node, op="index_select"), ctx.output(node)
    writer = block_node(ctx, node, "kv_write")
    e = state_buffer(ctx, f"{writer.id}.latent_cache").shape[-1]
    where = f"node {node.id}"
    if q.dim_value % e or out.dim_value != q.dim_value:
        raise LoweringError(f"queries ({q.dim_value}) are not whole {e}-wide heads", where)
    if e % 512 or e > 4096:
        raise LoweringError(f"latent width {e}: the decode takes multiples of 512 up to 4096", where)
    heads, rows = q.dim_value // e, ctx.rows(q)
    hpc = heads_per_cta(heads)
    merge, counters = state_buffer(ctx, f"{node.id}.merge"), state_buffer(ctx, f"{node.id}.counters")
    if merge.shape != (rows, 2 * ORDER_WARPS, heads, e + 2) or counters.shape != (rows, ORDER_WARPS, heads):
        raise LoweringError(f"merge state {merge.shape} / {counters.shape} does not fit {rows} rows of {heads} "
                            f"heads", where)
    width = buffer_elements(ctx.bp, sel)   # token ids per row, as the indexer wrote them
    inst = decode_instance(e, hpc)
    args = (ctx.buf(q), ctx.state(f"{writer.id}.latent_cache", "uint8_t"),
            ctx.state(f"{writer.id}.block_table", "int32_t"), lit(ctx.c.latent_page_tokens),
            ctx.buf(sel, "int32_t"), lit(width), StepInput("SEQ"), ctx.weight_value(writer, "k_scale"), ctx.buf(out),
            ctx.state(merge.name, "float"), ctx.state(counters.name, "uint32_t"))
    return [Launch(inst, grid=(ORDER_WARPS, heads // hpc, rows), block=(THREADS, 1, 1), smem=0, args=args,
                   group=group.id, nodes=(node.id,))]
