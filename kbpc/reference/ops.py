"""The reference backend's op table: one handler per blueprint op, built from the family modules.

Each handler returns either one value (assigned to every output edge of the node) or a dict of
output name -> value. Rows are kept 2-D (1, width) for a decode step; routed slots (1, k, width)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kbpc.errors import KbpcError
from kbpc.ir.records import Node
from kbpc.reference import (argmax_host, causal_conv1d_l2norm, dense_bf16, dsa_indexer,
                            glm_mhc, glm_mla_decode, glm_mla_latent_write, glm_moe_combine,
                            glm_router_topk, glm_swiglu_clamp, kda_o_norm, kda_pack,
                            kda_recurrent, layer_norm, rms_norm, w4a4_mx, w4a16_gemv,
                            w8a8_act_quant, wxay)
from kbpc.reference.f32ops import sigmoid_f32
from kbpc.reference.formats import quantize_nvfp4_rows, quantize_nvfp4_static
from kbpc.reference.interpreter import Inputs, Step
from kbpc.reference.kda_gates_w8a8 import decay_gate
from kbpc.reference.state import LatentCache

F32 = np.float32


@dataclass(frozen=True)
class SiluInput:
    """silu(g) * u kept in FP32 for the GEMV that consumes it (w4a16_gemv_silu_input)."""
    clamped: np.ndarray   # [g_hat | u_hat] FP32


def embed(s: Step, node: Node, ins: Inputs):
    table = s.bf16(node)
    return table[s.token][None, :]


def hc_expand(s: Step, node: Node, ins: Inputs):
    return glm_mhc.hc_expand(ins.activation(), s.sym["hc"])


def hc_mix(s: Step, node: Node, ins: Inputs):
    return glm_mhc.hc_mix(ins.activation(), s.bf16(node), s.c.hc_norm_eps)


def _streams(ins: Inputs):
    return ins.from_op("hc_post", "hc_expand")


def hc_pre(s: Step, node: Node, ins: Inputs):
    y, post, comb = glm_mhc.hc_pre(ins.from_op("linear:hc_mix"), _streams(ins), s.w(node, "alpha"),
                                   s.w(node, "beta"), s.c.hc_eps, s.c.sinkhorn_iters)
    return {"u": y, "post": post, "comb": comb}


def hc_post(s: Step, node: Node, ins: Inputs):
    pre_items = [(t, n, v) for t, n, v in ins.items if n.op == "hc_pre"]
    post = next(v for t, _, v in pre_items if t.id.endswith(".post"))
    comb = next(v for t, _, v in pre_items if t.id.endswith(".comb"))
    branch = [v for t, n, v in ins.items if n.op not in ("hc_pre", "hc_post", "hc_expand")]
    x = _streams(ins)
    n = x.shape[-2]
    return glm_mhc.hc_post(x, branch[0], post, np.asarray(comb, F32).reshape(post.shape[:-1] + (n, n)))


def hc_contract(s: Step, node: Node, ins: Inputs):
    return glm_mhc.hc_head(ins.activation())


def norm(s: Step, node: Node, ins: Inputs):
    x = ins.activation()
    if node.family == "glm_mhc":
        return glm_mhc.hc_norm(x, s.bf16(node), s.c.hc_site_norm_eps)
    if node.family == "glm_mla_latent_write":
        return x  # normalised together with the FP8 store by kv_write (one kernel)
    return rms_norm.rms_norm(x, s.bf16(node), s.c.rms_eps, weight=rms_norm.weight_form(node))


def act_quant(s: Step, node: Node, ins: Inputs):
    x = ins.activation()
    fmt = node.precision.output[0]
    if fmt == "fp8/token":
        return w8a8_act_quant.quant_row(x.reshape(-1, x.shape[-1]))
    if fmt == "nvfp4/g16":
        if node.family == "w4a4_mx_static":
            consumer = s.bp.node(s.bp.outputs(node.order)[0].dst)
            return quantize_nvfp4_static(x, s.w(consumer, "input_scale"))
        return quantize_nvfp4_rows(x)
    raise KbpcError(f"act_quant to {fmt!r} is not supported", f"node {node.id}")


def linear(s: Step, node: Node, ins: Inputs):
    x = ins.activation()
    wfmt, afmt = node.precision.weight, node.precision.activation
    out_f32 = node.precision.output[:1] == ("f32",)
    if wfmt == "bf16":
        return dense_bf16.dense_gemv_bf16(x, s.bf16(node), "f32" if out_f32 else "bf16")
    if wfmt == "fp8/channel":
        codes, scales = x
        return wxay.wxay_rowscale(codes, scales, *s.fp8(node))
    if wfmt == "nvfp4/g16" and afmt == "nvfp4/g16":
        return w4a4_mx.w4a4_gemv(*x, *s.nvfp4(node))
    if wfmt == "nvfp4/g16":
        if isinstance(x, SiluInput):
            g, u = glm_swiglu_clamp.split_gate_up(x.clamped)
            return w4a16_gemv.w4a16_gemv_silu_input(g, u, *s.nvfp4(node))
        return w4a16_gemv.w4a16_gemv(x, *s.nvfp4(node), walk="chunk16")
    raise KbpcError(f"no reference product for weight {wfmt} x activation {afmt}", f"node {node.id}")


def experts(s: Step, node: Node, ins: Inputs):
    ids = next(v for t, _, v in ins.items if t.format == "i32")
    act = next(v for t, _, v in ins.items if t.format != "i32")
    return w4a4_mx.w4a4_moe_slots(*act, *s.nvfp4(node), ids)


def top_k(s: Step, node: Node, ins: Inputs):
    w, ids = glm_router_topk.router_topk(ins.activation(), s.w(node, "e_score_correction_bias"),
                                         s.sym["top_k"], s.c.routed_scale)
    return {"topk_w": w, "topk_id": ids}


def swiglu_clamp(s: Step, node: Node, ins: Inputs):
    return glm_swiglu_clamp.clamp_gate_up(ins.activation(), s.c.swiglu_limit)


def silu_mul(s: Step, node: Node, ins: Inputs):
    clamped = ins.activation()
    if node.family == "w4a16_gemv":  # fused into the down GEMV's input (FP32, not rounded)
        return SiluInput(clamped)
    return glm_swiglu_clamp.silu_mul(clamped, "bf16")


def blend(s: Step, node: Node, ins: Inputs):
    weights = ins.from_op("top_k")
    routed = ins.from_op("expert_down")
    shared = next(v for t, n, v in ins.items if n.op_base == "linear")
    # The blend reads the weights, not the ids: an unfilled slot (-1) has weight 0 and a +0 output.
    return glm_moe_combine.moe_combine(weights, routed, shared)


def concat(s: Step, node: Node, ins: Inputs):
    q, k, v = (val for _, _, val in ins.items)
    return kda_pack.kda_pack(q, k, v)


def conv1d_update(s: Step, node: Node, ins: Inputs):
    x = np.asarray(ins.activation(), F32).reshape(-1)
    channels = x.shape[-1]
    window = s.state.conv.get(node.id)
    if window is None:
        window = np.zeros((channels, s.c.conv_width), F32)
    qk = sum(t.dim_value for t in s.bp.inputs(s.producer(node, "concat").order)[:2])
    y, new = causal_conv1d_l2norm.causal_conv1d_update_l2norm(
        x, window, s.bf16(node, "conv_weight"), s.bf16(node, "conv_bias"), c_qk=qk,
        d_k=s.sym["lin_k_dim"], eps=s.c.l2_norm_eps)
    s.state.conv[node.id] = new
    return y[None, :]  # the conv, SiLU and L2 norm are one kernel; l2_norm passes this through


def passthrough(s: Step, node: Node, ins: Inputs):
    return ins.activation()


def no_output(s: Step, node: Node, ins: Inputs):
    return {}


def gdn_gates(s: Step, node: Node, ins: Inputs):
    f, b = ins.named("f"), ins.named("b")
    decay = decay_gate(f, s.w(node, "A_log"), s.w(node, "dt_bias"), s.c.kda_gate_lower_bound)
    return {"decay": decay, "beta": sigmoid_f32(np.asarray(b, F32))}


def gdn_recurrence(s: Step, node: Node, ins: Inputs):
    qkv = np.asarray(ins.named("qkvn"), F32).reshape(-1)
    decay, beta = ins.named("decay"), ins.named("beta")
    heads, d = np.asarray(beta).size, s.sym["lin_k_dim"]
    n_qk = s.sym["lin_k_heads"] * d
    q, k, v = qkv[:n_qk], qkv[n_qk:2 * n_qk], qkv[2 * n_qk:]
    state = s.state.recurrent.get(node.id)
    if state is None:
        state = np.zeros((heads, d, v.size // heads), F32)
    o, new = kda_recurrent.kda_step(state, q.reshape(-1, d), k.reshape(-1, d), v.reshape(heads, -1),
                                    np.asarray(decay, F32).reshape(heads, d), np.asarray(beta, F32).reshape(heads))
    s.state.recurrent[node.id] = new
    return o.reshape(1, -1)


def gated_rms_norm(s: Step, node: Node, ins: Inputs):
    return kda_o_norm.kda_o_norm(ins.named("core"), ins.named("g"), s.bf16(node), s.c.kda_norm_eps,
                                 s.sym["lin_v_dim"])


def _latent(s: Step, writer: Node, width: int) -> LatentCache:
    cache = s.state.latent.get(writer.id)
    if cache is None:
        cache = LatentCache.for_context(s.state.max_context, s.c.latent_page_tokens, width)
        s.state.latent[writer.id] = cache
    return cache


def kv_write(s: Step, node: Node, ins: Inputs):
    c = np.asarray(ins.activation(), F32).reshape(1, -1)
    norm_node = s.producer(node, "rms_norm")
    cache = _latent(s, node, c.shape[-1])
    cache.codes = glm_mla_latent_write.latent_write(
        cache.codes, c, s.bf16(norm_node), [cache.slot(s.position)], s.c.rms_eps,
        float(s.w(node, "k_scale")))
    return {}


def layer_norm_op(s: Step, node: Node, ins: Inputs):
    return layer_norm.layer_norm(ins.activation(), s.bf16(node), s.bf16(node, "bias"), s.c.layer_norm_eps)


def _indexer(s: Step, node: Node):
    key = node.block
    if key not in s.state.indexer:
        geo = dsa_indexer.IndexerGeometry.from_symbols(s.sym)
        pools = -(-s.state.max_context // geo.pool)
        s.state.indexer[key] = (geo, dsa_indexer.IndexerCache.empty(geo, geo.pool, pools, s.state.index_cache))
    return s.state.indexer[key]


def kpool_compress(s: Step, node: Node, ins: Inputs):
    geo, cache = _indexer(s, node)
    key = ins.from_op("layer_norm").reshape(-1)
    gate = next(v for t, n, v in ins.items if n.op_base == "linear").reshape(-1)
    dsa_indexer.store_token(cache, geo, s.position, key, gate, s.w(node, "slot_bias"))
    return {}


def index_select(s: Step, node: Node, ins: Inputs):
    geo, cache = _indexer(s, node)
    q = np.asarray(ins.named("iq"), F32).reshape(geo.heads, geo.head_dim)
    raw_w = np.asarray(ins.named("iw"), F32).reshape(geo.heads)
    pool_keys = cache.pool_values(dsa_indexer.valid_pools(geo, s.position + 1, s.position))
    _, tokens = dsa_indexer.select_tokens(geo, q, raw_w, pool_keys, s.position + 1, s.position)
    return np.asarray(tokens, np.int32)[None, :]


def mla_attention(s: Step, node: Node, ins: Inputs):
    sel = ins.from_op("index_select").reshape(-1)
    q = next(v for t, n, v in ins.items if n.op_base == "linear")
    writer = next(n for n in s.bp.nodes() if n.op == "kv_write" and n.block == node.block)
    cache = _latent(s, writer, s.sym["kv_lora"])
    q = np.asarray(q, F32).reshape(-1, cache.layout.latent_dim)
    o = glm_mla_decode.mla_decode(q, cache.rows, sel, s.position + 1, float(s.w(writer, "k_scale")))
    return o.reshape(1, -1)


def argmax(s: Step, node: Node, ins: Inputs):
    logits = np.asarray(ins.activation(), F32).reshape(-1)
    token = int(argmax_host.argmax_host(logits))
    return {"__logits": logits, "__token": token}


HANDLERS = {
    "embed": embed, "hc_expand": hc_expand, "linear:hc_mix": hc_mix, "hc_pre": hc_pre,
    "hc_post": hc_post, "hc_contract": hc_contract, "rms_norm": norm, "final_norm": norm,
    "act_quant": act_quant, "linear": linear, "lm_head": linear, "router": linear,
    "expert_gate_up": experts, "expert_down": experts, "top_k": top_k,
    "swiglu_clamp": swiglu_clamp, "silu_mul": silu_mul, "blend": blend, "concat": concat,
    "conv1d_update": conv1d_update, "state_snapshot": no_output, "l2_norm": passthrough,
    "gdn_gates": gdn_gates, "gdn_recurrence": gdn_recurrence, "gated_rms_norm": gated_rms_norm,
    "kv_write": kv_write, "layer_norm": layer_norm_op, "kpool_compress": kpool_compress,
    "index_select": index_select, "mla_attention": mla_attention, "argmax": argmax,
}
