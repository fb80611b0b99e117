"""End-to-end numerics check of a bundle: the GPU step against the reference interpreter with the
same synthetic weights and the same token sequence (teacher forcing: both sides are fed the
reference's greedy tokens, so one early disagreement cannot derail the rest)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kbpc.runtime.bundle_model import BundleModel
from kbpc.runtime.reference_backend import ReferenceBackend, load_weights

REL_L2_LIMIT = 1e-2
AGREEMENT_LIMIT = 0.95


@dataclass
class NumericsReport:
    positions: int
    rel_l2: list[float] = field(default_factory=list)
    same_token: list[bool] = field(default_factory=list)

    @property
    def max_rel_l2(self) -> float:
        return max(self.rel_l2, default=0.0)

    @property
    def agreement(self) -> float:
        return sum(self.same_token) / max(1, len(self.same_token))

    @property
    def passed(self) -> bool:
        return self.max_rel_l2 <= REL_L2_LIMIT and self.agreement >= AGREEMENT_LIMIT

    def to_json(self) -> dict:
        return {"positions": self.positions, "max_rel_l2": self.max_rel_l2, "agreement": self.agreement,
                "rel_l2": self.rel_l2, "same_token": self.same_token, "passed": self.passed,
                "limits": {"rel_l2": REL_L2_LIMIT, "agreement": AGREEMENT_LIMIT}}


def compare_numerics(model: BundleModel, positions: int = 64, weights: str = "synthetic:0",
                     first_token: int = 1, on_position=None) -> NumericsReport:
    from kbpc.runtime.cuda_backend import CudaBackend

    bp = model.blueprint
    ref = ReferenceBackend(bp, load_weights(bp, weights), positions)
    gpu = CudaBackend(model, weights, positions)
    report = NumericsReport(positions)
    token = first_token
    try:
        for pos in range(positions):
            ref_logits, ref_next = ref.step(token)
            gpu_logits, gpu_next = gpu.step(token)
            diff = np.linalg.norm((gpu_logits - ref_logits).astype(np.float64))
            norm = np.linalg.norm(ref_logits.astype(np.float64)) or 1.0
            report.rel_l2.append(float(diff / norm))
            report.same_token.append(gpu_next == ref_next)
            if on_position:
                on_position(pos, report)
            token = ref_next
    finally:
        gpu.close()
    return report
