"""Lowering of glm_router_topk groups (glm_router_topk_rank_kda / _dsa) on the tiny blueprint."""
from __future__ import annotations

import dataclasses

import pytest

from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.families import glm_router_topk
from kbpc.testing.lowering import points_into, family_groups, planned, unwritten


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path))


def test_router_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "glm_router_topk")
    assert {g.rule for g in groups} == {"glm_router_topk_rank_kda", "glm_router_topk_rank_dsa"}
    for g in groups:
        (launch,) = glm_router_topk.lower(ctx, g)
        node = ctx.node(g, "top_k")
        e, k = ctx.input(node).dim_value, plan.blueprint.symbols["top_k"]
        assert launch.instance.kernel == f"kbp::router_topk<{e}, {k}>"
        assert (launch.grid, launch.block, launch.smem) == ((1, 1, 1), (32 * -(-e // 32), 1, 1), 0)
        z, bias, scale, w, ids = launch.args
        assert z == ctx.buf(ctx.input(node), "const float")
        assert bias == ctx.weight(node, "e_score_correction_bias", "float")
        assert scale == flt(ctx.c.routed_scale)
        assert points_into(w, f"{node.id}.topk_w") and w.ctype == "float"
        assert points_into(ids, f"{node.id}.topk_id") and ids.ctype == "int"
        assert unwritten(plan, g, [launch]) == []


def test_threads():
    assert [glm_router_topk.router_threads(e) for e in (8, 32, 33, 288)] == [32, 32, 64, 288]


def test_renorm_eps_must_match_the_kernel(tiny):
    plan, _ = tiny
    c = dataclasses.replace(plan.blueprint.config.constants, router_renorm_eps=1e-6)
    ctx = LowerCtx(plan)
    ctx.c = c
    with pytest.raises(LoweringError, match="router_renorm_eps"):
        glm_router_topk.lower(ctx, family_groups(plan, "glm_router_topk")[0])


# ------------------------------------------------------------------ fused:router_gemv_topk

@pytest.fixture(scope="module")
def tiny_default(tiny_path):
    """The default plan: router_gemv_topk merges every MoE block's router GEMV into its top-k."""
    from kbpc.frontend.load import load_blueprint
    from kbpc.ir.plan import Options
    from kbpc.passes import run_pipeline
    plan = run_pipeline(load_blueprint(tiny_path), Options())
    return plan, LowerCtx(plan)


def test_fused_router_launch(tiny_default):
    plan, ctx = tiny_default
    groups = [g for g in family_groups(plan, "glm_router_topk") if g.rule == "fused:router_gemv_topk"]
    assert groups and len(groups) == len(family_groups(plan, "glm_router_topk"))
    for g in groups:
        (launch,) = glm_router_topk.lower(ctx, g)
        router, node = ctx.node(g, "router"), ctx.node(g, "top_k")
        x = ctx.input(router)
        h, e, k = x.dim_value, ctx.input(node).dim_value, plan.blueprint.symbols["top_k"]
        opc = glm_router_topk.fused_outputs_per_cta(e)
        assert launch.instance.kernel == f"kbp::router_gemv_topk<{h}, {e}, {k}, {opc}>"
        assert launch.instance == glm_router_topk.fused_instance(h, e, k)
        assert (launch.grid, launch.block, launch.smem) == ((-(-e // opc), 1, 1), (64 * opc, 1, 1), 0)
        assert launch.nodes == (router.id, node.id)
        w_router, xs, bias, scale, logits, arrive, w, ids = launch.args
        assert w_router == ctx.weight(router, ctype="__nv_bfloat16")
        assert w_router.name == f"{router.id}.weight"
        assert xs == ctx.buf(x)
        assert bias == ctx.weight(node, "e_score_correction_bias", "float")
        assert scale == flt(ctx.c.routed_scale)
        # the logits edge is internal to the group: the top-k's scratch state holds them
        assert logits == ctx.state(f"{node.id}.logits", "float")
        assert arrive == ctx.state(f"{node.id}.arrive", "unsigned int")
        assert points_into(w, f"{node.id}.topk_w") and w.ctype == "float"
        assert points_into(ids, f"{node.id}.topk_id") and ids.ctype == "int"
        assert unwritten(plan, g, [launch]) == []


def test_fused_state_sizes(tiny_default):
    plan, _ = tiny_default
    state = {s.name: s for s in plan.state}
    for node in (n for n in plan.blueprint.nodes() if n.op == "top_k"):
        e = plan.blueprint.inputs(node.order)[0].dim_value
        assert state[f"{node.id}.logits"].shape == (1, e) and state[f"{node.id}.logits"].nbytes == 4 * e
        assert state[f"{node.id}.arrive"].nbytes == 4


@pytest.mark.parametrize("e", [1, 8, 33, 128, 256, 288, 512, 700, 1024])
def test_fused_outputs_per_cta(e):
    """At least the dense GEMV's outputs per CTA; more only until the top-k's CTA plays at most 4
    experts a thread (or it has 256 threads)."""
    from kbpc.codegen.families.dense_bf16 import outputs_per_cta
    opc = glm_router_topk.fused_outputs_per_cta(e)
    assert opc in (1, 2, 4) and opc >= outputs_per_cta(e)
    assert opc == 4 or 4 * 64 * opc >= glm_router_topk.router_threads(e)
    assert opc == outputs_per_cta(e) or 4 * 32 * opc < glm_router_topk.router_threads(e)
    assert {128: 1, 288: 2, 1024: 4}.get(e, opc) == opc


def test_fused_refuses_other_renorm_eps(tiny_default):
    plan, _ = tiny_default
    ctx = LowerCtx(plan)
    ctx.c = dataclasses.replace(plan.blueprint.config.constants, router_renorm_eps=1e-6)
    g = next(g for g in family_groups(plan, "glm_router_topk") if g.rule == "fused:router_gemv_topk")
    with pytest.raises(LoweringError, match="router_renorm_eps"):
        glm_router_topk.lower(ctx, g)
