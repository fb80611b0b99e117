"""Lowering of causal_conv1d_l2norm groups (glm_kda_conv_l2) on the tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import FloatLit, StatePtr, lit
from kbpc.codegen.context import LoweringError
from kbpc.codegen.families import causal_conv1d_l2norm as conv
from kbpc.testing.lowering import points_into, family_groups, planned, unwritten

BF = "__nv_bfloat16"


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path))


def test_block_threads():
    assert conv.block_threads(128) == 256 and conv.block_threads(64) == 256
    assert conv.block_threads(512) == 512 and conv.block_threads(32) == 256
    with pytest.raises(LoweringError):
        conv.block_threads(48)


def test_conv_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "causal_conv1d_l2norm")
    assert groups and {g.rule for g in groups} == {"glm_kda_conv_l2"}
    sym, c = plan.blueprint.symbols, plan.blueprint.config.constants
    state = [s.name for s in plan.state]
    for g in groups:
        (launch,) = conv.lower(ctx, g)
        conv_id = next(n for n in g.nodes if n.endswith("short_conv"))
        l2_id = next(n for n in g.nodes if n.endswith(".l2"))
        n = sym["lin_k_heads"] * sym["lin_k_dim"]
        channels = 2 * n + sym["lin_v_heads"] * sym["lin_v_dim"]
        w, dk = c.conv_width, sym["lin_k_dim"]
        assert launch.instance.kernel == (f"kbp::causal_conv1d_update_l2norm<{channels}, {2 * n}, {dk}, {w}, "
                                          f"256, {BF}>")
        assert launch.grid == (-(-channels // 256), 1, 1) and launch.block == (256, 1, 1) and launch.smem == 0
        assert launch.nodes == g.nodes
        x, xs, window, ws, taps, bias, eps, y, ys = launch.args
        pack = plan.blueprint.node(ctx.input(plan.blueprint.node_by_id[conv_id]).src)
        assert pack.op_base == "concat" and points_into(x, f"{pack.id}.qkv")
        assert xs == ys == lit(channels) and ws == lit(channels * w)
        assert window == StatePtr(state.index(conv_id + '.window'), conv_id + '.window', "float")
        assert taps == ctx.weight(conv_id, "conv_weight", BF) and bias == ctx.weight(conv_id, "conv_bias", BF)
        assert eps == FloatLit(c.l2_norm_eps)
        assert points_into(y, f"{l2_id}.qkvn")
        assert unwritten(plan, g, [launch]) == []
