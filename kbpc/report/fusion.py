"""What the fusion pass did, for `kbpc compile` and the bundle manifest: launches before and after
fusion, each rule applied (how often), and every candidate left apart with the reason."""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

from kbpc.ir.plan import FusionRecord


@dataclass(frozen=True)
class FusionReport:
    launches_before: int
    launches_after: int
    applied: dict[str, int]                  # rule -> merges
    left_apart: tuple[FusionRecord, ...]

    def to_json(self) -> dict:
        return {"launches_before": self.launches_before, "launches_after": self.launches_after,
                "applied": dict(self.applied), "left_apart": [asdict(r) for r in self.left_apart]}

    def lines(self, limit: int = 8) -> list[str]:
        out = [f"fusion: {self.launches_before} -> {self.launches_after} launches per step"]
        out += [f"  fused {rule} x{n}" for rule, n in sorted(self.applied.items())]
        by_reason = Counter((r.rule, r.reason) for r in self.left_apart)
        for (rule, reason), n in sorted(by_reason.items())[:limit]:
            out.append(f"  left apart: {rule} x{n}: {reason}")
        if len(by_reason) > limit:
            out.append(f"  ... and {len(by_reason) - limit} more kinds of refusal (plan.json: fusions)")
        return out


def fusion_report(fusions: tuple[FusionRecord, ...], launches_before: int, launches_after: int) -> FusionReport:
    applied = Counter(r.rule for r in fusions if r.applied)
    return FusionReport(launches_before, launches_after, dict(sorted(applied.items())),
                        tuple(r for r in fusions if not r.applied))
