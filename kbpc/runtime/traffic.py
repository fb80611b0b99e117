"""Bytes each group must move per decode step: the floor its time is measured against.

A group reads its weights (routed experts: top_k of them), every activation buffer it reads and
writes its outputs once, and touches its sequence state: the conv window and the recurrent state
are read and written whole, the latent cache is read for the attended tokens (the indexer's
selection, at most the context) and written for one token, the indexer reads every persisted pool
key and its scores."""
from __future__ import annotations

from collections import defaultdict

from kbpc.ir.graph import Blueprint
from kbpc.ir.weights import weight_specs
from kbpc.ir.buffers import buffer_name


def _state_bytes(bp: Blueprint, node, context: int, index_cache: str = "f32") -> float:
    sym, c = bp.symbols, bp.config.constants
    total = 0.0
    for kind in node.state:
        if kind == "conv:update":
            total += 2 * bp.inputs(node.order)[0].dim_value * c.conv_width * 4
        elif kind == "h:update":
            total += 2 * sym["lin_v_heads"] * sym["lin_k_dim"] * sym["lin_v_dim"] * 4
        elif kind == "latent:write":
            total += bp.inputs(node.order)[0].dim_value
        elif kind == "latent:read":
            kp = sym["index_kpool"]
            attended = min(context + 1, (sym["index_topk"] // kp + 1) * kp)
            total += attended * sym["kv_lora"]
        elif kind == "index:write":
            total += 4 * sym["index_head_dim"] * 2          # key and gate row, pool key amortised
        elif kind == "index:read":   # pool keys (FP32, or E4M3 codes + a scale), scores written and read
            pools = (context + 1) // sym["index_kpool"]
            key = sym["index_head_dim"] + 4 if index_cache == "fp8" else sym["index_head_dim"] * 4
            total += pools * (key + 8)
    return total


def _node_weights(bp: Blueprint) -> dict[str, float]:
    weights: dict[str, float] = defaultdict(float)
    for spec in weight_specs(bp):
        weights[spec.node] += spec.bytes_per_token
    return weights


def group_bytes(bp: Blueprint, plan: dict, context: int) -> dict[int, float]:
    """group id -> bytes per step, from a plan's JSON (`plan.json` of a bundle)."""
    weights = _node_weights(bp)
    buffers = {b["name"]: b["nbytes"] for b in plan["buffers"]}
    index_cache = plan.get("options", {}).get("index_cache", "f32")
    out: dict[int, float] = defaultdict(float)
    group_of: dict[int, int] = {}          # node order -> the plan's group (after fusion)
    for g in plan["groups"]:
        for node_id in g["nodes"]:
            node = bp.node_by_id[node_id]
            group_of[node.order] = g["id"]
            out[g["id"]] += weights[node_id] + _state_bytes(bp, node, context, index_cache)
    seen: set[tuple[int, str]] = set()
    for t in bp.tensors():
        name = buffer_name(bp, t)
        if name not in buffers:
            continue
        for gid in (group_of[t.src], group_of[t.dst]):
            if (gid, name) not in seen:      # a group touches each buffer once
                seen.add((gid, name))
                out[gid] += buffers[name]
    return dict(out)


def mark_bytes(bp: Blueprint, plan: dict, context: int, marks,
               per_group: dict[int, float] | None = None) -> list[float]:
    """Bytes per step of each profile mark (one per launch: RunManifest.marks), adding up to the
    groups' bytes (`per_group`: group_bytes', computed here if not given): a launch owns the weights
    and sequence state of the nodes it computes; the rest of its group's bytes (the activation
    buffers, counted once per group) go to the group's first launch of the group's own family (else
    its first launch)."""
    per_group = group_bytes(bp, plan, context) if per_group is None else per_group
    weights = _node_weights(bp)
    index_cache = plan.get("options", {}).get("index_cache", "f32")
    family_of = {g["id"]: g["family"] for g in plan["groups"]}
    out = [0.0] * len(marks)
    owned: dict[int, float] = defaultdict(float)
    home: dict[int, int] = {}   # group -> the mark that takes the group's activation bytes
    for i, m in enumerate(marks):
        for node_id in m.nodes:
            node = bp.node_by_id.get(node_id)
            if node is not None:
                out[i] += weights[node_id] + _state_bytes(bp, node, context, index_cache)
        owned[m.group] += out[i]
        own_family = m.family == family_of.get(m.group)
        if m.group not in home or (own_family and marks[home[m.group]].family != m.family):
            home[m.group] = i
    for gid, i in home.items():
        out[i] += per_group.get(gid, 0.0) - owned[gid]
    return out


def family_bytes(bp: Blueprint, plan: dict, context: int, marks=None) -> dict[str, float]:
    """Bytes per step by kernel family: by each launch's family where the bundle's profile marks
    launches (`marks`, RunManifest.marks), else by plan group family; a group with no launch (the
    host's argmax) counts under its own family either way."""
    out: dict[str, float] = defaultdict(float)
    per_group = group_bytes(bp, plan, context)
    launched = set()
    if marks:
        for m, b in zip(marks, mark_bytes(bp, plan, context, marks, per_group)):
            out[m.family] += b
        launched = {m.group for m in marks}
    for g in plan["groups"]:   # every group without a launch of its own (the host's argmax)
        if g["id"] not in launched:
            out[g["family"]] += per_group.get(g["id"], 0.0)
    return dict(out)
