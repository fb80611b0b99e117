"""The pass pipeline on the seed and tiny blueprints: invariants after every pass, a stable plan
digest, schedules that respect dependencies, an arena smaller than the sum of its buffers, and the
fusion checks rejecting illegal groups."""
from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import pytest

from kbpc.errors import KbpcError
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import PIPELINE, run_pipeline
from kbpc.passes.check_fusion import _check_convex
from kbpc.passes.invariants import InvariantError, check_invariants
from kbpc.passes.ordering import HappensBefore
from kbpc.tools.shrink import shrink


@pytest.fixture(scope="module")
def seed_plan(seed_path):
    return run_pipeline(load_blueprint(seed_path), Options(max_context=16384), verify=True)


@pytest.fixture(scope="module")
def tiny_bp(tiny_path):
    return load_blueprint(tiny_path)


def test_pipeline_table_order():
    assert [name for name, _ in PIPELINE] == ["validate", "check_fusion", "lower_precision", "fuse_groups",
                                              "split_tensor_parallel", "schedule_streams", "plan_memory"]


def test_seed_plan(seed_plan):
    merged = sum(len(f.groups) - 1 for f in seed_plan.fusions if f.applied)
    assert merged > 0 and len(seed_plan.groups) == 909 - merged
    assert len(seed_plan.schedule) == 908 - merged   # every device group + the embed copy; argmax is host
    assert seed_plan.streams > 1
    assert seed_plan.critical_path_us < seed_plan.serial_us
    assert 0 < seed_plan.arena_bytes < sum(b.nbytes for b in seed_plan.buffers)
    assert any(g.variant == "e2m1_dp4a_exact" for g in seed_plan.groups)
    assert sum(s.nbytes for s in seed_plan.weights) > 170e9


def test_digest_is_stable(seed_path, seed_plan):
    again = run_pipeline(load_blueprint(seed_path), Options(max_context=16384))
    assert again.digest == seed_plan.digest
    other = run_pipeline(load_blueprint(seed_path), Options(max_context=16384, target="sm_121"))
    assert other.digest != seed_plan.digest
    assert any("not yet validated" in n for n in other.notes)


def test_state_grows_with_context(tiny_bp):
    small = run_pipeline(tiny_bp, Options(max_context=256))
    large = run_pipeline(tiny_bp, Options(max_context=512 * 1024))
    assert sum(s.nbytes for s in large.state) > 100 * sum(s.nbytes for s in small.state)


def test_schedule_without_event_is_caught(tiny_bp):
    plan = run_pipeline(tiny_bp, Options())
    crossing = next(s for s in plan.schedule if s.waits)
    broken = tuple(dataclasses.replace(s, waits=()) if s is crossing else s for s in plan.schedule)
    with pytest.raises(InvariantError, match="no event"):
        check_invariants(dataclasses.replace(plan, schedule=broken), "test")


def test_overlapping_buffers_are_caught(tiny_bp):
    plan = run_pipeline(tiny_bp, Options())
    a, b = sorted(plan.buffers, key=lambda x: x.first_use)[:2]
    if a.last_use < b.first_use:
        b = next(x for x in plan.buffers if x is not a and not (x.last_use < a.first_use or a.last_use < x.first_use))
    moved = tuple(dataclasses.replace(x, offset=a.offset) if x is b else x for x in plan.buffers)
    with pytest.raises(InvariantError, match="overlap"):
        check_invariants(dataclasses.replace(plan, buffers=moved), "test")


def test_non_convex_group_is_rejected(tiny_bp):
    # q_a -> q_a_norm -> ... -> q_b: a "group" of q_a and q_b with q_a_norm outside is not convex.
    ids = tiny_bp.node_by_id
    orders = {ids["l1.dsa.q_a"].order, ids["l1.dsa.q_b"].order}
    with pytest.raises(KbpcError, match="not convex"):
        _check_convex(tiny_bp, 999, orders)
    _check_convex(tiny_bp, 998, {ids["l1.dsa.q_a"].order, ids["l1.dsa.kv_a"].order})


def test_tp_splits_or_is_refused(tiny_bp):
    assert run_pipeline(tiny_bp, Options()).parallel is None
    assert run_pipeline(tiny_bp, Options(tp=2)).parallel.ranks == 2
    with pytest.raises(KbpcError, match="does not split over 3 ranks"):
        run_pipeline(tiny_bp, Options(tp=3))


def test_stream_schedule_waits_only_where_needed(seed_path):
    """Every group dependency is ordered by the schedule (stream order or events), and no group
    waits for an event its stream already knows finished: a redundant wait would cost the launch
    after it programmatic dependent launch."""
    seed = load_blueprint(seed_path)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "e16.json"
        path.write_text(json.dumps(shrink(seed, {"experts": 16}, list(range(len(seed.layers))))))
        plan = run_pipeline(load_blueprint(path), Options())
    hb = HappensBefore(plan.schedule)
    assert not hb.missing_events
    deps = plan.grouping.dependencies()
    assert all(hb.before(d, g) for g, ds in deps.items() for d in ds if g in hb.pos and d in hb.pos)
    by_event = {s.record: s for s in plan.schedule if s.record is not None}
    order = sorted(plan.schedule, key=lambda s: s.position)
    for s in order:
        for e in s.waits:   # without this wait, the producer would not be known finished
            rest = tuple(w for w in s.waits if w != e)
            trial = tuple(dataclasses.replace(x, waits=rest) if x.group == s.group else x for x in order)
            assert not HappensBefore(trial).before(by_event[e].group, s.group), (s.group, e)
