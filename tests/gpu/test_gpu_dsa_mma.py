"""GPU test of dsa_index_select's tensor-core form (MMA: numerics `fast`, f32 index cache) through
the product's launcher, on fresh random pool keys and queries each run.

Tolerance: the form scores BF16-rounded queries and keys on tensor cores
(kernels/dsa_index_score_mma.cuh), so each pool's score must lie within
kbpc.reference.dsa_indexer.bf16_score_bound of the reference score. The selection is the kernel's
exact top-k code, so it must be exactly the top k of the scores the kernel wrote (ties to the lower
pool). Against the reference's selection: every selected pool's reference score plus its bound is
at least every unselected pool's reference score minus its bound, and where the reference's k-th and
(k+1)-th scores differ by more than twice the largest bound the selected set is the reference's."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import dsa_indexer as lower_dsa
from kbpc.ir.state import INDEX_SELECT_BIN_BITS, INDEX_SELECT_FILTER_CAP
from kbpc.reference import dsa_indexer as dsa
from kbpc.testing.dsa_select import check_bounded_select

pytestmark = pytest.mark.gpu
F32 = np.float32
KP = 4
CHUNK = 4096   # pools per reference call (the reference is per pool: same bits in chunks)


def _reference(geo, q, raw, keys):
    """(scores, bounds) of pools [0, n), float32 and float64, in chunks to bound the memory."""
    n = keys.shape[0]
    scores, bounds = np.empty(n, F32), np.empty(n, np.float64)
    for a in range(0, n, CHUNK):
        k = keys[a:a + CHUNK]
        m = k.shape[0]
        scores[a:a + m] = dsa.index_scores(geo, q, raw, k, seq_len=KP * m, tau=KP * m - 1)
        bounds[a:a + m] = dsa.bf16_score_bound(geo, q, raw, k)
    return scores, bounds


def _draw(rng, h, d, cap, scale_spread, aligned, k=0):
    """(keys, q, raw). aligned: every query near one direction v, positive head weights, and pool p's
    key t_p v (+ 1% noise), t_p in [3, 4) for k random pools and in [1, 1.5) for the others, so that
    the k-th and (k+1)-th scores differ by far more than twice the bound (about 2^-7 of a score
    here) and the set comparison always runs."""
    if not aligned:
        keys = rng.normal(size=(cap, d)) * np.exp(rng.normal(0, scale_spread, (cap, 1)))
        return keys.astype(F32), rng.normal(size=(h, d)).astype(F32), rng.normal(size=h).astype(F32)
    v = rng.normal(size=d)
    v /= np.linalg.norm(v)
    t = 1.0 + 0.5 * rng.random(cap)
    t[rng.choice(cap - 3, size=k, replace=False)] += 2.0 + 0.5 * rng.random(k)   # within the valid pools
    keys = t[:, None] * (v[None, :] + 0.01 * rng.normal(size=(cap, d)) / np.sqrt(d))
    q = v[None, :] * np.sqrt(d) + 0.01 * rng.normal(size=(h, d))
    return keys.astype(F32), q.astype(F32), np.abs(rng.normal(size=h)).astype(F32) + F32(0.1)


def _mma_select(h, d, topk, n_tokens, grid, scale_spread=0.0, replays=1, aligned=False) -> bool:
    """Run the tensor-core select `replays` times on the same scratch (fresh queries each time) and
    check each; True when the last draw's gap let the set comparison run."""
    from kbpc.testing import gpu
    from kbpc.testing.launchers import launcher
    rng = np.random.default_rng()
    geo = dsa.IndexerGeometry(head_dim=d, heads=h, pool=KP, topk_tokens=topk * KP)
    tau = n_tokens - 1
    n, k = dsa.valid_pools(geo, n_tokens, tau), dsa.topk_count(geo, n_tokens, tau)
    cap = n + 3
    keys, q, raw = _draw(rng, h, d, cap, scale_spread, aligned, k)
    run = launcher(lower_dsa.select_instance(h, d, KP, topk, False, mma=True))
    keys_gpu = gpu.to_gpu(keys)
    scores = gpu.poisoned((cap,), np.float32)
    toks = gpu.poisoned((geo.selection_width,), np.int32)
    hist = gpu.to_gpu(np.zeros(1 << INDEX_SELECT_BIN_BITS, np.uint32))
    arrive = gpu.to_gpu(np.zeros(2, np.uint32))
    cand = gpu.to_gpu(np.zeros(INDEX_SELECT_FILTER_CAP, np.uint64))
    checked = False
    for replay in range(replays):
        if replay:
            q, raw = rng.normal(size=(h, d)).astype(F32), rng.normal(size=h).astype(F32)
        run((grid, 1, 1), (lower_dsa.SELECT_THREADS, 1, 1), gpu.to_gpu(q), gpu.to_gpu(raw), keys_gpu, None, None,
            gpu.to_gpu(np.array([n_tokens], np.int32)), gpu.to_gpu(np.array([tau], np.int32)),
            scores, hist, arrive, cand, toks)
        got = gpu.fetch(scores, allow_nan=True)
        assert np.all(np.isnan(got[n:])), "scores past the valid pools are not written"
        got = got[:n]
        ref, bound = _reference(geo, q, raw, keys[:n])
        checked = check_bounded_select(geo, got, ref, bound, gpu.fetch(toks, "tokens"), k, n_tokens, tau)
        assert not hist.get().any() and not arrive.get().any(), "scratch not returned to zero"
    return checked


@pytest.mark.parametrize("pools", [256, 4096, 32768, 131072])
def test_mma_select_seed_sizes(pools):
    """The seed's index geometry at 1k, 16k, 128k and 512k context, one CTA per SM."""
    _mma_select(32, 128, 512, KP * pools + 3, 132)


@pytest.mark.parametrize("h,d,topk", [(1, 128, 16), (7, 32, 3), (48, 64, 64), (128, 32, 512), (128, 128, 512)])
@pytest.mark.parametrize("n_tokens,grid", [(3, 1), (4 * 77 + 1, 2), (4 * 3000, 32)])
def test_mma_select_odd_sizes(h, d, topk, n_tokens, grid):
    _mma_select(h, d, topk, n_tokens, grid)


def test_mma_select_replays_on_the_same_scratch():
    """Graph replays reuse the histogram and the arrival counter: each launch leaves them zero."""
    _mma_select(32, 128, 512, KP * 5000 + 2, 132, replays=4)


def test_mma_select_wide_key_scales():
    """Pool keys over ~2^-17 .. 2^17 (per-pool scales far apart): the bound is relative per pool."""
    _mma_select(32, 128, 512, KP * 8192, 132, scale_spread=4.0)


@pytest.mark.parametrize("topk,pools", [(8, 64), (512, 2000)])
def test_mma_select_separated_scores_pick_the_reference_set(topk, pools):
    """The k-th gap far above twice the bound: the selected set is the reference's."""
    assert _mma_select(32, 128, topk, KP * pools, 16, aligned=True), "the set comparison did not run"
