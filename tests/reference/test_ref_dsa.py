"""DSA reference families (glm_mla_latent_write, dsa_indexer, glm_mla_decode) against float64
evaluations of the explain math, plus a many-position run of the incremental cache path compared
with a from-scratch evaluation."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.reference import dsa_indexer as dsa
from kbpc.reference.formats import E4M3_VALUES, bf16_from_bits, e4m3_decode, to_bf16
from kbpc.reference.glm_mla_decode import mla_decode
from kbpc.reference.glm_mla_latent_write import LatentCacheLayout, latent_codes, latent_dequant, latent_write

F32 = np.float32
EPS = 1e-5


def _e4m3_neighbours_ok(codes, exact64) -> bool:
    """Every code is the E4M3 value nearest to the float64 value or its neighbour across a tie."""
    grid = np.sort(np.unique(E4M3_VALUES[np.isfinite(E4M3_VALUES)]))
    got = e4m3_decode(codes).astype(np.float64)
    x = np.clip(exact64, -448, 448)
    idx = np.searchsorted(grid, x)
    lo = grid[np.clip(idx - 1, 0, grid.size - 1)]
    hi = grid[np.clip(idx, 0, grid.size - 1)]
    return bool(np.all((got == lo) | (got == hi)))


def test_latent_write_matches_float64_and_skips():
    rng = np.random.default_rng()
    c = to_bf16(rng.normal(0, 3, (5, 512)).astype(F32))
    gamma = to_bf16(rng.uniform(0.5, 1.5, 512).astype(F32))
    s_k = 0.75
    r = 1 / np.sqrt(np.mean(c.astype(np.float64) ** 2, axis=-1) + EPS)
    exact = c * r[:, None] * gamma / s_k
    codes = latent_codes(c, gamma, EPS, s_k)
    assert _e4m3_neighbours_ok(codes, exact)
    layout = LatentCacheLayout(num_pages=4, page_size=2, latent_dim=512)
    table = np.array([3, 1, 0, 2], np.int32)
    slots = [layout.slot(table, t) for t in range(4)] + [-1]
    cache = latent_write(np.full(layout.shape, 0xAB, np.uint8), c, gamma, slots, EPS, s_k)
    np.testing.assert_array_equal(layout.rows(cache, table, np.arange(4)), codes[:4])
    np.testing.assert_array_equal(cache.reshape(-1, 512)[table[0] * 2], codes[0])   # page 0 -> 3
    assert np.count_nonzero(np.all(cache.reshape(-1, 512) == 0xAB, axis=1)) == 4   # row 4 skipped


def test_compress_pool_matches_float64():
    rng = np.random.default_rng()
    k = to_bf16(rng.normal(size=(6, 4, 64)).astype(F32))
    g = to_bf16(rng.normal(0, 3, (6, 4, 64)).astype(F32))
    a = rng.normal(size=(4, 64)).astype(F32)
    x = g.astype(np.float64) + a
    w = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
    exact = (w * k).sum(axis=1)
    np.testing.assert_allclose(dsa.compress_pool(k, g, a), exact, rtol=1e-5, atol=1e-5)


def test_scores_match_float64_and_mask():
    rng = np.random.default_rng()
    geo = dsa.IndexerGeometry(head_dim=64, heads=8, pool=4, topk_tokens=16)
    q = rng.normal(size=(8, 64)).astype(F32)
    raw = rng.normal(size=8).astype(F32)
    pk = rng.normal(size=(10, 64)).astype(F32)
    s = dsa.index_scores(geo, q, raw, pk, seq_len=40, tau=30)          # 7 pools end at or before 30
    dots = pk.astype(np.float64) @ q.T.astype(np.float64) / 8.0
    exact = (np.maximum(dots, 0) * raw / np.sqrt(8)).sum(axis=1)
    np.testing.assert_allclose(s[:7], exact[:7], rtol=1e-5, atol=1e-5)
    assert np.all(s[7:] == -np.inf)
    assert np.all(dsa.index_scores(geo, q, raw, pk, seq_len=13, tau=39)[3:] == -np.inf)  # S limits


def test_top_pools_ties_and_signed_zero():
    s = np.array([1.0, 3.0, -0.0, 3.0, 0.0, 1.0, -2.0], F32)
    np.testing.assert_array_equal(dsa.top_pools(s, 7), [1, 3, 0, 5, 2, 4, 6])
    np.testing.assert_array_equal(dsa.top_pools(s, 3), [1, 3, 0])


def test_expansion_tail_and_padding():
    geo = dsa.IndexerGeometry(head_dim=32, heads=1, pool=4, topk_tokens=8)
    assert geo.selection_width == 12
    sel = dsa.expand_selection(geo, np.array([1, 0]), seq_len=11, tau=10)
    np.testing.assert_array_equal(sel, [4, 5, 6, 7, 0, 1, 2, 3, 8, 9, 10, -1])
    sel = dsa.expand_selection(geo, np.array([], np.int64), seq_len=3, tau=2)
    np.testing.assert_array_equal(sel, [0, 1, 2] + [-1] * 9)
    assert dsa.topk_count(geo, 11, 10) == 2 and dsa.topk_count(geo, 30, 29) == 2
    assert dsa.topk_count(geo, 2, 1) == 0


@pytest.mark.parametrize("topk_pools", [1, 3, 8])
def test_order_free_selection_is_the_ranked_list_reordered(topk_pools):
    """The select's ORDER_FREE form (numerics fast) lists every valid pool in index order exactly while
    the top k is all of them, whatever the scores: the ranked list's entries, reordered; past that
    context it ranks (None). Every position from 0 to past the top-k, with capped and uncapped S."""
    rng = np.random.default_rng()
    geo = dsa.IndexerGeometry(head_dim=32, heads=3, pool=4, topk_tokens=4 * topk_pools)
    for seq_len in (4 * topk_pools + 7, 9):
        pk = rng.normal(size=(seq_len // 4 + 1, 32)).astype(F32)
        q, raw = rng.normal(size=(3, 32)).astype(F32), rng.normal(size=3).astype(F32)
        unranked = 0
        for tau in range(4 * topk_pools + 12):
            pools, ranked = dsa.select_tokens(geo, q, raw, pk, seq_len, tau)
            free = dsa.order_free_selection(geo, seq_len, tau)
            if dsa.topk_count(geo, seq_len, tau) < dsa.valid_pools(geo, seq_len, tau):
                assert free is None
                continue
            unranked += 1
            np.testing.assert_array_equal(np.sort(free), np.sort(ranked))
            np.testing.assert_array_equal(free[:4 * len(pools)], np.arange(4 * len(pools)))
        assert unranked >= min(seq_len, 4 * topk_pools + 3)


@pytest.mark.parametrize("topk_pools", [1, 3, 8])
def test_index_order_selection_is_the_ranked_list_in_index_order(topk_pools):
    """Past the contexts where every pool is selected, the ORDER_FREE select lists the ranked top k in
    increasing pool index (index_order_selection): select_tokens' entries, the pools ascending, the
    tail and padding where they were; where every pool is selected it is order_free_selection."""
    rng = np.random.default_rng()
    geo = dsa.IndexerGeometry(head_dim=32, heads=3, pool=4, topk_tokens=4 * topk_pools)
    seq_len = 4 * topk_pools + 37
    pk = rng.normal(size=(seq_len // 4 + 1, 32)).astype(F32)
    q, raw = rng.normal(size=(3, 32)).astype(F32), rng.normal(size=3).astype(F32)
    for tau in range(seq_len):
        pools, ranked = dsa.select_tokens(geo, q, raw, pk, seq_len, tau)
        listed = dsa.index_order_selection(geo, pools, seq_len, tau)
        np.testing.assert_array_equal(np.sort(listed), np.sort(ranked))
        n = 4 * len(pools)
        np.testing.assert_array_equal(listed[:n:4] // 4, np.sort(pools))
        np.testing.assert_array_equal(listed[n:], ranked[n:])
        free = dsa.order_free_selection(geo, seq_len, tau)
        if free is not None:
            np.testing.assert_array_equal(listed, free)


@pytest.mark.parametrize("topk_pools", [1, 3, 512])
def test_every_pool_selected_is_where_the_select_reads_no_score(topk_pools):
    """every_pool_selected (the switch the unranked select and the score-only projections share,
    dsa_every_pool_selected on the device) holds exactly where order_free_selection lists without
    scores; for a decode row (S = tau + 1) it is floor(S / K_P) <= top-k pools."""
    geo = dsa.IndexerGeometry(head_dim=32, heads=3, pool=4, topk_tokens=4 * topk_pools)
    for tau in range(4 * topk_pools + 12):
        for seq_len in (tau + 1, min(tau + 1, 9)):
            idle = dsa.every_pool_selected(geo, seq_len, tau)
            assert idle == (dsa.order_free_selection(geo, seq_len, tau) is not None)
        assert dsa.every_pool_selected(geo, tau + 1, tau) == ((tau + 1) // 4 <= topk_pools)


def _decode64(q, v_rows, s_k):
    if len(v_rows) == 0:
        return np.zeros_like(q, np.float64)
    v = np.asarray(v_rows, np.float64) * s_k
    z = q.astype(np.float64) @ v.T / np.sqrt(q.shape[1])
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return (p @ v) / p.sum(axis=1, keepdims=True)


def test_decode_matches_float64_with_duplicates_and_skips():
    rng = np.random.default_rng()
    layout = LatentCacheLayout(num_pages=3, page_size=4, latent_dim=512)
    table = np.array([2, 0, 1], np.int32)
    cache = rng.integers(0, 256, layout.shape, dtype=np.uint8)
    cache[(cache & 0x7F) == 0x7F] = 0x3C          # no NaN codes
    q = to_bf16(rng.normal(0, 0.05, (3, 512)).astype(F32))
    sel = np.array([5, -1, 5, 11, 2, 12, 40, 0, -1], np.int32)     # 12, 40 out of range (S = 12)
    rows = lambda ids: layout.rows(cache, table, ids)              # noqa: E731
    got = mla_decode(q, rows, sel, seq_len=12, s_k=0.5, warps=2, group=2)
    keep = sel[(sel >= 0) & (sel < 12)]
    exact = _decode64(q, e4m3_decode(rows(keep)), 0.5)
    np.testing.assert_allclose(got, exact, rtol=2 ** -7, atol=1e-6 * np.abs(exact).max())
    assert np.all(mla_decode(q, rows, np.full(8, -1, np.int32), 12, 0.5, warps=4) == 0)


def test_many_positions_incremental_matches_from_scratch():
    """Decode positions 0..T-1 one token at a time (pools complete, pages fill, the top-k drops
    pools) and compare every step with an evaluation from the whole history."""
    rng = np.random.default_rng()
    geo = dsa.IndexerGeometry(head_dim=64, heads=4, pool=4, topk_tokens=16)
    T, E, H, P = 61, 512, 2, 8
    keys = to_bf16(rng.normal(size=(T, 64)).astype(F32))
    gates = to_bf16(rng.normal(size=(T, 64)).astype(F32))
    a = rng.normal(0, 0.5, (4, 64)).astype(F32)
    lat = to_bf16(rng.normal(size=(T, E)).astype(F32))
    gamma = to_bf16(rng.uniform(0.5, 1.5, E).astype(F32))
    layout = LatentCacheLayout(num_pages=T // P + 1, page_size=P, latent_dim=E)
    table = rng.permutation(layout.num_pages).astype(np.int32)
    cache = dsa.IndexerCache.empty(geo, rows=geo.pool, pool_capacity=T // geo.pool)
    codes = layout.empty()
    pk_all = dsa.compress_pool(keys[:T // 4 * 4].reshape(-1, 4, 64), gates[:T // 4 * 4].reshape(-1, 4, 64), a)
    codes_all = latent_codes(lat, gamma, EPS, 1.0)
    dropped = False
    for t in range(T):
        dsa.store_token(cache, geo, t, keys[t], gates[t], a)
        codes = latent_write(codes, lat[t:t + 1], gamma, [layout.slot(table, t)], EPS, 1.0)
        n = (t + 1) // 4
        np.testing.assert_array_equal(cache.pool_keys[:n], pk_all[:n])
        q = rng.normal(size=(4, 64)).astype(F32)
        raw = rng.normal(size=4).astype(F32)
        pools, sel = dsa.select_tokens(geo, q, raw, cache.pool_keys, seq_len=t + 1, tau=t)
        # from scratch, float64 scores over the whole history
        s64 = (np.maximum(pk_all[:n] @ q.T.astype(np.float64) / 8, 0) * raw / 2).sum(axis=1)
        k = min(n, 4)
        assert set(pools.tolist()) == set(np.argsort(-s64, kind="stable")[:k].tolist())
        dropped |= n > k
        tail = list(range(n * 4, t + 1))
        expect = sorted([p * 4 + s for p in pools for s in range(4)] + tail)
        assert sorted(sel[sel >= 0].tolist()) == expect and np.all(sel[len(expect):] == -1)
        qa = to_bf16(rng.normal(0, 0.05, (H, E)).astype(F32))
        o = mla_decode(qa, lambda ids: layout.rows(codes, table, ids), sel, seq_len=t + 1, s_k=1.0)
        ids = sel[sel >= 0]
        exact = _decode64(qa, latent_dequant(codes_all[ids], 1.0), 1.0)
        np.testing.assert_allclose(o, exact, rtol=2 ** -7, atol=1e-5 * np.abs(exact).max())
    assert dropped


@pytest.mark.parametrize("rows", [4, 8, 64])
def test_store_ring_rows(rows):
    geo = dsa.IndexerGeometry(head_dim=32, heads=1, pool=4, topk_tokens=8)
    rng = np.random.default_rng()
    cache = dsa.IndexerCache.empty(geo, rows=rows, pool_capacity=8)
    k = to_bf16(rng.normal(size=(20, 32)).astype(F32))
    for t in range(20):
        dsa.store_token(cache, geo, t, k[t], k[t], np.zeros((4, 32), F32))
    np.testing.assert_array_equal(bf16_from_bits(cache.keys[19 % rows]), k[19])
    np.testing.assert_array_equal(cache.pool_keys[:5],
                                  dsa.compress_pool(k.reshape(5, 4, 32), k.reshape(5, 4, 32), np.zeros((4, 32), F32)))
