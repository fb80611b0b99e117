"""GPU tests of dsa_index_select's ORDER_FREE flag (numerics `fast`; kernels/dsa_index_select.cuh)
through the product's launcher, in both fast scoring forms (tensor cores over the f32 cache, the
rotated query over the fp8 cache), on fresh random keys and queries each run.

While the top k holds every valid pool the list must be exactly
kbpc.reference.dsa_indexer.order_free_selection (the ranked list's entries in index order: the
reference test holds that) with nothing scored: the poisoned scores stay NaN, the histogram and the
arrival counter stay zero. Past that context the flag keeps the ranked form's scores, bit for bit,
and its set: the list is the ranked launch's pools in index order
(kbpc.reference.dsa_indexer.index_order_selection), with one bitmap pass per 32768 pools, so
the cases reach past one pass; a crowded case (thousands of pools tied at the top score, so the
candidates fill most of the rank slots) at the 524288-token cache's 131072 pools. The fast MLA decode's bound
does not depend on the list's order (tests/gpu/test_gpu_mla_decode_fast.py runs it on shuffled
lists of the visible tokens, the shape of this list)."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import dsa_indexer as lower_dsa
from kbpc.ir.state import INDEX_SELECT_BIN_BITS, INDEX_SELECT_FILTER_CAP
from kbpc.reference import dsa_indexer as dsa
from kbpc.reference.dsa_index_cache import quantize_pool_keys

pytestmark = pytest.mark.gpu
F32 = np.float32
KP = 4
FORMS = {"mma": dict(fp8=False, mma=True), "qrot": dict(fp8=True, qrot=True)}   # what `fast` lowers


def instances():
    """The instances this module launches (tests/nvcc/test_gpu_test_instances.py builds them)."""
    return [lower_dsa.select_instance(h, d, KP, topk, order_free=free, **FORMS[form])
            for h, d, topk in ((32, 128, 512), (7, 32, 3)) for form in FORMS for free in (False, True)]


def _launch(form, order_free, h, d, topk, n_tokens, grid, keys, q, raw):
    """One select launch on fresh scratch: (scores (capacity,) with NaN where unwritten, tokens,
    whether the histogram and the counter came back zero)."""
    from kbpc.testing import gpu
    from kbpc.testing.launchers import launcher
    geo = dsa.IndexerGeometry(head_dim=d, heads=h, pool=KP, topk_tokens=topk * KP)
    run = launcher(lower_dsa.select_instance(h, d, KP, topk, order_free=order_free, **FORMS[form]))
    if form == "qrot":
        codes, scales = quantize_pool_keys(keys)
        pools = (None, gpu.to_gpu(codes), gpu.to_gpu(scales))
    else:
        pools = (gpu.to_gpu(keys), None, None)
    scores = gpu.poisoned((keys.shape[0],), np.float32)
    toks = gpu.poisoned((geo.selection_width,), np.int32)
    hist = gpu.to_gpu(np.zeros(1 << INDEX_SELECT_BIN_BITS, np.uint32))
    arrive = gpu.to_gpu(np.zeros(2, np.uint32))
    cand = gpu.to_gpu(np.zeros(INDEX_SELECT_FILTER_CAP, np.uint64))
    run((grid, 1, 1), (lower_dsa.SELECT_THREADS, 1, 1), gpu.to_gpu(q), gpu.to_gpu(raw), *pools,
        gpu.to_gpu(np.array([n_tokens], np.int32)), gpu.to_gpu(np.array([n_tokens - 1], np.int32)),
        scores, hist, arrive, cand, toks)
    clean = not hist.get().any() and not arrive.get().any()
    return geo, gpu.fetch(scores, allow_nan=True), gpu.fetch(toks, "tokens"), clean


def _inputs(rng, h, d, n_tokens):
    cap = n_tokens // KP + 3
    return (rng.normal(size=(cap, d)).astype(F32), rng.normal(size=(h, d)).astype(F32),
            rng.normal(size=h).astype(F32))


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("h,d,topk,n_tokens,grid", [
    (32, 128, 512, 1, 132), (32, 128, 512, 4 * 256 + 3, 132), (32, 128, 512, 4 * 512, 132),
    (32, 128, 512, 4 * 512 + 3, 132), (7, 32, 3, 5, 2), (7, 32, 3, 4 * 3 + 2, 1)])
def test_every_pool_selected_is_listed_unranked_without_scores(form, h, d, topk, n_tokens, grid):
    """Contexts up to the top k (the seed's 1k, exactly 2048 tokens, 2048 + a tail): the index-order
    list, nothing read or scored."""
    rng = np.random.default_rng()
    geo, scores, toks, clean = _launch(form, True, h, d, topk, n_tokens, grid, *_inputs(rng, h, d, n_tokens))
    want = dsa.order_free_selection(geo, n_tokens, n_tokens - 1)
    assert want is not None
    np.testing.assert_array_equal(toks, want)
    assert np.all(np.isnan(scores)), "the unranked list must not score"
    assert clean, "scratch touched"


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("h,d,topk,n_tokens,grid", [
    (32, 128, 512, 4 * 513, 132), (32, 128, 512, 4 * 4096 + 3, 132), (32, 128, 512, 4 * 40000 + 1, 132),
    (7, 32, 3, 4 * 4, 1), (7, 32, 3, 4 * 77 + 1, 2), (7, 32, 3, 4 * 33000 + 2, 3)])
def test_past_the_top_k_the_set_is_listed_in_index_order(form, h, d, topk, n_tokens, grid):
    """One pool more than the top k and beyond (past 32768 pools: two bitmap passes): the ranked
    form's scores bit for bit, and its pools in index order."""
    rng = np.random.default_rng()
    inputs = _inputs(rng, h, d, n_tokens)
    geo, s0, t0, clean0 = _launch(form, False, h, d, topk, n_tokens, grid, *inputs)
    _, s1, t1, clean1 = _launch(form, True, h, d, topk, n_tokens, grid, *inputs)
    assert dsa.order_free_selection(geo, n_tokens, n_tokens - 1) is None
    np.testing.assert_array_equal(s1.view(np.uint32), s0.view(np.uint32))
    k = dsa.topk_count(geo, n_tokens, n_tokens - 1)
    ranked_pools = t0[:k * KP:KP] // KP
    np.testing.assert_array_equal(t1, dsa.index_order_selection(geo, ranked_pools, n_tokens, n_tokens - 1))
    assert clean0 and clean1, "scratch not returned to zero"


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("h,d,topk,tied", [(32, 128, 512, 1500), (32, 128, 512, 3000), (7, 32, 3, 3000)])
def test_a_crowded_top_bin_is_listed_in_index_order(form, h, d, topk, tied):
    """131072 pools, `tied` of them (at random places) with one key that outscores every other
    pool: the threshold bin holds them all, so the select gathers `tied` candidates (1500 leaves
    room for one bitmap of every pool beside them, 3000 does not). The ranked form breaks the ties
    to the lower pool index; the flag lists the same set in index order, with the same scores."""
    rng = np.random.default_rng()
    n_tokens = 4 * 131072 + 1
    keys, q, raw = _inputs(rng, h, d, n_tokens)
    raw = np.abs(raw) + F32(0.5)                      # every head counts for the tied key
    keys *= F32(0.01)                                 # every other pool scores near zero
    top = q.sum(axis=0) / np.linalg.norm(q.sum(axis=0)) * F32(4)
    where = rng.choice(n_tokens // KP, size=tied, replace=False)
    keys[where] = top.astype(F32)
    inputs = (keys, q, raw)
    geo, s0, t0, clean0 = _launch(form, False, h, d, topk, n_tokens, 132, *inputs)
    _, s1, t1, clean1 = _launch(form, True, h, d, topk, n_tokens, 132, *inputs)
    valid = s0[:dsa.valid_pools(geo, n_tokens, n_tokens - 1)]
    assert np.count_nonzero(valid == valid.max()) == tied, "the premise: the tied pools share the top score"
    np.testing.assert_array_equal(s1.view(np.uint32), s0.view(np.uint32))
    k = dsa.topk_count(geo, n_tokens, n_tokens - 1)
    ranked_pools = t0[:k * KP:KP] // KP
    np.testing.assert_array_equal(np.sort(ranked_pools), np.sort(where)[:k])   # ties go to the lower index
    np.testing.assert_array_equal(t1, dsa.index_order_selection(geo, ranked_pools, n_tokens, n_tokens - 1))
    assert clean0 and clean1, "scratch not returned to zero"
