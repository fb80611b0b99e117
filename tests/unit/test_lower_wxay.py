"""Lowering of wxay groups (FP8 rowscale GEMVs: single and split with a by-value table) on the
tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import Aggregate, lit
from kbpc.codegen.families import wxay
from kbpc.testing.lowering import family_groups, planned, unwritten

RULES = {"glm_w8a8_dsa_proj_in_split4", "glm_w8a8_dsa_mb1_ku8", "glm_w8a8_index_kgate_1row"}


@pytest.fixture(scope="module", params=["fast", "exact"])
def tiny(tiny_path, request):
    return planned(str(tiny_path), numerics=request.param)


def test_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "wxay")
    assert {g.rule for g in groups} == RULES
    for g in groups:
        launches = wxay.lower(ctx, g)
        nodes = [plan.blueprint.node_by_id[n] for n in g.nodes]
        x = ctx.input(nodes[0])
        k, a = x.dim_value, ctx.quant(x)
        (launch,) = launches
        ns = [ctx.output(n).dim_value for n in nodes]
        exact = ", true" if plan.options.numerics == "exact" else ""   # the FP64 chunk-sum form
        assert launch.grid == (sum(n // 16 for n in ns), 1, 1) and launch.block == (256, 1, 1)
        if len(nodes) == 1:
            node, y = nodes[0], ctx.output(nodes[0])
            assert launch.instance.kernel == f"kbp::wxay_rowscale<{k}{exact}>"
            assert launch.args == (a.codes, a.scales, ctx.weight(node), ctx.weight(node, "weight_scale", "float"),
                                   ctx.buf(y), lit(y.dim_value))
        else:
            assert g.rule == "glm_w8a8_dsa_proj_in_split4"
            assert launch.instance.kernel == f"kbp::wxay_rowscale_split_list<{k}, {len(nodes)}{exact}>"
            assert launch.instance.params == (f"kbp::WxaySegList<{len(nodes)}>", "const uint8_t*", "const float*")
            assert launch.args[1:] == (a.codes, a.scales)
            for node, n in zip(nodes, ns):
                seg = Aggregate("kbp::WxaySeg", (ctx.weight(node), ctx.weight(node, "weight_scale", "float"),
                                                 ctx.buf(ctx.output(node)), lit(n), lit(0)))
                assert seg in launch.args[0].fields[0].fields
        assert unwritten(plan, g, launches) == []
