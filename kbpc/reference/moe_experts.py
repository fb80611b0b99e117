"""moe_experts: a MoE layer's router and expert GEMVs as the fused launches of kernels/moe_experts.cuh
compute them (fusion rules moe_experts and moe_gate_up_pair).

The launches put the shared expert's tiles beside the routed ones and end the routed gate/up in
the down projection's NVFP4 input, but add no rounding point: every value is its family's, by its
module, in the order the kernels compose them (one token):

    logits = dense_gemv_bf16(x, W_router) in FP32; (w, ids) = router_topk(logits, bias)  (glm_router_topk)
    a = quantize_nvfp4_static(x, gamma_in)                           (the experts' input, once)
    gu_s = w4a4_moe_slots(a, gate_up, ids)                           (BF16 [gate | up] of slot s)
    h = quantize_nvfp4_static(swiglu_clamp_rows(gu_s, L), gamma_dn)  (the down input: codes, scales, g)
    y_s = w4a4_moe_slots(h, down, ids)                               (BF16, +0 for an id of -1)
    sh_x = silu(min(g, L)) * min(max(u, -L), L), [g | u] = w4a16_gemv(x, shared gate_up)   (FP32)
    sh_y = w4a16_gemv(sh_x, shared down, walk vec8)                  (w4a16_gemv_silu_input's walk)

Weights as the reference's modules take them: W_router (E, H) BF16 values, the routed stacks
(packed (E, N, K/2), scales (E, N, K/16), global (E,)), the shared weights (packed, scales, s_g)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kbpc.reference.dense_bf16 import dense_gemv_bf16
from kbpc.reference.formats import quantize_nvfp4_static
from kbpc.reference.glm_router_topk import router_topk
from kbpc.reference.glm_swiglu_clamp import clamp_gate_up, split_gate_up, swiglu_clamp_rows
from kbpc.reference.w4a4_mx import w4a4_moe_slots
from kbpc.reference.w4a16_gemv import silu_input, w4a16_gemv

F32 = np.float32


@dataclass(frozen=True)
class MoeExperts:
    """One token's outputs of the launches: the router's (weights, ids, the experts' NVFP4 input),
    the down projection's NVFP4 input per slot, the routed down rows (slots, N), the shared
    expert's FP32 down input (I_sh,) and its output (N,)."""
    weights: np.ndarray
    ids: np.ndarray
    expert_input: tuple
    down_input: tuple
    routed: np.ndarray
    shared_input: np.ndarray
    shared: np.ndarray


def moe_experts(x, w_router, bias, *, top_k: int, routed_scale: float, gamma_in, gate_up: tuple, gamma_dn,
                down: tuple, shared_gate_up: tuple, shared_down: tuple, limit: float) -> MoeExperts:
    """x: one BF16 row (H,) as float32 values; see the module docstring for the rest."""
    x = np.asarray(x, F32).reshape(1, -1)
    logits = dense_gemv_bf16(x, w_router, out_dtype="f32")
    weights, ids = router_topk(logits, bias, top_k, routed_scale)
    a = quantize_nvfp4_static(x, gamma_in)
    gu = w4a4_moe_slots(*a, *gate_up, ids)            # (1, top_k, 2I): the token's row shared by its slots
    h = quantize_nvfp4_static(swiglu_clamp_rows(gu, limit), gamma_dn)
    routed = w4a4_moe_slots(*h, *down, ids)[0]         # one row per slot
    g, u = split_gate_up(clamp_gate_up(w4a16_gemv(x, *shared_gate_up), limit))
    sh_x = silu_input(g, u)
    shared = w4a16_gemv(sh_x, *shared_down, walk="vec8")
    return MoeExperts(weights[0], ids[0], a, h, routed, sh_x[0], shared[0])
