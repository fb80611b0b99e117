"""A checkpoint's config.json as a model config: symbols and constants each read from a named
field (with the family's default where the field is absent), the values kbpc requires of fields
whose alternatives it does not implement, and the layer sequence. Family tables
(`kbpc/weights/glm5_next.py`) list the fields; this module reads them and checks the result
against a blueprint, naming the field at fault."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from kbpc.errors import BlueprintError, ConfigError
from kbpc.frontend.dims import DimFact, solve_symbols
from kbpc.ir.config import CheckpointConfig
from kbpc.ir.graph import Blueprint

_ABSENT = object()


@dataclass(frozen=True)
class ConfigField:
    """kbpc symbol or constant `name` = the product of config.json fields `keys`; `default` is the
    family's value when a field is absent (None: the field is required)."""
    name: str
    keys: tuple[str, ...]
    default: float | int | None = None


@dataclass(frozen=True)
class Requirement:
    """A config.json field whose other values kbpc does not implement."""
    key: str
    allowed: tuple[Any, ...]
    default: Any
    why: str


@dataclass(frozen=True)
class HfModel:
    """What a family reads from config.json."""
    source: str
    symbols: dict[str, int]
    constants: dict[str, float | int]
    fields: dict[str, str]                    # symbol or constant -> the config.json field(s)
    layers: tuple[tuple[str, ...], ...]       # block types per layer, e.g. ("kda", "mlp")
    layer_fields: tuple[str, ...]             # where the layer sequence was read from
    tied_embeddings: bool = False
    extra: dict[str, Any] = field(default_factory=dict)   # family-specific values (e.g. MLA head dims)

    def checkpoint_config(self) -> CheckpointConfig:
        return CheckpointConfig(source=self.source, symbols=tuple(sorted(self.symbols.items())),
                                constants=tuple(sorted(self.constants.items())),
                                fields=tuple(sorted(self.fields.items())))


def get(doc: dict, key: str, default: Any, source: str) -> Any:
    value = doc.get(key, _ABSENT)
    if value is _ABSENT:
        if default is None:
            raise ConfigError(f"config.json has no {key!r}", source)
        return default
    return value


def read_fields(doc: dict, fields: tuple[ConfigField, ...], source: str, integer: bool
                ) -> tuple[dict[str, float | int], dict[str, str]]:
    values, where = {}, {}
    for f in fields:
        parts = [get(doc, k, f.default, source) for k in f.keys]
        for key, part in zip(f.keys, parts):
            if isinstance(part, bool) or not isinstance(part, (int, float)) or not math.isfinite(part):
                raise ConfigError(f"{key} must be a number, got {part!r}", source)
            if integer and (not isinstance(part, int) or part < 1):
                raise ConfigError(f"{key} must be a positive integer, got {part!r}", source)
        values[f.name] = math.prod(parts)
        where[f.name] = " * ".join(f.keys)
    return values, where


def check_requirements(doc: dict, reqs: tuple[Requirement, ...], source: str) -> None:
    for r in reqs:
        value = doc.get(r.key, r.default)
        if isinstance(value, list):
            bad = [v for v in value if v not in r.allowed]
            value = bad[0] if bad else r.allowed[0]
        if value not in r.allowed:
            raise ConfigError(f"{r.key} = {value!r}: kbpc implements only {' or '.join(map(repr, r.allowed))} "
                              f"({r.why})", source)


def check_layers(bp: Blueprint, hf: HfModel) -> None:
    """The checkpoint's layer sequence must be the blueprint's, layer by layer."""
    where = f"{hf.source}: {' / '.join(hf.layer_fields)}"
    if len(hf.layers) != len(bp.layers):
        raise ConfigError(f"the checkpoint has {len(hf.layers)} layers, the blueprint {len(bp.layers)} "
                          f"(make a matching blueprint with kbpc shrink SEED --like config.json)", where)
    for layer, blocks in zip(bp.layers, hf.layers):
        have = tuple(b.rsplit(".", 1)[-1] for b in layer.blocks)
        if have != blocks:
            raise ConfigError(f"layer {layer.index} is {'+'.join(blocks)} in the checkpoint but "
                              f"{'+'.join(have)} (template {layer.template}) in the blueprint", where)


def check_symbols(bp: Blueprint, hf: HfModel) -> None:
    """Symbols the blueprint's edges fix must equal config.json's; the others (q_heads, the
    indexer pool...) must give the edges' values together with them."""
    facts = [DimFact(t.dim, t.dim_value, t.id) for t in bp.tensors() if t.dim is not None]
    fixed, _ = solve_symbols(facts, {})
    for name, value in sorted(hf.symbols.items()):
        if name in fixed and fixed[name] != value:
            raise ConfigError(f"{hf.fields[name]} = {value} gives {name} = {value}, but the blueprint's "
                              f"edges fix {name} = {fixed[name]}", hf.source)
    open_given = {k: v for k, v in hf.symbols.items() if k not in fixed}
    try:
        solve_symbols(facts, {**fixed, **open_given})
    except BlueprintError as exc:
        named = {k: v for k, v in open_given.items() if re.search(rf"\b{k}\b", exc.message)} or open_given
        fields = ", ".join(f"{hf.fields[k]} ({k} = {v})" for k, v in sorted(named.items()))
        raise ConfigError(f"{fields} contradict the blueprint: {exc.message}", hf.source) from None
