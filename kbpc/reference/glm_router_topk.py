"""glm_router_topk: sigmoid + correction-bias top-k routing over FP32 logits.

Math (explain.families.glm_router_topk):

    s_e = sigma(z_e),   chi_e = s_e + b_e,   E = top_k(chi) (descending, ties to the lower e)
    w_e = gamma_r * s_e / (sum_{e' in E} s_e' + 1e-20),   e in E

Numerics: FP32 throughout; sigma(z) = 1 / (1 + expf(-z)); chi = fl(s + b) is used for selection
only; the renormalising sum runs in slot order (slot 0 first) in FP32; then a true division
fl(s_e / fl(sum + 1e-20)) and, after it, the scale multiply fl(q * gamma_r). Default (non-ladder)
mode only.

Choices where the math is open:
- Candidates: an expert can fill a slot only if chi_e is not NaN and chi_e > -inf (the block-wide
  argmax starts from -inf and keeps strictly greater values, so NaN and -inf never win). A bias of
  -inf therefore masks an expert.
- Slots no candidate fills (k > experts, or fewer candidates than k) get id -1 and weight 0 and
  are left out of the renormalising sum; they are the trailing slots.
- 1e-20 is taken as fl32(1e-20).
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.f32ops import sigmoid_f32
from kbpc.reference.fp32 import seq_sum

F32 = np.float32
RENORM_EPS = F32(1e-20)


def router_scores(logits) -> np.ndarray:
    """s = sigma(z), FP32."""
    return sigmoid_f32(logits)


def topk_select(chi, k: int) -> np.ndarray:
    """Ids of the top-k of chi per row, descending, exact ties to the lower id; -1 when unfilled."""
    chi = np.asarray(chi, F32)
    m, experts = chi.shape
    valid = ~np.isnan(chi) & (chi > -np.inf)
    key = np.where(valid, chi, -np.inf)
    # lexsort: last key is primary. Sort by -chi ascending (so chi descending), then by id.
    ids = np.broadcast_to(np.arange(experts), chi.shape)
    order = np.lexsort((ids, -key.astype(np.float64)), axis=-1)
    out = np.full((m, k), -1, np.int32)
    take = min(k, experts)
    chosen = order[:, :take]
    ok = np.take_along_axis(valid, chosen, axis=-1)
    out[:, :take] = np.where(ok, chosen, -1)
    return out


def router_topk(logits, bias, k: int, routed_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(weights FP32 (m, k), ids int32 (m, k)) for FP32 logits (m, experts) and bias (experts,)."""
    z = np.asarray(logits, F32)
    if z.ndim != 2:
        raise ValueError(f"logits must be (m, experts), got shape {z.shape}")
    s = router_scores(z)
    chi = (s + np.asarray(bias, F32)).astype(F32)
    ids = topk_select(chi, k)
    filled = ids >= 0
    s_sel = np.where(filled, np.take_along_axis(s, np.maximum(ids, 0), axis=-1), F32(0))
    # Unfilled slots are trailing, so a zero there leaves the slot-order sum unchanged.
    denom = (seq_sum(s_sel, axis=-1) + RENORM_EPS).astype(F32)
    w = ((s_sel / denom[:, None]).astype(F32) * F32(routed_scale)).astype(F32)
    return np.where(filled, w, F32(0)).astype(F32), ids
