"""The ops and kernel families kbpc knows. A blueprint naming anything else is refused by name."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kbpc.ir.graph import Blueprint
    from kbpc.ir.records import Node

# Op names as they appear in a node's `op` field; `linear:<role>` is any named projection.
KNOWN_OPS = frozenset({
    "embed", "hc_expand", "hc_pre", "hc_post", "hc_contract", "rms_norm", "final_norm",
    "layer_norm", "l2_norm", "gated_rms_norm", "act_quant", "concat", "conv1d_update",
    "state_snapshot", "gdn_gates", "gdn_recurrence", "kv_write", "kpool_compress",
    "index_select", "mla_attention", "router", "top_k", "expert_gate_up", "expert_down",
    "swiglu_clamp", "silu_mul", "blend", "lm_head", "argmax",
})
PREFIXED_OPS = frozenset({"linear"})

# The kernel families whose numerics kbpc implements (reference and GPU).
KNOWN_FAMILIES = frozenset({
    "argmax_host", "causal_conv1d_l2norm", "dense_bf16", "dsa_indexer", "embed_copy", "glm_mhc",
    "glm_mla_decode", "glm_mla_latent_write", "glm_moe_combine", "glm_router_topk",
    "glm_swiglu_clamp", "kda_gates_w8a8", "kda_o_norm", "kda_pack", "kda_recurrent",
    "layer_norm", "rms_norm", "w4a16_gemv", "w4a4_mx", "w4a4_mx_static", "w8a8_act_quant", "wxay",
})


def is_known_op(op: str) -> bool:
    base, sep, rest = op.partition(":")
    if sep:
        return base in PREFIXED_OPS and bool(rest)
    return op in KNOWN_OPS


def selection_is_a_set(bp: Blueprint, node: Node, numerics: str) -> bool:
    """Whether an index_select's token list may hold its entries in an order of its own (the select's
    ORDER_FREE form: pool index order, kbpc.reference.dsa_indexer.order_free_selection while every
    pool is selected, index_order_selection past that): in `fast` numerics, where every
    reader is an MLA decode, whose fast form deals the entries to slices and sums in an order of its
    own; the exact decode sums in list order, so there the rank order is part of the result."""
    return (numerics == "fast" and node.op == "index_select"
            and all(bp.node(t.dst).op == "mla_attention" for t in bp.outputs(node.order)))


def unranked_scores_reader(bp: Blueprint, node: Node, numerics: str) -> Node | None:
    """The index_select for which `node` computes only score inputs (its index queries or head
    weights), where that select lists an unranked selection (selection_is_a_set): while the top k
    is every valid pool it reads no score (kbpc.reference.dsa_indexer.every_pool_selected), so
    `node`'s output is not needed and its kernel may idle. None where anything else reads it."""
    readers = {t.dst for t in bp.outputs(node.order)}
    if len(readers) != 1:
        return None
    select = bp.node(readers.pop())
    return select if select.op == "index_select" and selection_is_a_set(bp, select, numerics) else None
