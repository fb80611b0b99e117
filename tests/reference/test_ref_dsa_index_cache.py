"""The FP8 indexer cache reference (kbpc/reference/dsa_index_cache.py): the rotation against the
Hadamard matrix in float64, the power-of-two scale's definition at its edges, the round-trip error
bound, the cache through store_token, and the interpreter following the compile option."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.reference import dsa_index_cache as fp8c
from kbpc.reference import dsa_indexer as dsa
from kbpc.reference.formats import e4m3_decode, to_bf16

F32 = np.float32


@pytest.mark.parametrize("n", [1, 2, 32, 128])
def test_fwht_is_the_hadamard_product(n):
    rng = np.random.default_rng()
    x = rng.normal(size=(5, n)).astype(F32)
    exact = x.astype(np.float64) @ fp8c.hadamard(n).T
    np.testing.assert_allclose(fwht := fp8c.fwht(x), exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())
    np.testing.assert_allclose(fp8c.fwht(fwht) / n, x, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError):
        fp8c.fwht(np.zeros(12, F32))


def test_fwht_stage_order_is_fixed():
    """Stages h = 1, 2, 4, ...: rounding differs from other orders, so the order is part of the math."""
    x = np.array([1e8, 1.0, -1e8, 3.0], F32)
    a, b = (x[0] + x[1]).astype(F32), (x[0] - x[1]).astype(F32)
    c, d = (x[2] + x[3]).astype(F32), (x[2] - x[3]).astype(F32)
    want = np.array([a + c, b + d, a - c, b - d], F32)
    np.testing.assert_array_equal(fp8c.fwht(x), want)


def test_scale_exponent_edges():
    v = np.array([448.0, np.nextafter(F32(448), F32(1e9)), 224.0, 1.0, 0.0, 1e-42, 3e38], F32)
    e = fp8c.scale_exponent(v)
    np.testing.assert_array_equal(e[:5], [0, 1, -1, -8, -126])
    assert e[5] == -126                                   # clamped below
    for m, k in zip(v, e):
        if m > 0 and -126 < k < 127:
            s = np.ldexp(1.0, int(k))
            assert m <= 448 * s and m > 448 * s / 2       # the smallest such exponent


def test_roundtrip_error_bound():
    """|sigma yhat - y| <= max(2^-4 |y|, sigma 2^-10) per rotated channel (RNE on E4M3's 3 mantissa
    bits, or its subnormal step 2^-9 halved); the read back is FWHT / D of that, so per key
    ||ktilde - kbar||_2 <= ||that error||_2 / sqrt(D) (plus FP32 rounding of the rotations)."""
    rng = np.random.default_rng()
    kbar = (rng.normal(size=(64, 128)) * rng.uniform(1e-3, 1e3, (64, 1))).astype(F32)
    codes, sigma = fp8c.quantize_pool_keys(kbar)
    assert codes.dtype == np.uint8 and sigma.dtype == F32
    assert np.all(np.log2(sigma) == np.round(np.log2(sigma)))
    y = fp8c.fwht(kbar).astype(np.float64)
    got = e4m3_decode(codes).astype(np.float64) * sigma[:, None]
    assert np.all(np.abs(got - y) <= np.maximum(2.0 ** -4 * np.abs(y), sigma[:, None] * 2.0 ** -10) * (1 + 1e-6))
    assert np.all(np.abs(got).max(axis=1) > 0)
    back = fp8c.dequantize_pool_keys(codes, sigma).astype(np.float64)
    bound = np.linalg.norm(got - y, axis=1) / np.sqrt(128) + 1e-5 * np.linalg.norm(kbar, axis=1)
    assert np.all(np.linalg.norm(back - kbar, axis=1) <= bound)
    zero_codes, zero_sigma = fp8c.quantize_pool_keys(np.zeros((1, 128), F32))
    assert np.all(zero_codes == 0) and zero_sigma[0] == np.ldexp(F32(1), -126)


def test_fp8_cache_through_store_token():
    rng = np.random.default_rng()
    geo = dsa.IndexerGeometry(head_dim=64, heads=4, pool=4, topk_tokens=16)
    f32 = dsa.IndexerCache.empty(geo, rows=4, pool_capacity=6)
    fp8 = dsa.IndexerCache.empty(geo, rows=4, pool_capacity=6, kind="fp8")
    assert fp8.fp8 and not f32.fp8 and fp8.pool_keys.dtype == np.uint8
    keys = to_bf16(rng.normal(size=(22, 64)).astype(F32))
    gates = to_bf16(rng.normal(size=(22, 64)).astype(F32))
    a = rng.normal(0, 0.5, (4, 64)).astype(F32)
    for t in range(22):
        dsa.store_token(f32, geo, t, keys[t], gates[t], a)
        dsa.store_token(fp8, geo, t, keys[t], gates[t], a)
    kbar = f32.pool_values(5)
    codes, sigma = fp8c.quantize_pool_keys(kbar)
    np.testing.assert_array_equal(fp8.pool_keys[:5], codes)
    np.testing.assert_array_equal(fp8.pool_scales[:5], sigma)
    np.testing.assert_array_equal(fp8.pool_values(5), fp8c.dequantize_pool_keys(codes, sigma))
    with pytest.raises(ValueError):
        dsa.IndexerCache.empty(geo, rows=4, pool_capacity=6, kind="bf16")


def test_interpreter_follows_the_index_cache(tiny_path):
    from kbpc.frontend.load import load_blueprint
    from kbpc.reference.interpreter import Interpreter
    from kbpc.weights.synthetic import synthetic_weights

    tiny = load_blueprint(tiny_path)
    weights = synthetic_weights(tiny, 3)
    runs = {}
    for kind in ("f32", "fp8"):
        interp = Interpreter(tiny, weights, 40, index_cache=kind)
        token, logits = 1, []
        for _ in range(24):      # past several pools, so the selection reads persisted pool keys
            out, token = interp.step(token)
            logits.append(out)
        caches = [c for _, c in interp.state.indexer.values()]
        assert caches and all(c.fp8 == (kind == "fp8") for c in caches)
        runs[kind] = (np.array(logits), [c.pool_values(6) for c in caches])
    for f32_keys, fp8_keys in zip(runs["f32"][1], runs["fp8"][1]):   # the scores read ktilde, near kbar
        assert not np.array_equal(f32_keys, fp8_keys)
        assert np.linalg.norm(fp8_keys - f32_keys) <= 0.1 * np.linalg.norm(f32_keys)
    rel = np.linalg.norm(runs["f32"][0] - runs["fp8"][0]) / np.linalg.norm(runs["f32"][0])
    assert rel < 0.5
