"""wxay: FP8 E4M3 W8A8 skinny tensor-core GEMV (`explain.families.wxay`).

    S_c,tn = sum_{k in chunk c} e4m3(A_tk) e4m3(W_nk)                      (128-wide chunks)
    rowscale: y_tn = rn_bf16( [ sum_{w<8} sum_{c = w (mod 8)} S_c,tn ] * (w_n a_t) )
    blk128:   y_tn = rn_bf16( sum_{w<8} sum_{c = w (mod 8)} S_c,tn * (w_{n/128,c} a_t,c) )

Orders chosen where the math leaves one:
- S_c is exact: E4M3 values are multiples of 2^-9 below 448, so products are multiples of 2^-18
  below 2^18 and any partial sum of 128 is below 2^25 (43 bits, exact in float64 in any order).
- rowscale: warp w folds chunks c = w, w+8, ... in increasing order into an FP32 accumulator from
  +0 with one rounding each (acc = f32(acc + S_c)); the 8 partials are added in warp order; then
  f32(P * f32(w_n * a_t)), rn_bf16.
- blk128: the MMA's chunk sum is an FP32 value f32(S_c) (accumulated from zero in the MMA), folded
  as acc = fma(f32(S_c), f32(w_{n/128,c} * a_t,c), acc); warp order; rn_bf16.
K must be a multiple of 128 (ValueError). A row's result never depends on the other rows.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kbpc.reference.formats import e4m3_decode, to_bf16
from kbpc.reference.gemv_order import (
    CHUNK, check_chunks, chunk_sums_exact, fma_f32_fast, row_blocks, warp_chunk_chain,
)

F32 = np.float32


def _operands(a_codes, w_codes) -> tuple[np.ndarray, np.ndarray]:
    a = np.atleast_2d(np.asarray(a_codes, np.uint8))
    w = np.asarray(w_codes, np.uint8)
    check_chunks(a.shape[-1])
    if w.ndim != 2 or w.shape[1] != a.shape[-1]:
        raise ValueError(f"weight {w.shape} does not match K = {a.shape[-1]}")
    return a, w


def wxay_rowscale(a_codes, a_scales, w_codes, w_scales) -> np.ndarray:
    """Rowscale policy: a_codes (m, K) E4M3 with a_scales (m,) per token, w_codes (N, K) E4M3
    with w_scales (N,) per output channel. Returns (m, N) BF16 values."""
    a, w = _operands(a_codes, w_codes)
    av = e4m3_decode(a).astype(np.float64)
    sa = np.broadcast_to(np.asarray(a_scales, F32).reshape(-1), (a.shape[0],))
    sw = np.asarray(w_scales, F32).reshape(-1)
    y = np.empty((a.shape[0], w.shape[0]), F32)
    for blk in row_blocks(w.shape[0], a.shape[1]):
        s = chunk_sums_exact(av, e4m3_decode(w[blk]).astype(np.float64))
        scale = (sw[blk][None, :] * sa[:, None]).astype(F32)
        y[:, blk] = (warp_chunk_chain(s) * scale).astype(F32)
    return to_bf16(y)


def wxay_blk128(a_codes, a_scales, w_codes, w_scales) -> np.ndarray:
    """Blk128 policy: a_scales (m, K/128) per 128-group, w_scales (ceil(N/128), K/128) per
    128 x 128 weight block. Returns (m, N) BF16 values."""
    a, w = _operands(a_codes, w_codes)
    av = e4m3_decode(a).astype(np.float64)
    sa = np.asarray(a_scales, F32).reshape(a.shape[0], -1)
    sw = np.asarray(w_scales, F32)
    c = a.shape[1] // CHUNK
    if sa.shape[1] != c or sw.shape != (-(-w.shape[0] // CHUNK), c):
        raise ValueError(f"blk128 scales {sa.shape} / {sw.shape} do not match {w.shape}")
    y = np.empty((a.shape[0], w.shape[0]), F32)
    for blk in row_blocks(w.shape[0], a.shape[1]):
        s = chunk_sums_exact(av, e4m3_decode(w[blk]).astype(np.float64)).astype(F32)
        rows = np.arange(w.shape[0])[blk] // CHUNK
        # (m, n, C): f32(w_{n/128,c} * a_{t,c})
        sc = (sw[rows][None, :, :] * sa[:, None, :]).astype(F32)

        def fold(acc, cs, v, sc=sc):
            return fma_f32_fast(v, sc[..., cs], acc)

        y[:, blk] = warp_chunk_chain(s, fold)
    return to_bf16(y)


def wxay_split(a_codes, a_scales, weights: Sequence[tuple], policy: str = "rowscale"):
    """split4 / stacked segments: several projections of one input, one output each, every one
    equal to its own call. weights: (w_codes, w_scales) pairs."""
    fn = {"rowscale": wxay_rowscale, "blk128": wxay_blk128}[policy]
    return [fn(a_codes, a_scales, wc, ws) for wc, ws in weights]
