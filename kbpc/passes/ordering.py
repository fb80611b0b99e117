"""Dependencies between groups (kbpc/ir/grouping.py) and the happens-before order a stream
schedule gives them."""
from __future__ import annotations

from kbpc.ir.plan import Plan, ScheduledGroup


def group_dependencies(plan: Plan) -> dict[int, set[int]]:
    """group id -> ids of the groups it must run after (within one step): the plan's grouping."""
    return plan.grouping.dependencies()


class HappensBefore:
    """Vector clocks over a schedule: clock[g][s] = the last position on stream s that is known
    finished when group g starts (through stream order and the events g waits for)."""

    def __init__(self, schedule: tuple[ScheduledGroup, ...]):
        self.pos = {s.group: s for s in schedule}
        recorded = {s.record: s for s in schedule if s.record is not None}
        self.clock: dict[int, dict[int, int]] = {}
        last_on: dict[int, int] = {}
        self.missing_events: list[tuple[int, int]] = []
        for s in sorted(schedule, key=lambda x: x.position):
            sources = [last_on[s.stream]] if s.stream in last_on else []
            for e in s.waits:
                if e in recorded and recorded[e].position < s.position:
                    sources.append(recorded[e].group)
                else:
                    self.missing_events.append((s.group, e))
            known: dict[int, int] = {}
            for g in sources:
                for stream, p in self.clock[g].items():
                    known[stream] = max(known.get(stream, -1), p)
            known[s.stream] = s.position
            self.clock[s.group] = known
            last_on[s.stream] = s.group

    def before(self, a: int, b: int) -> bool:
        """Group a finishes before group b starts."""
        if a == b:
            return False
        pa, pb = self.pos[a], self.pos[b]
        if pa.position >= pb.position:
            return False
        if pa.stream == pb.stream:
            return True
        # b's clock counts b itself on its own stream; other streams are known finished up to it.
        return self.clock[b].get(pa.stream, -1) >= pa.position
