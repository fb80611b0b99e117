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
