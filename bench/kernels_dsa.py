"""Benchmark cases of the DSA kernels at the seed's shapes (latent 512, 32 attention heads, indexer
32 heads x 128, pools of 4, top-2048 tokens) at 1k, 16k and 128k context. See bench/kernels.py."""
from __future__ import annotations

import numpy as np

from kernels import Case, rotations

E, HEADS, D, H, KP, TOPK_POOLS, PAGE = 512, 32, 128, 32, 4, 512, 64
WIDTH = (TOPK_POOLS + 1) * KP
CONTEXTS = (1024, 16384, 131072)

SOURCE = f"""
#include "glm_mla_latent_write.cuh"
#include "dsa_indexer.cuh"
#include "glm_mla_decode.cuh"
using namespace kbp;
extern "C" __global__ void __launch_bounds__({E}) b_latent(const __nv_bfloat16* c, const __nv_bfloat16* g,
    const int32_t* s, float sk, float eps, uint8_t* cache) {{ glm_mla_latent_write_fp8_body<{E}>(c, g, s, sk, eps, cache); }}
extern "C" __global__ void __launch_bounds__({D}) b_store(const __nv_bfloat16* k, const __nv_bfloat16* g,
    const float* a, __nv_bfloat16* kk, __nv_bfloat16* gg, int rows, float* pk, const int32_t* tau) {{
  dsa_indexer_store_body<{D}, {KP}>(k, g, a, kk, gg, rows, pk, tau); }}
extern "C" __global__ void __launch_bounds__(128) b_scores(const float* q, const float* w, const float* pk,
    const int32_t* s, const int32_t* tau, float* out) {{ dsa_index_scores_body<{H}, {D}, {KP}>(q, w, pk, s, tau, out); }}
extern "C" __global__ void __launch_bounds__(1024) b_topk(const float* sc, const int32_t* s, const int32_t* tau,
    int32_t* pools, int32_t* toks) {{ dsa_topk_select_body<{KP}, {TOPK_POOLS}>(sc, s, tau, pools, toks); }}
extern "C" __global__ void __launch_bounds__(512) b_decode(const __nv_bfloat16* q, const uint8_t* cache,
    const int32_t* bt, int page, const int32_t* sel, int width, const int32_t* s, float sk, __nv_bfloat16* out) {{
  glm_mla_decode_fp8_body<{E}, 16, 4>(q, cache, bt, page, sel, width, s, sk, out); }}
"""


def _mod():
    from kbpc.testing.gpu import load_module  # noqa: PLC0415
    return load_module(SOURCE, "bench_dsa")


def _gpu(a):
    from kbpc.testing.gpu import to_gpu  # noqa: PLC0415
    return to_gpu(a)


def _i32(v):
    return _gpu(np.array([v], np.int32))


def _latent_case() -> Case:
    nbytes = E * 2 * 2 + E + 4

    def setup():
        f = _mod().get_function("b_latent")
        rng = np.random.default_rng(0)
        n = rotations(nbytes)
        cs = [_gpu(rng.integers(0, 1 << 14, E).astype(np.uint16)) for _ in range(n)]
        g, slot = _gpu(np.full(E, 0x3F80, np.uint16)), _i32(5)
        cache = _gpu(np.zeros((64, E), np.uint8))
        return lambda i: f(cs[i % n], g, slot, np.float32(1), np.float32(1e-5), cache,
                           block=(E, 1, 1), grid=(1, 1))
    return Case("glm_mla_latent_write::latent_write_fp8", f"1x{E} bf16 -> e4m3", nbytes, setup)


def _store_case() -> Case:
    nbytes = D * 2 * 2 * 2 + KP * D * (2 * 2 + 4) + D * 4     # write k,g; read pool rows, a; write kbar

    def setup():
        f = _mod().get_function("b_store")
        rng = np.random.default_rng(0)
        k = _gpu(rng.integers(0, 1 << 14, D).astype(np.uint16))
        a = _gpu(np.zeros((KP, D), np.float32))
        kk, gg = _gpu(np.zeros((KP, D), np.uint16)), _gpu(np.zeros((KP, D), np.uint16))
        pk, tau = _gpu(np.zeros((8, D), np.float32)), _i32(7)   # position 7 completes pool 1
        return lambda i: f(k, k, a, kk, gg, np.int32(KP), pk, tau, block=(D, 1, 1), grid=(1, 1))
    return Case("dsa_indexer::store+pool", f"{D} bf16 key+gate, pool {KP}", nbytes, setup)


def _scores_case(ctx: int) -> Case:
    pools = ctx // KP
    nbytes = pools * D * 4 + H * D * 4 + H * 4 + pools * 4

    def setup():
        f = _mod().get_function("b_scores")
        rng = np.random.default_rng(0)
        n = rotations(pools * D * 4)
        pks = [_gpu(rng.normal(size=(pools, D)).astype(np.float32)) for _ in range(n)]
        q, w = _gpu(rng.normal(size=(H, D)).astype(np.float32)), _gpu(rng.normal(size=H).astype(np.float32))
        out, s, tau = _gpu(np.zeros(pools, np.float32)), _i32(ctx), _i32(ctx - 1)
        grid = max(1, min(-(-pools // 128), 264))
        return lambda i: f(q, w, pks[i % n], s, tau, out, block=(128, 1, 1), grid=(grid, 1))
    return Case("dsa_indexer::index_scores", f"ctx {ctx}: {pools}x{D} f32 x {H} heads", nbytes, setup)


def _topk_case(ctx: int) -> Case:
    pools = ctx // KP
    nbytes = pools * 4 + TOPK_POOLS * 4 + WIDTH * 4

    def setup():
        f = _mod().get_function("b_topk")
        rng = np.random.default_rng(0)
        n = rotations(pools * 4)
        scs = [_gpu(rng.normal(size=pools).astype(np.float32)) for _ in range(n)]
        pl, tk = _gpu(np.zeros(TOPK_POOLS, np.int32)), _gpu(np.zeros(WIDTH, np.int32))
        s, tau = _i32(ctx), _i32(ctx - 1)
        return lambda i: f(scs[i % n], s, tau, pl, tk, block=(1024, 1, 1), grid=(1, 1))
    return Case("dsa_indexer::topk_select+expand", f"ctx {ctx}: top {TOPK_POOLS} of {pools}", nbytes, setup)


def _decode_case(ctx: int) -> Case:
    tokens = min(ctx, TOPK_POOLS * KP)
    cache_bytes = ctx * E
    nbytes = HEADS * E * 2 * 2 + tokens * E + WIDTH * 4

    def setup():
        f = _mod().get_function("b_decode")
        rng = np.random.default_rng(0)
        pages = -(-ctx // PAGE)
        n = rotations(cache_bytes)
        caches = [_gpu(rng.integers(0, 0x70, (pages * PAGE, E)).astype(np.uint8)) for _ in range(n)]
        table = _gpu(rng.permutation(pages).astype(np.int32))
        sel = np.full(WIDTH, -1, np.int32)
        sel[:tokens] = np.sort(rng.choice(ctx, tokens, replace=False))
        q = _gpu(rng.integers(0, 1 << 14, (HEADS, E)).astype(np.uint16))
        d_sel, out, s = _gpu(sel), _gpu(np.zeros((HEADS, E), np.uint16)), _i32(ctx)
        return lambda i: f(q, caches[i % n], table, np.int32(PAGE), d_sel, np.int32(WIDTH), s,
                           np.float32(1), out, block=(512, 1, 1), grid=(HEADS, 1))
    return Case("glm_mla_decode::decode_fp8", f"ctx {ctx}: {HEADS} heads x {tokens} tokens", nbytes, setup)


CASES = [_latent_case(), _store_case()] + [
    make(ctx) for ctx in CONTEXTS for make in (_scores_case, _topk_case, _decode_case)]
