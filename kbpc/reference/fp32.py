"""FP32 arithmetic with a fixed order, for the reference families.

numpy rounds every float32 `+` and `*` correctly, so a formula evaluated op by op in float32 is the
same as a CUDA build without FMA contraction. What numpy does *not* give is a fixed summation order
(`np.sum` is pairwise) or a fused multiply-add; these helpers do:

- `seq_sum(x, axis)`: left-to-right sum along `axis`, starting from the first element.
- `tree_sum(x, axis)`: the warp shuffle tree over a power-of-two axis (offsets n/2, ..., 2, 1);
  the value lane 0 holds after `v += shfl_down(v, off)` (and every lane after the xor butterfly).
- `fma_f32(a, b, c)`: correctly rounded a*b + c, as CUDA's fmaf / __fmaf_rn.
"""
from __future__ import annotations

import numpy as np

F32 = np.float32


def seq_sum(x: np.ndarray, axis: int = -1, start: np.ndarray | float | None = None) -> np.ndarray:
    """Sequential float32 sum along `axis` (x[0] + x[1] + ...), optionally added onto `start`."""
    x = np.moveaxis(np.asarray(x, F32), axis, 0)
    if x.shape[0] == 0:
        return np.zeros(x.shape[1:], F32) if start is None else np.asarray(start, F32)
    acc = x[0].copy() if start is None else (np.asarray(start, F32) + x[0]).astype(F32)
    for i in range(1, x.shape[0]):
        acc = (acc + x[i]).astype(F32)
    return acc


def tree_sum(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Shuffle-tree sum over a power-of-two axis: for off = n/2 .. 1: v[i] += v[i + off]."""
    v = np.moveaxis(np.asarray(x, F32), axis, 0).copy()
    n = v.shape[0]
    if n & (n - 1):
        raise ValueError(f"tree_sum needs a power-of-two length, got {n}")
    off = n // 2
    while off >= 1:
        v = (v[:off] + v[off:2 * off]).astype(F32)
        off //= 2
    return v[0]


def fma_f32(a, b, c) -> np.ndarray:
    """Correctly rounded float32 fused multiply-add.

    a*b is exact in float64 (24+24 significant bits). The float64 sum is made round-to-odd (its
    last bit set when inexact), after which one rounding to float32 is correct: 53 >= 24 + 2."""
    a64 = np.asarray(a, F32).astype(np.float64)
    b64 = np.asarray(b, F32).astype(np.float64)
    c64 = np.asarray(c, F32).astype(np.float64)
    p = a64 * b64
    s = p + c64
    # TwoSum: the exact error of the float64 addition.
    bv = s - p
    err = (p - (s - bv)) + (c64 - bv)
    bits = s.view(np.int64)
    inexact_even = (err != 0) & ((bits & 1) == 0) & np.isfinite(s)
    toward = np.where(err > 0, np.inf, -np.inf)
    s = np.where(inexact_even, np.nextafter(s, toward), s)
    return s.astype(F32)
