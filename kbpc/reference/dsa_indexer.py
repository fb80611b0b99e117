"""dsa_indexer: the DSA lightning indexer (key store, pool compression, scores, top pools,
token expansion), explain.families.dsa_indexer.

Sizes are arguments (`IndexerGeometry`): D_I = head_dim, H_I = heads, K_P = pool,
topk_tokens (2048 in the seed). For a query at position tau over S cached tokens:

    kbar_{p,c} = sum_s softmax_s(g_{pK+s,c} + a_{s,c}) k_{pK+s,c}
    I_{t,p}    = sum_h w_h relu(<q_h, kbar_p> / sqrt(D_I))   if (p+1)K <= S and pK+K-1 <= tau
               = -inf                                          otherwise
    w_h        = H_I^{-1/2} (W_w x)_h
    k_t        = min(floor((tau+1)/K), floor(min(S, topk_tokens)/K))
    T_t        = tokens of the top-k_t pools  U  the n_t mod K visible tokens of the tail pool

Order and rounding choices (FP32 op by op, no FMA):
- Pool softmax, per channel c: x_s = fl(g_s + a_s), m = max_s x_s, e_s = expf(x_s - m) (the max is
  subtracted: the same value mathematically, no overflow for large gates), den = e_0 + e_1 + ...
  (slot order), kbar = sum_s fl(fl(e_s / den) k_s) in slot order from s = 0.
- w_h = fl(raw_h * fl(1 / sqrtf(H_I))); the idx_w projection writes raw_h = (W_w x)_h and the
  score stage applies H_I^{-1/2} (both sqrt and division are correctly rounded).
- <q_h, kbar_p>: 32 lanes, lane l sums channels l, l+32, ... sequentially from its first product,
  then the 32 lane partials go through the shuffle tree (`tree_sum`). relu(fl(dot * fl(1/sqrtf(D_I)))),
  relu(x) = x if x > 0 else +0. Head terms fl(w_h * relu) summed in head order starting from +0.
- Top-k: score descending, ties to the lower pool index; -0 and +0 are one value. The selected
  pools are emitted in that rank order.
- Selection list (the `select` edge): the blueprint's edge dim index_topk/index_kpool (512) counts
  POOLS; the i32 list the decode reads holds token ids, K_P per pool, plus one pool-sized slot for
  the tail: width (topk_pools + 1) * K_P (2052 in the seed; a multiple of K_P so four-token groups
  stay aligned). Entries: rank-ordered pools' tokens p*K..p*K+K-1, then the tail tokens, then -1.

State (`IndexerCache`, shared with kernels/dsa_indexer.cuh):
- keys, gates: uint16 BF16 bits [rows, D_I]; token t lives in row t % rows, rows a multiple of K_P
  (rows = K_P keeps only the incomplete pool: the blueprint's `tail` state; rows >= context keeps
  every token).
- pool keys, written once when pool p completes (its last token t = pK + K - 1 is stored): with the
  `f32` index cache pool_keys float32 [pool_capacity, D_I] holds kbar_p; with the `fp8` cache
  (kbpc/reference/dsa_index_cache.py) pool_keys holds the rotated E4M3 codes uint8 [capacity, D_I]
  and pool_scales float32 [capacity] the power-of-two scales, and scores read ktilde_p.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kbpc.ir.state import INDEX_CACHE_KINDS
from kbpc.reference.dsa_index_cache import dequantize_pool_keys, hadamard, quantize_pool_keys
from kbpc.reference.f32ops import exp_f32
from kbpc.reference.formats import bf16_bits, bf16_from_bits, e4m3_decode
from kbpc.reference.fp32 import seq_sum, tree_sum

F32 = np.float32
WARP = 32


@dataclass(frozen=True)
class IndexerGeometry:
    head_dim: int      # D_I
    heads: int         # H_I
    pool: int          # K_P
    topk_tokens: int   # index_topk

    @classmethod
    def from_symbols(cls, sym: dict[str, int]) -> IndexerGeometry:
        """The blueprint's indexer geometry (symbols index_head_dim, index_heads, index_kpool, index_topk)."""
        return cls(sym["index_head_dim"], sym["index_heads"], sym["index_kpool"], sym["index_topk"])

    @property
    def topk_pools(self) -> int:
        return self.topk_tokens // self.pool

    @property
    def selection_width(self) -> int:
        """i32 entries per selection row: topk_pools pools and one tail pool, K_P tokens each."""
        return (self.topk_pools + 1) * self.pool


@dataclass
class IndexerCache:
    keys: np.ndarray        # uint16 [rows, D_I]
    gates: np.ndarray       # uint16 [rows, D_I]
    pool_keys: np.ndarray   # float32 [pool_capacity, D_I] (f32 cache) or uint8 E4M3 codes (fp8)
    pool_scales: np.ndarray | None = None   # float32 [pool_capacity] (fp8 cache only)

    @classmethod
    def empty(cls, geo: IndexerGeometry, rows: int, pool_capacity: int, kind: str = "f32") -> "IndexerCache":
        if rows % geo.pool:
            raise ValueError(f"cache rows ({rows}) must be a multiple of the pool size {geo.pool}")
        if kind not in INDEX_CACHE_KINDS:
            raise ValueError(f"index cache kind must be one of {INDEX_CACHE_KINDS}, got {kind!r}")
        fp8 = kind == "fp8"
        pools = np.zeros((pool_capacity, geo.head_dim), np.uint8 if fp8 else F32)
        return cls(np.zeros((rows, geo.head_dim), np.uint16), np.zeros((rows, geo.head_dim), np.uint16),
                   pools, np.zeros(pool_capacity, F32) if fp8 else None)

    @property
    def fp8(self) -> bool:
        return self.pool_scales is not None

    def put_pool(self, p: int, kbar) -> None:
        if self.fp8:
            self.pool_keys[p], self.pool_scales[p] = quantize_pool_keys(kbar)
        else:
            self.pool_keys[p] = kbar

    def pool_values(self, n: int) -> np.ndarray:
        """The FP32 keys the scores read for pools [0, n): kbar, or ktilde from the FP8 cache."""
        if self.fp8:
            return dequantize_pool_keys(self.pool_keys[:n], self.pool_scales[:n])
        return self.pool_keys[:n]


def compress_pool(keys, gates, slot_term) -> np.ndarray:
    """kbar (..., D_I) from one pool's keys and gates (..., K_P, D_I) and a (K_P, D_I), FP32."""
    keys, gates = np.asarray(keys, F32), np.asarray(gates, F32)
    x = (gates + np.asarray(slot_term, F32)).astype(F32)
    e = exp_f32((x - np.max(x, axis=-2, keepdims=True)).astype(F32))
    den = seq_sum(e, axis=-2)
    w = (e / np.expand_dims(den, -2)).astype(F32)
    return seq_sum((w * keys).astype(F32), axis=-2)


def store_token(cache: IndexerCache, geo: IndexerGeometry, t: int, key, gate, slot_term) -> None:
    """Store token t's BF16 key and gate; when t completes pool p, persist kbar_p (in place)."""
    rows = cache.keys.shape[0]
    cache.keys[t % rows] = bf16_bits(key)
    cache.gates[t % rows] = bf16_bits(gate)
    if (t + 1) % geo.pool == 0:
        p = t // geo.pool
        r = [(p * geo.pool + s) % rows for s in range(geo.pool)]
        cache.put_pool(p, compress_pool(bf16_from_bits(cache.keys[r]), bf16_from_bits(cache.gates[r]),
                                        slot_term))


def valid_pools(geo: IndexerGeometry, seq_len: int, tau: int) -> int:
    """Pools p with (p+1)K <= S and pK + K - 1 <= tau: exactly p < this count."""
    return min(seq_len // geo.pool, (tau + 1) // geo.pool)


def topk_count(geo: IndexerGeometry, seq_len: int, tau: int) -> int:
    """k_t = min(floor((tau+1)/K), floor(min(S, topk_tokens)/K))."""
    return min((tau + 1) // geo.pool, min(seq_len, geo.topk_tokens) // geo.pool)


def head_weights(raw, heads: int) -> np.ndarray:
    """w_h = fl(raw_h * fl(1 / sqrt(H_I)))."""
    inv = (F32(1) / np.sqrt(F32(heads))).astype(F32)
    return (np.asarray(raw, F32) * inv).astype(F32)


def lane_dot(q, k) -> np.ndarray:
    """<q, k> over the last axis (D a multiple of 32): lane-strided sequential partials, then the
    32-lane shuffle tree. Broadcasts over leading axes."""
    prod = (np.asarray(q, F32) * np.asarray(k, F32)).astype(F32)
    d = prod.shape[-1]
    lanes = prod.reshape(prod.shape[:-1] + (d // WARP, WARP))   # [.., j, lane]: channel l + 32 j
    return tree_sum(seq_sum(lanes, axis=-2), axis=-1)


def index_scores(geo: IndexerGeometry, q, raw_w, pool_keys, seq_len: int, tau: int,
                 n_out: int | None = None) -> np.ndarray:
    """I_{t,p} for p < n_out (default: every persisted pool), -inf where invalid.

    q: (H_I, D_I) FP32; raw_w: (H_I,) FP32 (W_w x, before H_I^{-1/2}); pool_keys: (P, D_I)."""
    pool_keys = np.asarray(pool_keys, F32)
    n_out = pool_keys.shape[0] if n_out is None else n_out
    out = np.full(n_out, -np.inf, F32)
    n = min(valid_pools(geo, seq_len, tau), n_out)
    if n == 0:
        return out
    dots = lane_dot(np.asarray(q, F32)[None], pool_keys[:n, None, :])         # (n, H)
    inv_d = (F32(1) / np.sqrt(F32(geo.head_dim))).astype(F32)
    x = (dots * inv_d).astype(F32)
    relu = np.where(x > 0, x, F32(0)).astype(F32)
    terms = (head_weights(raw_w, geo.heads)[None, :] * relu).astype(F32)
    out[:n] = seq_sum(terms, axis=-1, start=F32(0))
    return out


U = 2.0 ** -24            # FP32 unit roundoff
U_SLACK = 1.01 * U        # absorbs gamma_n = n u / (1 - n u) and the second-order terms (n < 400)
F32_TINY = 2.0 ** -149    # the FP32 subnormal spacing: the most an underflowing rounding loses


def rotated_score_bound(geo: IndexerGeometry, q, raw_w, codes, sigma) -> np.ndarray:
    """(n,) float64 bound on |I_fast - I_ref| per pool of the fp8 cache (codes uint8 [n, D_I], sigma
    [n]) for the select's rotated-query form (kernels/dsa_index_select.cuh, QROT; numerics `fast`).

    Per head, with c = e4m3(code), x = sigma c (exact), ktilde the reference's read-back,
    Hq = FWHT(q) exactly, c_d = fl(1/sqrtf(D)), L = log2 D, J = D / 32, and the magnitudes
        A = sum_d |q_d ktilde_d|,  B = |q|_1 |x|_1 / D,  C = sum_d |(Hq)_d x_d| / D,
    the reference's head dot is within c_d u' ((L + 1) B + (J + 6) A) and the fast one within
    c_d u' ((L + 1) B + (J + 6) C) of the exact x* = c_d (Hq) . x / D = c_d q . FWHT(x) / D:
    - reference: each ktilde_d errs by gamma_L |x|_1 / D (an FWHT output is a +-sum of the D inputs
      through L rounded additions), and the dot (product, J - 1 lane adds, 5 tree adds) and the
      c_d multiply cost gamma_{J+6} relative to A;
    - fast: each FWHT(q)_d errs by gamma_L |q|_1, qhat_d = fl(FWHT(q)_d c_d / D) costs u, the FMA
      chain (J - 1 adds) and the 5 tree adds cost gamma_{J+5} relative to C; the sigma multiply is
      exact (a power of two) unless the result is subnormal.
    So |x_fast - x_ref| <= bx = c_d u' ((2L + 2) B + (J + 6)(A + C)) + (D + 8) 2^-149 (underflow).
    relu is 1-Lipschitz, and each side then rounds t_h = fl(w_h r_h) and adds H terms from +0
    (H roundings in all, each relative to a sum of |t_h| <= |w_h| (c_d A (1 + u') + bx)), so
        |I_fast - I_ref| <= sum_h |w_h| (bx_h (1 + 2 (H + 1) u') + 2 (H + 1) u' c_d A_h).
    For incoherent keys |x|_1 ~ sqrt(D) |ktilde|_1 so B ~ sqrt(D) A and C ~ A: about
    ((2L + 2) sqrt(D) + 2 (J + 6) + 2 (H + 1)) u relative to sum_h |w_h| c_d A_h (~250 u at the
    seed's sizes). Assumes no FP32 overflow (the reference would overflow too)."""
    d, heads = geo.head_dim, geo.heads
    levels, j = d.bit_length() - 1, d // WARP
    q64 = np.abs(np.asarray(q, F32).astype(np.float64))                       # (H, D)
    codes = np.asarray(codes, np.uint8)
    x = np.abs(e4m3_decode(codes).astype(np.float64) * np.asarray(sigma, F32).astype(np.float64)[:, None])
    kt = np.abs(dequantize_pool_keys(codes, sigma).astype(np.float64))          # (n, D)
    qh = np.abs(np.asarray(q, F32).astype(np.float64) @ hadamard(d))           # H is symmetric
    a = kt @ q64.T                                                              # (n, H)
    b = np.outer(x.sum(axis=-1), q64.sum(axis=-1)) / d
    c = x @ qh.T / d
    c_d = float((F32(1) / np.sqrt(F32(d))).astype(F32))
    bx = c_d * U_SLACK * ((2 * levels + 2) * b + (j + 6) * (a + c)) + (d + 8) * F32_TINY
    w = np.abs(head_weights(raw_w, heads).astype(np.float64))
    per_head = bx * (1 + 2 * (heads + 1) * U_SLACK) + 2 * (heads + 1) * U_SLACK * c_d * a
    return per_head @ w


BF16_U = 2.0 ** -8         # BF16 unit roundoff (8 significant bits, round to nearest even)
MMA_STEP_LOSS = 2.0 ** -13  # assumed worst loss of one m16n8k16 accumulation, relative to its magnitudes
BF16_TINY = 2.0 ** -125     # BF16 subnormals may be flushed by the tensor core: at most this absolute


def bf16_score_bound(geo: IndexerGeometry, q, raw_w, pool_keys) -> np.ndarray:
    """(n,) float64 bound on |I_fast - I_ref| per pool of the f32 cache (pool_keys [n, D_I]) for the
    select's tensor-core form (kernels/dsa_index_score_mma.cuh, MMA; numerics `fast`).

    Per head, with A = sum_d |q_d k_d|, c_d = fl(1/sqrtf(D)), S = D / 16 mma k steps:
    - reference: the lane dot (product, J - 1 lane adds, 5 tree adds) and the c_d multiply are
      within c_d gamma_{J+6} A of c_d q . k;
    - fast: q and k rounded to BF16 (RNE, relative error u_b = 2^-8 each) make each product err by
      (2 u_b + u_b^2) |q_d k_d|; a BF16 subnormal flushed to zero errs by at most 2^-125 absolute,
      so a product by 2^-125 (|q_d| + |k_d|) (the other factor rounded up by at most 2^-7); the
      BF16 products are exact in FP32 and each k step's accumulation is assumed to lose at most
      2^-13 of the magnitudes summed (a 14-bit alignment, as published for Hopper's FP8 tensor
      cores; the BF16 mma keeps FP32's), S steps in all; the c_d multiply costs u.
    So |x_fast - x_ref| <= bx = c_d (A (2 u_b + u_b^2 + 1.01 S 2^-13 + (J + 7) u') + 2^-124 T)
    + (D + 8) 2^-149, T = sum_d (|q_d| + |k_d|). Then, as in rotated_score_bound, relu is
    1-Lipschitz and each side rounds at most H + 1 times in its weighted head sum (the fast one by
    FMA per lane and two quad adds, any order), so
        |I_fast - I_ref| <= sum_h |w_h| (bx_h (1 + 2 (H + 1) u') + 2 (H + 1) u' c_d A_h).
    About 2^-7 of sum_h |w_h| c_d A_h: the BF16 rounding of the operands dominates."""
    d, heads = geo.head_dim, geo.heads
    j, steps = d // WARP, d // 16
    q64 = np.abs(np.asarray(q, F32).astype(np.float64))                       # (H, D)
    k64 = np.abs(np.asarray(pool_keys, F32).astype(np.float64))               # (n, D)
    a = k64 @ q64.T                                                            # (n, H)
    t = k64.sum(axis=-1)[:, None] + q64.sum(axis=-1)[None, :]
    c_d = float((F32(1) / np.sqrt(F32(d))).astype(F32))
    rel = 2 * BF16_U + BF16_U ** 2 + 1.01 * steps * MMA_STEP_LOSS + (j + 7) * U_SLACK
    bx = c_d * (a * rel + 2 * BF16_TINY * t) + (d + 8) * F32_TINY
    w = np.abs(head_weights(raw_w, heads).astype(np.float64))
    per_head = bx * (1 + 2 * (heads + 1) * U_SLACK) + 2 * (heads + 1) * U_SLACK * c_d * a
    return per_head @ w


def top_pools(scores, k: int) -> np.ndarray:
    """The k best pool ids in rank order: score descending, ties to the lower index.

    -0 and +0 compare equal (numpy's float order); scores must be NaN-free."""
    s = np.asarray(scores, F32)
    order = np.lexsort((np.arange(s.size), -s.astype(np.float64)))
    return order[:k].astype(np.int32)


def expand_selection(geo: IndexerGeometry, pools, seq_len: int, tau: int) -> np.ndarray:
    """Token ids (selection_width,) int32: the pools' tokens in rank order, the tail, -1 padding."""
    out = np.full(geo.selection_width, -1, np.int32)
    pools = np.asarray(pools, np.int64)
    kp = geo.pool
    toks = (pools[:, None] * kp + np.arange(kp)[None, :]).reshape(-1)
    out[:toks.size] = toks
    n_vis = min(seq_len, tau + 1)
    tail = n_vis % kp
    out[toks.size:toks.size + tail] = (n_vis // kp) * kp + np.arange(tail)
    return out


def order_free_selection(geo: IndexerGeometry, seq_len: int, tau: int) -> np.ndarray | None:
    """The list the select's ORDER_FREE form (numerics `fast`) writes without scoring, or None where
    it ranks as select_tokens does: while the top k_t holds every valid pool, those pools in index
    order, then the tail, -1 padding. The same entries as select_tokens' list in another order, since
    the top k of n candidates is all of them whatever the scores."""
    if not every_pool_selected(geo, seq_len, tau):
        return None
    return expand_selection(geo, np.arange(topk_count(geo, seq_len, tau)), seq_len, tau)


def index_order_selection(geo: IndexerGeometry, pools, seq_len: int, tau: int) -> np.ndarray:
    """The list the select's ORDER_FREE form (numerics `fast`) writes past the contexts where
    order_free_selection applies: the ranked top-k pools (`pools`, as top_pools gives them) in
    increasing index, then the tail, -1 padding. The same entries as select_tokens' list; the fast
    MLA decode takes it as a set. Where every pool is selected it is order_free_selection's list."""
    return expand_selection(geo, np.sort(np.asarray(pools, np.int64)), seq_len, tau)


def every_pool_selected(geo: IndexerGeometry, seq_len: int, tau: int) -> bool:
    """Whether the top k_t is every valid pool, whatever the scores (dsa_every_pool_selected in
    kernels/dsa_indexer_common.cuh): the unranked select then reads no score, and the projections
    that feed only its scores (kbpc.ir.ops.unranked_scores_reader) idle."""
    return topk_count(geo, seq_len, tau) == valid_pools(geo, seq_len, tau)


def select_tokens(geo: IndexerGeometry, q, raw_w, pool_keys, seq_len: int, tau: int):
    """Scores -> top-k_t pools -> expanded token list. Returns (pools, tokens)."""
    scores = index_scores(geo, q, raw_w, pool_keys, seq_len, tau)
    k = topk_count(geo, seq_len, tau)
    pools = top_pools(scores[:valid_pools(geo, seq_len, tau)], k)
    return pools, expand_selection(geo, pools, seq_len, tau)
