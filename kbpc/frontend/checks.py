"""Semantic checks of a structurally valid blueprint: graph shape, groups, formats, ops, bytes.
Each raises BlueprintError naming the node, edge or group at fault."""
from __future__ import annotations

from collections import Counter, defaultdict

import networkx as nx

from kbpc.errors import BlueprintError
from kbpc.frontend.dims import eval_dim
from kbpc.ir.formats import FORMATS, is_known
from kbpc.ir.limits import MAX_DIM
from kbpc.ir.ops import KNOWN_FAMILIES, is_known_op
from kbpc.ir.records import Group, Node, Tensor


def check_nodes(nodes: list[Node], explain_families: set[str]) -> None:
    orders = Counter(n.order for n in nodes)
    dup = [o for o, c in orders.items() if c > 1]
    if dup:
        ids = [n.id for n in nodes if n.order == dup[0]]
        raise BlueprintError(f"order {dup[0]} is used by several nodes: {', '.join(ids)}", "nodes")
    ids = Counter(n.id for n in nodes)
    dup_ids = [i for i, c in ids.items() if c > 1]
    if dup_ids:
        raise BlueprintError(f"node id {dup_ids[0]!r} appears {ids[dup_ids[0]]} times", "nodes")
    for n in nodes:
        where = f"node {n.id}"
        if not is_known_op(n.op):
            raise BlueprintError(f"unknown op {n.op!r}", where)
        if n.family is not None:
            if n.family not in KNOWN_FAMILIES:
                raise BlueprintError(f"unknown kernel family {n.family!r}", where)
            if n.family not in explain_families:
                raise BlueprintError(f"kernel family {n.family!r} has no entry in explain.families", where)
        for field, value in (("weight", n.precision.weight), ("activation", n.precision.activation)):
            if value is not None and not is_known(value):
                raise BlueprintError(f"unknown {field} format {value!r}", f"{where}: precision")
        for value in n.precision.output:
            if not is_known(value):
                raise BlueprintError(f"unknown output format {value!r}", f"{where}: precision")


def check_edges(tensors: list[Tensor], by_order: dict[int, Node]) -> None:
    for t in tensors:
        where = f"edge {t.id} (edges[{t.index}])"
        for end, order in (("from", t.src), ("to", t.dst)):
            if order not in by_order:
                raise BlueprintError(f"'{end}' names node order {order}, which does not exist", where)
        if not is_known(t.format):
            raise BlueprintError(f"unknown format {t.format!r}", where)
        if t.requant is not None:
            for value in (t.requant.src, t.requant.dst):
                if not is_known(value):
                    raise BlueprintError(f"unknown requant format {value!r}", where)
        if not 1 <= t.dim_value <= MAX_DIM:
            raise BlueprintError(f"dim_value must be from 1 to {MAX_DIM} (kernels take sizes as 32-bit "
                                 f"ints), got {t.dim_value}", where)


def check_acyclic(graph: nx.MultiDiGraph, tensors: list[Tensor], by_order: dict[int, Node]) -> None:
    """Edges must go forward in `order` (which makes the graph a DAG); report a cycle if not."""
    backward = [t for t in tensors if t.dst <= t.src]
    if not backward:
        return
    try:
        cycle = nx.find_cycle(graph)
        path = " -> ".join(by_order[u].id for u, _, _ in cycle) + f" -> {by_order[cycle[0][0]].id}"
        raise BlueprintError(f"the graph has a cycle: {path}", "edges")
    except nx.NetworkXNoCycle:
        t = backward[0]
        raise BlueprintError(
            f"edge goes backward: from {by_order[t.src].id} (order {t.src}) to "
            f"{by_order[t.dst].id} (order {t.dst}); edges must follow node order",
            f"edge {t.id} (edges[{t.index}])") from None


def check_groups(groups: list[Group], nodes: list[Node]) -> None:
    ids = Counter(g.id for g in groups)
    dup = [i for i, c in ids.items() if c > 1]
    if dup:
        raise BlueprintError(f"group id {dup[0]} appears {ids[dup[0]]} times", "groups")
    by_id = {g.id: g for g in groups}
    listed: dict[int, list[int]] = defaultdict(list)
    for g in groups:
        if not g.nodes:
            raise BlueprintError("group lists no nodes", f"group {g.id}")
        for order in g.nodes:
            listed[order].append(g.id)
    by_order = {n.order: n for n in nodes}
    for g in groups:
        for order in g.nodes:
            if order not in by_order:
                raise BlueprintError(f"lists node order {order}, which does not exist", f"group {g.id}")
    for n in nodes:
        where = f"node {n.id}"
        if n.group not in by_id:
            raise BlueprintError(f"names group {n.group}, which does not exist", where)
        owners = listed.get(n.order, [])
        if len(owners) != 1:
            names = ", ".join(map(str, owners)) or "none"
            raise BlueprintError(f"must be listed in exactly one group, is in: {names}", where)
        if owners[0] != n.group:
            raise BlueprintError(
                f"says group {n.group} but group {owners[0]} lists it", where)


def rows_multiplier(rows: str | None, symbols: dict[str, int], n_rows: int) -> int | None:
    if rows is None:
        return None
    return eval_dim(rows, {**symbols, "n": n_rows})


def check_bytes(tensors: list[Tensor], inputs_of: dict[int, list[Tensor]], symbols: dict[str, int],
                n_rows: int) -> None:
    """bytes_per_token = row bytes of the format at dim_value x the rows multiplier. Edges with
    rows null (quantized activations) carry the rows of their producer's input."""
    for t in tensors:
        if t.dim is not None:
            expected_dim = eval_dim(t.dim, symbols)
            if expected_dim != t.dim_value:
                raise BlueprintError(f"dim `{t.dim}` is {expected_dim} but dim_value says {t.dim_value}",
                                     f"edge {t.id} (edges[{t.index}])")
        if t.bytes_per_token is None:
            continue
        mult = rows_multiplier(t.rows, symbols, n_rows)
        if mult is None:
            mults = [rows_multiplier(i.rows, symbols, n_rows) for i in inputs_of.get(t.src, [])]
            mult = max((m for m in mults if m is not None), default=n_rows)
        expected = FORMATS[t.format].row_bytes(t.dim_value) * mult
        if expected != t.bytes_per_token:
            raise BlueprintError(
                f"bytes_per_token is {t.bytes_per_token} but {t.format} x {t.dim_value} values x "
                f"{mult} rows is {expected}", f"edge {t.id} (edges[{t.index}])")
