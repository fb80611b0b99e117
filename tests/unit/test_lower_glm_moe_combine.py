"""Lowering of glm_moe_combine groups (glm_moe_combine_kda / _dsa) on the tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import NULL, lit
from kbpc.codegen.families import glm_moe_combine
from kbpc.testing.lowering import points_into, family_groups, planned, unwritten

BF = "__nv_bfloat16"


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path))


def test_combine_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "glm_moe_combine")
    assert {g.rule for g in groups} == {"glm_moe_combine_kda", "glm_moe_combine_dsa"}
    for g in groups:
        (launch,) = glm_moe_combine.lower(ctx, g)
        node = ctx.node(g, "blend")
        y = ctx.output(node)
        d, k = y.dim_value, plan.blueprint.symbols["top_k"]
        assert launch.instance.kernel == f"kbp::moe_combine<{d}, {k}, 8>"
        assert (launch.grid, launch.block, launch.smem) == ((-(-d // 512), 1, 1), (64, 1, 1), 0)
        w, ids, slot_rows, routed, shared, out = launch.args
        layer = node.id.rsplit(".", 1)[0]
        assert points_into(w, f"{layer}.top_k.topk_w")
        assert (ids, slot_rows) == (NULL, NULL)   # every slot summed, as the reference
        assert points_into(routed, f"{layer}.experts_down.edown")
        assert points_into(shared, f"{layer}.shared_down.sdown")
        assert out == ctx.buf(y)
        assert unwritten(plan, g, [launch]) == []
