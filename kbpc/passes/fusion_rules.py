"""The fused kernel forms the fusion pass may create: one record per form, in one table.

A rule names the exact multiset of node ops a merged group holds and the family whose lowering
serves it (that lowering recognises the merged nodes and emits the fused kernel; a test checks
every rule lowers). A rule is listed here only once its kernel form exists and is tested against
the reference: fusion never changes the math, so a bit-exact chain stays bit-exact."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class FusionRule:
    name: str
    family: str                      # the family lowering that serves the merged group
    ops: tuple[str, ...]             # the merged group's node ops (a multiset, by Node.op)
    anchor: str                      # the op a search starts from (one per merged group)
    why: str                         # what the fused kernel saves, for the report

    @property
    def op_counts(self) -> Counter:
        return Counter(self.ops)


FUSION_RULES: tuple[FusionRule, ...] = (
    FusionRule("hc_boundary", "glm_mhc", ("hc_post", "linear:hc_mix", "hc_pre", "rms_norm"), "hc_post",
               "the post-mix runs inside the next site's pre-mix kernel (FUSE_POST): one launch and one "
               "pass over the streams fewer per boundary"),
)
