"""Lowering of w4a4_mx groups (dense MLP: act quant, gate_up, down) on the tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import lit
from kbpc.codegen.context import LoweringError
from kbpc.codegen.families import w4a4_mx, w4a4_mx_static
from kbpc.testing.lowering import family_groups, planned, unwritten

RULES = {"w4a4_act_quant", "w4a4_gate_up_1_8", "w4a4_down_1_8"}


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path))


def test_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "w4a4_mx")
    assert {g.rule for g in groups} == RULES
    for g in groups:
        (launch,) = w4a4_mx.lower(ctx, g)
        node = plan.blueprint.node_by_id[g.nodes[0]]
        x, y = ctx.input(node), ctx.output(node)
        k = x.dim_value
        assert launch.block == (256, 1, 1) and launch.smem == 0
        if g.rule == "w4a4_act_quant":
            q = ctx.quant(y)
            assert launch.instance.kernel == f"kbp::w4a4_quant_rows<{k}>"
            assert launch.grid == (ctx.rows(x), -(-k // 256), 1)   # one value a thread
            assert launch.args == (ctx.buf(x), q.codes, q.scales, q.globals)
        else:
            a = ctx.quant(x)
            n = y.dim_value
            assert launch.instance.kernel == f"kbp::w4a4_gemv<{k}, true>"   # numerics fast: FP32 sums
            assert launch.grid == (n // 16, 1, 1)
            assert launch.args == (a.codes, a.scales, a.globals, ctx.weight(node),
                                   ctx.weight(node, "weight_scale"), ctx.weight_value(node, "weight_scale_2"),
                                   ctx.buf(y), lit(n))
            assert launch.instance.params[5] == "float"   # s_g is a host value
        assert unwritten(plan, g, [launch]) == []


def test_rows_beyond_the_staging_limit_are_refused(tiny, monkeypatch):
    """A K whose activation staging would not fit static shared memory is a lowering error naming the
    node, not a kernel that fails to compile (the limit is lowered here so the tiny blueprint's K
    exceeds it)."""
    plan, ctx = tiny
    monkeypatch.setattr(w4a4_mx, "MAX_K", 64)
    monkeypatch.setattr(w4a4_mx_static, "MAX_K", 64)
    gemv = next(g for g in family_groups(plan, "w4a4_mx") if g.rule != "w4a4_act_quant")
    with pytest.raises(LoweringError, match="stages at most K = 64"):
        w4a4_mx.lower(ctx, gemv)
    expert = family_groups(plan, "w4a4_mx_static")[0]
    with pytest.raises(LoweringError, match="stages at most K = 64"):
        w4a4_mx_static.lower(ctx, expert)
