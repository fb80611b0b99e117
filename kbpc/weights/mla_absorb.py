"""MLA absorption: a checkpoint's unabsorbed latent attention as the blueprint's absorbed heads.

A transformers-style checkpoint (CONVENTIONS mla_softmax_scale) has, per head h of H, a query
q_h = W_qb,h x (qk_nope wide, NoPE so qk_rope = 0), key and value up-projections
k_h,j = W_uk,h c_j and v_h,j = W_uv,h c_j from `kv_b_proj` (rows [W_uk,h; W_uv,h] per head), scores
(q_h . k_h,j) / sqrt(qk_nope + qk_rope) and output o_proj(concat_h sum_j p_hj v_h,j). The
blueprint's decode (explain glm_mla_decode) attends over the latent c itself with 512-wide (kv_lora)
heads and scale 1/sqrt(kv_lora). The two are the same function when

    W'_qb,h = sqrt(kv_lora) / sqrt(qk_nope + qk_rope) * W_uk,h^T W_qb,h        [kv_lora x q_lora]
    W'_o[:, h]   = W_o[:, h] W_uv,h                                             [hidden x kv_lora]

since q_h . (W_uk,h c) = (W_uk,h^T q_h) . c and sum_j p_hj W_uv,h c_j = W_uv,h sum_j p_hj c_j. The
products are formed in float64 from the dequantized checkpoint weights and re-quantized to the
blueprint's format (FP8 E4M3 with one FP32 scale per output channel, `quantize_fp8`): the one
conversion that is not exact, to the E4M3 grid of the absorbed weights."""
from __future__ import annotations

import math

import numpy as np

from kbpc.errors import WeightsError
from kbpc.reference.formats import bf16_bits, quantize_fp8
from kbpc.weights.mapping import Context, Job, Need, source
from kbpc.weights.projections import projection_needs, read_projection

F32 = np.float32


def absorb_query(w_qb: np.ndarray, w_kvb: np.ndarray, heads: int, qk_nope: int, qk_rope: int,
                 v_head: int) -> np.ndarray:
    """[heads * kv_lora, q_lora] float64: each head's query carried into the latent, scaled so
    that the blueprint's 1/sqrt(kv_lora) gives the checkpoint's 1/sqrt(qk_nope + qk_rope)."""
    if qk_rope:
        raise WeightsError(f"qk_rope_head_dim = {qk_rope}: absorption is for NoPE latent attention only")
    wq = np.asarray(w_qb, np.float64).reshape(heads, qk_nope + qk_rope, -1)[:, :qk_nope]
    wkv = np.asarray(w_kvb, np.float64).reshape(heads, qk_nope + v_head, -1)
    kv_lora = wkv.shape[-1]
    ratio = math.sqrt(kv_lora) / math.sqrt(qk_nope + qk_rope)
    return (np.einsum("hdl,hdq->hlq", wkv[:, :qk_nope], wq) * ratio).reshape(heads * kv_lora, -1)


def absorb_output(w_o: np.ndarray, w_kvb: np.ndarray, heads: int, qk_nope: int, v_head: int) -> np.ndarray:
    """[hidden, heads * kv_lora] float64: the value up-projection folded into o_proj."""
    wkv = np.asarray(w_kvb, np.float64).reshape(heads, qk_nope + v_head, -1)
    wo = np.asarray(w_o, np.float64).reshape(w_o.shape[0], heads, v_head)
    return np.einsum("nhd,hdl->nhl", wo, wkv[:, qk_nope:]).reshape(w_o.shape[0], -1)


def requantize(w: np.ndarray, fmt: str, node: str) -> dict[str, np.ndarray]:
    if fmt == "fp8/channel":
        codes, scales = quantize_fp8(np.asarray(w, F32))
        return {"weight": codes, "weight_scale": scales.astype(F32)}
    if fmt == "bf16":
        return {"weight": bf16_bits(np.asarray(w, F32))}
    raise WeightsError(f"absorbed MLA weights can be written as fp8/channel or bf16, not {fmt}", f"node {node}")


def _geometry(ctx: Context, job: Job) -> dict[str, int]:
    mla = dict(ctx.hf.extra["mla"])
    w = next(s for s in job.specs if s.role == "weight")
    n, k = w.shape[-2], w.shape[-1]
    latent = mla["kv_lora"]
    width = n if job.rule.transform == "absorb_query" else k
    if width != mla["heads"] * latent:
        raise WeightsError(f"the absorbed projection is {width} wide, the checkpoint gives {mla['heads']} heads "
                           f"x kv_lora_rank {latent}", f"node {job.node.id}")
    return {**mla, "n": n, "k": k}


def _kv_b_need(ctx: Context, job: Job, g: dict[str, int]) -> list[Need]:
    module = source(job, job.rule.sources[1])
    return projection_needs(ctx, module, g["heads"] * (g["qk_nope"] + g["v_head"]), g["kv_lora"],
                            f"node {job.node.id} (absorbed)")


class AbsorbQuery:
    """q_b_proj and kv_b_proj -> the absorbed query projection (sources: q_b, kv_b)."""

    def needs(self, ctx: Context, job: Job) -> list[Need]:
        g = _geometry(ctx, job)
        q_b = projection_needs(ctx, source(job, job.rule.sources[0]), g["heads"] * (g["qk_nope"] + g["qk_rope"]),
                               g["k"], f"node {job.node.id} (absorbed)")
        return q_b + _kv_b_need(ctx, job, g)

    def apply(self, ctx: Context, job: Job) -> dict[str, np.ndarray]:
        g = _geometry(ctx, job)
        w_qb = read_projection(ctx, source(job, job.rule.sources[0])).dequantized()
        w_kvb = read_projection(ctx, source(job, job.rule.sources[1])).dequantized()
        w = absorb_query(w_qb, w_kvb, g["heads"], g["qk_nope"], g["qk_rope"], g["v_head"])
        return requantize(w, job.node.precision.weight, job.node.id)


class AbsorbOutput:
    """o_proj and kv_b_proj -> the absorbed output projection (sources: o, kv_b)."""

    def needs(self, ctx: Context, job: Job) -> list[Need]:
        g = _geometry(ctx, job)
        o = projection_needs(ctx, source(job, job.rule.sources[0]), g["n"], g["heads"] * g["v_head"],
                             f"node {job.node.id} (absorbed)")
        return o + _kv_b_need(ctx, job, g)

    def apply(self, ctx: Context, job: Job) -> dict[str, np.ndarray]:
        g = _geometry(ctx, job)
        w_o = read_projection(ctx, source(job, job.rule.sources[0])).dequantized()
        w_kvb = read_projection(ctx, source(job, job.rule.sources[1])).dequantized()
        w = absorb_output(w_o, w_kvb, g["heads"], g["qk_nope"], g["v_head"])
        return requantize(w, job.node.precision.weight, job.node.id)
