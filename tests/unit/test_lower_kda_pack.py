"""Lowering of kda_pack groups (glm_kda_pack) on the tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import lit
from kbpc.codegen.families import kda_pack
from kbpc.testing.lowering import points_into, family_groups, planned, unwritten

BF = "__nv_bfloat16"


@pytest.fixture(scope="module")
def tiny(tiny_path):
    """Every buffer its own bytes: the pack's inputs are not written in place, so it copies."""
    return planned(str(tiny_path), arena_reuse=False)


def test_a_pack_written_in_place_launches_nothing(tiny_path):
    plan, ctx = planned(str(tiny_path))
    groups = family_groups(plan, "kda_pack")
    assert groups and all(kda_pack.lower(ctx, g) == [] for g in groups)


def test_copy_unit_and_blocks():
    assert kda_pack.pack_vec(8192, 8192, 8192) == 8 and kda_pack.pack_blocks(8192, 8192, 8192) == 12
    assert kda_pack.pack_vec(6, 4, 2) == 2 and kda_pack.pack_vec(3, 8, 8) == 1
    assert kda_pack.pack_blocks(3, 64, 3) == 1 and kda_pack.pack_blocks(300, 1, 1) == 2


def test_pack_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "kda_pack")
    assert groups and {g.rule for g in groups} == {"glm_kda_pack"}
    for g in groups:
        (launch,) = kda_pack.lower(ctx, g)
        node = plan.blueprint.node_by_id[g.nodes[0]]
        q, k, v = plan.blueprint.inputs(node.order)
        n = q.dim_value
        assert launch.instance.kernel == f"kbp::kda_pack_qkv_bf16<{n}, {n}, {n}, 256>"
        assert launch.instance.params[:3] == (f"const {BF}*",) * 3 and launch.instance.params[6] == f"{BF}*"
        assert launch.grid == (-(-3 * n // 8 // 256), 1, 1) and launch.block == (256, 1, 1) and launch.smem == 0
        for arg, t in zip(launch.args[:3], (q, k, v)):   # q, k, v in the reference's order
            assert arg == ctx.buf(t)
        assert launch.args[3:6] == (lit(n),) * 3 and launch.args[7] == lit(3 * n)
        assert points_into(launch.args[6], f"{node.id}.qkv")
        assert unwritten(plan, g, [launch]) == []
