"""The fused kernel forms the fusion pass may create: one record per form, in one table.

A rule names the exact multiset of node ops a merged group holds and the family whose lowering
serves it (that lowering recognises the merged nodes and emits the fused kernel; a test checks
every rule lowers). A rule is listed here only once its kernel form exists and is tested against
the reference: fusion never changes the math, so a bit-exact chain stays bit-exact."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from kbpc.reference.layer_norm import block_threads

if TYPE_CHECKING:
    from kbpc.ir.graph import Blueprint
    from kbpc.ir.records import Node

# A rule's extra condition on the merged nodes: None if the fused form serves them, else why not.
Check = Callable[["Blueprint", "list[Node]"], "str | None"]


def _always(bp: Blueprint, nodes: list[Node]) -> str | None:
    return None


@dataclass(frozen=True)
class FusionRule:
    name: str
    family: str                      # the family lowering that serves the merged group
    ops: tuple[str, ...]             # the merged group's node ops (a multiset, by Node.op)
    anchor: str                      # the op a search starts from (one per merged group)
    why: str                         # what the fused kernel saves, for the report
    check: Check = _always
    tensor_parallel: bool = True     # the fused form also serves a rank of a split plan
    default: bool = True             # applied unless skipped; False: only on request (--fuse-rule)
    off_by_default_why: str = ""     # why a rule is opt-in (measured), for the report
    siblings: bool = False           # groups reading outputs of one producer may merge (side by side)
    numerics: str | None = None      # the fused form exists in this numerics mode only (None: both)

    @property
    def op_counts(self) -> Counter:
        return Counter(self.ops)


def _norm_then_fp8_quant(bp: Blueprint, nodes: list[Node]) -> str | None:
    """The quantizer reads the norm's output and writes the per-token FP8 format."""
    norm = next(n for n in nodes if n.op == "rms_norm")
    quant = next(n for n in nodes if n.op == "act_quant")
    (x,) = [t for t in bp.inputs(quant.order) if t.format != "i32"] or [None]
    if x is None or x.src != norm.order:
        return "the quantizer does not read the norm's output"
    if any(t.format != "fp8/token" for t in bp.outputs(quant.order)):
        return "the quantizer does not write fp8/token"
    return None


def _attend_then_fp8_quant(bp: Blueprint, nodes: list[Node]) -> str | None:
    """The quantizer reads the MLA decode's output alone and writes the per-token FP8 format."""
    attend = next(n for n in nodes if n.op == "mla_attention")
    quant = next(n for n in nodes if n.op == "act_quant")
    ins = [t for t in bp.inputs(quant.order) if t.format != "i32"]
    if len(ins) != 1 or ins[0].src != attend.order:
        return "the quantizer does not read the decode's output"
    if any(t.format != "fp8/token" for t in bp.outputs(quant.order)):
        return "the quantizer does not write fp8/token"
    return None


def _norm_feeds_index_store(bp: Blueprint, nodes: list[Node]) -> str | None:
    """The index store's key is the LayerNorm's output, and the norm's block rule gives one thread a
    channel (a power-of-two width from 32 to 1024), as the store's block of D threads needs."""
    norm = next(n for n in nodes if n.op == "layer_norm")
    store = next(n for n in nodes if n.op == "kpool_compress")
    keys = [t for t in bp.inputs(store.order) if t.src == norm.order]
    if len(keys) != 1:
        return "the index store does not read the norm's output as its key"
    d = keys[0].dim_value
    if block_threads(d) != d:
        return f"key width {d}: the fused store needs one thread a channel, a power of two from 32 to 1024"
    return None


def _swiglu_feeds_down_quant(bp: Blueprint, nodes: list[Node]) -> str | None:
    """The SwiGLU's BF16 output is the down projection's act_quant input, and the clamp reads the
    routed [gate | up] BF16 rows (one per slot)."""
    act = next(n for n in nodes if n.op == "silu_mul")
    clamp = next(n for n in nodes if n.op == "swiglu_clamp")
    (h,) = bp.outputs(act.order) or (None,)
    quant = next((n for n in nodes if n.op == "act_quant" and h is not None and n.order == h.dst), None)
    if h is None or quant is None or h.format != "bf16":
        return "the down projection's quantizer does not read the SwiGLU's BF16 output"
    gu = [t for t in bp.inputs(clamp.order) if t.format == "bf16"]
    if len(gu) != 1 or gu[0].dim_value != 2 * h.dim_value:
        return "the clamp does not read one [gate | up] BF16 row"
    if any(t.format != "nvfp4/g16" for t in bp.outputs(quant.order)):
        return "the down projection's input is not NVFP4"
    return None


def _gate_up_feeds_swiglu(bp: Blueprint, nodes: list[Node]) -> str | None:
    """The routed gate/up GEMV's BF16 [gate | up] rows are read by the clamp and nothing else, and
    the SwiGLU feeds the down projection's NVFP4 quantizer (_swiglu_feeds_down_quant)."""
    gate_up = next(n for n in nodes if n.op == "expert_gate_up")
    clamp = next(n for n in nodes if n.op == "swiglu_clamp")
    rows = [t for t in bp.outputs(gate_up.order) if t.format == "bf16"]
    if len(rows) != 1 or rows[0].dst != clamp.order or len(bp.outputs(gate_up.order)) != 1:
        return "the gate/up rows are not read by the clamp alone"
    return _swiglu_feeds_down_quant(bp, nodes)


def _blend_feeds_post_only(bp: Blueprint, nodes: list[Node]) -> str | None:
    """The blend's output is read by the merged post-mix and by nothing else: the fused kernel
    computes it in place and never stores it."""
    blend = next(n for n in nodes if n.op == "blend")
    post = next(n for n in nodes if n.op == "hc_post")
    readers = {t.dst for t in bp.outputs(blend.order)}
    if readers != {post.order}:
        others = sorted(bp.node(o).id for o in readers - {post.order})
        return f"the blend's output is also read by {', '.join(others) or 'no post-mix'}"
    return None


def _kda_chain_fits(bp: Blueprint, nodes: list[Node]) -> str | None:
    """The fused KDA kernel's formats and size limits (kbpc/codegen/families/kda_fused.py)."""
    from kbpc.codegen.families.kda_fused import chain_fits  # noqa: PLC0415  (codegen imports this table)
    return chain_fits(bp, nodes)


def _kda_conv_gates_fits(bp: Blueprint, nodes: list[Node]) -> str | None:
    """The side-by-side kernel's limits (kbpc/codegen/families/kda_conv_gates.py)."""
    from kbpc.codegen.families.kda_conv_gates import fits  # noqa: PLC0415  (codegen imports this table)
    return fits(bp, nodes)


def _kda_recurrence_norm_fits(bp: Blueprint, nodes: list[Node]) -> str | None:
    """The norm reads the recurrence's output; the fused form's limits (kbpc/codegen/families/kda_recurrent.py)."""
    from kbpc.codegen.families.kda_recurrent import norm_fits  # noqa: PLC0415  (codegen imports this table)
    return norm_fits(bp, nodes)


def _router_expert_quant_fits(bp: Blueprint, nodes: list[Node]) -> str | None:
    """The fused router's limits, and the quantizer is w4a4_quant_rows_static's form on the router's
    own input (kbpc/codegen/families/glm_router_topk.py)."""
    from kbpc.codegen.families.glm_router_topk import fused_quant_fits  # noqa: PLC0415  (codegen imports this table)
    return fused_quant_fits(bp, nodes)


def _moe_experts_fits(bp: Blueprint, nodes: list[Node]) -> str | None:
    """The fused router, the paired gate/up tiles and (moe_experts) the shared expert's forms
    (kbpc/codegen/families/moe_experts.py)."""
    from kbpc.codegen.families.moe_experts import fits  # noqa: PLC0415  (codegen imports this table)
    return fits(bp, nodes)


def _router_topk_fits(bp: Blueprint, nodes: list[Node]) -> str | None:
    """The fused router's formats and limits (kbpc/codegen/families/glm_router_topk.py)."""
    from kbpc.codegen.families.glm_router_topk import fused_fits  # noqa: PLC0415  (codegen imports this table)
    return fused_fits(bp, nodes)


# Measured on an H200 (128-expert seed shrink, 1k context, the same build otherwise, two runs each).
# Measured on an H200 after the PDL stale-read fix (bench/NOTES.md, third 2026-12-01 session; the
# earlier comparisons mixed correct and skipped MoE layers), 128-expert seed shrink, 1k context, the
# default build 6.76-7.09 ms a step over five runs in the same calls.
# moe_combine_hc and moe_combine_head, measured on an H200 (128-expert seed shrink, 1k context,
# interleaved, logits bit-equal): with PDL across event waits 6.04-6.05 ms a step against 6.07-6.12
# ms without the two rules (and 6.13-6.27 / 6.13-6.20 ms for the same pair without PDL across
# events), so they are on by default.

# Order matters where rules share ops: a group joins the first rule (in this order) that merges it,
# so the opt-in moe_layer, when asked for, takes its groups before moe_combine_hc, moe_swiglu_down,
# router_expert_quant and router_gemv_topk do; the opt-in moe_gate_up_swiglu, when asked for, before
# moe_swiglu_down (a default) and router_expert_quant (whose router + top-k pair router_gemv_topk
# then serves); router_expert_quant takes the router + top-k pair before
# router_gemv_topk (which serves it where router_expert_quant is refused).
FUSION_RULES: tuple[FusionRule, ...] = (
    # Before the rules that take the blend's or the post-mix's group alone: a group joins one merge.
    FusionRule("moe_layer", "glm_moe_layer",
               ("router", "top_k", "act_quant", "expert_gate_up", "swiglu_clamp", "silu_mul", "act_quant",
                "expert_down", "linear:shared_gate_up", "swiglu_clamp", "silu_mul", "linear:shared_down",
                "blend"), "router",
               "a MoE layer in two launches over every SM: router GEMV with its top-k, the expert input "
               "quantized once, the shared expert beside the routed ones, SwiGLU and the down input's "
               "quantization in the gate_up epilogue, the combine in the down epilogue",
               tensor_parallel=False, default=False,
               off_by_default_why="measured slower in the step on an H200 (128-expert seed shrink, 1k context: "
                                  "8.77 ms a step with it vs 6.76-7.09 ms without; the persistent kernel runs at "
                                  "~30% of its byte floor and blocks overlap with the neighbouring launches)"),
    FusionRule("moe_combine_hc", "glm_mhc", ("blend", "hc_post", "linear:hc_mix", "hc_pre", "rms_norm"), "blend",
               "the MoE combine runs as the boundary kernel's prologue (hc_boundary with PreParams<N, 1, K>): "
               "the blend's launch, its dependency and its BF16 row in memory go; the merged group keeps the "
               "blend's wait on the shared expert's stream", _blend_feeds_post_only, tensor_parallel=False),
    FusionRule("moe_combine_head", "glm_mhc", ("blend", "hc_post", "hc_contract", "final_norm"), "blend",
               "the last MoE layer's combine runs inside the head + final norm kernel: one launch and one "
               "dependency fewer", _blend_feeds_post_only, tensor_parallel=False),
    FusionRule("hc_boundary", "glm_mhc", ("hc_post", "linear:hc_mix", "hc_pre", "rms_norm"), "hc_post",
               "the post-mix runs inside the next site's pre-mix kernel (hc_boundary, kSrcPost): one launch "
               "and one pass over the streams fewer per boundary"),
    FusionRule("hc_expand_pre", "glm_mhc", ("hc_expand", "linear:hc_mix", "hc_pre", "rms_norm"), "hc_expand",
               "the embedding row is widened into the streams inside the first pre-mix kernel: one launch "
               "fewer"),
    FusionRule("hc_head_norm", "glm_mhc", ("hc_post", "hc_contract", "final_norm"), "hc_contract",
               "the last post-mix, the stream mean and the final RMSNorm in one kernel: two launches fewer"),
    FusionRule("kda_chain", "kda_fused",
               ("concat", "conv1d_update", "state_snapshot", "l2_norm", "act_quant", "linear:kda_f_b", "gdn_gates",
                "act_quant", "linear:kda_g_b", "gdn_recurrence", "gated_rms_norm"), "gdn_recurrence",
               "a KDA layer's pack, conv + L2 norm, FP8 gates, recurrence and gated norm in one kernel "
               "(kernels/kda_fused.cuh): five launches become one, the packed row, the conv output, the "
               "gates and the recurrence output stay on chip", _kda_chain_fits,
               default=False,
               off_by_default_why="measured slower in the step on an H200 (128-expert seed shrink, 1k context, "
                                  "replayed step 5696 us with it against 5358 us without: it ends 19.2 us after "
                                  "the six-segment projection, the default conv_gates + recurrence_norm pair 8.9 "
                                  "us); one profiled replay of a build with it stopped with an unspecified launch "
                                  "failure whose cause was not found (bench/NOTES.md, fourteenth session)"),
    # After kda_chain (which, asked for, takes these groups first).
    FusionRule("kda_conv_gates", "kda_conv_gates",
               ("concat", "conv1d_update", "state_snapshot", "l2_norm", "act_quant", "linear:kda_f_b", "gdn_gates",
                "act_quant", "linear:kda_g_b"), "conv1d_update",
               "the KDA short conv + L2 norm and the FP8 gate chain, independent readers of the same projection, "
               "share one grid (kernels/kda_conv_gates.cuh): one launch fewer, and the recurrence follows one "
               "kernel on one stream (its state loaded early under PDL) instead of joining two streams",
               _kda_conv_gates_fits, siblings=True),
    FusionRule("kda_recurrence_norm", "kda_recurrent", ("gdn_recurrence", "gated_rms_norm"), "gdn_recurrence",
               "the KDA gated output norm runs as the recurrence's epilogue (kda_recurrent_norm_decode_bf16, one "
               "block per value head): one launch fewer, the FP32 recurrence output stays on chip",
               _kda_recurrence_norm_fits),
    FusionRule("dsa_proj_in", "wxay", ("linear:mla_q_a", "linear:mla_kv_a", "linear:index_k"), "linear:index_k",
               "the indexer's key projection joins the query/latent projections that read the same FP8 "
               "row: one segment-list launch reads the input once"),
    FusionRule("dsa_key_store", "dsa_indexer", ("layer_norm", "kpool_compress"), "kpool_compress",
               "the DSA index key's LayerNorm runs in the index store's block (dsa_indexer_store_norm, the "
               "norm's arithmetic bit for bit): one launch and one dependency fewer per DSA layer on the "
               "path to the index select, the normalised key never leaves the chip", _norm_feeds_index_store),
    FusionRule("mla_attend_quant", "glm_mla_decode", ("mla_attention", "act_quant"), "mla_attention",
               "the per-token FP8 quantizer of the output projection's input runs in the fast MLA decode's "
               "CTAs (glm_mla_decode_fast_quant: each CTA's max of its merged share, one arrival of the row's "
               "CTAs, each encodes its share): one launch and one dependency fewer per DSA layer, the same bytes",
               _attend_then_fp8_quant, numerics="fast", default=False,
               off_by_default_why="no faster in the step on an H200 (128-expert seed shrink, 1k context, replay "
                                  "timelines interleaved, logits bit-equal): the quantized row is ready 4.8 us "
                                  "sooner, but the output projection, whose CTAs find no room beside the decode's "
                                  "and so load none of its 67 MB early, ends 22.1 us after it instead of 17 after "
                                  "the separate quantizer: DSA sublayer 61.07 / 61.39 against 59.85 / 61.50 us "
                                  "(bench/NOTES.md, twenty-ninth session; the seventeenth measured the same)"),
    FusionRule("rms_norm_fp8_quant", "rms_norm", ("rms_norm", "act_quant"), "rms_norm",
               "the per-token FP8 quantizer runs on the normed row in registers, in the norm's launch",
               _norm_then_fp8_quant),
    # Before moe_gate_up_swiglu, moe_swiglu_down and router_expert_quant, whose groups they take.
    FusionRule("moe_experts", "moe_experts",
               ("router", "top_k", "act_quant", "expert_gate_up", "swiglu_clamp", "silu_mul", "act_quant",
                "expert_down", "linear:shared_gate_up", "swiglu_clamp", "silu_mul", "linear:shared_down"),
               "expert_gate_up",
               "a MoE layer's router and experts on one stream (kernels/moe_experts.cuh): the shared gate/up "
               "tiles in the fused router's launch, the shared down's tiles in the routed gate/up's, then the "
               "SwiGLU quantizer and the routed down: two launches fewer, and the combine after them follows "
               "one stream instead of joining the shared expert's",
               _moe_experts_fits, tensor_parallel=False, default=False,
               off_by_default_why="measured slower in the step on an H200 (128-expert seed shrink, 1k context, "
                                  "interleaved with the default build, logits bit-equal: 5.98-6.05 ms a step "
                                  "against 5.79-5.97, replay busy time 5496 against 5395 us, 566 launches against "
                                  "650): the router ends 1 us sooner without the second stream beside it, but the "
                                  "shared down's compute-bound tiles make the routed gate/up launch 5 us longer, "
                                  "where the second stream hid them beside the routed GEMVs"),
    FusionRule("moe_expert_flow", "moe_experts",
               ("router", "top_k", "act_quant", "expert_gate_up", "swiglu_clamp", "silu_mul", "act_quant",
                "expert_down"),
               "expert_gate_up",
               "the routed gate/up tiles, the SwiGLU quantizer and the down's tiles run as units of one grid "
               "after the fused router (kernels/moe_experts.cuh moe_expert_flow): each unit waits only for the "
               "units it reads (flagged words, per-slot counters), so the down's weights stream while the "
               "gate/up's last tiles run, and the quantizer's launch and two full dependencies go",
               _moe_experts_fits, tensor_parallel=False, default=False,
               off_by_default_why="measured slower in the step on an H200 (128-expert seed shrink, 1k context, "
                                  "interleaved with the default build, logits bit-equal: 5.07-5.08 ms a step "
                                  "against 4.94-4.98): the flow ends 1.2 us sooner than the gate/up, quantizer "
                                  "and down launches, but its grid keeps every SM busy until it ends, so the "
                                  "shared expert's down beside it ends 13 us later and the combine waits for it; "
                                  "with the flow at the normal priority and the shared expert at the highest, "
                                  "the flow ends 6 us later instead (5.13-5.17 ms; bench/NOTES.md, "
                                  "twenty-third session)"),
    FusionRule("moe_gate_up_flow", "moe_experts",
               ("router", "top_k", "act_quant", "expert_gate_up", "swiglu_clamp", "silu_mul", "act_quant",
                "expert_down"),
               "expert_gate_up",
               "the routed gate/up tiles and the SwiGLU quantizer run as units of one grid after the fused "
               "router (kernels/moe_experts.cuh moe_gate_up_flow): each quantizer CTA waits only for its "
               "slot's flagged [gate | up] words, so the down input is ready as the gate/up's last tiles end; "
               "the quantizer's launch and one full dependency go",
               _moe_experts_fits, tensor_parallel=False, default=False,
               off_by_default_why="measured slower in the step on an H200 (128-expert seed shrink, 1k context, "
                                  "interleaved with the default build, logits bit-equal: 4.99-5.04 ms a step "
                                  "against 4.93): the down input is ready 1.9 us sooner, but the down's CTAs, "
                                  "which started beside the quantizer's launch, now start as this grid's CTAs "
                                  "exit and the down ends 0.5 us later; with the grid releasing its dependents "
                                  "after its wait, the down ends 0.35 us sooner but starves the shared expert's "
                                  "down beside it, which ends 14 us later (5.11 ms; bench/NOTES.md, "
                                  "twenty-third session)"),
    FusionRule("moe_gate_up_pair", "moe_experts",
               ("router", "top_k", "act_quant", "expert_gate_up", "swiglu_clamp", "silu_mul", "act_quant",
                "expert_down"),
               "expert_gate_up",
               "the routed gate/up GEMV's CTAs each compute 16 gate rows and their 16 up rows and write the "
               "clamped SwiGLU of those positions as one NVFP4 group of the down input "
               "(kernels/moe_experts.cuh moe_gate_up_pair), then the routed down: the SwiGLU quantizer's launch "
               "and its dependency go, with no cross-CTA arrival", _moe_experts_fits, tensor_parallel=False,
               default=False,
               off_by_default_why="measured slower in the step on an H200 (128-expert seed shrink, 1k context, "
                                  "interleaved, logits bit-equal, 608 launches against 650: the pair launch ends "
                                  "29.6 us after the router against 26.0 for the gate/up GEMV and the SwiGLU "
                                  "quantizer, and the shared expert's down, squeezed beside the 512-thread CTAs, "
                                  "then ends after the routed down: router to combine 55.1 us against 50.6)"),
    FusionRule("moe_gate_up_swiglu", "w4a4_mx_static",
               ("act_quant", "expert_gate_up", "swiglu_clamp", "silu_mul", "act_quant", "expert_down"),
               "expert_gate_up",
               "the routed experts' clamped SwiGLU and the down input's quantization run in the gate/up GEMV's "
               "epilogue (each slot's last CTA, w4a4_gemv_moe_gate_up_swiglu): two launches and two "
               "dependencies fewer per MoE layer, the same bytes", _gate_up_feeds_swiglu,
               tensor_parallel=False, default=False,
               off_by_default_why="slower in the step on an H200 (128-expert seed shrink, 1k context: 7.14-7.22 "
                                  "ms a step with it against 6.93-6.99 ms without, four runs each, logits "
                                  "bit-equal; the gate/up launch takes ~35 us against ~27 us + 6 us for the GEMV "
                                  "and the two launches it replaces: every CTA's fence and arrival keeps it "
                                  "resident longer)"),
    FusionRule("moe_swiglu_down", "w4a4_mx_static", ("swiglu_clamp", "silu_mul", "act_quant", "expert_down"),
               "expert_down",
               "the routed experts' clamped SwiGLU and the down input's quantization run in the down "
               "projection's input quantizer (w4a4_quant_swiglu_rows_static): one launch and one "
               "dependency fewer per MoE layer, the BF16 SwiGLU row never leaves the chip (measured on an H200, "
               "128-expert seed shrink, 1k context, one value a thread: 5.98 / 5.99 ms a step against 6.17 / "
               "6.37 ms without, interleaved, logits bit-equal; with one 16-value group a thread it was slower)",
               _swiglu_feeds_down_quant),
    # After moe_layer (which, asked for, takes these nodes first) and before router_gemv_topk (its
    # router + top-k pair): a group joins one merge.
    FusionRule("router_expert_quant", "glm_router_topk", ("router", "top_k", "act_quant", "expert_gate_up"),
               "expert_gate_up",
               "the fused router also quantizes the routed experts' input row (router_gemv_topk_quant, every "
               "CTA a share of the NVFP4 groups, the bytes w4a4_quant_rows_static writes): one launch fewer "
               "per MoE layer, the expert gate/up GEMV follows the router directly",
               _router_expert_quant_fits,
               # Single GPU only until a split plan has run with it on GPUs. place_collectives
               # (kbpc/codegen/collectives.py) inserts an expert-parallel rank's own_experts id
               # rewrite right after the last launch of a group that writes the ids: here the fused
               # router, so it would land between that launch and the slot GEMV that reads the ids
               # (a tp=2 tiny plan with this flag on shows exactly that order), but no rank has run
               # it; router_gemv_topk keeps serving split plans, its rewrite after the group's one launch.
               tensor_parallel=False),
    FusionRule("router_gemv_topk", "glm_router_topk", ("router", "top_k"), "top_k",
               "the MoE router GEMV and its top-k in one launch (the last CTA to finish ranks the logits): one "
               "launch and one full dependency fewer per MoE layer, the same bits", _router_topk_fits),
)

# The rules applied only on request (--fuse-rule), by name.
OPT_IN_RULES: tuple[str, ...] = tuple(r.name for r in FUSION_RULES if not r.default)
