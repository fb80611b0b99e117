"""Projection families: bit-exact against straightforward per-thread loops written from the
docstring orders, within rounding-derived bounds of a float64 evaluation, and invariants (zero
rows, saturation, zero groups, segments, slot forms, -1 slots, shape errors)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbpc.reference import formats as F
from kbpc.reference.dense_bf16 import dense_gemm_bf16, dense_gemv_bf16
from kbpc.reference.fp32 import fma_f32, tree_sum
from kbpc.reference.kda_gates_w8a8 import kda_gates_w8a8
from kbpc.reference.w4a16_gemv import (
    qg_permutation, silu_input, w4a16_gemv, w4a16_gemv_qg, w4a16_gemv_segments,
    w4a16_gemv_silu_input,
)
from kbpc.reference.w4a4_mx import w4a4_gemv, w4a4_moe_slots, w4a4_mx
from kbpc.reference.w4a4_mx_static import w4a4_mx_static, w4a4_static_moe_slots
from kbpc.reference.w8a8_act_quant import quant_g128, quant_row, quant_silu_g128, silu_mul_bf16
from kbpc.reference.wxay import wxay_blk128, wxay_rowscale, wxay_split

F32 = np.float32
U32 = 2.0**-24
SETTINGS = settings(max_examples=12, deadline=None)
seeds = st.integers(0, 2**31)


def bf16_rows(r, shape, scale=1.0):
    return F.to_bf16(r.standard_normal(shape) * scale)


def assert_bf16_close(y, exact, err):
    """|y - exact| <= err + half a BF16 ulp of (|exact| + err): f32 error, then one rn_bf16."""
    tol = err + (np.abs(exact) + err) * 2.0**-8 + 1e-37
    assert (np.abs(y.astype(np.float64) - exact) <= tol).all(), np.abs(y - exact).max()


def two_warps(acc):
    return F32(tree_sum(acc[:32]) + tree_sum(acc[32:]))


def nvfp4_weight(r, n, k):
    return F.quantize_nvfp4(r.standard_normal((n, k)).astype(F32))


# ---------------------------------------------------------------- dense_bf16

def naive_dense(x, w):
    k = x.shape[0]
    acc = np.zeros(64, F32)
    for v in range(k // 8):
        for i in range(8):
            acc[v % 64] = F32(acc[v % 64] + F32(x[8 * v + i] * w[8 * v + i]))
    return two_warps(acc)


@SETTINGS
@given(seeds, st.integers(1, 3), st.integers(1, 6), st.integers(1, 140).map(lambda v: 8 * v))
def test_dense_gemv(seed, m, n, k):
    r = np.random.default_rng(seed)
    x, w = bf16_rows(r, (m, k)), bf16_rows(r, (n, k))
    y32 = dense_gemv_bf16(x, w, out_dtype="f32")
    naive = np.array([[naive_dense(x[t], w[j]) for j in range(n)] for t in range(m)])
    assert np.array_equal(y32, naive)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    err = (k / 64 + 10) * U32 * (np.abs(x) @ np.abs(w).T)
    assert_bf16_close(dense_gemv_bf16(x, w), exact, err)
    assert_bf16_close(dense_gemm_bf16(x, w), exact, (k + 1) * U32 * (np.abs(x) @ np.abs(w).T))
    assert np.array_equal(dense_gemv_bf16(x, w)[-1:], dense_gemv_bf16(x[-1:], w))  # row-invariant
    assert not dense_gemv_bf16(np.zeros((1, k), F32), w).any()
    with pytest.raises(ValueError):
        dense_gemv_bf16(x[:, :-1], w[:, :-1]) if k > 8 else dense_gemv_bf16(x[:, :4], w[:, :4])


# ---------------------------------------------------------------- w4a16_gemv

def naive_w4a16(x, q, s, walk):
    k = x.shape[0]
    acc = np.zeros(64, F32)
    if walk == "chunk16":
        for j in range(k // 16):
            c = F32(0)
            for i in range(16):
                c = fma_f32(q[16 * j + i], x[16 * j + i], c)
            acc[j % 64] = fma_f32(c, s[j], acc[j % 64])
    else:
        wv = (q * np.repeat(s, 16)).astype(F32)
        for v in range(k // 8):
            for i in range(8):
                acc[v % 64] = fma_f32(x[8 * v + i], wv[8 * v + i], acc[v % 64])
    return two_warps(acc)


@SETTINGS
@given(seeds, st.integers(1, 2), st.integers(1, 4), st.integers(1, 80).map(lambda g: 16 * g),
       st.sampled_from(["chunk16", "vec8"]))
def test_w4a16(seed, m, n, k, walk):
    r = np.random.default_rng(seed)
    x = bf16_rows(r, (m, k))
    p, s_codes, sg = nvfp4_weight(r, n, k)
    s_codes[:, 0] = 0                                          # an all-zero group
    y = w4a16_gemv(x, p, s_codes, sg, walk=walk)
    q, s = F.nvfp4_group_values(p, s_codes)
    sc = (sg * s).astype(F32)
    naive = np.array([[naive_w4a16(x[t], q[j], sc[j], walk) for j in range(n)] for t in range(m)])
    assert np.array_equal(y, F.to_bf16(naive))
    wd = (np.repeat(sc, 16, axis=1).astype(np.float64) * q)
    exact = x.astype(np.float64) @ wd.T
    assert_bf16_close(y, exact, (k / 64 + 20) * 2 * U32 * (np.abs(x) @ np.abs(wd).T))
    segs = w4a16_gemv_segments(x, [(p, s_codes, sg), (p[::-1], s_codes[::-1], sg * 2)], walk)
    assert np.array_equal(segs[0], y)
    assert np.array_equal(segs[1], w4a16_gemv(x, p[::-1], s_codes[::-1], sg * 2, walk=walk))


@SETTINGS
@given(seeds, st.integers(1, 40).map(lambda g: 16 * g))
def test_w4a16_silu_input(seed, k):
    r = np.random.default_rng(seed)
    g, u = bf16_rows(r, (1, k), 3), bf16_rows(r, (1, k))
    p, s_codes, sg = nvfp4_weight(r, 3, k)
    xs = silu_input(g, u)
    g64 = g.astype(np.float64)
    assert np.allclose(xs, g64 / (1 + np.exp(-g64)) * u, rtol=4 * U32, atol=1e-30)
    y = w4a16_gemv_silu_input(g, u, p, s_codes, sg)
    q, s = F.nvfp4_group_values(p, s_codes)
    sc = (sg * s).astype(F32)
    assert np.array_equal(y[0], F.to_bf16([naive_w4a16(xs[0], q[j], sc[j], "vec8")
                                           for j in range(3)]))


def test_qg_permutation():
    heads, d = 3, 4
    pi = qg_permutation(heads, d)
    assert sorted(pi) == list(range(2 * heads * d))
    assert pi[d] == heads * d and pi[2 * d] == d               # head 0 gate, head 1 q
    r = np.random.default_rng(0)
    x = bf16_rows(r, (1, 32))
    p, s, sg = nvfp4_weight(r, 2 * heads * d, 32)
    y = w4a16_gemv(x, p, s, sg, walk="vec8")
    assert np.array_equal(w4a16_gemv_qg(x, p, s, sg, heads, d)[:, pi], y)


# ---------------------------------------------------------------- w4a4_mx / w4a4_mx_static

def naive_chunk_chain(av, wv):
    """av (K,), wv (K,) float64 values; per-chunk float64 sums (exact here), warp chains."""
    k = av.shape[0]
    acc = np.zeros(8, F32)
    for c in range(k // 128):
        sc = float(np.dot(av[128 * c:128 * c + 128], wv[128 * c:128 * c + 128]))
        acc[c % 8] = F32(float(acc[c % 8]) + sc)   # exact float64 sum at these magnitudes
    tot = F32(0)
    for w in range(8):
        tot = F32(tot + acc[w]) if w else acc[0]
    return tot


def nvfp4_scaled(p, s):
    q, sd = F.nvfp4_group_values(p, s)
    return q.astype(np.float64) * np.repeat(sd, 16, axis=-1)


@SETTINGS
@given(seeds, st.integers(1, 3), st.integers(1, 4), st.integers(1, 20).map(lambda c: 128 * c))
def test_w4a4_mx(seed, m, n, k):
    r = np.random.default_rng(seed)
    x = bf16_rows(r, (m, k), 4)
    x[0, :32] = 0
    if m > 1:
        x[1] = 0
    p, s, sg = nvfp4_weight(r, n, k)
    ap, asc, g = F.quantize_nvfp4_rows(x)
    y = w4a4_mx(x, p, s, sg)
    assert np.array_equal(y, w4a4_gemv(ap, asc, g, p, s, sg))
    av, wv = nvfp4_scaled(ap, asc), nvfp4_scaled(p, s)
    scale = (g * F32(sg)).astype(F32)
    naive = np.array([[F32(naive_chunk_chain(av[t], wv[j]) * scale[t]) for j in range(n)]
                      for t in range(m)])
    assert np.array_equal(y, F.to_bf16(naive))
    exact = (av @ wv.T) * g[:, None].astype(np.float64) * float(sg)
    bound = (k / 128 / 8 + 10) * U32 * (np.abs(av) @ np.abs(wv).T) * np.abs(g)[:, None] * sg
    assert_bf16_close(y, exact, bound)
    if m > 1:
        assert not y[1].any()
    assert np.array_equal(y[-1:], w4a4_mx(x[-1:], p, s, sg))
    with pytest.raises(ValueError):
        w4a4_mx(x[:, :k - 64], p[:, :(k - 64) // 2], s[:, :(k - 64) // 16], sg)


@SETTINGS
@given(seeds, st.integers(1, 3), st.integers(1, 4), st.floats(1e-3, 1.0))
def test_w4a4_moe_slots(seed, tokens, topk, gamma):
    r = np.random.default_rng(seed)
    e_count, n, k = 5, 3, 256
    ws = [nvfp4_weight(r, n, k) for _ in range(e_count)]
    wp, wsc = np.stack([w[0] for w in ws]), np.stack([w[1] for w in ws])
    wg = np.array([w[2] for w in ws], F32)
    ids = r.integers(-1, e_count, (tokens, topk))
    x = bf16_rows(r, (tokens, k))
    y = w4a4_static_moe_slots(x, gamma, wp, wsc, wg, ids)
    assert y.shape == (tokens, topk, n)
    for t in range(tokens):
        for j in range(topk):
            e = ids[t, j]
            want = (np.zeros(n, F32) if e < 0 else
                    w4a4_mx_static(x[t:t + 1], gamma, wp[e], wsc[e], wg[e])[0])
            assert np.array_equal(y[t, j], want)
    # one activation per slot; a permutation of the slots permutes the outputs
    xs = bf16_rows(r, (tokens * topk, k))
    ap, asc, g = F.quantize_nvfp4_rows(xs)
    flat = ids.reshape(-1)
    y2 = w4a4_moe_slots(ap, asc, g, wp, wsc, wg, flat)
    perm = r.permutation(flat.size)
    y3 = w4a4_moe_slots(ap[perm], asc[perm], g[perm], wp, wsc, wg, flat[perm])
    assert np.array_equal(y2[perm], y3)
    with pytest.raises(ValueError):
        w4a4_moe_slots(ap, asc, g, wp, wsc, wg, np.full(flat.shape, e_count))


def test_w4a4_static_saturation():
    r = np.random.default_rng(5)
    p, s, sg = nvfp4_weight(r, 2, 128)
    gamma = F32(1e-3)
    x = np.full((1, 128), F32(6 * 448) * gamma * 8, F32)      # beyond 6*448*gamma
    ap, asc, g = F.quantize_nvfp4_static(x, gamma)
    av = nvfp4_scaled(ap, asc)
    assert (av == 6 * 448).all()
    y = w4a4_mx_static(x, gamma, p, s, sg)
    assert np.array_equal(y, w4a4_gemv(ap, asc, g, p, s, sg))


# ---------------------------------------------------------------- wxay / w8a8_act_quant

@SETTINGS
@given(seeds, st.integers(1, 3), st.integers(1, 200), st.integers(1, 12).map(lambda c: 128 * c))
def test_wxay_rowscale_and_blk128(seed, m, n, k):
    r = np.random.default_rng(seed)
    x = bf16_rows(r, (m, k), 3)
    w = r.standard_normal((n, k)).astype(F32)
    wc, wsc = F.quantize_fp8(w)
    ac, asc = quant_row(x)
    y = wxay_rowscale(ac, asc, wc, wsc)
    av, wv = F.e4m3_decode(ac).astype(np.float64), F.e4m3_decode(wc).astype(np.float64)
    j = n - 1
    naive = [F32(naive_chunk_chain(av[t], wv[j]) * F32(wsc[j] * asc[t])) for t in range(m)]
    assert np.array_equal(y[:, j], F.to_bf16(naive))
    exact = (av @ wv.T) * asc[:, None] * wsc[None, :]
    bound = (k / 1024 + 10) * U32 * (np.abs(av) @ np.abs(wv).T) * asc[:, None] * wsc[None, :]
    assert_bf16_close(y, exact, bound)
    assert np.array_equal(y[-1:], wxay_rowscale(ac[-1:], asc[-1:], wc, wsc))
    outs = wxay_split(ac, asc, [(wc, wsc), (wc[::-1], wsc[::-1])])
    assert np.array_equal(outs[0], y) and np.array_equal(outs[1], y[:, ::-1])
    # blk128: block scales and per-128 activation groups
    wb = r.uniform(0.01, 0.1, (-(-n // 128), k // 128)).astype(F32)
    gc, gs = quant_g128(x)
    yb = wxay_blk128(gc, gs, wc, wb)
    gv = F.e4m3_decode(gc).astype(np.float64)
    accs = np.zeros(8, F32)
    for c in range(k // 128):
        sc = F32(np.dot(gv[0, 128 * c:128 * c + 128], wv[j, 128 * c:128 * c + 128]))
        accs[c % 8] = fma_f32(sc, F32(wb[j // 128, c] * gs[0, c]), accs[c % 8])
    tot = accs[0]
    for wi in range(1, 8):
        tot = F32(tot + accs[wi])
    assert yb[0, j] == F.to_bf16(tot)
    with pytest.raises(ValueError):
        wxay_rowscale(ac[:, :-128] if k > 128 else ac[:, :64], asc, wc[:, :64], wsc)


@SETTINGS
@given(seeds, st.integers(1, 3), st.integers(1, 6).map(lambda c: 128 * c))
def test_w8a8_act_quant(seed, m, k):
    r = np.random.default_rng(seed)
    x = bf16_rows(r, (m, k), 10.0 ** r.uniform(-3, 3))
    x[0, :128] = 0
    c, s = quant_row(x)
    assert (c, s)[0].shape == (m, k) and s.shape == (m,)
    gc, gs = quant_g128(x)
    assert gs.shape == (m, k // 128) and gs[0, 0] == F32(1e-12) and not gc[0, :128].any()
    for b in range(k // 128):
        cb, sb = F.quantize_fp8(x[:, 128 * b:128 * b + 128])
        assert np.array_equal(gc[:, 128 * b:128 * b + 128], cb) and np.array_equal(gs[:, b], sb)
    g, u = bf16_rows(r, (m, k), 4), bf16_rows(r, (m, k))
    v = silu_mul_bf16(g, u)
    g64 = g.astype(np.float64)
    assert np.allclose(v, g64 / (1 + np.exp(-g64)) * u, rtol=2.0**-8 + 8 * U32, atol=1e-30)
    sc, ss = quant_silu_g128(g, u)
    assert np.array_equal(sc, quant_g128(v)[0]) and np.array_equal(ss, quant_g128(v)[1])


# ---------------------------------------------------------------- kda_gates_w8a8

@SETTINGS
@given(seeds, st.integers(1, 8))
def test_kda_gates(seed, m):
    r = np.random.default_rng(seed)
    heads, dk, k = 4, 16, 128
    xf, xg = bf16_rows(r, (m, k)), bf16_rows(r, (m, k))
    b = bf16_rows(r, (m, heads), 2)
    wf, wg = (F.quantize_fp8(r.standard_normal((heads * dk, k)).astype(F32)) for _ in range(2))
    a_log, delta = r.uniform(-1, 1, heads).astype(F32), r.uniform(-1, 1, heads * dk).astype(F32)
    out = kda_gates_w8a8(xf, xg, b, *wf, *wg, a_log, delta, -5.0)
    assert np.array_equal(out.f, wxay_rowscale(*quant_row(xf), *wf))
    assert np.array_equal(out.o_g, wxay_rowscale(*quant_row(xg), *wg))
    f64 = out.f.astype(np.float64)
    z = np.exp(np.repeat(a_log, dk).astype(np.float64)) * (f64 + delta)
    assert np.allclose(out.decay, -5.0 / (1 + np.exp(-z)), rtol=16 * U32, atol=1e-6)
    assert ((out.decay <= 0) & (out.decay >= -5)).all() and out.decay.dtype == F32
    assert np.allclose(out.beta, 1 / (1 + np.exp(-b.astype(np.float64))), rtol=8 * U32)
    xq = F.dequantize_fp8(*out.xf_quant)
    exact = xq.astype(np.float64) @ F.dequantize_fp8(*wf).T.astype(np.float64)
    assert np.allclose(out.f, exact, rtol=2.0**-7, atol=1e-3 * np.abs(exact).max())
    with pytest.raises(ValueError):
        kda_gates_w8a8(xf, xg, b, *wf, *wg, a_log, delta, 0.5)


# ---------------------------------------------------------------- order helpers

def test_fast_fma_and_exact_add():
    from kbpc.reference.gemv_order import add_f32, fma_f32_fast
    r = np.random.default_rng(11)
    for scale in (1.0, 1e-20, 1e-38, 1e30):
        a = (r.standard_normal(20000) * scale).astype(F32)
        b = r.standard_normal(20000).astype(F32)
        c = (r.standard_normal(20000) * scale).astype(F32)
        c[:100], a[100:200], b[100:200] = 0, -c[100:200], 1
        assert np.array_equal(fma_f32_fast(a, b, c).view(np.uint32), fma_f32(a, b, c).view(np.uint32))
    # a*b = 1 + 2^-11 + 2^-24 sits on a float32 midpoint; a tiny c decides the direction
    a = np.full(3, 1 + 2**-12, F32)
    c = np.array([0, 2**-70, -2**-70], F32)
    want = np.array([1 + 2**-11, 1 + 2**-11 + 2**-23, 1 + 2**-11], F32)
    assert np.array_equal(fma_f32_fast(a, a, c), want) and np.array_equal(fma_f32(a, a, c), want)
    # 1 + (2^-24 + 2^-70): plain float64 rounding would tie back to 1.0
    assert add_f32(np.array([1.0], F32), np.array([2**-24 + 2**-70]))[0] == F32(1 + 2**-23)
