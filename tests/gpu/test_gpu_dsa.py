"""GPU tests of the DSA indexer kernels (dsa_indexer_store, dsa_index_select) through the product's
launchers (kbpc.testing.launchers, instances as kbpc/codegen/families/dsa_indexer.py builds them)
against the numpy reference, on fresh random inputs each run with poisoned outputs.

No tolerances: every stage is bit-exact. The pool softmax uses the correctly rounded exponential
(kbp_transcendental.cuh), the FP8 cache's rotation, scale and E4M3 rounding are the reference's op
for op, the scores are FP32 in a fixed order, and the top-k is an exact total order (score
descending, ties to the lower pool index). Cases cover both index caches, odd head counts and
widths, contexts from 3 tokens to 512k, grids from 1 CTA to one per SM, exact ties (duplicate pool
keys, all-zero keys) both where the tied bin fits in shared memory and where it does not, and a
replay of the same scratch (the histogram and the arrival counter must come back zeroed)."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import dsa_indexer as lower_dsa
from kbpc.ir.state import INDEX_SELECT_BIN_BITS, INDEX_SELECT_FILTER_CAP
from kbpc.reference import dsa_indexer as dsa
from kbpc.reference.dsa_index_cache import dequantize_pool_keys, quantize_pool_keys
from kbpc.reference.formats import bf16_bits, to_bf16
from kbpc.reference.layer_norm import layer_norm

pytestmark = pytest.mark.gpu
F32 = np.float32
KP = 4


def _gpu():
    from kbpc.testing import gpu
    return gpu


def _run(inst):
    from kbpc.testing.launchers import launcher
    return launcher(inst)


def _i32(*v):
    return _gpu().to_gpu(np.array(v, np.int32))


def _pool_keys(rng, n: int, d: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """(distinct rows, row index per pool): pool p's key is rows[index[p]]."""
    if mode == "random":
        return rng.normal(size=(n, d)).astype(F32), np.arange(n)
    if mode == "zeros":
        return np.zeros((1, d), F32), np.zeros(n, np.int64)
    if mode == "dups":          # exact ties everywhere: few distinct keys
        return rng.normal(size=(min(n, 7), d)).astype(F32), rng.integers(0, min(n, 7), n)
    if mode == "many":          # ~1000 distinct keys repeated over a long context
        distinct = min(n, 1000)
        return rng.normal(size=(distinct, d)).astype(F32), rng.integers(0, distinct, n)
    if mode == "clustered":     # distinct scores packed into few histogram bins
        base = rng.normal(size=(1, d)).astype(F32)
        rows = (base + rng.normal(0, 1e-3, (min(n, 4096), d))).astype(F32)
        return rows, rng.integers(0, rows.shape[0], n)
    raise ValueError(mode)


def _select(h, d, topk, fp8, grid, n_tokens, mode, replays=1):
    """Run dsa_index_select `replays` times on the same scratch with fresh queries; check each."""
    gpu, rng = _gpu(), np.random.default_rng()
    geo = dsa.IndexerGeometry(head_dim=d, heads=h, pool=KP, topk_tokens=topk * KP)
    tau = n_tokens - 1
    n = dsa.valid_pools(geo, n_tokens, tau)
    cap = n + 3
    rows, index = _pool_keys(rng, cap, d, mode)
    if fp8:
        codes, scales = quantize_pool_keys(rows)
        values = dequantize_pool_keys(codes, scales)
        pool_args = (None, gpu.to_gpu(codes[index]), gpu.to_gpu(scales[index]))
    else:
        values = rows
        pool_args = (gpu.to_gpu(rows[index]), None, None)
    run = _run(lower_dsa.select_instance(h, d, KP, topk, fp8))
    hist = gpu.to_gpu(np.zeros(1 << INDEX_SELECT_BIN_BITS, np.uint32))
    arrive = gpu.to_gpu(np.zeros(2, np.uint32))
    cand = gpu.to_gpu(np.zeros(INDEX_SELECT_FILTER_CAP, np.uint64))
    for _ in range(replays):
        q, raw = rng.normal(size=(h, d)).astype(F32), rng.normal(size=h).astype(F32)
        scores = gpu.poisoned((cap,), np.float32)
        toks = gpu.poisoned((geo.selection_width,), np.int32)
        run((grid, 1, 1), (lower_dsa.SELECT_THREADS, 1, 1), gpu.to_gpu(q), gpu.to_gpu(raw), *pool_args,
            _i32(n_tokens), _i32(tau), scores, hist, arrive, cand, toks)
        # Scores of the distinct rows, mapped to the pools (the reference per pool would be the same).
        ref_rows = dsa.index_scores(geo, q, raw, values, seq_len=10 ** 9, tau=10 ** 9 - 1)
        ref = ref_rows[index[:n]]
        got = gpu.fetch(scores, allow_nan=True)
        np.testing.assert_array_equal(got[:n].view(np.uint32), ref.view(np.uint32))
        assert np.all(np.isnan(got[n:])), "scores past the valid pools are not written"
        ref_pools = dsa.top_pools(ref, dsa.topk_count(geo, n_tokens, tau))
        np.testing.assert_array_equal(gpu.fetch(toks, "tokens"), dsa.expand_selection(geo, ref_pools, n_tokens, tau))
        assert not hist.get().any() and not arrive.get().any(), "scratch not returned to zero"


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("n_tokens,grid,mode", [
    (3, 132, "random"), (9, 1, "random"), (1000, 7, "dups"), (4 * 777 + 2, 132, "random"),
    (16384 + 7, 132, "zeros"), (16384 + 5, 132, "clustered"), (4 * 3000 + 1, 132, "clustered"),
    (131072, 132, "many"), (4 * 20000 + 3, 132, "random"), (4 * 20000 + 3, 7, "random"),
    (4 * 12000 + 1, 132, "clustered"), (4 * 10000, 132, "zeros")])
def test_select_seed_sizes(fp8, n_tokens, grid, mode):
    """Past 8192 pools the CTAs list their candidates (kernels/dsa_index_select.cuh): random and
    clustered keys fit the list, all-zero keys (every score tied) overflow it and the last CTA
    scans every score; the selection is the reference's either way."""
    _select(32, 128, 512, fp8, grid, n_tokens, mode)


@pytest.mark.parametrize("n_tokens,mode", [(524288, "many"), (524288, "zeros")])
def test_select_512k(n_tokens, mode):
    _select(32, 128, 512, False, 132, n_tokens, mode)


@pytest.mark.parametrize("h,d,topk,fp8", [(4, 128, 4, False), (1, 128, 16, True), (20, 64, 16, False),
                                          (48, 64, 64, True), (7, 96, 3, False), (128, 32, 512, False)])
@pytest.mark.parametrize("n_tokens,grid", [(3, 1), (4 * 77 + 1, 2), (4 * 1000, 32)])
def test_select_odd_sizes(h, d, topk, fp8, n_tokens, grid):
    _select(h, d, topk, fp8, grid, n_tokens, "random")


@pytest.mark.parametrize("n_tokens,mode", [(4 * 5000, "dups"), (4 * 20000, "random"), (4 * 10000, "zeros")])
def test_select_replays_reset_the_scratch(n_tokens, mode):
    """The histogram, the arrival counter and the candidate count come back to zero (with the
    candidate list used, and overflowed)."""
    _select(32, 128, 512, False, 132, n_tokens, mode, replays=3)


# ---------------------------------------------------------------- store

@pytest.mark.parametrize("norm", [False, True], ids=["store", "norm+store"])
@pytest.mark.parametrize("d,fp8", [(128, False), (128, True), (64, True), (32, False), (256, True)])
def test_store_every_position(d, fp8, norm):
    """Positions 0..T-1: the BF16 key/gate rows and, at each pool's last token, its key (FP32, or
    the rotated E4M3 codes and scale), all bit for bit. `norm+store` (rule dsa_key_store): the
    launch gets the raw key and the LayerNorm's weights, and stores the reference's
    layer_norm of it."""
    gpu, rng = _gpu(), np.random.default_rng()
    geo = dsa.IndexerGeometry(head_dim=d, heads=1, pool=KP, topk_tokens=16)
    T, rows = 41, KP
    ref = dsa.IndexerCache.empty(geo, rows=rows, pool_capacity=T // KP + 1, kind="fp8" if fp8 else "f32")
    a = rng.normal(0, 0.5, (KP, d)).astype(F32)
    keys, gates = gpu.to_gpu(np.zeros((rows, d), np.uint16)), gpu.to_gpu(np.zeros((rows, d), np.uint16))
    cap = T // KP + 1
    pk = None if fp8 else gpu.poisoned((cap, d), np.float32)
    codes = gpu.poisoned((cap, d), np.uint8) if fp8 else None
    scales = gpu.poisoned((cap,), np.float32) if fp8 else None
    run = _run(lower_dsa.store_instance(d, KP, fp8, norm=norm))
    d_a = gpu.to_gpu(a)
    gamma, beta, eps = to_bf16(rng.normal(1, 0.3, d).astype(F32)), to_bf16(rng.normal(0, 0.3, d).astype(F32)), 1e-6
    d_gamma, d_beta = gpu.to_gpu(bf16_bits(gamma)), gpu.to_gpu(bf16_bits(beta))
    for t in range(T):
        k = to_bf16(rng.normal(size=d).astype(F32) * rng.uniform(0.01, 100))
        g = to_bf16(rng.normal(0, 3, d).astype(F32))
        if norm:   # the launch normalises the raw key x itself
            x = to_bf16((rng.normal(size=d) * rng.uniform(0.01, 100) + rng.normal(0, 5)).astype(F32))
            k = layer_norm(x, gamma, beta, eps)
            head = (gpu.to_gpu(bf16_bits(x)), d_gamma, d_beta, np.float32(eps))
        else:
            head = (gpu.to_gpu(bf16_bits(k)),)
        dsa.store_token(ref, geo, t, k, g, a)
        run((1, 1, 1), (d, 1, 1), *head, gpu.to_gpu(bf16_bits(g)), d_a, keys, gates, rows,
            pk, codes, scales, _i32(t))
        np.testing.assert_array_equal(keys.get(), ref.keys)
        np.testing.assert_array_equal(gates.get(), ref.gates)
        n = (t + 1) // KP
        if fp8:
            np.testing.assert_array_equal(gpu.fetch(codes, allow_nan=True)[:n], ref.pool_keys[:n])
            np.testing.assert_array_equal(gpu.fetch(scales, allow_nan=True)[:n], ref.pool_scales[:n])
        else:
            got = gpu.fetch(pk, allow_nan=True)
            np.testing.assert_array_equal(got[:n].view(np.uint32), ref.pool_keys[:n].view(np.uint32))
            assert np.all(np.isnan(got[n:])), "pool keys past the completed pools were written"
