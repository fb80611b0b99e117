"""Error bounds of the `fast` GEMV forms against the reference (numerics `fast`, DESIGN.md).

A fast form may change the accumulation order and precision point of a projection; its contract is

    |y_fast - y_ref| <= c * u * S_n + ulp_bf16(max(|y_fast|, |y_ref|)),   S_n = sum_k |W_nk x_k|

(u = 2^-24 the FP32 unit roundoff, W the dequantized weight the reference multiplies): both
results are within c_* u S of the exact dot product before their one BF16 rounding, and two roundings
to nearest move them apart by at most one BF16 ulp of the larger magnitude. Each c is derived from the
chain lengths of the two computations (recursive summation: a chain of n correctly rounded
operations whose partial sums are bounded by S errs by at most n u S):

- reference w4a16 chunk walk: 16 FMAs per chunk, the FP32 scale product f32(s_g s_nj), ceil(K / 1024)
  FMAs per lane accumulator (64 lanes, chunks j = l, l+64, ...), 5 shuffle-tree levels and the
  two-warp add: c_ref = 17 + ceil(K/1024) + 6, plus 1 for the second-order terms.
- tensor-core MMA (m16n8k16, FP16 inputs, FP32 accumulate): products are exact; the PTX ISA leaves
  the summation order and rounding inside the instruction unspecified. Measured tensor cores align the
  17 addends (C and 16 products) to the largest exponent, keep at least 24 bits and truncate, so one
  MMA errs by less than 17 * 2u * max|addend| + 2u |result| <= 36 u (|C| + sum |p|) (truncation costs
  2u where rounding costs u); a chain of n MMAs into one accumulator errs by at most 36 n u S.
- w4a16_mma (kernels/w4a16_mma.cuh): n = 8 ceil(ceil(K/128) / KS) MMAs per warp, KS - 1 ordered
  FP32 adds of the warp partials, one rounding by s_g (the 2^(7-e) factor is exact):
  c = 36 n + KS + c_ref. The activation is rounded to FP16 after scaling by 2^e with max|x| 2^e in
  [2^14, 2^15): exact unless |x_k| 2^e < 2^-17, and then off by at most 2^-25 2^-e, which adds
  2^-25 2^-e s_g sum_k |q_nk s_nk| (2^-e = 2^-14 max|x| at most, or 2^-126 when e is clamped).
"""
from __future__ import annotations

import math

import numpy as np

from kbpc.reference.formats import NVFP4_GROUP, nvfp4_group_values

U = 2.0 ** -24
MMA_STEP = 36          # error of one tensor-core MMA in units of u (|C| + sum |products|)
LANES, TREE = 64, 6    # the reference's lane walk: 64 lanes, 5 shuffle levels + the two-warp add


def w4a16_ref_c(k: int) -> float:
    """c of the reference chunk walk (`kbpc.reference.w4a16_gemv`, walk chunk16)."""
    return 18 + math.ceil(k / (16 * LANES)) + TREE


def w4a16_mma_c(k: int, ks: int) -> float:
    """c of kernels/w4a16_mma.cuh with KS warps splitting K, plus the reference's."""
    mmas = 8 * math.ceil(math.ceil(k / 128) / ks)
    return MMA_STEP * mmas + ks + w4a16_ref_c(k)


def _nvfp4_abs(packed, scales, global_scale) -> np.ndarray:
    q, s = nvfp4_group_values(np.asarray(packed, np.uint8), np.asarray(scales, np.uint8))
    return np.abs(q.astype(np.float64) * np.repeat(s.astype(np.float64), NVFP4_GROUP, axis=-1)) * abs(float(global_scale))


def w4a16_mma_bound(x, packed, scales, global_scale, ks: int) -> np.ndarray:
    """(N,) bound on |y_mma - y_ref| before the BF16 roundings (add `bf16_ulp` of the outputs)."""
    x = np.asarray(x, np.float64).reshape(-1)
    wabs = _nvfp4_abs(packed, scales, global_scale)
    amax = float(np.max(np.abs(x))) if x.size else 0.0
    inv_scale = max(amax * 2.0 ** -14, 2.0 ** -126)   # 2^-e, at most
    return w4a16_mma_c(x.size, ks) * U * (wabs @ np.abs(x)) + 2.0 ** -25 * inv_scale * wabs.sum(axis=-1)


def bf16_ulp(v) -> np.ndarray:
    """One BF16 ulp at |v| (the spacing of the binade holding v; the subnormal spacing below)."""
    a = np.abs(np.asarray(v, np.float64))
    e = np.floor(np.log2(np.maximum(a, 2.0 ** -126)))
    return 2.0 ** (e - 7)


def within(got, want, bound) -> np.ndarray:
    """Elementwise: |got - want| <= bound + one BF16 ulp of the larger magnitude (NaN fails)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.abs(got - want) <= np.asarray(bound, np.float64) + bf16_ulp(np.maximum(np.abs(got), np.abs(want)))
