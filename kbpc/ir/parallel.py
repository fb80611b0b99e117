"""Tensor parallelism as plan facts: how a blueprint is split over R ranks.

A split symbol (attention heads, an MLP's intermediate size, the vocabulary of the LM head) gives
every rank a contiguous range of its units, in rank order. Each rank's step is the blueprint with
those symbols at the rank's counts (kbpc/ir/rank_blueprint.py); its checkpoint tensors are slices
of the full ones (`Shard`: ranges along one axis), so a rank reads only its part. Routed experts
are split the same way (`moe_inter`) or, expert-parallel, by expert ids (`ExpertRange`).

The split math (what kbpc.reference.tensor_parallel runs and the GPU must match bit for bit in
exact mode): each sublayer feeding a hyper-connection post-mix produces a BF16 partial output per
rank; the post-mix reads u = rn_bf16(sum_rho u^(rho)), an FP32 sum in rank order (explain, glm_mhc).
Everything a rank computes before that sum is the unsplit math restricted to its units, except the
per-token dynamic activation scales of a split row (FP8 per token, NVFP4 per-row global), which a
rank takes over its own slice. R = 1 is the unsplit step."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from math import comb, prod
from typing import Sequence

import numpy as np
from lark import Token, Tree

from kbpc.errors import KbpcError
from kbpc.frontend.dims import parse_dim


@dataclass(frozen=True)
class SymbolSplit:
    """A symbol counted per rank: rank r owns units [start(r), start(r) + counts[r]). `scope`: the
    ops whose output edges take the per-rank value (empty: every edge and the symbol table)."""
    name: str
    total: int
    counts: tuple[int, ...]
    scope: tuple[str, ...] = ()

    def start(self, rank: int) -> int:
        return sum(self.counts[:rank])

    def span(self, rank: int) -> tuple[int, int]:
        lo = self.start(rank)
        return lo, lo + self.counts[rank]


@dataclass(frozen=True)
class Shard:
    """The part of a full tensor one rank holds: along `axis`, the concatenation of the `ranges`
    [start, stop) in storage elements, in order."""
    axis: int
    ranges: tuple[tuple[int, int], ...]

    @property
    def size(self) -> int:
        return sum(b - a for a, b in self.ranges)

    def take(self, full: np.ndarray) -> np.ndarray:
        parts = [np.take(full, np.arange(a, b), axis=self.axis) for a, b in self.ranges]
        return np.ascontiguousarray(np.concatenate(parts, axis=self.axis) if len(parts) > 1 else parts[0])


@dataclass(frozen=True)
class RankWeight:
    """One checkpoint tensor as a rank holds it (shard None: the whole tensor)."""
    name: str
    storage: str
    full_shape: tuple[int, ...]
    shape: tuple[int, ...]
    shard: Shard | None
    bytes_per_token: float


@dataclass(frozen=True)
class ExpertRange:
    """Expert parallelism for one MoE block: this rank holds experts [base, base + count) of the
    router `router` (a top_k node); routed slots of other experts become empty (id -1) here."""
    router: str
    base: int
    count: int


@dataclass(frozen=True)
class ExpertLayout:
    """How one MoE block's routed experts are split, and the busiest rank's expected weight bytes
    per token under each layout (the choice is the smaller; `why` says when one is not legal)."""
    router: str
    layout: str                       # "tp" (each expert's intermediate split) | "ep" (by expert)
    tp_bytes: float | None            # None: that split is not legal for the kernels
    ep_bytes: float
    why: str


@dataclass(frozen=True)
class RankShard:
    """What rank `rank` of `ranks` runs: its symbol values, its vocabulary slice, its experts, the
    partial-output buffers summed before each post-mix (step order) and its weights."""
    rank: int
    ranks: int
    symbols: tuple[tuple[str, int], ...]
    vocab: tuple[int, int]            # (first logit, logits) of this rank
    experts: tuple[ExpertRange, ...]
    partials: tuple[str, ...]         # arena buffer names `<producer>.<output>` (BF16 rows)
    weights: tuple[RankWeight, ...]


@dataclass(frozen=True)
class TensorParallel:
    ranks: int
    splits: tuple[SymbolSplit, ...]
    experts: tuple[ExpertLayout, ...]
    replicated: tuple[str, ...]       # what every rank computes whole, and why
    shards: tuple[RankShard, ...]

    @property
    def collectives_per_step(self) -> int:
        """One all-gather of BF16 partials per post-mix, plus the logits' argmax exchange."""
        return len(self.shards[0].partials) + 1


def balanced(total: int, ranks: int, granule: int = 1) -> tuple[int, ...] | None:
    """Contiguous counts per rank in whole granules, the first ranks one granule larger; None when
    `total` is not a multiple of `granule` or some rank would get nothing."""
    if total % granule or total // granule < ranks:
        return None
    units = total // granule
    return tuple(granule * (units // ranks + (1 if r < units % ranks else 0)) for r in range(ranks))


# -- dim expressions as concatenations ------------------------------------------------------------
# A dim expression with a split symbol is read as a concatenation: a sum of terms in order, a term
# c * s * f (c a literal: c consecutive blocks; s the split symbol, outermost; f the product of
# the other symbols, innermost), e.g. `lin_k_heads*lin_k_dim*2+lin_v_heads*lin_v_dim` = q | k | v,
# heads-major, and `inter*2` = gate | up.

def _terms(tree) -> list[tuple[int, tuple[str, ...]]]:
    if isinstance(tree, Token):
        return [(int(tree), ())]
    if tree.data == "num":
        return [(int(tree.children[0]), ())]
    if tree.data == "sym":
        return [(1, (str(tree.children[0]),))]
    if tree.data == "add":
        return _terms(tree.children[0]) + _terms(tree.children[1])
    if tree.data == "mul":
        out = []
        for (ca, sa), (cb, sb) in product(_terms(tree.children[0]), _terms(tree.children[1])):
            out.append((ca * cb, sa + sb))
        return out
    raise ValueError(f"`{tree.data}` is not a concatenation of blocks")


def split_ranges(expr: str, symbols: dict[str, int], splits: dict[str, SymbolSplit],
                 rank: int) -> tuple[tuple[int, int], ...] | None:
    """The ranges of a rank's part of a dimension `expr` (None: the dimension is not split)."""
    tree = parse_dim(expr)
    if not isinstance(tree, Tree) or not any(s in splits for s in _symbols(tree)):
        return None
    try:
        terms = _terms(tree)
    except ValueError as exc:
        raise KbpcError(f"cannot split the dimension `{expr}`: {exc}") from None
    ranges, offset = [], 0
    for coef, syms in terms:
        split = [s for s in syms if s in splits]
        inner = prod(symbols[s] for s in syms if s not in splits)
        if len(split) != 1:
            raise KbpcError(f"cannot split the dimension `{expr}`: a term has {len(split)} split symbols")
        s = splits[split[0]]
        lo, hi = s.span(rank)
        for block in range(coef):
            base = offset + block * s.total * inner
            ranges.append((base + lo * inner, base + hi * inner))
        offset += coef * s.total * inner
    return tuple(ranges)


def _symbols(tree) -> set[str]:
    if isinstance(tree, Token):
        return set()
    if tree.data == "sym":
        return {str(tree.children[0])}
    return set().union(*(_symbols(c) for c in tree.children))


def expected_busiest(owned: Sequence[int], top_k: int) -> float:
    """E[max over ranks of the routed slots a rank owns] when `top_k` distinct experts are drawn
    uniformly from sum(owned) experts (multivariate hypergeometric, enumerated exactly)."""
    total = sum(owned)
    norm = comb(total, top_k)
    expect = 0.0
    for split in _compositions(top_k, len(owned)):
        ways = prod(comb(n, x) for n, x in zip(owned, split))
        if ways:
            expect += max(split) * ways / norm
    return expect


def _compositions(n: int, parts: int):
    if parts == 1:
        yield (n,)
        return
    for first in range(n + 1):
        for rest in _compositions(n - first, parts - 1):
            yield (first, *rest)
