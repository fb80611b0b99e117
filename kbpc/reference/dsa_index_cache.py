"""dsa_indexer's FP8 pool-key cache (explain.families.dsa_indexer, third math line): each completed
pool key is stored Walsh-Hadamard rotated in E4M3 with one power-of-two scale per pool, and read
back through the inverse rotation.

    y = FWHT_D(kbar),  sigma = 2^e,  yhat = sat_e4m3(y / sigma),  ktilde = FWHT_D(sigma yhat) / D

Order and rounding choices (FP32 op by op, shared with kernels/dsa_indexer.cuh):
- FWHT_D (D a power of two, unnormalised, so FWHT(FWHT(x)) = D x): stages h = 1, 2, 4, ..., D/2
  in that order; in stage h every pair (i, i + h) with bit h of i clear becomes
  (fl(x_i + x_{i+h}), fl(x_i - x_{i+h})).
- e is the smallest integer with max_c |y_c| <= 448 * 2^e in exact arithmetic (the explain's
  ceil(log2(max|y| / 448)) without the rounding of the quotient), clamped to [-126, 127]; an
  all-zero key gets e = -126. From frexp: max|y| = f 2^E, f in [0.5, 1): e = E - 9 if f <= 0.875
  (448 = 0.875 * 2^9), else E - 8. So |y / sigma| <= 448 and the saturation never engages.
- y / sigma and sigma * yhat are exact (powers of two, finite normal sigma); the E4M3 rounding
  is RNE; the read back divides the FP32 FWHT by D (exact).
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.formats import e4m3_decode, e4m3_encode

F32 = np.float32
E4M3_MAX_FRACTION = 0.875       # 448 = 0.875 * 2^9
EXP_MIN, EXP_MAX = -126, 127


def fwht(x) -> np.ndarray:
    """Unnormalised fast Walsh-Hadamard transform over the last axis, in the stage order above."""
    y = np.asarray(x, F32).copy()
    n = y.shape[-1]
    if n & (n - 1):
        raise ValueError(f"the Walsh-Hadamard rotation needs a power-of-two width, got {n}")
    lead = y.shape[:-1]
    h = 1
    while h < n:
        pairs = y.reshape(lead + (n // (2 * h), 2, h))
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = np.stack([(a + b).astype(F32), (a - b).astype(F32)], axis=-2).reshape(lead + (n,))
        h *= 2
    return y


def hadamard(n: int) -> np.ndarray:
    """The unnormalised Walsh-Hadamard matrix of order n (Sylvester), float64: fwht(x) = x H = H x."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def scale_exponent(max_abs) -> np.ndarray:
    """e (int32) per key: the smallest integer with max_abs <= 448 * 2^e, clamped."""
    m = np.asarray(max_abs, F32)
    frac, exp = np.frexp(m)
    e = np.where(frac <= F32(E4M3_MAX_FRACTION), exp - 9, exp - 8)
    e = np.where(m == 0, EXP_MIN, e)
    return np.clip(e, EXP_MIN, EXP_MAX).astype(np.int32)


def quantize_pool_keys(kbar) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint8 [..., D], sigma float32 [...]) of FP32 pool keys [..., D]."""
    y = fwht(kbar)
    sigma = np.ldexp(F32(1), scale_exponent(np.max(np.abs(y), axis=-1))).astype(F32)
    return e4m3_encode((y / sigma[..., None]).astype(F32)), sigma


def dequantize_pool_keys(codes, sigma) -> np.ndarray:
    """ktilde = FWHT(sigma * yhat) / D, FP32 [..., D]."""
    codes = np.asarray(codes, np.uint8)
    x = (e4m3_decode(codes) * np.asarray(sigma, F32)[..., None]).astype(F32)
    return (fwht(x) / F32(codes.shape[-1])).astype(F32)
