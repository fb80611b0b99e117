"""Lowering of dsa_indexer groups (glm_index_store, glm_index_select_persisted) on the tiny
blueprint, and the template sizes on the seed."""
from __future__ import annotations

import dataclasses

import pytest

from kbpc.codegen.args import StepInput, lit
from kbpc.codegen.context import LowerCtx, LoweringError
from kbpc.codegen.families import dsa_indexer
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options, StateBuffer
from kbpc.passes import run_pipeline
from kbpc.ir.buffers import buffer_name


def with_scratch(plan):
    """The select group's scratch state (scores, pool ids), added if plan_memory lacks it."""
    bp, have = plan.blueprint, {s.name for s in plan.state}
    kp = bp.symbols["index_kpool"]
    pools, topk = -(-plan.options.max_context // kp), bp.symbols["index_topk"] // kp
    extra = []
    for node in bp.nodes():
        if node.op == "index_select":
            scores, sel_pools = dsa_indexer.scratch_names(node.id)
            if scores not in have:
                extra.append(StateBuffer(scores, pools * 4, (pools,), "f32"))
            if sel_pools not in have:
                extra.append(StateBuffer(sel_pools, topk * 4, (topk,), "i32"))
    return dataclasses.replace(plan, state=plan.state + tuple(extra))


def _plan(path):
    plan = with_scratch(run_pipeline(load_blueprint(path), Options(target="sm_90")))
    return plan, LowerCtx(plan)


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return _plan(tiny_path)


def groups(plan, rule):
    found = [g for g in plan.groups if g.family == "dsa_indexer" and g.rule == rule]
    assert found, rule
    return found


def test_every_rule_is_covered(tiny):
    plan, _ = tiny
    assert {g.rule for g in plan.groups if g.family == "dsa_indexer"} == {
        "glm_index_store", "glm_index_select_persisted"}


def test_store(tiny):
    plan, ctx = tiny
    sym = plan.blueprint.symbols
    d, kp = sym["index_head_dim"], sym["index_kpool"]
    for g in groups(plan, "glm_index_store"):
        (launch,) = dsa_indexer.lower(ctx, g)
        node = ctx.node(g, "kpool_compress")
        assert launch.instance.kernel == f"kbp::dsa_indexer_store<{d}, {kp}>"
        assert (launch.grid, launch.block) == ((1, 1, 1), (d, 1, 1))
        assert len(launch.args) == len(launch.instance.params) == 8
        key, gate, a, keys, gates, rows, pool_keys, tau = launch.args
        assert key == ctx.buf(ctx.input(node, op="layer_norm"))
        assert gate == ctx.buf(ctx.input(node, op="linear"))
        assert a == ctx.weight(node, "slot_bias", ctype="float")
        assert keys == ctx.state(f"{node.id}.tail_keys", "__nv_bfloat16")
        assert gates == ctx.state(f"{node.id}.tail_gates", "__nv_bfloat16")
        assert rows == lit(kp) and tau == StepInput("POS")
        assert pool_keys == ctx.state(f"{node.id}.pool_keys", "float")


def test_select(tiny):
    plan, ctx = tiny
    sym = plan.blueprint.symbols
    h, d, kp = sym["index_heads"], sym["index_head_dim"], sym["index_kpool"]
    topk = sym["index_topk"] // kp
    for g in groups(plan, "glm_index_select_persisted"):
        scores_l, topk_l = dsa_indexer.lower(ctx, g)
        node = ctx.node(g, "index_select")
        pool = next(n for n in plan.blueprint.nodes() if n.op == "kpool_compress" and n.block == node.block)
        scores_name, pools_name = dsa_indexer.scratch_names(node.id)
        scores, sel_pools = ctx.state(scores_name, "float"), ctx.state(pools_name, "int32_t")
        assert scores_l.instance.kernel == f"kbp::dsa_index_scores<{h}, {d}, {kp}>"
        assert scores_l.grid == (-(-plan.options.max_context // kp // 128), 1, 1) and scores_l.block == (128, 1, 1)
        assert scores_l.args == (ctx.buf(ctx.input(node, "iq"), "float"), ctx.buf(ctx.input(node, "iw"), "float"),
                                 ctx.state(f"{pool.id}.pool_keys", "float"), StepInput("SEQ"), StepInput("POS"), scores)
        assert topk_l.instance.kernel == f"kbp::dsa_topk_select<{kp}, {topk}>"
        assert (topk_l.grid, topk_l.block) == ((1, 1, 1), (1024, 1, 1))
        sel = ctx.output(node)
        assert topk_l.args == (scores, StepInput("SEQ"), StepInput("POS"), sel_pools, ctx.buf(sel, "int32_t"))
        assert buffer_name(plan.blueprint, sel) in {b.name for b in plan.buffers}


def test_seed_sizes(seed_path):
    plan, ctx = _plan(seed_path)
    kernels = {l.instance.kernel for g in plan.groups if g.family == "dsa_indexer" for l in dsa_indexer.lower(ctx, g)}
    assert kernels == {"kbp::dsa_indexer_store<128, 4>", "kbp::dsa_index_scores<32, 128, 4>",
                       "kbp::dsa_topk_select<4, 512>"}
