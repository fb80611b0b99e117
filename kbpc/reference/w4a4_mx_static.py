"""w4a4_mx_static: W4A4 with a static NVFP4 activation scale gamma (`explain.families.w4a4_mx_static`).

Row quantization (w4a4_quant_rows_static) is w4a4_mx's with g = gamma, in the same order:
    s^a = sat_e4m3(f32(max_16|x| / 6) * f32(1/gamma)),  a = rn_e2m1(x / f32(s^a gamma)), 0 when s^a = 0
so values beyond 6*448*gamma saturate. The _k64 twin pads each row with zeros to a multiple of 128
(`quantize_rows_static(x, gamma, pad_to=128)`); zero groups encode as zero scales and codes.

Slot GEMV (w4a4_gemv_mx8_moe_slots and every union / grouped form, which write its bytes):
    y_(t,r),n = rn_bf16( [ sum_w sum_{c = w (mod 8)} sum_{k in c} (q^(e) s^w,(e))(a s^a) ] * (gamma s^(e)_g) ),  e = id_t,r
in w4a4_mx's order (exact chunk sums, per-warp FP32 chains, warp order, scale f32(gamma * s_g)).
Slots with id -1 produce +0 (see `w4a4_mx.w4a4_moe_slots`).

Fused gate/up epilogue (w4a4_grouped_gu_*): gate and up slot outputs are BF16 already; the
clamped SwiGLU is `glm_swiglu_clamp.swiglu_clamp` (FP32, rounded to BF16), and that value is
quantized under the down projection's gamma.
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.formats import quantize_nvfp4_static
from kbpc.reference.glm_swiglu_clamp import swiglu_clamp
from kbpc.reference.w4a4_mx import w4a4_gemv, w4a4_moe_slots

F32 = np.float32


def quantize_rows_static(x, gamma, pad_to: int | None = None):
    """(packed (m, K'/2), scales (m, K'/16), g (m,) = gamma) for BF16 rows x (m, K); with pad_to,
    K' = K rounded up to a multiple of pad_to, the padding being zeros."""
    x = np.atleast_2d(np.asarray(x, F32))
    if pad_to:
        pad = -x.shape[-1] % pad_to
        x = np.concatenate([x, np.zeros(x.shape[:-1] + (pad,), F32)], axis=-1)
    return quantize_nvfp4_static(x, gamma)


def w4a4_mx_static(x, gamma, w_packed, w_scales, w_global) -> np.ndarray:
    """Quantize BF16 rows x (m, K) under gamma, then the W4A4 GEMV with alpha = gamma * s_g."""
    return w4a4_gemv(*quantize_rows_static(x, gamma), w_packed, w_scales, w_global)


def w4a4_static_moe_slots(x, gamma, w_packed, w_scales, w_global, ids) -> np.ndarray:
    """Quantize BF16 activations under gamma (one row per slot, or per token shared by its slots,
    as `w4a4_moe_slots` reads them) and run each slot with its expert's weights."""
    x = np.asarray(x, F32)
    packed, scales, g = quantize_nvfp4_static(x, gamma)
    return w4a4_moe_slots(packed, scales, g, w_packed, w_scales, w_global, ids)


def moe_gate_up_down_input(x, ids, gate: tuple, up: tuple, gamma_gu, gamma_down, limit: float):
    """The fused grouped gate/up form: per slot, gate and up slot GEMVs (BF16), the clamped
    SwiGLU (BF16), and its static quantization under the down projection's gamma.

    gate / up: (packed (E, N, K/2), scales (E, N, K/16), global (E,)) stacks. Returns the down
    input's (packed, scales, g) per slot, shape ids.shape + (...). Slots with id -1 give h = 0."""
    g_out = w4a4_static_moe_slots(x, gamma_gu, *gate, ids)
    u_out = w4a4_static_moe_slots(x, gamma_gu, *up, ids)
    h = swiglu_clamp(g_out, u_out, limit)
    return quantize_nvfp4_static(h, gamma_down)
