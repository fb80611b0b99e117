"""GPU tests of the KDA kernels (kda_pack, causal_conv1d_l2norm, kda_gates_w8a8, kda_recurrent,
kda_o_norm) against the numpy reference, on fresh random inputs each run, with poisoned outputs,
through the product's launchers with the lowerings' instances (kbpc.testing.instances; the conv's
FP32 output, the recurrence over several tokens with snapshots and the gates over several rows
are the same templates at other arguments).

Tolerances (why each is what it is; everything else is bit-exact):
- kda_pack, the conv window, residual/state copies: pure copies, bit-exact.
- causal_conv1d_l2norm: the kernel's sigmoid uses __expf (<= 2 + 1.17|a| ulp) and the head scale
  rsqrtf (<= 2 ulp) where the reference rounds both correctly. A few ulp of FP32 before the store:
  BF16 outputs within 1 BF16 ulp, FP32 outputs within rtol 2^-16.
- kda_recurrent: expf(g) (<= 2 ulp) against the correctly rounded exp. With g = 0 both give 1.0
  exactly, and the whole recurrence is then bit-exact (every other op is correctly rounded FP32 in
  the reference's order). With random g: each step perturbs S by a few ulp; the delta-rule map is
  non-expansive, so after T steps the error stays below ~T * 4 ulp of max|S|: atol 2^-16 max|S|.
- kda_o_norm: __expf in the gate sigmoid, rsqrtf in the scale: within 1 BF16 ulp.
- kda_gates_w8a8: the tensor core's FP32 sum order is the hardware's; the reference rounds the
  exact sum once. Inputs whose products are small integers make every order exact, so f and o_g are
  then bit-exact; on random inputs |f - f_ref| <= 1 BF16 ulp + 2^-12 * scale * sum|products|
  (a bound loose enough for a reduced-precision FP8 accumulator). decay is checked against the
  reference epilogue applied to the kernel's own f (expf, rtol 2^-16); beta (__expf) rtol 2^-18.
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families.kda_gates_w8a8 import gate_blocks
from kbpc.codegen.families.kda_pack import pack_blocks
from kbpc.reference import causal_conv1d_l2norm as ref_conv
from kbpc.reference import kda_gates_w8a8 as ref_gates
from kbpc.reference import kda_o_norm as ref_onorm
from kbpc.reference import kda_pack as ref_pack
from kbpc.reference import kda_recurrent as ref_rec
from kbpc.reference.formats import bf16_bits, bf16_from_bits, e4m3_encode, quantize_fp8, to_bf16
from kbpc.testing import instances as ki
from kbpc.testing.compare import (
    assert_bf16_within, assert_f32_close, assert_f32_exact, bf16_ulp_distance,
)
from kbpc.testing.launchers import launcher

F32 = np.float32
OUT_TYPES = {"bf16": ki.BF, "f32": "float"}   # the conv's output C type


def bf16_rand(rng, shape, std=1.0):
    """(values as float32, raw bits uint16) of random BF16 numbers."""
    vals = to_bf16((rng.standard_normal(shape) * std).astype(F32))
    return vals, bf16_bits(vals)


def unit_rows_bf16(rng, shape):
    """BF16 rows of (nearly) unit L2 norm, like the conv's q/k output."""
    x = rng.standard_normal(shape).astype(F32)
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    return bf16_rand_from(x)


def bf16_rand_from(x):
    vals = to_bf16(np.asarray(x, F32))
    return vals, bf16_bits(vals)


def integer_gate_inputs(rng, m: int, k: int):
    """Rows whose E4M3 quantization is exact small integers: s_a = 2^-3 exactly (one element is
    +-56 = 448 * 2^-3), every other value an integer in [-4, 4] times 2^-3."""
    x = rng.integers(-4, 5, (m, k)).astype(F32) * F32(0.125)
    x[np.arange(m), rng.integers(0, k, m)] = F32(56.0) * rng.choice([-1, 1], m).astype(F32)
    return x


# ---------------------------------------------------------------- CPU checks of the host side

def test_instances_name_the_instantiation():
    assert ki.kda_pack(40, 40, 24).kernel == "kbp::kda_pack_qkv_bf16<40, 40, 24, 256>"
    assert ki.causal_conv(576, 384, 64, 3, 256, OUT_TYPES["f32"]).kernel.endswith("<576, 384, 64, 3, 256, float>")
    assert ki.kda_recurrent(1, 2, 64, 96, 32, 3).kernel.endswith("<1, 2, 64, 96, 32, 3>")   # 32 columns a block
    assert gate_blocks(8192, 4) == 128 and gate_blocks(48, 4) == 1


def test_integer_gate_inputs_quantize_exactly():
    rng = np.random.default_rng(0)
    x = integer_gate_inputs(rng, 3, 128)
    codes, scales = quantize_fp8(x)
    assert np.all(scales == F32(0.125))
    from kbpc.reference.formats import e4m3_decode
    np.testing.assert_array_equal(e4m3_decode(codes) * F32(0.125), x)


def test_bf16_ulp_distance():
    a = np.array([1.0, -1.0, 0.0], F32)
    bits = bf16_bits(a)
    assert bf16_ulp_distance(bits, a).max() == 0
    assert bf16_ulp_distance(bits + 1, a).tolist() == [1, 1, 1]
    with pytest.raises(AssertionError):
        assert_bf16_within(bits + 2, a, 1)


# ---------------------------------------------------------------- GPU tests

def _gpu():
    from kbpc.testing import gpu  # noqa: PLC0415
    return gpu


def _ptr(arr, offset_elems: int = 0):
    return np.uintp(int(arr.gpudata) + offset_elems * arr.dtype.itemsize)


PACK_SHAPES = [(8192, 8192, 8192, 1), (40, 40, 24, 3), (6, 6, 10, 2), (3, 5, 7, 4)]   # (nq, nk, nv, rows)


@pytest.mark.gpu
@pytest.mark.parametrize("nq,nk,nv,rows", PACK_SHAPES)
def test_kda_pack(nq, nk, nv, rows):
    g = _gpu()
    rng = np.random.default_rng()
    q, k, v = (bf16_rand(rng, (rows, n))[1] for n in (nq, nk, nv))
    out = g.poisoned((rows, nq + nk + nv), np.uint16)
    launcher(ki.kda_pack(nq, nk, nv))((pack_blocks(nq, nk, nv), rows, 1), (256, 1, 1), g.to_gpu(q), g.to_gpu(k),
                                      g.to_gpu(v), np.int32(nq), np.int32(nk), np.int32(nv), out,
                                      np.int32(nq + nk + nv))
    np.testing.assert_array_equal(g.fetch(out, "packed"), ref_pack.kda_pack(q, k, v))


CONV_SHAPES = [  # (heads, d_k, width, threads, rows)
    (64, 128, 4, 256, 1),  # the seed: 3 * 8192 channels
    (3, 64, 3, 256, 2),    # a block straddling q/k and value channels, a partial last block
]


def _conv_case(rng, heads, dk, w, rows, with_bias):
    c_qk, c = 2 * heads * dk, 3 * heads * dk
    x, xb = bf16_rand(rng, (rows, c))
    window = to_bf16(rng.standard_normal((rows, c, w)).astype(F32))
    taps, tb = bf16_rand(rng, (c, w), 0.5)
    bias, bb = bf16_rand(rng, (c,), 0.1) if with_bias else (None, None)
    return c_qk, c, x, xb, window, taps, tb, bias, bb


@pytest.mark.gpu
@pytest.mark.parametrize("heads,dk,w,threads,rows", CONV_SHAPES)
@pytest.mark.parametrize("out", ["bf16", "f32"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_causal_conv1d_l2norm(heads, dk, w, threads, rows, out, with_bias):
    g = _gpu()
    rng = np.random.default_rng()
    eps = 1e-6
    c_qk, c, x, xb, window, taps, tb, bias, bb = _conv_case(rng, heads, dk, w, rows, with_bias)
    win_gpu = g.to_gpu(window)
    y = g.poisoned((rows, c), np.uint16 if out == "bf16" else np.float32)
    launcher(ki.causal_conv(c, c_qk, dk, w, threads, OUT_TYPES[out]))(
        (-(-c // threads), rows, 1), (threads, 1, 1), g.to_gpu(xb), np.int32(c), win_gpu, np.int64(c * w),
        g.to_gpu(tb), g.to_gpu(bb) if with_bias else None, np.float32(eps), y, np.int32(c))
    y_ref, win_ref = ref_conv.causal_conv1d_update_l2norm(x, window, taps, bias, c_qk=c_qk, d_k=dk,
                                                          eps=eps, out=out)
    assert_f32_exact(g.fetch(win_gpu, "window"), win_ref, "window")
    if out == "bf16":
        assert_bf16_within(g.fetch(y, "y"), y_ref, 1, "y")
    else:
        assert_f32_close(g.fetch(y, "y"), y_ref, rtol=2.0 ** -16, atol=1e-30, name="y")


REC_SHAPES = [  # (hk, hv, dk, dv, cols, tokens, seqs)
    (64, 64, 128, 128, 32, 1, 1),   # the seed, one token, one warp per block
    (64, 64, 128, 128, 128, 1, 2),  # the seed, one block per head, two sequences
    (64, 64, 128, 128, 64, 4, 1),   # the seed, four tokens with snapshots
    (1, 2, 64, 96, 32, 3, 2),       # grouped heads, d_k != d_v
]


def _rec_inputs(rng, hk, hv, dk, dv, rows, zero_decay):
    q, _ = unit_rows_bf16(rng, (rows, hk, dk))
    k, _ = unit_rows_bf16(rng, (rows, hk, dk))
    v, _ = bf16_rand(rng, (rows, hv, dv))
    gdec = (np.zeros((rows, hv, dk), F32) if zero_decay
            else (rng.uniform(-5.0, 0.0, (rows, hv, dk)) ** 3 / F32(25)).astype(F32))
    beta = rng.uniform(0.0, 1.0, (rows, hv)).astype(F32)
    qkv = np.concatenate([q.reshape(rows, -1), k.reshape(rows, -1), v.reshape(rows, -1)], axis=-1)
    return q, k, v, gdec, beta, bf16_bits(qkv)


def _run_recurrent(g, shape, qkv_gpu, gdec, beta, state_gpu, seqs):
    hk, hv, dk, dv, cols, t = shape
    scale = ref_rec.query_scale(dk)
    width = 2 * hk * dk + hv * dv
    out = g.poisoned((seqs * t, hv * dv), np.float32)
    snap = g.poisoned((seqs, t - 1, hv, dk, dv), np.float32) if t > 1 else None
    launcher(ki.kda_recurrent(*shape))((hv, dv // cols, seqs), (cols, 1, 1), _ptr(qkv_gpu), _ptr(qkv_gpu, hk * dk),
                                       _ptr(qkv_gpu, 2 * hk * dk), np.int32(width),
                                       g.to_gpu(gdec.reshape(seqs * t, -1)), np.int32(hv * dk),
                                       g.to_gpu(beta.reshape(seqs * t, -1)), np.int32(hv), np.float32(scale),
                                       state_gpu, np.int64(hv * dk * dv), snap, out, np.int32(hv * dv))
    return out, snap


def _check_state(gpu, ref, exact, name):
    if exact:
        assert_f32_exact(gpu, ref, name)
    else:
        assert_f32_close(gpu, ref, rtol=2.0 ** -16, atol=2.0 ** -16 * float(np.abs(ref).max()), name=name)


@pytest.mark.gpu
@pytest.mark.parametrize("hk,hv,dk,dv,cols,t,seqs", REC_SHAPES)
@pytest.mark.parametrize("zero_decay", [True, False])
def test_kda_recurrent(hk, hv, dk, dv, cols, t, seqs, zero_decay):
    g = _gpu()
    rng = np.random.default_rng()
    rows = seqs * t
    q, k, v, gdec, beta, qkv = _rec_inputs(rng, hk, hv, dk, dv, rows, zero_decay)
    state0 = rng.standard_normal((seqs, hv, dk, dv)).astype(F32)
    state_gpu = g.to_gpu(state0)
    out, snap = _run_recurrent(g, (hk, hv, dk, dv, cols, t), g.to_gpu(qkv), gdec, beta, state_gpu, seqs)
    got_out = g.fetch(out, "out").reshape(seqs, t, hv, dv)
    got_state = g.fetch(state_gpu, "state")
    got_snap = g.fetch(snap, "snapshots") if snap is not None else None
    for s in range(seqs):
        sl = slice(s * t, (s + 1) * t)
        o_ref, states = ref_rec.kda_tokens(state0[s], q[sl], k[sl], v[sl], gdec[sl], beta[sl])
        _check_state(got_out[s], o_ref, zero_decay, "out")
        _check_state(got_state[s], states[-1], zero_decay, "state")
        if t > 1:
            _check_state(got_snap[s], states[:-1], zero_decay, "snapshots")


ONORM_SHAPES = [(64, 128, 1, False), (3, 64, 5, True)]   # (h, d, rows, per-head gamma)


@pytest.mark.gpu
@pytest.mark.parametrize("h,d,rows,per_head_gamma", ONORM_SHAPES)
def test_kda_o_norm(h, d, rows, per_head_gamma):
    g = _gpu()
    rng = np.random.default_rng()
    eps = 1e-5
    o = (rng.standard_normal((rows, h * d)) * rng.uniform(0.01, 10.0)).astype(F32)
    z, zb = bf16_rand(rng, (rows, h * d), 2.0)
    gamma, gb = bf16_rand(rng, (h, d) if per_head_gamma else (d,))
    y = g.poisoned((rows, h * d), np.uint16)
    launcher(ki.kda_o_norm(h, d))((h, rows, 1), (d, 1, 1), g.to_gpu(o), np.int32(h * d), g.to_gpu(zb), np.int32(h * d),
                                  g.to_gpu(gb), np.int32(d if per_head_gamma else 0), np.float32(eps), y,
                                  np.int32(h * d))
    assert_bf16_within(g.fetch(y, "y"), ref_onorm.kda_o_norm(o, z, gamma, eps, d), 1, "y")


GATE_SHAPES = [  # (n, k, dk, warps, m)
    (8192, 128, 128, 4, 1),  # the seed, one token
    (8192, 128, 128, 4, 8),  # the seed, eight rows
    (192, 256, 64, 2, 3),    # two K chunks, three heads
    (48, 128, 16, 4, 5),     # a block with an idle warp
]


def _gate_weights(rng, n, k, integer):
    if integer:
        codes = e4m3_encode(rng.integers(-4, 5, (n, k)).astype(F32))
        scales = rng.uniform(0.001, 0.01, n).astype(F32)
        return codes, scales
    return quantize_fp8((rng.standard_normal((n, k)) * 0.05).astype(F32))


def _run_gates(g, shape, xf, xg, b, wf, wg, a_log, delta, lam):
    n, k, dk, warps, m = shape
    h = n // dk
    decay, og = g.poisoned((m, n), np.float32), g.poisoned((m, n), np.uint16)
    beta, f = g.poisoned((m, h), np.float32), g.poisoned((m, n), np.uint16)
    launcher(ki.kda_gates(n, k, dk, warps))((2 * gate_blocks(n, warps), 1, 1), (32 * warps, 1, 1),
                                            g.to_gpu(bf16_bits(xf)), g.to_gpu(bf16_bits(xg)), np.int32(k), np.int32(m),
                                            g.to_gpu(wf[0]), g.to_gpu(wf[1]), g.to_gpu(wg[0]), g.to_gpu(wg[1]),
                                            g.to_gpu(a_log), g.to_gpu(delta), np.float32(lam), g.to_gpu(bf16_bits(b)),
                                            np.int32(h), decay, np.int32(n), og, np.int32(n), beta, np.int32(h), f,
                                            np.int32(n))
    return (g.fetch(f, "f"), g.fetch(og, "o_g"), g.fetch(decay, "decay"), g.fetch(beta, "beta"))


def _gemv_bound(x, w):
    """2^-12 * f32(s_w * s_a) * sum_k |W^ x^| + 1 BF16 ulp: the random-input bound on f."""
    from kbpc.reference.formats import e4m3_decode  # noqa: PLC0415
    xq, sa = quantize_fp8(x)
    mag = np.abs(e4m3_decode(xq).astype(np.float64)) @ np.abs(e4m3_decode(w[0]).astype(np.float64)).T
    return 2.0 ** -12 * mag * (sa[:, None].astype(np.float64) * w[1][None, :].astype(np.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,dk,warps,m", GATE_SHAPES)
@pytest.mark.parametrize("integer", [True, False])
def test_kda_gates_w8a8(n, k, dk, warps, m, integer):
    g = _gpu()
    rng = np.random.default_rng()
    h, lam = n // dk, -5.0
    if integer:
        xf, xg = integer_gate_inputs(rng, m, k), integer_gate_inputs(rng, m, k)
    else:
        xf, xg = bf16_rand(rng, (m, k))[0], bf16_rand(rng, (m, k), 3.0)[0]
    wf, wg = _gate_weights(rng, n, k, integer), _gate_weights(rng, n, k, integer)
    a_log = rng.uniform(-1.0, 1.0, h).astype(F32)
    delta = rng.uniform(-1.0, 1.0, n).astype(F32)
    b = bf16_rand(rng, (m, h))[0]
    f, og, decay, beta = _run_gates(g, (n, k, dk, warps, m), xf, xg, b, wf, wg, a_log, delta, lam)
    ref = ref_gates.kda_gates_w8a8(xf, xg, b, wf[0], wf[1], wg[0], wg[1], a_log, delta, lam)
    if integer:
        np.testing.assert_array_equal(f, bf16_bits(ref.f))
        np.testing.assert_array_equal(og, bf16_bits(ref.o_g))
    else:
        for got, want, x, w, name in ((f, ref.f, xf, wf, "f"), (og, ref.o_g, xg, wg, "o_g")):
            ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(want), 1e-30))) - 7)
            assert_f32_close(bf16_from_bits(got), want, rtol=0.0, atol=ulp + _gemv_bound(x, w), name=name)
    decay_of_f = ref_gates.decay_gate(bf16_from_bits(f), a_log, delta, lam)
    assert_f32_close(decay, decay_of_f, rtol=2.0 ** -16, atol=1e-30, name="decay")
    assert_f32_close(beta, ref.beta, rtol=2.0 ** -18, atol=1e-30, name="beta")


# ---------------------------------------------------------------- many consecutive tokens

SEQ_SHAPES = [  # (heads, d_k, conv width, sequences, steps)
    (64, 128, 4, 1, 12),  # the seed
    (2, 64, 3, 3, 24),    # small heads, three sequences with their own windows and states
]


def chain_instances(heads: int, dk: int, w: int) -> tuple:
    """pack, conv and o_norm of one KDA layer of `heads` heads of d_k = d_v = dk (the recurrence:
    chain_recurrence)."""
    n = heads * dk
    return ki.kda_pack(n, n, n), ki.causal_conv(3 * n, 2 * n, dk, w, 256), ki.kda_o_norm(heads, dk)


def chain_recurrence(heads: int, dk: int) -> tuple:
    """(hk, hv, dk, dv, cols, tokens) of the chain's recurrence: one token, one warp per block."""
    return heads, heads, dk, dk, 32, 1


def instances():
    """Every kernel instance this module launches (tests/nvcc/test_gpu_test_instances.py builds them)."""
    out = [ki.kda_pack(nq, nk, nv) for nq, nk, nv, _ in PACK_SHAPES]
    out += [ki.causal_conv(3 * h * dk, 2 * h * dk, dk, w, threads, ot) for h, dk, w, threads, _ in CONV_SHAPES
            for ot in OUT_TYPES.values()]
    out += [ki.kda_recurrent(*shape[:6]) for shape in REC_SHAPES]
    out += [ki.kda_o_norm(h, d) for h, d, *_ in ONORM_SHAPES] + [ki.kda_gates(*shape[:4]) for shape in GATE_SHAPES]
    for heads, dk, w, *_ in SEQ_SHAPES:
        out += [*chain_instances(heads, dk, w), ki.kda_recurrent(*chain_recurrence(heads, dk))]
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("heads,dk,w,seqs,steps", SEQ_SHAPES)
@pytest.mark.parametrize("zero_decay", [True, False])
def test_kda_many_tokens(heads, dk, w, seqs, steps, zero_decay):
    """pack -> conv -> recurrence -> o_norm over `steps` tokens, the conv window and the recurrent
    state advanced in place on the GPU; every step checked against the reference, which carries
    its own window and state (the recurrence reads the GPU's conv output, so both see the same
    q, k, v; with zero decay the state must stay bit-exact at every step)."""
    g = _gpu()
    rng = np.random.default_rng()
    n, eps = heads * dk, 1e-6
    pack, conv, onorm = (launcher(i) for i in chain_instances(heads, dk, w))
    taps, tb = bf16_rand(rng, (3 * n, w), 0.5)
    bias, bb = bf16_rand(rng, (3 * n,), 0.1)
    gamma, gb = bf16_rand(rng, (dk,))
    window = np.zeros((seqs, 3 * n, w), F32)
    state = np.zeros((seqs, heads, dk, dk), F32)
    win_gpu, state_gpu = g.to_gpu(window), g.to_gpu(state)
    taps_gpu, bias_gpu, gamma_gpu = g.to_gpu(tb), g.to_gpu(bb), g.to_gpu(gb)
    for step in range(steps):
        (qv, qb), (kv, kb), (vv, vb) = (bf16_rand(rng, (seqs, n)) for _ in range(3))
        packed = g.poisoned((seqs, 3 * n), np.uint16)
        pack((pack_blocks(n, n, n), seqs, 1), (256, 1, 1), g.to_gpu(qb), g.to_gpu(kb), g.to_gpu(vb), np.int32(n),
             np.int32(n), np.int32(n), packed, np.int32(3 * n))
        y = g.poisoned((seqs, 3 * n), np.uint16)
        conv((-(-3 * n // 256), seqs, 1), (256, 1, 1), packed, np.int32(3 * n), win_gpu, np.int64(3 * n * w),
             taps_gpu, bias_gpu, np.float32(eps), y, np.int32(3 * n))
        x_ref = ref_pack.kda_pack(qv, kv, vv)
        np.testing.assert_array_equal(g.fetch(packed, "packed"), bf16_bits(x_ref))
        y_ref, window = ref_conv.causal_conv1d_update_l2norm(x_ref, window, taps, bias, c_qk=2 * n,
                                                             d_k=dk, eps=eps)
        assert_f32_exact(g.fetch(win_gpu, "window"), window, f"window at step {step}")
        y_bits = g.fetch(y, "conv out")
        assert_bf16_within(y_bits, y_ref, 1, f"conv out at step {step}")

        yv = bf16_from_bits(y_bits)
        gdec = (np.zeros((seqs, heads, dk), F32) if zero_decay
                else rng.uniform(-1.0, 0.0, (seqs, heads, dk)).astype(F32))
        beta = rng.uniform(0.0, 1.0, (seqs, heads)).astype(F32)
        out, _ = _run_recurrent(g, chain_recurrence(heads, dk), y, gdec, beta, state_gpu, seqs)
        o_ref, state = ref_rec.kda_step(state, yv[:, :n].reshape(seqs, heads, dk),
                                        yv[:, n:2 * n].reshape(seqs, heads, dk),
                                        yv[:, 2 * n:].reshape(seqs, heads, dk), gdec, beta)
        o_gpu = g.fetch(out, "recurrent out")
        _check_state(o_gpu.reshape(o_ref.shape), o_ref, zero_decay, f"recurrent out at step {step}")
        _check_state(g.fetch(state_gpu, "state"), state, zero_decay, f"state at step {step}")

        z, zb = bf16_rand(rng, (seqs, n))
        gated = g.poisoned((seqs, n), np.uint16)
        onorm((heads, seqs, 1), (dk, 1, 1), out, np.int32(n), g.to_gpu(zb), np.int32(n), gamma_gpu, np.int32(0),
              np.float32(eps), gated, np.int32(n))
        assert_bf16_within(g.fetch(gated, "gated"), ref_onorm.kda_o_norm(o_gpu, z, gamma, eps, dk), 1,
                           f"o_norm at step {step}")
