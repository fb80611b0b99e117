"""kda_fused: one KDA decode layer's non-projection chain as one function (kernels/kda_fused.cuh).

The math is the composition of the five families, each by its own module, in the blueprint's
order: kda_pack -> causal_conv1d_l2norm -> kda_gates_w8a8 -> kda_recurrent -> kda_o_norm:

    p = [q | k | v];   y_qkv, window' = conv1d_update + SiLU + head L2 norm (BF16 store)
    f, o_g, decay, beta = kda_gates_w8a8(f_a, g_a, b)
    o, S' = kda_step(S, q_n, k_n, v_n, decay, beta);   y = kda_o_norm(o, o_g, gamma)

No new rounding point: a fused kernel must produce these bits (the unfused kernels' bits). Value
heads come from `b` (one beta logit per value head), d_k from the caller, d_v from what is left
of v, exactly as the interpreter splits them (kbpc.reference.ops). The state is explicit and pure:
the window (C, w) and the recurrent state (H_v, d_k, d_v) go in and their successors come out.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kbpc.reference.causal_conv1d_l2norm import causal_conv1d_update_l2norm
from kbpc.reference.kda_gates_w8a8 import KdaGates, kda_gates_w8a8
from kbpc.reference.kda_o_norm import kda_o_norm
from kbpc.reference.kda_pack import kda_pack
from kbpc.reference.kda_recurrent import kda_step

F32 = np.float32


@dataclass(frozen=True)
class KdaLayerWeights:
    """The chain's parameters: conv taps (C, w) and bias (C,) or None (BF16 values); the FP8 gate
    up-projections W_f (H_v*d_k, K_f) and W_g (H_v*d_v, K_g) as E4M3 codes with FP32 row scales;
    A (H_v,), delta (H_v*d_k,) and lambda < 0 of the decay; the norm weight gamma (d_v,) or
    (H_v*d_v,) (BF16 values); the constants. query_scale None means 1/sqrt(d_k) in FP32."""
    conv_weight: np.ndarray
    conv_bias: np.ndarray | None
    wf_codes: np.ndarray
    wf_scales: np.ndarray
    wg_codes: np.ndarray
    wg_scales: np.ndarray
    a_log: np.ndarray
    dt_bias: np.ndarray
    gamma: np.ndarray
    d_k: int
    l2_eps: float
    lower_bound: float
    norm_eps: float
    query_scale: float | None = None


@dataclass(frozen=True)
class KdaDecodeStep:
    """The chain's output y (H_v*d_v,) BF16 values, the advanced window and state, and every
    intermediate tensor (for tests and for plans that keep one as a buffer)."""
    y: np.ndarray
    window: np.ndarray
    state: np.ndarray
    packed: np.ndarray
    conv: np.ndarray
    gates: KdaGates
    core: np.ndarray


def kda_decode_step(q, k, v, f_a, b, g_a, window, state, w: KdaLayerWeights) -> KdaDecodeStep:
    """One token: q, k (H_k*d_k,), v (H_v*d_v,), f_a (K_f,), b (H_v,), g_a (K_g,) BF16 values;
    window (C, w) FP32 with C = 2*H_k*d_k + H_v*d_v; state (H_v, d_k, d_v) FP32."""
    q, k, v = (np.asarray(a, F32).reshape(-1) for a in (q, k, v))
    d_k, n_qk = w.d_k, q.size
    if n_qk % d_k or k.size != n_qk:
        raise ValueError(f"q/k widths {q.size}, {k.size} are not whole heads of d_k={d_k}")
    heads = np.asarray(b).size
    if v.size % heads:
        raise ValueError(f"v width {v.size} is not {heads} value heads")
    packed = kda_pack(q, k, v)
    conv, new_window = causal_conv1d_update_l2norm(packed, window, w.conv_weight, w.conv_bias,
                                                   c_qk=2 * n_qk, d_k=d_k, eps=w.l2_eps)
    gates = kda_gates_w8a8(np.asarray(f_a, F32).reshape(1, -1), np.asarray(g_a, F32).reshape(1, -1),
                           np.asarray(b, F32).reshape(1, -1), w.wf_codes, w.wf_scales, w.wg_codes,
                           w.wg_scales, w.a_log, w.dt_bias, w.lower_bound)
    qn, kn, vn = conv[:n_qk], conv[n_qk:2 * n_qk], conv[2 * n_qk:]
    core, new_state = kda_step(state, qn.reshape(-1, d_k), kn.reshape(-1, d_k), vn.reshape(heads, -1),
                               gates.decay.reshape(heads, d_k), gates.beta.reshape(heads), w.query_scale)
    core = core.reshape(-1)
    y = kda_o_norm(core, gates.o_g.reshape(-1), w.gamma, w.norm_eps, v.size // heads)
    return KdaDecodeStep(y=y, window=new_window, state=new_state, packed=packed, conv=conv, gates=gates,
                         core=core)
