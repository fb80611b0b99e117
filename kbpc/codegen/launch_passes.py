"""Launch passes: rewrites of the step program between family lowering and rendering, in one
ordered table. Each is a pure function (StepProgram, Options) -> StepProgram; its docstring says
what it guarantees. Fusions that are plan facts (which nodes run in one group) belong to the plan
passes (kbpc/passes/); these passes only change how the launches are issued."""
from __future__ import annotations

import dataclasses
from typing import Callable

from kbpc.codegen.collectives import place_collectives as _place
from kbpc.codegen.context import LoweringError
from kbpc.codegen.records import Collective, GroupCode, Launch, StepProgram
from kbpc.ir.plan import Options
from kbpc.targets import get_target

LaunchPass = Callable[[StepProgram, Options], StepProgram]


def issue_aside(step: StepProgram, options: Options) -> StepProgram:
    """Launches marked `aside` (Launch.aside: the nodes that read what they write) leave their
    group's stream: each becomes a group of its own on one extra stream, right after its group,
    waiting for an event recorded after that group's other launches; every group holding one of
    its reader nodes waits for an event recorded after it. So the kernels after the group on its
    stream no longer wait for the aside launch (under PDL a kernel waits for its whole predecessor
    grid), and its readers still see its writes. A reader that never comes is a lowering error."""
    if not any(isinstance(l, Launch) and l.aside for g in step.groups for l in g.launches):
        return step
    side, events = step.streams, step.events
    pending: dict[str, set[int]] = {}   # reader node -> events of the aside groups it must wait for
    groups: list[GroupCode] = []
    for g in step.groups:
        extra = sorted({e for n in g.nodes for e in pending.pop(n, ())} - set(g.waits))
        aside = tuple(l for l in g.launches if isinstance(l, Launch) and l.aside)
        main = tuple(l for l in g.launches if not (isinstance(l, Launch) and l.aside))
        record = g.record
        if aside and record is None:
            record, events = events, events + 1
        groups.append(dataclasses.replace(g, waits=g.waits + tuple(extra), launches=main, record=record))
        for launch in aside:
            groups.append(GroupCode(group=g.group, rule=f"aside:{g.rule}", family=g.family, stream=side,
                                    waits=(record,), record=events, nodes=launch.nodes, launches=(launch,),
                                    urgent=g.urgent))
            for reader in launch.aside:
                pending.setdefault(reader, set()).add(events)
            events += 1
    if pending:
        raise LoweringError(f"aside launches whose readers {sorted(pending)} are not in the step")
    return dataclasses.replace(step, groups=tuple(groups), streams=side + 1, events=events)


def mark_pdl(step: StepProgram, options: Options) -> StepProgram:
    """Programmatic dependent launch: every launch whose stream predecessor is a kernel of this step
    (no event wait between them) is issued with the PDL attribute, so it starts while that kernel
    drains and waits for it in kbp::pdl_wait(). The first launch on each stream keeps a full
    dependency, and so does a launch after a collective (an NCCL kernel triggers no dependent
    launch). A launch after a cross-stream event wait keeps one too unless
    options.pdl_across_events (experimental): CUDA documents the attribute as resolving the
    dependency on the previous kernel *in the stream* and leaves unsaid how capture annotates the
    edge from the event's kernel; either way every kernel calls pdl_wait(), which waits for all of
    its prerequisite grids (tests/gpu/test_gpu_pdl_events.py). Counted on an H200 with CUDA 13.0
    (`kbpc bench` reports it): the seed shrink's captured graph holds 817 programmatic edges for 650
    launches, so capture made the event's edge programmatic as well. With options.pdl off, no
    launch is marked."""
    if not options.pdl:
        return step
    seen_stream: set[int] = set()
    groups = []
    for g in step.groups:
        launches = []
        for i, launch in enumerate(g.launches):
            if isinstance(launch, Collective):
                seen_stream.discard(g.stream)
                launches.append(launch)
                continue
            after_event = i == 0 and bool(g.waits)
            after_kernel = g.stream in seen_stream and (options.pdl_across_events or not after_event)
            launches.append(dataclasses.replace(launch, pdl=after_kernel))
            seen_stream.add(g.stream)
        if not g.launches and g.waits:   # a group with nothing to launch (a concat written in place)
            seen_stream.discard(g.stream)  # still orders its stream after the events it waits for
        groups.append(dataclasses.replace(g, launches=tuple(launches)))
    return dataclasses.replace(step, groups=tuple(groups))


def mark_priority(step: StepProgram, options: Options) -> StepProgram:
    """Launch priority: the launches of the groups the schedule puts on the modelled critical path
    (ScheduledGroup.urgent) are issued at the device's highest priority, so where kernels of
    several streams wait for SMs, the block scheduler places theirs first (a side branch such as
    the query up-projection then yields to the index select). So are the small launches (at most
    one CTA an SM of the target) on any stream: a latency-bound link of a side branch, such as the
    DSA index key's norm and store that the index select waits for, otherwise queues behind every
    pending CTA of a large grid launched before it (the query up-projection's 1024), while placing
    it first costs that grid one CTA slot for a few microseconds (H200, 128-expert seed shrink,
    replay timelines at 16k: the index store ended 13.5 us after the DSA layer's opening boundary
    instead of 17.0, the DSA sublayer 78.5 instead of 80.1 us; at 1k 61.3 instead of 61.9;
    bench/NOTES.md, twenty-ninth session). The runtime instantiates the step's graph with node
    priorities; priority never changes what a kernel computes. With options.pdl off (the plain
    baseline), no launch is marked."""
    if not options.pdl:
        return step
    small = get_target(options.target).sms
    groups = []
    for g in step.groups:
        launches = tuple(dataclasses.replace(l, priority=g.urgent or l.grid[0] * l.grid[1] * l.grid[2] <= small)
                         if not isinstance(l, Collective) else l for l in g.launches)
        groups.append(dataclasses.replace(g, launches=launches))
    return dataclasses.replace(step, groups=tuple(groups))


def place_collectives(step: StepProgram, options: Options) -> StepProgram:
    """Tensor parallelism: an all-gather before each post-mix that sums rank partials, and the
    expert-parallel id rewrite after each router (kbpc/codegen/collectives.py)."""
    return _place(step, options, step.collective_layout)


LAUNCH_PASSES: tuple[tuple[str, LaunchPass], ...] = (
    ("place_collectives", place_collectives),
    ("issue_aside", issue_aside),
    ("mark_pdl", mark_pdl),
    ("mark_priority", mark_priority),
)


def run_launch_passes(step: StepProgram, options: Options) -> StepProgram:
    for _, fn in LAUNCH_PASSES:
        step = fn(step, options)
    return step


__all__ = ["LAUNCH_PASSES", "GroupCode", "issue_aside", "mark_pdl", "mark_priority", "place_collectives", "run_launch_passes"]
