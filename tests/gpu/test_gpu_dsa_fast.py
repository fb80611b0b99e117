"""GPU test of dsa_index_select's rotated-query form (QROT: numerics `fast`, fp8 index cache) through
the product's launcher, on fresh random pool keys and queries each run.

Tolerance: the form rounds differently from the reference's read-back (kernels/dsa_index_select.cuh),
so each pool's score must lie within kbpc.reference.dsa_indexer.rotated_score_bound of the reference
score. The selection is the kernel's exact top-k code, so it must be exactly the top k of the scores
the kernel wrote (ties to the lower pool). Against the reference's selection: every selected pool's
reference score plus its bound is at least every unselected pool's reference score minus its bound,
and where the reference's k-th and (k+1)-th scores differ by more than twice the largest bound the
selected set is the reference's."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import dsa_indexer as lower_dsa
from kbpc.ir.state import INDEX_SELECT_BIN_BITS, INDEX_SELECT_FILTER_CAP
from kbpc.reference import dsa_indexer as dsa
from kbpc.testing.dsa_select import check_bounded_select
from kbpc.reference.dsa_index_cache import dequantize_pool_keys, quantize_pool_keys

pytestmark = pytest.mark.gpu
F32 = np.float32
KP = 4
CHUNK = 4096   # pools per reference call (the reference is per pool: same bits in chunks)


def _reference(geo, q, raw, codes, scales):
    """(scores, bounds) of pools [0, n), float32 and float64, in chunks to bound the memory."""
    n = codes.shape[0]
    scores, bounds = np.empty(n, F32), np.empty(n, np.float64)
    for a in range(0, n, CHUNK):
        c, s = codes[a:a + CHUNK], scales[a:a + CHUNK]
        m = c.shape[0]
        scores[a:a + m] = dsa.index_scores(geo, q, raw, dequantize_pool_keys(c, s), seq_len=KP * m, tau=KP * m - 1)
        bounds[a:a + m] = dsa.rotated_score_bound(geo, q, raw, c, s)
    return scores, bounds


def _fast_select(h, d, topk, n_tokens, grid, scale_spread=0.0) -> bool:
    """Run the fast select once and check it; True when the gap let the set comparison run."""
    from kbpc.testing import gpu
    from kbpc.testing.launchers import launcher
    rng = np.random.default_rng()
    geo = dsa.IndexerGeometry(head_dim=d, heads=h, pool=KP, topk_tokens=topk * KP)
    tau = n_tokens - 1
    n, k = dsa.valid_pools(geo, n_tokens, tau), dsa.topk_count(geo, n_tokens, tau)
    cap = n + 3
    keys = rng.normal(size=(cap, d)) * np.exp(rng.normal(0, scale_spread, (cap, 1)))
    codes, scales = quantize_pool_keys(keys.astype(F32))
    q, raw = rng.normal(size=(h, d)).astype(F32), rng.normal(size=h).astype(F32)
    run = launcher(lower_dsa.select_instance(h, d, KP, topk, True, qrot=True))
    scores = gpu.poisoned((cap,), np.float32)
    toks = gpu.poisoned((geo.selection_width,), np.int32)
    hist = gpu.to_gpu(np.zeros(1 << INDEX_SELECT_BIN_BITS, np.uint32))
    arrive = gpu.to_gpu(np.zeros(2, np.uint32))
    cand = gpu.to_gpu(np.zeros(INDEX_SELECT_FILTER_CAP, np.uint64))
    run((grid, 1, 1), (lower_dsa.SELECT_THREADS, 1, 1), gpu.to_gpu(q), gpu.to_gpu(raw), None, gpu.to_gpu(codes),
        gpu.to_gpu(scales), gpu.to_gpu(np.array([n_tokens], np.int32)), gpu.to_gpu(np.array([tau], np.int32)),
        scores, hist, arrive, cand, toks)
    got = gpu.fetch(scores, allow_nan=True)
    assert np.all(np.isnan(got[n:])), "scores past the valid pools are not written"
    got = got[:n]
    ref, bound = _reference(geo, q, raw, codes[:n], scales[:n])
    checked = check_bounded_select(geo, got, ref, bound, gpu.fetch(toks, "tokens"), k, n_tokens, tau)
    assert not hist.get().any() and not arrive.get().any(), "scratch not returned to zero"
    return checked


@pytest.mark.parametrize("pools", [1024, 16384, 131072])
def test_fast_select_seed_sizes(pools):
    _fast_select(32, 128, 512, KP * pools + 3, 132)


@pytest.mark.parametrize("h,d,topk", [(1, 128, 16), (7, 32, 3), (48, 64, 64), (128, 32, 512)])
@pytest.mark.parametrize("n_tokens,grid", [(3, 1), (4 * 77 + 1, 2), (4 * 3000, 32)])
def test_fast_select_odd_sizes(h, d, topk, n_tokens, grid):
    _fast_select(h, d, topk, n_tokens, grid)


def test_fast_select_wide_key_scales():
    """Pool keys over ~2^-17 .. 2^17 (per-pool scales far apart): the bound is relative per pool."""
    _fast_select(32, 128, 512, KP * 8192, 132, scale_spread=4.0)


def test_fast_select_gap_case_checks_the_set():
    """Few pools and a small k: the reference's k-th gap usually exceeds twice the bound, so the
    set comparison runs (checked over several draws, not one)."""
    checked = sum(_fast_select(32, 128, 8, KP * 64, 4) for _ in range(8))
    assert checked >= 4, f"the gap exceeded twice the bound in only {checked} of 8 draws"
