"""The fused hyper-connection forms of kbpc.reference.glm_mhc are their unfused chains: a boundary is
the post-mix then the next pre-mix + norm, the first site the expand then the pre-mix, the head the
stream mean then the final RMSNorm (checked here against float64, the kernels bit for bit on the GPU)."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.reference import glm_mhc as MHC
from kbpc.reference.formats import to_bf16
from kbpc.reference.rms_norm import rms_norm

F32 = np.float32
KW = dict(eps_n=1e-6, eps_hc=1e-6, eps=1e-5, iters=20)


def _site(rng, n, d):
    phi = to_bf16((rng.standard_normal(((2 + n) * n, n * d)) * 0.02).astype(F32))
    alpha = rng.uniform(0.5, 2.0, 3).astype(F32)
    beta = rng.uniform(-1, 1, (2 + n) * n).astype(F32)
    return phi, alpha, beta, to_bf16((1 + 0.1 * rng.standard_normal(d)).astype(F32))


@pytest.mark.parametrize("n,d,ranks", [(4, 512, 1), (3, 100, 2)])
def test_boundary_is_post_then_pre(n, d, ranks):
    rng = np.random.default_rng(n * d)
    x = rng.standard_normal((2, n, d)).astype(F32)
    parts = to_bf16(rng.standard_normal((ranks, 2, d)).astype(F32))
    post = rng.uniform(0, 2, (2, n)).astype(F32)
    comb = rng.dirichlet(np.ones(n), (2, n)).astype(F32)
    site = _site(rng, n, d)
    streams, pm = MHC.hc_boundary(x, parts, post, comb, *site, **KW)
    want = MHC.hc_post(x, MHC.hc_rank_sum(parts), post, comb)
    np.testing.assert_array_equal(streams, want)
    ref = MHC.hc_pre_norm(want, *site, **KW)
    for got, exp in zip(pm, ref):
        np.testing.assert_array_equal(got, exp)


def test_expand_pre_norm_starts_from_the_embedding():
    rng = np.random.default_rng(7)
    n, d = 4, 256
    h = to_bf16(rng.standard_normal((1, d)).astype(F32))
    site = _site(rng, n, d)
    streams, pm = MHC.hc_expand_pre_norm(h, n, *site, **KW)
    assert streams.shape == (1, n, d) and all(np.array_equal(streams[:, i], h) for i in range(n))
    for got, exp in zip(pm, MHC.hc_pre_norm(streams, *site, **KW)):
        np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("weight", ["one_plus", "plain"])
def test_head_norm_matches_float64(weight):
    rng = np.random.default_rng(11)
    n, d = 4, 4096
    x = (rng.standard_normal((2, n, d)) * 3).astype(F32)
    gamma = to_bf16((0.1 * rng.standard_normal(d)).astype(F32))
    head, normed = MHC.hc_head_norm(x, gamma, 1e-5, weight)
    np.testing.assert_array_equal(head, MHC.hc_head(x))
    np.testing.assert_array_equal(normed, rms_norm(head, gamma, 1e-5, weight))
    h64 = head.astype(np.float64)
    w64 = gamma.astype(np.float64) + (1.0 if weight == "one_plus" else 0.0)
    y64 = h64 / np.sqrt(np.mean(h64 * h64, -1, keepdims=True) + 1e-5) * w64
    # one BF16 rounding of the output (2^-8 relative) plus a few FP32 ulps before it
    np.testing.assert_array_less(np.abs(normed - y64), 2.0 ** -8 * np.abs(y64) + 1e-30 + 1e-6 * np.abs(y64))
