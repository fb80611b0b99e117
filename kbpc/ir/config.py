"""Model config: the symbols and constants a blueprint's edges do not determine.

Defaults are per engine family (the blueprint's kernels name it: `glm5next_*` kernels mean the
GLM-5 "glm5_next" engine). A JSON file given with `--config` overrides any of them:

    {"symbols": {"q_heads": 32, "index_kpool": 4}, "constants": {"swiglu_limit": 7.0}}

Where a blueprint's `explain` text states a value (epsilons, scales), that value is the default.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from kbpc.errors import ConfigError


@dataclass(frozen=True)
class Constants:
    """Numeric constants of the model's math. Sources noted per field."""
    rms_eps: float = 1e-5            # GLM-5 rms_norm_eps (public config); explain: latent write eps 1e-5
    hc_norm_eps: float = 1e-6        # stream RMS: explain glm_mhc eps_n = 1e-6; see CONVENTIONS
    hc_eps: float = 1e-6             # explain glm_mhc: eps_hc = 1e-6 (gates, Sinkhorn)
    hc_site_norm_eps: float = 1e-5   # the site RMSNorm inside the pre-mix: the model's rms_norm_eps
    layer_norm_eps: float = 1e-6     # indexer key LayerNorm: 1e-6 in every public source (CONVENTIONS)
    l2_norm_eps: float = 1e-6        # KDA q/k L2 norm (FLA's l2norm default)
    kda_norm_eps: float = 1e-5       # KDA output RMSNorm
    sinkhorn_iters: int = 20         # explain glm_mhc: T = 20
    swiglu_limit: float = 10.0       # explain glm_swiglu_clamp: L = 10.0 for this checkpoint
    routed_scale: float = 2.5        # explain glm_router_topk: gamma_r = 2.5
    router_renorm_eps: float = 1e-20 # explain glm_router_topk
    conv_width: int = 4              # KDA short-conv width (public GLM-5.3-Flash config)
    kda_gate_lower_bound: float = -5.0  # KDA decay gate lower bound lambda (public config)
    kv_cache_scale: float = 1.0      # explain glm_mla_latent_write: s_k = 1.0 for this checkpoint
    latent_page_tokens: int = 64     # paged latent cache page size (runtime layout choice)
    act_scale_floor: float = 1e-12   # explain w8a8_act_quant / kda_gates_w8a8


@dataclass(frozen=True)
class CheckpointConfig:
    """What a checkpoint's own config file (a Hugging Face `config.json`) fixes: symbols and
    constants, each with the field it was read from. It sits above the engine defaults and the
    symbols a blueprint carries, and below a `--config` file."""
    source: str                                       # the file it was read from
    symbols: tuple[tuple[str, int], ...]
    constants: tuple[tuple[str, float | int], ...]
    fields: tuple[tuple[str, str], ...]               # symbol or constant -> the field it came from


@dataclass(frozen=True)
class ModelConfig:
    engine: str
    symbols: tuple[tuple[str, int], ...]      # symbols the config file sets (sorted); they win
    defaults: tuple[tuple[str, int | str], ...] = ()  # engine defaults, used only where needed
    constants: Constants = field(default_factory=Constants)
    sources: tuple[tuple[str, str], ...] = ()  # symbol or constant -> where a non-default value came from

    @property
    def symbol_dict(self) -> dict[str, int]:
        return dict(self.symbols)

    def to_json(self) -> dict:
        return {"engine": self.engine, "symbols": dict(self.symbols),
                "defaults": dict(self.defaults), "constants": dataclasses.asdict(self.constants),
                "sources": dict(self.sources)}


@dataclass(frozen=True)
class Convention:
    """One point where a blueprint's `explain` and a checkpoint family's convention differ:
    both values with their sources, and what kbpc does about it."""
    name: str
    blueprint: str
    checkpoint: str
    resolution: str


# Conventions of the checkpoint families kbpc maps (the mapping tables in kbpc/weights/ cite them
# by name; `kbpc convert` records the ones it applied).
CONVENTIONS: dict[str, tuple[Convention, ...]] = {
    "glm5_next": (
        Convention("hc_norm_eps", "1e-6: explain glm_mhc, eps_n of the stream RMS",
                   "rms_norm_eps (1e-5 in the public config): transformers Glm5NextTextHyperConnection "
                   "normalises the streams with Glm5NextTextUnweightedRMSNorm(eps=config.rms_norm_eps)",
                   "constant hc_norm_eps takes config.json's rms_norm_eps"),
        Convention("layer_norm_eps", "not stated by explain layer_norm; kbpc's earlier default was 1e-5",
                   "1e-6: transformers Glm5NextTextIndexer.k_norm = LayerNorm(index_head_dim, eps=1e-6), "
                   "as DeepSeek-V3.2's indexer",
                   "constant layer_norm_eps defaults to 1e-6"),
        Convention("final_norm_weight", "1 + gamma: explain rms_norm, the one_plus point of norm::rms_norm "
                   "(the head's final norm)",
                   "gamma: transformers Glm5NextTextRMSNorm returns weight * x_hat for every RMSNorm",
                   "conversion stores gamma - 1 for one_plus norm nodes (BF16; exact for gamma >= 0.5, "
                   "where 1 + (gamma - 1) gives gamma back in FP32); plain-weight nodes copy gamma"),
        Convention("mla_softmax_scale", "512^-1/2 on absorbed heads of the 512-wide latent: explain "
                   "glm_mla_decode",
                   "(qk_nope_head_dim + qk_rope_head_dim)^-1/2 on unabsorbed heads, kv_b_proj kept apart: "
                   "transformers Glm5NextTextAttention.scaling",
                   "conversion absorbs kv_b_proj into q_b and o, folds sqrt(kv_lora) * (qk_nope + qk_rope)^-1/2 "
                   "into the absorbed query and re-quantizes both to FP8 per channel"),
        Convention("conv_taps", "BF16 taps and a BF16 bias: explain causal_conv1d_l2norm",
                   "F32 taps [3*heads*head_dim, 1, width], no bias: transformers Glm5NextTextLinearAttention."
                   "conv1d (bias=False, dtype float32)",
                   "conversion rounds the taps to BF16 (relative error <= 2^-9) and writes a zero bias"),
        Convention("router_weight", "BF16: the router node's weight format (dense_bf16, FP32 output)",
                   "F32: transformers keeps mlp.gate.weight in FP32 (_keep_in_fp32_modules_strict)",
                   "conversion rounds the router weight to BF16"),
        Convention("hc_streams", "FP32 streams: explain glm_mhc",
                   "the model dtype (BF16 for a BF16 checkpoint): transformers carries hidden_streams in it",
                   "kbpc keeps FP32 streams (no weight is involved)"),
        Convention("index_kpool", "4: kbpc's engine default (index_topk/index_kpool = 512 pools -> top-2048)",
                   "16: transformers Glm5NextTextConfig.index_kpool default",
                   "config.json's index_kpool (16 when absent) is taken and checked against the blueprint"),
        Convention("lm_head", "its own BF16 weight (head.lm_head)",
                   "untied in the public config (tie_word_embeddings false): lm_head.weight",
                   "lm_head.weight, or the embedding table when tie_word_embeddings is true"),
        Convention("expert_input_scale", "one static NVFP4 activation scale per routed projection: explain "
                   "w4a4_mx_static",
                   "one input_scale per expert and per gate/up projection: ModelOpt export (equal within a "
                   "layer: one input quantizer per fused expert module)",
                   "conversion takes the largest (no activation saturates earlier than in the checkpoint)"),
        Convention("gate_up_fusion", "one NVFP4 tensor with one tensor scale per fused gate|up (and per expert)",
                   "separate gate_proj and up_proj with a shared weight_scale_2: ModelOpt export",
                   "rows concatenated (exact); unequal tensor scales are unified on the larger one by rescaling "
                   "the E4M3 block scales (rounded)"),
        Convention("dense_mlp_activation_scale", "dynamic per-row NVFP4 activation scale: explain w4a4_mx",
                   "a static input_scale per projection: ModelOpt NVFP4 export",
                   "the blueprint's dynamic scale is used; the checkpoint's input_scale is not read"),
        Convention("kv_cache_scale", "s_k = 1.0: explain glm_mla_latent_write",
                   "no KV cache quantization (hf_quant_config kv_cache_quant_algo null)",
                   "s_k = 1.0; a checkpoint with KV cache quantization is refused"),
    ),
}


# Symbols the edges of a GLM-5 blueprint leave open, used only where the edges and the config do
# not determine them. A string value is another symbol: the MLA decode math fixes each head's
# absorbed query (and value) at the latent width, so q_heads*mla_qk = 16384 with kv_lora = 512
# reads as 32 heads of 512. The indexer pools 4 tokens, so index_topk/index_kpool = 512 pools is
# top-2048 tokens.
ENGINE_DEFAULTS: dict[str, dict[str, int | str]] = {
    "glm5_next": {"mla_qk": "kv_lora", "mla_v": "kv_lora", "index_kpool": 4},
}


def detect_engine(kernels: set[str]) -> str | None:
    """The engine family a blueprint was planned for, from its kernel module names."""
    if any(k.split("::", 1)[0].startswith("glm5next") for k in kernels):
        return "glm5_next"
    return None


def load_config(engine: str | None, path: Path | None = None,
                carried: dict[str, int] | None = None,
                checkpoint: CheckpointConfig | None = None) -> ModelConfig:
    """Defaults for `engine`, then symbols the blueprint carries (`carried`, written by `kbpc
    shrink`), then a checkpoint's own config, then the JSON file at `path`."""
    symbols = dict(carried or {})
    constants = Constants()
    sources: dict[str, str] = {}
    if checkpoint is not None:
        symbols.update(checkpoint.symbols)
        constants = _override_constants(constants, dict(checkpoint.constants), checkpoint.source)
        sources.update((name, f"{checkpoint.source}: {fld}") for name, fld in checkpoint.fields)
    if path is not None:
        where = str(path)
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError("config file not found", where) from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", where) from None
        if not isinstance(data, dict) or set(data) - {"symbols", "constants"}:
            raise ConfigError('expected an object with keys "symbols" and/or "constants"', where)
        for name, value in (data.get("symbols") or {}).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"symbol {name!r} must be a positive integer, got {value!r}", f"{where}: symbols")
            symbols[name] = value
            sources[name] = where
        constants = _override_constants(constants, data.get("constants") or {}, f"{where}: constants")
        sources.update((name, where) for name in data.get("constants") or {})
    defaults = ENGINE_DEFAULTS.get(engine or "", {})
    return ModelConfig(engine=engine or "unknown", symbols=tuple(sorted(symbols.items())),
                       defaults=tuple(sorted(defaults.items())), constants=constants,
                       sources=tuple(sorted(sources.items())))


def _override_constants(base: Constants, values: dict, where: str) -> Constants:
    fields = {f.name: f for f in dataclasses.fields(Constants)}
    changes = {}
    for name, value in values.items():
        if name not in fields:
            raise ConfigError(f"unknown constant {name!r}; known: {', '.join(sorted(fields))}", where)
        kind = type(getattr(base, name))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            raise ConfigError(f"constant {name!r} must be a {kind.__name__}, got {value!r}", where)
        changes[name] = kind(value)
    return dataclasses.replace(base, **changes)
