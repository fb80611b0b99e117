"""MLA absorption against the unabsorbed math transformers runs (Glm5NextTextAttention: per-head
k = W_uk c, v = W_uv c from kv_b_proj, scores q.k / sqrt(qk_nope + qk_rope), o_proj over the
concatenated heads), on random weights with several heads and qk_nope != v_head != kv_lora."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.errors import WeightsError
from kbpc.reference.formats import dequantize_fp8, e4m3_encode, to_bf16
from kbpc.reference.glm_mla_decode import mla_decode
from kbpc.weights.mla_absorb import absorb_output, absorb_query, requantize

HEADS, NOPE, V, LATENT, Q_LORA, HIDDEN, TOKENS = 3, 96, 64, 512, 128, 256, 9


def _weights(rng):
    return (rng.standard_normal((HEADS * NOPE, Q_LORA)) / np.sqrt(Q_LORA),
            rng.standard_normal((HEADS * (NOPE + V), LATENT)) / np.sqrt(LATENT),
            rng.standard_normal((HIDDEN, HEADS * V)) / np.sqrt(HEADS * V))


def _unabsorbed(w_qb, w_kvb, w_o, q_resid, latents):
    """transformers' MLA for one query over `latents` (the normalised kv_a rows), in float64."""
    q = (w_qb @ q_resid).reshape(HEADS, NOPE)
    kv = (latents @ w_kvb.T).reshape(len(latents), HEADS, NOPE + V)
    k, v = kv[..., :NOPE], kv[..., NOPE:]
    z = np.einsum("hd,thd->ht", q, k) / np.sqrt(NOPE)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return w_o @ np.einsum("ht,thd->hd", p, v).reshape(-1)


def _absorbed(w_q, w_out, q_resid, latents):
    """The blueprint's decode math (explain glm_mla_decode) with absorbed weights, float64."""
    q = (w_q @ q_resid).reshape(HEADS, LATENT)
    z = q @ latents.T / np.sqrt(LATENT)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return w_out @ (p @ latents).reshape(-1)


def test_absorbed_equals_unabsorbed_exactly_in_float64():
    rng = np.random.default_rng(3)
    w_qb, w_kvb, w_o = _weights(rng)
    q_resid, latents = rng.standard_normal(Q_LORA), rng.standard_normal((TOKENS, LATENT))
    w_q = absorb_query(w_qb, w_kvb, HEADS, NOPE, 0, V)
    w_out = absorb_output(w_o, w_kvb, HEADS, NOPE, V)
    assert w_q.shape == (HEADS * LATENT, Q_LORA) and w_out.shape == (HIDDEN, HEADS * LATENT)
    want = _unabsorbed(w_qb, w_kvb, w_o, q_resid, latents)
    np.testing.assert_allclose(_absorbed(w_q, w_out, q_resid, latents), want, rtol=1e-10, atol=1e-12)


def test_requantized_through_the_reference_decode():
    """FP8 re-quantized absorbed weights through kbpc's own glm_mla_decode (FP8 latent cache, BF16
    query) stay within the E4M3 grid's error of the unabsorbed float64 result."""
    rng = np.random.default_rng(4)
    w_qb, w_kvb, w_o = _weights(rng)
    q_resid = to_bf16(rng.standard_normal(Q_LORA)).astype(np.float64)
    codes = e4m3_encode(rng.standard_normal((TOKENS, LATENT)).astype(np.float32))
    latents = dequantize_fp8(codes, np.ones(TOKENS, np.float32), axis=-1).astype(np.float64)
    q8 = requantize(absorb_query(w_qb, w_kvb, HEADS, NOPE, 0, V), "fp8/channel", "q_b")
    o8 = requantize(absorb_output(w_o, w_kvb, HEADS, NOPE, V), "fp8/channel", "o")
    q = to_bf16(dequantize_fp8(q8["weight"], q8["weight_scale"]) @ q_resid.astype(np.float32))
    attn = mla_decode(q.reshape(HEADS, LATENT), lambda ids: codes[ids], np.arange(TOKENS), TOKENS, 1.0)
    got = dequantize_fp8(o8["weight"], o8["weight_scale"]).astype(np.float64) @ attn.reshape(-1)
    want = _unabsorbed(w_qb, w_kvb, w_o, q_resid, latents)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel < 0.06, rel          # two E4M3 weight roundings (~2.5% RMS each) and BF16 q / o
    assert np.linalg.norm(_absorbed(absorb_query(w_qb, w_kvb, HEADS, NOPE, 0, V),
                                    absorb_output(w_o, w_kvb, HEADS, NOPE, V), q_resid, latents) - want) < 1e-9


def test_softmax_scale_is_folded_into_the_query():
    """Scaling kv_b's key rows by s scales the scores by s in both forms; the fold is exactly
    sqrt(kv_lora / (qk_nope + qk_rope))."""
    rng = np.random.default_rng(5)
    w_qb, w_kvb, _ = _weights(rng)
    head = w_qb[:NOPE].T @ w_kvb[:NOPE]                   # [q_lora, latent] = W_qb,0^T W_uk,0
    w_q = absorb_query(w_qb, w_kvb, HEADS, NOPE, 0, V)
    np.testing.assert_allclose(w_q[:LATENT], head.T * np.sqrt(LATENT / NOPE), rtol=1e-9, atol=1e-15)


def test_rope_and_other_formats_are_refused():
    rng = np.random.default_rng(6)
    w_qb, w_kvb, _ = _weights(rng)
    with pytest.raises(WeightsError, match="NoPE"):
        absorb_query(w_qb, w_kvb, HEADS, NOPE - 32, 32, V)
    with pytest.raises(WeightsError, match="fp8/channel or bf16"):
        requantize(w_qb, "nvfp4/g16", "q_b")
