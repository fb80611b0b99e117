"""kda_gates_w8a8: the KDA decode gate chain (`explain.families.kda_gates_w8a8`).

    s_a = max(f32(max_k|x_k| / 448), 1e-12),   x^_k = sat_e4m3(clamp(f32(x_k / s_a), +-448))
    f_n = rn_bf16( (sum_k W^_nk x^_k) * (s_w,n s_a) )          (o_g likewise from x_g, W_g)
    g_n = lambda * sigma( e^{A_h(n)} (f_n + delta_n) ),  h(n) = n / d_k
    beta_h = sigma(b_h)

The activation quantization is `w8a8_act_quant.quant_row`; f and o_g are `wxay.wxay_rowscale`
(K = 128 is one chunk, so the tensor core's full-K sum is the exact chunk sum rounded once to
FP32; larger K multiples of 128 follow wxay's warp-chunk order), i.e. f32(S * f32(s_w,n * s_a))
rounded to BF16. Decay in FP32, op by op: t = f32(f_n + delta_n), z = f32(expf(A_h) * t),
g = f32(lambda * sigma(z)) with sigma(z) = f32(1 / f32(1 + expf(-z))); beta = sigma(b_h) the same
way (the kernel's __expf is within the GPU tolerance). lambda (< 0), A (per head), delta (per
channel) and b (per token and head) are explicit arguments.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kbpc.reference.f32ops import exp_f32, sigmoid_f32
from kbpc.reference.w8a8_act_quant import quant_row
from kbpc.reference.wxay import wxay_rowscale

F32 = np.float32


@dataclass(frozen=True)
class KdaGates:
    """Outputs of the chain: f and o_g (m, H*d_k) BF16 values, decay (m, H*d_k) and beta (m, H)
    FP32, plus the row quantizations (codes, scales) of x_f and x_g."""
    f: np.ndarray
    o_g: np.ndarray
    decay: np.ndarray
    beta: np.ndarray
    xf_quant: tuple[np.ndarray, np.ndarray]
    xg_quant: tuple[np.ndarray, np.ndarray]


def fp8_projection(x, w_codes, w_scales):
    """Row-quantize x (m, K) to E4M3 and apply the FP8 weight: ((codes, scales), y BF16)."""
    q = quant_row(x)
    return q, wxay_rowscale(q[0], q[1], w_codes, w_scales)


def decay_gate(f, a_log, delta, lower_bound: float) -> np.ndarray:
    """g_n = lambda * sigma(expf(A_h) * (f_n + delta_n)).

    f (m, H*d_k) BF16 values, a_log = A (H,), delta (H*d_k,), lower_bound = lambda < 0."""
    f = np.atleast_2d(np.asarray(f, F32))
    a = np.asarray(a_log, F32).reshape(-1)
    if f.shape[-1] % a.size:
        raise ValueError(f"{f.shape[-1]} channels do not split into {a.size} heads")
    lam = F32(lower_bound)
    if not lam < 0:
        raise ValueError(f"the gate lower bound must be negative, got {lower_bound}")
    t = (f + np.asarray(delta, F32).reshape(-1)).astype(F32)
    z = (np.repeat(exp_f32(a), f.shape[-1] // a.size) * t).astype(F32)
    return (lam * sigmoid_f32(z)).astype(F32)


def kda_gates_w8a8(x_f, x_g, b, wf_codes, wf_scales, wg_codes, wg_scales,
                   a_log, delta, lower_bound: float) -> KdaGates:
    """The whole chain for m token rows: x_f, x_g (m, K) BF16 (the f_a and g_a outputs), b (m, H)
    BF16 beta logits; W_f, W_g (H*d_k, K) E4M3 codes with per-row FP32 scales."""
    xf_q, f = fp8_projection(x_f, wf_codes, wf_scales)
    xg_q, o_g = fp8_projection(x_g, wg_codes, wg_scales)
    decay = decay_gate(f, a_log, delta, lower_bound)
    beta = sigmoid_f32(np.atleast_2d(np.asarray(b, F32)))
    return KdaGates(f=f, o_g=o_g, decay=decay, beta=beta, xf_quant=xf_q, xg_quant=xg_q)
