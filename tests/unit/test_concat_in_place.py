"""Memory planning writes a concat's inputs in place: the KDA q|k|v pack's inputs lie back to back
inside the packed row, their producer (the segmented projection) writes the row directly, the pack
launches nothing, and the arena invariants hold with the inputs sharing the row's bytes."""
from __future__ import annotations

from kbpc.codegen.emit import build_step
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.passes.invariants import check_invariants


def _plans(path):
    """Without rule kda_conv_gates, which merges the pack with the conv (its conv then reads q, k and v
    where the projection wrote them, and no packed row exists)."""
    bp = load_blueprint(path)
    skip = ("kda_conv_gates",)
    return (run_pipeline(bp, Options(skip_fusions=skip)),
            run_pipeline(bp, Options(arena_reuse=False, skip_fusions=skip)))


def test_pack_inputs_are_written_in_place(tiny_path):
    plan, debug = _plans(tiny_path)
    check_invariants(plan, "test")
    by_name = {b.name: b for b in plan.buffers}
    aliased = [b for b in plan.buffers if b.alias_of]
    assert aliased and len(aliased) % 3 == 0
    for region in {b.alias_of for b in aliased}:
        parts = sorted((b for b in aliased if b.alias_of == region), key=lambda b: b.offset)
        whole = by_name[region]
        assert parts[0].offset == whole.offset and sum(p.nbytes for p in parts) == whole.nbytes
        assert all(a.offset + a.nbytes == b.offset for a, b in zip(parts, parts[1:]))
        assert len({p.producer_group for p in parts}) == 1
    step, debug_step = build_step(plan, "x"), build_step(debug, "x")
    packs = [g for g in step.groups if g.family == "kda_pack"]
    assert packs and all(not g.launches for g in packs)
    assert all(g.launches for g in debug_step.groups if g.family == "kda_pack")   # debug arena: no aliasing
    records = [f for f in plan.fusions if f.rule == "concat_in_place"]
    assert records and all(f.applied for f in records)
    assert sum(len(g.launches) for g in step.groups) == sum(len(g.launches) for g in debug_step.groups) - len(packs)


def test_the_projection_writes_into_the_packed_row(tiny_path):
    plan, _ = _plans(tiny_path)
    step = build_step(plan, "x")
    region = {b.name: b for b in plan.buffers if b.alias_of}
    writes = {a.buffer for g in step.groups for launch in g.launches for a in _arena_args(launch.args)}
    assert set(region) <= writes


def _arena_args(args):
    from kbpc.codegen.args import ArenaPtr, walk
    return [a for arg in args for a in walk(arg) if isinstance(a, ArenaPtr)]
