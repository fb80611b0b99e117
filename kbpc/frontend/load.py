"""Load a kbp-graph/v2 blueprint into the checked, typed IR (`Blueprint`)."""
from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import networkx as nx

from kbpc.errors import BlueprintError, KbpcError
from kbpc.frontend.checks import (check_acyclic, check_bytes, check_edges, check_groups,
                                  check_nodes, rows_multiplier)
from kbpc.frontend.collapsed import check_collapsed
from kbpc.frontend.dims import DimFact, eval_dim, solve_symbols, symbols_of, parse_dim
from kbpc.frontend.schema import check_structure
from kbpc.ir.config import CheckpointConfig, ModelConfig, detect_engine, load_config
from kbpc.ir.graph import Blueprint, BlueprintMeta
from kbpc.ir.records import Group, Layer, Node, Precision, Requant, Tensor

# Where `kbpc shrink` records the symbols it set that no edge determines.
CARRIED_SYMBOLS_KEY = "kbpc_model_symbols"


def read_json(path: Path) -> Any:
    try:
        text = Path(path).read_bytes()
    except FileNotFoundError:
        raise BlueprintError("file not found", str(path)) from None
    except IsADirectoryError:
        raise BlueprintError("is a directory, not a blueprint file", str(path)) from None
    try:
        return json.loads(text)
    except UnicodeDecodeError:
        raise BlueprintError("not UTF-8 text (is it a JSON blueprint?)", str(path)) from None
    except json.JSONDecodeError as exc:
        # A JSON object or list ends with its closing bracket; a file that doesn't was cut short.
        truncated = not text.rstrip().endswith((b"}", b"]")) or exc.pos >= len(text.rstrip())
        why = f"{exc.msg}; the file ends early (truncated?)" if truncated else exc.msg
        raise BlueprintError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {why}",
                             str(path)) from None


def load_blueprint(path: Path | str, config_path: Path | None = None) -> Blueprint:
    path = Path(path)
    return blueprint_from_doc(read_json(path), str(path), config_path)


def blueprint_from_doc(doc: Any, source: str, config_path: Path | None = None,
                       checkpoint: CheckpointConfig | None = None) -> Blueprint:
    """Check `doc` and build the IR. Every failure is a KbpcError whose location starts with
    `source`. `checkpoint`: what a checkpoint's own config fixes (see `load_config`)."""
    try:
        return _build(doc, source, config_path, checkpoint)
    except KbpcError as exc:
        if exc.where and exc.where.startswith(source):
            raise
        where = f"{source}: {exc.where}" if exc.where else source
        raise type(exc)(exc.message, where) from None


def _build(doc: Any, source: str, config_path: Path | None, checkpoint: CheckpointConfig | None) -> Blueprint:
    check_structure(doc)
    nodes = [_node(n) for n in doc["nodes"]]
    tensors = [_tensor(i, e) for i, e in enumerate(doc["edges"])]
    groups = [_group(g) for g in doc["groups"]]
    layers = [Layer(l["index"], l["kind"], l["template"], tuple(l["blocks"])) for l in doc["layers"]]
    check_nodes(nodes, set(doc["explain"].get("families", {})))
    by_order = {n.order: n for n in nodes}
    check_edges(tensors, by_order)
    graph = nx.MultiDiGraph()
    for n in nodes:
        graph.add_node(n.order, node=n)
    for t in tensors:
        graph.add_edge(t.src, t.dst, key=t.index, tensor=t)
    check_acyclic(graph, tensors, by_order)
    check_groups(groups, nodes)
    check_collapsed(doc["collapsed"], layers, nodes, tensors)
    engine = detect_engine({n.kernel for n in nodes if n.kernel})
    carried = (doc.get("provenance") or {}).get(CARRIED_SYMBOLS_KEY)
    config = load_config(engine, config_path, carried if isinstance(carried, dict) else None, checkpoint)
    symbols = _solve(tensors, config)
    inputs_of: dict[int, list[Tensor]] = defaultdict(list)
    for t in tensors:
        inputs_of[t.dst].append(t)
    check_bytes(tensors, inputs_of, symbols, 1)
    for t in _resolve_rows(tensors, inputs_of, symbols):
        graph.edges[t.src, t.dst, t.index]["tensor"] = t
    groups_by_id = tuple(sorted(groups, key=lambda g: g.id))
    meta = BlueprintMeta(source=source, schema=doc["schema"], blueprint_id=doc["blueprint_id"],
                         lineage=doc["lineage"], revision=doc["revision"], arm=doc["arm"],
                         explain=doc["explain"], collapsed=doc["collapsed"],
                         provenance=doc.get("provenance") or {})
    return Blueprint(meta=meta, graph=graph, groups=groups_by_id, layers=tuple(layers),
                     symbols=symbols, config=config, raw=doc)


def _solve(tensors: list[Tensor], config: ModelConfig) -> dict[str, int]:
    facts = [DimFact(t.dim, t.dim_value, t.id) for t in tensors if t.dim is not None]
    for t in tensors:
        if t.dim is not None:
            parse_dim(t.dim)  # a parse error names the expression; add the edge
    for t in tensors:
        if t.rows is not None:
            try:
                parse_dim(t.rows)
            except BlueprintError as exc:
                raise BlueprintError(exc.message, f"edge {t.id} (edges[{t.index}]): rows") from None
    symbols, undetermined = solve_symbols(facts, config.symbol_dict)
    defaults = dict(config.defaults)
    while undetermined & defaults.keys():
        given = dict(config.symbol_dict)
        for name in sorted(undetermined & defaults.keys()):
            value = defaults.pop(name)
            given[name] = symbols[value] if isinstance(value, str) and value in symbols else value
        given = {k: v for k, v in given.items() if isinstance(v, int)}
        symbols, undetermined = solve_symbols(facts, {**given})
    row_syms = set().union(*(symbols_of(parse_dim(t.rows)) for t in tensors if t.rows)) - {"n"}
    missing = sorted(undetermined | (row_syms - symbols.keys()))
    if missing:
        raise BlueprintError(
            f"the edges do not determine {', '.join(missing)}; set them in a config file "
            f'(--config FILE.json with {{"symbols": {{"{missing[0]}": ...}}}})')
    return dict(sorted(symbols.items()))


def _resolve_rows(tensors: list[Tensor], inputs_of: dict[int, list[Tensor]],
                  symbols: dict[str, int]) -> list[Tensor]:
    """Each edge's rows as a number of rows per token of the batch (rows = factor x n). Edges with
    rows null carry the rows of their producer's inputs (the widest of them)."""
    def factor(rows: str | None, where: Tensor) -> int | None:
        if rows is None:
            return None
        one, two = (rows_multiplier(rows, symbols, n) for n in (1, 2))
        if one < 1 or two != 2 * one:
            raise BlueprintError(f"rows `{rows}` is not a positive multiple of the batch n",
                                 f"edge {where.id} (edges[{where.index}]): rows")
        return one
    out = []
    for t in tensors:
        f = factor(t.rows, t)
        if f is None:
            f = max((m for i in inputs_of.get(t.src, []) if (m := factor(i.rows, i)) is not None), default=1)
        out.append(dataclasses.replace(t, rows_per_token=f))
    return out


def _node(n: dict) -> Node:
    p = n["precision"]
    output = tuple(p["output"].split(",")) if p["output"] else ()
    point = tuple(sorted((str(k), str(v)) for k, v in (n["point"] or {}).items()))
    state = tuple(n["state"].split(",")) if n["state"] else ()
    return Node(id=n["id"], order=n["order"], layer=n["layer"], block=n["block"],
                block_type=n["block_type"], kind=n["kind"], op=n["op"], roles=tuple(n["roles"]),
                inserted=n["inserted"], precision=Precision(p["weight"], p["activation"], output),
                steps=tuple(n["steps"]), group=n["group"], kernel=n["kernel"], family=n["family"],
                point=point, compute=n["compute"], numerics=n["numerics"], where=n["where"],
                state=state)


def _tensor(index: int, e: dict) -> Tensor:
    rq = e["requant"]
    return Tensor(index=index, id=e["id"], src=e["from"], dst=e["to"], format=e["format"],
                  rows=e["rows"], dim=e["dim"], fused=e["fused"], dim_value=e["dim_value"],
                  bytes_per_token=e["bytes_per_token"],
                  requant=Requant(rq["from"], rq["to"], rq["at"]) if rq else None)


def _group(g: dict) -> Group:
    return Group(id=g["id"], rule=g["rule"], kernels=tuple(g["kernels"]), where=g["where"],
                 numerics=g["numerics"], compute=g["compute"], nodes=tuple(g["nodes"]))
