"""glm_moe_combine: weighted routed sum plus the ungated shared expert.

Math (explain.families.glm_moe_combine):

    y_{t,i} = rn_bf16( (sum_{kappa=1..k} w_{t,kappa} e^(kappa)_{t,i}) + e^sh_{t,i} )

Numerics: BF16 expert and shared outputs widened exactly, FP32 weights; one FP32 accumulator
starting at +0.0, summed over the slots in slot order with each product rounded before its add
(no FMA); then the shared value added; one RNE rounding to BF16.

Choice: a slot whose expert id is -1 (unfilled by the router, weight 0) is skipped entirely: it adds
nothing, not even fl(0 * e), so whatever its expert-output row holds (possibly never written, NaN)
cannot reach the sum. Without `ids` every slot is summed.

Shapes: weights (m, k) FP32, expert outputs (m, k, d) BF16 values (slot order; row t*k + kappa
of the (m*k, d) buffer), shared (m, d) BF16 values, ids (m, k) int32 or None.
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.formats import to_bf16

F32 = np.float32


def moe_combine(weights, expert_out, shared, ids=None) -> np.ndarray:
    """y = rn_bf16(sum_slots fl(w * e) + shared), (m, d) BF16 values."""
    w = np.asarray(weights, F32)
    e = np.asarray(expert_out, F32)
    sh = np.asarray(shared, F32)
    m, k = w.shape
    if e.shape[:2] != (m, k) or sh.shape != (m, e.shape[2]):
        raise ValueError(
            f"shapes disagree: weights {w.shape}, experts {e.shape}, shared {sh.shape}")
    live = np.ones((m, k), bool) if ids is None else np.asarray(ids) >= 0
    acc = np.zeros(sh.shape, F32)
    for slot in range(k):
        term = (w[:, slot, None] * e[:, slot]).astype(F32)
        acc = np.where(live[:, slot, None], (acc + term).astype(F32), acc)
    return to_bf16((acc + sh).astype(F32))
