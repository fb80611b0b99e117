"""Family lowerings: one module per kernel family, each `lower(ctx, group) -> list[Launch]`
turning one lowered group into launches of its kernels/ header. The table is explicit."""
from __future__ import annotations

from typing import Callable

from kbpc.codegen.context import LowerCtx, LoweringError
from kbpc.codegen.families import (causal_conv1d_l2norm, dense_bf16, dsa_indexer, embed_copy,
                                    glm_mhc, glm_mla_decode, glm_mla_latent_write, glm_moe_combine,
                                    glm_moe_layer,
                                    glm_router_topk, glm_swiglu_clamp, kda_gates_w8a8, kda_o_norm,
                                    kda_pack, kda_recurrent, layer_norm, rms_norm, w4a4_mx,
                                    w4a4_mx_static, w4a16_gemv, w8a8_act_quant, wxay)
from kbpc.codegen.records import Launch
from kbpc.ir.plan import LoweredGroup

Lowering = Callable[[LowerCtx, LoweredGroup], list[Launch]]

LOWERINGS: dict[str, Lowering] = {
    "causal_conv1d_l2norm": causal_conv1d_l2norm.lower,
    "dense_bf16": dense_bf16.lower,
    "dsa_indexer": dsa_indexer.lower,
    "embed_copy": embed_copy.lower,
    "glm_mhc": glm_mhc.lower,
    "glm_mla_decode": glm_mla_decode.lower,
    "glm_mla_latent_write": glm_mla_latent_write.lower,
    "glm_moe_combine": glm_moe_combine.lower,
    "glm_moe_layer": glm_moe_layer.lower,
    "glm_router_topk": glm_router_topk.lower,
    "glm_swiglu_clamp": glm_swiglu_clamp.lower,
    "kda_gates_w8a8": kda_gates_w8a8.lower,
    "kda_o_norm": kda_o_norm.lower,
    "kda_pack": kda_pack.lower,
    "kda_recurrent": kda_recurrent.lower,
    "layer_norm": layer_norm.lower,
    "rms_norm": rms_norm.lower,
    "w4a16_gemv": w4a16_gemv.lower,
    "w4a4_mx": w4a4_mx.lower,
    "w4a4_mx_static": w4a4_mx_static.lower,
    "w8a8_act_quant": w8a8_act_quant.lower,
    "wxay": wxay.lower,
}


def lower_group(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    fn = LOWERINGS.get(group.family)
    if fn is None:
        raise LoweringError(f"no code generation for kernel family {group.family!r} yet "
                            f"(group rule {group.rule})", f"group {group.id}")
    return fn(ctx, group)
