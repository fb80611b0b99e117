"""validate: the front end's checks hold and the options fit the blueprint.

Needs: a loaded Blueprint. Guarantees: every blueprint group is a plan group (the tensor-parallel
size is checked against the blueprint by split_tensor_parallel)."""
from __future__ import annotations

import dataclasses

from kbpc.errors import KbpcError
from kbpc.ir.plan import LoweredGroup, Plan


def validate(plan: Plan) -> Plan:
    bp = plan.blueprint
    groups = tuple(
        LoweredGroup(id=g.id, rule=g.rule, family=_family(bp, g.id), nodes=tuple(n.id for n in bp.group_nodes(g.id)),
                     kernels=g.kernels, variant="", where=g.where)
        for g in bp.groups)
    return dataclasses.replace(plan, groups=groups)


def _family(bp, gid: int) -> str:
    fams = [n.family for n in bp.group_nodes(gid) if n.family]
    if not fams:
        raise KbpcError("group has no kernel family", f"group {gid}")
    return max(set(fams), key=fams.count)
