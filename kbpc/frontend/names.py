"""Every name a blueprint gives must be an identifier of the safe character set (kbpc/ir/limits.py):
checked right after the structural check, before any name reaches the IR, a file name or
generated code. Free text (`steps`, `explain`, `arm`, `provenance`, `exported_by`) is not a name;
it never reaches generated code."""
from __future__ import annotations

from typing import Any, Iterator

from kbpc.errors import BlueprintError
from kbpc.ir.limits import IDENTIFIER, IDENTIFIER_CHARS, MAX_IDENTIFIER_CHARS

_NODE_NAMES = ("id", "block", "block_type", "kind", "op", "kernel", "family", "compute", "numerics")
_TEMPLATE_NODE_NAMES = ("id", "op", "kind", "block_type", "kernel", "family", "compute")
_GROUP_NAMES = ("rule", "numerics", "compute")


def check_identifier(value: Any, where: str) -> None:
    if not isinstance(value, str) or not IDENTIFIER.fullmatch(value):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise BlueprintError(
            f"{shown} is not a valid name: names are 1 to {MAX_IDENTIFIER_CHARS} characters of "
            f"[{IDENTIFIER_CHARS}], starting with a letter, digit or _", where)


def _names(doc: dict) -> Iterator[tuple[Any, str]]:
    """(value, JSON path) of every name in a structurally checked blueprint."""
    yield doc["blueprint_id"], "blueprint_id"
    yield doc["lineage"], "lineage"
    for i, n in enumerate(doc["nodes"]):
        yield from ((n[k], f"nodes[{i}].{k}") for k in _NODE_NAMES if n[k] is not None)
        yield from ((r, f"nodes[{i}].roles[{j}]") for j, r in enumerate(n["roles"]))
        yield from ((s, f"nodes[{i}].state") for s in (n["state"] or "").split(",") if n["state"])
        for key, value in (n["point"] or {}).items():
            yield key, f"nodes[{i}].point"
            if isinstance(value, str):
                yield value, f"nodes[{i}].point.{key}"
    for i, e in enumerate(doc["edges"]):
        yield e["id"], f"edges[{i}].id"
    for i, g in enumerate(doc["groups"]):
        yield from ((g[k], f"groups[{i}].{k}") for k in _GROUP_NAMES if g[k] is not None)
        yield from ((k, f"groups[{i}].kernels[{j}]") for j, k in enumerate(g["kernels"]))
    for i, layer in enumerate(doc["layers"]):
        yield layer["kind"], f"layers[{i}].kind"
        yield layer["template"], f"layers[{i}].template"
        yield from ((b, f"layers[{i}].blocks[{j}]") for j, b in enumerate(layer["blocks"]))
    yield from _collapsed_names(doc["collapsed"])


def _collapsed_names(collapsed: dict) -> Iterator[tuple[Any, str]]:
    for key in ("prologue", "layout", "epilogue"):
        yield from ((v, f"collapsed.{key}[{j}]") for j, v in enumerate(collapsed[key]))
    for name, tpl in collapsed["templates"].items():
        yield name, "collapsed.templates"
        path = f"collapsed.templates[{name!r}]"
        for j, block in enumerate(tpl["blocks"]):
            yield block, f"{path}.blocks[{j}]"
        for j, n in enumerate(tpl["nodes"]):
            yield from ((n[k], f"{path}.nodes[{j}].{k}") for k in _TEMPLATE_NODE_NAMES if n[k] is not None)


def check_names(doc: dict) -> None:
    """Raise BlueprintError at the first name outside the safe set, naming its JSON path."""
    for value, where in _names(doc):
        check_identifier(value, where)
