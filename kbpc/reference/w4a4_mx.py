"""w4a4_mx: W4A4 GEMV with dynamic per-row NVFP4 activations (`explain.families.w4a4_mx`).

Activation quantization (w4a4_quant_rows) is `formats.quantize_nvfp4_rows`, in the numerics
text's order:  g_t = f32(max|x_t| / 2688) (1 for an all-zero row);  s^a = sat_e4m3(f32(max_16|x|/6)
* f32(1/g_t));  a = rn_e2m1(x / f32(s^a g_t)), zero when s^a = 0.

Product:
    y_tn = rn_bf16( [ sum_{w<8} sum_{c = w (mod 8)} sum_{k in chunk c} (q_nk s^w_n,k/16)(a_tk s^a_t,k/16) ] * (g_t s_g) )

Order chosen where the math leaves one: each 128-wide chunk's sum S_c is taken exactly (the MMA's
block-scaled products are exact and we take its internal sum as exact: q s^w and a s^a are
multiples of 2^-10 below 2688, so every product is a multiple of 2^-20 below 2^23 and any partial
sum of 128 of them is below 2^30: 50 bits, exact in float64 in any order). Warp w folds its chunks
c = w, w+8, ... in increasing order into an FP32 accumulator from +0 with one rounding each
(acc = f32(acc + S_c)); the 8 warp partials are added left to right in warp order; the scale
f32(g_t * s_g) is formed in FP32 and the product f32(P * scale) is rounded once to BF16.
K must be a multiple of 128 (ValueError otherwise; the _k64 static twins pad rows instead).

Routed slots (`w4a4_moe_slots`): slot r runs the same GEMV with expert ids[r]'s weights; a slot
with id -1 (no expert: padding of a fixed-size slot table) produces zeros (+0.0 BF16) -- a choice
the math does not make; kernels must write those zeros, not leave the output untouched.
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.formats import nvfp4_group_values, quantize_nvfp4_rows, to_bf16
from kbpc.reference.gemv_order import (
    CHUNK, check_chunks, chunk_sums_exact, row_blocks, warp_chunk_chain,
)

F32 = np.float32

quantize_rows = quantize_nvfp4_rows


def _scaled_values(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """E2M1 value times its decoded E4M3 group scale, exact in float64, shape (..., K)."""
    q, s = nvfp4_group_values(packed, scales)
    return (q.reshape(s.shape + (16,)).astype(np.float64) * s[..., None]).reshape(q.shape)


def w4a4_gemv(a_packed, a_scales, a_global, w_packed, w_scales, w_global) -> np.ndarray:
    """y (m, N) BF16 values from NVFP4 activations (a_packed (m, K/2), a_scales (m, K/16),
    a_global g_t (m,)) and an NVFP4 weight (w_packed (N, K/2), w_scales (N, K/16), w_global s_g)."""
    a_packed = np.atleast_2d(np.asarray(a_packed, np.uint8))
    a_scales = np.atleast_2d(np.asarray(a_scales, np.uint8))
    w_packed, w_scales = np.asarray(w_packed, np.uint8), np.asarray(w_scales, np.uint8)
    k = a_packed.shape[-1] * 2
    check_chunks(k)
    if w_packed.shape[-1] * 2 != k or w_scales.shape[-1] * 16 != k:
        raise ValueError(f"weight {w_packed.shape} does not match K = {k}")
    av = _scaled_values(a_packed, a_scales)
    g = np.broadcast_to(np.asarray(a_global, F32), (av.shape[0],))
    scale = (g[:, None] * F32(w_global)).astype(F32)             # f32(g_t * s_g), (m, 1)
    y = np.empty((av.shape[0], w_packed.shape[0]), F32)
    for blk in row_blocks(w_packed.shape[0], max(k, av.shape[0] * k // CHUNK)):
        s = chunk_sums_exact(av, _scaled_values(w_packed[blk], w_scales[blk]))
        y[:, blk] = (warp_chunk_chain(s) * scale).astype(F32)
    return to_bf16(y)


def w4a4_mx(x, w_packed, w_scales, w_global) -> np.ndarray:
    """Quantize BF16 rows x (m, K) per row, then `w4a4_gemv`."""
    return w4a4_gemv(*quantize_nvfp4_rows(x), w_packed, w_scales, w_global)


def w4a4_moe_slots(a_packed, a_scales, a_global, w_packed, w_scales, w_global, ids) -> np.ndarray:
    """Routed-expert slot GEMV: y[r] = w4a4_gemv(activation of r, expert ids[r]) for every slot.

    ids: int array of any shape S; expert weights stacked (E, N, K/2), (E, N, K/16), (E,).
    Activations either one per slot (shape S + (K/2,)) or one per token shared by its slots
    (shape S[:-1] + (K/2,)). Returns S + (N,); slots with id -1 are +0."""
    ids = np.asarray(ids, np.int64)
    a_packed, a_scales = np.asarray(a_packed, np.uint8), np.asarray(a_scales, np.uint8)
    a_global = np.asarray(a_global, F32)
    if a_packed.ndim == ids.ndim:                      # one activation row per token
        a_packed = np.broadcast_to(a_packed[..., None, :], ids.shape + a_packed.shape[-1:])
        a_scales = np.broadcast_to(a_scales[..., None, :], ids.shape + a_scales.shape[-1:])
        a_global = np.broadcast_to(a_global[..., None], ids.shape)
    a_global = np.broadcast_to(a_global, ids.shape)
    w_packed, w_scales = np.asarray(w_packed, np.uint8), np.asarray(w_scales, np.uint8)
    w_global = np.asarray(w_global, F32).reshape(-1)
    if ids.size and (ids.max() >= w_packed.shape[0] or ids.min() < -1):
        raise ValueError(f"expert ids must lie in [-1, {w_packed.shape[0]}), got {ids}")
    flat = ids.reshape(-1)
    ap = a_packed.reshape(-1, a_packed.shape[-1])
    asc = a_scales.reshape(-1, a_scales.shape[-1])
    ag = a_global.reshape(-1)
    y = np.zeros((flat.size, w_packed.shape[1]), F32)
    for e in np.unique(flat[flat >= 0]):               # rows sharing an expert run together
        r = np.flatnonzero(flat == e)
        y[r] = w4a4_gemv(ap[r], asc[r], ag[r], w_packed[e], w_scales[e], w_global[e])
    return y.reshape(ids.shape + (w_packed.shape[1],))
