"""fuse_groups: before/after on the tiny example (the expected merges, their nodes and family),
refusals with reasons, the invariants after fusion, buffers only for edges that still cross
groups, and every fusion rule served by its family lowering."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families import lower_group
from kbpc.frontend.load import load_blueprint
from kbpc.ir.buffers import buffer_name
from kbpc.ir.plan import LoweredGroup, Options, Plan
from kbpc.passes import PIPELINE, run_pipeline
from kbpc.passes.fuse_groups import _convex, fuse_groups
from kbpc.passes.fusion_rules import FUSION_RULES, OPT_IN_RULES
from kbpc.passes.invariants import check_invariants


def _before(bp, **opts) -> Plan:
    """The plan just before fuse_groups."""
    plan = Plan(blueprint=bp, options=Options(**{"add_fusions": OPT_IN_RULES, **opts}))
    for name, fn in PIPELINE:
        if name == "fuse_groups":
            return plan
        plan = fn(plan)
    raise AssertionError("fuse_groups is not in the pipeline")


@pytest.fixture(scope="module")
def tiny_bp(tiny_path):
    return load_blueprint(Path(tiny_path))


def _ops(bp, group: LoweredGroup) -> list[str]:
    return sorted(bp.node_by_id[n].op for n in group.nodes)


def test_hc_boundaries_merge(tiny_bp):
    before = _before(tiny_bp)
    after = fuse_groups(before)
    posts = [g for g in before.groups if _ops(tiny_bp, g) == ["hc_post"]]
    pres = {g.id: g for g in before.groups if "hc_pre" in _ops(tiny_bp, g)}
    merged = [g for g in after.groups if g.rule == "fused:hc_boundary"]
    # every post-mix but the last (followed by the head's contract) joins the next pre-mix
    assert len(merged) == len(posts) - 1
    for g in merged:
        post_id, pre_id = g.fused_from
        assert _ops(tiny_bp, g) == sorted(["hc_post", "linear:hc_mix", "hc_pre", "rms_norm"])
        assert g.family == "glm_mhc" and g.id == post_id and pre_id in pres
        assert set(g.nodes) == set(next(p for p in posts if p.id == post_id).nodes) | set(pres[pre_id].nodes)
        # the post's streams feed the pre it joined
        post_node = next(tiny_bp.node_by_id[n] for n in g.nodes if tiny_bp.node_by_id[n].op == "hc_post")
        assert any(tiny_bp.node(t.dst).id in pres[pre_id].nodes for t in tiny_bp.outputs(post_node.order))
    assert len(after.groups) == len(before.groups) - sum(len(f.groups) - 1 for f in after.fusions if f.applied)
    left = [f for f in after.fusions if not f.applied]
    assert len(left) == 1 and left[0].rule == "hc_boundary" and "hc_pre" in left[0].reason


def test_dsa_projections_merge_horizontally(tiny_bp):
    """Siblings reading one quantized row join one segment-list launch (no edge between them)."""
    after = fuse_groups(_before(tiny_bp))
    merged = [g for g in after.groups if g.rule == "fused:dsa_proj_in"]
    assert len(merged) == sum(1 for n in tiny_bp.nodes() if n.op == "linear:index_k") > 0
    for g in merged:
        assert _ops(tiny_bp, g) == sorted(["linear:mla_q_a", "linear:mla_kv_a", "linear:index_k"])
        inputs = {t.id for n in g.nodes for t in tiny_bp.inputs(tiny_bp.node_by_id[n].order)}
        assert len(inputs) == 1 and g.family == "wxay"


def test_index_key_norm_merges_into_the_store(tiny_bp):
    """Before: the DSA index key's LayerNorm and the index store are two groups. After: one
    fused:dsa_key_store group of the dsa_indexer family, placed after every group it reads (the
    store also reads the gate projection, which the blueprint lists after the norm), and the groups
    stay in a dependency order; a key of a width the fused store cannot take is refused."""
    import dataclasses as dc
    before = _default_before(tiny_bp)
    after = fuse_groups(before)
    merged = [g for g in after.groups if g.rule == "fused:dsa_key_store"]
    assert len(merged) == sum(1 for n in tiny_bp.nodes() if n.op == "kpool_compress") > 0
    deps = after.grouping.dependencies()
    position = {g.id: i for i, g in enumerate(after.groups)}
    assert all(position[d] < position[g.id] for g in after.groups for d in deps[g.id])
    for g in merged:
        assert _ops(tiny_bp, g) == ["kpool_compress", "layer_norm"] and g.family == "dsa_indexer"
        norm_group, store_group = (next(b for b in before.groups if b.id == m) for m in g.fused_from)
        assert [_ops(tiny_bp, norm_group), _ops(tiny_bp, store_group)] == [["layer_norm"], ["kpool_compress"]]
    assert len(after.groups) == len(before.groups) - sum(len(f.groups) - 1 for f in after.fusions if f.applied)
    rule = next(r for r in FUSION_RULES if r.name == "dsa_key_store")
    store = next(n for n in tiny_bp.nodes() if n.op == "kpool_compress")
    norm = next(n for n in tiny_bp.nodes() if n.op == "layer_norm" and n.block == store.block)
    assert rule.check(tiny_bp, [norm, store]) is None
    elsewhere = dc.replace(norm, order=-1)   # a norm whose output the store does not read
    assert "does not read the norm's output" in rule.check(tiny_bp, [elsewhere, store])

    class OddKey:   # the blueprint with a 96-wide index key (the norm's block rule gives it 128 threads)
        def inputs(self, order):
            return [dc.replace(t, dim_value=96) if t.src == norm.order else t for t in tiny_bp.inputs(order)]
    assert "power of two" in rule.check(OddKey(), [norm, store])


def test_kda_siblings_merge_and_the_recurrence_takes_its_norm(tiny_bp, monkeypatch):
    """Before: per KDA layer the pack, the conv and the gate chain are three groups (the pack and the
    gates read different outputs of one projection group, no edge between them) and the recurrence
    and its gated norm two more. After (default rules): kda_conv_gates grows from the conv through
    the pack to its sibling gate group; kda_recurrence_norm joins the recurrence and the norm; with
    siblings off the conv and the gates never meet."""
    before = _before(tiny_bp, add_fusions=())
    after = fuse_groups(before)
    layers = sum(n.op == "gdn_recurrence" for n in tiny_bp.nodes())
    by_id = {g.id: g for g in before.groups}
    cg = [g for g in after.groups if g.rule == "fused:kda_conv_gates"]
    rn = [g for g in after.groups if g.rule == "fused:kda_recurrence_norm"]
    assert layers and len(cg) == len(rn) == layers
    for g in cg:
        parts = sorted((_ops(tiny_bp, by_id[m]) for m in g.fused_from), key=len)
        assert parts == [["concat"], sorted(["conv1d_update", "state_snapshot", "l2_norm"]),
                         sorted(["act_quant", "linear:kda_f_b", "gdn_gates", "act_quant", "linear:kda_g_b"])]
        assert g.family == "kda_conv_gates" and g.variant == "fp8_mma"
    for g in rn:
        assert _ops(tiny_bp, g) == ["gated_rms_norm", "gdn_recurrence"] and g.family == "kda_recurrent"
    check_invariants(after, "test")
    rules = tuple(dataclasses.replace(r, siblings=False) if r.name == "kda_conv_gates" else r for r in FUSION_RULES)
    monkeypatch.setattr(sys.modules[fuse_groups.__module__], "FUSION_RULES", rules)
    apart = fuse_groups(before)
    refused = [f for f in apart.fusions if f.rule == "kda_conv_gates"]
    assert len(refused) == layers and not any(f.applied for f in refused)
    assert all("no neighbouring group" in f.reason for f in refused)


def test_hc_expand_and_head_merge(tiny_bp):
    """The embedding's expand joins the first pre-mix; the last post-mix joins the stream mean and
    the final norm (the rms_norm family's group)."""
    before = _before(tiny_bp)
    after = fuse_groups(before)
    for rule, ops in (("hc_expand_pre", ["hc_expand", "hc_pre", "linear:hc_mix", "rms_norm"]),
                      ("hc_head_norm", ["final_norm", "hc_contract", "hc_post"])):
        (g,) = [g for g in after.groups if g.rule == f"fused:{rule}"]
        assert _ops(tiny_bp, g) == ops and g.family == "glm_mhc"
        assert set(g.nodes) == {n for m in g.fused_from for b in before.groups if b.id == m for n in b.nodes}


NO_RQ = ("router_expert_quant",)   # leaves the router + top-k pair to router_gemv_topk


def test_router_gemv_merges_into_its_top_k(tiny_bp):
    """Before: the router GEMV (dense_bf16) and the top-k (glm_router_topk) are two groups joined by
    the logits edge. After: one glm_router_topk group per MoE block holding exactly those two nodes,
    the logits edge without a buffer (nothing else reads it), the weights and ids still buffers."""
    before = _before(tiny_bp, add_fusions=(), skip_fusions=NO_RQ)
    routers = {g.id: g for g in before.groups if _ops(tiny_bp, g) == ["router"]}
    top_ks = {g.id: g for g in before.groups if _ops(tiny_bp, g) == ["top_k"]}
    moe_blocks = {n.block for n in tiny_bp.nodes() if n.op == "top_k"}
    assert len(routers) == len(top_ks) == len(moe_blocks) > 0
    assert {routers[r].family for r in routers} == {"dense_bf16"}
    after = fuse_groups(before)
    merged = [g for g in after.groups if g.rule == "fused:router_gemv_topk"]
    assert len(merged) == len(moe_blocks)
    for g in merged:
        router_id, top_k_id = g.fused_from
        assert router_id in routers and top_k_id in top_ks and g.id == router_id
        assert _ops(tiny_bp, g) == ["router", "top_k"] and g.family == "glm_router_topk"
        assert g.nodes == routers[router_id].nodes + top_ks[top_k_id].nodes
        assert g.variant == "cuda_core"
    assert not any(g.id in top_ks for g in after.groups)
    plan = run_pipeline(tiny_bp, Options(skip_fusions=NO_RQ))
    names = {b.name for b in plan.buffers}
    state = {s.name for s in plan.state}
    for block in moe_blocks:
        assert f"{block}.gate.logits" not in names
        assert {f"{block}.top_k.topk_w", f"{block}.top_k.topk_id"} <= names
        assert {f"{block}.top_k.logits", f"{block}.top_k.arrive"} <= state


def test_router_gemv_topk_refusals(tiny_bp):
    """moe_layer (opt-in) takes the router first when asked for; --no-fuse-rule leaves it apart; a
    router that is not a BF16 GEMV is refused with the reason."""
    import dataclasses as dc
    asked = fuse_groups(_before(tiny_bp))
    assert not any(g.rule == "fused:router_gemv_topk" for g in asked.groups)
    assert any(g.rule == "fused:moe_layer" for g in asked.groups)
    skipped = fuse_groups(_before(tiny_bp, add_fusions=(), skip_fusions=(*NO_RQ, "router_gemv_topk")))
    mine = [f for f in skipped.fusions if f.rule == "router_gemv_topk"]
    assert mine and all(not f.applied and "skipped" in f.reason for f in mine)
    from kbpc.passes.fusion_rules import FUSION_RULES as rules
    rule = next(r for r in rules if r.name == "router_gemv_topk")
    router = next(n for n in tiny_bp.nodes() if n.op == "router")
    top_k = next(n for n in tiny_bp.nodes() if n.op == "top_k" and n.block == router.block)
    assert rule.check(tiny_bp, [router, top_k]) is None
    fp8 = dc.replace(router, precision=dc.replace(router.precision, weight="fp8/channel"))
    assert "not a BF16 GEMV" in rule.check(tiny_bp, [fp8, top_k])
    other = next(n for n in tiny_bp.nodes() if n.op == "router" and n.block != router.block)
    assert "does not read" in rule.check(tiny_bp, [other, top_k])


def test_fuse_off_keeps_groups_and_reports(tiny_bp):
    before = _before(tiny_bp, fuse=False)
    after = fuse_groups(before)
    assert after.groups == before.groups
    assert after.fusions and all(not f.applied for f in after.fusions)
    assert any(f.reason.startswith("fusion is off") for f in after.fusions)


def test_convexity(tiny_bp):
    """Merging the KDA projections with the output projection would put the pack, conv, gates,
    recurrence and norm on a path that leaves the merge and comes back; a post-mix with the next
    pre-mix is a direct edge. (The boundary test above also shows the search skips the post-mix's
    own site, an earlier neighbour that would make a cycle.)"""
    plan = _before(tiny_bp)
    deps = plan.grouping.dependencies()
    six = next(g.id for g in plan.groups if "linear:kda_f_a" in _ops(tiny_bp, g))
    o_proj = next(g.id for g in plan.groups if _ops(tiny_bp, g) == ["linear:o"] and g.id > six)
    assert not _convex({six, o_proj}, deps)
    post = next(g.id for g in plan.groups if _ops(tiny_bp, g) == ["hc_post"])
    assert _convex({post, post + 1}, deps)


def test_plan_after_fusion(tiny_bp):
    plan = run_pipeline(tiny_bp, Options(), verify=True)       # invariants after every pass
    check_invariants(plan, "end")
    names = {b.name for b in plan.buffers}
    for g in plan.groups:
        for node_id in g.nodes:
            node = tiny_bp.node_by_id[node_id]
            for t in tiny_bp.outputs(node.order):
                crosses = plan.grouping.crosses(t)
                if crosses:
                    assert buffer_name(tiny_bp, t) in names
    # a boundary's (or the expand's) internal stream edge still has a buffer: the next post-mix reads it
    for g in plan.groups:
        if g.rule in ("fused:hc_boundary", "fused:hc_expand_pre"):
            src = next(tiny_bp.node_by_id[n] for n in g.nodes if tiny_bp.node_by_id[n].op in ("hc_post", "hc_expand"))
            assert any(b.startswith(f"{src.id}.") for b in names), src.id


def test_every_rule_lowers(tiny_bp):
    """Every rule is applied and lowered in the default plan, with all opt-in rules, with one
    opt-in rule alone (moe_layer takes the groups moe_combine_hc, moe_swiglu_down,
    router_expert_quant and router_gemv_topk would merge), or without router_expert_quant (which
    takes router_gemv_topk's pair) or activation quantization (which refuses it)."""
    served = set()
    for options in (Options(), Options(add_fusions=OPT_IN_RULES), *(Options(add_fusions=(r,)) for r in OPT_IN_RULES),
                    Options(skip_fusions=("router_expert_quant",)), Options(act_quant=False)):
        plan = run_pipeline(tiny_bp, options)
        ctx = LowerCtx(plan)
        for g in plan.groups:
            if g.rule.startswith("fused:"):
                launches = lower_group(ctx, g)
                assert launches and set(g.nodes) <= {n for l in launches for n in l.nodes}
                served.add(g.rule.removeprefix("fused:"))
    assert served == {r.name for r in FUSION_RULES}


COMBINE = ("moe_combine_hc", "moe_combine_head")   # opt-in rules (measured slower in the step)


def _default_before(bp, options: Options | None = None) -> Plan:
    """The plan just before fuse_groups with the default rules (or `options`)."""
    plan = Plan(blueprint=bp, options=options or Options())
    for name, fn in PIPELINE:
        if name == "fuse_groups":
            return plan
        plan = fn(plan)
    raise AssertionError("fuse_groups is not in the pipeline")


def test_moe_combine_merges_into_the_boundary(tiny_bp):
    """Before: blend | post-mix | pre-mix + norm, three groups. After: one fused:moe_combine_hc group
    holding exactly their nodes (the last MoE layer's blend joins the head + final norm instead);
    the blend's output edge has no buffer; fewer launches by one per blend."""
    before = _default_before(tiny_bp, Options(add_fusions=COMBINE))
    after = fuse_groups(before)
    blends = [g for g in before.groups if _ops(tiny_bp, g) == ["blend"]]
    assert len(blends) == 2
    by_id = {g.id: g for g in before.groups}
    hc = [g for g in after.groups if g.rule == "fused:moe_combine_hc"]
    head = [g for g in after.groups if g.rule == "fused:moe_combine_head"]
    assert len(hc) == 1 and len(head) == 1
    assert _ops(tiny_bp, hc[0]) == sorted(["blend", "hc_post", "linear:hc_mix", "hc_pre", "rms_norm"])
    assert _ops(tiny_bp, head[0]) == sorted(["blend", "hc_post", "hc_contract", "final_norm"])
    for g in hc + head:
        assert g.family == "glm_mhc" and g.id == g.fused_from[0] and g.fused_from[0] in {b.id for b in blends}
        assert set(g.nodes) == {n for m in g.fused_from for n in by_id[m].nodes}
    assert not any(g.rule.startswith("glm_moe_combine") for g in after.groups)
    plan = run_pipeline(tiny_bp, Options(add_fusions=COMBINE), verify=True)
    names = {b.name for b in plan.buffers}
    for g in plan.groups:
        if g.rule.startswith("fused:moe_combine"):
            blend = next(tiny_bp.node_by_id[n] for n in g.nodes if tiny_bp.node_by_id[n].op == "blend")
            assert all(buffer_name(tiny_bp, t) not in names for t in tiny_bp.outputs(blend.order))
    skipped = run_pipeline(tiny_bp, Options(skip_fusions=("moe_combine_hc", "moe_combine_head")))
    from kbpc.codegen.emit import build_step
    count = {k: sum(len(g.launches) for g in build_step(p, "x").groups) for k, p in (("on", plan), ("off", skipped))}
    assert count["on"] == count["off"] - 2


def test_moe_combine_keeps_the_shared_expert_wait(tiny_bp):
    """The shared expert runs on a side stream and the blend waited on its event: the merged group
    waits on that same event, so the combine never reads a shared row not yet written."""
    def shared_waits(plan, want_ops):
        sched = {s.group: s for s in plan.schedule}
        deps = plan.grouping.dependencies()
        out = []
        for g in plan.groups:
            if "blend" not in _ops(tiny_bp, g):
                continue
            (shared,) = [d for d in deps[g.id] if "linear:shared_down" in _ops(tiny_bp, next(
                x for x in plan.groups if x.id == d))]
            s, sh = sched[g.id], sched[shared]
            assert _ops(tiny_bp, g) in want_ops
            out.append((s.stream != sh.stream, sh.record in s.waits if s.stream != sh.stream else True))
        return out
    fused = shared_waits(run_pipeline(tiny_bp, Options(add_fusions=COMBINE)),
                         [sorted(["blend", "hc_post", "linear:hc_mix", "hc_pre", "rms_norm"]),
                          sorted(["blend", "hc_post", "hc_contract", "final_norm"])])
    apart = shared_waits(run_pipeline(tiny_bp, Options(skip_fusions=("moe_combine_hc", "moe_combine_head"))),
                         [["blend"]])
    assert fused and all(ok for _, ok in fused) and all(ok for _, ok in apart)
    assert any(cross for cross, _ in fused)  # the tiny plan puts the shared expert on another stream


def test_moe_combine_refusals(tiny_bp):
    """The rule needs the blend's output to feed the merged post-mix alone, and has no tensor-parallel
    form (a rank's blend is a partial that every rank's post-mix reads)."""
    from kbpc.passes.fusion_rules import _blend_feeds_post_only
    nodes = tiny_bp.nodes()
    blend = next(n for n in nodes if n.op == "blend")
    post = next(tiny_bp.node(t.dst) for t in tiny_bp.outputs(blend.order))
    assert post.op == "hc_post" and _blend_feeds_post_only(tiny_bp, [blend, post]) is None

    class ExtraReader:  # the blueprint as it is, plus one more reader of the blend's output
        def outputs(self, order):
            out = tiny_bp.outputs(order)
            return out + [dataclasses.replace(out[0], dst=post.order + 1)] if order == blend.order else out

        def node(self, order):
            return tiny_bp.node(order)
    why = _blend_feeds_post_only(ExtraReader(), [blend, post])
    assert why and tiny_bp.node(post.order + 1).id in why
    tp = run_pipeline(tiny_bp, Options(tp=2, add_fusions=COMBINE))
    assert not any(g.rule.startswith("fused:moe_combine") for g in tp.groups)
    refused = [f.reason for f in tp.fusions if f.rule.startswith("moe_combine")]
    assert sum("tensor-parallel" in why for why in refused) == 2  # the boundary and the head candidates


def test_fusion_reduces_launches(tiny_bp):
    from kbpc.codegen.emit import build_step
    count = {f: sum(len(g.launches) for g in build_step(run_pipeline(tiny_bp, Options(fuse=f)), "x").groups)
             for f in (False, True)}
    fusions = [f for f in run_pipeline(tiny_bp, Options()).fusions if f.applied]
    merged = sum(len(f.groups) - 1 for f in fusions)
    # kda_conv_gates merges the q|k|v pack too, which launches nothing unfused (written in place)
    in_place_packs = sum(f.rule == "kda_conv_gates" for f in fusions)
    assert in_place_packs and count[True] == count[False] - merged + in_place_packs


def test_opt_in_rules_apply_only_on_request(tiny_bp):
    """Rules measured slower in the step are opt-in: left apart by default with the reason, applied
    with --fuse-rule."""
    assert OPT_IN_RULES
    default = run_pipeline(tiny_bp, Options())
    for name in OPT_IN_RULES:
        mine = [f for f in default.fusions if f.rule == name]
        # every candidate left apart, those the rule could merge for being opt-in
        assert mine and not any(f.applied for f in mine) and any("opt-in" in f.reason for f in mine)
        asked = run_pipeline(tiny_bp, Options(add_fusions=(name,)))
        assert any(f.applied for f in asked.fusions if f.rule == name)


# ------------------------------------------------------------------ router_expert_quant

RQ_OPS = sorted(["router", "top_k", "act_quant", "expert_gate_up"])


def _moe_nodes(bp, block: str) -> dict[str, object]:
    """The router, top_k, the routed experts' input quantizer and gate/up node of one MoE block."""
    nodes = [n for n in bp.nodes() if n.block == block]
    gate_up = next(n for n in nodes if n.op == "expert_gate_up")
    quant = bp.node(next(t for t in bp.inputs(gate_up.order) if t.format == "nvfp4/g16").src)
    return {"router": next(n for n in nodes if n.op == "router"), "top_k": next(n for n in nodes if n.op == "top_k"),
            "quant": quant, "gate_up": gate_up}


def test_router_expert_quant_merges(tiny_bp):
    """Before: router GEMV | top-k | {act_quant, expert_gate_up}, three groups. After (default): one
    glm_router_topk group per MoE block holding exactly their nodes (ids from the three groups, the
    router's the lowest), the logits edge without a buffer, the ids and weights still buffers (the
    down projection and the combine read them), the quantizer's rows in its scratch state; two
    launches fewer per MoE block than the blueprint's groups, one fewer than router_gemv_topk."""
    from kbpc.codegen.emit import build_step
    before = _before(tiny_bp, add_fusions=())
    by_id = {g.id: g for g in before.groups}
    moe_blocks = sorted({n.block for n in tiny_bp.nodes() if n.op == "top_k"})
    after = fuse_groups(before)
    merged = [g for g in after.groups if g.rule == "fused:router_expert_quant"]
    assert len(merged) == len(moe_blocks) > 0
    for g, block in zip(merged, moe_blocks):
        m = _moe_nodes(tiny_bp, block)
        router_id, top_k_id, gate_up_id = g.fused_from
        assert g.id == router_id and _ops(tiny_bp, g) == RQ_OPS
        assert by_id[router_id].nodes == (m["router"].id,) and by_id[top_k_id].nodes == (m["top_k"].id,)
        assert set(by_id[gate_up_id].nodes) == {m["quant"].id, m["gate_up"].id}
        assert g.nodes == (m["router"].id, m["top_k"].id, m["quant"].id, m["gate_up"].id)
        assert (g.family, g.variant) == ("glm_router_topk", "cuda_core")
    assert not any(g.rule == "fused:router_gemv_topk" for g in after.groups)
    plan = run_pipeline(tiny_bp, Options(), verify=True)
    names, state = {b.name for b in plan.buffers}, {s.name for s in plan.state}
    for block in moe_blocks:
        assert f"{block}.gate.logits" not in names
        assert {f"{block}.top_k.topk_w", f"{block}.top_k.topk_id"} <= names
        assert {f"{block}.xn_quant.codes", f"{block}.xn_quant.scales", f"{block}.xn_quant.g"} <= state
    count = {k: sum(len(g.launches) for g in build_step(run_pipeline(tiny_bp, o), "x").groups)
             for k, o in (("on", Options()), ("off", Options(skip_fusions=NO_RQ)))}
    assert count["on"] == count["off"] - len(moe_blocks)


def test_router_expert_quant_check(tiny_bp):
    """The check accepts each MoE block's four nodes and says why not when the quantizer reads
    another row, writes another format, feeds an expert without a static scale, or the router is
    not the fused router's BF16 GEMV."""
    import dataclasses as dc
    rule = next(r for r in FUSION_RULES if r.name == "router_expert_quant")
    assert not rule.tensor_parallel and rule.default
    blocks = sorted({n.block for n in tiny_bp.nodes() if n.op == "top_k"})
    m = _moe_nodes(tiny_bp, blocks[0])
    nodes = [m["router"], m["top_k"], m["quant"], m["gate_up"]]
    assert rule.check(tiny_bp, nodes) is None
    other = _moe_nodes(tiny_bp, blocks[1])["quant"]
    assert "does not quantize" in rule.check(tiny_bp, [m["router"], m["top_k"], other, m["gate_up"]])
    fp8 = dc.replace(m["router"], precision=dc.replace(m["router"].precision, weight="fp8/channel"))
    assert "not a BF16 GEMV" in rule.check(tiny_bp, [fp8, m["top_k"], m["quant"], m["gate_up"]])

    class Rewired:  # the blueprint with one tensor edge or node changed
        def __init__(self, edge=None, node=None):
            self.edge, self.nd = edge, node

        def inputs(self, order):
            return tiny_bp.inputs(order)

        def outputs(self, order):
            out = tiny_bp.outputs(order)
            return [self.edge(t) for t in out] if self.edge and order == m["quant"].order else out

        def node(self, order):
            n = tiny_bp.node(order)
            return self.nd(n) if self.nd and order == m["gate_up"].order else n
    fp8_rows = Rewired(edge=lambda t: dc.replace(t, format="fp8/token"))
    assert "does not write nvfp4/g16" in rule.check(fp8_rows, nodes)
    dynamic = Rewired(node=lambda n: dc.replace(n, family="w4a4_mx"))
    assert "static input scale" in rule.check(dynamic, nodes)


def test_router_expert_quant_refusals(tiny_bp):
    """moe_layer, asked for, takes the nodes first; --no-act-quant refuses the rule with the
    quantizing fusions' reason (router_gemv_topk then merges the pair); a split plan refuses it
    (router_gemv_topk serves the ranks); --no-fuse-rule leaves it apart."""
    def records(options):
        plan = run_pipeline(tiny_bp, options)
        return plan, [f for f in plan.fusions if f.rule == "router_expert_quant"]
    plan, mine = records(Options(add_fusions=("moe_layer",)))
    assert any(g.rule == "fused:moe_layer" for g in plan.groups)
    assert not any(g.rule in ("fused:router_expert_quant", "fused:router_gemv_topk") for g in plan.groups)
    for options, reason in ((Options(act_quant=False), "activation quantization is off (--no-act-quant)"),
                            (Options(tp=2), "no tensor-parallel variant"),
                            (Options(skip_fusions=NO_RQ), "skipped (--no-fuse-rule router_expert_quant)")):
        plan, mine = records(options)
        assert mine and all(not f.applied and reason in f.reason for f in mine), options
        assert sum(g.rule == "fused:router_gemv_topk" for g in plan.groups) == len(mine)


def test_mla_attend_quant_merges_in_fast_mode_only(tiny_bp):
    """Before: the MLA decode | its output's per-token FP8 quantizer, two groups per DSA block.
    After (asked for with --fuse-rule, in fast mode): one glm_mla_decode group holding both, the
    BF16 decode output without a buffer (the codes and scales still one: the output projection reads
    them), one launch fewer per DSA block. By default it is left apart as measured; in exact mode it
    is refused with its reason (no exact fused form); the check says why not for a quantizer of
    another row."""
    from kbpc.codegen.emit import build_step
    attends = [n for n in tiny_bp.nodes() if n.op == "mla_attention"]
    quants = {n.block: n for n in tiny_bp.nodes() if n.op == "act_quant"
              and any(t.src == a.order for a in attends for t in tiny_bp.inputs(n.order))}
    assert attends and len(quants) == len(attends)
    after = fuse_groups(_before(tiny_bp, add_fusions=("mla_attend_quant",)))
    merged = [g for g in after.groups if g.rule == "fused:mla_attend_quant"]
    assert len(merged) == len(attends)
    for g, a in zip(merged, attends):
        assert g.nodes == (a.id, quants[a.block].id) and g.family == "glm_mla_decode"
    asked = Options(add_fusions=("mla_attend_quant",))
    plan = run_pipeline(tiny_bp, asked, verify=True)
    names = {b.name for b in plan.buffers}
    for a in attends:
        (out,) = tiny_bp.outputs(a.order)
        assert buffer_name(tiny_bp, out) not in names
        (codes,) = tiny_bp.outputs(quants[a.block].order)
        assert buffer_name(tiny_bp, codes) in names
    count = {k: sum(len(g.launches) for g in build_step(run_pipeline(tiny_bp, o), "x").groups)
             for k, o in (("on", asked), ("off", Options()))}
    assert count["on"] == count["off"] - len(attends)
    default = [f for f in run_pipeline(tiny_bp, Options()).fusions if f.rule == "mla_attend_quant"]
    assert default and all(not f.applied and "opt-in" in f.reason for f in default)
    exact = run_pipeline(tiny_bp, dataclasses.replace(asked, numerics="exact"))
    refused = [f for f in exact.fusions if f.rule == "mla_attend_quant"]
    assert len(refused) == len(attends) and all(not f.applied and "numerics fast only" in f.reason for f in refused)
    rule = next(r for r in FUSION_RULES if r.name == "mla_attend_quant")
    other = next(n for n in tiny_bp.nodes() if n.op == "act_quant" and n not in quants.values())
    assert "does not read the decode's output" in rule.check(tiny_bp, [attends[0], other])
