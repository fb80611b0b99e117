"""Model config: the symbols and constants a blueprint's edges do not determine.

Defaults are per engine family (the blueprint's kernels name it: `glm5next_*` kernels mean the
GLM-5 "glm5_next" engine). A JSON file given with `--config` overrides any of them:

    {"symbols": {"q_heads": 32, "index_kpool": 4}, "constants": {"swiglu_limit": 7.0}}

Where a blueprint's `explain` text states a value (epsilons, scales), that value is the default.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from kbpc.errors import ConfigError
from kbpc.ir.limits import MAX_DIM, SYMBOL_NAME
from kbpc.util.jsonload import MB, load_json_file

MAX_CONFIG_BYTES = 1 * MB
MAX_INT_CONSTANT = 1 << 16


@dataclass(frozen=True)
class Constants:
    """Numeric constants of the model's math. Sources noted per field."""
    rms_eps: float = 1e-5            # GLM-5 rms_norm_eps (public config); explain: latent write eps 1e-5
    hc_norm_eps: float = 1e-6        # explain glm_mhc: eps_n = 1e-6 (stream RMS)
    hc_eps: float = 1e-6             # explain glm_mhc: eps_hc = 1e-6 (gates, Sinkhorn)
    hc_site_norm_eps: float = 1e-5   # the site RMSNorm inside the pre-mix: the model's rms_norm_eps
    layer_norm_eps: float = 1e-5     # indexer key LayerNorm (public GLM-5 / DeepSeek-V3.2 indexer)
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
class ModelConfig:
    engine: str
    symbols: tuple[tuple[str, int], ...]      # symbols the config file sets (sorted); they win
    defaults: tuple[tuple[str, int | str], ...] = ()  # engine defaults, used only where needed
    constants: Constants = field(default_factory=Constants)

    @property
    def symbol_dict(self) -> dict[str, int]:
        return dict(self.symbols)

    def to_json(self) -> dict:
        return {"engine": self.engine, "symbols": dict(self.symbols),
                "defaults": dict(self.defaults), "constants": dataclasses.asdict(self.constants)}


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
                carried: dict[str, int] | None = None) -> ModelConfig:
    """Defaults for `engine`, then symbols the blueprint carries (`carried`, written by `kbpc
    shrink`), then the JSON file at `path`."""
    symbols = _checked_symbols(carried or {}, "provenance.kbpc_model_symbols")
    constants = Constants()
    if path is not None:
        where = str(path)
        data = load_json_file(path, max_bytes=MAX_CONFIG_BYTES, error=ConfigError, what="config file")
        if not isinstance(data, dict) or set(data) - {"symbols", "constants"}:
            raise ConfigError('expected an object with keys "symbols" and/or "constants"', where)
        for key in ("symbols", "constants"):
            if data.get(key) is not None and not isinstance(data[key], dict):
                raise ConfigError(f'"{key}" must be an object of name: value', where)
        symbols.update(_checked_symbols(data.get("symbols") or {}, f"{where}: symbols"))
        constants = _override_constants(constants, data.get("constants") or {}, f"{where}: constants")
    defaults = ENGINE_DEFAULTS.get(engine or "", {})
    return ModelConfig(engine=engine or "unknown", symbols=tuple(sorted(symbols.items())),
                       defaults=tuple(sorted(defaults.items())), constants=constants)


def _checked_symbols(values: dict, where: str) -> dict[str, int]:
    out = {}
    for name, value in values.items():
        if not SYMBOL_NAME.fullmatch(name):
            raise ConfigError(f"{name!r} is not a symbol name (letters, digits, _)", where)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIM:
            raise ConfigError(f"symbol {name!r} must be an integer from 1 to {MAX_DIM}, got {value!r}", where)
        out[name] = value
    return out


def _override_constants(base: Constants, values: dict, where: str) -> Constants:
    fields = {f.name: f for f in dataclasses.fields(Constants)}
    changes = {}
    for name, value in values.items():
        if name not in fields:
            raise ConfigError(f"unknown constant {name!r}; known: {', '.join(sorted(fields))}", where)
        kind = type(getattr(base, name))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            raise ConfigError(f"constant {name!r} must be a {kind.__name__}, got {value!r}", where)
        # Integer constants are counts and widths (iterations, taps, page size): a loop bound or an
        # allocation in the kernels and the reference, so they stay small.
        if kind is int and not 1 <= value <= MAX_INT_CONSTANT:
            raise ConfigError(f"constant {name!r} must be from 1 to {MAX_INT_CONSTANT}, got {value!r}", where)
        changes[name] = kind(value)
    return dataclasses.replace(base, **changes)
