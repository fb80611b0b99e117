"""`synthetic:SEED` weights: value = f(seed, tensor name, element index), reproducible bit for bit
by a CUDA kernel, so a large model needs no host copy.

The generator (all arithmetic on unsigned 64-bit integers, wrapping):

    mix(z)   = splitmix64 finaliser: z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
               z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31
    key      = mix(seed * 0x9E3779B97F4A7C15 ^ fnv1a64(name))
    h(i)     = mix(key + (i + 1) * 0x9E3779B97F4A7C15)          for element index i (row-major)
    unit(i)  = float32(h(i) >> 40) * 2^-23 - 1                  exactly in [-1, 1), 24-bit grid

and per storage kind (the rule is chosen per tensor, see `rule_for`):

    uniform (bf16, f32):  v = rn_storage(f32(unit * scale) + offset)
    e2m1x2 (NVFP4 codes): byte = h(i) & 0xFF                     (two uniform 4-bit codes)
    e4m3 (block scales):  code = lo + h(i) % (hi - lo + 1)       (a band of positive codes)
    e4m3 (FP8 weights):   code = (h(i) >> 8 & 0x80) | (lo + h(i) % (hi - lo + 1))

Scales keep activations finite and of order one through every layer: a GEMM weight with K inputs
gets an RMS of about 1/sqrt(K).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kbpc.errors import WeightsError
from kbpc.ir.graph import Blueprint
from kbpc.ir.weights import WeightSpec, weight_specs
from kbpc.reference.formats import bf16_bits
from kbpc.reference.rms_norm import weight_form

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
E2M1_RMS = math.sqrt(sum(v * v for v in (0, .5, 1, 1.5, 2, 3, 4, 6)) / 8)
# Block-scale codes 0x30..0x40 are E4M3 0.5 .. 2.0; FP8 weight magnitudes 0x20..0x48 are 0.125 .. 4.
BLOCK_SCALE_CODES = (0x30, 0x40)
FP8_WEIGHT_CODES = (0x20, 0x48)


def fnv1a64(text: str) -> int:
    h = 0xCBF29CE484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _mix(z: np.ndarray) -> np.ndarray:
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def tensor_key(seed: int, name: str) -> np.uint64:
    with np.errstate(over="ignore"):
        return _mix(np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * GOLDEN ^ np.uint64(fnv1a64(name)))


def hashes(seed: int, name: str, count: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        idx = np.arange(1, count + 1, dtype=np.uint64)
        return _mix(tensor_key(seed, name) + idx * GOLDEN)


def units(h: np.ndarray) -> np.ndarray:
    return ((h >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -23) - np.float32(1.0)).astype(np.float32)


@dataclass(frozen=True)
class Rule:
    kind: str             # uniform | codes | scale_codes | fp8_codes
    scale: float = 1.0
    offset: float = 0.0


def rule_for(bp: Blueprint, spec: WeightSpec) -> Rule:
    """How one tensor is drawn. GEMM weights get RMS ~ 1/sqrt(K); norm weights sit near 1 (or near
    0 where the kernel applies 1 + gamma); gates and biases are small."""
    node = bp.node_by_id[spec.node]
    suffix = spec.name[len(spec.node) + 1:]
    k = spec.shape[-1] if spec.shape else 1
    if spec.storage == "e2m1x2":
        return Rule("codes")
    if spec.storage == "e4m3":
        return Rule("scale_codes") if suffix == "weight_scale" else Rule("fp8_codes")
    if suffix == "weight_scale_2":     # NVFP4 tensor scale: codes ~ E2M1_RMS, block scales ~ 1.2
        return Rule("uniform", 0.0, 1.0 / (E2M1_RMS * 1.2 * math.sqrt(2 * k_of(bp, spec))))
    if suffix == "weight_scale":       # FP8 per-channel scale: codes RMS ~ 1.6
        return Rule("uniform", 0.05 / math.sqrt(k_of(bp, spec)), 0.6 / math.sqrt(k_of(bp, spec)))
    if suffix == "input_scale":        # static NVFP4 activation scale: |x| up to 12 unsaturated
        return Rule("uniform", 0.0, 12.0 / (6 * 448))
    if node.op == "embed":
        return Rule("uniform", math.sqrt(3.0))
    if suffix == "weight" and spec.role == "weight":   # bf16 GEMM weights
        return Rule("uniform", math.sqrt(3.0 / k))
    if spec.role == "norm":
        one_plus = node.op in ("rms_norm", "final_norm") and weight_form(node) == "one_plus"
        return Rule("uniform", 0.1, 0.0 if one_plus else 1.0)
    return _param_rule(suffix)


def k_of(bp: Blueprint, spec: WeightSpec) -> int:
    """K of the GEMM a scale tensor belongs to (from its sibling `.weight`)."""
    for other in weight_specs_of(bp, spec.node):
        if other.name == f"{spec.node}.weight":
            return other.shape[-1] * (2 if other.storage == "e2m1x2" else 1)
    raise WeightsError(f"scale tensor without a weight: {spec.name}")


def weight_specs_of(bp: Blueprint, node_id: str) -> list[WeightSpec]:
    from kbpc.ir.weights import node_weight_specs
    return node_weight_specs(bp, bp.node_by_id[node_id])


_PARAM_RULES = {
    "alpha": Rule("uniform", 0.1, 0.5), "beta": Rule("uniform", 0.2), "conv_weight": Rule("uniform", 0.5),
    "conv_bias": Rule("uniform", 0.1), "A_log": Rule("uniform", 1.0), "dt_bias": Rule("uniform", 0.5),
    "slot_bias": Rule("uniform", 0.5), "k_scale": Rule("uniform", 0.0, 1.0),
    "e_score_correction_bias": Rule("uniform", 0.05),
}


def _param_rule(suffix: str) -> Rule:
    if suffix not in _PARAM_RULES:
        raise WeightsError(f"no synthetic rule for parameter '{suffix}'")
    return _PARAM_RULES[suffix]


def generate(spec: WeightSpec, rule: Rule, seed: int) -> np.ndarray:
    count = int(np.prod(spec.shape, dtype=np.int64))
    h = hashes(seed, spec.name, count)
    if rule.kind == "codes":
        out = (h & np.uint64(0xFF)).astype(np.uint8)
    elif rule.kind in ("scale_codes", "fp8_codes"):
        lo, hi = BLOCK_SCALE_CODES if rule.kind == "scale_codes" else FP8_WEIGHT_CODES
        mag = (np.uint64(lo) + h % np.uint64(hi - lo + 1)).astype(np.uint8)
        sign = ((h >> np.uint64(8)) & np.uint64(0x80)).astype(np.uint8) if rule.kind == "fp8_codes" else 0
        out = (mag | sign).astype(np.uint8)
    else:
        v = (units(h) * np.float32(rule.scale)).astype(np.float32) + np.float32(rule.offset)
        out = bf16_bits(v.astype(np.float32)) if spec.storage == "bf16" else v.astype(np.float32)
    return out.reshape(spec.shape)


def parse_seed(source: str) -> int:
    prefix, _, value = source.partition(":")
    if prefix != "synthetic" or not value.isdigit():
        raise WeightsError(f"expected synthetic:SEED with a whole-number seed, got {source!r}", "--weights")
    return int(value)


def synthetic_weights(bp: Blueprint, seed: int) -> dict[str, np.ndarray]:
    return {spec.name: generate(spec, rule_for(bp, spec), seed) for spec in weight_specs(bp)}
