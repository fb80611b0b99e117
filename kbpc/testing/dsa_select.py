"""Inputs and checks of the bounded (numerics `fast`) forms of dsa_index_select, shared by their
bound tests (tests/reference/test_ref_dsa_rotated_bound.py, test_ref_dsa_bf16_bound.py) and GPU
tests (tests/gpu/test_gpu_dsa_fast.py, test_gpu_dsa_mma.py)."""
from __future__ import annotations

import numpy as np

from kbpc.reference import dsa_indexer as dsa


def spread_inputs(rng, heads: int, d: int, n: int, spread: float):
    """(geo, keys (n, d), q (heads, d), raw (heads,)) float32, normal with per-row scales e^N(0, spread)
    for the keys and e^N(0, spread / 2) for the queries (spread 0: unit scales)."""
    geo = dsa.IndexerGeometry(head_dim=d, heads=heads, pool=4, topk_tokens=64)
    keys = (rng.normal(size=(n, d)) * np.exp(rng.normal(0, spread, (n, 1)))).astype(np.float32)
    q = (rng.normal(size=(heads, d)) * np.exp(rng.normal(0, spread / 2, (heads, 1)))).astype(np.float32)
    return geo, keys, q, rng.normal(size=heads).astype(np.float32)


def check_bounded_select(geo, got, ref, bound, tokens, k: int, n_tokens: int, tau: int) -> bool:
    """got: the kernel's scores of the n valid pools; ref, bound: the reference's scores and the
    form's bound per pool; tokens: the kernel's selection. Asserts that every score is within its
    bound, that the selection is exactly the top k of the kernel's own scores (ties to the lower
    pool), and that every selected pool's reference score plus its bound is at least every
    unselected pool's minus its bound. Where the reference's k-th and (k+1)-th scores differ by
    more than twice the largest bound, also that the selected set is the reference's; returns
    whether that comparison ran."""
    n = got.shape[0]
    err = np.abs(got.astype(np.float64) - ref)
    if n:
        worst = int(np.argmax(err - bound))
        assert np.all(err <= bound), f"pool {worst}: |{got[worst]} - {ref[worst]}| > {bound[worst]}"
    picked = dsa.top_pools(got, k)
    np.testing.assert_array_equal(tokens, dsa.expand_selection(geo, picked, n_tokens, tau))
    if not 0 < k < n:
        return False
    inside = np.zeros(n, bool)
    inside[picked] = True
    assert np.min(ref[inside] + bound[inside]) >= np.max(ref[~inside] - bound[~inside])
    order = dsa.top_pools(ref, k + 1)
    if ref[order[k - 1]] - ref[order[k]] <= 2 * bound.max():
        return False
    assert set(picked.tolist()) == set(order[:k].tolist())
    return True
