"""Per-sublayer spans of the replayed step, from a replay timeline (`scripts/gpu-timeline.sh` JSON):
the hyper-connection boundary kernels (family glm_mhc) close every sublayer, so the time from one
boundary's end to the next one's is what that sublayer costs on the step's critical path, whatever
runs beside it on other streams. Each sublayer is named by the families launched between its two
boundaries (KDA or DSA attention, routed MoE, dense MLP); the table gives, per kind, the count and
the median, lowest and highest span.

    python3 bench/timeline_layers.py TIMELINE.json [OTHER.json]   # two files: side by side
"""
from __future__ import annotations

import json
import statistics
import sys

BOUNDARY = "glm_mhc"
# The first matching family names a sublayer (attention before MoE: an attention sublayer launches
# no expert GEMV, a MoE one no recurrence).
KINDS = (("kda attention", ("kda_recurrent", "kda_fused")),
         ("dsa attention", ("glm_mla_decode", "dsa_indexer")),
         ("moe", ("w4a4_mx_static", "glm_router_topk", "glm_moe_layer", "moe_experts")),
         ("dense mlp", ("w4a4_mx",)))


def kind_of(families: set[str]) -> str:
    return next((name for name, fams in KINDS if families & set(fams)), "other")


def sublayers(kernels: list[dict]) -> list[tuple[str, float]]:
    """(kind, span us) of every sublayer: from a boundary launch's end to the next one's end, in
    launch order, named by the families launched between them."""
    out, last, families = [], None, set()
    for k in kernels:
        if k["family"] == BOUNDARY:
            end = k["start_us"] + k["dur_us"]
            if last is not None:
                out.append((kind_of(families), end - last))
            last, families = end, set()
        else:
            families.add(k["family"])
    return out


def table(path: str) -> dict[str, tuple[int, float, float, float]]:
    """kind -> (sublayers, median, lowest, highest span us)."""
    spans: dict[str, list[float]] = {}
    for kind, span in sublayers(json.load(open(path))["kernels"]):
        spans.setdefault(kind, []).append(span)
    return {k: (len(v), statistics.median(v), min(v), max(v)) for k, v in spans.items()}


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__)
        return 2
    tables = [table(p) for p in argv]
    kinds = [k for k, _ in KINDS] + ["other"]
    for kind in (k for k in kinds if any(k in t for t in tables)):
        cols = "".join(f"  {t[kind][0]:3d} x median {t[kind][1]:7.2f} ({t[kind][2]:7.2f}..{t[kind][3]:7.2f})"
                       if kind in t else "  (none)" + " " * 39 for t in tables)
        print(f"{kind:14s}{cols}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
