"""layer_norm: BF16 LayerNorm with weight and bias (two-pass mean and biased variance).

Math (explain.families.layer_norm):

    mu = 1/d sum_j x_j,   v = 1/d sum_j (x_j - mu)^2
    y_i = rn_bf16((x_i - mu) / sqrt(v + eps) gamma_i + beta_i)

Numerics: BF16 widened exactly; both sums are FP32 per-thread partials then a shared-memory halving
tree; biased variance; rsqrtf; one RNE rounding per output.

Order chosen: a row of d elements gets B = min(1024, max(32, next_pow2(d))) threads (a power of
two, so the halving tree is complete); thread t sums elements t, t+B, ... sequentially in FP32 and
the B partials go through the halving tree (offsets B/2, ..., 1) =
`f32ops.strided_tree_sum(.., threads=B)`. mu = fl(sum / d) and v = fl(sum / d) are true divisions;
the deviations are fl(x - mu) squared as fl(dev * dev); r = rsqrtf(fl(v + eps)); the output is
rn_bf16(fl(fl(fl(x - mu) * r) * gamma) + beta).
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.f32ops import rsqrt_f32, strided_tree_sum
from kbpc.reference.formats import to_bf16

F32 = np.float32


def block_threads(d: int) -> int:
    """The block size rule: the next power of two >= d, within [32, 1024]."""
    if d <= 0:
        raise ValueError(f"layer_norm needs a positive row width, got {d}")
    return min(1024, max(32, 1 << (d - 1).bit_length()))


def layer_norm(x, gamma, beta, eps: float, threads: int | None = None) -> np.ndarray:
    """rn_bf16((x - mu) rsqrt(v + eps) gamma + beta) over the last axis.

    `threads` (a power of two) overrides the block size rule."""
    x = np.asarray(x, F32)
    d = x.shape[-1]
    b = block_threads(d) if threads is None else threads
    mu = (strided_tree_sum(x, threads=b) / F32(d)).astype(F32)
    dev = (x - mu[..., None]).astype(F32)
    var = (strided_tree_sum((dev * dev).astype(F32), threads=b) / F32(d)).astype(F32)
    r = rsqrt_f32((var + F32(eps)).astype(F32))
    scaled = ((dev * r[..., None]).astype(F32) * np.asarray(gamma, F32)).astype(F32)
    return to_bf16((scaled + np.asarray(beta, F32)).astype(F32))
