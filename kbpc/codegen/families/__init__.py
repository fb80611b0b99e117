"""Family lowerings: one module per kernel family, each `lower(ctx, group) -> list[Launch]`
turning one lowered group into launches of its kernels/ header. The table is explicit and keyed
by (family, variant)."""
from __future__ import annotations

from typing import Callable

from kbpc.codegen.context import LowerCtx, LoweringError
from kbpc.codegen.families import (causal_conv1d_l2norm, dense_bf16, dequant_gemv, dsa_indexer, embed_copy,
                                    glm_mhc, glm_mla_decode, glm_mla_latent_write, glm_moe_combine,
                                    glm_moe_layer, glm_router_topk, glm_swiglu_clamp, kda_conv_gates,
                                    kda_fused, kda_gates_w8a8, kda_o_norm,
                                    kda_pack, kda_recurrent, layer_norm, moe_experts, rms_norm, w4a4_mx,
                                    w4a4_mx_static, w4a16_gemv, w8a8_act_quant, wxay)
from kbpc.codegen.records import Launch
from kbpc.ir.plan import LoweredGroup

Lowering = Callable[[LowerCtx, LoweredGroup], list[Launch]]

# (family, variant) -> lowering. The variant is what lower_precision chose for the target
# (kbpc.targets.variant_for), so a target is a row of that table plus the variants listed here.
LOWERINGS: dict[tuple[str, str], Lowering] = {
    ("causal_conv1d_l2norm", "cuda_core"): causal_conv1d_l2norm.lower,
    ("dense_bf16", "cuda_core"): dense_bf16.lower,
    ("dsa_indexer", "cuda_core"): dsa_indexer.lower,
    ("embed_copy", "host"): embed_copy.lower,          # a host-planned row copy, run as a kernel
    ("glm_mhc", "cuda_core"): glm_mhc.lower,
    ("glm_mla_decode", "cuda_core"): glm_mla_decode.lower,
    ("glm_mla_latent_write", "cuda_core"): glm_mla_latent_write.lower,
    ("glm_moe_combine", "cuda_core"): glm_moe_combine.lower,
    ("glm_moe_layer", "e2m1_dp4a_exact"): glm_moe_layer.lower,   # the fused MoE layer (rule moe_layer)
    ("glm_router_topk", "cuda_core"): glm_router_topk.lower,
    ("glm_swiglu_clamp", "cuda_core"): glm_swiglu_clamp.lower,
    ("kda_conv_gates", "fp8_mma"): kda_conv_gates.lower,   # conv + gates side by side (rule kda_conv_gates)
    ("kda_fused", "fp8_mma"): kda_fused.lower,         # a merged KDA chain group (fusion rule kda_chain)
    ("kda_gates_w8a8", "fp8_mma"): kda_gates_w8a8.lower,
    ("kda_o_norm", "cuda_core"): kda_o_norm.lower,
    ("kda_pack", "cuda_core"): kda_pack.lower,
    ("kda_recurrent", "cuda_core"): kda_recurrent.lower,
    ("layer_norm", "cuda_core"): layer_norm.lower,
    ("moe_experts", "e2m1_dp4a_exact"): moe_experts.lower,   # router + experts (rules moe_experts, moe_gate_up_pair, moe_*_flow)
    ("rms_norm", "cuda_core"): rms_norm.lower,
    ("w4a16_gemv", "cuda_core"): w4a16_gemv.lower,
    ("w4a4_mx", "e2m1_dp4a_exact"): w4a4_mx.lower,
    ("w4a4_mx_static", "e2m1_dp4a_exact"): w4a4_mx_static.lower,
    ("w8a8_act_quant", "cuda_core"): w8a8_act_quant.lower,
    ("wxay", "fp8_mma"): wxay.lower,
    # Builds without activation quantization (Options.act_quant off, a debugging aid):
    ("glm_mla_decode", "unquantized"): glm_mla_decode.lower_unquantized,
    ("glm_mla_latent_write", "unquantized"): glm_mla_latent_write.lower_unquantized,
    ("kda_gates_w8a8", "unquantized"): kda_gates_w8a8.lower_unquantized,
    ("w4a4_mx", "unquantized"): dequant_gemv.lower,
    ("w4a4_mx_static", "unquantized"): dequant_gemv.lower,
    ("w8a8_act_quant", "unquantized"): dequant_gemv.lower,
    ("wxay", "unquantized"): dequant_gemv.lower,
}


def lower_group(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    fn = LOWERINGS.get((group.family, group.variant))
    if fn is None:
        known = sorted(v for f, v in LOWERINGS if f == group.family)
        what = (f"variant {group.variant!r} of kernel family {group.family!r} (lowered: {', '.join(known)})"
                if known else f"kernel family {group.family!r}")
        raise LoweringError(f"no code generation for {what} (group rule {group.rule})", f"group {group.id}")
    return fn(ctx, group)
