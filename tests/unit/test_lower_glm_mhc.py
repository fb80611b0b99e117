"""Lowering of the glm_mhc groups (expand, pre-mix + site norm, post-mix, head) on the tiny blueprint,
and of the groups the fusion pass merges (boundary, expand + first pre-mix, last post-mix + head + final norm)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kbpc.ir.buffers import buffer_name
from kbpc.ir.state import hc_pre_state
from kbpc.codegen.render_args import render_arg as r
from kbpc.codegen.args import NULL, Aggregate, lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.families import glm_mhc
from kbpc.codegen.families._rows import row_grid, vec_width
from kbpc.codegen.families.glm_moe_combine import operands as combine_operands
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.testing.lowering import points_into, family_groups, planned, unwritten

BF = "__nv_bfloat16"
RULES = {"glm_hc_expand", "glm_hc_pre_norm_c1_input", "glm_hc_pre_norm_c1_post", "glm_hc_post",
         "glm_hc_contract"}


def test_plan_has_pre_state(tiny):
    """plan_memory gives every pre-mix its counters and partial-sum workspace, sized as the lowering needs."""
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
        pre = any(plan.blueprint.node_by_id[n].op == "hc_pre" for n in g.nodes)
        assert len(launches) == (2 if pre else 1) and unwritten(plan, g, launches) == []
        assert launches[0].instance.header in ("glm_mhc.cuh", "glm_mhc_boundary.cuh")
        assert launches[0].nodes == tuple(g.nodes)
        if pre:
            _check_gates(ctx, g, launches[1])


def _check_gates(ctx, g, gates):
    """The pre-mix's gates + Sinkhorn launch, issued aside: mu from the mix state the boundary's
    tails write, the site's alpha and beta, post and comb into their buffers, for their readers."""
    pre = ctx.node(g, "hc_pre")
    post, comb = ctx.output(pre, "post"), ctx.output(pre, "comb")
    assert gates.instance == glm_mhc.gates_instance(post.dim_value)
    assert (gates.grid, gates.block) == ((ctx.rows(post), 1, 1), (32, 1, 1))
    assert gates.args == (ctx.state(pre.id + ".mix", "const float"), ctx.weight(pre, "alpha", "float"),
                          ctx.weight(pre, "beta", "float"), flt(ctx.c.hc_eps), lit(ctx.c.sinkhorn_iters),
                          ctx.buf(post, "float"), ctx.buf(comb, "float"))
    assert gates.nodes == (pre.id,) and gates.aside == tuple(sorted({ctx.bp.node(post.dst).id,
                                                                        ctx.bp.node(comb.dst).id}))


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


def _pre_fields(ctx, g, head, h):
    """The PreParams fields the boundary launch of pre-mix group g must carry, rendered."""
    mix, pre, norm = (ctx.node(g, op) for op in ("linear:hc_mix", "hc_pre", "rms_norm"))
    c = ctx.c
    fields = (*head, ctx.weight(mix, ctype=BF), ctx.weight(pre, "alpha", "float"), ctx.weight(pre, "beta", "float"),
              ctx.weight(norm, ctype=BF), flt(c.hc_norm_eps), flt(c.hc_eps), flt(c.hc_site_norm_eps),
              lit(c.sinkhorn_iters), ctx.state(pre.id + ".mix", "float"),
              ctx.state(pre.id + ".counters", "unsigned int"), NULL,
              ctx.buf(ctx.output(norm)), ctx.buf(ctx.output(pre, "post"), "float"),
              NULL, h, ctx.state(pre.id + ".work", "unsigned int"))   # comb: hc_gates (GATES_ASIDE)
    return tuple(map(r, fields))


def _shape(ctx, g):
    x, normed = ctx.input(ctx.node(g, "linear:hc_mix")), ctx.output(ctx.node(g, "rms_norm"))
    return x.dim_value // normed.dim_value, normed.dim_value


def _check_boundary(ctx, plan, g, launches, src, head, h, k=0):
    launch, gates = launches
    _check_gates(ctx, g, gates)
    n, d = _shape(ctx, g)
    assert launch.instance.kernel == f"kbp::mhc::hc_boundary<{n}, {d}, {src}, 1, {k}, 4>"
    assert launch.instance.params == (f"kbp::mhc::PreParams<{n}, 1, {k}>",)
    assert launch.instance.header == "glm_mhc_boundary.cuh"
    # producers: 8 column groups x ceil(((2+n)n + 1) / 4) chain groups; then the two tails; one row
    assert (launch.grid, launch.block, launch.smem) == ((8 * -(-((2 + n) * n + 1) // 4) + 2, 1, 1), (288, 1, 1), 0)
    assert tuple(map(r, launch.args[0].fields)) == _pre_fields(ctx, g, head, h)
    assert launch.nodes == tuple(g.nodes) and unwritten(plan, g, [launch, gates]) == []


def test_pre_norm(tiny):
    """A pre-mix group alone reads its streams as they are (kSrcStreams); mu and the collapsed row
    are on chip (their edges have no buffer)."""
    plan, ctx = tiny
    for g in by_rule(plan, "glm_hc_pre_norm_c1_input") + by_rule(plan, "glm_hc_pre_norm_c1_post"):
        launches = glm_mhc.lower(ctx, g)
        x = ctx.input(ctx.node(g, "linear:hc_mix"))
        no_parts = Aggregate(None, (Aggregate(None, (NULL,)),))
        _check_boundary(ctx, plan, g, launches, 0, (ctx.buf(x, "const float"), no_parts, NULL, NULL, NULL), NULL)


def test_pre_norm_needs_its_state(tiny_path):
    plan, _ = planned(str(tiny_path))
    bare = dataclasses.replace(plan, state=tuple(s for s in plan.state if not s.name.endswith((".counters", ".work"))))
    (g, *_) = by_rule(bare, "glm_hc_pre_norm_c1_input")
    with pytest.raises(LoweringError, match="no state buffer"):
        glm_mhc.lower(LowerCtx(bare), g)


def test_fused_boundary(tiny_path):
    """A post-mix merged with the next pre-mix lowers to one kSrcPost launch: it reads the post's input
    streams, the sublayer output and the post's gates, and writes the post's stream buffer."""
    plan, ctx = planned(str(tiny_path), fuse=True)
    bp = plan.blueprint
    fused = [g for g in plan.groups if g.rule == "fused:hc_boundary"]
    assert fused
    for g in fused:
        launches = glm_mhc.lower(ctx, g)
        post = next(bp.node_by_id[n] for n in g.nodes if bp.node_by_id[n].op == "hc_post")
        x, u, gate, comb, y = glm_mhc._post_operands(ctx, post)
        head = (ctx.buf(x, "const float"), glm_mhc._parts(ctx, u)[1], ctx.buf(gate, "const float"),
                ctx.buf(comb, "const float"), ctx.buf(y, "float"))
        _check_boundary(ctx, plan, g, launches, 1, head, NULL)
        assert x != y and points_into(launches[0].args[0], buffer_name(bp, u))


def _combine_plan(tiny_path):
    """The opt-in combine rules (the opt-in fused MoE layer would take the blends first)."""
    plan = run_pipeline(load_blueprint(Path(tiny_path)), Options(add_fusions=("moe_combine_hc", "moe_combine_head")))
    return plan, LowerCtx(plan)


def test_fused_combine_boundary(tiny_path):
    """A blend merged with the post-mix it feeds and the next pre-mix: one kSrcPost launch whose
    PreParams<N, 1, K> carry the blend's operands (router weights, routed rows in slot order, the
    shared expert's row) in place of the sublayer output, which has no buffer any more."""
    plan, ctx = _combine_plan(tiny_path)
    bp = plan.blueprint
    fused = [g for g in plan.groups if g.rule == "fused:moe_combine_hc"]
    assert fused
    names = {b.name for b in plan.buffers}
    for g in fused:
        launches = glm_mhc.lower(ctx, g)
        post, blend = (ctx.node(g, op) for op in ("hc_post", "blend"))
        x, u, gate, comb, y = glm_mhc._post_operands(ctx, post)
        w, e, sh, _ = combine_operands(ctx, blend)
        assert u.src == blend.order and buffer_name(bp, u) not in names
        parts = Aggregate(None, (ctx.buf(w, "const float"), NULL, NULL, ctx.buf(e, f"const {BF}"),
                                 ctx.buf(sh, f"const {BF}")))
        head = (ctx.buf(x, "const float"), parts, ctx.buf(gate, "const float"), ctx.buf(comb, "const float"),
                ctx.buf(y, "float"))
        _check_boundary(ctx, plan, g, launches, 1, head, NULL, k=w.dim_value)


def test_fused_combine_head_norm(tiny_path):
    """The last MoE layer's blend merged into the head + final norm: HeadParams<N, 1, K>."""
    plan, ctx = _combine_plan(tiny_path)
    (g,) = [g for g in plan.groups if g.rule == "fused:moe_combine_head"]
    (launch,) = glm_mhc.lower(ctx, g)
    blend, post, norm = (ctx.node(g, op) for op in ("blend", "hc_post", "final_norm"))
    x, u, gate, comb, y = glm_mhc._post_operands(ctx, post)
    w, e, sh, _ = combine_operands(ctx, blend)
    k, d = w.dim_value, u.dim_value
    assert launch.instance.kernel.endswith(f", true, true, 1, {k}>")
    assert launch.instance.params == (f"kbp::mhc::HeadParams<{x.dim_value // d}, 1, {k}>",)
    assert r(launch.args[0].fields[1]) == r(Aggregate(None, (ctx.buf(w, "const float"), NULL, NULL,
                                                             ctx.buf(e, f"const {BF}"), ctx.buf(sh, f"const {BF}"))))
    assert launch.nodes == tuple(g.nodes) == (blend.id, post.id, ctx.node(g, "hc_contract").id, norm.id)
    assert unwritten(plan, g, [launch]) == []


def test_fused_expand_pre(tiny_path):
    """The embedding's expand merged with the first pre-mix: the kernel reads the BF16 row and writes
    the expand's stream buffer (the first post-mix reads it)."""
    plan, ctx = planned(str(tiny_path), fuse=True)
    (g,) = [g for g in plan.groups if g.rule == "fused:hc_expand_pre"]
    launches = glm_mhc.lower(ctx, g)
    expand = next(n for n in ctx.nodes(g) if n.op == "hc_expand")
    no_parts = Aggregate(None, (Aggregate(None, (NULL,)),))
    head = (NULL, no_parts, NULL, NULL, ctx.buf(ctx.output(expand), "float"))
    _check_boundary(ctx, plan, g, launches, 2, head, ctx.buf(ctx.input(expand), f"const {BF}"))


def test_fused_head_norm(tiny_path):
    """The last post-mix, the stream mean and the final norm: one CTA per row of the rms_norm block size,
    the norm's weight form and epsilon; the post's streams and the mean stay on chip."""
    plan, ctx = planned(str(tiny_path), fuse=True)
    (g,) = [g for g in plan.groups if g.rule == "fused:hc_head_norm"]
    (launch,) = glm_mhc.lower(ctx, g)
    post, contract, norm = (ctx.node(g, op) for op in ("hc_post", "hc_contract", "final_norm"))
    x, u, gate, comb, y = glm_mhc._post_operands(ctx, post)
    d = ctx.output(contract).dim_value
    n = x.dim_value // d
    threads = min(1024, -(-(d // 2) // 32) * 32)
    assert launch.instance.kernel == f"kbp::mhc::hc_head_norm<{n}, {d}, {threads}, true, true, 1, 0>"
    assert (launch.grid, launch.block, launch.smem) == ((1, 1, 1), (threads, 1, 1), 0)
    fields = (ctx.buf(x, "const float"), glm_mhc._parts(ctx, u)[1], ctx.buf(gate, "const float"),
              ctx.buf(comb, "const float"), NULL, ctx.weight(norm, ctype=BF), flt(ctx.c.rms_eps), NULL,
              ctx.buf(ctx.output(norm)))
    assert tuple(map(r, launch.args[0].fields)) == tuple(map(r, fields))
    assert launch.nodes == tuple(g.nodes) and unwritten(plan, g, [launch]) == []


def test_boundary_limits(tiny_path, monkeypatch):
    """Sizes the boundary kernel cannot hold are lowering errors, not wrong kernels."""
    plan, ctx = planned(str(tiny_path))
    (g, *_) = by_rule(plan, "glm_hc_pre_norm_c1_input")
    monkeypatch.setattr(glm_mhc, "MAX_FLAT", 8)
    with pytest.raises(LoweringError, match="at most 8"):
        glm_mhc.lower(ctx, g)


def test_cluster_form_switch(tiny_path, monkeypatch):
    """With BOUNDARY_CLUSTER on, a boundary whose hidden size is a multiple of 256 lowers to one
    16-CTA cluster a token on a target that allows it (same fields, no dynamic shared memory); off
    (the measured default), on a target limited to portable clusters, or with a hidden size the
    cluster form cannot split, it stays the slot form."""
    plan, ctx = planned(str(tiny_path), fuse=True)
    g = next(g for g in plan.groups if g.rule == "fused:hc_boundary")
    n, d = _shape(ctx, g)
    assert d % 256 == 0
    slot = glm_mhc.lower(ctx, g)[0]
    assert slot.instance.header == "glm_mhc_boundary.cuh" and slot.instance.cluster == 0
    monkeypatch.setattr(glm_mhc, "BOUNDARY_CLUSTER", True)
    launch = glm_mhc.lower(ctx, g)[0]
    assert launch.instance.kernel == f"kbp::mhc::hc_boundary_cluster<{n}, {d}, 1, 1, 0, 16>"
    assert (launch.instance.header, launch.instance.cluster) == ("glm_mhc_boundary_cluster.cuh", 16)
    # one lane a tree thread of a chain, two chains a warp: ceil(((2+n)n + 1) / 2) warps
    assert (launch.grid, launch.block, launch.smem) == ((16, 1, 1), (32 * -(-((2 + n) * n + 1) // 2), 1, 1), 0)
    assert launch.args == slot.args and launch.nodes == slot.nodes
    assert glm_mhc.boundary_cluster(n, d, max_cluster=8) == 0       # a portable-only target
    assert glm_mhc.boundary_cluster(n, d + 128, max_cluster=16) == 0  # columns not whole tree threads
    assert glm_mhc.boundary_cluster(8, d, max_cluster=16) == 0       # 81 chains: more than 1024 threads


def test_launcher_opts_into_wide_clusters():
    """The launcher of a kernel with a cluster wider than 8 CTAs opts it into the non-portable size;
    no other launcher does; every launcher opts static + dynamic shared memory beyond 48 KB in."""
    from kbpc.testing.launchers import render_launcher  # noqa: PLC0415

    wide = render_launcher(glm_mhc.boundary_instance(4, 4096, 1, cluster=16))
    narrow = render_launcher(glm_mhc.boundary_instance(4, 4096, 1, cluster=8))
    slot = render_launcher(glm_mhc.boundary_instance(4, 4096, 1))
    assert "cudaFuncAttributeNonPortableClusterSizeAllowed" in wide
    assert "NonPortableCluster" not in narrow and "NonPortableCluster" not in slot
    for tu in (wide, narrow, slot):
        assert "smem + fa.sharedSizeBytes > 48 * 1024" in tu
