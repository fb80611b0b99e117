"""Plan -> sources: lower every scheduled group with its family lowering into a step program of
typed launches, run the launch passes on it, then render one TU per kernel instance and the step
program from templates/. Output is byte-identical run to run (stable iteration order, no
timestamps)."""
from __future__ import annotations

from dataclasses import dataclass

import jinja2

from kbpc.codegen.context import LowerCtx, LoweringError
from kbpc.codegen.escape import FILTERS
from kbpc.codegen.families import lower_group
from kbpc.codegen.launch_passes import run_launch_passes
from kbpc.codegen.records import (GroupCode, KernelInstance, StateBinding, StepProgram,
                                  WeightBinding)
from kbpc.codegen.render_args import launch_call, launcher_decl, render_arg
from kbpc.ir.plan import Plan
from kbpc.toolchain.assets import TEMPLATES_DIR


@dataclass(frozen=True)
class GeneratedHeader:
    blueprint_id: str
    plan_digest: str
    command: str


@dataclass(frozen=True)
class Sources:
    files: dict[str, str]            # relative path -> text (src/step.cu, src/kernels/<name>.cu)
    step: StepProgram


def _env() -> jinja2.Environment:
    # autoescape is for HTML; C++ text is escaped by the filters of escape.py where it is rendered
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)
    env.filters.update(FILTERS)
    env.filters["cxx"] = render_arg
    env.globals.update(launch_call=launch_call, launcher_decl=launcher_decl)
    return env


def build_step(plan: Plan, command: str, stamps: bool = False) -> StepProgram:
    ctx = LowerCtx(plan)
    groups = []
    by_id = {g.id: g for g in plan.groups}
    for s in sorted(plan.schedule, key=lambda s: s.position):
        g = by_id[s.group]
        groups.append(GroupCode(group=g.id, rule=g.rule, family=g.family, stream=s.stream,
                                waits=s.waits, record=s.record, nodes=g.nodes,
                                launches=tuple(lower_group(ctx, g)), urgent=s.urgent))
    instances: dict[str, KernelInstance] = {}
    for gc in groups:
        for launch in gc.launches:
            instances.setdefault(launch.instance.name, launch.instance)
    bp = plan.blueprint
    argmax = [n for n in bp.nodes() if n.op == "argmax"]
    if len(argmax) != 1:
        raise LoweringError(f"expected one argmax node for the logits, found {len(argmax)}")
    logits = ctx.input(argmax[0])
    events = sum(1 for s in plan.schedule if s.record is not None)
    step = StepProgram(
        blueprint_id=bp.meta.blueprint_id, plan_digest=plan.digest, command=command,
        target=plan.options.target, streams=plan.streams, events=events,
        arena_bytes=plan.arena_bytes, vocab=logits.dim_value, logits_buffer=ctx.buf(logits),
        logits_bytes=logits.dim_value * 2, groups=tuple(groups),
        weights=tuple(WeightBinding(i, w.name, w.storage, w.nbytes) for i, w in enumerate(plan.weights)),
        state=tuple(StateBinding(i, s.name, s.nbytes, s.storage) for i, s in enumerate(plan.state)),
        headers=tuple(sorted({inst.header for inst in instances.values()})),
        instances=tuple(instances[k] for k in sorted(instances)), collective_layout=ctx.tp, stamps=stamps)
    return run_launch_passes(step, plan.options)


def generate(plan: Plan, command: str, stamps: bool = False) -> Sources:
    """stamps: a profiling build, whose kernels record their phase stamps (kernels/kbp_stamps.cuh)."""
    return render(build_step(plan, command, stamps))


def render(step: StepProgram) -> Sources:
    """The sources of a step program: src/step.cu and one TU per kernel instance."""
    header = GeneratedHeader(step.blueprint_id, step.plan_digest, step.command)
    env = _env()
    files = {"src/step.cu": env.get_template("step.cu.j2").render(header=header, step=step)}
    tu = env.get_template("kernel_instance.cu.j2")
    for inst in step.instances:
        files[f"src/kernels/{inst.name}.cu"] = tu.render(inst=inst, stamps=step.stamps)
    return Sources(files=files, step=step)
