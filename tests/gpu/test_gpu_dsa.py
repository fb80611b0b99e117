"""GPU tests of the DSA kernels (glm_mla_latent_write, dsa_indexer, glm_mla_decode) against the
numpy reference, on fresh random inputs each run with poisoned outputs.

Tolerances (each stage is fed the GPU's own output of the stage before, so a tolerance never
compounds):
- latent write: rsqrtf is within 2 ulp of the correctly rounded 1/sqrt the reference uses, so each
  code must lie between the codes the reference gives for r(1 - 2^-21) and r(1 + 2^-21) (rounding
  is monotone); cache bytes of skipped slots must keep their poison.
- pool keys: __expf has at most 2 + floor(1.173|x|) ulp error (CUDA guide); with |x| <= ~20 in
  these tests the softmax weights are within ~3e-6 relative, so |kbar_gpu - kbar_ref| <=
  2e-5 * sum_s |k_s| per channel. The store itself (BF16 bytes) is exact.
- scores, top-k, expansion: exact (FP32 in a fixed order, no transcendental).
- decode: __expf in the online softmax and the merge; the FP32 result is within ~1e-5 relative
  of the reference before the BF16 rounding, which can then land on the neighbouring BF16 value:
  allow one BF16 ulp (at most 2^-7 relative to each value)
  plus 1e-4 of the row's largest magnitude for cancellation in the weighted average.
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.reference import dsa_indexer as dsa
from kbpc.reference.formats import bf16_bits, bf16_from_bits, e4m3_decode, e4m3_encode, to_bf16
from kbpc.reference.glm_mla_decode import mla_decode
from kbpc.reference.glm_mla_latent_write import LatentCacheLayout, latent_values
from kbpc.testing.gpu import fetch, load_module, poisoned, to_gpu

pytestmark = pytest.mark.gpu
F32 = np.float32
EPS = 1e-5

SOURCE = r"""
#include "glm_mla_latent_write.cuh"
#include "dsa_indexer.cuh"
#include "glm_mla_decode.cuh"
using namespace kbp;
extern "C" __global__ void __launch_bounds__({E}) t_latent_write(const __nv_bfloat16* c,
    const __nv_bfloat16* g, const int32_t* slots, float s_k, float eps, uint8_t* cache) {{
  glm_mla_latent_write_fp8_body<{E}>(c, g, slots, s_k, eps, cache); }}
extern "C" __global__ void __launch_bounds__({D}) t_store(const __nv_bfloat16* k,
    const __nv_bfloat16* g, const float* a, __nv_bfloat16* kk, __nv_bfloat16* gg, int rows,
    float* pk, const int32_t* tau) {{
  dsa_indexer_store_body<{D}, {KP}>(k, g, a, kk, gg, rows, pk, tau); }}
extern "C" __global__ void __launch_bounds__(128) t_scores(const float* q, const float* w,
    const float* pk, const int32_t* s, const int32_t* tau, float* out) {{
  dsa_index_scores_body<{H}, {D}, {KP}>(q, w, pk, s, tau, out); }}
extern "C" __global__ void __launch_bounds__(1024) t_topk(const float* sc, const int32_t* s,
    const int32_t* tau, int32_t* pools, int32_t* toks) {{
  dsa_topk_select_body<{KP}, {TOPK}>(sc, s, tau, pools, toks); }}
extern "C" __global__ void __launch_bounds__(256) t_expand(const int32_t* pools, const int32_t* s,
    const int32_t* tau, int32_t* toks) {{
  dsa_expand_selection_body<{KP}, {TOPK}>(pools, s, tau, toks); }}
extern "C" __global__ void __launch_bounds__(512) t_decode(const __nv_bfloat16* q,
    const uint8_t* cache, const int32_t* bt, int page, const int32_t* sel, int width,
    const int32_t* s, float s_k, __nv_bfloat16* out) {{
  glm_mla_decode_fp8_body<{E}, 16, 4>(q, cache, bt, page, sel, width, s, s_k, out); }}
"""


def _module(E=512, D=128, KP=4, H=32, TOPK=512):
    src = SOURCE.format(E=E, D=D, KP=KP, H=H, TOPK=TOPK)
    return load_module(src, f"dsa_e{E}_d{D}_k{KP}_h{H}_t{TOPK}")


def _i32(*v):
    return to_gpu(np.array(v, np.int32))


# ---------------------------------------------------------------- latent write

def test_latent_write_codes_and_skip():
    rng = np.random.default_rng()
    mod = _module()
    layout = LatentCacheLayout(num_pages=6, page_size=64, latent_dim=512)
    rows = 9
    c = to_bf16(rng.normal(0, rng.uniform(0.1, 30), (rows, 512)).astype(F32))
    gamma = to_bf16(rng.uniform(-2, 2, 512).astype(F32))
    s_k = F32(rng.choice([1.0, 0.37, 4.0]))
    slots = rng.choice(layout.num_pages * 64, rows, replace=False).astype(np.int32)
    slots[3] = -1
    cache = poisoned(layout.shape, np.uint8)
    mod.get_function("t_latent_write")(to_gpu(bf16_bits(c)), to_gpu(bf16_bits(gamma)), to_gpu(slots),
                                       s_k, F32(EPS), cache.gpudata, block=(512, 1, 1), grid=(rows, 1))
    got = fetch(cache, allow_nan=True).reshape(-1, 512)
    written = np.zeros(got.shape[0], bool)
    written[slots[slots >= 0]] = True
    assert np.all(got[~written] == 0xFF), "rows other than the written slots were touched"
    y = latent_values(c, gamma, EPS, s_k)
    lo = e4m3_decode(e4m3_encode(y * F32(1 - 2 ** -21))).astype(np.float64)
    hi = e4m3_decode(e4m3_encode(y * F32(1 + 2 ** -21))).astype(np.float64)
    for r in np.flatnonzero(slots >= 0):
        v = e4m3_decode(got[slots[r]]).astype(np.float64)
        assert np.all((v >= np.minimum(lo[r], hi[r])) & (v <= np.maximum(lo[r], hi[r]))), f"row {r}"


# ---------------------------------------------------------------- indexer stages

def _topk_case(rng, n, ties: bool):
    if ties:
        s = rng.integers(-3, 4, n).astype(F32) * F32(0.5)
        s[rng.random(n) < 0.1] = F32(-0.0)
    else:
        s = rng.normal(size=n).astype(F32)
    return s


@pytest.mark.parametrize("n_tokens", [3, 9, 1000, 16384 + 7, 131072])
@pytest.mark.parametrize("ties", [False, True])
def test_topk_and_expand_exact(n_tokens, ties):
    rng = np.random.default_rng()
    mod = _module()
    geo = dsa.IndexerGeometry(head_dim=128, heads=32, pool=4, topk_tokens=2048)
    tau = n_tokens - 1
    n = dsa.valid_pools(geo, n_tokens, tau)
    scores = np.concatenate([_topk_case(rng, n, ties), np.full(8, np.nan, F32)])  # beyond n: unread
    pools, toks = poisoned((geo.topk_pools,), np.int32), poisoned((geo.selection_width,), np.int32)
    mod.get_function("t_topk")(to_gpu(scores), _i32(n_tokens), _i32(tau), pools.gpudata, toks.gpudata,
                               block=(1024, 1, 1), grid=(1, 1))
    k = dsa.topk_count(geo, n_tokens, tau)
    ref_pools = dsa.top_pools(scores[:n], k)
    got_pools = fetch(pools, "pools")
    np.testing.assert_array_equal(got_pools[:k], ref_pools)
    assert np.all(got_pools[k:] == -1)
    np.testing.assert_array_equal(fetch(toks, "tokens"), dsa.expand_selection(geo, ref_pools, n_tokens, tau))
    toks2 = poisoned((geo.selection_width,), np.int32)
    mod.get_function("t_expand")(pools.gpudata, _i32(n_tokens), _i32(tau), toks2.gpudata,
                                 block=(256, 1, 1), grid=(1, 1))
    np.testing.assert_array_equal(fetch(toks2, "tokens"), fetch(toks))


@pytest.mark.parametrize("n_tokens,grid", [(5, 1), (4 * 3001 + 2, 7), (4 * 32768, 132)])
def test_scores_exact(n_tokens, grid):
    rng = np.random.default_rng()
    mod = _module()
    geo = dsa.IndexerGeometry(head_dim=128, heads=32, pool=4, topk_tokens=2048)
    cap = n_tokens // 4 + 3
    pk = rng.normal(size=(cap, 128)).astype(F32)
    q = rng.normal(size=(32, 128)).astype(F32)
    raw = rng.normal(size=32).astype(F32)
    tau = n_tokens - 1
    n = dsa.valid_pools(geo, n_tokens, tau)
    out = poisoned((cap,), np.float32)
    mod.get_function("t_scores")(to_gpu(q), to_gpu(raw), to_gpu(pk), _i32(n_tokens), _i32(tau), out.gpudata,
                                 block=(128, 1, 1), grid=(grid, 1))
    got = fetch(out, allow_nan=True)
    ref = dsa.index_scores(geo, q, raw, pk, n_tokens, tau)
    np.testing.assert_array_equal(got[:n].view(np.uint32), ref[:n].view(np.uint32))
    assert np.all(np.isnan(got[n:])), "scores past the valid pools are not written"


def _pool_tol(keys_f32):
    return F32(2e-5) * np.abs(keys_f32).sum(axis=-2)


# ---------------------------------------------------------------- decode

def _decode_ref_check(got, q, rows_fn, sel, seq_len, s_k):
    ref = mla_decode(q, rows_fn, sel, seq_len, s_k)
    scale = np.abs(ref).max(axis=1, keepdims=True)
    assert np.all(np.abs(got - ref) <= np.abs(ref) * 2 ** -7 + 1e-4 * scale), np.abs(got - ref).max()


@pytest.mark.parametrize("width,seq_len", [(2052, 5000), (37, 100), (8, 10)])
def test_decode_selection(width, seq_len):
    rng = np.random.default_rng()
    mod = _module()
    heads, page = 8, 64
    layout = LatentCacheLayout(num_pages=seq_len // page + 2, page_size=page, latent_dim=512)
    table = rng.permutation(layout.num_pages).astype(np.int32)
    cache = e4m3_encode(rng.normal(0, 2, layout.shape).astype(F32))
    q = to_bf16(rng.normal(0, 0.1, (heads, 512)).astype(F32))
    sel = rng.integers(-1, seq_len, width).astype(np.int32)
    sel[rng.random(width) < 0.05] = seq_len + 3                      # out of range: skipped
    sel[1::7] = sel[0]                                               # duplicates
    s_k = F32(rng.choice([1.0, 0.5, 1.3]))
    out = poisoned((heads, 512), np.uint16)
    mod.get_function("t_decode")(to_gpu(bf16_bits(q)), to_gpu(cache), to_gpu(table), np.int32(page),
                                 to_gpu(sel), np.int32(width), _i32(seq_len), s_k, out.gpudata,
                                 block=(512, 1, 1), grid=(heads, 1))
    got = bf16_from_bits(fetch(out))
    _decode_ref_check(got, q, lambda ids: layout.rows(cache, table, ids), sel, seq_len, s_k)
    none = to_gpu(np.full(width, -1, np.int32))
    mod.get_function("t_decode")(to_gpu(bf16_bits(q)), to_gpu(cache), to_gpu(table), np.int32(page), none,
                                 np.int32(width), _i32(seq_len), s_k, out.gpudata, block=(512, 1, 1),
                                 grid=(heads, 1))
    assert np.all(fetch(out) == 0)


# ---------------------------------------------------------------- many consecutive positions

def test_many_positions_every_step():
    """Positions 0..T-1 one step at a time through every kernel (latent write, store + pool,
    scores, top-k + expansion, decode), past several pools, pages and the top-k (16 pools)."""
    rng = np.random.default_rng()
    E, D, KP, H, TOPK, HEADS, PAGE, T = 512, 128, 4, 32, 16, 4, 16, 150
    mod = _module(TOPK=TOPK)
    geo = dsa.IndexerGeometry(head_dim=D, heads=H, pool=KP, topk_tokens=TOPK * KP)
    layout = LatentCacheLayout(num_pages=T // PAGE + 1, page_size=PAGE, latent_dim=E)
    table = rng.permutation(layout.num_pages).astype(np.int32)
    gamma = to_bf16(rng.uniform(0.5, 1.5, E).astype(F32))
    a = rng.normal(0, 0.5, (KP, D)).astype(F32)
    rows = KP
    d_cache, d_table = to_gpu(np.zeros(layout.shape, np.uint8)), to_gpu(table)
    d_keys, d_gates = to_gpu(np.zeros((rows, D), np.uint16)), to_gpu(np.zeros((rows, D), np.uint16))
    d_pk, d_a, d_gamma = poisoned((T // KP + 1, D), np.float32), to_gpu(a), to_gpu(bf16_bits(gamma))
    keys_hist, gates_hist = [], []
    for t in range(T):
        d_s, d_tau = _i32(t + 1), _i32(t)
        lat = to_bf16(rng.normal(size=(1, E)).astype(F32))
        mod.get_function("t_latent_write")(to_gpu(bf16_bits(lat)), d_gamma, _i32(layout.slot(table, t)),
                                           F32(1), F32(EPS), d_cache.gpudata, block=(E, 1, 1), grid=(1, 1))
        k, g = to_bf16(rng.normal(size=D).astype(F32)), to_bf16(rng.normal(0, 2, D).astype(F32))
        keys_hist.append(k), gates_hist.append(g)
        mod.get_function("t_store")(to_gpu(bf16_bits(k)), to_gpu(bf16_bits(g)), d_a, d_keys.gpudata,
                                    d_gates.gpudata, np.int32(rows), d_pk.gpudata, d_tau,
                                    block=(D, 1, 1), grid=(1, 1))
        np.testing.assert_array_equal(d_keys.get()[t % rows], bf16_bits(k))
        n = (t + 1) // KP
        pk = fetch(d_pk, allow_nan=True)[:n]
        if n and (t + 1) % KP == 0:
            kk = np.array(keys_hist[-KP:]).reshape(1, KP, D)
            ref = dsa.compress_pool(kk, np.array(gates_hist[-KP:]).reshape(1, KP, D), a)[0]
            assert np.all(np.abs(pk[n - 1] - ref) <= _pool_tol(kk)[0]), f"pool {n - 1}"
        q, raw = rng.normal(size=(H, D)).astype(F32), rng.normal(size=H).astype(F32)
        sc = poisoned((T // KP + 1,), np.float32)
        mod.get_function("t_scores")(to_gpu(q), to_gpu(raw), d_pk.gpudata, d_s, d_tau, sc.gpudata,
                                     block=(128, 1, 1), grid=(2, 1))
        got_sc = fetch(sc, allow_nan=True)[:n]
        np.testing.assert_array_equal(got_sc, dsa.index_scores(geo, q, raw, pk, t + 1, t)[:n])
        pools, toks = poisoned((TOPK,), np.int32), poisoned((geo.selection_width,), np.int32)
        mod.get_function("t_topk")(sc.gpudata, d_s, d_tau, pools.gpudata, toks.gpudata,
                                   block=(1024, 1, 1), grid=(1, 1))
        ref_pools = dsa.top_pools(got_sc, dsa.topk_count(geo, t + 1, t))
        sel = fetch(toks)
        np.testing.assert_array_equal(sel, dsa.expand_selection(geo, ref_pools, t + 1, t))
        qa = to_bf16(rng.normal(0, 0.1, (HEADS, E)).astype(F32))
        out = poisoned((HEADS, E), np.uint16)
        mod.get_function("t_decode")(to_gpu(bf16_bits(qa)), d_cache.gpudata, d_table.gpudata, np.int32(PAGE),
                                     toks.gpudata, np.int32(geo.selection_width), d_s, F32(1), out.gpudata,
                                     block=(512, 1, 1), grid=(HEADS, 1))
        codes = d_cache.get()
        _decode_ref_check(bf16_from_bits(fetch(out)), qa, lambda ids: layout.rows(codes, table, ids),
                          sel, t + 1, 1.0)
