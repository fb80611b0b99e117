"""glm_mla_latent_write: RMSNorm + E4M3 quantisation + paged store of one token's MLA latent.

Math (explain.families.glm_mla_latent_write), E = latent width (512 in the seed):

    r     = (1/E sum_k c_k^2 + eps)^{-1/2}
    c^_i  = sat_e4m3(((c_i r) gamma_i) * (1/s_k))

Order (the numerics fix it; one thread per channel, E/32 warps):
    sum of squares: thread i squares c_i (FP32); a 32-lane xor butterfly per warp (`tree_sum`),
    then a halving tree over the E/32 warp sums (`tree_sum`; E/32 a power of two);
    mean = fl(sum / E) (true division), r = rsqrtf(fl(mean + eps)),
    y_i = fl(fl(fl(c_i r) gamma_i) * inv_s) with inv_s = fl(1 / s_k); code = sat_e4m3(y_i).
gamma is the BF16 RMSNorm weight (plain: no 1 + gamma offset), given as BF16 values in float32.
eps (1e-5 for GLM-5) and s_k (static per layer) are explicit arguments.

The paged FP8 latent cache (`LatentCache`) is the state this family writes and glm_mla_decode
reads; the GPU kernels use the same layout (see kernels/glm_mla_latent_write.cuh).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kbpc.reference.f32ops import rsqrt_f32
from kbpc.reference.formats import e4m3_decode, e4m3_encode
from kbpc.reference.fp32 import tree_sum

F32 = np.float32
WARP = 32


@dataclass(frozen=True)
class LatentCacheLayout:
    """Paged FP8 latent cache.

    codes:       uint8 [num_pages, page_size, latent_dim], E4M3 codes of c^/1 (row-major; one row
                 per token, rows of a page contiguous, so a token row is latent_dim bytes).
    block_table: int32 [max_logical_pages]: logical page j (tokens j*P .. j*P+P-1 of the sequence)
                 lives in physical page block_table[j].
    slot:        the flat physical row a token is written to: block_table[t // P] * P + t % P.
    scale:       s_k, one static FP32 value per layer; a cached value is s_k * e4m3(code).
    """
    num_pages: int
    page_size: int
    latent_dim: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.num_pages, self.page_size, self.latent_dim)

    def empty(self) -> np.ndarray:
        return np.zeros(self.shape, np.uint8)

    def slot(self, block_table: np.ndarray, token: int) -> int:
        """Flat physical row of `token` (its logical page looked up in the block table)."""
        return int(block_table[token // self.page_size]) * self.page_size + token % self.page_size

    def rows(self, codes: np.ndarray, block_table: np.ndarray, tokens) -> np.ndarray:
        """The E4M3 codes of the given token ids (gathered through the block table)."""
        tokens = np.asarray(tokens, np.int64)
        phys = np.asarray(block_table, np.int64)[tokens // self.page_size]
        return codes.reshape(-1, self.latent_dim)[phys * self.page_size + tokens % self.page_size]


def sum_squares(c) -> np.ndarray:
    """sum_k c_k^2 per row in the kernel's order: warp butterfly, then a tree over warp sums."""
    c = np.asarray(c, F32)
    e = c.shape[-1]
    if e % WARP or (e // WARP) & (e // WARP - 1):
        raise ValueError(f"latent width must be 32 * a power of two, got {e}")
    sq = (c * c).astype(F32).reshape(c.shape[:-1] + (e // WARP, WARP))
    return tree_sum(tree_sum(sq, axis=-1), axis=-1)


def latent_values(c, gamma, eps: float, s_k: float) -> np.ndarray:
    """y = ((c r) gamma) / s_k in FP32, before the E4M3 conversion. c: (..., E) BF16 values."""
    c = np.asarray(c, F32)
    e = c.shape[-1]
    mean = (sum_squares(c) / F32(e)).astype(F32)
    r = rsqrt_f32((mean + F32(eps)).astype(F32))
    inv_s = (F32(1) / F32(s_k)).astype(F32)
    return ((((c * r[..., None]).astype(F32) * np.asarray(gamma, F32)).astype(F32)) * inv_s).astype(F32)


def latent_codes(c, gamma, eps: float, s_k: float) -> np.ndarray:
    """c^ = sat_e4m3(y): the uint8 codes a token row is stored as."""
    return e4m3_encode(latent_values(c, gamma, eps, s_k))


def latent_write(codes: np.ndarray, c, gamma, slots, eps: float, s_k: float) -> np.ndarray:
    """Store rows c (m, E) at flat physical rows `slots` (m,) of `codes`; slot -1 skips the row.

    Returns the updated cache (a copy; the input is not modified)."""
    out = np.array(codes, np.uint8, copy=True)
    flat = out.reshape(-1, out.shape[-1])
    q = latent_codes(np.atleast_2d(np.asarray(c, F32)), gamma, eps, s_k)
    for row, slot in enumerate(np.atleast_1d(np.asarray(slots, np.int64))):
        if slot >= 0:
            flat[slot] = q[row]
    return out


def latent_dequant(codes, s_k: float) -> np.ndarray:
    """s_k * c^ in FP32: what the decode reads back."""
    return (e4m3_decode(codes) * F32(s_k)).astype(F32)
