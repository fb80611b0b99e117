"""kda_recurrent: the KDA gated delta rule with a per-key-channel decay.

Math (explain.families.kda_recurrent), per head with an FP32 state S in R^{D x D}:

    S~  = diag(e^{g_t}) S_{t-1}
    u_t = beta_t (v_t - S~^T k_t)
    S_t = S~ + k_t u_t^T
    o_t = S_t^T (q_t / sqrt(D))

Numerics: BF16 q, k, v widened exactly; FP32 log decay g, beta (already sigma(b), from
kda_gates_w8a8), state and output. Decay as expf(g); the query pre-multiplied by the FP32 scale
1/sqrt(D) (computed on the host); both column sums over k = 1..D in order, no FMA; no state clamp.

Choices:
- State layout [head][k][v]: S[h, i, j] with i the key channel (row) and j the value column, so the
  kernel's thread j walks column j with a stride of D floats and neighbouring threads read
  neighbouring floats.
- Element order: S~_ij = fl(expf(g_i) * S_ij); a_j = seq_i fl(S~_ij k_i) (from the first term);
  u_j = fl(beta * fl(v_j - a_j)); S_ij = fl(S~_ij + fl(k_i u_j)); q^_i = fl(q_i * scale);
  o_j = seq_i fl(S_ij q^_i).
- scale defaults to fl32(1 / fl32(sqrt(D))), each op correctly rounded (the host's 1.0f/sqrtf(D)).
- Grouped heads: q and k may have fewer heads than v (H_v a multiple of H_k); value head h uses
  key head h // (H_v / H_k). g and beta are per value head.
Pure functions: the state is taken and a new one returned.
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.f32ops import exp_f32
from kbpc.reference.fp32 import seq_sum

F32 = np.float32


def query_scale(d: int) -> F32:
    """1/sqrt(D) in FP32: fl(1 / fl(sqrt(D)))."""
    return F32(F32(1) / np.sqrt(F32(d)))


def _expand_heads(a: np.ndarray, hv: int) -> np.ndarray:
    hk = a.shape[-2]
    if hv % hk:
        raise ValueError(f"value heads {hv} are not a multiple of key heads {hk}")
    return np.repeat(a, hv // hk, axis=-2)


def kda_step(state, q, k, v, g, beta, scale=None) -> tuple[np.ndarray, np.ndarray]:
    """One token: (o (..., Hv, D) FP32, new state (..., Hv, D, D)).

    state (..., Hv, D, D) [head][k][v]; q, k (..., Hk, D); v, g (..., Hv, D); beta (..., Hv)."""
    s = np.asarray(state, F32)
    hv, d = s.shape[-3], s.shape[-2]
    q = _expand_heads(np.asarray(q, F32), hv)
    k = _expand_heads(np.asarray(k, F32), hv)
    v = np.asarray(v, F32)
    scale = query_scale(d) if scale is None else F32(scale)
    decayed = (exp_f32(g)[..., :, None] * s).astype(F32)
    a = seq_sum((decayed * k[..., :, None]).astype(F32), axis=-2)  # (..., Hv, D) over i
    u = (np.asarray(beta, F32)[..., None] * (v - a).astype(F32)).astype(F32)
    new = (decayed + (k[..., :, None] * u[..., None, :]).astype(F32)).astype(F32)
    qs = (q * scale).astype(F32)
    o = seq_sum((new * qs[..., :, None]).astype(F32), axis=-2)
    return o, new


def kda_tokens(state, q, k, v, g, beta, scale=None):
    """T tokens of one sequence (the seq_reg_snap form): (o (T, ..., Hv, D), states).

    Inputs carry a leading token axis T; `states` is (T, ..., Hv, D, D), the state after each
    token: the first T-1 are the kernel's snapshots and the last is the new state."""
    outs, states = [], []
    for t in range(np.asarray(q).shape[0]):
        o, state = kda_step(state, q[t], k[t], v[t], g[t], beta[t], scale)
        outs.append(o)
        states.append(state)
    return np.stack(outs), np.stack(states)
