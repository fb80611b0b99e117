"""The bound of the select's rotated-query form (dsa_indexer.rotated_score_bound) against a float32
model of the kernel's order (kernels/dsa_index_select.cuh, QROT): qhat = fl(FWHT(q) fl(1/sqrtf(D)) / D),
lane l sums channels J l .. J l + J - 1 by FMA from its first product, the 32-lane tree, times
sigma, then the reference's relu, weights and head sum. The GPU test checks the kernel itself
(tests/gpu/test_gpu_dsa_fast.py); this one checks the derivation on the CPU, including keys with
a wide range of scales, and that the bound is not vacuous (the model's error uses some of it)."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.reference import dsa_indexer as dsa
from kbpc.reference.dsa_index_cache import dequantize_pool_keys, fwht, quantize_pool_keys
from kbpc.reference.formats import e4m3_decode
from kbpc.reference.fp32 import seq_sum, tree_sum
from kbpc.testing.dsa_select import spread_inputs

F32 = np.float32


def _fast_scores(geo, q, raw_w, codes, sigma) -> np.ndarray:
    d = geo.head_dim
    j = d // 32
    c0 = (F32(1) / np.sqrt(F32(d))).astype(F32) / F32(d)
    qhat = (fwht(q) * c0).astype(F32)                                          # (H, D)
    c = e4m3_decode(codes).astype(F32)                                         # (n, D)
    qb, cb = qhat.reshape(geo.heads, 32, j), c.reshape(-1, 1, 32, j)           # lane l: channels J l + i
    acc = (qb[None, :, :, 0] * cb[..., 0]).astype(F32)                          # (n, H, 32)
    for i in range(1, j):   # an FMA rounds once: the float64 product is exact, one rounding to f32
        acc = (qb[None, :, :, i].astype(np.float64) * cb[..., i] + acc).astype(F32)
    x = (tree_sum(acc, axis=-1) * np.asarray(sigma, F32)[:, None]).astype(F32)
    relu = np.where(x > 0, x, F32(0)).astype(F32)
    terms = (dsa.head_weights(raw_w, geo.heads)[None, :] * relu).astype(F32)
    return seq_sum(terms, axis=-1, start=F32(0))


@pytest.mark.parametrize("heads,d", [(32, 128), (4, 64), (7, 32), (1, 128)])
@pytest.mark.parametrize("spread", [0.0, 6.0])
def test_model_within_bound(heads, d, spread):
    n = 3000
    geo, keys, q, raw = spread_inputs(np.random.default_rng(), heads, d, n, spread)
    codes, sigma = quantize_pool_keys(keys)
    ref = dsa.index_scores(geo, q, raw, dequantize_pool_keys(codes, sigma), seq_len=4 * n, tau=4 * n - 1)
    fast = _fast_scores(geo, q, raw, codes, sigma)
    bound = dsa.rotated_score_bound(geo, q, raw, codes, sigma)
    err = np.abs(fast.astype(np.float64) - ref)
    assert np.all(err <= bound), float(np.max(err / bound))
    assert np.any(fast != ref), "the two orders should round differently somewhere"
    # A worst-case bound: the model's largest error is ~1e-3 of it at the seed's sizes (random signs).
    assert np.max(err / bound) > 1e-4, "the bound is far looser than the model's error"


def test_bound_is_small_relative_to_the_magnitudes():
    """At the seed's sizes on incoherent keys: ~250 u of sum_h |w_h| c_d sum_d |q_d ktilde_d|."""
    rng = np.random.default_rng(0)
    geo = dsa.IndexerGeometry(head_dim=128, heads=32, pool=4, topk_tokens=2048)
    keys, q, raw = (rng.normal(size=(500, 128)).astype(F32), rng.normal(size=(32, 128)).astype(F32),
                    rng.normal(size=32).astype(F32))
    codes, sigma = quantize_pool_keys(keys)
    kt = np.abs(dequantize_pool_keys(codes, sigma).astype(np.float64))
    w = np.abs(dsa.head_weights(raw, 32).astype(np.float64))
    mag = (kt @ np.abs(q.astype(np.float64)).T) @ w / np.sqrt(128)
    rel = dsa.rotated_score_bound(geo, q, raw, codes, sigma) / mag / 2.0 ** -24
    assert 100 < rel.min() and rel.max() < 400, (rel.min(), rel.max())
