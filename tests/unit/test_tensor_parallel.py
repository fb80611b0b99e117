"""Tensor parallelism on the CPU: the split (split_tensor_parallel), the ranks' shards of the
checkpoint, and the split math run rank by rank in the reference interpreter (partial sublayer
outputs summed in rank order before each post-mix) against the unsplit step."""
from __future__ import annotations

import dataclasses
from math import prod

import numpy as np
import pytest

from kbpc.errors import KbpcError
from kbpc.frontend.load import blueprint_from_doc, load_blueprint
from kbpc.ir.parallel import Shard, balanced, expected_busiest, split_ranges, SymbolSplit
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.passes.split_tensor_parallel import rank_plan
from kbpc.reference import no_act_quant
from kbpc.reference.interpreter import Interpreter
from kbpc.reference.ops import HANDLERS
from kbpc.reference.tensor_parallel import RankedReference, combine_argmax, shard_weights
from kbpc.tools.shrink import shrink
from kbpc.weights.synthetic import synthetic_weights


@pytest.fixture(scope="module")
def tiny(tiny_path):
    bp = load_blueprint(tiny_path)
    return bp, synthetic_weights(bp, 7)


@pytest.fixture(scope="module")
def deep(seed_path):
    """The seed at toy sizes with all of its layers; heads and every intermediate split in two."""
    seed = load_blueprint(seed_path)
    sizes = {"hidden": 256, "lin_k_heads": 2, "lin_v_heads": 2, "inter": 512, "moe_inter": 256,
             "shared_inter": 128, "experts": 8, "top_k": 2, "q_lora": 128, "q_heads": 2,
             "index_heads": 4, "index_topk": 16, "vocab": 512}
    doc = shrink(seed, sizes, list(range(len(seed.layers))))
    bp = blueprint_from_doc(doc, "deep.json")
    return bp, synthetic_weights(bp, 3)


def test_balanced_counts_and_granules():
    assert balanced(32, 3) == (11, 11, 10)
    assert balanced(512, 2, 128) == (256, 256)
    assert balanced(128, 2, 128) is None          # a rank would hold half a granule
    assert balanced(2, 3) is None                 # a rank would hold nothing


def test_concatenated_dims_give_each_rank_its_blocks():
    heads = SymbolSplit("h", 4, (2, 2))
    ranges = split_ranges("h*d*2+h*e", {"h": 4, "d": 8, "e": 4}, {"h": heads}, 1)
    assert ranges == ((16, 32), (48, 64), (72, 80))   # q | k | v, heads-major
    assert split_ranges("d*2", {"d": 8}, {"h": heads}, 0) is None
    shard = Shard(0, ranges)
    assert shard.take(np.arange(80)).tolist() == [*range(16, 32), *range(48, 64), *range(72, 80)]


def test_expected_busiest_rank():
    assert expected_busiest((4, 4), 1) == 1.0
    assert expected_busiest((1, 1), 2) == 1.0
    # two of four experts, two per rank: both on one rank with probability 2/6
    assert expected_busiest((2, 2), 2) == pytest.approx(2 * 2 / 6 + 1 * 4 / 6)


def test_tiny_split_layout(tiny):
    bp, _ = tiny
    plan = run_pipeline(bp, Options(tp=2))
    tp = plan.parallel
    counts = {s.name: s.counts for s in tp.splits}
    assert counts["q_heads"] == (1, 1) and counts["lin_v_heads"] == (1, 1) and counts["inter"] == (256, 256)
    assert "moe_inter" not in counts                   # 64 per rank is below the W4A4 K chunk
    assert {l.layout for l in tp.experts} == {"ep"} and all(l.tp_bytes is None for l in tp.experts)
    assert [s.vocab for s in tp.shards] == [(0, 256), (256, 256)]
    assert [(e.base, e.count) for e in tp.shards[1].experts] == [(4, 4), (4, 4)]
    n_post = sum(1 for n in bp.nodes() if n.op == "hc_post")
    assert len(tp.shards[0].partials) == n_post and tp.collectives_per_step == n_post + 1
    # every split tensor's shards cover the full tensor exactly once
    full = {w.name: w for w in plan.weights}
    for name in full:
        parts = [next(w for w in s.weights if w.name == name) for s in tp.shards]
        if parts[0].shard is None:
            assert all(p.shape == full[name].shape for p in parts)
            continue
        covered = sorted(r for p in parts for r in p.shard.ranges)
        axis = parts[0].shard.axis
        assert covered[0][0] == 0 and covered[-1][1] == full[name].shape[axis]
        assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
        assert sum(prod(p.shape) for p in parts) == prod(full[name].shape)


def test_rank_plans_carry_their_shard(tiny):
    bp, _ = tiny
    plan = run_pipeline(bp, Options(tp=2))
    r0, r1 = rank_plan(plan, 0), rank_plan(plan, 1)
    assert r0.shard.rank == 0 and r1.shard.rank == 1 and r0.options.tp == 1
    assert r0.digest != r1.digest                      # the shard is part of the plan
    assert r0.blueprint.symbols["q_heads"] == 1 and r0.blueprint.symbols["vocab"] == 512
    experts = next(w for w in r1.weights if w.name == "l1.moe.experts_down.weight")
    assert experts.shape[0] == 4
    logits = next(t for t in r0.blueprint.tensors() if r0.blueprint.node(t.src).op == "lm_head")
    assert logits.dim_value == 256


def test_tp_refuses_what_cannot_split(tiny):
    bp, _ = tiny
    with pytest.raises(KbpcError, match="does not split over 3 ranks"):
        run_pipeline(bp, Options(tp=3))


def test_one_rank_is_the_unsplit_step(tiny):
    bp, weights = tiny
    unsplit = Interpreter(bp, weights, 16)
    ranked = RankedReference(run_pipeline(bp, Options()), weights, 16)
    token = 3
    for _ in range(4):
        a, b = unsplit.step(token), ranked.step(token)
        assert np.array_equal(a[0], b[0]) and a[1] == b[1]
        token = a[1]


def _head_values_match(bp, weights, plan, layer_prefix: str):
    """Before the first post-mix the ranks compute exactly the unsplit per-head values, sliced."""
    unsplit = Interpreter(bp, weights, 8)
    unsplit.keep_values = True
    ranked = RankedReference(plan, weights, 8)
    for r in ranked.ranks:
        r.keep_values = True
    unsplit.step(11)
    ranked.step(11)
    splits = {s.name: s for s in plan.parallel.splits}
    checked = 0
    for t in bp.tensors():
        node = bp.node(t.src)
        if not node.id.startswith(layer_prefix) or t.dim is None or node.op in ("hc_pre", "hc_post"):
            continue
        full = unsplit.last_values[(t.src, t.id.rsplit(".", 1)[-1])]
        if not isinstance(full, np.ndarray):
            continue
        for s in plan.parallel.shards:
            part = ranked.ranks[s.rank].last_values[(t.src, t.id.rsplit(".", 1)[-1])]
            ranges = split_ranges(t.dim, bp.symbols, {k: v for k, v in splits.items() if not v.scope}, s.rank)
            if ranges is None or node.op_base == "linear" and node.op.endswith(":o"):
                continue
            want = Shard(full.ndim - 1, ranges).take(full)
            assert np.array_equal(part, want), f"{t.id} rank {s.rank}"
            checked += 1
    return checked


def test_ranks_compute_the_unsplit_heads_before_the_first_sum(tiny):
    bp, weights = tiny
    assert _head_values_match(bp, weights, run_pipeline(bp, Options(tp=2)), "l0.kda.") >= 8


def _compare(bp, weights, plan, steps: int, handlers):
    unsplit = Interpreter(bp, weights, steps + 1, handlers)
    ranked = RankedReference(plan, weights, steps + 1, handlers)
    token, worst, same = 1, 0.0, 0
    for _ in range(steps):
        (a, ta), (b, tb) = unsplit.step(token), ranked.step(token)
        a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
        worst = max(worst, np.linalg.norm(a - b) / np.linalg.norm(a))
        assert tb == combine_argmax([(b[i], i) for i in [int(np.argmax(b))]])
        same += ta == tb
        token = ta                                       # teacher-forced by the unsplit step
    return worst, same


def test_split_matches_unsplit_up_to_the_partial_roundings(tiny):
    """Without activation quantization the split differs from the unsplit step only by the BF16
    rounding of each rank's partial; with it, each rank also takes its own row scales (FP8 per
    token, NVFP4 per-row global) over its slice, so quantization noise is drawn anew."""
    bp, weights = tiny
    plan = run_pipeline(bp, Options(tp=2))
    worst, same = _compare(bp, weights, plan, 6, no_act_quant.HANDLERS)
    assert worst < 2e-2 and same == 6
    # Quantized, the split is another draw of the quantization noise: its distance from the
    # unquantized step is that of the unsplit quantized step (median over positions: a router or
    # indexer top-k that flips on a near tie moves one position further).
    split_err, unsplit_err = _distances_from_unquantized(bp, weights, plan, 6)
    assert np.median(split_err) < 1.5 * np.median(unsplit_err)


def _distances_from_unquantized(bp, weights, plan, steps: int):
    quant, plain = Interpreter(bp, weights, steps + 1), Interpreter(bp, weights, steps + 1, no_act_quant.HANDLERS)
    ranked = RankedReference(plan, weights, steps + 1)
    token, split_err, unsplit_err = 1, [], []
    for _ in range(steps):
        (a, ta), (b, _), (c, _) = quant.step(token), plain.step(token), ranked.step(token)
        a, b, c = (np.asarray(x, np.float64).ravel() for x in (a, b, c))
        unsplit_err.append(np.linalg.norm(a - b) / np.linalg.norm(b))
        split_err.append(np.linalg.norm(c - b) / np.linalg.norm(b))
        token = ta
    return split_err, unsplit_err


def test_full_depth_shrink_splits_experts_by_intermediate(deep):
    """All 45 layers: every rank computes the unsplit heads before the first sum, each post-mix's
    partials add up to the unsplit sublayer output within their BF16 roundings, the ranks' streams
    stay identical (RankedReference checks it at every post-mix) and the logits stay finite."""
    bp, weights = deep
    plan = run_pipeline(bp, Options(tp=2))
    assert {l.layout for l in plan.parallel.experts} == {"tp"}
    assert len(plan.parallel.shards[0].partials) == 2 * len(bp.layers) == 90
    assert _head_values_match(bp, weights, plan, "l0.kda.") >= 8
    unsplit = Interpreter(bp, weights, 4, no_act_quant.HANDLERS)
    unsplit.keep_values = True
    ranked = RankedReference(plan, weights, 4, no_act_quant.HANDLERS)
    unsplit.step(5)
    logits, _ = ranked.step(5)
    assert np.isfinite(logits).all()
    first = next(n for n in bp.nodes() if n.op == "hc_post")
    branch = next(t for t in bp.inputs(first.order) if bp.node(t.src).op_base == "linear")
    full = np.asarray(unsplit.last_values[(branch.src, branch.id.rsplit(".", 1)[-1])], np.float64)
    parts = [np.asarray(p, np.float64) for p in ranked.partials[0]]
    bound = 2.0 ** -8 * (np.abs(full) + sum(np.abs(p) for p in parts))
    assert (np.abs(sum(parts) - full) <= bound).all()


def test_shards_read_only_their_ranges(tiny):
    bp, weights = tiny
    plan = run_pipeline(bp, Options(tp=2))
    shard = plan.parallel.shards[1]
    got = shard_weights(weights, shard)
    assert np.array_equal(got["head.lm_head.weight"], weights["head.lm_head.weight"][256:])
    assert np.array_equal(got["l0.kda.o.weight"], weights["l0.kda.o.weight"][:, 64:])
    assert got["head.final_norm.weight"] is weights["head.final_norm.weight"]
    bad = {**weights, "l0.kda.o.weight": weights["l0.kda.o.weight"][:, :8]}
    with pytest.raises(KbpcError, match="l0.kda.o.weight has shape"):
        shard_weights(bad, shard)


def test_a_rank_reads_its_shards_from_a_checkpoint(tiny, tmp_path):
    from kbpc.weights.checkpoint import write_checkpoint
    from kbpc.weights.shards import checkpoint_shards

    bp, weights = tiny
    plan = run_pipeline(bp, Options(tp=2))
    path = tmp_path / "tiny.safetensors"
    write_checkpoint(path, weights, list(plan.weights))
    full = {w.name: w for w in plan.weights}
    shard = plan.parallel.shards[1]
    want = shard_weights(weights, shard)
    got = dict(checkpoint_shards(path, [(full[w.name], w.shard) for w in shard.weights]))
    assert got.keys() == want.keys()
    assert all(np.array_equal(got[k], want[k]) for k in want)
    wrong = [(dataclasses.replace(full["l0.kda.o.weight"], shape=(256, 64)), None)]
    with pytest.raises(KbpcError, match="shape"):
        list(checkpoint_shards(path, wrong))
