"""The typed launch layer: arguments render to the step program's expressions in one place, launch
passes rewrite the step program, and the PDL pass marks exactly the launches that follow a kernel
on their own stream with no event wait in between (and, with the experimental
pdl_across_events, after one too)."""
from __future__ import annotations

from pathlib import Path

import pytest

from kbpc.codegen.args import (NULL, Aggregate, ArenaPtr, FloatLit, StatePtr, StepInput, WeightPtr,
                               WeightScalar, arena_buffers, lit)
from kbpc.codegen.emit import build_step, generate
from kbpc.codegen.launch_passes import mark_pdl
from kbpc.codegen.records import Collective, GroupCode, KernelInstance, Launch, StepProgram
from kbpc.codegen.render_args import launch_call, render_arg
from kbpc.errors import KbpcError
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline


def test_render_each_kind():
    assert render_arg(ArenaPtr("l0.x.y", 512, "float")) == "((float*)(A + 512))"
    assert render_arg(ArenaPtr("b", 512, "__nv_bfloat16").plus(3)) == "((__nv_bfloat16*)(A + 518))"
    assert render_arg(WeightPtr(7, "w", "float")) == "((const float*)W[7])"
    assert render_arg(WeightPtr(7, "w", "const float")) == "((const float*)W[7])"
    assert render_arg(WeightScalar(2, "s")) == "WS[2]"
    assert render_arg(StatePtr(1, "st", "int32_t")) == "((int32_t*)S[1])"
    assert render_arg(StepInput("SEQ")) == "SEQ"
    assert render_arg(lit(5)) == "5" and render_arg(FloatLit(1e-6)) == "1e-06f" and render_arg(NULL) == "nullptr"
    nested = Aggregate("kbp::T<2>", (Aggregate(None, (lit(1), NULL)), FloatLit(0.5)))
    assert render_arg(nested) == "kbp::T<2>{{1, nullptr}, 0.5f}"
    assert arena_buffers((nested, ArenaPtr("a", 0), Aggregate(None, (ArenaPtr("b", 8),)))) == {"a", "b"}


def test_bad_literals_are_refused():
    with pytest.raises(ValueError):
        FloatLit(float("inf"))
    with pytest.raises(ValueError):
        StepInput("A + 1")


@pytest.fixture(scope="module")
def tiny_steps(tiny_path):
    bp = load_blueprint(Path(tiny_path))
    return {pdl: build_step(run_pipeline(bp, Options(pdl=pdl)), "x") for pdl in (False, True)}


def test_pdl_marks_launches_after_a_kernel_on_their_stream(tiny_steps):
    off, on = tiny_steps[False], tiny_steps[True]
    assert not any(l.pdl for g in off.groups for l in g.launches)
    seen: set[int] = set()
    marked = 0
    for g in on.groups:
        for i, launch in enumerate(g.launches):
            want = g.stream in seen   # after an event wait too (Options.pdl_across_events, the default)
            assert launch.pdl == want, (g.group, i)
            marked += want
            seen.add(g.stream)
        if not g.launches and g.waits:
            seen.discard(g.stream)
    assert 0 < marked < sum(len(g.launches) for g in on.groups)


def test_step_program_renders_the_pdl_flag(tiny_path, tiny_steps):
    step = tiny_steps[True]
    text = generate(run_pipeline(load_blueprint(Path(tiny_path)), Options(pdl=True)), "x").files["src/step.cu"]
    for g in step.groups:
        for launch in g.launches:
            assert launch_call(launch, f"streams[{g.stream}]") in text
    assert ", 1, ((" in text and ", 0, ((" in text


def test_a_group_without_launches_still_costs_the_next_launch_its_pdl(tiny_steps):
    """A launchless group that waits for an event (a concat written in place) orders its stream
    after that event: the next launch on the stream must not be marked for PDL."""
    import dataclasses

    from kbpc.codegen.launch_passes import mark_pdl

    step = tiny_steps[False]
    groups = list(step.groups)
    i = next(k for k in range(1, len(groups)) if groups[k].launches and groups[k - 1].stream == groups[k].stream
             and not groups[k].waits and groups[k - 1].launches)
    empty = dataclasses.replace(groups[i - 1], launches=(), waits=(0,))
    trial = dataclasses.replace(step, groups=tuple(groups[:i - 1]) + (groups[i - 1], empty) + tuple(groups[i:]))
    marked = mark_pdl(trial, Options(pdl=True))
    assert not marked.groups[i + 1].launches[0].pdl


def _step(groups: tuple) -> StepProgram:
    return StepProgram(blueprint_id="t", plan_digest="d", command="c", target="sm_90", streams=2, events=2,
                       arena_bytes=0, vocab=1, logits_buffer=ArenaPtr("logits", 0), logits_bytes=2,
                       groups=groups, weights=(), state=(), headers=(), instances=(_INST,))


_INST = KernelInstance(family="f", header="f.cuh", kernel="kbp::k<1>", params=())


def _group(gid: int, stream: int, waits: tuple[int, ...], *kinds: str) -> GroupCode:
    launches = tuple(Collective("all_gather", 0, 8, 2, gid, ("n",), "b") if k == "collective" else
                     Launch(_INST, (1, 1, 1), (32, 1, 1), 0, (), gid, ("n",)) for k in kinds)
    return GroupCode(gid, "r", "f", stream, waits, None, ("n",), launches)


# (group, stream, waits, launches) -> PDL flags by default and with pdl_across_events.
_PDL_CASES = (
    (_group(0, 0, (), "k", "k"), (False, True), (False, True)),       # first on stream 0, then its successor
    (_group(1, 1, (0,), "k"), (False,), (False,)),                    # first on stream 1: no kernel before it
    (_group(2, 0, (), "k"), (True,), (True,)),
    (_group(3, 0, (1,), "k", "k"), (False, True), (True, True)),      # after an event wait: the option's case
    (_group(4, 1, (), "collective", "k"), (None, False), (None, False)),   # after a collective: never
    (_group(5, 1, (0,), "k"), (False,), (True,)),
)


@pytest.mark.parametrize("across", [False, True])
def test_mark_pdl_with_and_without_event_waits(across):
    step = mark_pdl(_step(tuple(c[0] for c in _PDL_CASES)), Options(pdl_across_events=across))
    for g, (_, default, with_events) in zip(step.groups, _PDL_CASES):
        got = tuple(None if isinstance(l, Collective) else l.pdl for l in g.launches)
        assert got == (with_events if across else default), g.group
    off = mark_pdl(_step(tuple(c[0] for c in _PDL_CASES)), Options(pdl=False, pdl_across_events=across))
    assert not any(getattr(l, "pdl", False) for g in off.groups for l in g.launches)


def test_pdl_across_events_marks_the_launches_after_event_waits(tiny_path, tiny_steps):
    """On by default: against --no-pdl-across-events, exactly the first launches after event waits
    gain the PDL attribute."""
    across = tiny_steps[True]
    default = build_step(run_pipeline(load_blueprint(Path(tiny_path)), Options(pdl_across_events=False)), "x")
    added = [(g.group, i) for g, d in zip(across.groups, default.groups)
             for i, (a, b) in enumerate(zip(g.launches, d.launches)) if a.pdl != b.pdl]
    assert added, "the tiny example has launches after event waits on streams with kernels"
    for gid, i in added:
        g = next(x for x in across.groups if x.group == gid)
        assert i == 0 and g.waits and g.launches[0].pdl


def test_max_streams_bounds_the_schedule(tiny_path):
    bp = load_blueprint(Path(tiny_path))
    one = run_pipeline(bp, Options(max_streams=1))
    assert one.streams == 1 and not any(s.waits for s in one.schedule)
    assert run_pipeline(bp, Options(max_streams=2)).streams <= 2
    with pytest.raises(KbpcError, match="max streams"):
        Options(max_streams=0)


def test_issue_aside_moves_a_launch_off_its_stream_and_orders_its_readers():
    """An aside launch becomes a group of its own on a new stream after an event of its group; the
    group holding its reader waits for the aside group's event; groups in between do not."""
    from kbpc.codegen.launch_passes import issue_aside

    def launch(gid, aside=()):
        return Launch(_INST, (1, 1, 1), (32, 1, 1), 0, (), gid, ("n",), aside=aside)

    g0 = GroupCode(0, "r0", "f", 0, (), None, ("a",), (launch(0), launch(0, aside=("c",))))
    g1 = GroupCode(1, "r1", "f", 1, (), 1, ("b",), (launch(1),))
    g2 = GroupCode(2, "r2", "f", 0, (1,), None, ("c",), (launch(2),))
    step = issue_aside(_step((g0, g1, g2)), Options())
    assert step.streams == 3 and step.events == 4
    main, aside, b, c = step.groups
    assert main.launches == (launch(0),) and main.record == 2
    assert (aside.group, aside.rule, aside.stream, aside.waits, aside.record) == (0, "aside:r0", 2, (2,), 3)
    assert aside.launches == (launch(0, aside=("c",)),)
    assert b == g1 and c.waits == (1, 3)
    assert issue_aside(_step((g1,)), Options()) == _step((g1,))   # nothing aside: unchanged
    from kbpc.codegen.context import LoweringError
    with pytest.raises(LoweringError, match="readers"):
        issue_aside(_step((g0, g1)), Options())


def test_tiny_step_issues_the_gates_aside(tiny_steps):
    """Every hyper-connection pre-mix's gates + Sinkhorn (hc_gates) run on the extra stream, after
    their boundary, and the next post-mix's group waits for them."""
    step = tiny_steps[True]
    aside = [g for g in step.groups if g.rule.startswith("aside:")]
    assert aside and all(g.stream == step.streams - 1 and len(g.launches) == 1 for g in aside)
    assert all(g.launches[0].instance.kernel.startswith("kbp::mhc::hc_gates<") for g in aside)
    for g in aside:
        readers = [r for r in step.groups if set(r.nodes) & set(g.launches[0].aside)]
        assert readers and all(g.record in r.waits for r in readers)


def test_profile_marks_one_per_launch(tiny_path):
    """kbp_profile_step records one mark after every launch, in issue order, aside parts included;
    profile_marks (what the manifest's step.marks lists for the bench report) names each with its
    plan group, its kernel's family, its stream and nodes: the rendered step declares that many
    marks and records marks 0 .. n-1 once each, each right after its launch."""
    import re

    from kbpc.codegen.records import profile_marks

    plan = run_pipeline(load_blueprint(Path(tiny_path)), Options())
    step = build_step(plan, "x")
    launches = [(g, l) for g in step.groups for l in g.launches]
    marks = profile_marks(step.groups)
    assert len(marks) == len(launches) > len(plan.schedule)
    assert [(m.group, m.family, m.stream, m.nodes) for m in marks] == [
        (g.group, l.instance.family, g.stream, l.nodes) for g, l in launches]
    assert {m.group for m in marks} == {s.group for s in plan.schedule}
    assert any(m.family != g.family for m, (g, _) in zip(marks, launches))   # fused groups hold other families
    text = generate(plan, "x").files["src/step.cu"]
    assert f"/*marks*/ {len(marks)}," in text
    assert [int(m) for m in re.findall(r"marks\[(\d+)\]", text)] == list(range(len(marks)))
    calls = text.split("KBP_CHECK(kbp_launch_")[1:]
    assert len(calls) == len(marks) and all("if (marks)" in c.split(";")[1] for c in calls)
