"""Lowering of kda_o_norm groups (glm_kda_o_norm) on the tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.families import kda_o_norm
from kbpc.testing.lowering import arena_ref, family_groups, planned, unwritten

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
        assert arena_ref(plan, f"{layer}.recur.core") in o and o.startswith("((float*)")
        assert arena_ref(plan, f"{layer}.g_b.g") in z
        assert w == ctx.weight(node_id, ctype=BF) and whs == "0"      # gamma (D,) shared by the heads
        assert eps == f"{c.kda_norm_eps!r}f"
        assert arena_ref(plan, f"{node_id}.gated") in y
        assert os_ == zs == ys == str(h * d)
        assert unwritten(plan, g, [launch]) == []
