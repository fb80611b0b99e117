"""kda_o_norm: the KDA output norm, a per-head RMSNorm gated by a sigmoid.

Math (explain.families.kda_o_norm), one head o in R^D of the FP32 recurrence output:

    y_i = rn_bf16( o_i / sqrt(1/D sum_j o_j^2 + eps) * gamma_i * sigma(z_i) )

Numerics: FP32 input; BF16 gate z and weight gamma widened exactly; the sum of squares is a
shuffle-down tree in each 32-lane warp, then a second warp reduction over the D/32 warp sums; scale
rsqrtf(mean + eps); sigma via __expf; one RNE rounding at the store.

Order chosen: one block of D threads (D a multiple of 32, at most 1024) per (row, head), thread i
holds fl(o_i^2); `f32ops.warp_block_sum` (tree over each warp, tree over the zero-padded warp sums).
mean = fl(sum / D) (true division), r = rsqrtf(fl(mean + eps)), sigma(z) = fl(1 / fl(1 + expf(-z))),
y = rn_bf16(fl(fl(fl(o r) gamma) sigma)). gamma is (D,) shared by every head or (H*D,) per head.
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.f32ops import rsqrt_f32, sigmoid_f32, warp_block_sum
from kbpc.reference.formats import to_bf16

F32 = np.float32


def kda_o_norm(o, z, gamma, eps: float, head_dim: int) -> np.ndarray:
    """Per-head gated RMSNorm: o (..., H*D) FP32, z (..., H*D) BF16 values -> (..., H*D) BF16."""
    o = np.asarray(o, F32)
    width = o.shape[-1]
    if width % head_dim:
        raise ValueError(f"row width {width} is not a multiple of head_dim {head_dim}")
    heads = o.reshape(o.shape[:-1] + (width // head_dim, head_dim))
    ss = warp_block_sum((heads * heads).astype(F32), axis=-1)
    mean = (ss / F32(head_dim)).astype(F32)
    r = rsqrt_f32((mean + F32(eps)).astype(F32))
    gamma = np.asarray(gamma, F32)
    if gamma.shape[-1] == head_dim:
        gamma = np.broadcast_to(gamma, heads.shape)
    else:
        gamma = gamma.reshape(heads.shape[-2:])
    y = ((heads * r[..., None]).astype(F32) * gamma).astype(F32)
    gate = sigmoid_f32(np.asarray(z, F32).reshape(heads.shape))
    return to_bf16((y * gate).astype(F32)).reshape(o.shape)
