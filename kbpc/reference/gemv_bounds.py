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
- w4a16_mma (kernels/w4a16_mma.cuh): n = 8 ceil(ceil(K/128) / KS) MMAs per warp, dealt to
  two accumulators (each code word's first MMA into one, its second into the other: an MMA's error
  is bounded by its own addends, so the chains' errors add up to the one-chain bound), their add,
  KS - 1 ordered FP32 adds of the warp partials, one rounding by s_g (the 2^(7-e) factor is exact):
  c = 36 n + 1 + KS + c_ref. The activation is rounded to FP16 after scaling by 2^e with max|x| 2^e in
  [2^14, 2^15): exact unless |x_k| 2^e < 2^-17, and then off by at most 2^-25 2^-e, which adds
  2^-25 2^-e s_g sum_k |q_nk s_nk| (2^-e = 2^-14 max|x| at most, or 2^-126 when e is clamped).

- w4a4 (kernels/w4a4_mx.cuh, w4a4_gemv / w4a4_gemv_moe_slots): every group term q s^w a s^a is an
  exact integer times an exact FP32 scale product, so both forms sum exact terms whose magnitudes add
  up to S (the dequantized |W x| products before the global scales). The reference folds each of a
  row's P = ceil(ceil(K/128) / 8) chunk sums (exact) into its warp class with one rounding, adds the
  8 classes in order and rounds once more by the scale f32(g_t s_g): c_ref = P + 7 + 1. The fast form
  accumulates a lane's 4P group terms with one FMA each, adds the lane pair, multiplies by 1/4 (exact
  unless the partial is below 2^-124: at most 2^-150 of it is lost, 8 times, times the global
  scale), then the same class sums and scale: c_fast = 4P + 1 + 7 + 1.

The shared-expert pair's fast form (w4a16_mma_shared_pair: gate_up on tensor cores, the SwiGLU row
act_i = silu(min(g_i, L)) * clamp(u_i, -L, L) formed once in FP32 from the BF16-rounded g, u, then
staged as FP16 for the down MMA GEMV) against the reference pair (chunk-walk gate_up to BF16, then
the 8-value-walk down GEMV on the FP32 act row), bounded phase by phase:

- phase 0 is w4a16_mma with KS0: |g_fast - g_ref| <= d_i = b0_i + ulp_bf16((|g_ref| + b0_i)(1 + 2^-6))
  (b0 = w4a16_mma_bound; the ulp term is the two BF16 roundings, |g_fast| being at most that large).
- the act row: |act_fast - act_ref| <= D (1 + r) + 2.01 r |act_ref| + 3 a, with
  D = 1.1 dg^ min(|u^| + du^, L) + |silu(g^)| du^ the change of the real expression (silu is
  1.0999-Lipschitz, |u^| <= L; dg^ <= dg and du^ <= du are how far the monotone clamps let g^ and
  u^ move, zero where clamped throughout), r = 2^-21 the relative error of its FP32 evaluation
  (expf within 2 ulp, three rounded operations: 7u), a = 2^-120 max(1, L) where exp(-g) overflows.
- phase 1 stages act * 2^e (max|act| 2^e in [2^14, 2^15)) as two FP16 parts, hi = f16(h) and
  lo = f16(h - hi) (h - hi is exact in FP32, at most 2^-11 |h| when hi is normal, 2^-25 when it is
  subnormal), each code word's A meeting both in the same accumulator: off by at most
  2^-22 |act| + 2^-25 2^-e, and twice the MMAs, n = 16 ceil(ceil(I/128) / KS1) a warp (FP16 alone,
  2^-11 |act|, set the pair's whole error on random inputs and put the tiny example's fast logits
  at 0.040 relative L2 against the criterion's 1e-2). The down MMA chains have c = 36 n + 1 + KS1 + c_ref8 with c_ref8 =
  9 + 8 ceil(I/512) the reference's 8-value walk (the weight product f32(q f32(s_g s)): 2u; 8 FMAs per
  512-wide vector step of each of 64 lanes; the shuffle tree and two-warp add; second order), so
  |y_fast - y_ref| <= c u sum_k |W_nk| (|act_k| + e_k) + sum_k |W_nk| e_k before the BF16 roundings,
  e_k the act difference plus the FP16 rounding.
The phase-0 term dominates where g, u differ by a BF16 ulp (it is a worst case over every element
at once); on random inputs the fast phase 0 equals the reference's bits almost everywhere, and
with the split staging the rest is accumulation-order error.
"""
from __future__ import annotations

import math

import numpy as np

from kbpc.reference.formats import NVFP4_GROUP, nvfp4_group_values
from kbpc.reference.glm_swiglu_clamp import clamp_gate_up, split_gate_up
from kbpc.reference.w4a16_gemv import silu_input, w4a16_gemv

U = 2.0 ** -24
MMA_STEP = 36          # error of one tensor-core MMA in units of u (|C| + sum |products|)
MMA_CHAINS = 2         # accumulators of kernels/w4a16_mma.cuh's MMAs (w4a16f_chunk: d and e), added at the end
LANES, TREE = 64, 6    # the reference's lane walk: 64 lanes, 5 shuffle levels + the two-warp add
SILU_LIP = 1.1         # max |silu'| = 1.0998 (at 2.3994)
SWIGLU_F32_REL = 2.0 ** -21   # relative error of the FP32 act expression (expf within 2 ulp + 3 roundings)
F16_REL, F16_HALF_SUB = 2.0 ** -11, 2.0 ** -25   # FP16 unit roundoff; half the subnormal spacing
F16_SPLIT_REL = 2.0 ** -22   # hi + lo FP16 parts of an FP32 value (w4a16f_stage_f32)


def w4a16_ref_c(k: int) -> float:
    """c of the reference chunk walk (`kbpc.reference.w4a16_gemv`, walk chunk16)."""
    return 18 + math.ceil(k / (16 * LANES)) + TREE


def w4a16_mma_c(k: int, ks: int) -> float:
    """c of kernels/w4a16_mma.cuh with KS warps splitting K, plus the reference's."""
    mmas = 8 * math.ceil(math.ceil(k / 128) / ks)
    return MMA_STEP * mmas + MMA_CHAINS - 1 + ks + w4a16_ref_c(k)


def w4a16_vec8_ref_c(k: int) -> float:
    """c of the reference 8-value walk (`kbpc.reference.w4a16_gemv`, walk vec8; the silu input)."""
    return 3 + 8 * math.ceil(k / (8 * LANES)) + TREE


def w4a16_mma_act_c(k: int, ks: int) -> float:
    """c of the fast pair's phase 1 (w4a16_mma's chain on the act row staged in hi and lo parts: 16
    MMAs a chunk) plus the vec8 reference's."""
    return MMA_STEP * 16 * math.ceil(math.ceil(k / 128) / ks) + MMA_CHAINS - 1 + ks + w4a16_vec8_ref_c(k)


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


def w4a4_c(k: int) -> float:
    """c of w4a4_gemv's fast form plus the exact reference's (and 1 for the second-order terms)."""
    per = math.ceil(math.ceil(k / 128) / 8)
    return (4 * per + 9) + (per + 8) + 1


def w4a4_fast_bound(a_packed, a_scales, a_global, w_packed, w_scales, w_global) -> np.ndarray:
    """(N,) bound on |y_fast - y_ref| before the BF16 roundings of w4a4_gemv's fast form on one
    quantized activation row (codes, scales, global scale) and an NVFP4 weight (N, K)."""
    aq, asc = nvfp4_group_values(np.asarray(a_packed, np.uint8), np.asarray(a_scales, np.uint8))
    xabs = np.abs(aq.astype(np.float64) * np.repeat(asc.astype(np.float64), NVFP4_GROUP, axis=-1)).reshape(-1)
    scale = abs(float(a_global) * float(w_global))
    wabs = _nvfp4_abs(w_packed, w_scales, 1.0)
    return w4a4_c(xabs.size) * U * scale * (wabs @ xabs) + 2.0 ** -146 * scale


def bf16_pair_delta(want, bound) -> np.ndarray:
    """Bound on |got - want| for BF16 results whose pre-rounding values are within `bound`: bound
    plus one BF16 ulp of the larger magnitude, which is at most (|want| + bound)(1 + 2^-6)."""
    want, bound = np.abs(np.asarray(want, np.float64)), np.asarray(bound, np.float64)
    return bound + bf16_ulp((want + bound) * (1.0 + 2.0 ** -6))


def _silu64(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return v / (1.0 + np.exp(-v))


def swiglu_act_delta(g, u, dg, du, limit: float) -> np.ndarray:
    """Bound on |act(g', u') - act_ref(g, u)| over |g' - g| <= dg, |u' - u| <= du, both sides the
    FP32 expression silu(min(g, L)) * clamp(u, -L, L) of glm_swiglu_clamp (g, u the reference's
    BF16 gate and up values)."""
    g, u = np.asarray(g, np.float64), np.asarray(u, np.float64)
    dg, du, lim = np.asarray(dg, np.float64), np.asarray(du, np.float64), float(limit)
    gh, uh = np.minimum(g, lim), np.clip(u, -lim, lim)
    # how far the clamped values can move (the clamps are monotone: zero where clamped throughout)
    dgh = np.maximum(np.minimum(g + dg, lim) - gh, gh - np.minimum(g - dg, lim))
    duh = np.maximum(np.clip(u + du, -lim, lim) - uh, uh - np.clip(u - du, -lim, lim))
    s = np.abs(_silu64(gh))
    d = SILU_LIP * dgh * np.minimum(np.abs(uh) + duh, lim) + s * duh
    a = 2.0 ** -120 * max(1.0, lim)
    return d * (1 + SWIGLU_F32_REL) + 2.01 * SWIGLU_F32_REL * s * np.abs(uh) + 3 * a


def w4a16_mma_act_bound(act, dact, packed, scales, global_scale, ks: int) -> np.ndarray:
    """(N,) bound on |y_fast - y_ref| before the BF16 roundings for the fast pair's phase 1: the down
    MMA GEMV on an FP32 row within `dact` of the reference's act row (the vec8 walk's input)."""
    act = np.abs(np.asarray(act, np.float64).reshape(-1))
    dact = np.broadcast_to(np.asarray(dact, np.float64), act.shape)
    hi = act + dact                                        # |act_fast| at most
    inv_scale = max(float(hi.max(initial=0.0)) * 2.0 ** -14, 2.0 ** -126)   # 2^-e, at most
    err = dact + F16_SPLIT_REL * hi + F16_HALF_SUB * inv_scale   # act difference + the split FP16 staging
    wabs = _nvfp4_abs(packed, scales, global_scale)
    return w4a16_mma_act_c(act.size, ks) * U * (wabs @ (hi + err)) + wabs @ err


def shared_pair_fast_bound(x, gate_up, down, limit: float, ks0: int, ks1: int) -> np.ndarray:
    """(N,) bound on |y_fast - y_ref| before the BF16 roundings of the fast shared-expert pair on
    input x, gate_up and down each (packed, scales, global_scale); y_ref is the reference pair
    (w4a16_gemv, clamp_gate_up, w4a16_gemv_silu_input)."""
    gu = w4a16_gemv(x, *gate_up)[0]
    d = bf16_pair_delta(gu, w4a16_mma_bound(x, *gate_up, ks0))
    (g, u), (dg, du) = split_gate_up(gu), np.split(d, 2)
    act = silu_input(*split_gate_up(clamp_gate_up(gu, limit)))
    return w4a16_mma_act_bound(act, swiglu_act_delta(g, u, dg, du, limit), *down, ks1)


def bf16_ulp(v) -> np.ndarray:
    """One BF16 ulp at |v| (the spacing of the binade holding v; the subnormal spacing below)."""
    a = np.abs(np.asarray(v, np.float64))
    e = np.floor(np.log2(np.maximum(a, 2.0 ** -126)))
    return 2.0 ** (e - 7)


def within(got, want, bound) -> np.ndarray:
    """Elementwise: |got - want| <= bound + one BF16 ulp of the larger magnitude (NaN fails)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.abs(got - want) <= np.asarray(bound, np.float64) + bf16_ulp(np.maximum(np.abs(got), np.abs(want)))
