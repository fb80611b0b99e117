"""The GLM-5-next checkpoint family (transformers `glm5_next`, NVIDIA ModelOpt NVFP4 exports):
its config.json fields and its mapping table onto a glm5_next blueprint.

Names are transformers' module paths (`model.language_model.layers.N.self_attn.q_proj`, ...;
`model.` alone for a text-only export). Each rule's convention, where it has one, is documented
in kbpc/ir/config.py CONVENTIONS["glm5_next"]. Defaults for absent fields are transformers'
Glm5NextTextConfig defaults."""
from __future__ import annotations

from kbpc.errors import ConfigError
from kbpc.weights.hf_config import (ConfigField, HfModel, Requirement, check_requirements, get,
                                    read_fields)
from kbpc.weights.mapping import Family, MappingRule

SYMBOLS = (
    ConfigField("hidden", ("hidden_size",)),
    ConfigField("vocab", ("vocab_size",)),
    ConfigField("inter", ("intermediate_size",)),
    ConfigField("moe_inter", ("moe_intermediate_size",)),
    ConfigField("shared_inter", ("moe_intermediate_size", "n_shared_experts"), 1),
    ConfigField("experts", ("n_routed_experts",)),
    ConfigField("top_k", ("num_experts_per_tok",)),
    ConfigField("q_lora", ("q_lora_rank",)),
    ConfigField("kv_lora", ("kv_lora_rank",)),
    ConfigField("q_heads", ("num_attention_heads",)),
    # Absorbed MLA: every head's query and value live in the latent (CONVENTIONS mla_softmax_scale).
    ConfigField("mla_qk", ("kv_lora_rank",)),
    ConfigField("mla_v", ("kv_lora_rank",)),
    ConfigField("index_heads", ("index_n_heads",), 32),
    ConfigField("index_head_dim", ("index_head_dim",), 128),
    ConfigField("index_topk", ("index_topk",), 2048),
    ConfigField("index_kpool", ("index_kpool",), 16),               # CONVENTIONS index_kpool
    ConfigField("lin_k_heads", ("linear_num_heads",), 64),
    ConfigField("lin_v_heads", ("linear_num_heads",), 64),
    ConfigField("lin_k_dim", ("linear_head_dim",), 128),
    ConfigField("lin_v_dim", ("linear_head_dim",), 128),
    ConfigField("hc", ("hc_mult",), 4),
)

CONSTANTS = (
    ConfigField("rms_eps", ("rms_norm_eps",), 1e-5),
    ConfigField("hc_norm_eps", ("rms_norm_eps",), 1e-5),            # CONVENTIONS hc_norm_eps
    ConfigField("hc_site_norm_eps", ("rms_norm_eps",), 1e-5),
    ConfigField("kda_norm_eps", ("rms_norm_eps",), 1e-5),           # o_norm eps = rms_norm_eps
    ConfigField("hc_eps", ("hc_eps",), 1e-6),
    ConfigField("sinkhorn_iters", ("hc_sinkhorn_iters",), 20),
    ConfigField("swiglu_limit", ("swiglu_limit",), 10.0),
    ConfigField("routed_scale", ("routed_scaling_factor",), 2.5),
    ConfigField("conv_width", ("linear_conv_kernel_dim",), 4),
    ConfigField("kda_gate_lower_bound", ("linear_lower_bound",), -5.0),
)

# Constants the family fixes in code rather than in config.json.
FIXED = {
    "layer_norm_eps": (1e-6, "transformers Glm5NextTextIndexer.k_norm eps=1e-6 (not a config.json field)"),
    "l2_norm_eps": (1e-6, "transformers l2norm eps=1e-6 in the KDA kernels (not a config.json field)"),
}

REQUIREMENTS = (
    Requirement("qk_rope_head_dim", (0,), 0, "GLM-5 latent attention is NoPE"),
    Requirement("attention_bias", (False,), False, "the blueprint's projections have no bias"),
    Requirement("n_group", (1,), 1, "glm_router_topk does not use grouped routing"),
    Requirement("topk_group", (1,), 1, "glm_router_topk does not use grouped routing"),
    Requirement("norm_topk_prob", (True,), True, "glm_router_topk renormalises the routed weights"),
    Requirement("hidden_act", ("silu",), "silu", "glm_swiglu_clamp is SiLU"),
    Requirement("index_kpool_always_select_tail", (True,), True, "dsa_indexer always appends the tail"),
    Requirement("indexer_types", ("full",), "full", "every blueprint DSA layer runs its own indexer"),
)

ATTENTION_BLOCKS = {"linear_attention": "kda", "indexed_attention": "dsa", "full_attention": "dsa"}
FFN_BLOCKS = {"dense": "mlp", "sparse": "moe"}


def text_config(doc: dict, source: str) -> dict:
    text = doc.get("text_config", doc)
    if not isinstance(text, dict):
        raise ConfigError("text_config must be an object", source)
    model_type = text.get("model_type", doc.get("model_type"))
    if model_type not in ("glm5_next", "glm5_next_text"):
        raise ConfigError(f"model_type {model_type!r} is not a GLM-5-next checkpoint (glm5_next)", source)
    return text


def _layers(text: dict, source: str) -> tuple[tuple[str, str], ...]:
    """(attention block, FFN block) per layer; transformers' defaults when the lists are absent."""
    n = get(text, "num_hidden_layers", None, source)
    attn = text.get("layer_types") or ["linear_attention" if i % 4 != 3 else "indexed_attention" for i in range(n)]
    ffn = text.get("mlp_layer_types") or ["dense"] * min(3, n) + ["sparse"] * (n - 3)
    if len(attn) != n or len(ffn) != n:
        raise ConfigError(f"layer_types and mlp_layer_types must list num_hidden_layers = {n} layers", source)
    out = []
    for i, (a, f) in enumerate(zip(attn, ffn)):
        if a not in ATTENTION_BLOCKS:
            raise ConfigError(f"layer_types[{i}] = {a!r}; known: {', '.join(ATTENTION_BLOCKS)}", source)
        if f not in FFN_BLOCKS:
            raise ConfigError(f"mlp_layer_types[{i}] = {f!r}; known: {', '.join(FFN_BLOCKS)}", source)
        out.append((ATTENTION_BLOCKS[a], FFN_BLOCKS[f]))
    return tuple(out)


def read_config(doc: dict, source: str) -> HfModel:
    text = text_config(doc, source)
    check_requirements(text, REQUIREMENTS, source)
    if text.get("linear_lower_bound", -5.0) is None:
        raise ConfigError("linear_lower_bound = null selects the softplus decay gate; kda_gates_w8a8 "
                          "implements the bounded-sigmoid gate only", source)
    heads = get(text, "num_attention_heads", None, source)
    if get(text, "num_key_value_heads", heads, source) != heads:
        raise ConfigError("num_key_value_heads must equal num_attention_heads (MLA)", source)
    symbols, sym_fields = read_fields(text, SYMBOLS, source, integer=True)
    constants, const_fields = read_fields(text, CONSTANTS, source, integer=False)
    constants = {k: int(v) if k in ("sinkhorn_iters", "conv_width") else float(v) for k, v in constants.items()}
    constants.update({k: v for k, (v, _) in FIXED.items()})
    const_fields.update({k: why for k, (_, why) in FIXED.items()})
    mla = {"heads": heads, "qk_nope": get(text, "qk_nope_head_dim", 256, source),
           "qk_rope": get(text, "qk_rope_head_dim", 0, source), "v_head": get(text, "v_head_dim", 256, source),
           "kv_lora": symbols["kv_lora"]}
    tied = bool(doc.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    return HfModel(source=source, symbols=symbols, constants=constants, fields={**sym_fields, **const_fields},
                   layers=_layers(text, source), layer_fields=("layer_types", "mlp_layer_types"),
                   tied_embeddings=tied, extra={"mla": mla})


def _hc(block: str, site: str) -> tuple[MappingRule, ...]:
    return (MappingRule(block, "mix", "params", (f"weight={{layer}}.{site}.fn",)),
            MappingRule(block, "pre", "params", (f"alpha={{layer}}.{site}.scale", f"beta={{layer}}.{site}.base")))


_ATTN = "{layer}.self_attn"

RULES: tuple[MappingRule, ...] = (
    MappingRule("embed", "embed", "params", ("weight={model}.embed_tokens.weight",)),
    # KDA + its hyper-connection site
    *_hc("kda", "attn_hc"),
    MappingRule("kda", "input_norm", "norm", ("{layer}.input_layernorm.weight",)),
    *(MappingRule("kda", n, "gemm", (f"{_ATTN}.{p}",)) for n, p in (
        ("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("f_a", "forget_gate.f_a_proj"), ("b", "b_proj"),
        ("g_a", "g_a_proj"), ("f_b", "forget_gate.f_b_proj"), ("g_b", "g_b_proj"), ("o", "o_proj"))),
    MappingRule("kda", "short_conv", "conv_taps", (f"{_ATTN}.conv1d.weight",), "conv_taps"),
    MappingRule("kda", "gates", "params", (f"A_log={_ATTN}.forget_gate.A_log", f"dt_bias={_ATTN}.forget_gate.dt_bias")),
    MappingRule("kda", "out_norm", "norm", (f"{_ATTN}.o_norm.weight",)),
    # DSA (MLA + indexer)
    *_hc("dsa", "attn_hc"),
    MappingRule("dsa", "input_norm", "norm", ("{layer}.input_layernorm.weight",)),
    MappingRule("dsa", "q_a", "gemm", (f"{_ATTN}.q_a_proj",)),
    MappingRule("dsa", "kv_a", "gemm", (f"{_ATTN}.kv_a_proj_with_mqa",)),
    MappingRule("dsa", "q_a_norm", "norm", (f"{_ATTN}.q_a_layernorm.weight",)),
    MappingRule("dsa", "q_b", "absorb_query", (f"{_ATTN}.q_b_proj", f"{_ATTN}.kv_b_proj"), "mla_softmax_scale"),
    MappingRule("dsa", "kv_norm", "norm", (f"{_ATTN}.kv_a_layernorm.weight",)),
    MappingRule("dsa", "kv_write", "cache_scale", (), "kv_cache_scale"),
    MappingRule("dsa", "idx_k", "gemm", (f"{_ATTN}.indexer.wk",)),
    MappingRule("dsa", "idx_k_norm", "params", (f"weight={_ATTN}.indexer.k_norm.weight",
                                                f"bias={_ATTN}.indexer.k_norm.bias"), "layer_norm_eps"),
    MappingRule("dsa", "idx_gate", "params", (f"weight={_ATTN}.indexer.index_kpool_compress_gate",)),
    MappingRule("dsa", "pool", "params", (f"slot_bias={_ATTN}.indexer.index_kpool_compress_ape",)),
    MappingRule("dsa", "idx_w", "gemm", (f"{_ATTN}.indexer.weights_proj",)),
    MappingRule("dsa", "idx_q", "gemm", (f"{_ATTN}.indexer.wq_b",)),
    MappingRule("dsa", "o", "absorb_output", (f"{_ATTN}.o_proj", f"{_ATTN}.kv_b_proj"), "mla_softmax_scale"),
    # dense MLP and MoE + their hyper-connection site
    *_hc("mlp", "ffn_hc"),
    MappingRule("mlp", "post_norm", "norm", ("{layer}.post_attention_layernorm.weight",)),
    MappingRule("mlp", "gate_up", "gemm_rows", ("{layer}.mlp.gate_proj", "{layer}.mlp.up_proj"), "gate_up_fusion"),
    MappingRule("mlp", "down", "gemm", ("{layer}.mlp.down_proj",), "dense_mlp_activation_scale"),
    *_hc("moe", "ffn_hc"),
    MappingRule("moe", "post_norm", "norm", ("{layer}.post_attention_layernorm.weight",)),
    MappingRule("moe", "gate", "gemm", ("{layer}.mlp.gate",), "router_weight"),
    MappingRule("moe", "top_k", "params", ("e_score_correction_bias={layer}.mlp.gate.e_score_correction_bias",)),
    MappingRule("moe", "experts_gate_up", "experts", ("{layer}.mlp.experts.{e}.gate_proj",
                                                      "{layer}.mlp.experts.{e}.up_proj"), "expert_input_scale"),
    MappingRule("moe", "experts_down", "experts", ("{layer}.mlp.experts.{e}.down_proj",), "expert_input_scale"),
    MappingRule("moe", "shared_gate_up", "gemm_rows", ("{layer}.mlp.shared_experts.gate_proj",
                                                       "{layer}.mlp.shared_experts.up_proj"), "gate_up_fusion"),
    MappingRule("moe", "shared_down", "gemm", ("{layer}.mlp.shared_experts.down_proj",)),
    # head
    MappingRule("head", "final_norm", "norm", ("{model}.norm.weight",), "final_norm_weight"),
    MappingRule("head", "lm_head", "gemm", ("{lm_head}",), "lm_head"),
)

GLM5_NEXT = Family(
    engine="glm5_next",
    prefixes=("model.language_model", "model"),
    rules=RULES,
    # the vision tower and the multi-token-prediction head are not part of a text decode step
    ignored=(r"(^|\.)visual\.", r"\.shared_head\.", r"(^|\.)mtp\."),
    read_config=read_config,
)
