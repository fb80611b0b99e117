"""The split math on the CPU: every rank's step run by the reference interpreter on its own
blueprint and weights (shards of the full checkpoint), the ranks in lockstep node by node, the
partial sublayer outputs summed in rank order before each post-mix (`hc_rank_sum`, the FP32 sum
in rank order rounded once to BF16 that the explain fixes), and the greedy token from a
distributed argmax over the ranks' vocabulary slices. With one rank this is the unsplit step.

This is the oracle a GPU tensor-parallel step is compared with (bit for bit in exact mode), and
what a rank's GPU step can be checked against one rank at a time (`RankedReference.partials`)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from kbpc.errors import KbpcError
from kbpc.ir.parallel import RankShard, TensorParallel
from kbpc.ir.plan import Plan
from kbpc.ir.rank_blueprint import BRANCH_SKIP, rank_blueprint
from kbpc.reference.argmax_host import argmax_host
from kbpc.reference.glm_mhc import hc_rank_sum
from kbpc.reference.interpreter import Handler, Interpreter, value_key
from kbpc.reference.ops import HANDLERS


def shard_weights(full: dict[str, np.ndarray], shard: RankShard) -> dict[str, np.ndarray]:
    """A rank's tensors cut from the full checkpoint's (each rank reads only its ranges)."""
    out = {}
    for w in shard.weights:
        arr = full[w.name]
        if tuple(arr.shape) != w.full_shape:
            raise KbpcError(f"{w.name} has shape {tuple(arr.shape)}, the plan expects {w.full_shape}")
        out[w.name] = w.shard.take(arr) if w.shard is not None else arr
    return out


def combine_argmax(pairs: list[tuple[float, int]]) -> int:
    """The global greedy token from each rank's (best logit, its global index), in rank order:
    the largest value, ties to the lowest index (argmax_host over the whole row)."""
    best, token = -np.inf, 0
    for value, index in pairs:
        if value > best or (value == best and index < token):
            best, token = value, index
    return token


def local_argmax(logits: np.ndarray, first: int) -> tuple[float, int]:
    """A rank's best logit and its global index (its slice starts at logit `first`)."""
    i = int(argmax_host(logits.reshape(-1)))
    value = float(np.asarray(logits, np.float32).reshape(-1)[i])
    return (value if not np.isnan(value) else -np.inf), first + i


def rank_handlers(shard: RankShard, base: dict[str, Handler] = HANDLERS) -> dict[str, Handler]:
    """The op table with expert parallelism: a router's ids outside this rank's experts become
    empty slots (-1), its own experts local indices."""
    if not shard.experts:
        return base
    ranges = {e.router: e for e in shard.experts}
    base_top_k: Callable = base["top_k"]

    def top_k(s, node, ins):
        out = base_top_k(s, node, ins)
        ex = ranges.get(node.id)
        if ex is not None:
            ids = np.asarray(out["topk_id"])
            own = (ids >= ex.base) & (ids < ex.base + ex.count)
            out = {**out, "topk_id": np.where(own, ids - ex.base, -1).astype(ids.dtype)}
        return out

    return {**base, "top_k": top_k}


class RankedReference:
    """R reference interpreters stepping one sequence in lockstep (a plan split by
    split_tensor_parallel, or any plan: tp = 1 runs the unsplit step)."""

    def __init__(self, plan: Plan, full_weights: dict[str, np.ndarray], max_context: int,
                 handlers: dict[str, Handler] = HANDLERS):
        bp = plan.blueprint
        tp: TensorParallel | None = plan.parallel
        self.bp = bp
        self.shards = tp.shards if tp is not None else ()
        splits = {s.name: s for s in tp.splits} if tp is not None else {}
        if tp is None:
            self.ranks = [Interpreter(bp, full_weights, max_context, handlers)]
        else:
            self.ranks = [Interpreter(rank_blueprint(bp, splits, s.rank), shard_weights(full_weights, s),
                                      max_context, rank_handlers(s, handlers)) for s in self.shards]
        self.vocab = bp.symbols.get("vocab")
        self.partials: list[list[np.ndarray]] = []   # the last step's partials, per post-mix

    def step(self, token: int) -> tuple[np.ndarray, int]:
        runs = [r.begin(token) for r in self.ranks]
        self.partials = []
        for order in self.ranks[0].order:
            node = self.bp.node(order)
            if node.op == "hc_post" and len(self.ranks) > 1:
                self._sum_partials(runs, order)
            for interp, run in zip(self.ranks, runs):
                interp.run_node(run, order)
        results = [interp.finish(run) for interp, run in zip(self.ranks, runs)]
        logits = np.concatenate([np.asarray(lg, np.float32).reshape(-1) for lg, _ in results])
        if len(results) == 1:
            return results[0][0], results[0][1]
        pairs = [local_argmax(lg, s.vocab[0]) for (lg, _), s in zip(results, self.shards)]
        return logits[None, :], combine_argmax(pairs)

    def _sum_partials(self, runs, order: int) -> None:
        """Replace every rank's sublayer output feeding this post-mix by the rank-ordered sum;
        the streams it mixes must be the same on every rank."""
        edges = self.bp.inputs(order)
        branch = [t for t in edges if self.bp.node(t.src).op not in BRANCH_SKIP]
        streams = [t for t in edges if self.bp.node(t.src).op in ("hc_post", "hc_expand")]
        key = value_key(branch[0])
        parts = [np.asarray(run.values[key], np.float32) for run in runs]
        for t in streams:
            first = runs[0].values[value_key(t)]
            if any(not np.array_equal(first, run.values[value_key(t)]) for run in runs[1:]):
                raise KbpcError("the ranks' streams differ before a post-mix", f"node {self.bp.node(order).id}")
        self.partials.append(parts)
        u = hc_rank_sum(np.stack(parts))
        for run in runs:
            run.values[key] = u
