"""Lowering of layer_norm groups (glm_index_k_norm) on the tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import FloatLit, lit
from kbpc.codegen.families import layer_norm
from kbpc.testing.lowering import points_into, family_groups, planned, unwritten

BF = "__nv_bfloat16"


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path))


def test_block_threads_is_the_references_rule():
    assert [layer_norm.block_threads(d) for d in (1, 100, 128, 129, 5000)] == [32, 128, 128, 256, 1024]


def test_layer_norm_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "layer_norm")
    assert groups and {g.rule for g in groups} == {"glm_index_k_norm"}
    c = plan.blueprint.config.constants
    for g in groups:
        (launch,) = layer_norm.lower(ctx, g)
        (node_id,) = g.nodes
        node = plan.blueprint.node_by_id[node_id]
        (x_edge,) = plan.blueprint.inputs(node.order)
        d = x_edge.dim_value
        assert launch.instance.kernel == f"kbp::layer_norm_bf16<{d}, {layer_norm.block_threads(d)}>"
        assert launch.grid == (1, 1, 1) and launch.block == (layer_norm.block_threads(d), 1, 1)
        x, xs, w, b, eps, y, ys = launch.args
        assert x == ctx.buf(x_edge) and xs == ys == lit(d)
        assert w == ctx.weight(node_id, ctype=BF) and b == ctx.weight(node_id, "bias", BF)
        assert eps == FloatLit(c.layer_norm_eps)
        assert points_into(y, f"{node_id}.ikn")
        assert unwritten(plan, g, [launch]) == []
