"""kda_conv_gates: a KDA layer's q|k|v pack + short conv + L2 norm and its FP8 gate chain, side by side
(kernels/kda_conv_gates.cuh, fusion rule kda_conv_gates).

The two halves read different outputs of one projection and neither reads the other, so the math
is the two families' own, each by its module, with no new rounding point:

    y_qkv, window' = causal_conv1d_update_l2norm([q | k | v], window)   (kda_pack, then the conv)
    f, o_g, decay, beta = kda_gates_w8a8(f_a, g_a, b)

The state is explicit and pure: the window (C, w) goes in and its successor comes out."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kbpc.reference.causal_conv1d_l2norm import causal_conv1d_update_l2norm
from kbpc.reference.kda_gates_w8a8 import KdaGates, kda_gates_w8a8
from kbpc.reference.kda_pack import kda_pack

F32 = np.float32


@dataclass(frozen=True)
class KdaConvGates:
    """The conv's BF16 output row (C,), the advanced window (C, w) and the gates."""
    conv: np.ndarray
    window: np.ndarray
    gates: KdaGates


def kda_conv_gates(q, k, v, f_a, b, g_a, window, conv_weight, conv_bias, wf_codes, wf_scales, wg_codes,
                   wg_scales, a_log, dt_bias, *, d_k: int, l2_eps: float, lower_bound: float) -> KdaConvGates:
    """One token: q, k (H_k*d_k,), v, f_a (K_f,), b (H_v,), g_a (K_g,) BF16 values; window (C, w) FP32."""
    q, k, v = (np.asarray(a, F32).reshape(-1) for a in (q, k, v))
    if k.size != q.size or q.size % d_k:
        raise ValueError(f"q/k widths {q.size}, {k.size} are not whole heads of d_k={d_k}")
    conv, new_window = causal_conv1d_update_l2norm(kda_pack(q, k, v), window, conv_weight, conv_bias,
                                                   c_qk=2 * q.size, d_k=d_k, eps=l2_eps)
    gates = kda_gates_w8a8(np.asarray(f_a, F32).reshape(1, -1), np.asarray(g_a, F32).reshape(1, -1),
                           np.asarray(b, F32).reshape(1, -1), wf_codes, wf_scales, wg_codes, wg_scales,
                           a_log, dt_bias, lower_bound)
    return KdaConvGates(conv=conv, window=new_window, gates=gates)
