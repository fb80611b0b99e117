"""fuse_groups: merge groups across the blueprint's boundaries where a fused kernel form exists.

Needs: lowered groups with variants (lower_precision). Guarantees: every merged group holds exactly
the ops of one rule in kbpc/passes/fusion_rules.py and is convex in the group dependency graph (no
path leaves it and comes back), so stream scheduling and memory planning see an ordinary group;
edges inside a merged group have no buffer unless a group outside reads them too. `plan.fusions`
records every candidate: the groups merged, or why they were left apart. With options.fuse off
the plan keeps the blueprint's groups (the candidates are still reported, as not applied).

Search: for each rule, in group order, a group holding the rule's anchor op and no op the rule
lacks seeds a merge; groups joined to the merge by a data edge or reading the same tensor (or,
for a rule with `siblings`, reading any output of the same group) whose ops still fit the rule
are added, the earliest first,
until the merge holds exactly the rule's ops, and the rule's check accepts the merged nodes
(formats, which edge feeds which). Each group joins at most one merge."""
from __future__ import annotations

import dataclasses
from collections import Counter

import networkx as nx

from kbpc.errors import KbpcError
from kbpc.ir.plan import FusionRecord, LoweredGroup, Plan
from kbpc.passes.fusion_rules import FUSION_RULES, FusionRule
from kbpc.targets import get_target, variant_for


def fuse_groups(plan: Plan) -> Plan:
    grouping = plan.grouping
    ops = {g.id: Counter(n.op for n in grouping.nodes(g.id)) for g in plan.groups}
    device = {g.id for g in plan.groups if g.where == "device"}
    neighbours, siblings = _neighbours(plan), _siblings(plan)
    deps = grouping.dependencies()
    unknown = sorted(set(plan.options.skip_fusions + plan.options.add_fusions) - {r.name for r in FUSION_RULES})
    if unknown:
        raise KbpcError(f"no fusion rule {unknown[0]!r}; the rules are {', '.join(r.name for r in FUSION_RULES)}",
                        "--no-fuse-rule")
    taken: set[int] = set()
    records: list[FusionRecord] = []
    merges: list[tuple[FusionRule, tuple[int, ...]]] = []
    for rule in FUSION_RULES:
        for g in plan.groups:
            if (g.id in taken or g.id not in device or ops[g.id][rule.anchor] == 0
                    or ops[g.id] - rule.op_counts):
                continue
            near = {k: v | siblings[k] for k, v in neighbours.items()} if rule.siblings else neighbours
            members, missing = _grow(rule, g.id, ops, near, taken | (set(ops) - device), deps)
            if missing:
                records.append(FusionRecord(rule.name, members, False,
                                            f"no neighbouring group that keeps the merge convex holds {missing}"))
                continue
            refusal = rule.check(plan.blueprint, [n for m in members for n in grouping.nodes(m)])
            if refusal:
                records.append(FusionRecord(rule.name, members, False, refusal))
                continue
            if not plan.options.fuse:
                records.append(FusionRecord(rule.name, members, False, "fusion is off (--no-fuse)"))
                continue
            if rule.name in plan.options.skip_fusions:
                records.append(FusionRecord(rule.name, members, False, f"skipped (--no-fuse-rule {rule.name})"))
                continue
            if not rule.default and rule.name not in plan.options.add_fusions:
                records.append(FusionRecord(rule.name, members, False,
                                            f"opt-in (--fuse-rule {rule.name}): {rule.off_by_default_why}"))
                continue
            if rule.numerics is not None and plan.options.numerics != rule.numerics:
                records.append(FusionRecord(rule.name, members, False,
                                            f"the fused form exists in numerics {rule.numerics} only"))
                continue
            if not plan.options.act_quant and "act_quant" in rule.ops:
                records.append(FusionRecord(rule.name, members, False,
                                            "activation quantization is off (--no-act-quant): the fused "
                                            "form quantizes"))
                continue
            split = plan.options.tp > 1 or (plan.shard is not None and plan.shard.ranks > 1)
            if split and not rule.tensor_parallel:
                records.append(FusionRecord(rule.name, members, False,
                                            "the fused form has no tensor-parallel variant yet"))
                continue
            taken.update(members)
            merges.append((rule, members))
            records.append(FusionRecord(rule.name, members, True, rule.why))
    fused = dataclasses.replace(plan, groups=_merged(plan, merges), fusions=tuple(records))
    return dataclasses.replace(fused, groups=_in_dependency_order(fused))


def _in_dependency_order(plan: Plan) -> tuple[LoweredGroup, ...]:
    """The groups in their order, except that a merged group sitting before a producer of one of its
    later members moves down just after it (a topological sort that takes the earliest ready group
    first): later passes walk the groups as a topological order."""
    index = {g.id: i for i, g in enumerate(plan.groups)}
    graph = nx.DiGraph()
    graph.add_nodes_from(index)
    graph.add_edges_from((d, g) for g, ds in plan.grouping.dependencies().items() for d in ds)
    try:
        order = nx.lexicographical_topological_sort(graph, key=index.get)
        return tuple(plan.groups[index[g]] for g in order)
    except nx.NetworkXUnfeasible:   # fuse_groups only merges convex sets, so this is a bug
        raise KbpcError("the fused groups have no dependency order", "fuse_groups") from None


def _neighbours(plan: Plan) -> dict[int, set[int]]:
    """Groups joined by a data edge, either way, or reading the same tensor (horizontal fusion)."""
    out: dict[int, set[int]] = {g.id: set() for g in plan.groups}
    readers: dict[tuple[int, str], set[int]] = {}
    for t in plan.grouping.crossing_edges():
        a, b = plan.grouping.group_of(t.src), plan.grouping.group_of(t.dst)
        out[a].add(b)
        out[b].add(a)
        readers.setdefault((t.src, t.id), set()).add(b)
    for siblings in readers.values():
        for g in siblings:
            out[g] |= siblings - {g}
    return out


def _siblings(plan: Plan) -> dict[int, set[int]]:
    """Groups that read outputs of one producing group (any of its tensors): independent consumers
    of one producer, which a rule with `siblings` may put side by side in one launch."""
    out: dict[int, set[int]] = {g.id: set() for g in plan.groups}
    readers: dict[int, set[int]] = {}
    for t in plan.grouping.crossing_edges():
        readers.setdefault(plan.grouping.group_of(t.src), set()).add(plan.grouping.group_of(t.dst))
    for consumers in readers.values():
        for g in consumers:
            out[g] |= consumers - {g}
    return out


def _grow(rule: FusionRule, seed: int, ops: dict[int, Counter], neighbours: dict[int, set[int]],
          excluded: set[int], deps: dict[int, set[int]]) -> tuple[tuple[int, ...], str]:
    """(members, what is still missing) of the merge grown from `seed`: each step adds the
    earliest neighbouring group whose ops fit and that keeps the merge convex."""
    want = rule.op_counts
    members, have = [seed], Counter(ops[seed])
    while have != want:
        fits = sorted({n for m in members for n in neighbours[m]
                       if n not in members and n not in excluded and not (ops[n] - (want - have))})
        fits = [n for n in fits if _convex({*members, n}, deps)]
        if not fits:
            break
        members.append(fits[0])
        have += ops[fits[0]]
    missing = want - have
    return tuple(sorted(members)), ", ".join(sorted(missing.elements()))


def _convex(members: set[int], deps: dict[int, set[int]]) -> bool:
    """No group outside `members` is both reached from them and reaches them."""
    users: dict[int, set[int]] = {g: set() for g in deps}
    for g, ds in deps.items():
        for d in ds:
            users[d].add(g)
    def reach(start: set[int], edges: dict[int, set[int]]) -> set[int]:
        seen, stack = set(), [n for m in start for n in edges[m] if n not in start]
        while stack:
            n = stack.pop()
            if n not in seen:
                seen.add(n)
                stack.extend(x for x in edges[n] if x not in start)
        return seen
    return not (reach(members, users) & reach(members, deps))


def _merged(plan: Plan, merges: list[tuple[FusionRule, tuple[int, ...]]]) -> tuple[LoweredGroup, ...]:
    """The plan's groups with each merge replaced by one group (the lowest member id), nodes in
    blueprint order, the rule's family and that family's variant on the target."""
    by_id = {g.id: g for g in plan.groups}
    order = {n.id: n.order for n in plan.blueprint.nodes()}
    target = get_target(plan.options.target)
    replaced: dict[int, LoweredGroup | None] = {}
    for rule, members in merges:
        parts = [by_id[m] for m in members]
        nodes = tuple(sorted((n for p in parts for n in p.nodes), key=order.get))
        replaced[members[0]] = LoweredGroup(
            id=members[0], rule=f"fused:{rule.name}", family=rule.family, nodes=nodes,
            kernels=tuple(k for p in parts for k in p.kernels), variant=variant_for(target, rule.family, plan.options.act_quant),
            where=parts[0].where, requants=tuple(r for p in parts for r in p.requants),
            fused_from=tuple(members))
        replaced.update({m: None for m in members[1:]})
    out = []
    for g in plan.groups:
        if g.id not in replaced:
            out.append(g)
        elif replaced[g.id] is not None:
            out.append(replaced[g.id])
    return tuple(out)
