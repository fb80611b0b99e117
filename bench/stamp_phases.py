"""Phase stamps of replayed steps, matched to the step program's launches and summarized (the pure
half of bench/replay_stamps.py, tested on the CPU by tests/unit/test_stamp_phases.py).

A profiling build (`kbpc compile --stamps`) has its instrumented kernels record, per CTA, the
%globaltimer of fixed stamps (kernels/kbp_stamps.cuh): 0 the CTA began, 1 it entered pdl_wait(),
2 it left it, 3-6 the kernel's own phase boundaries (named in its header where they are placed),
7 it ended; a phase the CTA never reached is 0. Records carry %gridid, one value per launch.

Matching: an instance's records are grouped by grid id; within the instance, groups in order of
their first stamp take the instance's launches (kbpc launch table, bench/timeline_launches.py) in
launch order, grid shape by grid shape, as launches of one kernel in one replay run in layer order.
An instance whose group count differs from its launch count is left out with a note.

Times: nanoseconds in, microseconds out, relative to an anchor: for every launch the end (the last
CTA's stamp 7) of the latest launch of an anchor instance (by default every hc boundary instance:
each sublayer's opening boundary) before it in launch order, as bench/timeline_layers.py --chain
reads a sublayer. Launches before the first anchor are relative to the replay's first stamp."""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

TIMES = 8
NAMES = {0: "begin", 1: "wait in", 2: "wait out", 3: "phase 3", 4: "phase 4", 5: "phase 5", 6: "phase 6", 7: "end"}
DEFAULT_ANCHORS = ("hc_boundary",)    # matched against a launch's kernel name


class StampError(Exception):
    """Stamps that cannot be read against this step program; the message says why."""


@dataclass(frozen=True)
class LaunchStamps:
    """One launch's CTAs in one replay: t is (ctas, 8) nanoseconds, 0 where a CTA has no stamp."""
    launch: int                      # index in the launch table
    instance: str
    grid: int                        # %gridid
    ctas: int                        # CTAs recorded
    t: np.ndarray
    blocks: np.ndarray | None = None  # (ctas,) linear block index of each row of t
    sms: np.ndarray | None = None     # (ctas,) the SM it ran on

    def first(self, i: int) -> int | None:
        v = self.t[:, i][self.t[:, i] != 0]
        return int(v.min()) if v.size else None

    def last(self, i: int) -> int | None:
        v = self.t[:, i][self.t[:, i] != 0]
        return int(v.max()) if v.size else None

    def median(self, i: int) -> float | None:
        v = self.t[:, i][self.t[:, i] != 0]
        return float(np.median(v)) if v.size else None


def match_launches(logs: dict[str, np.ndarray], launches: list) -> tuple[list[LaunchStamps], list[str]]:
    """logs: instance -> its records (kbpc.runtime.stamps.RECORD) of one replay; launches: the launch
    table (bench/timeline_launches.LaunchRow). Returns the matched launches in launch order and a
    note for each instance left out."""
    by_instance: dict[str, list] = defaultdict(list)
    for row in launches:
        by_instance[row.instance].append(row)
    matched: list[LaunchStamps] = []
    notes: list[str] = []
    for instance, records in sorted(logs.items()):
        if records.size == 0:
            continue
        rows = by_instance.get(instance)
        if not rows:
            notes.append(f"{instance}: {records.size} stamp records but no launch of it in the step program")
            continue
        grids, which = np.unique(records["grid"], return_inverse=True)
        order = np.argsort(which, kind="stable")
        groups = np.split(order, np.cumsum(np.bincount(which, minlength=len(grids)))[:-1])
        observed = sorted(groups, key=lambda idx: int(records["t"][idx, 0].min()))
        if len(observed) != len(rows):
            notes.append(f"{instance}: {len(observed)} launches stamped, {len(rows)} in the step program "
                         "(left out)")
            continue
        shapes = [_ctas(r.grid) for r in rows]
        if any(len(idx) > n for idx, n in zip(observed, shapes)):
            notes.append(f"{instance}: a stamped launch has more CTAs than its grid (left out)")
            continue
        for idx, row in zip(observed, rows):
            matched.append(LaunchStamps(row.index, instance, int(records["grid"][idx[0]]), len(idx),
                                        np.asarray(records["t"][idx], dtype=np.int64),
                                        np.asarray(records["block"][idx]), np.asarray(records["smid"][idx])))
    matched.sort(key=lambda s: s.launch)
    return matched, notes


def _ctas(grid: tuple[int, int, int]) -> int:
    return grid[0] * grid[1] * grid[2]


def anchored(matched: list[LaunchStamps], launches: list, anchors: tuple[str, ...] = DEFAULT_ANCHORS) -> dict[int, int]:
    """launch index -> the anchor time (ns) its times are read against (see the module text)."""
    is_anchor = {row.index: any(a in row.kernel for a in anchors) for row in launches}
    if not matched:
        return {}
    origin = min(int(s.t[:, 0][s.t[:, 0] != 0].min()) for s in matched)
    end_of = {s.launch: s.last(7) for s in matched if is_anchor.get(s.launch)}
    out: dict[int, int] = {}
    current = origin
    for row in launches:
        out[row.index] = current
        if row.index in end_of and end_of[row.index] is not None:
            current = end_of[row.index]
    return out


def launch_summary(s: LaunchStamps, anchor_ns: int) -> dict:
    """Per stamp: CTAs that reached it, and the first / median / last CTA in us after the anchor."""
    phases = {}
    for i in range(TIMES):
        reached = int(np.count_nonzero(s.t[:, i]))
        if reached:
            phases[str(i)] = {"ctas": reached, "first": (s.first(i) - anchor_ns) / 1e3,
                              "median": (s.median(i) - anchor_ns) / 1e3, "last": (s.last(i) - anchor_ns) / 1e3}
    return {"launch": s.launch, "instance": s.instance, "ctas": s.ctas, "phases": phases}


def _median_phases(phase_dicts: list[dict], fields=("first", "median", "last", "ctas")) -> dict:
    """{stamp: {field: median over the dicts that have that stamp}}, stamps in order, from a list of
    {stamp: {field: value}} (a launch over replays, a kernel over its launches, a chain link over
    sublayers)."""
    out = {}
    for key in sorted({k for d in phase_dicts for k in d}, key=int):
        vals = [d[key] for d in phase_dicts if key in d]
        out[key] = {f: statistics.median(v[f] for v in vals) for f in fields}
    return out


def summarize(replays: list[dict[str, np.ndarray]], launches: list,
              anchors: tuple[str, ...] = DEFAULT_ANCHORS) -> dict:
    """Every replay's launches, and per launch the median over replays of each stamp's first /
    median / last CTA after its anchor (schema kbpc-replay-stamps/v1)."""
    per_launch: dict[int, list[dict]] = defaultdict(list)
    notes: set[str] = set()
    for logs in replays:
        matched, n = match_launches(logs, launches)
        notes.update(n)
        anchor = anchored(matched, launches, anchors)
        for s in matched:
            per_launch[s.launch].append(launch_summary(s, anchor[s.launch]))
    rows = {row.index: row for row in launches}
    out = []
    for index in sorted(per_launch):
        seen = per_launch[index]
        row = rows[index]
        phases = _median_phases([r["phases"] for r in seen])
        out.append({"launch": index, "instance": row.instance, "kernel": row.kernel, "group": row.group,
                    "rule": row.rule, "family": row.family, "stream": row.stream, "grid": list(row.grid),
                    "replays": len(seen), "phases": phases})
    return {"schema": "kbpc-replay-stamps/v1", "anchors": list(anchors), "replays": len(replays),
            "launches": out, "notes": sorted(notes)}


def by_instance(summary: dict) -> list[dict]:
    """Per instance (and grid): the median over its launches of each stamp's first / median / last
    CTA after the anchor, and how many launches that is: a kernel's phases in a typical layer."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for launch in summary["launches"]:
        groups[(launch["instance"], tuple(launch["grid"]))].append(launch)
    out = []
    for (instance, grid), launches in sorted(groups.items()):
        phases = _median_phases([l["phases"] for l in launches])
        out.append({"instance": instance, "kernel": launches[0]["kernel"], "grid": list(grid),
                    "launches": len(launches), "phases": phases})
    return out


def chains(summary: dict, launches: list) -> dict[str, dict]:
    """Per sublayer kind (bench/timeline_layers.py's names: kda / dsa attention, moe, dense mlp), the
    sublayers' launches in launch order, each keyed by its rule and its occurrence in the sublayer
    ("dsa_select #1"; the closing boundary last), with the median over those sublayers of each
    stamp's first / median / last CTA after the opening boundary: where along a sublayer each
    phase of each kernel happens. A sublayer runs from one anchor launch to the next."""
    from timeline_layers import kind_of

    anchors = tuple(summary["anchors"])
    stamped = {l["launch"]: l for l in summary["launches"]}
    layers: list[tuple[str, list[tuple[str, dict]]]] = []
    opened, families, rows, seen = False, set(), [], {}
    for row in launches:
        is_anchor = any(a in row.kernel for a in anchors)
        if opened:
            name = row.rule or row.family
            seen[name] = seen.get(name, 0) + 1
            rows.append((f"{name} #{seen[name]}", stamped.get(row.index, {}).get("phases", {})))
            if not is_anchor:
                families.add(row.family)
        if is_anchor:
            if opened:
                layers.append((kind_of(families), rows))
            opened, families, rows, seen = True, set(), [], {}
    out: dict[str, dict] = {}
    for kind, rows in layers:
        entry = out.setdefault(kind, {"sublayers": 0, "launches": {}})
        entry["sublayers"] += 1
        for key, phases in rows:
            entry["launches"].setdefault(key, []).append(phases)
    for entry in out.values():
        entry["launches"] = {key: _median_phases(per, ("first", "median", "last"))
                             for key, per in entry["launches"].items()}
    return out


def chain_table(chained: dict[str, dict]) -> str:
    """chains() as text: per kind, each launch's stamps (first / median / last CTA, us after the
    opening boundary); launches without stamps are listed without numbers."""
    lines = []
    for kind, entry in chained.items():
        lines.append(f"{kind} ({entry['sublayers']} sublayers): us after the opening boundary ends "
                     "(first / median / last CTA; medians over the sublayers)")
        for key, phases in entry["launches"].items():
            if not phases:
                lines.append(f"  {key:44s} (no stamps)")
                continue
            cells = "  ".join(f"{NAMES[int(k)]} {p['first']:.2f}/{p['median']:.2f}/{p['last']:.2f}"
                              for k, p in phases.items())
            lines.append(f"  {key:44s} {cells}")
    return "\n".join(lines)


def chrome_trace(logs: dict[str, np.ndarray], launches: list, title: str) -> dict:
    """One replay's CTAs as a Chrome/Perfetto trace (chrome://tracing, ui.perfetto.dev): a track per
    SM, a slice per CTA from its begin to its end stamp, named by its kernel, with its launch, block
    and every stamp (us after the replay's first) in args: which kernels shared an SM, and when."""
    matched, _ = match_launches(logs, launches)
    kernels = {row.index: row.kernel for row in launches}
    origin = min((int(s.t[:, 0].min()) for s in matched), default=0)
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": title}}]
    for s in matched:
        name = kernels[s.launch].split("<", 1)[0].replace("kbp::", "")
        for t, block, sm in zip(s.t, s.blocks, s.sms):
            stamps = {NAMES[i]: round((int(t[i]) - origin) / 1e3, 3) for i in range(TIMES) if t[i]}
            events.append({"name": name, "ph": "X", "pid": 0, "tid": int(sm),
                           "ts": (int(t[0]) - origin) / 1e3, "dur": max(0.0, (int(t[7]) - int(t[0])) / 1e3),
                           "args": {"launch": s.launch, "block": int(block), **stamps}})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def table(summary: dict, contains: str | None = None) -> str:
    """A text table of by_instance: one line per stamp, us after the anchor (first / median / last CTA)."""
    lines = [f"{'kernel / stamp':58s} {'CTAs':>6s} {'first':>8s} {'median':>8s} {'last':>8s}   (us after the anchor; "
             f"median over {summary['replays']} replays and over the kernel's launches)"]
    for entry in by_instance(summary):
        if contains and contains not in entry["kernel"] and contains not in entry["instance"]:
            continue
        lines.append(f"{entry['kernel'][:58]:58s} x{entry['launches']} grid {entry['grid']}")
        for key, p in entry["phases"].items():
            lines.append(f"  {NAMES[int(key)]:56s} {p['ctas']:6.0f} {p['first']:8.2f} {p['median']:8.2f} {p['last']:8.2f}")
    for note in summary["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)
