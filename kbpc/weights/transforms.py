"""The transforms a mapping rule names: checkpoint tensors -> one node's weight specs (stored
forms: bf16 bits, e4m3 codes, e2m1x2 bytes, float32). Each lists its needs first (checked for the
whole model before anything is read) and converts on `apply`. Only the MLA absorption
(kbpc/weights/mla_absorb.py) and the documented roundings (F32 taps and router to BF16, gamma - 1,
unequal NVFP4 tensor scales) change values; everything else is a copy or an exact widening."""
from __future__ import annotations

import numpy as np

from kbpc.errors import WeightsError
from kbpc.ir.weights import WeightSpec
from kbpc.reference.formats import bf16_bits, bf16_from_bits, e4m3_decode, e4m3_encode
from kbpc.reference.rms_norm import weight_form
from kbpc.weights.mapping import Context, Job, Need, Transform, source
from kbpc.weights.mla_absorb import AbsorbOutput, AbsorbQuery
from kbpc.weights.projections import Projection, projection_needs, read_projection

F32 = np.float32
FLOAT_DTYPES = {"bf16": ("BF16", "F32", "F16"), "f32": ("F32", "BF16", "F16")}


def spec_of(job: Job, suffix: str) -> WeightSpec:
    for spec in job.specs:
        if spec.name == f"{job.node.id}.{suffix}":
            return spec
    raise WeightsError(f"the node has no weight {suffix!r}", f"node {job.node.id}")


def values(ctx: Context, name: str) -> np.ndarray:
    """A float checkpoint tensor as float32 (BF16 and F16 widen exactly)."""
    arr, dtype = ctx.read(name), ctx.folder.info(name).dtype
    return bf16_from_bits(arr) if dtype == "BF16" else np.asarray(arr, F32)


def as_storage(ctx: Context, name: str, storage: str) -> np.ndarray:
    if storage == "bf16" and ctx.folder.info(name).dtype == "BF16":
        return np.asarray(ctx.read(name), np.uint16)
    v = values(ctx, name)
    return bf16_bits(v) if storage == "bf16" else v


def gemm_geometry(job: Job) -> tuple[str, int, int, bool]:
    """(weight format, N, K, static input scale?) of a GEMM node."""
    w = spec_of(job, "weight")
    k = w.shape[-1] * (2 if w.storage == "e2m1x2" else 1)
    static = any(s.role == "input_scale" for s in job.specs)
    return job.node.precision.weight, w.shape[-2], k, static


def stored(p: Projection, static: bool) -> dict[str, np.ndarray]:
    if p.fmt == "nvfp4/g16":
        out = {"weight": p.weight, "weight_scale": p.scale, "weight_scale_2": np.asarray(p.scale2, F32)}
        if static:
            out["input_scale"] = np.asarray(p.input_scale, F32)
        return out
    if p.fmt == "fp8/channel":
        return {"weight": p.weight, "weight_scale": p.scale}
    return {"weight": p.weight}


def fuse_rows(parts: list[Projection]) -> Projection:
    """Projections of one input stacked along N (gate | up). NVFP4 parts share one tensor scale
    in ModelOpt exports (exact); otherwise block scales are rescaled onto the largest (rounded)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    weight = np.concatenate([p.weight for p in parts], axis=0)
    if first.fmt != "nvfp4/g16":
        scale = None if first.scale is None else np.concatenate([p.scale for p in parts], axis=0)
        return Projection(first.module, first.fmt, weight, scale)
    g = max(F32(p.scale2) for p in parts)
    scales = [p.scale if F32(p.scale2) == g else
              e4m3_encode((e4m3_decode(p.scale) * F32(F32(p.scale2) / g)).astype(F32)) for p in parts]
    inputs = [p.input_scale for p in parts if p.input_scale is not None]
    return Projection(first.module, first.fmt, weight, np.concatenate(scales, axis=0), g,
                      max(inputs) if inputs else None)


class Gemm:
    """One checkpoint projection is one GEMM node."""

    def needs(self, ctx: Context, job: Job) -> list[Need]:
        fmt, n, k, static = gemm_geometry(job)
        return projection_needs(ctx, source(job, job.rule.sources[0]), n, k, f"node {job.node.id}", (fmt,), static)

    def apply(self, ctx: Context, job: Job) -> dict[str, np.ndarray]:
        return stored(read_projection(ctx, source(job, job.rule.sources[0])), gemm_geometry(job)[3])


class GemmRows:
    """Several projections of one input concatenated along N (gate | up)."""

    def needs(self, ctx: Context, job: Job) -> list[Need]:
        fmt, n, k, static = gemm_geometry(job)
        part = n // len(job.rule.sources)
        return [need for t in job.rule.sources
                for need in projection_needs(ctx, source(job, t), part, k, f"node {job.node.id}", (fmt,), static)]

    def apply(self, ctx: Context, job: Job) -> dict[str, np.ndarray]:
        parts = [read_projection(ctx, source(job, t)) for t in job.rule.sources]
        return stored(fuse_rows(parts), gemm_geometry(job)[3])


class Experts:
    """Routed experts stored one module per expert ({e}), stacked; gate | up fused per expert;
    one static input scale per stacked projection (the largest, CONVENTIONS expert_input_scale)."""

    def _modules(self, job: Job) -> list[list[str]]:
        count = spec_of(job, "weight").experts
        return [[source(job, t, e=e) for t in job.rule.sources] for e in range(count)]

    def needs(self, ctx: Context, job: Job) -> list[Need]:
        fmt, n, k, static = gemm_geometry(job)
        part = n // len(job.rule.sources)
        return [need for modules in self._modules(job) for m in modules
                for need in projection_needs(ctx, m, part, k, f"node {job.node.id}", (fmt,), static)]

    def apply(self, ctx: Context, job: Job) -> dict[str, np.ndarray]:
        static = gemm_geometry(job)[3]
        fused = [fuse_rows([read_projection(ctx, m) for m in modules]) for modules in self._modules(job)]
        out = {"weight": np.stack([p.weight for p in fused])}
        if fused[0].scale is not None:
            out["weight_scale"] = np.stack([p.scale for p in fused])
        if fused[0].fmt == "nvfp4/g16":
            out["weight_scale_2"] = np.array([p.scale2 for p in fused], F32)
            if static:
                out["input_scale"] = np.asarray(max(p.input_scale for p in fused), F32)
        return out


class Params:
    """Named tensors copied into the node's specs ("suffix=path"), widened or rounded to the
    spec's storage; shapes must match exactly."""

    def _pairs(self, job: Job) -> list[tuple[WeightSpec, str]]:
        pairs = []
        for item in job.rule.sources:
            suffix, _, template = item.partition("=")
            pairs.append((spec_of(job, suffix), source(job, template)))
        return pairs

    def needs(self, ctx: Context, job: Job) -> list[Need]:
        return [Need(path, FLOAT_DTYPES[spec.storage], spec.shape, f"{spec.name}")
                for spec, path in self._pairs(job)]

    def apply(self, ctx: Context, job: Job) -> dict[str, np.ndarray]:
        return {spec.name[len(job.node.id) + 1:]: as_storage(ctx, path, spec.storage)
                for spec, path in self._pairs(job)}


class Norm:
    """A norm weight stored as the applied gamma (transformers' RMSNorm multiplies by its weight):
    one_plus nodes get gamma - 1 (CONVENTIONS final_norm_weight), plain nodes gamma."""

    def needs(self, ctx: Context, job: Job) -> list[Need]:
        spec = spec_of(job, "weight")
        return [Need(source(job, job.rule.sources[0]), FLOAT_DTYPES["bf16"], spec.shape, spec.name)]

    def apply(self, ctx: Context, job: Job) -> dict[str, np.ndarray]:
        path = source(job, job.rule.sources[0])
        if job.node.op in ("rms_norm", "final_norm") and weight_form(job.node) == "one_plus":
            return {"weight": bf16_bits((values(ctx, path) - F32(1)).astype(F32))}
        return {"weight": as_storage(ctx, path, "bf16")}


class ConvTaps:
    """Depthwise conv taps [C, 1, w] (F32, no bias) -> BF16 taps [C, w] and a zero BF16 bias."""

    def needs(self, ctx: Context, job: Job) -> list[Need]:
        c, w = spec_of(job, "conv_weight").shape
        return [Need(source(job, job.rule.sources[0]), ("F32", "BF16"), (c, 1, w), f"{job.node.id} taps")]

    def apply(self, ctx: Context, job: Job) -> dict[str, np.ndarray]:
        c, w = spec_of(job, "conv_weight").shape
        taps = values(ctx, source(job, job.rule.sources[0])).reshape(c, w)
        return {"conv_weight": bf16_bits(taps), "conv_bias": np.zeros(c, np.uint16)}


class CacheScale:
    """The static latent cache scale s_k: the model config's kv_cache_scale (CONVENTIONS
    kv_cache_scale); a checkpoint that quantizes its KV cache is refused."""

    def needs(self, ctx: Context, job: Job) -> list[Need]:
        algo = ctx.folder.quant.kv_cache_algo
        if algo is not None:
            raise WeightsError(f"kv_cache_quant_algo {algo!r}: kbpc's FP8 latent cache uses the static scale "
                               "kv_cache_scale and does not read a checkpoint's KV cache scales",
                               ctx.folder.quant.source)
        return []

    def apply(self, ctx: Context, job: Job) -> dict[str, np.ndarray]:
        return {"k_scale": np.asarray(ctx.bp.config.constants.kv_cache_scale, F32)}


TRANSFORMS: dict[str, Transform] = {
    "gemm": Gemm(), "gemm_rows": GemmRows(), "experts": Experts(), "params": Params(), "norm": Norm(),
    "conv_taps": ConvTaps(), "cache_scale": CacheScale(), "absorb_query": AbsorbQuery(),
    "absorb_output": AbsorbOutput(),
}
