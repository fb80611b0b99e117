"""glm_mla_decode: sparse MLA decode (kernels/glm_mla_decode.cuh) of the absorbed queries over the
paged FP8 latent cache that the block's kv_write fills, at the token ids the indexer selected.

Split over the attended tokens: CTA (w, hg, row) is warp w of the family's order (ORDER_WARPS
warps, groups of ORDER_GROUP entries) for HPC heads, so each latent row is read once per head
group instead of once per head, and the grid fills the GPU; the partial states are merged across
CTAs by the order's halving tree, so the output is bit-exact: the `exact` form. Numerics `fast`
takes kernels/glm_mla_decode_fast.cuh instead: slices of the selection x head groups, one flat
merge in slice order, within kbpc/reference/glm_mla_decode_fast.py's bound; with the output's
per-token FP8 quantizer in its group (fusion rule mla_attend_quant) the CTAs also write the
quantized row (glm_mla_decode_fast_quant, the bytes w8a8_act_quant_row writes). Either form's
scratch is state of the attend node (kbpc/ir/state.py, kind latent:read)."""
from __future__ import annotations

from dataclasses import dataclass

from kbpc.codegen.args import NULL, StepInput, lit
from kbpc.codegen.context import LowerCtx, LoweringError
from kbpc.codegen.families._projection import materialized
from kbpc.codegen.families.dsa_state import block_node, state_buffer
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.buffers import buffer_elements
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.state import mla_fast_split
from kbpc.ir.records import Node, Tensor
from kbpc.reference.glm_mla_decode import ORDER_GROUP, ORDER_WARPS, heads_per_cta
from kbpc.reference.glm_mla_decode_fast import FAST_THREADS

THREADS = 256            # MLA_SPLIT_THREADS
BF = "__nv_bfloat16"
PARAMS = (f"const {BF}*", "const uint8_t*", "const int32_t*", "int", "const int32_t*", "int",
          "const int32_t*", "float", f"{BF}*", "float*", "uint32_t*")
FAST_HEADER = "glm_mla_decode_fast.cuh"
FAST_PARAMS = (*PARAMS[:8], "int", *PARAMS[8:])   # chunk after s_k
FAST_QUANT_PARAMS = (*FAST_PARAMS, "uint8_t*", "float*", "uint32_t*")   # codes, scales, sync


def decode_instance(latent: int, hpc: int) -> KernelInstance:
    return KernelInstance("glm_mla_decode", "glm_mla_decode.cuh",
                          f"kbp::glm_mla_decode_split<{latent}, {ORDER_WARPS}, {ORDER_GROUP}, {hpc}>", PARAMS)


@dataclass(frozen=True)
class _Attend:
    node: Node
    q: Tensor
    sel: Tensor
    out: Tensor
    writer: Node
    latent: int      # E, the latent width
    heads: int
    rows: int


def _attend(ctx: LowerCtx, group: LoweredGroup, widths: int) -> _Attend:
    """The attend node's edges and sizes; `widths`: the latent widths the kernel takes are its
    multiples up to 4096."""
    node = ctx.node(group, "mla_attention")
    q, sel, out = ctx.input(node, op="linear"), ctx.input(node, op="index_select"), ctx.output(node)
    writer = block_node(ctx, node, "kv_write")
    e = state_buffer(ctx, f"{writer.id}.latent_cache").shape[-1]
    where = f"node {node.id}"
    if q.dim_value % e or out.dim_value != q.dim_value:
        raise LoweringError(f"queries ({q.dim_value}) are not whole {e}-wide heads", where)
    if e % widths or e > 4096:
        raise LoweringError(f"latent width {e}: the decode takes multiples of {widths} up to 4096", where)
    return _Attend(node, q, sel, out, writer, e, q.dim_value // e, ctx.rows(q))


def fast_instance(latent: int, hpc: int, quant: bool = False) -> KernelInstance:
    if quant:
        return KernelInstance("glm_mla_decode", FAST_HEADER, f"kbp::glm_mla_decode_fast_quant<{latent}, {hpc}>",
                              FAST_QUANT_PARAMS)
    return KernelInstance("glm_mla_decode", FAST_HEADER, f"kbp::glm_mla_decode_fast<{latent}, {hpc}>", FAST_PARAMS)


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    a = _attend(ctx, group, 512)
    if ctx.plan.options.numerics == "fast":
        return _lower_fast(ctx, group, a)
    node, writer, e, heads, rows = a.node, a.writer, a.latent, a.heads, a.rows
    if len(group.nodes) != 1:
        raise LoweringError("the exact decode form has no fused output quantizer", f"group {group.id}")
    hpc = heads_per_cta(heads)
    merge, counters = state_buffer(ctx, f"{node.id}.merge"), state_buffer(ctx, f"{node.id}.counters")
    if merge.shape != (rows, ORDER_WARPS, heads, e + 2) or counters.shape != (rows, ORDER_WARPS, heads):
        raise LoweringError(f"merge state {merge.shape} / {counters.shape} does not fit {rows} rows of {heads} "
                            f"heads", f"node {node.id}")
    width = buffer_elements(ctx.bp, a.sel)   # token ids per row, as the indexer wrote them
    inst = decode_instance(e, hpc)
    args = (ctx.buf(a.q), ctx.state(f"{writer.id}.latent_cache", "uint8_t"),
            ctx.state(f"{writer.id}.block_table", "int32_t"), lit(ctx.c.latent_page_tokens),
            ctx.buf(a.sel, "int32_t"), lit(width), StepInput("SEQ"), ctx.weight_value(writer, "k_scale"),
            ctx.buf(a.out), ctx.state(merge.name, "float"), ctx.state(counters.name, "uint32_t"))
    return [Launch(inst, grid=(ORDER_WARPS, heads // hpc, rows), block=(THREADS, 1, 1), smem=0, args=args,
                   group=group.id, nodes=(node.id,))]


def _lower_fast(ctx: LowerCtx, group: LoweredGroup, a: _Attend) -> list[Launch]:
    """Numerics `fast`: S slices x head groups x rows CTAs, one flat merge in slice order (the split
    and the scratch from kbpc/ir/state.py, the bound kbpc/reference/glm_mla_decode_fast.py)."""
    split = mla_fast_split(ctx.bp, a.node, ctx.plan.options)
    partials, counters = state_buffer(ctx, f"{a.node.id}.partials"), state_buffer(ctx, f"{a.node.id}.counters")
    if partials.shape[:3] != (a.rows, split.slices, a.heads) or counters.shape != (a.rows, a.heads // split.hpc, 2):
        raise LoweringError(f"fast decode state {partials.shape} / {counters.shape} does not fit {a.rows} rows of "
                            f"{a.heads} heads in {split.slices} slices", f"node {a.node.id}")
    quant = [n for n in ctx.nodes(group) if n.op_base == "act_quant"]
    # The BF16 output: a buffer unless the fused quantizer is its only reader (a debug arena keeps it).
    out = ctx.buf(a.out) if not quant or materialized(ctx, a.out) else NULL
    args = (ctx.buf(a.q), ctx.state(f"{a.writer.id}.latent_cache", "uint8_t"),
            ctx.state(f"{a.writer.id}.block_table", "int32_t"), lit(ctx.c.latent_page_tokens),
            ctx.buf(a.sel, "int32_t"), lit(buffer_elements(ctx.bp, a.sel)), StepInput("SEQ"),
            ctx.weight_value(a.writer, "k_scale"), lit(split.chunk), out,
            ctx.state(partials.name, "float"), ctx.state(counters.name, "uint32_t"))
    nodes = (a.node.id,)
    if quant:   # rule mla_attend_quant
        (qnode,) = quant
        qout = ctx.output(qnode)
        if ctx.input(qnode) != a.out or qout.format != "fp8/token":
            raise LoweringError("the fused quantizer must read the decode's output and write fp8/token",
                                f"node {qnode.id}")
        sync = state_buffer(ctx, f"{a.node.id}.quant_sync")
        if sync.shape != (a.rows, split.slices * (a.heads // split.hpc) + 2):
            raise LoweringError(f"quantizer sync state {sync.shape} does not fit {a.rows} rows", f"node {a.node.id}")
        codes = ctx.quant(qout)
        args = (*args, codes.codes, codes.scales, ctx.state(sync.name, "uint32_t"))
        nodes = (a.node.id, qnode.id)
    return [Launch(fast_instance(a.latent, split.hpc, bool(quant)), grid=split.grid(a.heads, a.rows),
                   block=(FAST_THREADS, 1, 1), smem=split.smem_bytes(a.latent), args=args, group=group.id,
                   nodes=nodes)]


def lower_unquantized(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    """Without activation quantization (Options.act_quant off): a plain FP32 softmax over the FP32
    latent rows (glm_mla_decode_f32, one CTA per head and row; no split, no merge state)."""
    a = _attend(ctx, group, 256)
    inst = KernelInstance("glm_mla_decode", "glm_mla_decode.cuh", f"kbp::glm_mla_decode_f32<{a.latent}>",
                          (f"const {BF}*", "const float*", "const int32_t*", "int", "const int32_t*", "int",
                           "const int32_t*", f"{BF}*"))
    args = (ctx.buf(a.q), ctx.state(f"{a.writer.id}.latent_cache", "float"),
            ctx.state(f"{a.writer.id}.block_table", "int32_t"), lit(ctx.c.latent_page_tokens),
            ctx.buf(a.sel, "int32_t"), lit(buffer_elements(ctx.bp, a.sel)), StepInput("SEQ"), ctx.buf(a.out))
    return [Launch(inst, grid=(a.heads, a.rows, 1), block=(256, 1, 1), smem=0, args=args,
                   group=group.id, nodes=(a.node.id,))]
