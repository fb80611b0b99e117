"""Lowering of w8a8_act_quant groups (per-token FP8 quantization) on the tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import lit
from kbpc.codegen.families import w8a8_act_quant
from kbpc.testing.lowering import family_groups, planned, unwritten


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path))


def test_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "w8a8_act_quant")
    assert {g.rule for g in groups} == {"w8a8_act_quant_row"}
    for g in groups:
        (launch,) = w8a8_act_quant.lower(ctx, g)
        node = plan.blueprint.node_by_id[g.nodes[0]]
        x, q = ctx.input(node), ctx.output(node)
        out = ctx.quant(q)
        assert launch.instance.kernel == f"kbp::w8a8_act_quant_row<{x.dim_value}>"
        assert launch.instance.params == ("const __nv_bfloat16*", "uint8_t*", "float*")
        assert launch.grid == (ctx.rows(x), 1, 1) and launch.block == (256, 1, 1) and launch.smem == 0
        assert launch.args == (ctx.buf(x), out.codes, out.scales)
        assert unwritten(plan, g, [launch]) == []
