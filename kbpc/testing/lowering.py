"""Helpers for the pure (no nvcc) unit tests of family lowerings: plan a blueprint, pick a
family's groups, and check that a group's launches write every buffer it must write."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from kbpc.codegen.args import ArenaPtr, Arg, arena_buffers, walk
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.records import Launch
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import LoweredGroup, Options, Plan
from kbpc.passes import run_pipeline
from kbpc.passes.fusion_rules import OPT_IN_RULES
from kbpc.ir.buffers import buffer_name


@lru_cache(maxsize=8)
def planned(path: str, target: str = "sm_90", fuse: bool = False, numerics: str = "fast",
            arena_reuse: bool = True, opt_in: bool = True) -> tuple[Plan, LowerCtx]:
    """The planned blueprint and its lowering context; by default without the fusion pass, so a
    family's tests see the blueprint's own groups (fused forms are tested with fuse=True, which
    applies the opt-in rules too unless opt_in is False). arena_reuse=False: every buffer its own
    bytes, and no concat written in place (the pack keeps its copy)."""
    plan = run_pipeline(load_blueprint(Path(path)), Options(target=target, fuse=fuse, numerics=numerics,
                                                            add_fusions=OPT_IN_RULES if fuse and opt_in else (),
                                                            arena_reuse=arena_reuse))
    return plan, LowerCtx(plan)


def family_groups(plan: Plan, family: str) -> list[LoweredGroup]:
    return [g for g in plan.groups if g.family == family]


def output_buffers(plan: Plan, group: LoweredGroup) -> list[str]:
    """Buffers produced by the group's nodes (its non-fused outputs), by name."""
    bp, names = plan.blueprint, {b.name for b in plan.buffers}
    out = []
    for node_id in group.nodes:
        for t in bp.outputs(bp.node_by_id[node_id].order):
            name = buffer_name(bp, t)
            if name in names and name not in out:
                out.append(name)
    return out


def points_into(arg: Arg, name: str) -> bool:
    """Whether a launch argument is (or holds) a pointer into arena buffer `name`."""
    return any(isinstance(a, ArenaPtr) and a.buffer == name for a in walk(arg))


def unwritten(plan: Plan, group: LoweredGroup, launches: list[Launch]) -> list[str]:
    """Output buffers of the group that appear in no launch argument."""
    touched = set().union(*(arena_buffers(launch.args) for launch in launches))
    return [n for n in output_buffers(plan, group) if n not in touched]
