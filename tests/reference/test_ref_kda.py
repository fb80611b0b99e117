"""Reference families kda_pack, causal_conv1d_l2norm, kda_recurrent, kda_o_norm.

Checked against float64 evaluations of the same formulas (tolerances from the rounding points:
an FP32 sum of n terms is within (n + 8) 2^-24 of the sum of absolute values, a BF16 store adds at
most 2^-8 of the magnitude) and against literal scalar loops where the module fixes an order.
"""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from kbpc.reference import causal_conv1d_l2norm as CV
from kbpc.reference import kda_o_norm as ON
from kbpc.reference import kda_pack as KP
from kbpc.reference import kda_recurrent as KR
from kbpc.reference.f32ops import exp_f32, sigmoid_f32
from kbpc.reference.formats import bf16_bits, to_bf16

F32 = np.float32
U = 2.0 ** -24
HALF_BF16 = 2.0 ** -8
SETTINGS = settings(max_examples=15, deadline=None)
seeds = st.integers(0, 2**32 - 1)


def assert_within(ref, exact, bound):
    err = np.abs(np.asarray(ref, np.float64) - exact)
    bad = ~(err <= bound)
    assert not bad.any(), f"max excess {np.max(err - bound)} at {np.argwhere(bad)[:3].tolist()}"


def assert_bf16_near(ref, exact, fp32_err):
    assert np.array_equal(to_bf16(ref), ref), "output is not BF16-valued"
    assert_within(ref, exact, HALF_BF16 * (np.abs(exact) + fp32_err) + fp32_err)


def bf16_normal(rng, shape, scale=1.0):
    return to_bf16(rng.standard_normal(shape) * scale)


# ------------------------------------------------------------------ kda_pack

@SETTINGS
@given(seed=seeds, n=st.integers(1, 64), nv=st.integers(1, 64))
def test_kda_pack_is_a_bit_copy(seed, n, nv):
    rng = np.random.default_rng(seed)
    q, k = (rng.integers(0, 1 << 16, (3, n), dtype=np.uint16) for _ in range(2))
    v = rng.integers(0, 1 << 16, (3, nv), dtype=np.uint16)
    p = KP.kda_pack(q, k, v)
    assert p.dtype == np.uint16 and p.shape == (3, 2 * n + nv)
    for t in range(3):
        assert p[t].tobytes() == q[t].tobytes() + k[t].tobytes() + v[t].tobytes()


# ------------------------------------------------------------------ causal_conv1d_l2norm

def conv_direct_f32(hist, weight, bias, t, w):
    """Token t's conv from the full history (stored window first), scalar FP32 ops in order."""
    c_count = hist.shape[1]
    out = np.empty(c_count, F32)
    for c in range(c_count):
        acc = F32(bias[c])
        for i in range(w):
            acc = F32(acc + F32(weight[c, i] * hist[t + 1 + i, c]))
        out[c] = F32(acc * sigmoid_f32(acc))
    return out


@SETTINGS
@given(seed=seeds, w=st.integers(1, 5), steps=st.integers(1, 6), c=st.integers(1, 24))
def test_conv_window_shift_equals_direct_convolution(seed, w, steps, c):
    rng = np.random.default_rng(seed)
    window = bf16_normal(rng, (c, w))
    weight, bias = bf16_normal(rng, (c, w), 0.5), bf16_normal(rng, c, 0.1)
    x = bf16_normal(rng, (steps, c))
    u, new = CV.conv1d_tokens(x, window, weight, bias)
    hist = np.concatenate([window.T, x])  # (w + steps, C): x_{j} for j <= 0 from the window
    for t in range(steps):
        np.testing.assert_array_equal(u[t], conv_direct_f32(hist, weight, bias, t, w))
    np.testing.assert_array_equal(new, hist[-w:].T)
    np.testing.assert_array_equal(new, CV.window_advance(window, x))
    # float64 of the same formula
    win64 = np.stack([hist[t + 1:t + 1 + w].T for t in range(steps)]).astype(np.float64)
    terms = weight * win64
    a = bias + terms.sum(-1)
    want = a / (1 + np.exp(-a))
    err = (w + 8) * U * (np.abs(bias) + np.abs(terms).sum(-1)) * 1.2 + 4 * U * np.abs(want)
    assert_within(u, want, err)
    # step by step equals the token form, and the input window is left untouched
    win = window.copy()
    for t in range(steps):
        ut, win = CV.conv1d_update(x[t], win, weight, bias)
        np.testing.assert_array_equal(ut, u[t])
    np.testing.assert_array_equal(window, hist[:w].T)


def test_conv_rows_are_independent_sequences():
    rng = np.random.default_rng(7)
    windows = bf16_normal(rng, (3, 8, 4))
    weight = bf16_normal(rng, (8, 4))
    x = bf16_normal(rng, (3, 8))
    u, new = CV.conv1d_update(x, windows, weight)
    for r in range(3):
        ur, nr = CV.conv1d_update(x[r], windows[r], weight)
        np.testing.assert_array_equal(u[r], ur)
        np.testing.assert_array_equal(new[r], nr)


def test_head_sum_squares_order():
    rng = np.random.default_rng(8)
    u = (rng.standard_normal((64, 256)) * 2.0 ** rng.uniform(-10, 10, (64, 256))).astype(F32)
    sq = (u * u).astype(F32).reshape(64, 2, 4, 32)  # rows, heads, warps, lanes
    off = 16
    while off:  # shuffle-down: lane i adds lane i + off (lanes past 31 keep their value)
        head = (sq[..., :32 - off] + sq[..., off:]).astype(F32)
        sq = np.concatenate([head, sq[..., 32 - off:]], -1)
        off //= 2
    w = sq[..., 0]
    want = (((w[..., 0] + w[..., 1]).astype(F32) + w[..., 2]).astype(F32) + w[..., 3]).astype(F32)
    np.testing.assert_array_equal(CV.head_sum_squares(u, 128), want)


@SETTINGS
@given(seed=seeds, heads=st.integers(1, 3), d_k=st.sampled_from([32, 64, 128]),
       scale=st.floats(1e-3, 1e3))
def test_l2norm_heads_matches_float64(seed, heads, d_k, scale):
    rng = np.random.default_rng(seed)
    c_qk = 2 * heads * d_k
    u = (rng.standard_normal((2, c_qk + heads * d_k)) * scale).astype(F32)
    eps = 1e-6
    y32 = CV.l2norm_heads(u, c_qk, d_k, eps, out="f32")
    y = CV.l2norm_heads(u, c_qk, d_k, eps)
    np.testing.assert_array_equal(y, to_bf16(y32))
    np.testing.assert_array_equal(y32[:, c_qk:], u[:, c_qk:])  # value channels: SiLU only
    qk = u[:, :c_qk].astype(np.float64).reshape(2, -1, d_k)
    want = (qk / np.sqrt((qk ** 2).sum(-1, keepdims=True) + eps)).reshape(2, c_qk)
    rel = (d_k // 32 + 40) * U
    assert_within(y32[:, :c_qk], want, rel * np.abs(want))
    assert_bf16_near(y[:, :c_qk], want, rel * np.abs(want))
    assert not np.any(CV.l2norm_heads(np.zeros((1, c_qk), F32), c_qk, d_k, eps))


def test_fused_conv_l2norm_composes():
    rng = np.random.default_rng(9)
    c_qk, d_k, c = 128, 64, 192
    window, weight = bf16_normal(rng, (c, 4)), bf16_normal(rng, (c, 4))
    x = bf16_normal(rng, (3, c))
    y, new = CV.causal_conv1d_update_l2norm_tokens(x, window, weight, None, c_qk=c_qk, d_k=d_k,
                                                   eps=1e-6)
    win = window
    for t in range(3):
        yt, win = CV.causal_conv1d_update_l2norm(x[t], win, weight, None, c_qk=c_qk, d_k=d_k,
                                                 eps=1e-6)
        np.testing.assert_array_equal(yt, y[t])
    np.testing.assert_array_equal(win, new)


# ------------------------------------------------------------------ kda_recurrent

def kda_inputs(rng, steps, hk, hv, d):
    def unit(shape):
        a = rng.standard_normal(shape)
        return to_bf16(a / np.linalg.norm(a, axis=-1, keepdims=True))
    q, k = unit((steps, hk, d)), unit((steps, hk, d))
    v = bf16_normal(rng, (steps, hv, d))
    g = rng.uniform(-1.0, 0.0, (steps, hv, d)).astype(F32)
    beta = rng.uniform(0.0, 1.0, (steps, hv)).astype(F32)
    return q, k, v, g, beta


@SETTINGS
@given(seed=seeds, steps=st.integers(1, 5), hk=st.integers(1, 2), group=st.integers(1, 2),
       d=st.sampled_from([4, 16, 32]))
def test_recurrence_matches_float64_closed_form(seed, steps, hk, group, d):
    rng = np.random.default_rng(seed)
    hv = hk * group
    q, k, v, g, beta = kda_inputs(rng, steps, hk, hv, d)
    s0 = (rng.standard_normal((hv, d, d)) * 0.3).astype(F32)
    o, states = KR.kda_tokens(s0, q, k, v, g, beta)
    kx = np.repeat(k, group, axis=1).astype(np.float64)
    qx = np.repeat(q, group, axis=1).astype(np.float64)
    # float64: u_t by the recurrence, S_T by the unrolled closed form
    s = s0.astype(np.float64)
    us = []
    for t in range(steps):
        st_ = np.exp(g[t].astype(np.float64))[..., :, None] * s
        us.append(beta[t][:, None] * (v[t] - np.einsum("hij,hi->hj", st_, kx[t])))
        s = st_ + kx[t][..., :, None] * us[-1][..., None, :]
        o64 = np.einsum("hij,hi->hj", s, qx[t] / np.sqrt(d))
        assert_within(o[t], o64, 1e-4 * (1 + np.abs(o64)))
    cum = np.cumsum(g[::-1].astype(np.float64), axis=0)[::-1]  # cum[t] = sum_{s>=t} g_s
    closed = np.exp(cum[0])[..., :, None] * s0
    for t in range(steps):
        decay = np.exp(cum[t + 1]) if t + 1 < steps else np.ones_like(cum[0])
        closed = closed + decay[..., :, None] * kx[t][..., :, None] * us[t][..., None, :]
    np.testing.assert_allclose(s, closed, atol=1e-10)
    assert_within(states[-1], closed, 1e-4 * (1 + np.abs(closed)))


def test_recurrence_element_order_is_literal():
    rng = np.random.default_rng(10)
    d = 4
    q, k, v, g, beta = (a[0] for a in kda_inputs(rng, 1, 1, 1, d))
    s = (rng.standard_normal((1, d, d))).astype(F32)
    o, new = KR.kda_step(s, q, k, v, g, beta)
    scale = F32(F32(1) / np.sqrt(F32(d)))
    ed = exp_f32(g[0])
    for j in range(d):
        col = [F32(ed[i] * s[0, i, j]) for i in range(d)]
        a = F32(col[0] * k[0, 0])
        for i in range(1, d):
            a = F32(a + F32(col[i] * k[0, i]))
        u = F32(beta[0] * F32(v[0, j] - a))
        col = [F32(col[i] + F32(k[0, i] * u)) for i in range(d)]
        acc = F32(col[0] * F32(q[0, 0] * scale))
        for i in range(1, d):
            acc = F32(acc + F32(col[i] * F32(q[0, i] * scale)))
        assert o[0, j] == acc
        assert [new[0, i, j] for i in range(d)] == col


def test_recurrence_is_pure_and_snapshots():
    rng = np.random.default_rng(11)
    q, k, v, g, beta = kda_inputs(rng, 3, 2, 2, 8)
    s0 = rng.standard_normal((2, 8, 8)).astype(F32)
    keep = s0.copy()
    o, states = KR.kda_tokens(s0, q, k, v, g, beta)
    np.testing.assert_array_equal(s0, keep)
    s = s0
    for t in range(3):
        ot, s = KR.kda_step(s, q[t], k[t], v[t], g[t], beta[t])
        np.testing.assert_array_equal(ot, o[t])
        np.testing.assert_array_equal(s, states[t])
    # zero state, zero beta: no update and no output
    o0, s1 = KR.kda_step(np.zeros((2, 8, 8), F32), q[0], k[0], v[0], g[0], np.zeros(2, F32))
    assert not np.any(o0) and not np.any(s1)


# ------------------------------------------------------------------ kda_o_norm

@SETTINGS
@given(seed=seeds, heads=st.integers(1, 4), d=st.sampled_from([32, 64, 128]),
       per_head=st.booleans())
def test_o_norm_matches_float64(seed, heads, d, per_head):
    rng = np.random.default_rng(seed)
    o = (rng.standard_normal((2, heads * d)) * rng.uniform(1e-2, 1e2)).astype(F32)
    z = bf16_normal(rng, (2, heads * d), 3)
    gamma = bf16_normal(rng, heads * d if per_head else d)
    eps = 1e-5
    y = ON.kda_o_norm(o, z, gamma, eps, d)
    oh = o.astype(np.float64).reshape(2, heads, d)
    gm = gamma.astype(np.float64).reshape(-1, d)
    want = oh / np.sqrt((oh ** 2).mean(-1, keepdims=True) + eps) * gm
    want = (want / (1 + np.exp(-z.astype(np.float64).reshape(2, heads, d)))).reshape(2, -1)
    assert_bf16_near(y, want, 40 * U * np.abs(want))
    assert not np.any(ON.kda_o_norm(np.zeros((1, d), F32), z[:1, :d], gamma[:d], eps, d))
    assert bf16_bits(y).dtype == np.uint16
