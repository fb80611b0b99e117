"""glm_swiglu_clamp: GLM-5's clamped SwiGLU (asymmetric clamp, SiLU, multiply).

Math (explain.families.glm_swiglu_clamp), L = swiglu_limit > 0:

    ghat_i = min(g_i, L),   uhat_i = min(max(u_i, -L), L)
    y_i    = rn_bf16( ghat_i / (1 + e^{-ghat_i}) * uhat_i )

Numerics: BF16 gate/up widened exactly; fminf/fmaxf clamps; silu as fl(ghat / fl(1 + expf(-ghat)))
(a true division); then one product fl(silu * uhat); one RNE rounding to BF16 at the store (none
for the FP32 output).

Choices:
- Clamps follow fminf/fmaxf (numpy fmin/fmax): a NaN operand yields the other operand, so a NaN
  gate becomes L and a NaN up becomes -L.
- A `gate_up` row (the gate_up projection's output) is laid out [gate (inter) | up (inter)].

The blueprint splits the family into two ops in one group: `swiglu_clamp` (BF16 [gate|up] ->
FP32 [ghat|uhat], `clamp_gate_up`) then `silu_mul` (FP32 [ghat|uhat] -> BF16 y, `silu_mul`).
The clamps are exact, so `silu_mul(clamp_gate_up(gu))` equals `swiglu_clamp_rows(gu)`, the fused
entry; `swiglu_clamp(g, u)` is the same element expression on separate gate and up rows.
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.f32ops import silu_f32
from kbpc.reference.formats import to_bf16

F32 = np.float32


def _check_limit(limit: float) -> F32:
    lim = F32(limit)
    if not lim > 0:
        raise ValueError(f"swiglu_limit must be positive, got {limit}")
    return lim


def split_gate_up(gate_up) -> tuple[np.ndarray, np.ndarray]:
    """[gate | up] rows (..., 2*inter) -> (gate, up), each (..., inter)."""
    gu = np.asarray(gate_up, F32)
    if gu.shape[-1] % 2:
        raise ValueError(f"gate_up width {gu.shape[-1]} is odd")
    half = gu.shape[-1] // 2
    return gu[..., :half], gu[..., half:]


def clamp_gate_up(gate_up, limit: float) -> np.ndarray:
    """The swiglu_clamp op: FP32 [ghat | uhat] from a [gate | up] row (exact clamps)."""
    lim = _check_limit(limit)
    g, u = split_gate_up(gate_up)
    ghat = np.fmin(g, lim)
    uhat = np.fmin(np.fmax(u, -lim), lim)
    return np.concatenate([ghat, uhat], axis=-1).astype(F32)


def silu_mul(clamped, out: str = "bf16") -> np.ndarray:
    """The silu_mul op: y = silu(ghat) * uhat from an FP32 [ghat | uhat] row."""
    ghat, uhat = split_gate_up(clamped)
    y = (silu_f32(ghat) * uhat).astype(F32)
    if out == "bf16":
        return to_bf16(y)
    if out == "f32":
        return y
    raise ValueError(f"output format must be 'bf16' or 'f32', got {out!r}")


def swiglu_clamp(gate, up, limit: float, out: str = "bf16") -> np.ndarray:
    """Fused clamp + SiLU + multiply over separate gate and up rows (BF16 or FP32 output)."""
    gate = np.asarray(gate, F32)
    up = np.asarray(up, F32)
    if gate.shape != up.shape:
        raise ValueError(f"gate {gate.shape} and up {up.shape} differ in shape")
    return silu_mul(clamp_gate_up(np.concatenate([gate, up], axis=-1), limit), out)


def swiglu_clamp_rows(gate_up, limit: float, out: str = "bf16") -> np.ndarray:
    """Fused entry over [gate | up] rows (the routed gate/up epilogue's element expression)."""
    return silu_mul(clamp_gate_up(gate_up, limit), out)
