"""Reference families glm_mhc, glm_router_topk, glm_swiglu_clamp, glm_moe_combine, embed_copy,
argmax_host, rms_norm, layer_norm (and the f32ops reductions they use).

Each function is checked against a float64 evaluation of the same formula. Tolerances come from
the rounding points: an FP32 sum of n terms in the fixed orders here is within (n + 16) 2^-24 of
the sum of absolute values; a BF16 store adds at most half a BF16 ulp, 2^-8 of the magnitude.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kbpc.reference import argmax_host as AH
from kbpc.reference import embed_copy as EC
from kbpc.reference import glm_mhc as MHC
from kbpc.reference import glm_moe_combine as MC
from kbpc.reference import glm_router_topk as RT
from kbpc.reference import glm_swiglu_clamp as SW
from kbpc.reference import layer_norm as LN
from kbpc.reference import rms_norm as RN
from kbpc.reference.f32ops import (exp_f32, rsqrt_f32, strided_tree_sum, sum_pow2_tree,
                                   warp_block_sum)
from kbpc.reference.formats import bf16_bits, to_bf16

F32 = np.float32
U = 2.0 ** -24  # FP32 unit roundoff
HALF_BF16 = 2.0 ** -8  # half a BF16 ulp, relative
SETTINGS = settings(max_examples=20, deadline=None)
seeds = st.integers(0, 2**32 - 1)


def assert_within(ref, exact, bound):
    ref = np.asarray(ref, np.float64)
    err = np.abs(ref - exact)
    bad = ~(err <= bound)
    assert not bad.any(), f"max excess {np.max(err - bound)} at {np.argwhere(bad)[:3].tolist()}"


def assert_bf16_near(ref, exact, fp32_err):
    """ref = rn_bf16(y32) with |y32 - exact| <= fp32_err."""
    assert np.array_equal(to_bf16(ref), ref), "output is not BF16-valued"
    assert_within(ref, exact, HALF_BF16 * (np.abs(exact) + fp32_err) + fp32_err)


def bf16_normal(rng, shape, scale=1.0):
    return to_bf16(rng.standard_normal(shape) * scale)


# ------------------------------------------------------------------ f32ops

def test_strided_tree_sum_is_threads_then_halving_tree():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1000).astype(F32)
    threads = 64
    part = [F32(0)] * threads
    for i, v in enumerate(x):  # thread t sums t, t+64, ... from +0.0
        part[i % threads] = F32(part[i % threads] + v)
    while len(part) > 1:
        h = len(part) // 2
        part = [F32(part[i] + part[i + h]) for i in range(h)]
    assert strided_tree_sum(x, threads=threads) == part[0]
    assert sum_pow2_tree(x[:3]) == F32(F32(x[0] + x[2]) + x[1])


def test_warp_block_sum_is_butterfly_then_warp_sums():
    rng = np.random.default_rng(2)
    p = rng.standard_normal(96).astype(F32)

    def butterfly(lanes):
        lanes = list(lanes)
        off = 16
        while off:
            lanes = [F32(lanes[i] + lanes[i ^ off]) for i in range(32)]
            off //= 2
        assert len(set(lanes)) == 1  # every lane agrees
        return lanes[0]

    warps = [butterfly(p[32 * w:32 * w + 32]) for w in range(3)]
    assert warp_block_sum(p) == butterfly(warps + [F32(0)] * 29)


def test_exp_and_rsqrt_are_correctly_rounded():
    x = np.linspace(-80, 80, 2001).astype(F32)
    e64 = np.exp(x.astype(np.float64))
    assert_within(exp_f32(x), e64, np.spacing(exp_f32(x)).astype(np.float64) * 0.5)
    y = np.abs(x) + F32(1e-3)
    r64 = 1 / np.sqrt(y.astype(np.float64))
    assert_within(rsqrt_f32(y), r64, np.spacing(rsqrt_f32(y)).astype(np.float64) * 0.5)


# ------------------------------------------------------------------ glm_mhc

def mhc_params(rng, n, d):
    phi = bf16_normal(rng, ((2 + n) * n, n * d), 0.02)
    alpha = rng.uniform(0.5, 2.0, 3).astype(F32)
    beta = rng.uniform(-1, 1, (2 + n) * n).astype(F32)
    gamma = bf16_normal(rng, d, 1.0)
    return phi, alpha, beta, gamma


def mix_f64(x, phi, eps_n):
    x = x.astype(np.float64)
    flat = x.reshape(x.shape[:-2] + (-1,))
    r = 1 / np.sqrt(np.mean(flat * flat, -1) + eps_n)
    return r[..., None] * (flat @ phi.astype(np.float64).T), r


def gates_f64(mu, alpha, beta, n, eps_hc, iters):
    z = np.repeat(alpha.astype(np.float64), [n, n, n * n]) * mu + beta
    sig = lambda t: 1 / (1 + np.exp(-t))  # noqa: E731
    lg = z[..., 2 * n:].reshape(z.shape[:-1] + (n, n))
    c = np.exp(lg - lg.max(-1, keepdims=True))
    c = c / c.sum(-1, keepdims=True) + eps_hc
    for it in range(iters):
        if it:
            c = c / (eps_hc + c.sum(-1, keepdims=True))
        c = c / (eps_hc + c.sum(-2, keepdims=True))
    return sig(z[..., :n]) + eps_hc, 2 * sig(z[..., n:2 * n]), c


@SETTINGS
@given(seed=seeds, n=st.integers(1, 4), d=st.sampled_from([32, 200, 512, 1000]))
def test_mhc_pre_norm_matches_float64(seed, n, d):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, n, d)).astype(F32) * F32(rng.uniform(0.1, 10))
    phi, alpha, beta, gamma = mhc_params(rng, n, d)
    eps_n, eps_hc, eps, iters = 1e-6, 1e-6, 1e-5, 20
    mu = MHC.hc_mix(x, phi, eps_n)
    mu64, r64 = mix_f64(x, phi, eps_n)
    dot_abs = np.abs(x.reshape(2, -1)).astype(np.float64) @ np.abs(phi.astype(np.float64)).T
    assert_within(mu, mu64, (n * d // 256 + 24) * U * r64[:, None] * dot_abs)
    # gates and comb from the reference's own mu, against float64 from that same mu
    pre, post, comb = MHC.hc_gates(mu, alpha, beta, n, eps_hc, iters)
    pre64, post64, c64 = gates_f64(mu.astype(np.float64), alpha, beta, n, eps_hc, iters)
    assert_within(pre, pre64, 1e-6)
    assert_within(post, post64, 2e-6)
    assert_within(comb, c64, 2e-5)
    pm = MHC.hc_pre_norm(x, phi, alpha, beta, gamma, eps_n=eps_n, eps_hc=eps_hc, eps=eps,
                         iters=iters)
    np.testing.assert_array_equal(pm.post, post)
    np.testing.assert_array_equal(pm.comb, comb)
    y64 = np.einsum("tn,tnd->td", pre.astype(np.float64), x.astype(np.float64))
    y_abs = np.einsum("tn,tnd->td", pre.astype(np.float64), np.abs(x).astype(np.float64))
    assert_bf16_near(pm.collapsed, y64, 12 * U * y_abs)
    y = pm.collapsed.astype(np.float64)
    yh64 = y / np.sqrt(np.mean(y * y, -1, keepdims=True) + eps) * gamma
    assert_bf16_near(pm.normed, yh64, (d // 256 + 24) * U * np.abs(yh64))


def test_mhc_mix_uses_256_strided_tree():
    rng = np.random.default_rng(3)
    n, d = 2, 300
    x = (rng.standard_normal((n, d)) * 2.0 ** rng.uniform(-8, 8, (n, d))).astype(F32)
    phi, *_ = mhc_params(rng, n, d)
    flat = x.reshape(-1)

    def dot(a, b):
        part = [F32(0)] * 256
        for i in range(a.size):
            part[i % 256] = F32(part[i % 256] + F32(a[i] * b[i]))
        while len(part) > 1:
            h = len(part) // 2
            part = [F32(part[i] + part[i + h]) for i in range(h)]
        return part[0]

    r = rsqrt_f32(F32(F32(dot(flat, flat) / F32(n * d)) + F32(1e-6)))
    want = np.array([F32(dot(flat, phi[m]) * r) for m in range(phi.shape[0])], F32)
    np.testing.assert_array_equal(MHC.hc_mix(x, phi, 1e-6), want)


@SETTINGS
@given(seed=seeds, n=st.integers(2, 6), iters=st.integers(20, 30))
def test_sinkhorn_row_and_column_sums(seed, n, iters):
    rng = np.random.default_rng(seed)
    # softmax rows of logits in [-2, 2] plus eps_hc, as the pre-mix builds C0 (entry ratio <= e^4,
    # for which 20 iterations bring the row sums within 1e-3 of 1; measured worst 1.02e-3)
    lg = rng.uniform(-2, 2, (n, n))
    c0 = (np.exp(lg) / np.exp(lg).sum(1, keepdims=True) + 1e-6).astype(F32)
    c = MHC.sinkhorn(c0, 1e-6, iters)
    assert np.all(c >= 0)
    np.testing.assert_allclose(c.sum(0), 1, atol=1e-5)  # ends on a column pass
    np.testing.assert_allclose(c.sum(1), 1, atol=3e-3)
    # one iteration is a single column pass
    c1 = MHC.sinkhorn(c0, 1e-6, 1)
    np.testing.assert_array_equal(c1, (c0 / (F32(1e-6) + sum_pow2_tree(c0, axis=0))).astype(F32))


def test_mhc_zero_streams():
    rng = np.random.default_rng(4)
    n, d = 4, 256
    phi, alpha, beta, gamma = mhc_params(rng, n, d)
    x = np.zeros((1, n, d), F32)
    pm = MHC.hc_pre_norm(x, phi, alpha, beta, gamma, eps_n=1e-6, eps_hc=1e-6, eps=1e-6, iters=20)
    assert not np.any(pm.collapsed) and not np.any(pm.normed)
    assert np.all(np.isfinite(pm.post)) and np.all(np.isfinite(pm.comb))
    pre64, post64, _ = gates_f64(np.zeros((1, (2 + n) * n)), alpha, beta, n, 1e-6, 20)
    assert_within(pm.post, post64, 2e-6)
    assert not np.any(MHC.hc_post(x, np.zeros((1, d), F32), pm.post, pm.comb))


@SETTINGS
@given(seed=seeds, n=st.integers(1, 4), ranks=st.integers(1, 3))
def test_mhc_post_expand_head_match_float64(seed, n, ranks):
    rng = np.random.default_rng(seed)
    d = 96
    h = bf16_normal(rng, (2, d))
    x = MHC.hc_expand(h, n)
    assert x.shape == (2, n, d) and all(np.array_equal(x[:, i], h) for i in range(n))
    x = (x + rng.standard_normal(x.shape)).astype(F32)
    parts = bf16_normal(rng, (ranks, 2, d))
    u = MHC.hc_rank_sum(parts)
    s64 = parts.astype(np.float64).sum(0)
    assert_bf16_near(u, s64, ranks * U * np.abs(parts).astype(np.float64).sum(0))
    post = rng.uniform(0, 2, (2, n)).astype(F32)
    comb = rng.dirichlet(np.ones(n), (2, n)).astype(F32)
    xp = MHC.hc_post(x, u, post, comb)
    terms = np.einsum("tij,tid->tjd", comb.astype(np.float64), x.astype(np.float64))
    absd = np.einsum("tij,tid->tjd", comb.astype(np.float64), np.abs(x).astype(np.float64))
    gated = post[..., None].astype(np.float64) * u[:, None, :]
    assert_within(xp, gated + terms, 12 * U * (np.abs(gated) + absd))
    y = MHC.hc_head(xp)
    xp64 = xp.astype(np.float64)
    assert_bf16_near(y, xp64.mean(-2), 8 * U * np.abs(xp64).mean(-2))


# ------------------------------------------------------------------ glm_router_topk

def brute_topk(chi_row, k):
    cand = [e for e in range(chi_row.size) if chi_row[e] > -np.inf]  # NaN compares false
    cand.sort(key=lambda e: (-float(chi_row[e]), e))
    ids = cand[:k]
    return ids + [-1] * (k - len(ids))


@SETTINGS
@given(seed=seeds, experts=st.integers(1, 40), k=st.integers(1, 10), ties=st.booleans())
def test_router_topk_matches_brute_force_and_float64(seed, experts, k, ties):
    rng = np.random.default_rng(seed)
    m = 3
    if ties:  # few distinct values: many exact ties
        z = rng.choice(np.array([-1.0, 0.0, 0.5, 2.0], F32), (m, experts))
        b = np.zeros(experts, F32)
    else:
        z = (rng.standard_normal((m, experts)) * 3).astype(F32)
        b = (rng.standard_normal(experts) * 0.1).astype(F32)
    w, ids = RT.router_topk(z, b, k, 2.5)
    assert w.dtype == F32 and ids.dtype == np.int32 and ids.shape == (m, k)
    s = RT.router_scores(z)
    chi = (s + b).astype(F32)
    for t in range(m):
        assert ids[t].tolist() == brute_topk(chi[t], k)
    filled = ids >= 0
    assert np.all(w[~filled] == 0)
    s64 = 1 / (1 + np.exp(-z.astype(np.float64)))
    sel = np.where(filled, np.take_along_axis(s64, np.maximum(ids, 0), -1), 0)
    w64 = 2.5 * sel / (sel.sum(-1, keepdims=True) + 1e-20)
    assert_within(w, w64, (k + 8) * U * np.abs(w64) + 1e-30)
    np.testing.assert_allclose(w.sum(-1), 2.5, rtol=1e-5)


def test_router_ties_go_to_lower_id_and_unfilled_slots():
    z = np.zeros((1, 6), F32)
    w, ids = RT.router_topk(z, np.zeros(6, F32), 3, 1.0)
    assert ids.tolist() == [[0, 1, 2]]
    w, ids = RT.router_topk(z, np.zeros(6, F32), 8, 2.0)  # k > experts
    assert ids.tolist() == [[0, 1, 2, 3, 4, 5, -1, -1]]
    assert w[0, 6:].tolist() == [0, 0] and np.isclose(w.sum(), 2.0)
    bias = np.array([0, -np.inf, 0, 0, 0, 0], F32)  # -inf bias masks expert 1
    z2 = np.array([[0, 5, np.nan, 0, 0, 0]], F32)  # NaN logit is never selected
    w, ids = RT.router_topk(z2, bias, 6, 1.0)
    assert ids.tolist() == [[0, 3, 4, 5, -1, -1]]
    assert np.allclose(w[0, :4], 0.25, rtol=1e-6) and not np.any(w[0, 4:])


# ------------------------------------------------------------------ glm_swiglu_clamp

def swiglu_f64(g, u, lim):
    gh = np.minimum(g.astype(np.float64), lim)
    uh = np.clip(u.astype(np.float64), -lim, lim)
    return gh / (1 + np.exp(-gh)) * uh


@SETTINGS
@given(seed=seeds, width=st.integers(1, 300), lim=st.floats(0.5, 20))
def test_swiglu_clamp_matches_float64(seed, width, lim):
    rng = np.random.default_rng(seed)
    g = bf16_normal(rng, (2, width), 8)
    u = bf16_normal(rng, (2, width), 8)
    want = swiglu_f64(g, u, F32(lim))
    err = 6 * U * np.abs(want) + 1e-37
    y32 = SW.swiglu_clamp(g, u, lim, out="f32")
    assert_within(y32, want, err)
    y = SW.swiglu_clamp(g, u, lim)
    assert_bf16_near(y, want, err)
    np.testing.assert_array_equal(y, to_bf16(y32))
    gu = np.concatenate([g, u], -1)
    clamped = SW.clamp_gate_up(gu, lim)
    np.testing.assert_array_equal(SW.silu_mul(clamped), y)  # the split nodes compose exactly
    np.testing.assert_array_equal(SW.swiglu_clamp_rows(gu, lim), y)
    assert np.all(clamped[:, :width] <= F32(lim)) and np.all(np.abs(clamped[:, width:]) <= F32(lim))


def test_swiglu_clamp_edges():
    g = np.array([np.nan, 100, -100, 0], F32)
    u = np.array([1, np.nan, 1, -100], F32)
    c = SW.clamp_gate_up(np.concatenate([g, u]), 10)
    assert c.tolist() == [10, 10, -100, 0, 1, -10, 1, -10]  # fminf/fmaxf drop NaN
    y = SW.swiglu_clamp(g, u, 10, out="f32")
    assert np.all(np.isfinite(y)) and y[2] == 0
    with pytest.raises(ValueError):
        SW.swiglu_clamp(g, u, 0.0)


# ------------------------------------------------------------------ glm_moe_combine

@SETTINGS
@given(seed=seeds, k=st.integers(1, 9), d=st.integers(1, 64))
def test_moe_combine_matches_float64(seed, k, d):
    rng = np.random.default_rng(seed)
    m = 3
    w = rng.uniform(0, 1, (m, k)).astype(F32)
    ids = rng.integers(-1, 5, (m, k)).astype(np.int32)
    w = np.where(ids >= 0, w, F32(0))
    e = bf16_normal(rng, (m, k, d), 4)
    e[ids < 0] = np.nan  # unfilled slots' rows may hold anything
    sh = bf16_normal(rng, (m, d), 4)
    y = MC.moe_combine(w, e, sh, ids)
    live = (ids >= 0)[..., None]
    terms = np.where(live, w[..., None].astype(np.float64) * e, 0)
    want = terms.sum(1) + sh
    assert_bf16_near(y, want, (k + 3) * U * (np.abs(terms).sum(1) + np.abs(sh)))
    e_ok = np.where(live, e, F32(1))
    np.testing.assert_array_equal(MC.moe_combine(w, e_ok, sh, np.maximum(ids, 0)),
                                  MC.moe_combine(w, e_ok, sh))


def test_moe_combine_slot_order():
    # in slot order 1e8 + 1 - 1e8 loses the 1; any other order would keep it
    w = np.ones((1, 3), F32)
    e = np.array([[[1e8], [1.0], [-1e8]]], F32)
    assert MC.moe_combine(w, e, np.zeros((1, 1), F32))[0, 0] == 0.0


# ------------------------------------------------------------------ embed_copy, argmax_host

@SETTINGS
@given(seed=seeds, vocab=st.integers(1, 50), d=st.integers(1, 40))
def test_embed_copy_is_byte_exact(seed, vocab, d):
    rng = np.random.default_rng(seed)
    table = rng.integers(0, 1 << 16, (vocab, d), dtype=np.uint16)  # NaN and -0 bit patterns too
    tok = rng.integers(0, vocab, 7)
    h = EC.embed_copy(table, tok)
    assert h.dtype == np.uint16 and h.tobytes() == b"".join(table[t].tobytes() for t in tok)
    with pytest.raises(ValueError):
        EC.embed_copy(table, np.array([vocab]))


@SETTINGS
@given(seed=seeds, vocab=st.integers(1, 300), nan=st.booleans())
def test_argmax_first_index_of_max(seed, vocab, nan):
    rng = np.random.default_rng(seed)
    z = to_bf16(rng.integers(-4, 4, vocab).astype(F32))  # many ties
    if nan:
        z[rng.integers(0, vocab, 3)] = np.nan
    bits = bf16_bits(z)
    got = int(AH.argmax_host(bits))
    assert got == AH.argmax_scan(bits) == AH.argmax_scan(z)
    finite = np.where(np.isnan(z), -np.inf, z)
    want = int(np.flatnonzero(finite == finite.max())[0]) if not np.all(np.isnan(z)) else 0
    assert got == want


def test_argmax_all_nan_and_batched():
    assert AH.argmax_host(np.full(5, np.nan, F32)) == 0
    z = np.array([[1, 3, 3], [7, -1, 7]], F32)
    assert AH.argmax_host(z).tolist() == [1, 0]


# ------------------------------------------------------------------ rms_norm, layer_norm

def test_rms_block_rule():
    assert [RN.block_threads(d) for d in (2, 128, 1536, 4096, 8192)] == [32, 64, 768, 1024, 1024]
    with pytest.raises(ValueError):
        RN.block_threads(7)


@pytest.mark.parametrize("threads", [None, 64])
def test_rms_sum_squares_is_pairs_then_butterflies(threads):
    rng = np.random.default_rng(5)
    d = 2 * 1024 + 2 * 70  # with 1024 threads: two rounds for the first 70 threads
    # 64 rows of wide dynamic range, so any other order changes some row's bits
    x = (rng.standard_normal((64, d)) * 2.0 ** rng.uniform(-12, 12, (64, d))).astype(F32)
    b = RN.block_threads(d) if threads is None else threads
    acc = np.zeros((64, b), F32)
    for p in range(d // 2):  # thread p % b, pair by pair: even element, then odd element
        t = p % b
        acc[:, t] = (acc[:, t] + (x[:, 2 * p] * x[:, 2 * p]).astype(F32)).astype(F32)
        acc[:, t] = (acc[:, t] + (x[:, 2 * p + 1] * x[:, 2 * p + 1]).astype(F32)).astype(F32)
    np.testing.assert_array_equal(RN.sum_squares(x, threads), warp_block_sum(acc))


@SETTINGS
@given(seed=seeds, d=st.sampled_from([2, 64, 130, 1536, 4096]), plain=st.booleans())
def test_rms_norm_matches_float64(seed, d, plain):
    rng = np.random.default_rng(seed)
    x = bf16_normal(rng, (3, d), rng.uniform(0.01, 100))
    gamma = bf16_normal(rng, d, 0.5)
    eps = 1e-6
    form = "plain" if plain else "one_plus"
    w = gamma.astype(np.float64) + (0 if plain else 1)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 ** 2, -1, keepdims=True) + eps) * w
    rel = (d // 2 // RN.block_threads(d) * 2 + 24) * U
    assert_bf16_near(RN.rms_norm(x, gamma, eps, form), want, rel * np.abs(want))
    y, res = RN.rms_norm_residual(x, gamma, eps, form)
    assert np.array_equal(res, x) and np.array_equal(y, RN.rms_norm(x, gamma, eps, form))


@SETTINGS
@given(seed=seeds, d=st.sampled_from([64, 200, 1024]))
def test_residual_add_rms_norm(seed, d):
    rng = np.random.default_rng(seed)
    h, s = bf16_normal(rng, (2, d)), bf16_normal(rng, (2, d))
    gamma = bf16_normal(rng, d, 0.5)
    y, h_new, res = RN.residual_add_rms_norm(h, s, gamma, 1e-6, exact=True)
    assert np.array_equal(h_new, to_bf16(h + s)) and np.array_equal(res, h_new)
    y_ref, res_ref = RN.rms_norm_residual(h_new, gamma, 1e-6)
    assert np.array_equal(y, y_ref) and np.array_equal(res, res_ref)
    y2, h2, _ = RN.residual_add_rms_norm(h, s, gamma, 1e-6, exact=False)
    assert np.array_equal(h2, h_new)
    u64 = h.astype(np.float64) + s  # exact in float64
    r64 = 1 / np.sqrt(np.mean(u64 ** 2, -1, keepdims=True) + 1e-6)
    want = h_new * r64 * (1 + gamma.astype(np.float64))
    assert_bf16_near(y2, want, 32 * U * np.abs(want))


def test_rms_norm_zero_row():
    y = RN.rms_norm(np.zeros((1, 64), F32), np.ones(64, F32), 1e-6)
    assert not np.any(y)


@SETTINGS
@given(seed=seeds, d=st.sampled_from([1, 33, 128, 700, 2048]), shift=st.floats(-3, 3))
def test_layer_norm_matches_float64(seed, d, shift):
    rng = np.random.default_rng(seed)
    x = to_bf16(rng.standard_normal((3, d)) + shift)
    gamma, beta = bf16_normal(rng, d), bf16_normal(rng, d)
    eps = 1e-5
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    dev = x64 - mu
    r = 1 / np.sqrt((dev ** 2).mean(-1, keepdims=True) + eps)
    want = dev * r * gamma + beta
    n_err = (d // LN.block_threads(d) + 16) * U
    mu_err = n_err * np.abs(x64).mean(-1, keepdims=True)
    err = (mu_err * r + 2 * n_err * np.abs(dev) * r + 4 * U * np.abs(dev * r)) * np.abs(gamma) \
        + 2 * U * np.abs(want)
    assert_bf16_near(LN.layer_norm(x, gamma, beta, eps), want, err)


def test_layer_norm_constant_row_gives_beta():
    beta = to_bf16(np.linspace(-1, 1, 96))
    y = LN.layer_norm(np.full((1, 96), 1.5, F32), np.ones(96, F32), beta, 1e-5)
    np.testing.assert_array_equal(y[0], beta)



def test_layer_norm_threads_override_is_the_two_pass_order():
    rng = np.random.default_rng(6)
    x = to_bf16(rng.standard_normal((2, 96)) + 4)
    gamma, beta = bf16_normal(rng, 96), bf16_normal(rng, 96)
    mu = (strided_tree_sum(x, threads=32) / F32(96)).astype(F32)[:, None]
    dev = (x - mu).astype(F32)
    var = (strided_tree_sum((dev * dev).astype(F32), threads=32) / F32(96)).astype(F32)
    r = rsqrt_f32((var + F32(1e-5)).astype(F32))[:, None]
    want = to_bf16((((dev * r).astype(F32) * gamma).astype(F32) + beta).astype(F32))
    np.testing.assert_array_equal(LN.layer_norm(x, gamma, beta, 1e-5, threads=32), want)
    assert [LN.block_threads(d) for d in (1, 100, 128, 5000)] == [32, 128, 128, 1024]
