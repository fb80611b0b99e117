"""Launch passes: rewrites of the step program between family lowering and rendering, in one
ordered table. Each is a pure function (StepProgram, Options) -> StepProgram; its docstring says
what it guarantees. Fusions that are plan facts (which nodes run in one group) belong to the plan
passes (kbpc/passes/); these passes only change how the launches are issued."""
from __future__ import annotations

import dataclasses
from typing import Callable

from kbpc.codegen.collectives import place_collectives as _place
from kbpc.codegen.records import Collective, GroupCode, StepProgram
from kbpc.ir.plan import Options

LaunchPass = Callable[[StepProgram, Options], StepProgram]


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
    the query up-projection then yields to the index select). The runtime instantiates the step's
    graph with node priorities; priority never changes what a kernel computes. With
    options.pdl off (the plain baseline), no launch is marked."""
    if not options.pdl:
        return step
    groups = []
    for g in step.groups:
        launches = tuple(dataclasses.replace(l, priority=g.urgent) if not isinstance(l, Collective) else l
                         for l in g.launches)
        groups.append(dataclasses.replace(g, launches=launches))
    return dataclasses.replace(step, groups=tuple(groups))


def place_collectives(step: StepProgram, options: Options) -> StepProgram:
    """Tensor parallelism: an all-gather before each post-mix that sums rank partials, and the
    expert-parallel id rewrite after each router (kbpc/codegen/collectives.py)."""
    return _place(step, options, step.collective_layout)


LAUNCH_PASSES: tuple[tuple[str, LaunchPass], ...] = (
    ("place_collectives", place_collectives),
    ("mark_pdl", mark_pdl),
    ("mark_priority", mark_priority),
)


def run_launch_passes(step: StepProgram, options: Options) -> StepProgram:
    for _, fn in LAUNCH_PASSES:
        step = fn(step, options)
    return step


__all__ = ["LAUNCH_PASSES", "GroupCode", "mark_pdl", "mark_priority", "place_collectives", "run_launch_passes"]
