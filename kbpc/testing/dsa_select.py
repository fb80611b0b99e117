"""Checks of a bounded (numerics `fast`) form of dsa_index_select against the reference, shared by
the GPU tests of the rotated-query and the tensor-core forms (tests/gpu/test_gpu_dsa_fast.py,
test_gpu_dsa_mma.py)."""
from __future__ import annotations

import numpy as np

from kbpc.reference import dsa_indexer as dsa


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
