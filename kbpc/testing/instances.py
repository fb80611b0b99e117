"""The kernel instances the GPU tests launch through the product's launchers (kbpc.testing.launchers),
built as the family lowerings build them: the same family, header, kernel string and parameter
types. A lowering's own instance function is used where it has one; the rest mirror the lowering's
inline KernelInstance, and tests/unit/test_testing_instances.py holds every mirror to what the
lowerings emit for the example blueprints (MIRRORS, keyed by the C++ template name).

A few instances are a header's own __global__ template that no lowering launches (yet): the
pointer-table segment GEMVs, the split-K FP8 GEMVs, the SiLU-input and group-128 quantizer forms,
the standalone hyper-connection pre-mix and gates. The GPU tests launch those through the same
launcher template, so no test carries a hand-written extern "C" wrapper of a kernel body."""
from __future__ import annotations

import re
from typing import Callable

from kbpc.codegen.families import (dense_bf16, embed_copy, glm_mhc, glm_mla_latent_write, glm_moe_combine,
                                    glm_swiglu_clamp, w4a4_mx, w4a4_mx_static, w4a16_gemv, w8a8_act_quant, wxay)
from kbpc.codegen.records import KernelInstance

BF = "__nv_bfloat16"
W4 = w4a16_gemv.W4                                         # NVFP4 weight: codes, scales, tensor scale
W4_OUT = (f"const {BF}*", f"{BF}*", "int")                 # x, y, N after the weight
FP8_ROW = ("const uint8_t*", "const float*")               # an fp8/token row: codes, scale
QUANT_OUT = ("uint8_t*", "float*")                         # w8a8 quantizer outputs: codes, scales


def _flag(b: bool) -> str:
    return "true" if b else "false"


# ------------------------------------------------------------------ projections

def dense(k: int, out: str, opc: int = 4) -> KernelInstance:
    """dense_bf16: out is the C type of y (__nv_bfloat16 or float); opc outputs per CTA."""
    return dense_bf16.instance(k, out, opc)


def w4a16(k: int) -> KernelInstance:
    return KernelInstance("w4a16_gemv", w4a16_gemv.HEADER, f"kbp::w4a16_gemv<{k}>", (*W4, *W4_OUT))


def w4a16_seg(k: int) -> KernelInstance:
    """The pointer-table segment form (a device array of W4A16Seg); not lowered."""
    return KernelInstance("w4a16_gemv", w4a16_gemv.HEADER, f"kbp::w4a16_gemv_seg<{k}>",
                          ("const kbp::W4A16Seg*", "int", f"const {BF}*"))


def w4a16_seg_list(k: int, nseg: int) -> KernelInstance:
    return KernelInstance("w4a16_gemv", w4a16_gemv.HEADER, f"kbp::w4a16_gemv_seg_list<{k}, {nseg}>",
                          (f"kbp::W4A16SegList<{nseg}>", f"const {BF}*"))


def w4a16_silu_input(k: int) -> KernelInstance:
    """y = W (silu(g) * u); not lowered (the shared pair's phase 1 is the clamped form)."""
    return KernelInstance("w4a16_gemv", w4a16_gemv.HEADER, f"kbp::w4a16_gemv_silu_input<{k}>",
                          (*W4, f"const {BF}*", *W4_OUT))


def w4a16_silu_clamp_input(k: int) -> KernelInstance:
    """y = W (silu(clamp g) * clamp u); not lowered on its own."""
    return KernelInstance("w4a16_gemv", w4a16_gemv.HEADER, f"kbp::w4a16_gemv_silu_clamp_input<{k}>",
                          (*W4, f"const {BF}*", f"const {BF}*", "float", f"{BF}*", "int"))


def w4a16_shared_pair(k: int, i: int) -> KernelInstance:
    return w4a16_gemv.pair_instance(k, i)                   # the lowering's own


def w4a16_mma_shared_pair(k: int, i: int, ks0: int, t0: int, ks1: int, t1: int) -> KernelInstance:
    return w4a16_gemv.pair_instance(k, i, (ks0, t0, ks1, t1))


def _pf(pf: int | None) -> str:
    """The optional L2 prefetch argument of the fast W4A16 forms (written as the lowering writes it)."""
    return "" if pf is None else f", {pf}"


def w4a16_mma(k: int, ks: int, t: int, pf: int | None = None) -> KernelInstance:
    return KernelInstance("w4a16_gemv", w4a16_gemv.MMA_HEADER, f"kbp::w4a16_mma<{k}, {ks}, {t}{_pf(pf)}>",
                          (*W4, *W4_OUT))


def w4a16_mma_f32_input(k: int, ks: int, t: int) -> KernelInstance:
    """The fast pair's phase 1 on its own (an FP32 input row staged as FP16); not lowered."""
    return KernelInstance("w4a16_gemv", w4a16_gemv.MMA_HEADER, f"kbp::w4a16_mma_f32_input<{k}, {ks}, {t}>",
                          (*W4, "const float*", f"{BF}*", "int"))


def w4a16_mma_seg_list(k: int, ks: int, t: int, nseg: int, pf: int | None = None) -> KernelInstance:
    return KernelInstance("w4a16_gemv", w4a16_gemv.MMA_HEADER,
                          f"kbp::w4a16_mma_seg_list<{k}, {ks}, {t}, {nseg}{_pf(pf)}>",
                          (f"kbp::W4A16SegList<{nseg}>", f"const {BF}*"))


def w4a4_quant_rows(k: int) -> KernelInstance:
    return KernelInstance("w4a4_mx", w4a4_mx.HEADER, f"kbp::w4a4_quant_rows<{k}>",
                          (f"const {BF}*", "uint8_t*", "uint8_t*", "float*"))


w4a4_gemv = w4a4_mx.gemv_instance                                # the lowering's own


def w4a4_quant_rows_static(k: int) -> KernelInstance:
    return KernelInstance("w4a4_mx_static", w4a4_mx_static.HEADER, f"kbp::w4a4_quant_rows_static<{k}>",
                          (f"const {BF}*", "float", "uint8_t*", "uint8_t*", "float*"))


w4a4_moe_slots = w4a4_mx_static.slots_instance                   # the lowering's own
w4a4_quant_swiglu_rows_static = w4a4_mx_static.quant_swiglu_instance
w4a4_moe_gate_up_swiglu = w4a4_mx_static.gate_up_swiglu_instance
w4a4_moe_slots_after_quant = w4a4_mx_static.slots_after_quant_instance


def w4a4_moe_slots_bf16(k: int) -> KernelInstance:
    return KernelInstance("w4a4_mx_static", w4a4_mx_static.HEADER, f"kbp::w4a4_gemv_moe_slots_bf16<{k}>",
                          ("const int*", "int", f"const {BF}*", "float", *w4a4_mx_static.W_PARAMS))


def _exact_arg(exact: bool) -> str:
    return ", true" if exact else ""


def wxay_rowscale(k: int, exact: bool = False) -> KernelInstance:
    return KernelInstance("wxay", wxay.HEADER, f"kbp::wxay_rowscale<{k}{_exact_arg(exact)}>",
                          (*FP8_ROW, "const uint8_t*", "const float*", f"{BF}*", "int"))


def wxay_split(k: int) -> KernelInstance:
    """The pointer-table split form (a device array of WxaySeg); not lowered."""
    return KernelInstance("wxay", wxay.HEADER, f"kbp::wxay_rowscale_split<{k}>", ("const kbp::WxaySeg*", "int",
                                                                                   *FP8_ROW))


def wxay_split_list(k: int, nseg: int, exact: bool = False) -> KernelInstance:
    return KernelInstance("wxay", wxay.HEADER, f"kbp::wxay_rowscale_split_list<{k}, {nseg}{_exact_arg(exact)}>",
                          (f"kbp::WxaySegList<{nseg}>", *FP8_ROW))


def wxay_rowscale_ks(k: int, warps: int) -> KernelInstance:
    """W warps per CTA, partials through a global scratch and per-tile counters; not lowered."""
    return KernelInstance("wxay", wxay.HEADER, f"kbp::wxay_rowscale_ks<{k}, {warps}>",
                          (*FP8_ROW, "const uint8_t*", "const float*", f"{BF}*", "int", "float*", "unsigned int*"))


def wxay_split_ks(k: int, warps: int, nseg: int) -> KernelInstance:
    return KernelInstance("wxay", wxay.HEADER, f"kbp::wxay_rowscale_split_ks<{k}, {warps}, {nseg}>",
                          (f"kbp::WxaySegList<{nseg}>", *FP8_ROW, "float*", "unsigned int*"))


def w8a8_quant_cluster(k: int, cl: int) -> KernelInstance:
    """One cl-CTA thread-block cluster a row (w8a8_act_quant.row_cluster picks cl)."""
    return KernelInstance("w8a8_act_quant", w8a8_act_quant.HEADER, f"kbp::w8a8_act_quant_row_cluster<{k}, {cl}>",
                          (f"const {BF}*", *QUANT_OUT), cluster=cl)


def w8a8_quant(k: int, form: str = "row", split: int = 1) -> KernelInstance:
    """form: row (lowered; split CTAs per row as w8a8_act_quant.row_split picks), g128, silu_row,
    silu_g128 (the SiLU forms read gate and up rows)."""
    ins = (f"const {BF}*", f"const {BF}*") if form.startswith("silu") else (f"const {BF}*",)
    targs = f"{k}" if split == 1 else f"{k}, {split}"
    return KernelInstance("w8a8_act_quant", w8a8_act_quant.HEADER, f"kbp::w8a8_act_quant_{form}<{targs}>",
                          (*ins, *QUANT_OUT))


# ------------------------------------------------------------------ MoE glue, embedding, hyper-connections

def swiglu(inter: int, vec: int, out: str = glm_swiglu_clamp.OUT_BF16, zero_fill: bool = False) -> KernelInstance:
    return KernelInstance("glm_swiglu_clamp", glm_swiglu_clamp.HEADER,
                          f"kbp::swiglu_clamp<{inter}, {vec}, {out}, {_flag(zero_fill)}>", glm_swiglu_clamp.PARAMS)


def moe_combine(d: int, k: int, vec: int) -> KernelInstance:
    return KernelInstance("glm_moe_combine", glm_moe_combine.HEADER, f"kbp::moe_combine<{d}, {k}, {vec}>",
                          glm_moe_combine.PARAMS)


def embed(d: int, vec: int) -> KernelInstance:
    return KernelInstance("embed_copy", embed_copy.HEADER, f"kbp::embed_copy<{d}, {vec}>", embed_copy.PARAMS)


def hc_expand(n: int, d: int, vec: int) -> KernelInstance:
    return KernelInstance("glm_mhc", glm_mhc.HEADER, f"kbp::mhc::hc_expand<{n}, {d}, {vec}>",
                          (f"const {BF}*", "float*"))


def hc_post(n: int, d: int, ranks: int, vec: int) -> KernelInstance:
    return KernelInstance("glm_mhc", glm_mhc.HEADER, f"kbp::mhc::hc_post<{n}, {d}, {ranks}, {vec}>",
                          ("const float*", f"kbp::mhc::RankParts<{ranks}>", "const float*", "const float*", "float*"))


def hc_head(n: int, d: int, vec: int) -> KernelInstance:
    return KernelInstance("glm_mhc", glm_mhc.HEADER, f"kbp::mhc::hc_head<{n}, {d}, {vec}>", ("const float*", f"{BF}*"))


def hc_pre_norm(n: int, d: int, fuse_post: bool, ranks: int) -> KernelInstance:
    """The standalone pre-mix (the product launches the boundary form, glm_mhc.boundary_instance)."""
    return KernelInstance("glm_mhc", glm_mhc.HEADER, f"kbp::mhc::hc_pre_norm<{n}, {d}, {_flag(fuse_post)}, {ranks}>",
                          (f"kbp::mhc::PreParams<{n}, {ranks}>",))


hc_gates = glm_mhc.gates_instance   # the lowering's own (GATES_ASIDE)


# ------------------------------------------------------------------ KDA, norms, latent write

def kda_pack(nq: int, nk: int, nv: int, threads: int = 256) -> KernelInstance:
    return KernelInstance("kda_pack", "kda_pack.cuh", f"kbp::kda_pack_qkv_bf16<{nq}, {nk}, {nv}, {threads}>",
                          (f"const {BF}*", f"const {BF}*", f"const {BF}*", "int", "int", "int", f"{BF}*", "int"))


def causal_conv(c: int, c_qk: int, dk: int, width: int, threads: int, out: str = BF) -> KernelInstance:
    """out: the C type of y (the lowering writes BF16; FP32 is the header's other form)."""
    return KernelInstance("causal_conv1d_l2norm", "causal_conv1d_l2norm.cuh",
                          f"kbp::causal_conv1d_update_l2norm<{c}, {c_qk}, {dk}, {width}, {threads}, {out}>",
                          (f"const {BF}*", "int", "float*", "long", f"const {BF}*", f"const {BF}*", "float",
                           f"{out}*", "int"))


def kda_recurrent(hk: int, hv: int, dk: int, dv: int, cols: int, tokens: int) -> KernelInstance:
    return KernelInstance("kda_recurrent", "kda_recurrent.cuh",
                          f"kbp::kda_recurrent_decode_bf16_seq_reg<{hk}, {hv}, {dk}, {dv}, {cols}, {tokens}>",
                          (f"const {BF}*", f"const {BF}*", f"const {BF}*", "int", "const float*", "int",
                           "const float*", "int", "float", "float*", "long", "float*", "float*", "int"))


def kda_o_norm(h: int, d: int) -> KernelInstance:
    return KernelInstance("kda_o_norm", "kda_o_norm.cuh", f"kbp::kda_o_norm_gated_bf16<{h}, {d}>",
                          ("const float*", "int", f"const {BF}*", "int", f"const {BF}*", "int", "float",
                           f"{BF}*", "int"))


def kda_gates(n: int, k: int, dk: int, warps: int) -> KernelInstance:
    return KernelInstance("kda_gates_w8a8", "kda_gates_w8a8.cuh",
                          f"kbp::kda_gates_w8a8_k128_rows<{n}, {k}, {dk}, {warps}>",
                          (f"const {BF}*", f"const {BF}*", "int", "int", "const uint8_t*", "const float*",
                           "const uint8_t*", "const float*", "const float*", "const float*", "float", f"const {BF}*",
                           "int", "float*", "int", f"{BF}*", "int", "float*", "int", f"{BF}*", "int"))


def rms_norm(d: int, threads: int, one_plus: bool, mode: int) -> KernelInstance:
    """mode: kbp::RmsMode (the lowering launches 0, kNormOnly)."""
    return KernelInstance("rms_norm", "rms_norm.cuh", f"kbp::rms_norm<{d}, {threads}, {_flag(one_plus)}, {mode}>",
                          (f"{BF}*", "long", "long", f"const {BF}*", "long", f"{BF}*", "long",
                           f"const {BF}*", "float", f"{BF}*", "long", "long"))


def layer_norm(d: int, threads: int) -> KernelInstance:
    return KernelInstance("layer_norm", "layer_norm.cuh", f"kbp::layer_norm_bf16<{d}, {threads}>",
                          (f"const {BF}*", "long", f"const {BF}*", f"const {BF}*", "float", f"{BF}*", "long"))


def latent_write_paged(e: int) -> KernelInstance:
    return KernelInstance("glm_mla_latent_write", "glm_mla_latent_write.cuh",
                          f"kbp::glm_mla_latent_write_fp8_paged<{e}>", glm_mla_latent_write.PARAMS)


# ------------------------------------------------------------------ mirrors of lowered kernels

# C++ template name -> the builder that mirrors its lowering, taking the template arguments in order.
MIRRORS: dict[str, Callable[..., KernelInstance]] = {
    "kbp::dense_gemv_bf16": dense, "kbp::dense_gemv_bf16_opc": dense,
    "kbp::dense_gemv_bf16_scores_only": dense_bf16.scores_only_instance,
    "kbp::w4a16_gemv": w4a16, "kbp::w4a16_gemv_seg_list": w4a16_seg_list,
    "kbp::w4a16_shared_pair": w4a16_shared_pair, "kbp::w4a16_mma": w4a16_mma,
    "kbp::w4a16_mma_seg_list": w4a16_mma_seg_list, "kbp::w4a16_mma_shared_pair": w4a16_mma_shared_pair,
    "kbp::w4a4_quant_rows": w4a4_quant_rows, "kbp::w4a4_gemv": w4a4_gemv,
    "kbp::w4a4_quant_rows_static": w4a4_quant_rows_static, "kbp::w4a4_gemv_moe_slots": w4a4_moe_slots,
    "kbp::w4a4_gemv_moe_slots_bf16": w4a4_moe_slots_bf16,
    "kbp::w4a4_quant_swiglu_rows_static": w4a4_quant_swiglu_rows_static,
    "kbp::w4a4_gemv_moe_gate_up_swiglu": w4a4_moe_gate_up_swiglu,
    "kbp::w4a4_gemv_moe_slots_after_quant": w4a4_moe_slots_after_quant,
    "kbp::wxay_rowscale": wxay_rowscale, "kbp::wxay_rowscale_split_list": wxay_split_list,
    "kbp::w8a8_act_quant_row": lambda k, split=1: w8a8_quant(k, "row", split),
    "kbp::w8a8_act_quant_row_cluster": w8a8_quant_cluster,
    "kbp::swiglu_clamp": swiglu, "kbp::moe_combine": moe_combine, "kbp::embed_copy": embed,
    "kbp::mhc::hc_expand": hc_expand, "kbp::mhc::hc_post": hc_post, "kbp::mhc::hc_head": hc_head,
    "kbp::kda_pack_qkv_bf16": kda_pack, "kbp::causal_conv1d_update_l2norm": causal_conv,
    "kbp::kda_recurrent_decode_bf16_seq_reg": kda_recurrent, "kbp::kda_o_norm_gated_bf16": kda_o_norm,
    "kbp::kda_gates_w8a8_k128_rows": kda_gates,
    "kbp::rms_norm": rms_norm, "kbp::layer_norm_bf16": layer_norm,
    "kbp::glm_mla_latent_write_fp8_paged": latent_write_paged,
}


def template_args(kernel: str) -> tuple[str, list[int | bool | str]]:
    """('kbp::name', [arguments]) of a kernel string: integers and true/false as Python values, the
    rest (types, enumerators) as written."""
    m = re.fullmatch(r"([\w:]+)<(.*)>", kernel)
    if m is None:
        return kernel, []
    args: list[int | bool | str] = []
    for a in (s.strip() for s in m.group(2).split(",")):
        args.append(int(a) if re.fullmatch(r"-?\d+", a) else {"true": True, "false": False}.get(a, a))
    return m.group(1), args


def mirror(inst: KernelInstance) -> KernelInstance | None:
    """The builder's instance for a lowered instance's template arguments (None: no mirror)."""
    name, args = template_args(inst.kernel)
    build = MIRRORS.get(name)
    return build(*args) if build is not None else None
