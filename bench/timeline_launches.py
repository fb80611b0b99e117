"""The launch table of a bundle, and kernel records matched to it (the pure half of
bench/replay_timeline.py, tested on the CPU by tests/unit/test_replay_timeline.py).

A bundle holds the step program it was built from (src/step.cu, rendered by templates/step.cu.j2)
and one TU per kernel instance (src/kernels/<instance>.cu, whose second line names the C++ kernel
with its template arguments). Their text is what the library runs, so the table is read from it:
each `kbp_launch_<instance>(dim3(grid), dim3(block), smem, streams[s], flags, ...)` (flags bit 0:
programmatic dependent launch, bit 1: the highest priority) under its
`// group G (rule, family) on stream S:` comment, in launch order.

A profiler names a kernel by its demangled symbol (`void kbp::w4a16_gemv<128, 4, true>(...)`), so
records are matched to launches by a cascade of keys, each used only where it is unambiguous in
count: (kernel with template arguments, grid, block), then (template name, grid, block), then the
template name alone; within a key, records in start order take launches in launch order (launches
of one kernel in one replay run in layer order)."""
from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from dataclasses import dataclass

_GROUP = re.compile(r"^\s*// group (\d+) \((.*), ([^,()]*)\) on stream (\d+):")
_WAIT = re.compile(r"cudaStreamWaitEvent\(streams\[(\d+)\], events\[(\d+)\]")
_RECORD = re.compile(r"cudaEventRecord\(events\[(\d+)\], streams\[(\d+)\]\)")
_LAUNCH = re.compile(r"kbp_launch_(\w+)\(dim3\((\d+), (\d+), (\d+)\), dim3\((\d+), (\d+), (\d+)\), "
                     r"(\d+), streams\[(\d+)\], ([0-3])\b")


class TimelineError(Exception):
    """A bundle or a trace the timeline cannot use; the message says what to try."""


@dataclass(frozen=True)
class LaunchRow:
    index: int                       # launch order in the step program
    group: int
    rule: str
    family: str
    stream: int
    instance: str                    # the kernel instance (its launcher is kbp_launch_<instance>)
    kernel: str                      # C++ kernel name with template arguments
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    pdl: bool                        # launched with programmatic dependent launch
    after_wait: bool                 # the first launch after a cross-stream event wait
    waits: tuple[int, ...] = ()      # events its stream waited for since its previous launch there
    records: tuple[int, ...] = ()    # events its stream records after it, before its next launch
    priority: bool = False           # launched at the highest priority

    def to_json(self) -> dict:
        return {"launch": self.index, "group": self.group, "rule": self.rule, "family": self.family,
                "stream": self.stream, "instance": self.instance, "kernel": self.kernel, "pdl": self.pdl,
                "priority": self.priority,
                "after_wait": self.after_wait, "waits": list(self.waits), "records": list(self.records)}


@dataclass(frozen=True)
class KernelRecord:
    """One kernel execution a profiler recorded (times in microseconds)."""
    name: str                        # demangled symbol
    start: float
    end: float
    stream: int                      # the profiler's stream id (not the plan's)
    correlation: int | None          # the launching API call (one cudaGraphLaunch per replay)
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None


def kernel_names(sources: dict[str, str]) -> dict[str, str]:
    """instance -> C++ kernel name, from the kernel TUs (path src/kernels/<instance>.cu -> text)."""
    names = {}
    for path, text in sources.items():
        lines = text.splitlines()
        if path.startswith("src/kernels/") and path.endswith(".cu") and len(lines) > 1 and lines[1].startswith("// "):
            names[path[len("src/kernels/"):-3]] = lines[1][3:].strip()
    return names


def launch_table(step_cu: str, kernels: dict[str, str]) -> list[LaunchRow]:
    """Every kernel launch of the step program, in launch order, with the event waits before it and
    the event records after it on its stream. An event recorded on a stream before its first launch
    is left out (it is complete when the step starts); one recorded after waits with no launch
    between (a group that launches nothing) is dated by the stream's last launch, without them."""
    rows: list[LaunchRow] = []
    group = None
    waited = False
    pending: dict[int, list[int]] = defaultdict(list)   # stream -> events waited since its last launch
    last_on: dict[int, int] = {}                         # stream -> its last launch row
    for line in step_cu.splitlines():
        if m := _GROUP.match(line):
            group = (int(m[1]), m[2], m[3].strip(), int(m[4]))
            waited = False
        elif m := _WAIT.search(line):
            waited = True
            pending[int(m[1])].append(int(m[2]))
        elif m := _RECORD.search(line):
            if int(m[2]) in last_on:
                i = last_on[int(m[2])]
                rows[i] = dataclasses.replace(rows[i], records=rows[i].records + (int(m[1]),))
        elif (m := _LAUNCH.search(line)) and group is not None:
            gid, rule, family, stream = group
            if int(m[9]) != stream:
                raise TimelineError(f"group {gid} launches on stream {m[9]} under a header naming stream {stream}")
            rows.append(LaunchRow(len(rows), gid, rule, family, stream, m[1], kernels.get(m[1], m[1]),
                                  (int(m[2]), int(m[3]), int(m[4])), (int(m[5]), int(m[6]), int(m[7])),
                                  bool(int(m[10]) & 1), waited, tuple(pending.pop(stream, ())),
                                  priority=bool(int(m[10]) & 2)))
            last_on[stream] = len(rows) - 1
            waited = False
    if not rows:
        raise TimelineError("no kernel launches found in src/step.cu: not a step program of this kbpc "
                            "(templates/step.cu.j2)")
    return rows


def strip_signature(symbol: str) -> str:
    """`void kbp::k<1, (kbp::M)2>(float const*, int)` -> `kbp::k<1,(kbp::M)2>` (no spaces)."""
    s = symbol.strip()
    if s.startswith("void "):
        s = s[5:]
    if s.endswith(")"):
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i]
                break
    return s.replace(" ", "")


def base_name(kernel: str) -> str:
    return strip_signature(kernel).split("<", 1)[0]


def _keys(kernel: str, grid, block) -> tuple[tuple, ...]:
    full = strip_signature(kernel)
    return ((full, grid, block), (base_name(kernel), grid, block), (base_name(kernel),))


def match_replay(records: list[KernelRecord], launches: list[LaunchRow]) -> list[LaunchRow | None]:
    """For each record (in the given order), its launch, or None where no key is unambiguous."""
    order = sorted(range(len(records)), key=lambda i: (records[i].start, records[i].end))
    left_r = order
    left_l = list(range(len(launches)))
    found: dict[int, int] = {}
    for level in range(3):
        by_r: dict[tuple, list[int]] = defaultdict(list)
        by_l: dict[tuple, list[int]] = defaultdict(list)
        for i in left_r:
            by_r[_keys(records[i].name, records[i].grid, records[i].block)[level]].append(i)
        for j in left_l:
            by_l[_keys(launches[j].kernel, launches[j].grid, launches[j].block)[level]].append(j)
        for key, rs in by_r.items():
            ls = by_l.get(key, [])
            if len(rs) == len(ls):
                found.update(zip(rs, ls))
        left_r = [i for i in left_r if i not in found]
        taken = set(found.values())
        left_l = [j for j in left_l if j not in taken]
    return [launches[found[i]] if i in found else None for i in range(len(records))]
