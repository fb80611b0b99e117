"""glm_mla_decode: sparse NoPE MLA decode (kernels/glm_mla_decode.cuh) of the absorbed queries over
the paged FP8 latent cache that the block's kv_write fills, at the token ids the indexer selected.
One CTA of WARPS warps per (head, row)."""
from __future__ import annotations

from kbpc.codegen.args import StepInput, lit
from kbpc.codegen.context import LowerCtx, LoweringError
from kbpc.codegen.families.dsa_state import block_node, state_buffer
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.buffers import buffer_elements

WARPS = 16   # the family's CTA: 16 warps split the selection list
GATHER = 4   # selected tokens gathered per warp step
BF = "__nv_bfloat16"
PARAMS = (f"const {BF}*", "const uint8_t*", "const int32_t*", "int", "const int32_t*", "int",
          "const int32_t*", "float", f"{BF}*")


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    node = ctx.node(group, "mla_attention")
    q, sel, out = ctx.input(node, op="linear"), ctx.input(node, op="index_select"), ctx.output(node)
    writer = block_node(ctx, node, "kv_write")
    e = state_buffer(ctx, f"{writer.id}.latent_cache").shape[-1]
    if q.dim_value % e or out.dim_value != q.dim_value:
        raise LoweringError(f"queries ({q.dim_value}) are not whole {e}-wide heads", f"node {node.id}")
    heads, rows = q.dim_value // e, ctx.rows(q)
    width = buffer_elements(ctx.bp, sel)   # token ids per row, as the indexer wrote them
    inst = KernelInstance("glm_mla_decode", "glm_mla_decode.cuh", f"kbp::glm_mla_decode_fp8<{e}, {WARPS}, {GATHER}>",
                          PARAMS)
    args = (ctx.buf(q), ctx.state(f"{writer.id}.latent_cache", "uint8_t"),
            ctx.state(f"{writer.id}.block_table", "int32_t"), lit(ctx.c.latent_page_tokens),
            ctx.buf(sel, "int32_t"), lit(width), StepInput("SEQ"), ctx.weight_value(writer, "k_scale"), ctx.buf(out))
    return [Launch(inst, grid=(heads, rows, 1), block=(32 * WARPS, 1, 1), smem=0, args=args, group=group.id,
                   nodes=(node.id,))]
