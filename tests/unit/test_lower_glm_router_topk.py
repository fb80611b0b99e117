"""Lowering of glm_router_topk groups (glm_router_topk_rank_kda / _dsa) on the tiny blueprint, and of
the merged groups of rules router_gemv_topk and router_expert_quant."""
from __future__ import annotations

import dataclasses

import pytest

from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.families import glm_router_topk
from kbpc.testing.lowering import points_into, family_groups, planned, unwritten


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path))


def test_router_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "glm_router_topk")
    assert {g.rule for g in groups} == {"glm_router_topk_rank_kda", "glm_router_topk_rank_dsa"}
    for g in groups:
        (launch,) = glm_router_topk.lower(ctx, g)
        node = ctx.node(g, "top_k")
        e, k = ctx.input(node).dim_value, plan.blueprint.symbols["top_k"]
        assert launch.instance.kernel == f"kbp::router_topk<{e}, {k}>"
        assert (launch.grid, launch.block, launch.smem) == ((1, 1, 1), (32 * -(-e // 32), 1, 1), 0)
        z, bias, scale, w, ids = launch.args
        assert z == ctx.buf(ctx.input(node), "const float")
        assert bias == ctx.weight(node, "e_score_correction_bias", "float")
        assert scale == flt(ctx.c.routed_scale)
        assert points_into(w, f"{node.id}.topk_w") and w.ctype == "float"
        assert points_into(ids, f"{node.id}.topk_id") and ids.ctype == "int"
        assert unwritten(plan, g, [launch]) == []


def test_threads():
    assert [glm_router_topk.router_threads(e) for e in (8, 32, 33, 288)] == [32, 32, 64, 288]


def test_renorm_eps_must_match_the_kernel(tiny):
    plan, _ = tiny
    c = dataclasses.replace(plan.blueprint.config.constants, router_renorm_eps=1e-6)
    ctx = LowerCtx(plan)
    ctx.c = c
    with pytest.raises(LoweringError, match="router_renorm_eps"):
        glm_router_topk.lower(ctx, family_groups(plan, "glm_router_topk")[0])


# ------------------------------------------------------------------ fused:router_gemv_topk

def _plan(path, **opts):
    from kbpc.frontend.load import load_blueprint
    from kbpc.ir.plan import Options
    from kbpc.passes import run_pipeline
    plan = run_pipeline(load_blueprint(path), Options(**opts))
    return plan, LowerCtx(plan)


@pytest.fixture(scope="module")
def tiny_default(tiny_path):
    """The default plan without router_expert_quant: router_gemv_topk merges every MoE block's
    router GEMV into its top-k."""
    return _plan(tiny_path, skip_fusions=("router_expert_quant",))


def test_fused_router_launch(tiny_default):
    plan, ctx = tiny_default
    groups = [g for g in family_groups(plan, "glm_router_topk") if g.rule == "fused:router_gemv_topk"]
    assert groups and len(groups) == len(family_groups(plan, "glm_router_topk"))
    for g in groups:
        (launch,) = glm_router_topk.lower(ctx, g)
        router, node = ctx.node(g, "router"), ctx.node(g, "top_k")
        x = ctx.input(router)
        h, e, k = x.dim_value, ctx.input(node).dim_value, plan.blueprint.symbols["top_k"]
        opc = glm_router_topk.fused_outputs_per_cta(e)
        assert launch.instance.kernel == f"kbp::router_gemv_topk<{h}, {e}, {k}, {opc}>"
        assert launch.instance == glm_router_topk.fused_instance(h, e, k)
        assert (launch.grid, launch.block, launch.smem) == ((-(-e // opc), 1, 1), (64 * opc, 1, 1), 0)
        assert launch.nodes == (router.id, node.id)
        w_router, xs, bias, scale, logits, arrive, w, ids = launch.args
        assert w_router == ctx.weight(router, ctype="__nv_bfloat16")
        assert w_router.name == f"{router.id}.weight"
        assert xs == ctx.buf(x)
        assert bias == ctx.weight(node, "e_score_correction_bias", "float")
        assert scale == flt(ctx.c.routed_scale)
        # the logits edge is internal to the group: the top-k's scratch state holds them
        assert logits == ctx.state(f"{node.id}.logits", "float")
        assert arrive == ctx.state(f"{node.id}.arrive", "unsigned int")
        assert points_into(w, f"{node.id}.topk_w") and w.ctype == "float"
        assert points_into(ids, f"{node.id}.topk_id") and ids.ctype == "int"
        assert unwritten(plan, g, [launch]) == []


def test_fused_state_sizes(tiny_default):
    plan, _ = tiny_default
    state = {s.name: s for s in plan.state}
    for node in (n for n in plan.blueprint.nodes() if n.op == "top_k"):
        e = plan.blueprint.inputs(node.order)[0].dim_value
        assert state[f"{node.id}.logits"].shape == (1, e) and state[f"{node.id}.logits"].nbytes == 4 * e
        assert state[f"{node.id}.arrive"].nbytes == 4


@pytest.mark.parametrize("e", [1, 8, 33, 128, 256, 288, 512, 700, 1024])
def test_fused_outputs_per_cta(e):
    """At least the dense GEMV's outputs per CTA; more only until the top-k's CTA plays at most
    FUSED_EXPERTS_PER_THREAD experts a thread (or it has 256 threads)."""
    from kbpc.codegen.families.dense_bf16 import outputs_per_cta
    per = glm_router_topk.FUSED_EXPERTS_PER_THREAD
    opc = glm_router_topk.fused_outputs_per_cta(e)
    assert opc in (1, 2, 4) and opc >= outputs_per_cta(e)
    assert opc == 4 or per * 64 * opc >= glm_router_topk.router_threads(e)
    assert opc == outputs_per_cta(e) or per * 32 * opc < glm_router_topk.router_threads(e)
    assert {8: 1, 128: 2, 288: 4, 1024: 4}.get(e, opc) == opc


def test_fused_refuses_other_renorm_eps(tiny_default):
    plan, _ = tiny_default
    ctx = LowerCtx(plan)
    ctx.c = dataclasses.replace(plan.blueprint.config.constants, router_renorm_eps=1e-6)
    g = next(g for g in family_groups(plan, "glm_router_topk") if g.rule == "fused:router_gemv_topk")
    with pytest.raises(LoweringError, match="router_renorm_eps"):
        glm_router_topk.lower(ctx, g)


# ------------------------------------------------------------------ fused:router_expert_quant

@pytest.fixture(scope="module")
def tiny_rq(tiny_path):
    """The default plan: router_expert_quant merges the router, top-k, the experts' input quantizer
    and the gate/up GEMV of every MoE block."""
    return _plan(tiny_path)


def _same_arg(a, b) -> bool:
    """Equal launch arguments, arena pointers by buffer and type (two plans may place them apart)."""
    from kbpc.codegen.args import ArenaPtr
    if isinstance(a, ArenaPtr) and isinstance(b, ArenaPtr):
        return (a.buffer, a.ctype) == (b.buffer, b.ctype)
    return a == b


@pytest.fixture(params=["cluster", "last_cta"])
def router_form(request, monkeypatch):
    """Both forms of the quantizing router: the cluster form (the default where it fits) and the
    last-CTA form (ROUTER_CLUSTER off, or routers wider than the target's cluster)."""
    monkeypatch.setattr(glm_router_topk, "ROUTER_CLUSTER", request.param == "cluster")
    return request.param


def test_router_cluster_width(monkeypatch):
    """ceil(E / 8) CTAs up to the target's widest cluster (then more logits a 64-thread group; at
    most 8 groups a CTA); 0 (the last-CTA form) with ROUTER_CLUSTER off."""
    width = glm_router_topk.router_cluster
    assert [width(e, 16) for e in (1, 8, 9, 33, 128, 129, 288, 1024)] == [1, 1, 2, 5, 16, 16, 16, 16]
    assert width(128, 8) == 8 and width(64, 8) == 8 and width(7, 8) == 1
    assert [glm_router_topk.cluster_threads(e, width(e, 16)) for e in (1, 3, 33, 128, 288)] == [64, 192, 448, 512, 512]
    monkeypatch.setattr(glm_router_topk, "ROUTER_CLUSTER", False)
    assert width(128, 16) == 0


def test_router_expert_quant_launches(tiny_rq, tiny_default, router_form):
    """Two launches per merged group: router_gemv_topk_quant (or, where its cluster fits,
    router_cluster_topk_quant with one cluster a row) with the fused router's arguments, then
    gamma and the quantizer's scratch rows (what w4a4_quant_rows_static gets in the unfused plan),
    and the gate/up slot GEMV exactly as the unfused group lowers it."""
    from kbpc.codegen.families import lower_group, w4a4_mx_static
    from kbpc.targets import get_target
    plan, ctx = tiny_rq
    plain, plain_ctx = tiny_default
    groups = [g for g in plan.groups if g.rule == "fused:router_expert_quant"]
    assert groups and len(groups) == len(family_groups(plan, "glm_router_topk"))
    for g in groups:
        route, slots = glm_router_topk.lower(ctx, g)
        router, node, quant, expert = (ctx.node(g, op) for op in ("router", "top_k", "act_quant", "expert_gate_up"))
        h, e, k = ctx.input(router).dim_value, ctx.input(node).dim_value, plan.blueprint.symbols["top_k"]
        opc = glm_router_topk.fused_outputs_per_cta(e)
        cl = glm_router_topk.router_cluster(e, get_target(plan.options.target).max_cluster)
        assert bool(cl) == (router_form == "cluster")   # the tiny example's 8 experts: one CTA
        if cl:
            assert route.instance == glm_router_topk.cluster_quant_instance(h, e, k, cl)
            assert route.instance.kernel == f"kbp::router_cluster_topk_quant<{h}, {e}, {k}, {cl}>"
            assert route.instance.cluster == cl
            assert (route.grid, route.block, route.smem) == ((cl, 1, 1), (glm_router_topk.cluster_threads(e, cl), 1, 1), 0)
        else:
            assert route.instance == glm_router_topk.fused_quant_instance(h, e, k)
            assert route.instance.kernel == f"kbp::router_gemv_topk_quant<{h}, {e}, {k}, {opc}>"
            assert (route.grid, route.block, route.smem) == ((-(-e // opc), 1, 1), (64 * opc, 1, 1), 0)
        assert route.instance.params == glm_router_topk.FUSED_PARAMS + ("float", "uint8_t*", "uint8_t*", "float*")
        assert route.nodes == (router.id, node.id, quant.id)
        rows = (ctx.state(f"{quant.id}.codes", "uint8_t"), ctx.state(f"{quant.id}.scales", "uint8_t"),
                ctx.state(f"{quant.id}.g", "float"))
        gamma = ctx.weight_value(expert, "input_scale")
        fused = next(x for x in plain.groups if x.rule == "fused:router_gemv_topk" and router.id in x.nodes)
        (plain_route,) = glm_router_topk.lower(plain_ctx, fused)
        assert all(_same_arg(a, b) for a, b in zip(route.args, (*plain_route.args, gamma, *rows), strict=True))
        assert route.args[1] == ctx.buf(ctx.input(quant))   # the quantizer's row is the router's
        apart = next(x for x in plain.groups if expert.id in x.nodes)
        quant_rows, plain_slots = lower_group(plain_ctx, apart)
        assert quant_rows.instance.kernel == f"kbp::w4a4_quant_rows_static<{h}>"
        assert all(_same_arg(a, b) for a, b in zip(route.args[-4:], quant_rows.args[1:], strict=True))
        n = ctx.output(expert).dim_value
        want = w4a4_mx_static.slots_instance(h, fast=True, tiles=w4a4_mx_static.slot_tiles(h, n))
        assert slots.instance == plain_slots.instance == want
        assert (slots.grid, slots.block, slots.smem, slots.nodes) == (
            plain_slots.grid, plain_slots.block, plain_slots.smem, (expert.id,))
        assert all(_same_arg(a, b) for a, b in zip(slots.args, plain_slots.args, strict=True))
        assert slots.args[2:5] == rows and slots.group == route.group == g.id
        assert unwritten(plan, g, [route, slots]) == []


def test_router_expert_quant_refuses_another_row(tiny_rq):
    """A merged group whose quantizer does not read the router's input is a lowering error."""
    import dataclasses as dc
    plan, ctx = tiny_rq
    g, other = [g for g in plan.groups if g.rule == "fused:router_expert_quant"][:2]
    swapped = dc.replace(g, nodes=(g.nodes[0], g.nodes[1], *other.nodes[2:]))
    with pytest.raises(LoweringError, match="does not quantize"):
        glm_router_topk.lower(ctx, swapped)
