"""Lowering of the glm_mhc groups (expand, pre-mix + site norm, post-mix, head) on the tiny blueprint."""
from __future__ import annotations

import dataclasses

import pytest

from kbpc.ir.buffers import buffer_name
from kbpc.ir.state import hc_pre_state
from kbpc.codegen.render_args import render_arg as r
from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.families import glm_mhc
from kbpc.codegen.families._rows import row_grid, vec_width
from kbpc.testing.lowering import points_into, family_groups, planned, unwritten

BF = "__nv_bfloat16"
RULES = {"glm_hc_expand", "glm_hc_pre_norm_c1_input", "glm_hc_pre_norm_c1_post", "glm_hc_post",
         "glm_hc_contract"}


def test_plan_has_pre_state(tiny):
    """plan_memory gives every pre-mix its counters and mu workspace, sized as the lowering needs."""
    plan, _ = tiny
    state = {s.name: s for s in plan.state}
    for g in plan.groups:
        for node_id in g.nodes:
            node = plan.blueprint.node_by_id[node_id]
            if node.op == "hc_pre":
                mix = next(t for t in plan.blueprint.inputs(node.order) if t.id.endswith(".mix"))
                for want in hc_pre_state(node, 1, mix.dim_value):
                    assert state[want.name] == want


@pytest.fixture(scope="module")
def tiny(tiny_path):
    plan = planned(str(tiny_path))[0]
    return plan, LowerCtx(plan)


def by_rule(plan, rule):
    found = [g for g in family_groups(plan, "glm_mhc") if g.rule == rule]
    assert found, f"no {rule} groups"
    return found


def test_rules_covered(tiny):
    plan, ctx = tiny
    assert {g.rule for g in family_groups(plan, "glm_mhc")} == RULES
    for g in family_groups(plan, "glm_mhc"):
        launches = glm_mhc.lower(ctx, g)
        assert len(launches) == 1 and unwritten(plan, g, launches) == []
        assert launches[0].instance.header == "glm_mhc.cuh" and launches[0].nodes == tuple(g.nodes)


def test_vec_and_grid():
    assert [vec_width(d, 8) for d in (4096, 100, 6, 7)] == [8, 4, 2, 1]
    assert row_grid(4096, 32, 4, 1) == (32, 1, 1) and row_grid(100, 32, 4, 3) == (1, 3, 1)


def test_expand_and_head(tiny):
    plan, ctx = tiny
    (expand,) = by_rule(plan, "glm_hc_expand")
    (launch,) = glm_mhc.lower(ctx, expand)
    node = plan.blueprint.node_by_id[expand.nodes[0]]
    h, x = ctx.input(node), ctx.output(node)
    n, d = x.dim_value // h.dim_value, h.dim_value
    assert launch.instance.kernel == f"kbp::mhc::hc_expand<{n}, {d}, 4>"
    assert (launch.grid, launch.block, launch.smem) == ((-(-d // 128), 1, 1), (32, 1, 1), 0)
    assert launch.args == (ctx.buf(h, f"const {BF}"), ctx.buf(x, "float"))
    (head,) = by_rule(plan, "glm_hc_contract")
    (launch,) = glm_mhc.lower(ctx, head)
    node = plan.blueprint.node_by_id[head.nodes[0]]
    assert launch.instance.kernel == f"kbp::mhc::hc_head<{n}, {d}, 4>"
    assert launch.args == (ctx.buf(ctx.input(node), "const float"), ctx.buf(ctx.output(node)))


def test_post_mix(tiny):
    plan, ctx = tiny
    bp = plan.blueprint
    for g in by_rule(plan, "glm_hc_post"):
        (launch,) = glm_mhc.lower(ctx, g)
        node = bp.node_by_id[g.nodes[0]]
        ins = {bp.node(t.src).op: t for t in ctx.inputs(node) if not t.id.endswith((".post", ".comb"))}
        stream = next(t for op, t in ins.items() if op in ("hc_post", "hc_expand"))
        u = next(t for op, t in ins.items() if op not in ("hc_post", "hc_expand"))
        y = ctx.output(node)
        d = u.dim_value
        assert launch.instance.kernel == f"kbp::mhc::hc_post<{y.dim_value // d}, {d}, 1, 4>"
        assert launch.instance.params[1] == "kbp::mhc::RankParts<1>"
        assert (launch.grid, launch.block) == ((-(-d // 128), 1, 1), (32, 1, 1))
        x, parts, post, comb, out = launch.args
        assert x == ctx.buf(stream, "const float") and out == ctx.buf(y, "float") and x != ctx.buf(y, "const float")
        assert r(parts) == f"kbp::mhc::RankParts<1>{{{{{r(ctx.buf(u, f'const {BF}'))}}}}}"
        pre = bp.node(ctx.input(node, "post").src).id
        assert points_into(post, f"{pre}.post") and points_into(comb, f"{pre}.comb")


def test_pre_norm(tiny):
    plan, ctx = tiny
    groups = by_rule(plan, "glm_hc_pre_norm_c1_input") + by_rule(plan, "glm_hc_pre_norm_c1_post")
    for g in groups:
        (launch,) = glm_mhc.lower(ctx, g)
        mix, pre, norm = (ctx.node(g, op) for op in ("linear:hc_mix", "hc_pre", "rms_norm"))
        x, normed = ctx.input(mix), ctx.output(norm)
        d = normed.dim_value
        n = x.dim_value // d
        params = f"kbp::mhc::PreParams<{n}, 1>"
        assert launch.instance.kernel == f"kbp::mhc::hc_pre_norm<{n}, {d}, false, 1>"
        assert launch.instance.params == (params,)
        assert (launch.grid, launch.block, launch.smem) == (((2 + n) * n, 1, 1), (288, 1, 1), 0)
        c = ctx.c
        want = (f"{params}{{{r(ctx.buf(x, 'const float'))}, {{{{nullptr}}}}, nullptr, nullptr, nullptr, "
                f"{r(ctx.weight(mix, ctype=BF))}, {r(ctx.weight(pre, 'alpha', 'float'))}, "
                f"{r(ctx.weight(pre, 'beta', 'float'))}, {r(ctx.weight(norm, ctype=BF))}, {r(flt(c.hc_norm_eps))}, "
                f"{r(flt(c.hc_eps))}, {r(flt(c.hc_site_norm_eps))}, {c.sinkhorn_iters}, "
                f"{r(ctx.state(pre.id + '.mix', 'float'))}, {r(ctx.state(pre.id + '.counters', 'unsigned int'))}, "
                f"nullptr, {r(ctx.buf(normed))}, {r(ctx.buf(ctx.output(pre, 'post'), 'float'))}, "
                f"{r(ctx.buf(ctx.output(pre, 'comb'), 'float'))}}}")
        assert tuple(map(r, launch.args)) == (want,)


def test_pre_norm_needs_its_state(tiny_path):
    plan, _ = planned(str(tiny_path))
    bare = dataclasses.replace(plan, state=tuple(s for s in plan.state if not s.name.endswith((".counters", ".mix"))))
    (g, *_) = by_rule(bare, "glm_hc_pre_norm_c1_input")
    with pytest.raises(LoweringError, match="no state buffer"):
        glm_mhc.lower(LowerCtx(bare), g)


def test_fused_boundary(tiny_path):
    """A post-mix merged with the next pre-mix lowers to one FUSE_POST launch: the pre-mix reads the
    post's input streams and the sublayer output, and writes the post's stream buffer."""
    plan, ctx = planned(str(tiny_path), fuse=True)
    bp = plan.blueprint
    fused = [g for g in plan.groups if g.rule == "fused:hc_boundary"]
    assert fused
    for g in fused:
        (launch,) = glm_mhc.lower(ctx, g)
        post = next(bp.node_by_id[n] for n in g.nodes if bp.node_by_id[n].op == "hc_post")
        mix = ctx.node(g, "linear:hc_mix")
        x = ctx.input(mix)
        n, d = x.dim_value // ctx.output(ctx.node(g, "rms_norm")).dim_value, ctx.output(ctx.node(g, "rms_norm")).dim_value
        assert launch.instance.kernel == f"kbp::mhc::hc_pre_norm<{n}, {d}, true, 1>"
        assert launch.nodes == tuple(g.nodes) and unwritten(plan, g, [launch]) == []
        params = launch.args[0].fields
        stream_in = next(t for t in ctx.inputs(post) if bp.node(t.src).op in ("hc_post", "hc_expand"))
        assert params[0] == ctx.buf(stream_in, "const float")
        assert params[4] == ctx.buf(ctx.output(post), "float") and params[4] != params[0]
        assert points_into(params[1], buffer_name(bp, next(t for t in ctx.inputs(post)
                                                           if bp.node(t.src).op not in ("hc_post", "hc_expand", "hc_pre"))))
