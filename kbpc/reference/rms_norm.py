"""rms_norm: RMSNorm (plain / one_plus weight), residual copy, residual add + RMSNorm.

Math (explain.families.rms_norm):

    r   = (1/d sum_j x_j^2 + eps)^{-1/2},    y_i = rn_bf16(x_i r w_i),  w_i = 1+gamma_i | gamma_i
    residual add:  h_i <- rn_bf16(h_i + s_i),  rho_i <- h_i,
                   r = (1/d sum_j u_j^2 + eps)^{-1/2},  y_i = rn_bf16(h_i r (1+gamma_i)),
                   u_j = fl32(h_j + s_j) (residual_add_rms_norm) | rn_bf16(h_j + s_j) (_exact)

Reduction order (the numerics give pairs, a butterfly warp shuffle, then a shuffle over the warp
sums; the block size is ours): a row of d (even) elements gets

    B = min(1024, ceil(d/2 / 32) * 32) threads   (d/2 pairs, rounded up to whole warps)

Thread t owns pairs p = t, t+B, t+2B, ... (elements 2p, 2p+1) and accumulates from +0.0, in that
order, acc = fl(acc + fl(x_2p^2)) then acc = fl(acc + fl(x_2p+1^2)). The B partials go through a
32-lane xor butterfly per warp and the B/32 warp sums (zero-padded to 32 lanes) through a second
butterfly (`f32ops.warp_block_sum`); `threads=` selects another block size. Then
mean = fl(sum / d) (a true division), r = rsqrtf(fl(mean + eps)), and y = rn_bf16(fl(fl(x r) w))
with w = fl(1 + gamma) for one_plus.
The strided per-head form (rms_norm_strided) is this same function over rows of the head width.
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.f32ops import WARP, rsqrt_f32, warp_block_sum
from kbpc.reference.formats import to_bf16
from kbpc.reference.fp32 import seq_sum

F32 = np.float32
MAX_THREADS = 1024
WEIGHT_FORMS = ("one_plus", "plain")


def weight_form(node) -> str:
    """How an rms_norm/final_norm node applies its weight: the plain gamma in rms_norm_vanilla and
    where the glm_mhc site norm or the glm_mla_latent_write kernel normalises (their explain text
    says so), 1 + gamma in every other rms_norm kernel (explain rms_norm)."""
    if node.family in ("glm_mhc", "glm_mla_latent_write") or (node.kernel and "vanilla" in node.kernel):
        return "plain"
    return "one_plus"


def block_threads(d: int) -> int:
    """The block size rule: d/2 pairs rounded up to whole warps, at most 1024 threads."""
    if d <= 0 or d % 2:
        raise ValueError(f"rms_norm needs a positive even row width, got {d}")
    return min(MAX_THREADS, -(-(d // 2) // WARP) * WARP)


def sum_squares(u, threads: int | None = None) -> np.ndarray:
    """sum_j u_j^2 over the last axis in the kernel's order (pairs, threads, warps).

    `threads` overrides the block size rule (a multiple of 32, at most 1024)."""
    u = np.asarray(u, F32)
    d = u.shape[-1]
    b = block_threads(d) if threads is None else threads
    pairs = d // 2
    rounds = -(-pairs // b)
    sq = (u * u).astype(F32).reshape(u.shape[:-1] + (pairs, 2))
    pad = np.zeros(u.shape[:-1] + (rounds * b - pairs, 2), F32)
    # (..., rounds, b, 2) -> (..., rounds*2, b): per thread, round by round, even then odd element.
    sq = np.concatenate([sq, pad], axis=-2).reshape(u.shape[:-1] + (rounds, b, 2))
    seq = np.swapaxes(sq, -1, -2).reshape(u.shape[:-1] + (rounds * 2, b))
    partials = seq_sum(seq, axis=-2, start=np.zeros(u.shape[:-1] + (b,), F32))
    return warp_block_sum(partials, axis=-1)


def _weight(gamma, form: str) -> np.ndarray:
    gamma = np.asarray(gamma, F32)
    if form == "one_plus":
        return (F32(1) + gamma).astype(F32)
    if form == "plain":
        return gamma
    raise ValueError(f"weight form must be one of {WEIGHT_FORMS}, got {form!r}")


def _normalize(x: np.ndarray, ss: np.ndarray, gamma, eps: float, form: str) -> np.ndarray:
    mean = (ss / F32(x.shape[-1])).astype(F32)
    r = rsqrt_f32((mean + F32(eps)).astype(F32))
    return to_bf16(((x * r[..., None]).astype(F32) * _weight(gamma, form)).astype(F32))


def rms_norm(x, gamma, eps: float, weight: str = "one_plus",
             threads: int | None = None) -> np.ndarray:
    """y = rn_bf16(x r w) over the last axis; `weight` 'one_plus' (1+gamma) or 'plain' (vanilla)."""
    x = np.asarray(x, F32)
    return _normalize(x, sum_squares(x, threads), gamma, eps, weight)


def rms_norm_residual(x, gamma, eps: float, weight: str = "one_plus",
                      threads: int | None = None):
    """(y, residual copy of x): rms_norm that also copies its input row into the residual buffer."""
    x = np.asarray(x, F32)
    return rms_norm(x, gamma, eps, weight, threads), x.copy()


def residual_add_rms_norm(h, s, gamma, eps: float, exact: bool = False,
                          weight: str = "one_plus", threads: int | None = None):
    """(y, h_new, residual): h <- rn_bf16(h + s) in place, then its norm and residual copy.

    exact=False squares the FP32 sums h + s (residual_add_rms_norm); exact=True squares the
    rounded sums (residual_add_rms_norm_exact, bit-identical to add then rms_norm_residual)."""
    total = (np.asarray(h, F32) + np.asarray(s, F32)).astype(F32)
    h_new = to_bf16(total)
    ss = sum_squares(h_new if exact else total, threads)
    return _normalize(h_new, ss, gamma, eps, weight), h_new, h_new.copy()
