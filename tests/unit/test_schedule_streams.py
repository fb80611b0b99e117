"""schedule_streams' cost model and stream pick on the seed: the latency floors of the index select
and the MLA decode make the indexer's path the DSA layer's longest, so the index query GEMV, not
the query up-projection, continues the q_a norm's stream (and starts early under programmatic
dependent launch); the up-projection waits on an event. Every dependency stays ordered."""
from __future__ import annotations

import pytest

from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.passes.ordering import HappensBefore, group_dependencies
from kbpc.passes.schedule_streams import LATENCY_FLOOR_US, group_costs, remaining_path_us


@pytest.fixture(scope="module")
def seed_plan(seed_path):
    return run_pipeline(load_blueprint(seed_path), Options(max_context=16384))


def _group_with_op(plan, op, layer_block):
    ops = {n.id: n.op for n in plan.blueprint.nodes()}
    found = [g for g in plan.groups if any(ops[n] == op and n.startswith(layer_block) for n in g.nodes)]
    assert len(found) == 1, (op, layer_block, found)
    return found[0]


def _dsa_blocks(plan):
    return sorted({n.block for n in plan.blueprint.nodes() if n.op == "index_select"})


def test_latency_floors_price_the_chains(seed_plan):
    costs = group_costs(seed_plan)
    for block in _dsa_blocks(seed_plan):
        for op in ("index_select", "mla_attention"):
            g = _group_with_op(seed_plan, op, block + ".")
            assert costs[g.id] >= LATENCY_FLOOR_US[op]


def test_remaining_path_is_cost_plus_longest_successor(seed_plan):
    device = [g for g in seed_plan.groups if g.where == "device" or g.family == "embed_copy"]
    deps = group_dependencies(seed_plan)
    costs = group_costs(seed_plan)
    rank = remaining_path_us(device, deps, costs)
    ids = {g.id for g in device}
    for g in device:
        succ = [x for x in ids if g.id in deps[x]]
        assert rank[g.id] == pytest.approx(costs[g.id] + max((rank[x] for x in succ), default=0.0))


def test_index_query_continues_the_norm_stream(seed_plan):
    by_group = {s.group: s for s in seed_plan.schedule}
    hb = HappensBefore(seed_plan.schedule)
    blocks = _dsa_blocks(seed_plan)
    assert blocks
    for block in blocks:
        norm_group = next(g for g in seed_plan.groups
                          if any(n.startswith(block + ".") and n.endswith("q_a_norm") for n in g.nodes))
        index_q = by_group[_group_with_op(seed_plan, "linear:index_q", block + ".").id]
        q_b = by_group[_group_with_op(seed_plan, "linear:mla_q_b", block + ".").id]
        norm = by_group[norm_group.id]
        same_stream = sorted((s for s in seed_plan.schedule if s.stream == norm.stream), key=lambda s: s.position)
        after_norm = same_stream[same_stream.index(norm) + 1]
        assert after_norm.group == index_q.group and not index_q.waits, block
        assert q_b.stream != norm.stream and q_b.waits, block
        assert hb.before(norm.group, q_b.group)


def test_urgent_groups_are_the_critical_path(seed_plan):
    """The indexer's chain, the decode and the output projection are urgent (no modelled slack);
    the side branches with slack (the query up-projection, the latent write) and the shared experts
    are not."""
    by_group = {s.group: s for s in seed_plan.schedule}
    for block in _dsa_blocks(seed_plan):
        for op in ("linear:index_q", "index_select", "mla_attention", "linear:o"):
            assert by_group[_group_with_op(seed_plan, op, block + ".").id].urgent, (block, op)
        for op in ("linear:mla_q_b", "kv_write"):
            assert not by_group[_group_with_op(seed_plan, op, block + ".").id].urgent, (block, op)
    ops = {n.id: n.op for n in seed_plan.blueprint.nodes()}
    shared = [g for g in seed_plan.groups if any(ops[n] == "linear:shared_gate_up" for n in g.nodes)]
    assert shared and not any(by_group[g.id].urgent for g in shared)


def test_launch_priority_follows_urgency(seed_path):
    """Urgent groups' launches and small launches (at most one CTA an SM) run at the highest
    priority, large launches of groups with slack (the query up-projection) at the normal one;
    nothing without PDL (the plain baseline)."""
    from kbpc.codegen.emit import build_step
    from kbpc.codegen.records import Collective
    from kbpc.targets import get_target
    sms = get_target("sm_90").sms
    for pdl in (True, False):
        plan = run_pipeline(load_blueprint(seed_path), Options(max_context=16384, pdl=pdl))
        step = build_step(plan, "x")
        launches = [(g, l) for g in step.groups for l in g.launches if not isinstance(l, Collective)]
        small = lambda l: l.grid[0] * l.grid[1] * l.grid[2] <= sms   # noqa: E731
        assert all(l.priority == (pdl and (g.urgent or small(l))) for g, l in launches)
        assert any(l.priority for _, l in launches) == pdl
        if pdl:   # the index key's norm and pooled store (one CTA each) beside the query up-projection
            ops = {n.id: n.op for n in plan.blueprint.nodes()}
            prio = {ops[n]: l.priority for _, l in launches for n in l.nodes if n.startswith("l3.dsa.")}
            assert prio["layer_norm"] and prio["kpool_compress"] and not prio["linear:mla_q_b"]
