"""The bound of the select's tensor-core form (dsa_indexer.bf16_score_bound) against a model of the
kernel (kernels/dsa_index_score_mma.cuh, MMA): queries and pool keys rounded to BF16 (RNE), each
16-channel k step summed exactly and added to the FP32 accumulator with one rounding, x =
fl(acc fl(1/sqrtf(D))), each lane adding w_h relu(x) of its heads 2c, 2c + 1 of every group of 8 by
FMA, then the quad's sums (xor 1, then 2). The GPU test checks the kernel itself
(tests/gpu/test_gpu_dsa_mma.py); this one checks the derivation on the CPU, including keys and
queries over a wide range of scales, and that the bound is not vacuous."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kbpc.reference import dsa_indexer as dsa
from kbpc.testing.dsa_select import spread_inputs

F32 = np.float32


def _bf16(x) -> np.ndarray:
    return np.asarray(x, F32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _fast_scores(geo, q, raw_w, keys) -> np.ndarray:
    d, heads = geo.head_dim, geo.heads
    nt = -(-heads // 8)
    qh = np.zeros((8 * nt, d))
    qh[:heads] = _bf16(q)
    kh = _bf16(keys)                                                          # (n, D)
    acc = np.zeros((keys.shape[0], 8 * nt), F32)
    for s in range(d // 16):   # one k step: exact products and sum, one rounding into the accumulator
        part = kh[:, 16 * s:16 * s + 16] @ qh[:, 16 * s:16 * s + 16].T
        acc = (acc.astype(np.float64) + part).astype(F32)
    c_d = (F32(1) / np.sqrt(F32(d))).astype(F32)
    x = (acc * c_d).astype(F32)
    r = np.where(x > 0, x, F32(0)).astype(F32)
    w = np.zeros(8 * nt, F32)
    w[:heads] = dsa.head_weights(raw_w, heads)
    lanes = np.zeros((keys.shape[0], 4), F32)   # lane c of the quad
    for t in range(nt):
        for c in range(4):
            for h in (8 * t + 2 * c, 8 * t + 2 * c + 1):   # FMA: one rounding of the exact w r + s
                lanes[:, c] = (w[h].astype(np.float64) * r[:, h] + lanes[:, c]).astype(F32)
    pair = (lanes + lanes[:, [1, 0, 3, 2]]).astype(F32)   # xor 1
    return (pair + pair[:, [2, 3, 0, 1]]).astype(F32)[:, 0]   # xor 2


@pytest.mark.parametrize("heads,d", [(32, 128), (4, 64), (7, 32), (1, 128), (48, 64)])
@pytest.mark.parametrize("spread", [0.0, 6.0])
def test_model_within_bound(heads, d, spread):
    n = 3000
    geo, keys, q, raw = spread_inputs(np.random.default_rng(), heads, d, n, spread)
    ref = dsa.index_scores(geo, q, raw, keys, seq_len=4 * n, tau=4 * n - 1)
    fast = _fast_scores(geo, q, raw, keys)
    bound = dsa.bf16_score_bound(geo, q, raw, keys)
    err = np.abs(fast.astype(np.float64) - ref)
    assert np.all(err <= bound), float(np.max(err / bound))
    assert np.any(fast != ref), "BF16 operands should move some scores"
    # A worst-case bound over random signs: the model's largest error uses a fair part of it.
    assert np.max(err / bound) > 1e-2, "the bound is far looser than the model's error"


def test_bound_is_about_two_bf16_roundings_of_the_magnitudes():
    """At the seed's sizes: 2^-7 (two operand roundings) plus the accumulation allowance of
    sum_h |w_h| c_d sum_d |q_d k_d|."""
    rng = np.random.default_rng(0)
    geo = dsa.IndexerGeometry(head_dim=128, heads=32, pool=4, topk_tokens=2048)
    keys, q, raw = (rng.normal(size=(500, 128)).astype(F32), rng.normal(size=(32, 128)).astype(F32),
                    rng.normal(size=32).astype(F32))
    w = np.abs(dsa.head_weights(raw, 32).astype(np.float64))
    mag = (np.abs(keys.astype(np.float64)) @ np.abs(q.astype(np.float64)).T) @ w / np.sqrt(128)
    rel = dsa.bf16_score_bound(geo, q, raw, keys) / mag
    assert 2.0 ** -7 < rel.min() and rel.max() < 1.2 * 2.0 ** -7, (rel.min(), rel.max())


def test_flushed_subnormals_stay_within_bound():
    """Keys below BF16's normal range: a tensor core that flushes them reads zeros."""
    rng = np.random.default_rng(1)
    geo = dsa.IndexerGeometry(head_dim=32, heads=8, pool=4, topk_tokens=64)
    keys = (rng.normal(size=(200, 32)) * 2.0 ** -127).astype(F32)
    q, raw = rng.normal(size=(8, 32)).astype(F32) * F32(4), rng.normal(size=8).astype(F32)
    ref = dsa.index_scores(geo, q, raw, keys, seq_len=800, tau=799)
    bound = dsa.bf16_score_bound(geo, q, raw, keys)
    assert np.all(np.abs(ref.astype(np.float64)) <= bound), "a flushed tile (scores 0) must be within the bound"
