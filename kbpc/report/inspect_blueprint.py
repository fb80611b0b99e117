"""`kbpc inspect BLUEPRINT`: what is inside a blueprint, its weights and its bandwidth floor."""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from kbpc.ir.graph import Blueprint
from kbpc.ir.weights import weight_specs

SCHEMA = "kbpc-inspect-blueprint/v1"

# Measured device-to-device copy bandwidth of one H200 (read + write), DESIGN.md.
DEFAULT_BANDWIDTH_GBS = 4300.0


def kernel_families(bp: Blueprint) -> dict[str, str]:
    """kernel name -> family: from the nodes naming the kernel, else the family of its group."""
    families: dict[str, str] = {}
    for node in bp.nodes():
        if node.kernel and node.family:
            families.setdefault(node.kernel, node.family)
    for group in bp.groups:
        fams = [n.family for n in bp.group_nodes(group.id) if n.family]
        for kernel in group.kernels:
            if kernel not in families and fams:
                families[kernel] = Counter(fams).most_common(1)[0][0]
    return families


def family_table(bp: Blueprint) -> dict[str, dict[str, int]]:
    """Per family: groups it appears in, kernel launches per step, and nodes."""
    k2f = kernel_families(bp)
    table: dict[str, dict[str, int]] = defaultdict(lambda: {"groups": 0, "launches": 0, "nodes": 0})
    for group in bp.groups:
        fams = {n.family for n in bp.group_nodes(group.id) if n.family}
        for fam in fams:
            table[fam]["groups"] += 1
        for kernel in group.kernels:
            table[k2f.get(kernel, "?")]["launches"] += 1
    for node in bp.nodes():
        if node.family:
            table[node.family]["nodes"] += 1
    return dict(sorted(table.items()))


def step_bytes_at(bp: Blueprint, context: int) -> float:
    """Bytes a decode step moves at `context` (weights, activations, state and caches), from the
    lowered plan's buffers and kbpc.runtime.traffic's model."""
    import json

    from kbpc.ir.plan import Options
    from kbpc.passes import run_pipeline
    from kbpc.runtime.traffic import group_bytes

    plan = json.loads(json.dumps(run_pipeline(bp, Options(max_context=context + 1)).to_json()))
    return sum(group_bytes(bp, plan, context).values())


def summarize(bp: Blueprint, bandwidth_gbs: float = DEFAULT_BANDWIDTH_GBS,
              context: int | None = None) -> dict[str, Any]:
    specs = weight_specs(bp)
    by_format: Counter[str] = Counter()
    for spec in specs:
        node = bp.node_by_id[spec.node]
        gemm = spec.role.startswith("weight") or spec.role == "input_scale"
        if gemm:   # the embedding table has no weight precision: it is stored BF16
            key = node.precision.weight or spec.storage
        else:
            key = "params"
        by_format[key] += spec.nbytes
    weight_bytes = sum(s.nbytes for s in specs)
    per_token = sum(s.bytes_per_token for s in specs)
    templates = Counter(l.template for l in bp.layers)
    extra = {}
    if context is not None:
        step = step_bytes_at(bp, context)
        extra = {"context": context, "step_bytes_at_context": round(step),
                 "roofline_tokens_per_s_at_context": bandwidth_gbs * 1e9 / step}
    return {
        **extra,
        "schema": SCHEMA,
        "blueprint_schema": bp.meta.schema,
        "blueprint_id": bp.meta.blueprint_id,
        "source": bp.meta.source,
        "arm": bp.meta.arm,
        "layers": len(bp.layers),
        "layers_by_template": dict(templates),
        "nodes": bp.graph.number_of_nodes(),
        "nodes_by_op": dict(sorted(Counter(n.op for n in bp.nodes()).items())),
        "edges": bp.graph.number_of_edges(),
        "groups": len(bp.groups),
        "device_groups": len(bp.device_groups),
        "launches": sum(len(g.kernels) for g in bp.groups),
        "families": family_table(bp),
        "symbols": bp.symbols,
        "config": bp.config.to_json(),
        "weight_tensors": len(specs),
        "weight_bytes": weight_bytes,
        "weight_bytes_by_format": dict(sorted(by_format.items())),
        "bytes_per_token": round(per_token),
        "bandwidth_gbs": bandwidth_gbs,
        "roofline_tokens_per_s": bandwidth_gbs * 1e9 / per_token if per_token else None,
        "roofline_step_ms": per_token / (bandwidth_gbs * 1e9) * 1e3,
    }
