"""Per-sublayer spans of the replayed step, from a replay timeline (`scripts/gpu-timeline.sh` JSON):
the hyper-connection boundary kernels (family glm_mhc) close every sublayer, so the time from one
boundary's end to the next one's is what that sublayer costs on the step's critical path, whatever
runs beside it on other streams. Each sublayer is named by the families launched between its two
boundaries (KDA or DSA attention, routed MoE, dense MLP); the table gives, per kind, the count and
the median, lowest and highest span.

With --chain, per kind also every launch of the sublayer in launch order (named by its rule, the
n-th of that rule inside the sublayer) with the median time it ends after the opening boundary's
end (and its stream): where along the sublayer each kernel finishes, e.g. the router, the gate/up,
the quantizer, the down and the combine boundary of a MoE sublayer. With --starts as well, each
launch shows its median start too (its first CTA's, so a kernel resident early under PDL starts
before its inputs are ready): a link that starts late although its predecessor ended long before
waits for SMs (at 16k the DSA index store started 3.9 us after the index key's norm had ended,
behind the query up-projection's CTAs; bench/NOTES.md, twenty-ninth session).

With --kernel TEXT, for every launch whose kernel name contains TEXT: when it starts after it is
ready (everything it depends on has ended: the timeline's `late_us`, as bench/timeline_delays.py
reads it), how long it runs, and when it ends after it was ready; medians over the launches, per
file (e.g. how long the MLA decode takes after the query projection or the select it waits for).

With --neighbours TEXT, the same medians for the launches whose kernel name contains TEXT, grouped
by the kernel launched before and the kernel launched after each on its stream: a latency-bound
kernel's run can depend on what follows it (a dependent launched early under PDL puts its weight
loads in flight beside it: the hc boundaries ran 5.8 us before the router, 8.5-8.8 us before the
projections that load 9-18 MB before their wait; bench/NOTES.md, twenty-fifth session).

With --json, for any number of timelines, one JSON object per file in a list: its step span, the
per-kind table and the per-kind chains (what a variant summary in bench/results records).

    python3 bench/timeline_layers.py TIMELINE.json [OTHER.json]   # two files: side by side
    python3 bench/timeline_layers.py --chain [--starts] TIMELINE.json [OTHER.json]
    python3 bench/timeline_layers.py --kernel glm_mla_decode TIMELINE.json [OTHER.json...]
    python3 bench/timeline_layers.py --neighbours hc_boundary TIMELINE.json [OTHER.json...]
    python3 bench/timeline_layers.py --json TIMELINE.json...
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


def is_boundary(k: dict) -> bool:
    """A boundary launch: family glm_mhc, except the gates + Sinkhorn issued aside (rule aside:...),
    which run beside the next sublayer."""
    return k["family"] == BOUNDARY and not str(k.get("rule") or "").startswith("aside:")


def kind_of(families: set[str]) -> str:
    return next((name for name, fams in KINDS if families & set(fams)), "other")


def sublayers(kernels: list[dict]) -> list[tuple[str, float]]:
    """(kind, span us) of every sublayer: from a boundary launch's end to the next one's end, in
    launch order, named by the families launched between them."""
    out, last, families = [], None, set()
    for k in kernels:
        if is_boundary(k):
            end = k["start_us"] + k["dur_us"]
            if last is not None:
                out.append((kind_of(families), end - last))
            last, families = end, set()
        else:
            families.add(k["family"])
    return out


def launch_chains(kernels: list[dict], at: str = "end") -> list[tuple[str, list[tuple[str, int, float]]]]:
    """(kind, [(launch key, stream, end us after the opening boundary's end)]) of every sublayer:
    its launches in launch order, the closing boundary last; a launch's key is its rule (its
    family where it has none) and which occurrence of that rule in the sublayer it is. at="start":
    the launches' start instead of their end."""
    out, last, families, rows, seen = [], None, set(), [], {}
    for k in kernels:
        name = k.get("rule") or k["family"]
        end = k["start_us"] + k["dur_us"]
        if last is not None:
            seen[name] = seen.get(name, 0) + 1
            rows.append((f"{name} #{seen[name]}", k.get("stream", -1), (end if at == "end" else k["start_us"]) - last))
        if is_boundary(k):
            if last is not None:
                out.append((kind_of(families), rows))
            last, families, rows, seen = end, set(), [], {}
        elif last is not None:
            families.add(k["family"])
    return out


def chain_table(path: str, at: str = "end") -> dict[str, tuple[int, dict[str, tuple[int, float]]]]:
    """kind -> (sublayers, {launch key: (stream, median end us)}), launch keys in first-seen order
    (at="start": median start us)."""
    by_kind: dict[str, list[list[tuple[str, int, float]]]] = {}
    for kind, rows in launch_chains(json.load(open(path))["kernels"], at):
        by_kind.setdefault(kind, []).append(rows)
    out = {}
    for kind, layers in by_kind.items():
        ends: dict[str, list[float]] = {}
        streams: dict[str, int] = {}
        for rows in layers:
            for key, stream, end in rows:
                ends.setdefault(key, []).append(end)
                streams.setdefault(key, stream)
        out[kind] = (len(layers), {key: (streams[key], statistics.median(v)) for key, v in ends.items()})
    return out


def print_chains(paths: list[str], starts: bool = False) -> None:
    tables = [chain_table(p) for p in paths]
    firsts = [chain_table(p, "start") if starts else {} for p in paths]
    kinds = [k for k, _ in KINDS] + ["other"]
    for kind in (k for k in kinds if any(k in t for t in tables)):
        counts = " / ".join(str(t[kind][0]) if kind in t else "0" for t in tables)
        what = "median start .. end" if starts else "median end"
        print(f"{kind} ({counts} sublayers): {what}, us after the opening boundary ends")
        keys = list(dict.fromkeys(key for t in tables if kind in t for key in t[kind][1]))
        for key in keys:
            cols = ""
            for t, f in zip(tables, firsts):
                if kind not in t or key not in t[kind][1]:
                    cols += "  " + " " * (21 if starts else 11) + "-"
                    continue
                stream, end = t[kind][1][key]
                first = f"{f[kind][1][key][1]:8.2f} .." if starts else ""
                cols += f"  s{stream} {first}{end:8.2f}"
            print(f"  {key[:44]:44s}{cols}")


def table(path: str) -> dict[str, tuple[int, float, float, float]]:
    """kind -> (sublayers, median, lowest, highest span us)."""
    spans: dict[str, list[float]] = {}
    for kind, span in sublayers(json.load(open(path))["kernels"]):
        spans.setdefault(kind, []).append(span)
    return {k: (len(v), statistics.median(v), min(v), max(v)) for k, v in spans.items()}


def summary(path: str) -> dict:
    """One timeline as JSON: step span (median, min, max us), per kind the sublayer count and span
    median / lowest / highest, and per kind every launch's stream and median end."""
    span = json.load(open(path)).get("step_span_us", {})
    return {"file": path,
            "step_span_us": {k: span[k] for k in ("median", "min", "max") if k in span},
            "sublayers": {kind: {"count": n, "median_us": med, "min_us": lo, "max_us": hi}
                          for kind, (n, med, lo, hi) in table(path).items()},
            "chains": {kind: {"count": n, "launches": [{"launch": key, "stream": stream, "end_us": end}
                                                        for key, (stream, end) in rows.items()]}
                       for kind, (n, rows) in chain_table(path).items()}}


def after_ready(kernels: list[dict], text: str) -> dict:
    """Launches whose kernel name contains `text`: their count and the medians of their start after
    ready (the timeline's own `late_us`: start minus the end of everything the launch depends on,
    bench/timeline_delays.py's measure), their duration, and their end after ready."""
    rows = [(k["late_us"], k["dur_us"]) for k in kernels if text in k["kernel"]]
    if not rows:
        return {"count": 0}
    return {"count": len(rows), "start_after_us": statistics.median(r[0] for r in rows),
            "duration_us": statistics.median(r[1] for r in rows),
            "end_after_us": statistics.median(r[0] + r[1] for r in rows)}


def short_name(kernel: str) -> str:
    """A kernel's name without its namespace and template arguments."""
    return kernel.split("<")[0].split("::")[-1]


def by_neighbours(kernels: list[dict], text: str) -> dict[tuple[str, str], dict]:
    """(kernel before, kernel after on the same stream; "" at a stream's ends) -> after_ready's
    medians over the launches whose kernel name contains `text`, the timeline's launch order."""
    streams: dict[int, list[dict]] = {}
    for k in kernels:
        streams.setdefault(k.get("stream", -1), []).append(k)
    groups: dict[tuple[str, str], list[dict]] = {}
    for seq in streams.values():
        for i, k in enumerate(seq):
            if text in k["kernel"]:
                before = short_name(seq[i - 1]["kernel"]) if i else ""
                after = short_name(seq[i + 1]["kernel"]) if i + 1 < len(seq) else ""
                groups.setdefault((before, after), []).append(k)
    return {key: after_ready(rows, text) for key, rows in groups.items()}


def for_each_timeline(paths: list[str], show) -> int:
    """show(path, launches) for each timeline; 1 (said why) at the first without `late_us`."""
    for path in paths:
        kernels = json.load(open(path))["kernels"]
        if any("late_us" not in k for k in kernels):
            print(f"{path}: no late_us (recorded before bench/timeline_delays.py; read it with that tool's --step)")
            return 1
        show(path, kernels)
    return 0


def print_neighbours(text: str, paths: list[str]) -> int:
    def show(path: str, kernels: list[dict]) -> None:
        groups = by_neighbours(kernels, text)
        if not groups:
            print(f"{path}: no launch of {text}")
            return
        print(f"{path}: {text} by the kernels before and after it on its stream (medians, us)")
        for (before, after), r in sorted(groups.items(), key=lambda kv: -kv[1]["count"]):
            print(f"  {r['count']:4d} x  after {before[:34]:34s} before {after[:34]:34s} starts {r['start_after_us']:6.2f}"
                  f"  runs {r['duration_us']:6.2f}  ends {r['end_after_us']:6.2f}")
    return for_each_timeline(paths, show)


def print_kernel(text: str, paths: list[str]) -> int:
    def show(path: str, kernels: list[dict]) -> None:
        r = after_ready(kernels, text)
        if not r["count"]:
            print(f"{path}: no launch of {text}")
            return
        print(f"{path}: {r['count']} x {text}: starts {r['start_after_us']:.2f} us after it is ready, runs "
              f"{r['duration_us']:.2f} us, ends {r['end_after_us']:.2f} us after it is ready (medians)")
    return for_each_timeline(paths, show)


def main(argv: list[str]) -> int:
    for flag, show in (("--kernel", print_kernel), ("--neighbours", print_neighbours)):
        if flag in argv:
            i = argv.index(flag)
            paths = argv[:i] + argv[i + 2:]
            if i + 1 >= len(argv) or not paths:   # the text and at least one timeline
                print(__doc__)
                return 2
            return show(argv[i + 1], paths)
    chain, as_json, starts = "--chain" in argv, "--json" in argv, "--starts" in argv
    argv = [a for a in argv if a not in ("--chain", "--json", "--starts")]
    if as_json and argv:
        print(json.dumps([summary(p) for p in argv], indent=1))
        return 0
    if not 1 <= len(argv) <= 2:
        print(__doc__)
        return 2
    if chain:
        print_chains(argv, starts)
        return 0
    tables = [table(p) for p in argv]
    kinds = [k for k, _ in KINDS] + ["other"]
    for kind in (k for k in kinds if any(k in t for t in tables)):
        cols = "".join(f"  {t[kind][0]:3d} x median {t[kind][1]:7.2f} ({t[kind][2]:7.2f}..{t[kind][3]:7.2f})"
                       if kind in t else "  (none)" + " " * 39 for t in tables)
        print(f"{kind:14s}{cols}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
