"""w8a8_act_quant: dynamic FP8 E4M3 activation quantizer (`explain.families.w8a8_act_quant`).

    v_tk = x_tk   or   v_tk = rn_bf16((g_tk sigma(g_tk)) u_tk)
    s_t,G = max(f32(max_{k in G}|v_tk| / 448), 1e-12),   G = [0, K) (row) or [128b, 128b+128) (g128)
    q_tk = sat_e4m3(min(max(f32(v_tk / s_t,G), -448), 448))

sigma(g) = f32(1 / f32(1 + expf(-g))) (`f32ops.sigmoid_f32`; the kernel's fast exponential is
within the GPU test's tolerance), then f32(g * sigma), f32(that * u), rn_bf16: left to right, no
FMA. The max is exact, so its order is free. An all-zero group gets scale 1e-12 and zero codes.
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.f32ops import sigmoid_f32
from kbpc.reference.formats import quantize_fp8, to_bf16

F32 = np.float32
GROUP = 128


def quant_row(x) -> tuple[np.ndarray, np.ndarray]:
    """Per-token: codes (m, K) uint8, scales (m,) float32."""
    return quantize_fp8(np.atleast_2d(np.asarray(x, F32)), axis=-1)


def quant_g128(x) -> tuple[np.ndarray, np.ndarray]:
    """Per-128 group: codes (m, K) uint8, scales (m, K/128) float32."""
    x = np.atleast_2d(np.asarray(x, F32))
    m, k = x.shape
    if k % GROUP:
        raise ValueError(f"w8a8_act_quant_g128 needs K a multiple of {GROUP}, got {k}")
    codes, scales = quantize_fp8(x.reshape(m, k // GROUP, GROUP), axis=-1)
    return codes.reshape(m, k), scales


def silu_mul_bf16(g, u) -> np.ndarray:
    """v = rn_bf16((g * sigma(g)) * u), FP32 op by op."""
    g = np.asarray(g, F32)
    return to_bf16(((g * sigmoid_f32(g)).astype(F32) * np.asarray(u, F32)).astype(F32))


def quant_silu_row(g, u) -> tuple[np.ndarray, np.ndarray]:
    """w8a8_act_quant_silu_row: `quant_row(silu_mul_bf16(g, u))`."""
    return quant_row(silu_mul_bf16(g, u))


def quant_silu_g128(g, u) -> tuple[np.ndarray, np.ndarray]:
    """w8a8_act_quant_silu_g128: `quant_g128(silu_mul_bf16(g, u))`."""
    return quant_g128(silu_mul_bf16(g, u))
