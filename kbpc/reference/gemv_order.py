"""Fixed GEMV accumulation orders shared by the projection families (dense_bf16, w4a16_gemv,
w4a4_mx, w4a4_mx_static, wxay, kda_gates_w8a8).

- Lane walks: 64 threads per output (two warps); thread l owns items l, l+64, ... of a walk axis
  (8-element vectors or 16-value chunks), visited in increasing order. `lane_layout` pads the walk
  axis to a multiple of 64 with zero items: a zero item adds +0 to an accumulator that started at
  +0, which changes nothing (an FP32 sum is never -0 unless every term is -0, and the products here
  start from +0). `two_warp_sum` is the shuffle tree of each warp, then P0 + P1.
- Warp chunk chains: warp w (0..7) owns the 128-wide K chunks c = w (mod 8) in increasing order.
  Chunk sums arrive exact in float64 and are folded into the warp's FP32 accumulator with one
  rounding each (`add_f32`); the eight warp partials are then added left to right in warp order.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from kbpc.reference.fp32 import fma_f32, seq_sum, tree_sum

F32 = np.float32
LANES = 64
WARP = 32
CHUNK = 128
WARPS = 8
# Elements per block of outputs processed at once: bounds the temporaries (~16 MB of float32).
BLOCK_ELEMS = 1 << 22


def row_blocks(n: int, per_row: int, budget: int = BLOCK_ELEMS) -> Iterator[slice]:
    """Slices of range(n) whose rows hold about `budget` elements in all."""
    step = max(1, budget // max(1, per_row))
    for lo in range(0, n, step):
        yield slice(lo, min(n, lo + step))


def lane_layout(a: np.ndarray, item: int) -> np.ndarray:
    """(..., K) -> (..., T, 64, item): item v = t*64 + l, zero-padded to whole steps."""
    k = a.shape[-1]
    if k % item:
        raise ValueError(f"length {k} is not a multiple of the walk item {item}")
    items = k // item
    steps = -(-items // LANES)
    pad = steps * LANES * item - k
    if pad:
        a = np.concatenate([a, np.zeros(a.shape[:-1] + (pad,), a.dtype)], axis=-1)
    return a.reshape(a.shape[:-1] + (steps, LANES, item))


def two_warp_sum(acc: np.ndarray) -> np.ndarray:
    """(..., 64) per-thread partials -> P0 + P1, each warp reduced by `tree_sum`."""
    p = tree_sum(acc.reshape(acc.shape[:-1] + (2, WARP)), axis=-1)
    return (p[..., 0] + p[..., 1]).astype(F32)


def add_f32(acc: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Correctly rounded float32 of acc + s, acc float32 and s an exact float64 value.

    The float64 sum is made round-to-odd with TwoSum (its last bit set when inexact), after which
    one rounding to float32 is correct (53 >= 24 + 2), as in `fp32.fma_f32`."""
    a = np.asarray(acc, F32).astype(np.float64)
    b = np.asarray(s, np.float64)
    t = a + b
    bv = t - a
    err = (a - (t - bv)) + (b - bv)
    inexact_even = (err != 0) & ((t.view(np.int64) & 1) == 0) & np.isfinite(t)
    t = np.where(inexact_even, np.nextafter(t, np.where(err > 0, np.inf, -np.inf)), t)
    return t.astype(F32)


def fma_f32_fast(a, b, c) -> np.ndarray:
    """`fp32.fma_f32` with a cheap common path: a*b is exact in float64, and rounding the float64
    sum once more to float32 is correct unless that sum sits exactly on a float32 rounding
    midpoint (or in the float32 subnormal range); only those elements take the exact path. (A
    float32 midpoint is a float64 value, so none can lie strictly between the exact sum and its
    float64 rounding.)"""
    a64 = np.asarray(a, F32).astype(np.float64)
    b64 = np.asarray(b, F32).astype(np.float64)
    c32 = np.asarray(c, F32)
    s = a64 * b64 + c32
    bits = s.view(np.int64) & ((1 << 29) - 1)
    # an exact zero is exact in float64 too (a*b >= 2^-298 when nonzero), with IEEE's sign
    risky = (bits == (1 << 28)) | ((np.abs(s) < 2.0 ** -125) & (s != 0))
    out = s.astype(F32)
    if risky.any():
        a_b, b_b, c_b = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32), c32)
        out[risky] = fma_f32(a_b[risky], b_b[risky], c_b[risky])
    return out


def check_chunks(k: int) -> None:
    if k % CHUNK:
        raise ValueError(f"K = {k} is not a multiple of the {CHUNK}-wide MMA chunk")


def chunk_sums_exact(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """S[t, n, c] = sum_{k in chunk c} a[t, k] * w[n, k], exact.

    a (m, K) and w (N, K) hold float64 values whose products and 128-term sums fit in 53 bits (the
    caller proves it for its format); every partial sum is then exact, so the BLAS order is moot."""
    m, k = a.shape
    c = k // CHUNK
    at = a.reshape(m, c, CHUNK).transpose(1, 0, 2)
    wt = w.reshape(w.shape[0], c, CHUNK).transpose(1, 2, 0)
    return np.matmul(at, wt).transpose(1, 2, 0)


def warp_chunk_chain(s: np.ndarray, fold=None) -> np.ndarray:
    """(..., C) chunk values -> sum over warps (warp order) of each warp's chunk chain.

    fold(acc, chunk_index_array, values) returns the new accumulators; default add_f32."""
    fold = fold or (lambda acc, _c, v: add_f32(acc, v))
    c = s.shape[-1]
    acc = np.zeros(s.shape[:-1] + (WARPS,), F32)
    for lo in range(0, c, WARPS):
        hi = min(c, lo + WARPS)
        acc[..., : hi - lo] = fold(acc[..., : hi - lo], np.arange(lo, hi), s[..., lo:hi])
    return seq_sum(acc, axis=-1)
