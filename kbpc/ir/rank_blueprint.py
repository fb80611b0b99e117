"""One rank's blueprint and weights under tensor parallelism (kbpc/ir/parallel.py).

A rank's blueprint is the full one with the split symbols at the rank's counts: every edge's dim
value and bytes are re-evaluated from its dim expression (a scoped symbol, the vocabulary of the LM
head, only on the outputs of its ops), so every pass, lowering and reference module runs on it
unchanged. Its checkpoint tensors are shards of the full ones: the ranges follow from the dim
expressions that size each axis (`split_ranges`), and expert-parallel blocks keep a range of
experts."""
from __future__ import annotations

import dataclasses
from math import prod

from kbpc.errors import KbpcError
from kbpc.frontend.dims import eval_dim
from kbpc.ir.buffers import buffer_name
from kbpc.ir.formats import FORMATS
from kbpc.ir.graph import Blueprint
from kbpc.ir.parallel import ExpertRange, RankWeight, Shard, SymbolSplit, split_ranges
from kbpc.ir.records import Node, Tensor
from kbpc.ir.weights import GEMM_OPS, WeightSpec

BRANCH_SKIP = ("hc_pre", "hc_post", "hc_expand")


def rank_blueprint(bp: Blueprint, splits: dict[str, SymbolSplit], rank: int) -> Blueprint:
    """The blueprint rank `rank` runs: split symbols at its counts, dims and bytes re-evaluated."""
    symbols = {**bp.symbols, **{s.name: s.counts[rank] for s in splits.values() if not s.scope}}
    graph = bp.graph.copy()
    values: dict[int, int] = {}
    for t in bp.tensors():
        if t.dim is not None:
            env = dict(symbols)
            for s in splits.values():
                if s.scope and bp.node(t.src).op_base in s.scope:
                    env[s.name] = s.counts[rank]
            values[t.index] = eval_dim(t.dim, env)
    for t in bp.tensors():
        if t.dim is None:   # a quantized edge: as wide as its producer's sized input
            ins = [i for i in bp.inputs(t.src) if i.dim is not None]
            values[t.index] = values[ins[0].index] if ins else t.dim_value
        new = dataclasses.replace(
            t, dim_value=values[t.index],
            bytes_per_token=None if t.bytes_per_token is None else
            FORMATS[t.format].row_bytes(values[t.index]) * t.rows_per_token)
        graph.edges[t.src, t.dst, t.index]["tensor"] = new
    meta = dataclasses.replace(bp.meta, source=f"{bp.meta.source}#rank{rank}")
    return Blueprint(meta=meta, graph=graph, groups=bp.groups, layers=bp.layers, symbols=symbols,
                     config=bp.config, raw=bp.raw)


def dim_expr(bp: Blueprint, t: Tensor) -> str | None:
    """The dim expression of an edge; a quantized edge's is its producer's sized input's."""
    while t.dim is None:
        ins = [i for i in bp.inputs(t.src) if i.dim is not None or i.format != "i32"]
        if not ins:
            return None
        t = ins[0]
    return t.dim


def partial_buffers(bp: Blueprint) -> tuple[str, ...]:
    """The BF16 sublayer outputs each post-mix sums over ranks, in node order."""
    out = []
    for node in bp.nodes():
        if node.op == "hc_post":
            branch = [t for t in bp.inputs(node.order) if bp.node(t.src).op not in BRANCH_SKIP]
            if len(branch) != 1:
                raise KbpcError("a post-mix needs one sublayer output to sum over ranks", f"node {node.id}")
            out.append(buffer_name(bp, branch[0]))
    return tuple(out)


def _axes(bp: Blueprint, node: Node, spec: WeightSpec) -> dict[int, tuple[str | None, int]]:
    """axis -> (dim expression sizing it, storage elements per unit) for the axes a split may cut."""
    suffix = spec.name[len(node.id) + 1:]
    lead = 1 if spec.experts else 0
    if node.op_base in GEMM_OPS and node.precision.weight is not None:
        n = dim_expr(bp, bp.outputs(node.order)[0])
        act = [t for t in bp.inputs(node.order) if t.format != "i32"]
        k = dim_expr(bp, act[0]) if act else None
        per_k = {"e2m1x2": 2, "e4m3": 1, "bf16": 1}.get(spec.storage, 1)
        if suffix == "weight":
            return {lead: (n, 1), lead + 1: (k, per_k)}
        if suffix == "weight_scale" and len(spec.shape) == lead + 2:
            return {lead: (n, 1), lead + 1: (k, 16)}
        if suffix == "weight_scale":
            return {lead: (n, 1)}
        return {}
    if node.op == "conv1d_update":
        return {0: (dim_expr(bp, bp.inputs(node.order)[0]), 1)}
    if node.op == "gdn_gates":
        outs = {t.id.rsplit(".", 1)[-1]: t for t in bp.outputs(node.order)}
        which = {"A_log": "beta", "dt_bias": "decay"}.get(suffix)
        return {0: (outs[which].dim, 1)} if which in outs else {}
    return {}


def rank_weights(bp: Blueprint, full: tuple[WeightSpec, ...], rank_specs: list[WeightSpec],
                 splits: dict[str, SymbolSplit], experts: tuple[ExpertRange, ...],
                 rank: int) -> tuple[RankWeight, ...]:
    """Each rank tensor with the shard of the full tensor it holds; checks that the shard has the
    shape the rank's own blueprint derives (expert-parallel stacks keep their range of experts)."""
    full_by_name = {w.name: w for w in full}
    routed = _routed_nodes(bp, experts)
    out = []
    for spec in rank_specs:
        whole = full_by_name.get(spec.name)
        if whole is None:
            raise KbpcError(f"rank {rank} has a weight {spec.name} the unsplit model lacks")
        node = bp.node_by_id[spec.node]
        shards = []
        active = {k: s for k, s in splits.items() if not s.scope or node.op_base in s.scope}
        for axis, (expr, per) in _axes(bp, node, whole).items():
            ranges = split_ranges(expr, bp.symbols, active, rank) if expr else None
            if ranges is not None:
                if any(a % per or b % per for a, b in ranges):
                    raise KbpcError(f"rank {rank}'s part of {spec.name} does not start on a whole "
                                    f"storage element (ranges {ranges}, {per} values each)")
                shards.append(Shard(axis, tuple((a // per, b // per) for a, b in ranges)))
        if node.id in routed and whole.experts:
            ex = routed[node.id]
            shards.append(Shard(0, ((ex.base, ex.base + ex.count),)))
        if len(shards) > 1:
            raise KbpcError(f"{spec.name} would be split along {len(shards)} axes")
        shard = shards[0] if shards else None
        shape = list(whole.shape)
        if shard is not None:
            shape[shard.axis] = shard.size
        if shard is None or shard.axis != 0 or node.id not in routed:
            if tuple(shape) != spec.shape:
                raise KbpcError(f"rank {rank}: {spec.name} derives shape {spec.shape}, its shard of "
                                f"{whole.shape} is {tuple(shape)}")
        nbytes = prod(shape) * (whole.nbytes // max(1, prod(whole.shape)))
        out.append(RankWeight(spec.name, spec.storage, whole.shape, tuple(shape), shard,
                              nbytes * whole.touched_per_token))
    return tuple(out)


def _routed_nodes(bp: Blueprint, experts: tuple[ExpertRange, ...]) -> dict[str, ExpertRange]:
    """Expert nodes (readers of an expert-parallel router's ids) -> that router's range."""
    out = {}
    for ex in experts:
        router = bp.node_by_id[ex.router]
        for t in bp.outputs(router.order):
            if t.format == "i32":
                out[bp.node(t.dst).id] = ex
    return out


def as_specs(weights: tuple[RankWeight, ...], full: tuple[WeightSpec, ...]) -> tuple[WeightSpec, ...]:
    """A rank's weights as the plan's weight specs (shapes of the shards, names and roles kept)."""
    by_name = {w.name: w for w in full}
    return tuple(dataclasses.replace(by_name[w.name], shape=w.shape) for w in weights)
