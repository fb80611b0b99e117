"""Check that the expanded nodes and edges agree with the blueprint's `collapsed` section: the
layer sequence is the layout, and every layer (and the prologue/epilogue blocks) is an instance of
its template: same node ids, ops, precisions, kernels and families in order, the same internal
edges, and groups that map one to one onto the template's groups."""
from __future__ import annotations

from collections import Counter
from typing import Any

from kbpc.errors import BlueprintError
from kbpc.ir.records import Layer, Node, Tensor

# Template node fields that must equal the expanded node's.
_SAME_FIELDS = ("op", "kind", "block_type", "kernel", "family", "compute", "where", "inserted")


def check_collapsed(collapsed: dict[str, Any], layers: list[Layer], nodes: list[Node],
                    tensors: list[Tensor]) -> None:
    templates = collapsed["templates"]
    layout = collapsed["layout"]
    if len(layout) != len(layers):
        raise BlueprintError(f"layout has {len(layout)} entries but the blueprint has {len(layers)} layers",
                             "collapsed.layout")
    for i, (layer, name) in enumerate(zip(layers, layout)):
        if layer.index != i:
            raise BlueprintError(f"layer index {layer.index} at position {i}", f"layers[{i}]")
        if layer.template != name:
            raise BlueprintError(f"layer uses template {layer.template!r} but collapsed.layout[{i}] "
                                 f"says {name!r}", f"layers[{i}]")
        if name not in templates:
            raise BlueprintError(f"unknown template {name!r}", f"collapsed.layout[{i}]")
    for name, tpl in templates.items():
        used = [l.index for l in layers if l.template == name]
        if tpl["instances"] and sorted(tpl["instances"]) != used:
            raise BlueprintError(f"instances {tpl['instances']} but layers {used} use it",
                                 f"collapsed.templates[{name!r}]")
    by_layer: dict[int | None, list[Node]] = {}
    for n in nodes:
        by_layer.setdefault(n.layer, []).append(n)
    for layer in layers:
        members = by_layer.get(layer.index, [])
        _match(templates[layer.template], layer.template, members, tensors, f"layer {layer.index}",
               _prefix(layer.blocks, templates[layer.template]["blocks"], f"layer {layer.index}"))
    outside = by_layer.get(None, [])
    for name in (*collapsed["prologue"], *collapsed["epilogue"]):
        if name not in templates:
            raise BlueprintError(f"unknown template {name!r}", "collapsed.prologue/epilogue")
        blocks = set(templates[name]["blocks"])
        members = [n for n in outside if n.block in blocks]
        _match(templates[name], name, members, tensors, f"block {name}", "")
    counted = sum(len(by_layer.get(l.index, [])) for l in layers)
    counted += sum(1 for n in outside if any(n.block in templates[t]["blocks"]
                                             for t in (*collapsed["prologue"], *collapsed["epilogue"])))
    if counted != len(nodes):
        raise BlueprintError(f"{len(nodes) - counted} nodes belong to no layer and no prologue/epilogue "
                             "template", "collapsed")


def _prefix(blocks: tuple[str, ...], tpl_blocks: list[str], where: str) -> str:
    """'l3.' from layer blocks ('l3.dsa', 'l3.moe') and template blocks ('dsa', 'moe')."""
    if len(blocks) != len(tpl_blocks):
        raise BlueprintError(f"has blocks {list(blocks)} but its template has {tpl_blocks}", where)
    prefix = blocks[0][: len(blocks[0]) - len(tpl_blocks[0])]
    if any(b != prefix + t for b, t in zip(blocks, tpl_blocks)):
        raise BlueprintError(f"blocks {list(blocks)} do not match template blocks {tpl_blocks}", where)
    return prefix


def _match(tpl: dict, name: str, members: list[Node], tensors: list[Tensor], where: str,
           prefix: str) -> None:
    tnodes = tpl["nodes"]
    if len(members) != len(tnodes):
        raise BlueprintError(f"has {len(members)} nodes but template {name!r} has {len(tnodes)}", where)
    group_map: dict[int, int] = {}
    for i, (node, tn) in enumerate(zip(members, tnodes)):
        at = f"node {node.id} ({where}, template {name!r} node {i})"
        if node.id != prefix + tn["id"]:
            raise BlueprintError(f"expected id {prefix + tn['id']!r} from the template", at)
        for field in _SAME_FIELDS:
            if getattr(node, field) != tn[field]:
                raise BlueprintError(f"{field} is {getattr(node, field)!r} but the template says "
                                     f"{tn[field]!r}", at)
        tp = tn["precision"]
        out = tuple(tp["output"].split(",")) if tp["output"] else ()
        if (node.precision.weight, node.precision.activation, node.precision.output) != \
                (tp["weight"], tp["activation"], out):
            raise BlueprintError("precision differs from the template", at)
        if tn["group"] is not None:
            mapped = group_map.setdefault(tn["group"], node.group)
            if mapped != node.group:
                raise BlueprintError(f"is in group {node.group} but the template puts it with group "
                                     f"{mapped}", at)
    if len(set(group_map.values())) != len(group_map):
        raise BlueprintError(f"template {name!r} groups do not map one to one onto groups", where)
    index = {n.order: i for i, n in enumerate(members)}
    actual = Counter((index[t.src], index[t.dst], t.format, t.fused) for t in tensors
                     if t.src in index and t.dst in index)
    expected = Counter((e["from"], e["to"], e["format"], e["fused"]) for e in tpl["edges"])
    if actual != expected:
        extra = sorted((actual - expected).elements())[:3]
        missing = sorted((expected - actual).elements())[:3]
        raise BlueprintError(f"internal edges differ from template {name!r}: not in the template "
                             f"{extra}, missing {missing} (from, to, format, fused)", where)
