"""lower_precision: explicit requantizations, each group's kernel variant for the target, and the
weight specs that become the bundle's weight manifest.

Needs: groups (validate). Guarantees: every edge that changes format has a quantizing producer
(an `act_quant` node, at=producer) or is converted by its reader (at=reader) and is recorded on
the group that does it; every group has a variant the target implements; `plan.weights` lists
every checkpoint tensor."""
from __future__ import annotations

import dataclasses

from kbpc.errors import KbpcError
from kbpc.ir.plan import Plan
from kbpc.ir.weights import weight_specs
from kbpc.targets import get_target, variant_for


def _variant(plan: Plan, target, group) -> str:
    """The family's variant on the target; without activation quantization, any group that holds an
    act_quant runs an `unquantized` variant (a family without one is refused when it is lowered)."""
    if group.where != "device":
        return "host"
    act_quant = plan.options.act_quant
    if not act_quant and any(n.op_base == "act_quant" for n in plan.grouping.nodes(group.id)):
        return "unquantized"
    return variant_for(target, group.family, act_quant)


def lower_precision(plan: Plan) -> Plan:
    bp = plan.blueprint
    target = get_target(plan.options.target)
    requants: dict[int, list[str]] = {g.id: [] for g in plan.groups}
    for t in bp.tensors():
        if t.requant is None:
            continue
        src, dst = bp.node(t.src), bp.node(t.dst)
        if t.requant.at == "producer":
            if src.op != "act_quant":
                raise KbpcError(f"requantization at the producer, but {src.id} is a {src.op}, not an "
                                "act_quant", f"edge {t.id} (edges[{t.index}])")
            owner = plan.grouping.group_of(src)
        elif t.requant.at == "reader":
            owner = plan.grouping.group_of(dst)
        else:
            raise KbpcError(f"requant 'at' must be producer or reader, got {t.requant.at!r}",
                            f"edge {t.id} (edges[{t.index}])")
        requants[owner].append(f"{t.requant.src}->{t.requant.dst}@{t.id}")
    groups = tuple(dataclasses.replace(g, variant=_variant(plan, target, g), requants=tuple(requants[g.id]))
                   for g in plan.groups)
    notes = plan.notes
    if any(g.variant == "e2m1_dp4a_exact" for g in groups):
        why = ("has no FP4 block-scaled MMA" if not target.fp4_block_mma else
               "has the FP4 block-scaled MMA, not yet validated on hardware")
        notes += (f"{target.name} {why}: W4A4 groups run the exact e2m1_dp4a_exact variant (same "
                  "NVFP4 bytes and activation quantization, integer dot products per group)",)
    return dataclasses.replace(plan, groups=groups, weights=tuple(weight_specs(bp)), notes=notes)
