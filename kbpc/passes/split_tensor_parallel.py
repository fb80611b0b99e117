"""split_tensor_parallel: heads, intermediate sizes, routed experts and the LM head's vocabulary
split across the ranks of options.tp (kbpc/ir/parallel.py says what the split math is).

Needs: lowered groups and weight specs. Guarantees (tp = 1): the plan is unchanged. tp = R > 1:
`plan.parallel` records the split symbols and their per-rank counts, each MoE block's expert layout
(with the bytes that chose it), what stays replicated, and one RankShard per rank (its symbols,
vocabulary slice, experts, the partial outputs summed before each post-mix, and its weights as
shards of the full checkpoint). `rank_plan(plan, r)` is rank r's own plan: its blueprint through
every other pass of the pipeline, its weights the shards.

What splits (ENGINE_SPLITS, per engine family, in the engine's own symbol names): KDA heads (q/k
and v heads together), MLA heads, the dense MLP's, shared expert's and routed experts'
intermediate sizes, and the LM head's vocabulary (scoped to the lm_head: the embedding table stays
whole). A symbol splits into contiguous whole granules, the granule being what the consuming
kernels need (NVFP4 x NVFP4 and FP8 GEMMs read K in chunks of 128, NVFP4 x BF16 in 16s, BF16 in
8s; W4A4 and FP8 GEMVs write N in 16s). Routed experts: the intermediate split ("tp") when it is
legal and its busiest rank reads no more than expert parallelism's expected busiest rank ("ep":
contiguous expert ranges; a rank's slots of other experts are empty)."""
from __future__ import annotations

import dataclasses
from math import gcd, lcm

from kbpc.errors import KbpcError
from kbpc.frontend.dims import parse_dim
from kbpc.ir.graph import Blueprint
from kbpc.ir.parallel import (ExpertLayout, ExpertRange, RankShard, SymbolSplit, TensorParallel,
                              _terms, balanced, expected_busiest)
from kbpc.ir.plan import Plan
from kbpc.ir.rank_blueprint import (as_specs, dim_expr, partial_buffers, rank_blueprint,
                                    rank_weights)
from kbpc.ir.weights import GEMM_OPS, weight_specs

# engine -> groups of symbols split together (one count per rank for the whole group); the
# routed experts' symbol last, and the vocabulary with the ops it is scoped to.
ENGINE_SPLITS = {
    "glm5_next": {"together": (("lin_k_heads", "lin_v_heads"), ("q_heads",), ("inter",), ("shared_inter",)),
                  "experts": ("experts", "moe_inter", "top_k"), "vocab": ("vocab", ("lm_head",))},
}
REPLICATED = (
    "hyper-connections (streams, mix, gates, Sinkhorn, site norms): every rank keeps the streams",
    "embedding table (one row read per token) and the final norm",
    "MLA q_a/kv_a projections, their norms and the latent cache (every head reads every latent)",
    "KDA low-rank f_a/g_a projections (their outputs feed every head's gates)",
    "DSA indexer (its top-k needs every head's score; splitting it would add a collective per layer)",
    "MoE router and top-k (every rank routes the token the same way)",
)
K_CHUNK = {("nvfp4/g16", "nvfp4/g16"): 128, ("fp8/channel", "fp8/token"): 128, ("nvfp4/g16", "bf16"): 16}


def split_tensor_parallel(plan: Plan) -> Plan:
    ranks = plan.options.tp
    if ranks == 1:
        return plan
    bp = plan.blueprint
    table = ENGINE_SPLITS.get(bp.config.engine)
    if table is None:
        raise KbpcError(f"no tensor-parallel split is defined for engine {bp.config.engine!r}", "--tp")
    splits = {}
    for names in table["together"]:
        splits.update(_split_together(bp, names, ranks))
    experts, layouts = _experts(bp, plan, table["experts"], ranks, splits)
    vocab, scope = table["vocab"]
    counts = balanced(bp.symbols[vocab], ranks, _granule(bp, vocab))
    if counts is None:
        raise KbpcError(f"{vocab} = {bp.symbols[vocab]} does not split over {ranks} ranks", "--tp")
    splits[vocab] = SymbolSplit(vocab, bp.symbols[vocab], counts, scope)
    partials = partial_buffers(bp)
    shards = []
    for r in range(ranks):
        rbp = rank_blueprint(bp, splits, r)
        ranges = tuple(ExpertRange(router, *span[r]) for router, span in experts)
        weights = rank_weights(bp, plan.weights, weight_specs(rbp), splits, ranges, r)
        shards.append(RankShard(rank=r, ranks=ranks,
                                symbols=tuple(sorted((s.name, s.counts[r]) for s in splits.values())),
                                vocab=(splits[vocab].start(r), splits[vocab].counts[r]),
                                experts=ranges, partials=partials,
                                weights=weights))
    tp = TensorParallel(ranks, tuple(splits[k] for k in sorted(splits)), layouts, REPLICATED, tuple(shards))
    return dataclasses.replace(plan, parallel=tp)


def _split_together(bp: Blueprint, names: tuple[str, ...], ranks: int) -> dict[str, SymbolSplit]:
    present = [n for n in names if n in bp.symbols]
    if not present:
        return {}
    totals = {bp.symbols[n] for n in present}
    if len(totals) != 1:
        raise KbpcError(f"{' and '.join(present)} differ ({sorted(totals)}); they split together", "--tp")
    granule = lcm(*(_granule(bp, n) for n in present))
    counts = balanced(totals.pop(), ranks, granule)
    if counts is None:
        raise KbpcError(f"{present[0]} = {bp.symbols[present[0]]} does not split over {ranks} ranks in "
                        f"whole granules of {granule} (what its kernels need)", "--tp")
    return {n: SymbolSplit(n, bp.symbols[n], counts) for n in present}


def _granule(bp: Blueprint, symbol: str) -> int:
    """The smallest count of `symbol` per rank that keeps every GEMM reading or writing it legal."""
    granule = 1
    for node in bp.nodes():
        if node.op_base not in GEMM_OPS or node.precision.weight is None:
            continue
        act = [t for t in bp.inputs(node.order) if t.format != "i32"]
        wfmt = node.precision.weight
        chunk_k = K_CHUNK.get((wfmt, node.precision.activation), 8)
        chunk_n = 16 if chunk_k == 128 else 1      # W4A4 and FP8 GEMVs write N in 16s
        for t, chunk in ((act[0] if act else None, chunk_k), (bp.outputs(node.order)[0], chunk_n)):
            expr = dim_expr(bp, t) if t is not None else None
            if expr is None:
                continue
            for _, syms in _terms(parse_dim(expr)):
                if symbol in syms:
                    inner = 1
                    for s in syms:
                        inner *= bp.symbols[s] if s != symbol else 1
                    granule = lcm(granule, chunk // gcd(chunk, inner))
    return granule


def _experts(bp: Blueprint, plan: Plan, names: tuple[str, str, str], ranks: int,
             splits: dict[str, SymbolSplit]):
    """Choose the routed experts' layout; add the intermediate split to `splits` when it is "tp".
    Returns ((router, per-rank spans) for "ep", the layouts)."""
    experts_sym, inter_sym, topk_sym = names
    routers = [n for n in bp.nodes() if n.op == "top_k"]
    if not routers:
        return (), ()
    e, k = bp.symbols[experts_sym], bp.symbols[topk_sym]
    inter = bp.symbols[inter_sym]
    tp_counts = balanced(inter, ranks, _granule(bp, inter_sym))
    ep_counts = balanced(e, ranks)
    if ep_counts is None and tp_counts is None:
        raise KbpcError(f"the routed experts split over {ranks} ranks neither by {inter_sym} ({inter}) nor "
                        f"by expert ({e} experts)", "--tp")
    layouts, spans = [], []
    for router in routers:
        per_expert = _expert_bytes(bp, plan, router) / e
        tp_bytes = None if tp_counts is None else k * per_expert * max(tp_counts) / inter
        ep_bytes = float("inf") if ep_counts is None else expected_busiest(ep_counts, k) * per_expert
        layout = "tp" if tp_bytes is not None and tp_bytes <= ep_bytes else "ep"
        why = (f"{inter_sym} {inter} does not split over {ranks} ranks in the kernels' granules"
               if tp_counts is None else "the busiest rank reads fewer expert bytes per token")
        layouts.append(ExpertLayout(router.id, layout, tp_bytes, ep_bytes, why))
    if len({l.layout for l in layouts}) != 1:
        raise KbpcError("MoE blocks of one model chose different expert layouts", "--tp")
    if layouts[0].layout == "tp":
        splits[inter_sym] = SymbolSplit(inter_sym, inter, tp_counts)
        return (), tuple(layouts)
    starts = [sum(ep_counts[:r]) for r in range(ranks)]
    spans = tuple((l.router, tuple((starts[r], ep_counts[r]) for r in range(ranks))) for l in layouts)
    return spans, tuple(layouts)


def _expert_bytes(bp: Blueprint, plan: Plan, router) -> float:
    readers = {bp.node(t.dst).id for t in bp.outputs(router.order) if t.format == "i32"}
    return float(sum(w.nbytes for w in plan.weights if w.node in readers and w.experts))


def rank_plan(plan: Plan, rank: int) -> Plan:
    """Rank `rank`'s plan: its blueprint through every pass but this one (tp = 1 options, the
    RankShard recorded on the plan), its weights the shards of the full checkpoint."""
    from kbpc.passes import PIPELINE   # the table imports this module

    tp = plan.parallel
    if tp is None:
        raise KbpcError("the plan is not split (tp = 1)")
    shard = tp.shards[rank]
    splits = {s.name: s for s in tp.splits}
    rbp = rank_blueprint(plan.blueprint, splits, rank)
    out = Plan(blueprint=rbp, options=dataclasses.replace(plan.options, tp=1), shard=shard)
    for name, fn in PIPELINE:
        if name == "split_tensor_parallel":
            out = dataclasses.replace(out, weights=as_specs(shard.weights, plan.weights))
        else:
            out = fn(out)
    return out
