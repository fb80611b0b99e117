"""Lowering of kda_o_norm groups (glm_kda_o_norm) on the tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import FloatLit, lit
from kbpc.codegen.families import kda_o_norm
from kbpc.testing.lowering import points_into, family_groups, planned, unwritten

BF = "__nv_bfloat16"


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path))


def test_o_norm_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "kda_o_norm")
    assert groups and {g.rule for g in groups} == {"glm_kda_o_norm"}
    sym, c = plan.blueprint.symbols, plan.blueprint.config.constants
    h, d = sym["lin_v_heads"], sym["lin_v_dim"]
    for g in groups:
        (launch,) = kda_o_norm.lower(ctx, g)
        (node_id,) = g.nodes
        layer = node_id.rsplit(".", 1)[0]
        assert launch.instance.kernel == f"kbp::kda_o_norm_gated_bf16<{h}, {d}>"
        assert launch.grid == (h, 1, 1) and launch.block == (d, 1, 1) and launch.smem == 0
        o, os_, z, zs, w, whs, eps, y, ys = launch.args
        assert points_into(o, f"{layer}.recur.core") and o.ctype == "float"
        assert points_into(z, f"{layer}.g_b.g")
        assert w == ctx.weight(node_id, ctype=BF) and whs == lit(0)      # gamma (D,) shared by the heads
        assert eps == FloatLit(c.kda_norm_eps)
        assert points_into(y, f"{node_id}.gated")
        assert os_ == zs == ys == lit(h * d)
        assert unwritten(plan, g, [launch]) == []
