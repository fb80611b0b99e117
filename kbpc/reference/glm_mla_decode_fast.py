"""The `fast` form of glm_mla_decode (kernels/glm_mla_decode_fast.cuh): its split of the selection
and its error bound against the reference order (kbpc.reference.glm_mla_decode.mla_decode).

Split: S slices x H/HPC head groups x rows CTAs; slice s takes entries s, s + S, ... `chunk` at a
time (the rows staged per round trip); once a head group's S CTAs have published their partials,
each merges a share of the group's outputs, the S partials in slice order. S fills the target's SMs
once (a single wave) but gives no slice fewer than MIN_SLICE entries, since each slice adds a
partial the merge reads.

Bound. Let v*_j = s_k c^_j (exact), z*_j = sigma <q, v*_j> with sigma = fl(1/sqrtf(E)) (both forms
use that constant), w_j = softmax(z*)_j over the valid entries (duplicates counted twice),
A_c = sum_j w_j |v*_jc| and out*_c = sum_j w_j v*_jc. Both computations X (reference, fast) satisfy

    |out_X,c - out*_c| <= (e^{2 D_X} - 1) A_c + e^{2 D_X} 1.01 u ((K_X + d) A_c + sum_j w_j d_j |v*_jc|)

before their one BF16 rounding, u = 2^-24, where
- D_X bounds every |z_X,j - z*_j| <= (E/32 + 8) u sigma sum_c |q_c v*_jc| (1.01): both forms
  round v or d s_k once, the E/32 products of a lane chain, the 5 butterfly levels and the scaling;
  a perturbation of the scores by at most D moves every softmax weight by a factor in e^{+-2D};
- K_X counts the rounded operations on any token's path into o and into l (recursive summation
  errs by at most n u times the sum of the magnitudes): the reference's warp chain of n_w tokens
  costs 3 per later token (the rescale factor's exp, its product, the add) plus the product, the
  value rounding, p's exp and 3 per merge level, and the division; the fast form's chunk chain of
  its NC rows (one FMA each), 2-3 per later chunk, the slice merge (factor, product, S adds), s_k
  and the division;
- d_j = M* - z*_j + 2 D (D = D_ref + D_fast) and d = sum_j w_j d_j: the exponentials' arguments
  along a token's path (z_j - m, m - m', ..., m_s - M) are rounded subtractions that telescope to
  M - z_j, so exp of the rounded arguments is off by at most u (M - z_j) relatively;
- plus n 2^-140 (1 + 448 s_k) for subnormal p and products (p <= 1, l >= 1).
fast_bound is the sum of the two sides; with two BF16 roundings on top (gemv_bounds.within).
On the seed's sizes the bound is ~1e-4 of A_c: the outputs agree to BF16 rounding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kbpc.reference.formats import e4m3_decode
from kbpc.reference.glm_mla_decode import ORDER_GROUP, ORDER_WARPS, heads_per_cta

F32 = np.float32
U = 2.0 ** -24
FAST_THREADS = 256             # MLA_FAST_THREADS: one thread per entry when a chunk is compacted
MIN_SLICE = 16                 # entries below which another slice costs more (its partial) than it saves
STAGE_BYTES = 96 * 1024        # latent rows a CTA stages at once (dynamic shared memory)
PARTIAL_PAD = 4                # floats per (slice, head) partial beyond o: m, l and 2 pad (16-byte rows)


@dataclass(frozen=True)
class FastSplit:
    hpc: int       # heads per CTA
    slices: int    # S, CTAs per head group and row
    chunk: int     # entries a CTA stages per round trip

    def grid(self, heads: int, rows: int) -> tuple[int, int, int]:
        return (self.slices, heads // self.hpc, rows)

    def share(self, latent: int) -> int:
        """mla_fast_share: outputs of its head group each CTA merges (a multiple of 8)."""
        return (-(-self.hpc * latent // self.slices) + 7) // 8 * 8

    def smem_bytes(self, latent: int) -> int:
        """mla_fast_smem_bytes: rows, z/p per row and head, row ids, the merge's factors and products,
        the CTA's merged outputs (BF16)."""
        return self.chunk * (latent + 4 * self.hpc + 4) + 8 * self.hpc * self.slices + 2 * self.share(latent)


def fast_split(heads: int, width: int, rows: int, sms: int, latent: int) -> FastSplit:
    """The fast form's CTA split for `width` selection entries per row on a GPU of `sms` SMs."""
    hpc = heads_per_cta(heads)
    groups = heads // hpc
    slices = max(1, min(sms // (groups * rows), width // MIN_SLICE))
    entries = -(-width // slices)
    chunk = max(1, min(entries, FAST_THREADS, STAGE_BYTES // latent))
    return FastSplit(hpc, slices, chunk)


def reference_k(width: int, warps: int = ORDER_WARPS, group: int = ORDER_GROUP) -> float:
    """K of the reference order: rounded operations on a token's path into o plus into l."""
    groups = -(-width // group)
    n_w = group * -(-groups // warps)                         # most entries any warp walks
    levels = int(math.log2(warps))
    return (3 * n_w + 3 * levels + 4) + (3 * n_w + 3 * levels + 1)


def fast_k(width: int, slices: int, chunk: int) -> float:
    """K of the fast form (kernels/glm_mla_decode_fast.cuh) for this split."""
    entries = -(-width // slices)
    chunks, nc = -(-entries // chunk), min(chunk, entries)
    k_o = nc + 2 * chunks + slices + 4
    k_l = -(-nc // 32) + 6 + 3 * chunks + slices + 2
    return k_o + k_l + 1


def fast_bound(q, cache_rows, selection, seq_len: int, s_k: float, slices: int, chunk: int) -> np.ndarray:
    """(H, E) bound on |out_fast - out_ref| before the two BF16 roundings, for one row (arguments
    as mla_decode's, plus the fast form's split)."""
    q = np.asarray(q, F32).astype(np.float64)
    heads, e = q.shape
    sel = np.asarray(selection, np.int64)
    valid = (sel >= 0) & (sel < seq_len)
    if not valid.any():
        return np.zeros((heads, e))
    sk = float(F32(s_k))
    v = e4m3_decode(cache_rows(sel[valid])).astype(np.float64) * sk           # (n, E) exact
    sigma = float((F32(1) / np.sqrt(F32(e))).astype(F32))
    z = (q @ v.T) * sigma                                                       # (H, n)
    dz = (e / 32 + 8) * 1.01 * U * sigma * (np.abs(q) @ np.abs(v).T)           # per side
    d_side = dz.max(axis=1)                                                     # (H,) D_X, each side
    top = z.max(axis=1, keepdims=True)
    w = np.exp(z - top)
    w /= w.sum(axis=1, keepdims=True)
    dist = (top - z) + 4 * d_side[:, None]                                      # d_j, widened by 2 D
    spread = (w * dist).sum(axis=1)                                             # d
    a, a_dist = w @ np.abs(v), (w * dist) @ np.abs(v)                           # A_c, sum_j w_j d_j |v*_jc|
    grow = np.exp(2 * d_side)[:, None]
    k = reference_k(sel.size) + fast_k(sel.size, slices, chunk)
    bound = (2 * (grow - 1) * a + grow * 1.01 * U * ((k + 2 * spread[:, None]) * a + 2 * a_dist))
    return bound + valid.sum() * 2.0 ** -140 * (1 + 448 * sk)
