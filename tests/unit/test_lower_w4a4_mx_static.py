"""Lowering of w4a4_mx_static groups (routed experts with a static activation scale, the
act_quant fused into the slot GEMV) on the tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.codegen.families import w4a4_mx_static
from kbpc.testing.instances import template_args
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


def _slots_instance(k):
    return ("const int*", "int", "const uint8_t*", "const uint8_t*", "const float*", *w4a4_mx_static.W_PARAMS)


def test_numerics_pick_the_slot_form(tiny_path):
    """Numerics exact runs the slot GEMV's exact form (FP64 chunk sums), fast its FP32 accumulation;
    both take slot_tiles(K, N) tiles a CTA, the grid covering N once."""
    for numerics in ("exact", "fast"):
        plan, ctx = planned(str(tiny_path), numerics=numerics)
        slots = [launch for g in family_groups(plan, "w4a4_mx_static") for launch in w4a4_mx_static.lower(ctx, g)
                 if "moe_slots" in launch.instance.kernel]
        assert slots
        for launch in slots:
            _, (k, *rest) = template_args(launch.instance.kernel)
            n = ctx.output(ctx.bp.node_by_id[launch.nodes[-1]]).dim_value
            tiles = w4a4_mx_static.slot_tiles(k, n)
            assert launch.instance.kernel == w4a4_mx_static.slots_instance(k, numerics == "fast", tiles).kernel
            assert launch.grid[0] * 16 * tiles == n


def test_fused_quant_then_slot_launches(tiny):
    """Blueprint groups {act_quant, expert}: the quantizer writes its scratch rows once, then the slot
    GEMV (one 16-row tile per CTA) reads them."""
    plan, ctx = tiny
    bp, top_k = plan.blueprint, plan.blueprint.symbols["top_k"]
    for g in family_groups(plan, "w4a4_mx_static"):
        quant_launch, slots = w4a4_mx_static.lower(ctx, g)
        quant = next(bp.node_by_id[n] for n in g.nodes if bp.node_by_id[n].op == "act_quant")
        expert = next(bp.node_by_id[n] for n in g.nodes if bp.node_by_id[n].op.startswith("expert_"))
        x, y = ctx.input(quant), ctx.output(expert)
        ids = next(t for t in ctx.inputs(expert) if t.format == "i32")
        k, n = x.dim_value, y.dim_value
        rows = (ctx.state(f"{quant.id}.codes", "uint8_t"), ctx.state(f"{quant.id}.scales", "uint8_t"),
                ctx.state(f"{quant.id}.g", "float"))
        assert quant_launch.instance.kernel == f"kbp::w4a4_quant_rows_static<{k}>"
        gate_up = expert.op == "expert_gate_up"
        assert quant_launch.grid == (1 if gate_up else top_k, -(-k // 256), 1)   # one value a thread
        assert quant_launch.args == (ctx.buf(x), ctx.weight_value(expert, "input_scale"), *rows)
        tiles = w4a4_mx_static.slot_tiles(k, n)
        assert slots.instance.kernel == f"kbp::w4a4_gemv_moe_slots<{k}, true, {tiles}>" and tiles == 2  # fast
        assert slots.instance.params == _slots_instance(k)
        assert slots.grid == (n // 32, top_k, 1) and slots.block == (256, 1, 1)
        assert slots.args == (ctx.buf(ids, "const int"), lit(top_k if gate_up else 1), *rows, ctx.weight(expert),
                              ctx.weight(expert, "weight_scale"), ctx.weight(expert, "weight_scale_2", "float"),
                              ctx.buf(y), lit(n))
        assert set(quant_launch.nodes) | set(slots.nodes) == set(g.nodes)
        assert unwritten(plan, g, [quant_launch, slots]) == []


def test_swiglu_fused_into_down(tiny_path):
    """Rule moe_swiglu_down (a default rule): the routed SwiGLU group joins the down projection's group; one
    launch writes the quantized SwiGLU rows (one per slot), the slot GEMV reads them (its form that
    reads the expert ids before its wait, w4a4_gemv_moe_slots_after_quant)."""
    plan = run_pipeline(load_blueprint(tiny_path), Options(add_fusions=("moe_swiglu_down",)))
    ctx = LowerCtx(plan)
    bp, top_k = plan.blueprint, plan.blueprint.symbols["top_k"]
    fused = [g for g in plan.groups if g.rule == "fused:moe_swiglu_down"]
    assert fused and all(g.family == "w4a4_mx_static" for g in fused)
    for g in fused:
        quant_launch, slots = w4a4_mx_static.lower(ctx, g)
        ops = {bp.node_by_id[n].op: bp.node_by_id[n] for n in g.nodes}
        assert set(ops) == {"swiglu_clamp", "silu_mul", "act_quant", "expert_down"}
        gu, expert, quant = ctx.input(ops["swiglu_clamp"]), ops["expert_down"], ops["act_quant"]
        k = ctx.output(ops["silu_mul"]).dim_value
        rows = (ctx.state(f"{quant.id}.codes", "uint8_t"), ctx.state(f"{quant.id}.scales", "uint8_t"),
                ctx.state(f"{quant.id}.g", "float"))
        assert quant_launch.instance.kernel == f"kbp::w4a4_quant_swiglu_rows_static<{k}>"
        assert quant_launch.grid == (-(-k // 256), top_k, 1) and ctx.rows(gu) == top_k and gu.dim_value == 2 * k
        assert quant_launch.args[0] == ctx.buf(gu, f"const {BF}") and quant_launch.args[3:] == rows
        assert quant_launch.args[1].value == pytest.approx(ctx.c.swiglu_limit)
        assert quant_launch.args[2] == ctx.weight_value(expert, "input_scale")
        # the down projection reads its ids before its wait: the quantizer triggers after its own
        n = ctx.output(expert).dim_value
        tiles = w4a4_mx_static.slot_tiles(k, n)
        assert slots.instance == w4a4_mx_static.slots_after_quant_instance(k, w4a4_mx_static.fast_form(ctx), tiles)
        assert slots.args[1:4] == rows and slots.grid == (n // (16 * tiles), top_k, 1)
        assert set(quant_launch.nodes) | set(slots.nodes) == set(g.nodes)
        assert unwritten(plan, g, [quant_launch, slots]) == []


def test_swiglu_in_the_gate_up_epilogue(tiny_path):
    """Rule moe_gate_up_swiglu (opt-in): the gate/up group, the routed SwiGLU group and the down
    group merge into three launches: the expert input's quantizer, the gate/up GEMV whose slots'
    last CTAs write the quantized SwiGLU rows into the down quantizer's scratch, the down GEMV."""
    plan = run_pipeline(load_blueprint(tiny_path), Options(add_fusions=("moe_gate_up_swiglu",)))
    ctx = LowerCtx(plan)
    bp, top_k = plan.blueprint, plan.blueprint.symbols["top_k"]
    fused = [g for g in plan.groups if g.rule == "fused:moe_gate_up_swiglu"]
    assert fused and all(g.family == "w4a4_mx_static" for g in fused)
    for g in fused:
        first, gate_up, slots = w4a4_mx_static.lower(ctx, g)
        nodes = [bp.node_by_id[n] for n in g.nodes]
        assert sorted(n.op for n in nodes) == sorted(("act_quant", "expert_gate_up", "swiglu_clamp", "silu_mul",
                                                      "act_quant", "expert_down"))
        gu_node = next(n for n in nodes if n.op == "expert_gate_up")
        act = next(n for n in nodes if n.op == "silu_mul")
        down = next(n for n in nodes if n.op == "expert_down")
        dq = bp.node(ctx.output(act).dst)
        i, k = ctx.output(act).dim_value, ctx.input(gu_node).dim_value
        rows = (ctx.state(f"{dq.id}.codes", "uint8_t"), ctx.state(f"{dq.id}.scales", "uint8_t"),
                ctx.state(f"{dq.id}.g", "float"))
        assert first.instance.kernel == f"kbp::w4a4_quant_rows_static<{k}>"
        assert gate_up.instance.kernel == f"kbp::w4a4_gemv_moe_gate_up_swiglu<{k}, {i}>"
        assert gate_up.grid == (2 * i // 16, top_k, 1) and gate_up.args[1] == lit(top_k)
        assert gate_up.args[8] == ctx.state(f"{gu_node.id}.rows", BF)
        assert gate_up.args[9].value == pytest.approx(ctx.c.swiglu_limit)
        assert gate_up.args[10] == ctx.weight_value(down, "input_scale") and gate_up.args[11:14] == rows
        assert gate_up.args[14] == ctx.state(f"{gu_node.id}.arrive", "unsigned int")
        assert slots.instance.kernel == f"kbp::w4a4_gemv_moe_slots<{i}, true, 2>" and slots.args[1] == lit(1)
        assert slots.args[2:5] == rows and slots.nodes == (down.id,)
        assert unwritten(plan, g, [first, gate_up, slots]) == []
