"""Sequence state: the one home for the kinds of state a node keeps across steps and their sizes.

Kinds come from a node's `state` field in the blueprint (`conv:update`, `h:update`,
`latent:write`, `index:write`, `tail:update`, `index:read`; `conv:snapshot` and `latent:read` own
nothing: snapshots serve multi-token verify, reads use the writer's buffers). The fused
hyper-connection pre-mix also keeps per-row arrival counters and a partial-sum workspace; the
indexer's selection and the split MLA decode keep the scratch their last-arriving CTAs combine
(the exact form's merge tree, or in numerics `fast` its slices' partials; arrival counters
that the kernels return to zero, so a replayed step finds them zeroed), and so does every top-k
for the fused router (its logits and arrival counter, used when the fusion rule router_gemv_topk
merges the router GEMV into it: 4 bytes per expert and row, kept in any plan so
the state does not depend on which fusions ran; its expert ids too, for a merge that keeps them
inside one group). A routed expert's NVFP4 input quantizer keeps the
quantized rows it hands to the expert GEMV in its group (codes, scales, global scale: scratch of
one step), and a routed gate/up GEMV its [gate | up] rows and per-slot arrival counters for the
SwiGLU epilogue of rule moe_gate_up_swiglu (and for rule moe_expert_flow the rows as flagged
words, a ticket and per-slot counters), and a shared expert's down projection its FP32 input row
for rule moe_experts. Caches are sized for the compile's max context; the indexer's pool keys are FP32 or, with the `fp8` index
cache, Walsh-Hadamard rotated E4M3 codes with one FP32 power-of-two scale per pool. A build without
activation quantization (Options.act_quant off) keeps the MLA latent rows in FP32 and has no
quantized expert rows."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kbpc.errors import KbpcError
from kbpc.ir.buffers import buffer_elements
from kbpc.reference.glm_mla_decode import ORDER_WARPS
from kbpc.reference.glm_mla_decode_fast import PARTIAL_PAD, FastSplit, fast_split
from kbpc.targets import get_target

if TYPE_CHECKING:
    from kbpc.ir.graph import Blueprint
    from kbpc.ir.plan import Options
    from kbpc.ir.records import Node


INDEX_CACHE_KINDS = ("f32", "fp8")   # Options.index_cache: the indexer's pool-key storage
INDEX_SELECT_BIN_BITS = 11           # dsa_index_select: the score-key histogram of the first radix digit
INDEX_SELECT_FILTER_CAP = 8192       # dsa_index_select: DSA_FILTER_CAP, the candidate list's 64-bit rank keys


@dataclass(frozen=True)
class StateBuffer:
    name: str                         # owner node id + "." + what
    nbytes: int
    shape: tuple[int, ...]
    storage: str


# kbp::mhc::kLevel1: the partial sums of one hyper-connection sum kept after the first level of the
# family's 256-wide tree (kernels/glm_mhc_boundary.cuh).
HC_LEVEL1 = 128


def hc_pre_state(pre: Node, rows: int, mix_width: int) -> tuple[StateBuffer, StateBuffer, StateBuffer]:
    """The fused pre-mix's per-row counters, its partial-sum hand-off slots (per row, the mix rows
    and the stream sum of squares twice, one copy per tail CTA, HC_LEVEL1 32-bit slots each; both
    zero between launches: kernels/glm_mhc_boundary.cuh re-arms them), and the mix outputs mu it
    hands to the gates + Sinkhorn kernel that runs beside the step (FP32, rows x mix width)."""
    slots = mix_width + 2
    return (StateBuffer(f"{pre.id}.counters", rows * 4, (rows,), "i32"),
            StateBuffer(f"{pre.id}.work", rows * slots * HC_LEVEL1 * 4, (rows, slots, HC_LEVEL1), "i32"),
            StateBuffer(f"{pre.id}.mix", rows * mix_width * 4, (rows, mix_width), "f32"))


def _hc_pre(bp: Blueprint, node: Node, batch: int) -> tuple[StateBuffer, ...]:
    ins = bp.inputs(node.order)
    x = next(t for t in ins if bp.node(t.src).op in ("hc_post", "hc_expand"))
    width = next(t for t in ins if bp.node(t.src).op == "linear:hc_mix").dim_value
    return hc_pre_state(node, x.rows_per_token * batch, width)


def mla_merge_state(attend: Node, rows: int, heads: int, latent: int) -> tuple[StateBuffer, StateBuffer]:
    """The split MLA decode's merge tree (kernels/glm_mla_decode.cuh): per row and head, the partial
    state (o, m, l) of each of the ORDER_WARPS CTAs (the tree's leaves), and per row ORDER_WARPS x
    heads counter words, of which [row][0][group] and [row][1][group] are a head group's arrive and
    depart counts."""
    slots, pairs = rows * ORDER_WARPS * heads, rows * ORDER_WARPS * heads
    return (StateBuffer(f"{attend.id}.merge", slots * (latent + 2) * 4, (rows, ORDER_WARPS, heads, latent + 2),
                        "f32"),
            StateBuffer(f"{attend.id}.counters", pairs * 4, (rows, ORDER_WARPS, heads), "i32"))


def router_state(top_k: Node, rows: int, experts: int) -> tuple[StateBuffer, StateBuffer]:
    """The fused router's scratch (kernels/glm_router_topk.cuh, router_gemv_topk): the FP32 logits
    of every row (written by every CTA, read back by the last) and its arrival counter (zero
    between launches)."""
    return (StateBuffer(f"{top_k.id}.logits", rows * experts * 4, (rows, experts), "f32"),
            StateBuffer(f"{top_k.id}.arrive", 4, (1,), "i32"))


def router_ids_state(top_k: Node, rows: int, slots: int) -> StateBuffer:
    """The top-k's expert ids when no group outside the one that writes them reads them (rule
    moe_experts: the router and both expert GEMVs in one group)."""
    return StateBuffer(f"{top_k.id}.ids", rows * slots * 4, (rows, slots), "i32")


def _router(bp: Blueprint, node: Node, batch: int) -> tuple[StateBuffer, ...]:
    (z,) = [t for t in bp.inputs(node.order) if t.format != "i32"]
    slots = max((t.dim_value for t in bp.outputs(node.order) if t.format == "i32"), default=0)
    ids = (router_ids_state(node, z.rows_per_token * batch, slots),) if slots else ()
    return (*router_state(node, z.rows_per_token * batch, z.dim_value), *ids)


def mla_fast_state(attend: Node, rows: int, heads: int, latent: int,
                   split: FastSplit) -> tuple[StateBuffer, StateBuffer, StateBuffer]:
    """The fast MLA decode's scratch (kernels/glm_mla_decode_fast.cuh): per row, slice and head a
    partial state (o, m, l, pad), arrive and depart counts per row and head group, and per row the
    fused output quantizer's words (rule mla_attend_quant: an amax slot per CTA, arrive, depart;
    520 bytes a row at the seed's shape, kept whether or not the rule applies)."""
    width, groups = latent + PARTIAL_PAD, heads // split.hpc
    ctas = split.slices * groups
    return (StateBuffer(f"{attend.id}.partials", rows * split.slices * heads * width * 4,
                        (rows, split.slices, heads, width), "f32"),
            StateBuffer(f"{attend.id}.counters", rows * groups * 2 * 4, (rows, groups, 2), "i32"),
            StateBuffer(f"{attend.id}.quant_sync", rows * (ctas + 2) * 4, (rows, ctas + 2), "i32"))


def mla_fast_split(bp: Blueprint, attend: Node, options: Options) -> FastSplit:
    """The fast decode's split of one attend node for the options' target (the lowering's too)."""
    q = next(t for t in bp.inputs(attend.order) if bp.node(t.src).op_base == "linear")
    sel = next(t for t in bp.inputs(attend.order) if bp.node(t.src).op == "index_select")
    latent = _mla_latent(bp, attend)
    return fast_split(max(1, q.dim_value // latent), buffer_elements(bp, sel), q.rows_per_token * options.batch,
                      get_target(options.target).sms, latent)


def _mla_latent(bp: Blueprint, node: Node) -> int:
    writer = [n for n in bp.nodes() if n.block == node.block and n.op == "kv_write"]
    if len(writer) != 1:
        raise KbpcError(f"expected one kv_write node in block {node.block}, found {len(writer)}", f"node {node.id}")
    return bp.inputs(writer[0].order)[0].dim_value


def _mla_read(bp: Blueprint, node: Node, options: Options) -> tuple[StateBuffer, ...]:
    q = next(t for t in bp.inputs(node.order) if bp.node(t.src).op_base == "linear")
    latent = _mla_latent(bp, node)
    rows, heads = q.rows_per_token * options.batch, max(1, q.dim_value // latent)
    if options.numerics == "fast":
        return mla_fast_state(node, rows, heads, latent, mla_fast_split(bp, node, options))
    return mla_merge_state(node, rows, heads, latent)


ROUTED_EXPERT_OPS = ("expert_gate_up", "expert_down")   # the routed expert GEMVs' ops (one home)
SHARED_GATE_UP_OP, SHARED_DOWN_OP = "linear:shared_gate_up", "linear:shared_down"   # a shared expert's GEMVs


def routed_quant_rows(node: Node, rows: int, k: int) -> tuple[StateBuffer, StateBuffer, StateBuffer]:
    """The NVFP4 rows an act_quant writes for the routed expert GEMV of its group: codes (rows, K/2),
    E4M3 scales (rows, K/16), FP32 global scales (rows,)."""
    return (StateBuffer(f"{node.id}.codes", rows * (k // 2), (rows, k // 2), "e2m1x2"),
            StateBuffer(f"{node.id}.scales", rows * (k // 16), (rows, k // 16), "e4m3"),
            StateBuffer(f"{node.id}.g", rows * 4, (rows,), "f32"))


def _routed_quant(bp: Blueprint, node: Node, batch: int) -> tuple[StateBuffer, ...]:
    outs = bp.outputs(node.order)
    if len(outs) != 1 or outs[0].format != "nvfp4/g16" or bp.node(outs[0].dst).op_base not in ROUTED_EXPERT_OPS:
        return ()
    x = bp.inputs(node.order)[0]
    return routed_quant_rows(node, x.rows_per_token * batch, x.dim_value)


def routed_gate_up_state(node: Node, slots: int, width: int) -> tuple[StateBuffer, ...]:
    """The routed gate/up GEMV's scratch for the SwiGLU epilogue (rule moe_gate_up_swiglu,
    kernels/w4a4_mx_static.cuh w4a4_gemv_moe_gate_up_swiglu): the [gate | up] BF16 rows of every
    slot, written by every CTA and read back by each slot's last, and an arrival counter per slot
    (zero between launches); and for rule moe_expert_flow (kernels/moe_experts.cuh) the same rows
    as 32-bit words that are their own arrival flags, and its ticket and per-slot counters
    (1 + 2 x slots; all zero between launches)."""
    return (StateBuffer(f"{node.id}.rows", slots * width * 2, (slots, width), "bf16"),
            StateBuffer(f"{node.id}.arrive", slots * 4, (slots,), "i32"),
            StateBuffer(f"{node.id}.words", slots * width * 4, (slots, width), "i32"),
            StateBuffer(f"{node.id}.flow", (1 + 2 * slots) * 4, (1 + 2 * slots,), "i32"))


def _routed_gate_up(bp: Blueprint, node: Node, batch: int) -> tuple[StateBuffer, ...]:
    outs = [t for t in bp.outputs(node.order) if t.format == "bf16"]
    if len(outs) != 1:
        return ()
    return routed_gate_up_state(node, outs[0].rows_per_token * batch, outs[0].dim_value)


def shared_silu_state(down: Node, rows: int, width: int) -> tuple[StateBuffer]:
    """A shared expert's down-projection input in FP32, silu(clamp g) * clamp u, written by the
    gate/up launch's shared tiles and staged by the down launch's (rule moe_experts,
    kernels/moe_experts.cuh)."""
    return (StateBuffer(f"{down.id}.silu_x", rows * width * 4, (rows, width), "f32"),)


def _shared_silu(bp: Blueprint, node: Node, batch: int) -> tuple[StateBuffer, ...]:
    ins = bp.inputs(node.order)
    if len(ins) != 1 or bp.node(ins[0].src).op_base != "silu_mul":
        return ()
    return shared_silu_state(node, ins[0].rows_per_token * batch, ins[0].dim_value)


def _index_pools(bp: Blueprint, ctx: int, index_cache: str, node: Node) -> tuple[StateBuffer, ...]:
    d, kp = bp.symbols["index_head_dim"], bp.symbols["index_kpool"]
    pools = -(-ctx // kp)
    if index_cache == "fp8":
        return (StateBuffer(f"{node.id}.pool_codes", pools * d, (pools, d), "e4m3"),
                StateBuffer(f"{node.id}.pool_scales", pools * 4, (pools,), "f32"))
    return (StateBuffer(f"{node.id}.pool_keys", pools * d * 4, (pools, d), "f32"),)


def _of_kind(bp: Blueprint, node: Node, kind: str, options: Options) -> tuple[StateBuffer, ...]:
    sym, c, ctx = bp.symbols, bp.config.constants, options.max_context
    if kind == "conv:update":
        ch = bp.inputs(node.order)[0].dim_value
        return (StateBuffer(f"{node.id}.window", ch * c.conv_width * 4, (ch, c.conv_width), "f32"),)
    if kind == "h:update":
        heads, d, dv = sym["lin_v_heads"], sym["lin_k_dim"], sym["lin_v_dim"]
        return (StateBuffer(f"{node.id}.state", heads * d * dv * 4, (heads, d, dv), "f32"),)
    if kind == "latent:write":
        width = bp.inputs(node.order)[0].dim_value
        pages = -(-ctx // c.latent_page_tokens)
        size = 1 if options.act_quant else 4
        return (StateBuffer(f"{node.id}.latent_cache", pages * c.latent_page_tokens * width * size,
                            (pages, c.latent_page_tokens, width), "e4m3" if options.act_quant else "f32"),
                StateBuffer(f"{node.id}.block_table", pages * 4, (pages,), "i32"))
    if kind == "index:write":
        return _index_pools(bp, ctx, options.index_cache, node)
    if kind == "tail:update":
        d, kp = sym["index_head_dim"], sym["index_kpool"]
        return (StateBuffer(f"{node.id}.tail_keys", kp * d * 2, (kp, d), "bf16"),
                StateBuffer(f"{node.id}.tail_gates", kp * d * 2, (kp, d), "bf16"))
    if kind == "index:read":   # scratch of the selection: scores per pool, key histogram, arrivals
        # and the listed-candidate count, the candidate list of long contexts (64-bit rank keys)
        pools, bins = -(-ctx // sym["index_kpool"]), 1 << INDEX_SELECT_BIN_BITS
        return (StateBuffer(f"{node.id}.scores", pools * 4, (pools,), "f32"),
                StateBuffer(f"{node.id}.hist", bins * 4, (bins,), "i32"),
                StateBuffer(f"{node.id}.arrive", 8, (2,), "i32"),
                StateBuffer(f"{node.id}.cand", INDEX_SELECT_FILTER_CAP * 8, (INDEX_SELECT_FILTER_CAP, 2), "i32"))
    if kind == "latent:read":   # the unquantized decode (act_quant off) merges nothing across CTAs
        return _mla_read(bp, node, options) if options.act_quant else ()
    if kind == "conv:snapshot":
        return ()
    raise KbpcError(f"unknown state kind {kind!r}", f"node {node.id}")


def state_buffers(bp: Blueprint, options: Options) -> list[StateBuffer]:
    out: list[StateBuffer] = []
    for node in bp.nodes():
        if node.op == "hc_pre":
            out.extend(_hc_pre(bp, node, options.batch))
        if node.op_base == "act_quant" and options.act_quant:
            out.extend(_routed_quant(bp, node, options.batch))
        if node.op == "top_k":
            out.extend(_router(bp, node, options.batch))
        if node.op_base == "expert_gate_up" and options.act_quant:
            out.extend(_routed_gate_up(bp, node, options.batch))
        if node.op == SHARED_DOWN_OP and options.act_quant:
            out.extend(_shared_silu(bp, node, options.batch))
        for kind in node.state:
            out.extend(_of_kind(bp, node, kind, options))
    return out
