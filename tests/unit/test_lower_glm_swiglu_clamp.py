"""Lowering of glm_swiglu_clamp groups (clamp + act as one launch) on the tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import NULL, lit
from kbpc.codegen.context import flt
from kbpc.codegen.families import glm_swiglu_clamp
from kbpc.testing.lowering import family_groups, planned, unwritten

BF = "__nv_bfloat16"


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path))


def test_swiglu_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "glm_swiglu_clamp")
    assert {g.rule for g in groups} == {"glm_swiglu_clamp"} and len(groups) == 3
    sym = plan.blueprint.symbols
    routed = 0
    for g in groups:
        (launch,) = glm_swiglu_clamp.lower(ctx, g)
        clamp, act = ctx.node(g, "swiglu_clamp"), ctx.node(g, "silu_mul")
        gu, y = ctx.input(clamp), ctx.output(act)
        inter = y.dim_value
        rows = sym["top_k"] if clamp.id.endswith("experts_clamp") else 1   # routed rows are slots
        routed += rows > 1
        assert launch.instance.kernel == f"kbp::swiglu_clamp<{inter}, 8, kbp::SwiGluOut::kBF16, false>"
        assert launch.nodes == (clamp.id, act.id)
        assert (launch.grid, launch.block, launch.smem) == ((-(-inter // 1024), rows, 1), (128, 1, 1), 0)
        gate = ctx.buf(gu, f"const {BF}")
        assert launch.args == (gate, gate.plus(inter), lit(2 * inter), ctx.buf(y, "void"), lit(inter),
                               flt(ctx.c.swiglu_limit), NULL, lit(0))
        assert unwritten(plan, g, [launch]) == []
    assert routed == 2
