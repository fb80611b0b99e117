"""The pass pipeline: one ordered table. Each pass is a pure function Plan -> Plan in its own
module; its docstring says what it needs and what it guarantees."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from kbpc.ir.graph import Blueprint
from kbpc.ir.plan import Options, Plan
from kbpc.passes.check_fusion import check_fusion
from kbpc.passes.fuse_groups import fuse_groups
from kbpc.passes.invariants import check_invariants
from kbpc.passes.lower_precision import lower_precision
from kbpc.passes.plan_memory import plan_memory
from kbpc.passes.schedule_streams import schedule_streams
from kbpc.passes.split_tensor_parallel import split_tensor_parallel
from kbpc.passes.validate import validate
from kbpc.util.atomic import write_text_atomic

Pass = Callable[[Plan], Plan]

PIPELINE: tuple[tuple[str, Pass], ...] = (
    # check what the blueprint planned
    ("validate", validate),
    ("check_fusion", check_fusion),
    # lower it to this target
    ("lower_precision", lower_precision),
    ("fuse_groups", fuse_groups),
    ("split_tensor_parallel", split_tensor_parallel),
    # order and place it
    ("schedule_streams", schedule_streams),
    ("plan_memory", plan_memory),
)


def run_pipeline(bp: Blueprint, options: Options, *, verify: bool = False,
                 dump_dir: Path | None = None) -> Plan:
    """Run every pass in order; with `verify`, check the IR invariants after each one; with
    `dump_dir`, write each stage's plan as JSON (NN-name.json) for reproduction."""
    plan = Plan(blueprint=bp, options=options)
    for i, (name, fn) in enumerate(PIPELINE):
        plan = fn(plan)
        if verify:
            check_invariants(plan, name)
        if dump_dir is not None:
            write_text_atomic(Path(dump_dir) / f"{i:02d}-{name}.json",
                              json.dumps(plan.to_json(), indent=1, sort_keys=True) + "\n")
    return plan
