"""The tensor-parallel split as data for the manifest, `kbpc inspect` and the runner: per rank its
symbols, vocabulary slice, experts, weight shards and bytes read per token, plus the collectives
of a step. One home for that record: the manifest's "tp" section is `tp_summary(plan)`."""
from __future__ import annotations

from math import prod
from typing import Any

from rich.console import Console
from rich.table import Table

from kbpc.ir.parallel import RankShard, TensorParallel
from kbpc.ir.plan import Plan
from kbpc.ir.weights import STORAGE_BYTES
from kbpc.report.render import human_bytes, kv_table


def lib_path(rank: int) -> str:
    """The bundle member holding rank `rank`'s library."""
    return f"lib/rank{rank}/libkbp.so"


def _rank(shard: RankShard, slot_bytes: int) -> dict[str, Any]:
    return {
        "rank": shard.rank,
        "symbols": dict(shard.symbols),
        "vocab": list(shard.vocab),
        "experts": [{"router": e.router, "base": e.base, "count": e.count} for e in shard.experts],
        "weight_bytes": sum(_nbytes(w.shape, w) for w in shard.weights),
        "weight_bytes_per_token": round(sum(w.bytes_per_token for w in shard.weights)),
        "collective_bytes_per_step": slot_bytes * (shard.ranks - 1),
        "weights": [{"name": w.name, "shape": list(w.shape), "full_shape": list(w.full_shape),
                     "shard": None if w.shard is None else
                     {"axis": w.shard.axis, "ranges": [list(r) for r in w.shard.ranges]}}
                    for w in shard.weights],
    }


def _nbytes(shape, w) -> int:
    return prod(shape) * STORAGE_BYTES[w.storage]


def tp_summary(plan: Plan, slot_bytes: int = 0, layout=None) -> dict[str, Any] | None:
    """The split of a plan (None when tp = 1). `slot_bytes`: the BF16 partial rows all-gathered
    per step by one rank (the sum over its post-mix sites), and `layout` the collective region
    (kbpc.codegen.collectives.TpStep, the same on every rank), when the step program is known."""
    tp: TensorParallel | None = plan.parallel
    if tp is None:
        return None
    return {
        "ranks": tp.ranks,
        "splits": {s.name: {"total": s.total, "counts": list(s.counts), "scope": list(s.scope)}
                   for s in tp.splits},
        "experts": [{"router": e.router, "layout": e.layout, "tp_bytes": e.tp_bytes, "ep_bytes": e.ep_bytes,
                     "why": e.why} for e in tp.experts],
        "replicated": list(tp.replicated),
        "collectives_per_step": tp.collectives_per_step,
        "partials": list(tp.shards[0].partials),
        "comm_bytes": layout.comm_bytes if layout is not None else None,
        "sites": [{"buffer": c.buffer, "offset": c.offset, "slot_bytes": c.slot_bytes}
                  for c in (layout.sites if layout is not None else ())],
        "library": {f"rank{s.rank}": lib_path(s.rank) for s in tp.shards},
        "per_rank": [_rank(s, slot_bytes) for s in tp.shards],
    }


def render_tp(summary: dict[str, Any], console: Console) -> None:
    """Bytes per token per rank and the collectives per step (inspect)."""
    splits = ", ".join(f"{k} {v['total']} -> {'/'.join(map(str, v['counts']))}" for k, v in summary["splits"].items())
    experts = ", ".join(sorted({f"{e['layout']} ({e['why']})" for e in summary["experts"]})) or "-"
    console.print(kv_table("Tensor parallel", [
        ("ranks", str(summary["ranks"])), ("split", splits), ("routed experts", experts),
        ("collectives per step", f"{summary['collectives_per_step']} (an all-gather of BF16 partials before "
                                 "each post-mix, summed in rank order; the logits' argmax exchange)"),
        ("replicated", "; ".join(summary["replicated"]))]))
    table = Table(title="Per rank", title_justify="left")
    for col in ("rank", "weights", "bytes/token", "vocab", "experts", "gathered/step"):
        table.add_column(col, justify="left" if col == "rank" else "right")
    for r in summary["per_rank"]:
        experts = ", ".join(f"{e['base']}..{e['base'] + e['count'] - 1}" for e in r["experts"][:1]) or "all (split)"
        table.add_row(str(r["rank"]), human_bytes(r["weight_bytes"]), human_bytes(r["weight_bytes_per_token"]),
                      f"{r['vocab'][0]}+{r['vocab'][1]}", experts, human_bytes(r["collective_bytes_per_step"]))
    console.print(table)
