"""w4a16_gemv: NVFP4 weight x BF16 activation GEMV on CUDA cores (`explain.families.w4a16_gemv`).

    W_nk = s_g s_{n,k/16} q_nk
    16-value chunk walk:  y_n = rn_bf16( sum_j (s_g s_nj) sum_{i<16} q_{n,16j+i} x_{16j+i} )
    8-value walk:         y_n = rn_bf16( sum_k x_k (q_nk (s_g s_{n,k/16})) )
    silu input:           x_k = (g_k / (1 + e^{-g_k})) u_k   (FP32, not rounded)

Orders (fixed here; the CUDA kernels follow them, the `_sw` one-warp forms by keeping two
accumulators per lane, the batch forms per row):
- chunk walk (w4a16_gemv, batch2/3, seg_*, pipe_*): thread l of 64 takes chunks j = l, l+64, ...
  in increasing j; per chunk c = +0, c = fma(q_i, x_i, c) for i = 0..15, then
  acc = fma(c, f32(s_g * s_nj), acc) with acc from +0.
- 8-value walk (dual, qg, silu-input): w_k = f32(q_nk * f32(s_g * s_nj)) first; thread l of 64
  takes the 8-element vectors v = l, l+64, ... (elements 8v..8v+7) in increasing v and i,
  acc = fma(x_k, w_k, acc) from +0.
- then each warp's shuffle tree (`fp32.tree_sum`), y = P0 + P1, rn_bf16.
A BF16 x times an E2M1 q is exact in FP32 (8 + 2 significant bits, no underflow below 2^-134),
so that FMA is evaluated as a separately rounded add; otherwise a correctly rounded FMA
(`gemv_order.fma_f32_fast`, equal to `fp32.fma_f32`) is used.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kbpc.reference.f32ops import silu_f32
from kbpc.reference.formats import NVFP4_GROUP, nvfp4_group_values, to_bf16
from kbpc.reference.gemv_order import fma_f32_fast
from kbpc.reference.gemv_order import lane_layout, row_blocks, two_warp_sum

F32 = np.float32
WALKS = ("chunk16", "vec8")


def _check(x: np.ndarray, packed: np.ndarray, scales: np.ndarray) -> None:
    k = x.shape[-1]
    if k % NVFP4_GROUP:
        raise ValueError(f"w4a16_gemv needs K a multiple of {NVFP4_GROUP}, got {k}")
    if packed.shape[-1] * 2 != k or scales.shape[-1] * NVFP4_GROUP != k:
        raise ValueError(f"weight {packed.shape}/{scales.shape} does not match K = {k}")


def _chunk16_block(x: np.ndarray, q: np.ndarray, sc: np.ndarray, exact: bool) -> np.ndarray:
    """Per-thread accumulators (m, n, 64) of the 16-value chunk walk for one block of outputs."""
    m, k = x.shape
    xj = x.reshape(m, 1, k // 16, 16)
    qj = q.reshape(1, q.shape[0], k // 16, 16)
    c = np.zeros((m, q.shape[0], k // 16), F32)
    for i in range(16):
        if exact:
            c += xj[..., i] * qj[..., i]
        else:
            c = fma_f32_fast(qj[..., i], xj[..., i], c)
    cl = lane_layout(c, 1)[..., 0]                    # (m, n, T, 64), zero-padded chunks
    sl = lane_layout(sc, 1)[..., 0][None]             # (1, n, T, 64), zero scales
    acc = np.zeros(cl.shape[:2] + (cl.shape[-1],), F32)
    for t in range(cl.shape[2]):
        acc = fma_f32_fast(cl[:, :, t], sl[:, :, t], acc)
    return acc


def _vec8_block(x: np.ndarray, q: np.ndarray, sc: np.ndarray, exact: bool) -> np.ndarray:
    """Per-thread accumulators (m, n, 64) of the 8-value walk for one block of outputs."""
    wv = (q * np.repeat(sc, NVFP4_GROUP, axis=-1)).astype(F32)
    xl = lane_layout(x, 8)[:, None]                   # (m, 1, T, 64, 8)
    wl = lane_layout(wv, 8)[None]                     # (1, n, T, 64, 8)
    acc = np.zeros((x.shape[0], q.shape[0], 64), F32)
    for t in range(xl.shape[2]):
        for i in range(8):
            acc = fma_f32_fast(xl[:, :, t, :, i], wl[:, :, t, :, i], acc)
    return acc


def w4a16_gemv(x, packed, scales, global_scale, walk: str = "chunk16") -> np.ndarray:
    """y (m, N) BF16 values = x (m, K) times the NVFP4 weight (packed (N, K/2) bytes, scales
    (N, K/16) E4M3 codes, global_scale the FP32 tensor scale s_g), in the given walk's order."""
    x = np.atleast_2d(np.asarray(x, F32))
    packed, scales = np.asarray(packed, np.uint8), np.asarray(scales, np.uint8)
    _check(x, packed, scales)
    if walk not in WALKS:
        raise ValueError(f"walk must be one of {WALKS}, got {walk!r}")
    # FMAs of E2M1 x BF16 are exact products; anything else needs the fused operation.
    exact = walk == "chunk16" and bool(np.array_equal(to_bf16(x), x))
    block = _chunk16_block if walk == "chunk16" else _vec8_block
    sg = F32(global_scale)
    y = np.empty((x.shape[0], packed.shape[0]), F32)
    for blk in row_blocks(packed.shape[0], x.shape[0] * x.shape[1] * 2):
        q, s = nvfp4_group_values(packed[blk], scales[blk])
        y[:, blk] = two_warp_sum(block(x, q, (sg * s).astype(F32), exact))
    return to_bf16(y)


def silu_input(g, u) -> np.ndarray:
    """x_k = (g_k / (1 + expf(-g_k))) * u_k in FP32, not rounded."""
    return (silu_f32(g) * np.asarray(u, F32)).astype(F32)


def w4a16_gemv_silu_input(g, u, packed, scales, global_scale) -> np.ndarray:
    """w4a16_gemv_silu_input_sw: the 8-value walk over x = silu(g) * u (FP32)."""
    return w4a16_gemv(silu_input(g, u), packed, scales, global_scale, walk="vec8")


def w4a16_gemv_segments(x, weights: Sequence[tuple], walk: str = "chunk16") -> list[np.ndarray]:
    """Several weights over one input (seg_*, pipe_*, dual): one output per (packed, scales,
    global_scale) segment, each equal to its own `w4a16_gemv` call."""
    return [w4a16_gemv(x, p, s, g, walk=walk) for p, s, g in weights]


def qg_permutation(heads: int, width: int) -> np.ndarray:
    """pi for the head-interleaved q|gate weight: output row n goes to column pi[n] of [Q | G]."""
    n = np.arange(2 * heads * width)
    h, i = n // (2 * width), n % (2 * width)
    return np.where(i < width, width * h + i, heads * width + width * h + (i - width))


def w4a16_gemv_qg(x, packed, scales, global_scale, heads: int, width: int) -> np.ndarray:
    """w4a16_gemv_qg: 8-value walk, then y^{[Q|G]}_{pi(n)} = y_n."""
    y = w4a16_gemv(x, packed, scales, global_scale, walk="vec8")
    out = np.empty_like(y)
    out[:, qg_permutation(heads, width)] = y
    return out
