"""dense_bf16: BF16 x BF16 projections on CUDA cores (`explain.families.dense_bf16`).

GEMV math (the one-row kernel dense_gemv_bf16; the batched forms repeat it per row):

    y_tn = rn_bf16(P0 + P1),  P_w = sum_{l=32w}^{32w+31} sum_{v = l (mod 64)} sum_{i<8} x_{t,8v+i} W_{n,8v+i}

Order fixed here (the CUDA kernel follows it): thread l of the output's 64 starts acc = +0 and walks
the 8-element vectors v = l, l+64, ... in increasing v, and i = 0..7 inside a vector, doing
acc = acc + x*w as two correctly rounded FP32 operations (no FMA); each warp (threads 0-31, 32-63)
reduces its accumulators with the shuffle tree (`fp32.tree_sum`), and y = P0 + P1, rounded once
to BF16 (skipped for FP32 output). Tiled GEMM: a sequential FP32 sum over k, then rn_bf16.
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.formats import to_bf16
from kbpc.reference.fp32 import seq_sum
from kbpc.reference.gemv_order import lane_layout, row_blocks, two_warp_sum

F32 = np.float32
VEC = 8


def _finish(y: np.ndarray, out_dtype: str) -> np.ndarray:
    if out_dtype == "bf16":
        return to_bf16(y)
    if out_dtype == "f32":
        return y.astype(F32)
    raise ValueError(f"out_dtype must be 'bf16' or 'f32', got {out_dtype!r}")


def dense_gemv_bf16(x, w, out_dtype: str = "bf16") -> np.ndarray:
    """y (m, N) = x (m, K) @ w (N, K)^T in the GEMV order above; K a multiple of 8.

    x and w hold BF16 values as float32 (they are used as given: widening is exact)."""
    x = np.atleast_2d(np.asarray(x, F32))
    w = np.asarray(w, F32)
    m, k = x.shape
    if w.ndim != 2 or w.shape[1] != k:
        raise ValueError(f"weight shape {w.shape} does not match K = {k}")
    if k % VEC:
        raise ValueError(f"dense_gemv_bf16 needs K a multiple of {VEC}, got {k}")
    # (T, 8, m, 64): step t, element i, row, lane -- contiguous slices in the walk below.
    xl = np.ascontiguousarray(lane_layout(x, VEC).transpose(1, 3, 0, 2))
    y = np.empty((m, w.shape[0]), F32)
    for blk in row_blocks(w.shape[0], m * k):
        wl = np.ascontiguousarray(lane_layout(w[blk], VEC).transpose(1, 3, 0, 2))
        acc = np.zeros((m, wl.shape[2], wl.shape[3]), F32)
        for t in range(xl.shape[0]):
            for i in range(VEC):
                acc += xl[t, i][:, None, :] * wl[t, i][None]
        y[:, blk] = two_warp_sum(acc)
    return _finish(y, out_dtype)


def dense_gemm_bf16(x, w, out_dtype: str = "bf16") -> np.ndarray:
    """Tiled GEMM form: y_tn = rn_bf16(sum_k x_tk W_nk), sequential in k from +0."""
    x = np.atleast_2d(np.asarray(x, F32))
    w = np.asarray(w, F32)
    y = np.empty((x.shape[0], w.shape[0]), F32)
    for blk in row_blocks(w.shape[0], x.shape[0] * x.shape[1]):
        prod = (x[:, None, :] * w[blk][None]).astype(F32)
        y[:, blk] = seq_sum(prod, axis=-1, start=F32(0))
    return _finish(y, out_dtype)
