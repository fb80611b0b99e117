"""Structural check of kbp-graph/v2 JSON: every required field present with the right type.
Errors name the JSON path (`nodes[12].precision.output`) and what is wrong."""
from __future__ import annotations

from typing import Any

from kbpc.errors import BlueprintError

SCHEMA = "kbp-graph/v2"

NULL = type(None)
_STR, _INT, _BOOL, _LIST, _DICT = (str,), (int,), (bool,), (list,), (dict,)

TOP_FIELDS = {
    "schema": _STR, "blueprint_id": _STR, "lineage": _STR, "revision": _INT, "arm": _DICT,
    "layers": _LIST, "nodes": _LIST, "edges": _LIST, "groups": _LIST, "collapsed": _DICT,
    "explain": _DICT,
}
NODE_FIELDS = {
    "id": _STR, "order": _INT, "layer": (int, NULL), "block": _STR, "block_type": _STR,
    "kind": (str, NULL), "op": _STR, "roles": _LIST, "inserted": _BOOL, "precision": _DICT,
    "steps": _LIST, "group": _INT, "kernel": (str, NULL), "family": (str, NULL),
    "point": (dict, NULL), "compute": (str, NULL), "numerics": _STR, "where": _STR,
    "state": (str, NULL),
}
PRECISION_FIELDS = {"weight": (str, NULL), "activation": (str, NULL), "output": (str, NULL)}
EDGE_FIELDS = {
    "id": _STR, "from": _INT, "to": _INT, "format": _STR, "rows": (str, NULL), "dim": (str, NULL),
    "fused": _BOOL, "dim_value": _INT, "bytes_per_token": (int, NULL), "requant": (dict, NULL),
}
REQUANT_FIELDS = {"from": _STR, "to": _STR, "at": _STR}
GROUP_FIELDS = {
    "id": _INT, "rule": _STR, "kernels": _LIST, "where": _STR, "numerics": _STR,
    "compute": (str, NULL), "nodes": _LIST,
}
LAYER_FIELDS = {"index": _INT, "kind": _STR, "template": _STR, "blocks": _LIST}
COLLAPSED_FIELDS = {"prologue": _LIST, "layout": _LIST, "epilogue": _LIST, "templates": _DICT}
TEMPLATE_FIELDS = {"blocks": _LIST, "nodes": _LIST, "edges": _LIST, "ports": _DICT, "instances": _LIST}
TEMPLATE_NODE_FIELDS = {
    "id": _STR, "op": _STR, "kind": (str, NULL), "block_type": _STR, "precision": _DICT,
    "kernel": (str, NULL), "family": (str, NULL), "compute": (str, NULL), "where": _STR,
    "group": (int, NULL), "inserted": _BOOL,
}
TEMPLATE_EDGE_FIELDS = {"from": _INT, "to": _INT, "format": _STR, "fused": _BOOL}
WHERE_VALUES = ("host", "device")


def _type_name(types: tuple) -> str:
    names = {str: "a string", int: "an integer", bool: "true/false", list: "a list",
             dict: "an object", NULL: "null"}
    return " or ".join(names[t] for t in types)


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_fields(obj: Any, fields: dict[str, tuple], path: str) -> None:
    if not isinstance(obj, dict):
        raise BlueprintError(f"expected an object, got {_describe(obj)}", path)
    for name, types in fields.items():
        if name not in obj:
            raise BlueprintError(f"missing field {name!r}", path)
        value = obj[name]
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            raise BlueprintError(f"field {name!r} must be {_type_name(types)}, got {_describe(value)}",
                                 path)


def check_list_of(items: list, kind: type, path: str) -> None:
    for i, item in enumerate(items):
        if not isinstance(item, kind) or (isinstance(item, bool) and kind is not bool):
            raise BlueprintError(f"must hold only {_type_name((kind,))} values, got {_describe(item)}",
                                 f"{path}[{i}]")


def check_structure(doc: Any) -> None:
    """Raise BlueprintError at the first structural problem (missing field, wrong type)."""
    if not isinstance(doc, dict):
        raise BlueprintError(f"the top level must be a JSON object, got {_describe(doc)}", "$")
    schema = doc.get("schema")
    if schema != SCHEMA:
        raise BlueprintError(f"unsupported schema {schema!r}: kbpc reads {SCHEMA!r}", "schema")
    check_fields(doc, TOP_FIELDS, "$")
    _check_top(doc)
    for i, node in enumerate(doc["nodes"]):
        path = f"nodes[{i}]"
        check_fields(node, NODE_FIELDS, path)
        check_fields(node["precision"], PRECISION_FIELDS, f"{path}.precision")
        check_list_of(node["roles"], str, f"{path}.roles")
        check_list_of(node["steps"], str, f"{path}.steps")
        if node["where"] not in WHERE_VALUES:
            raise BlueprintError(f"field 'where' must be 'host' or 'device', got {node['where']!r}", path)
    for i, edge in enumerate(doc["edges"]):
        check_fields(edge, EDGE_FIELDS, f"edges[{i}]")
        if edge["requant"] is not None:
            check_fields(edge["requant"], REQUANT_FIELDS, f"edges[{i}].requant")
    for i, group in enumerate(doc["groups"]):
        check_fields(group, GROUP_FIELDS, f"groups[{i}]")
        check_list_of(group["kernels"], str, f"groups[{i}].kernels")
        check_list_of(group["nodes"], int, f"groups[{i}].nodes")
    for i, layer in enumerate(doc["layers"]):
        check_fields(layer, LAYER_FIELDS, f"layers[{i}]")
        check_list_of(layer["blocks"], str, f"layers[{i}].blocks")
    _check_collapsed(doc["collapsed"])


def _check_top(doc: dict) -> None:
    if not doc["nodes"]:
        raise BlueprintError("the blueprint has no nodes (an empty graph)", "nodes")
    if doc["revision"] < 0:
        raise BlueprintError(f"field 'revision' must not be negative, got {doc['revision']}", "$")
    if not isinstance(doc.get("provenance") or {}, dict):
        raise BlueprintError(f"must be an object, got {_describe(doc['provenance'])}", "provenance")
    if not isinstance(doc["explain"].get("families", {}), dict):
        raise BlueprintError("must be an object of family name: description", "explain.families")


def _check_collapsed(collapsed: dict) -> None:
    check_fields(collapsed, COLLAPSED_FIELDS, "collapsed")
    for key in ("prologue", "layout", "epilogue"):
        check_list_of(collapsed[key], str, f"collapsed.{key}")
    for name, tpl in collapsed["templates"].items():
        path = f"collapsed.templates[{name!r}]"
        check_fields(tpl, TEMPLATE_FIELDS, path)
        for i, node in enumerate(tpl["nodes"]):
            check_fields(node, TEMPLATE_NODE_FIELDS, f"{path}.nodes[{i}]")
            check_fields(node["precision"], PRECISION_FIELDS, f"{path}.nodes[{i}].precision")
        for i, edge in enumerate(tpl["edges"]):
            check_fields(edge, TEMPLATE_EDGE_FIELDS, f"{path}.edges[{i}]")
        check_list_of(tpl["instances"], int, f"{path}.instances")
        for port, members in tpl["ports"].items():
            if not isinstance(members, list):
                raise BlueprintError(f"must be a list of node positions, got {_describe(members)}",
                                     f"{path}.ports[{port!r}]")
            check_list_of(members, int, f"{path}.ports[{port!r}]")
