"""glm_mla_decode: sparse NoPE MLA decode over the paged FP8 latent cache.

Math (explain.families.glm_mla_decode), E = latent width (512), per head h:

    z_j = <q_h, s_k c^_j> / sqrt(E),   o_h = rn_bf16(sum_j e^{z_j - m} s_k c^_j / sum_j e^{z_j - m})

over the selection list (token ids; -1 or ids outside [0, S) skipped; duplicates attended twice).
How the seed's node reads its `bf16` weight field: the absorbed form applies no weight inside
attention (the key up-projection is already in q_h, the value up-projection follows in `o`).

Order (the kernel's; one CTA of `warps` warps per head and row):
- The list is cut into groups of `group` consecutive entries; group g goes to warp g % warps, and a
  warp walks its groups in increasing g, entries in list order.
- Per token: v_c = fl(s_k * c^_c); lane l owns channels 16(l + 32i) + k (i < E/512, k < 16) and
  sums fl(q_c v_c) sequentially in that order; a 32-lane butterfly (`tree_sum`) gives the dot;
  z = fl(dot * fl(1 / sqrtf(E))).
- Online update, token by token: m' = max(m, z), a = expf(m - m'), p = expf(z - m'),
  l = fl(fl(l a) + p), o_c = fl(fl(o_c a) + fl(p v_c)), from m = -inf, l = 0, o = 0.
  (When z <= m, a = expf(0) = 1 exactly, so the kernel may skip the rescale: same bits.)
- Warp merge, a halving tree: for stride = warps/2 .. 1, warp w < stride absorbs warp w + stride:
  m* = max(m_a, m_b); f_x = expf(m_x - m*) (0 when m_x = -inf); l = fl(l_a f_a) + fl(l_b f_b);
  o likewise. Two empty warps stay empty.
- o = rn_bf16(fl(o_c / l)); a head with l = 0 (no valid token) writes zeros.
Exponentials are `exp_f32` here and __expf on the GPU (the GPU test states the tolerance).
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.f32ops import exp_f32
from kbpc.reference.formats import e4m3_decode, to_bf16
from kbpc.reference.fp32 import seq_sum, tree_sum

F32 = np.float32
WARP = 32
LANE_CHANNELS = 16     # one 16-byte load of E4M3 codes per lane
ORDER_WARPS = 16       # the family's order: groups dealt to 16 warps (CTAs of the split form), a halving tree
ORDER_GROUP = 4        # consecutive selection entries per group
MAX_HEADS_PER_CTA = 4  # heads a decode CTA attends for (its registers hold their queries); no order depends on it


def heads_per_cta(heads: int) -> int:
    """The largest power of two <= MAX_HEADS_PER_CTA that divides the head count."""
    hpc = MAX_HEADS_PER_CTA
    while heads % hpc:
        hpc //= 2
    return hpc


def lane_order(latent_dim: int) -> np.ndarray:
    """Channel index per (lane, position in that lane's sequential sum): shape (32, E/32)."""
    if latent_dim % (WARP * LANE_CHANNELS):
        raise ValueError(f"latent width must be a multiple of 512, got {latent_dim}")
    chunks = latent_dim // (WARP * LANE_CHANNELS)
    i, lane, k = np.meshgrid(np.arange(chunks), np.arange(WARP), np.arange(LANE_CHANNELS), indexing="ij")
    return (LANE_CHANNELS * (lane + WARP * i) + k).transpose(1, 0, 2).reshape(WARP, -1)


def _state(e: int, heads: int):
    return np.full(heads, -np.inf, F32), np.zeros(heads, F32), np.zeros((heads, e), F32)


def _update(state, z, v):
    """One online-softmax step for all heads: z (H,), v (E,) FP32."""
    m, l, o = state
    m2 = np.maximum(m, z)
    a = exp_f32((m - m2).astype(F32))
    p = exp_f32((z - m2).astype(F32))
    l = ((l * a).astype(F32) + p).astype(F32)
    o = ((o * a[:, None]).astype(F32) + (p[:, None] * v[None, :]).astype(F32)).astype(F32)
    return m2, l, o


def _merge(a, b):
    (ma, la, oa), (mb, lb, ob) = a, b
    m = np.maximum(ma, mb)
    with np.errstate(invalid="ignore"):
        fa = np.where(ma == -np.inf, F32(0), exp_f32((ma - m).astype(F32))).astype(F32)
        fb = np.where(mb == -np.inf, F32(0), exp_f32((mb - m).astype(F32))).astype(F32)
    l = ((la * fa).astype(F32) + (lb * fb).astype(F32)).astype(F32)
    o = ((oa * fa[:, None]).astype(F32) + (ob * fb[:, None]).astype(F32)).astype(F32)
    return m, l, o


def head_dots(q, v, order: np.ndarray) -> np.ndarray:
    """<q_h, v> for every head in the lane order, then the butterfly. q (H, E), v (E,)."""
    prod = (np.asarray(q, F32) * v[None, :]).astype(F32)[:, order]    # (H, 32, E/32)
    return tree_sum(seq_sum(prod, axis=-1), axis=-1)


def mla_decode(q, cache_rows, selection, seq_len: int, s_k: float, warps: int = ORDER_WARPS,
               group: int = ORDER_GROUP) -> np.ndarray:
    """o (H, E) as BF16 values in float32 for one row.

    q: (H, E) BF16 values; cache_rows: callable ids -> E4M3 codes (n, E) (e.g. a bound
    `LatentCacheLayout.rows`); selection: (W,) int32 token ids."""
    q = np.asarray(q, F32)
    heads, e = q.shape
    if warps & (warps - 1):
        raise ValueError("warps must be a power of two (the merge is a halving tree)")
    order = lane_order(e)
    scale = (F32(1) / np.sqrt(F32(e))).astype(F32)
    sel = np.asarray(selection, np.int64)
    valid = (sel >= 0) & (sel < seq_len)
    codes = np.zeros((sel.size, e), np.uint8)
    if valid.any():
        codes[valid] = cache_rows(sel[valid])
    v_all = (e4m3_decode(codes) * F32(s_k)).astype(F32)
    states = [_state(e, heads) for _ in range(warps)]
    for g in range(-(-sel.size // group)):
        w = g % warps
        for j in range(g * group, min((g + 1) * group, sel.size)):
            if valid[j]:
                z = (head_dots(q, v_all[j], order) * scale).astype(F32)
                states[w] = _update(states[w], z, v_all[j])
    stride = warps // 2
    while stride >= 1:
        for w in range(stride):
            states[w] = _merge(states[w], states[w + stride])
        stride //= 2
    _, l, o = states[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(l[:, None] > 0, (o / l[:, None]).astype(F32), F32(0))
    return to_bf16(out)
