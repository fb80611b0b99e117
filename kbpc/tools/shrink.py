"""`kbpc shrink`: the same architecture at other sizes, as a valid blueprint of the same schema.

Symbols are changed with `--set name=value`; dims, dim values and bytes of every edge are
recomputed from the dim expressions. `--layers` keeps a subset of the layers (the residual stream
edges are reconnected to the previous kept layer and everything is renumbered). The result goes
through the same checks as any blueprint before it is written."""
from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any

from kbpc.errors import BlueprintError, KbpcError
from kbpc.frontend.checks import rows_multiplier
from kbpc.frontend.dims import DimFact, eval_dim, solve_symbols
from kbpc.frontend.load import CARRIED_SYMBOLS_KEY, blueprint_from_doc
from kbpc.ir.formats import FORMATS
from kbpc.ir.graph import Blueprint
from kbpc.ir.limits import MAX_DIM, SYMBOL_NAME

# Toy sizes per engine family that respect every kernel family's constraints: NVFP4 K a multiple
# of 128 (the W4A4 K-chunk), FP8 K-chunks of 128, and the head dims the families fix (KDA d_k =
# d_v = 128, MLA latent 512, indexer head 128) left as they are.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "glm5_next": {
            "symbols": {"hidden": 256, "lin_k_heads": 2, "lin_v_heads": 2, "inter": 512,
                        "moe_inter": 128, "shared_inter": 128, "experts": 8, "top_k": 2,
                        "q_lora": 128, "q_heads": 2, "index_heads": 4, "index_topk": 16,
                        "vocab": 512},
            "layers": "per-template",
        },
    },
}


def parse_assignments(items: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        value = value.strip()
        if not sep or not SYMBOL_NAME.fullmatch(name.strip()) or not re.fullmatch(r"[0-9]{1,30}", value):
            raise KbpcError(f"expected symbol=positive-integer, got {item!r}", "--set")
        if not 1 <= int(value) <= MAX_DIM:
            raise KbpcError(f"{name} must be from 1 to {MAX_DIM} (kernels take sizes as 32-bit ints), "
                            f"got {value}", "--set")
        out[name.strip()] = int(value)
    return out


def select_layers(bp: Blueprint, pattern: str | None) -> list[int]:
    """Layer indices to keep: None = all; 'per-template' = the first layer of each template;
    else comma-separated indices and ranges ('0,3-5')."""
    count = len(bp.layers)
    if pattern is None:
        return list(range(count))
    if pattern == "per-template":
        seen: dict[str, int] = {}
        for layer in bp.layers:
            seen.setdefault(layer.template, layer.index)
        return sorted(seen.values())
    keep: set[int] = set()
    for part in pattern.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise KbpcError(f"bad layer pattern {part!r}: use indices and ranges like 0,3-5, or "
                            "'per-template'", "--layers")
        lo, hi = int(m[1]), int(m[2] or m[1])
        if hi < lo or hi >= count:
            raise KbpcError(f"layer range {part.strip()!r} is outside 0..{count - 1}", "--layers")
        keep.update(range(lo, hi + 1))
    return sorted(keep)


def shrink(bp: Blueprint, assignments: dict[str, int], layers: list[int]) -> dict[str, Any]:
    """A new blueprint document; raises KbpcError if the result is not a valid blueprint."""
    unknown = sorted(set(assignments) - set(bp.symbols))
    if unknown:
        raise KbpcError(f"unknown symbol(s) {', '.join(unknown)}; this blueprint has "
                        f"{', '.join(bp.symbols)}", "--set")
    if not layers:
        raise KbpcError("no layers selected", "--layers")
    symbols = {**bp.symbols, **assignments}
    doc = _select(copy.deepcopy(bp.raw), bp, layers)
    _resize(doc, symbols)
    _check_family_constraints(doc, symbols)
    _restamp(doc, bp, assignments, layers, symbols)
    try:
        blueprint_from_doc(doc, "shrunk blueprint")
    except KbpcError as exc:
        raise KbpcError(f"these sizes do not give a valid blueprint: {exc}", "shrink") from None
    return doc


def _select(doc: dict, bp: Blueprint, keep: list[int]) -> dict:
    """Keep the chosen layers (plus prologue/epilogue), renumber layers, nodes and groups."""
    new_index = {old: new for new, old in enumerate(keep)}
    nodes = [n for n in doc["nodes"] if n["layer"] is None or n["layer"] in new_index]
    order_map = {n["order"]: i for i, n in enumerate(nodes)}
    # The node each layer's stream leaves from (the template's out port); a dropped layer's
    # stream edges are re-sourced from the previous kept layer's out port.
    port_out: dict[int | None, int] = {}
    for layer in bp.layers:
        tpl = doc["collapsed"]["templates"][layer.template]
        members = [n.order for n in bp.nodes() if n.layer == layer.index]
        out_port = tpl["ports"].get("out") or [-1]
        if not 0 <= out_port[0] < len(members):
            raise KbpcError(f"template {layer.template!r} has no usable 'out' port to reconnect layers",
                            f"collapsed.templates[{layer.template!r}].ports")
        port_out[layer.index] = members[out_port[0]]
    prologue_out = max(n.order for n in bp.nodes() if n.layer is None and n.order < port_out[0])
    last_kept_out = {}
    prev = prologue_out
    for layer in bp.layers:
        last_kept_out[layer.index] = prev
        if layer.index in new_index:
            prev = port_out[layer.index]
    tail_out = prev
    out_edge_id = {e["from"]: e["id"] for e in doc["edges"]}
    by_order = {n.order: n for n in bp.nodes()}
    edges = []
    for e in doc["edges"]:
        src, dst = by_order[e["from"]], by_order[e["to"]]
        if e["to"] not in order_map:
            continue
        if e["from"] not in order_map or (src.layer != dst.layer and src.layer is not None):
            new_src = last_kept_out[dst.layer] if dst.layer is not None else tail_out
            if e["from"] != new_src:
                e = {**e, "from": new_src, "id": out_edge_id[new_src]}
        if e["from"] in order_map:
            edges.append(e)
    group_map: dict[int, int] = {}
    for n in nodes:
        group_map.setdefault(n["group"], len(group_map))
    groups = []
    for g in sorted(doc["groups"], key=lambda g: group_map.get(g["id"], 1 << 30)):
        if g["id"] in group_map:
            groups.append({**g, "id": group_map[g["id"]],
                           "nodes": [order_map[o] for o in g["nodes"] if o in order_map]})
    for n in nodes:
        n["group"] = group_map[n["group"]]
        if n["layer"] is not None:
            old = n["layer"]
            n["id"] = _rename(n["id"], old, new_index[old])
            n["block"] = _rename(n["block"], old, new_index[old])
            n["layer"] = new_index[old]
    layer_of = {n.order: n.layer for n in bp.nodes()}
    for e in edges:
        old = layer_of[e["from"]]
        if old is not None:
            e["id"] = _rename(e["id"], old, new_index[old])
        e["from"], e["to"] = order_map[e["from"]], order_map[e["to"]]
    for n in nodes:
        n["order"] = order_map[n["order"]]
    doc["nodes"], doc["edges"], doc["groups"] = nodes, edges, groups
    doc["layers"] = [{**l, "index": new_index[l["index"]],
                      "blocks": [_rename(b, l["index"], new_index[l["index"]]) for b in l["blocks"]]}
                     for l in doc["layers"] if l["index"] in new_index]
    collapsed = doc["collapsed"]
    collapsed["layout"] = [collapsed["layout"][i] for i in keep]
    for name, tpl in collapsed["templates"].items():
        if tpl["instances"]:
            tpl["instances"] = [i for i, t in enumerate(collapsed["layout"]) if t == name]
    return doc


def _rename(text: str, old: int, new: int) -> str:
    prefix = f"l{old}."
    if text.startswith(prefix):
        return f"l{new}." + text[len(prefix):]
    if text == f"l{old}":
        return f"l{new}"
    return text


def _resize(doc: dict, symbols: dict[str, int]) -> None:
    """Recompute dim_value and bytes_per_token of every edge from the new symbols."""
    inputs: dict[int, list[dict]] = {}
    for e in doc["edges"]:
        inputs.setdefault(e["to"], []).append(e)
    for e in doc["edges"]:  # edges follow node order, so producers' inputs are resized first
        if e["dim"] is not None:
            try:
                e["dim_value"] = eval_dim(e["dim"], symbols)
            except ZeroDivisionError:
                raise KbpcError(f"`{e['dim']}` is not a whole number with these sizes",
                                f"edge {e['id']}") from None
            if e["dim_value"] <= 0:
                raise KbpcError(f"`{e['dim']}` = {e['dim_value']} is not positive", f"edge {e['id']}")
    for e in doc["edges"]:
        if e["dim"] is None:
            ins = [i for i in inputs.get(e["from"], []) if i["dim"] is not None]
            if not ins:
                raise KbpcError("a quantized edge whose producer has no sized input", f"edge {e['id']}")
            e["dim_value"] = ins[0]["dim_value"]
        if e["bytes_per_token"] is not None:
            mult = rows_multiplier(e["rows"], symbols, 1)
            if mult is None:
                mults = [rows_multiplier(i["rows"], symbols, 1) for i in inputs.get(e["from"], [])]
                mult = max((m for m in mults if m is not None), default=1)
            e["bytes_per_token"] = FORMATS[e["format"]].row_bytes(e["dim_value"]) * mult


def _check_family_constraints(doc: dict, symbols: dict[str, int]) -> None:
    """Sizes the kernel families need: K multiples of the format's chunk."""
    need = {"nvfp4/g16": 128, "fp8/channel": 128, "bf16": 8}
    inputs: dict[int, list[dict]] = {}
    for e in doc["edges"]:
        inputs.setdefault(e["to"], []).append(e)
    for n in doc["nodes"]:
        fmt = n["precision"]["weight"]
        if fmt in need and n["op"] != "mla_attention":
            for e in inputs.get(n["order"], []):
                if e["format"] != "i32" and e["dim_value"] % need[fmt]:
                    raise KbpcError(f"{fmt} weights need K divisible by {need[fmt]}; K = {e['dim_value']} "
                                    f"(edge {e['id']})", f"node {n['id']}")
        if n["precision"]["output"] and "nvfp4/g16" in n["precision"]["output"]:
            for e in inputs.get(n["order"], []):
                if e["dim_value"] % 16:
                    raise KbpcError(f"NVFP4 activations need a multiple of 16 values, got "
                                    f"{e['dim_value']} (edge {e['id']})", f"node {n['id']}")


def _restamp(doc: dict, bp: Blueprint, assignments: dict[str, int], layers: list[int],
             symbols: dict[str, int]) -> None:
    facts = [DimFact(e["dim"], e["dim_value"], e["id"]) for e in doc["edges"] if e["dim"]]
    _, open_symbols = solve_symbols(facts, {})
    provenance = dict(doc.get("provenance") or {})
    provenance["kbpc_shrink"] = {"from": bp.meta.blueprint_id, "set": assignments,
                                 "layers": layers if len(layers) != len(bp.layers) else "all"}
    provenance[CARRIED_SYMBOLS_KEY] = {s: symbols[s] for s in sorted(open_symbols) if s in symbols}
    doc["provenance"] = provenance
    body = json.dumps({k: v for k, v in doc.items() if k not in ("blueprint_id", "arm")},
                      sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(body).hexdigest()
    doc["blueprint_id"] = f"shrink:{digest}"
    doc["arm"] = {**doc["arm"], "digest": digest}
