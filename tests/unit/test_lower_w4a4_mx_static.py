"""Lowering of w4a4_mx_static groups (routed experts with a static activation scale, the
act_quant fused into the slot GEMV) on the tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import lit
from kbpc.codegen.families import w4a4_mx_static
from kbpc.testing.lowering import family_groups, planned, unwritten

BF = "__nv_bfloat16"


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path))


def test_rules(tiny):
    plan, _ = tiny
    rules = {g.rule for g in family_groups(plan, "w4a4_mx_static")}
    assert rules == {"glm_moe_w4a4_cs_gate_up_1_dsa", "glm_moe_w4a4_cs_down_1_dsa",
                     "glm_moe_w4a4_cs_gate_up_1_kda", "glm_moe_w4a4_cs_down_1_kda"}


def test_fused_slot_launches(tiny):
    plan, ctx = tiny
    bp, top_k = plan.blueprint, plan.blueprint.symbols["top_k"]
    for g in family_groups(plan, "w4a4_mx_static"):
        (launch,) = w4a4_mx_static.lower(ctx, g)
        quant = next(bp.node_by_id[n] for n in g.nodes if bp.node_by_id[n].op == "act_quant")
        expert = next(bp.node_by_id[n] for n in g.nodes if bp.node_by_id[n].op.startswith("expert_"))
        x, y = ctx.input(quant), ctx.output(expert)
        ids = next(t for t in ctx.inputs(expert) if t.format == "i32")
        k, n = x.dim_value, y.dim_value
        assert launch.instance.kernel == f"kbp::w4a4_gemv_moe_slots_bf16<{k}>"
        assert launch.grid == (n // 16, top_k, 1) and launch.block == (256, 1, 1)
        gate_up = expert.op == "expert_gate_up"
        assert launch.args[1] == lit(top_k if gate_up else 1)   # shared row vs one row per slot
        assert ctx.rows(x) == (1 if gate_up else top_k)
        assert launch.args == (ctx.buf(ids, "const int"), launch.args[1], ctx.buf(x),
                               ctx.weight_value(expert, "input_scale"), ctx.weight(expert),
                               ctx.weight(expert, "weight_scale"), ctx.weight(expert, "weight_scale_2", "float"),
                               ctx.buf(y), lit(n))
        assert launch.instance.params[3] == "float" and launch.instance.params[6] == "const float*"
        assert set(launch.nodes) == set(g.nodes)
        assert unwritten(plan, g, [launch]) == []
