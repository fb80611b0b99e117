"""Rules moe_gate_up_pair, moe_expert_flow, moe_gate_up_flow and moe_experts on the tiny blueprint: which groups merge (before/after),
the launches kbpc/codegen/families/moe_experts.py makes of them and their arguments, and the
refusals when the merged nodes do not fit the kernels."""
from __future__ import annotations

import dataclasses

import pytest

from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families import moe_experts
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.testing.lowering import unwritten

BF = "__nv_bfloat16"
ROUTED = ("router", "top_k", "act_quant", "expert_gate_up", "swiglu_clamp", "silu_mul", "act_quant", "expert_down")
SHARED = ("linear:shared_gate_up", "swiglu_clamp", "silu_mul", "linear:shared_down")


def _plan(tiny_path, *rules, numerics="fast"):
    plan = run_pipeline(load_blueprint(tiny_path), Options(add_fusions=rules, numerics=numerics))
    return plan, LowerCtx(plan)


def _merged_routed_groups(plan, rule):
    """The groups of `rule`, each holding the router's and the routed experts' whole chain (no
    router_expert_quant or moe_swiglu_down group left)."""
    fused = [g for g in plan.groups if g.rule == rule]
    assert fused and all(g.family == "moe_experts" and _ops(plan, g) == sorted(ROUTED) for g in fused)
    assert not any(g.rule in ("fused:router_expert_quant", "fused:moe_swiglu_down") for g in plan.groups)
    return fused


def _down_input_rows(ctx, act):
    """The down input quantizer's scratch rows (codes, scales, global scale) after silu_mul `act`."""
    dq = ctx.bp.node(ctx.output(act).dst)
    return (ctx.state(f"{dq.id}.codes", "uint8_t"), ctx.state(f"{dq.id}.scales", "uint8_t"),
            ctx.state(f"{dq.id}.g", "float"))


def _ops(plan, g):
    return sorted(plan.blueprint.node_by_id[n].op for n in g.nodes)


def test_default_plan_keeps_the_moe_groups_apart(tiny_path):
    """Before: both rules are opt-in; the default rules make the router + gate/up group and the
    SwiGLU + down group, the shared expert a group of its own."""
    plan, _ = _plan(tiny_path)
    rules = {g.rule for g in plan.groups}
    assert "fused:router_expert_quant" in rules and "fused:moe_swiglu_down" in rules
    assert not any(g.family == "moe_experts" for g in plan.groups)
    refused = {f.rule: f.reason for f in plan.fusions if not f.applied}
    assert "opt-in (--fuse-rule moe_experts)" in refused["moe_experts"]


@pytest.mark.parametrize("numerics,fast", [("exact", ""), ("fast", ", true")])
def test_gate_up_pair(tiny_path, numerics, fast):
    """After moe_gate_up_pair: one group per MoE layer holds the router, its top-k, the experts' input
    quantizer, the routed gate/up, the SwiGLU with the down input's quantizer and the routed down; it
    lowers to the fused router, one pair launch writing the down input's scratch rows and the slot
    GEMV reading them (the shared expert stays apart)."""
    plan, ctx = _plan(tiny_path, "moe_gate_up_pair", numerics=numerics)
    bp, top_k = plan.blueprint, plan.blueprint.symbols["top_k"]
    fused = _merged_routed_groups(plan, "fused:moe_gate_up_pair")
    for g in fused:
        route, pair, down = moe_experts.lower(ctx, g)
        nodes = {bp.node_by_id[n].op: bp.node_by_id[n] for n in g.nodes if bp.node_by_id[n].op != "act_quant"}
        gate_up, act = nodes["expert_gate_up"], nodes["silu_mul"]
        k, i = ctx.input(gate_up).dim_value, ctx.output(act).dim_value
        rows = _down_input_rows(ctx, act)
        assert route.instance.kernel.startswith(("kbp::router_gemv_topk_quant<", "kbp::router_cluster_topk_quant<"))
        assert pair.instance.kernel == f"kbp::moe_gate_up_pair<{k}, {i}{fast}>"
        assert pair.grid == (i // 16, top_k, 1) and pair.block == moe_experts.PAIR_BLOCK
        assert pair.args[1] == lit(top_k) and pair.args[2:5] == route.args[-3:]   # the router's quantized row
        assert pair.args[8].value == pytest.approx(ctx.c.swiglu_limit)
        assert pair.args[10:] == rows
        assert down.instance.kernel == f"kbp::w4a4_gemv_moe_slots<{i}, {'true' if fast else 'false'}, 2>"
        assert down.args[1] == lit(1) and down.args[2:5] == rows
        assert set(route.nodes) | set(pair.nodes) | set(down.nodes) == set(g.nodes)
        assert unwritten(plan, g, [route, pair, down]) == []


@pytest.mark.parametrize("numerics,fast", [("exact", "false"), ("fast", "true")])
def test_expert_flow(tiny_path, numerics, fast):
    """After moe_expert_flow: the same merged group as moe_gate_up_pair, lowered to the fused router
    and one flow launch whose 1-D grid holds every slot's gate/up tiles, SwiGLU quantizer CTAs and
    down tiles; it writes the down input's scratch rows and the down's output buffer, and takes the
    gate/up node's words and sync state."""
    plan, ctx = _plan(tiny_path, "moe_expert_flow", numerics=numerics)
    bp, top_k = plan.blueprint, plan.blueprint.symbols["top_k"]
    fused = _merged_routed_groups(plan, "fused:moe_expert_flow")
    for g in fused:
        route, flow = moe_experts.lower(ctx, g)
        nodes = {bp.node_by_id[n].op: bp.node_by_id[n] for n in g.nodes if bp.node_by_id[n].op != "act_quant"}
        gate_up, act, down = nodes["expert_gate_up"], nodes["silu_mul"], nodes["expert_down"]
        k, i, n = ctx.input(gate_up).dim_value, ctx.output(act).dim_value, ctx.output(down).dim_value
        rows = _down_input_rows(ctx, act)
        tiles = 2 if n % 32 == 0 else 1
        assert flow.instance.kernel == f"kbp::moe_expert_flow<{k}, {i}, {n}, {fast}, {tiles}>"
        units = 2 * i // 16 + -(-i // 256) + n // (16 * tiles)
        assert flow.grid == (top_k * units, 1, 1) and flow.block == (256, 1, 1)
        assert flow.args[1] == lit(top_k) and flow.args[2:5] == route.args[-3:]   # the router's quantized row
        assert flow.args[10:13] == rows
        assert flow.args[16] == ctx.buf(ctx.output(down))
        assert flow.args[17:] == (ctx.state(f"{gate_up.id}.words", "unsigned int"),
                                  ctx.state(f"{gate_up.id}.flow", "unsigned int"))
        assert set(route.nodes) | set(flow.nodes) == set(g.nodes)
        assert unwritten(plan, g, [route, flow]) == []


def test_gate_up_flow(tiny_path):
    """After moe_gate_up_flow: the same merged group, lowered to the fused router, one grid of the
    gate/up tiles and SwiGLU quantizer CTAs writing the down input's scratch rows (the gate/up node's
    words and ticket state), then the down's slot GEMV in its after-quantizer form."""
    plan, ctx = _plan(tiny_path, "moe_gate_up_flow")
    bp, top_k = plan.blueprint, plan.blueprint.symbols["top_k"]
    fused = [g for g in plan.groups if g.rule == "fused:moe_gate_up_flow"]
    assert fused and all(_ops(plan, g) == sorted(ROUTED) for g in fused)
    for g in fused:
        route, flow, down = moe_experts.lower(ctx, g)
        nodes = {bp.node_by_id[n].op: bp.node_by_id[n] for n in g.nodes if bp.node_by_id[n].op != "act_quant"}
        gate_up, act = nodes["expert_gate_up"], nodes["silu_mul"]
        k, i = ctx.input(gate_up).dim_value, ctx.output(act).dim_value
        rows = _down_input_rows(ctx, act)
        assert flow.instance.kernel == f"kbp::moe_gate_up_flow<{k}, {i}, true>"
        assert flow.grid == (top_k * (2 * i // 16 + -(-i // 256)), 1, 1)
        assert flow.args[2:5] == route.args[-3:] and flow.args[10:13] == rows
        assert flow.args[13:] == (ctx.state(f"{gate_up.id}.words", "unsigned int"),
                                  ctx.state(f"{gate_up.id}.flow", "unsigned int"))
        assert down.instance.kernel.startswith("kbp::w4a4_gemv_moe_slots_after_quant<")
        assert down.args[1:4] == rows
        assert unwritten(plan, g, [route, flow, down]) == []


def test_moe_experts(tiny_path):
    """After moe_experts: the router, both routed GEMVs and the shared expert in one group and four
    launches on one stream (router + shared gate/up tiles, shared down + routed gate/up tiles, the
    SwiGLU quantizer, the routed down); the ids, the [gate | up] rows, the down input and the shared
    silu row stay in state."""
    plan, ctx = _plan(tiny_path, "moe_experts")
    bp, top_k = plan.blueprint, plan.blueprint.symbols["top_k"]
    fused = [g for g in plan.groups if g.rule == "fused:moe_experts"]
    assert fused and all(_ops(plan, g) == sorted(ROUTED + SHARED) for g in fused)
    assert not any(bp.node_by_id[n].op == "linear:shared_gate_up" for g in plan.groups
                   if g.rule != "fused:moe_experts" for n in g.nodes)
    for g in fused:
        first, second, swiglu, down = moe_experts.lower(ctx, g)
        nodes = [bp.node_by_id[n] for n in g.nodes]
        top = next(n for n in nodes if n.op == "top_k")
        router = next(n for n in nodes if n.op == "router")
        gate_up = next(n for n in nodes if n.op == "expert_gate_up")
        sdown = next(n for n in nodes if n.op == "linear:shared_down")
        experts, k = ctx.input(top).dim_value, ctx.input(router).dim_value
        ish, n, width = ctx.input(sdown).dim_value, ctx.output(sdown).dim_value, ctx.output(gate_up).dim_value
        opc = moe_experts.router_opc(experts)
        assert first.instance.kernel == f"kbp::moe_router_shared<{k}, {experts}, {top_k}, {opc}, {ish}>"
        assert first.grid == (-(-experts // opc) + ish // (2 * opc), 1, 1) and first.block == (64 * opc, 1, 1)
        assert first.args[7] == ctx.state(f"{top.id}.ids", "int")
        assert first.args[-1] == ctx.state(f"{sdown.id}.silu_x", "float")
        assert second.instance.kernel == f"kbp::moe_gate_up_shared_down<{k}, {ish}, {n}, true>"
        assert second.grid == (n // 16 + top_k * (width // 16), 1, 1)
        assert second.args[0] == ctx.state(f"{top.id}.ids", "const int") and second.args[2:5] == first.args[9:12]
        assert second.args[8] == ctx.state(f"{gate_up.id}.rows", BF) and second.args[9] == lit(width)
        assert second.args[10] == ctx.state(f"{sdown.id}.silu_x", "const float")
        assert second.args[-1] == ctx.buf(ctx.output(sdown))
        assert swiglu.instance.kernel == f"kbp::w4a4_quant_swiglu_rows_static<{width // 2}>"
        assert swiglu.args[0] == ctx.state(f"{gate_up.id}.rows", f"const {BF}")
        assert down.args[0] == second.args[0] and down.args[2:5] == swiglu.args[3:6]
        assert {x for launch in (first, second, swiglu, down) for x in launch.nodes} == set(g.nodes)
        assert unwritten(plan, g, [first, second, swiglu, down]) == []


def test_refused_when_the_shapes_do_not_fit(tiny_path):
    """A merge whose routed gate/up K is not a multiple of 128 is refused with the reason, and the
    default rules then serve those groups."""
    bp = load_blueprint(tiny_path)
    nodes = list(bp.nodes())
    gate_up = next(n for n in nodes if n.op == "expert_gate_up")
    a = next(t for t in bp.inputs(gate_up.order) if t.format != "i32")
    from kbpc.codegen.families.moe_experts import fits
    merge = [n for n in nodes if n.block == gate_up.block and n.op in ROUTED + SHARED]
    assert fits(bp, merge) is None
    narrow = dataclasses.replace(a, dim_value=a.dim_value + 16)
    bad = _with_tensor(bp, a, narrow)
    assert "K % 128 == 0" in (fits(bad, merge) or "")


def _with_tensor(bp, old, new):
    """A view of bp in which the gate/up's input tensor `old` reads as `new` (inputs only)."""
    class View:
        def __getattr__(self, name):
            return getattr(bp, name)

        def inputs(self, order):
            return [new if t is old else t for t in bp.inputs(order)]
    return View()
