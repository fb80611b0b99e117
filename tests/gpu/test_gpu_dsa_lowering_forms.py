"""GPU tests of the DSA kernel forms the code generation launches beyond tests/gpu/test_gpu_dsa.py:
the paged latent write (slot looked up from the device position through the block table) and the
index scores with a head count that is not a multiple of 32 (the tiny blueprint has 4 heads).

Tolerances: the paged write stores the same codes as glm_mla_latent_write_fp8 at the slot the
block table gives (same bounds as test_gpu_dsa: the codes between those of r(1 -+ 2^-21), since
rsqrtf is within 2 ulp); every other cache byte keeps its poison. Scores are exact (FP32 in a fixed
order, no transcendental)."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.reference import dsa_indexer as dsa
from kbpc.reference.formats import bf16_bits, e4m3_decode, e4m3_encode, to_bf16
from kbpc.reference.glm_mla_latent_write import LatentCacheLayout, latent_values
from kbpc.testing.gpu import fetch, load_module, poisoned, to_gpu

pytestmark = pytest.mark.gpu
F32 = np.float32
EPS = 1e-5

SOURCE = r"""
#include "glm_mla_latent_write.cuh"
#include "dsa_indexer.cuh"
using namespace kbp;
extern "C" __global__ void __launch_bounds__({E}) t_paged(const __nv_bfloat16* c, const __nv_bfloat16* g,
    const int32_t* bt, int page, const int32_t* pos, float s_k, float eps, uint8_t* cache) {{
  glm_mla_latent_write_fp8_paged_body<{E}>(c, g, bt, page, pos, s_k, eps, cache); }}
extern "C" __global__ void __launch_bounds__(128) t_scores(const float* q, const float* w,
    const float* pk, const int32_t* s, const int32_t* tau, float* out) {{
  dsa_index_scores_body<{H}, {D}, {KP}>(q, w, pk, s, tau, out); }}
"""


def _module(E=512, H=4, D=128, KP=4):
    return load_module(SOURCE.format(E=E, H=H, D=D, KP=KP), f"dsa_forms_e{E}_h{H}_d{D}_k{KP}")


def _i32(*v):
    return to_gpu(np.array(v, np.int32))


@pytest.mark.parametrize("rows,pos", [(1, 0), (1, 63), (1, 64 * 3 + 5), (3, 126)])
def test_paged_latent_write(rows, pos):
    rng = np.random.default_rng()
    mod = _module()
    page, e = 64, 512
    layout = LatentCacheLayout(num_pages=6, page_size=page, latent_dim=e)
    table = rng.permutation(layout.num_pages).astype(np.int32)   # not the identity
    c = to_bf16(rng.normal(0, rng.uniform(0.1, 30), (rows, e)).astype(F32))
    gamma = to_bf16(rng.uniform(-2, 2, e).astype(F32))
    s_k = F32(rng.choice([1.0, 0.37, 4.0]))
    cache = poisoned(layout.shape, np.uint8)
    mod.get_function("t_paged")(to_gpu(bf16_bits(c)), to_gpu(bf16_bits(gamma)), to_gpu(table), np.int32(page),
                                _i32(pos), s_k, F32(EPS), cache.gpudata, block=(e, 1, 1), grid=(rows, 1))
    got = fetch(cache, allow_nan=True).reshape(-1, e)
    slots = [layout.slot(table, pos + r) for r in range(rows)]
    untouched = np.ones(got.shape[0], bool)
    untouched[slots] = False
    assert np.all(got[untouched] == 0xFF), "rows other than the token slots were touched"
    y = latent_values(c, gamma, EPS, s_k)
    lo = e4m3_decode(e4m3_encode(y * F32(1 - 2 ** -21))).astype(np.float64)
    hi = e4m3_decode(e4m3_encode(y * F32(1 + 2 ** -21))).astype(np.float64)
    for r, slot in enumerate(slots):
        v = e4m3_decode(got[slot]).astype(np.float64)
        assert np.all((v >= np.minimum(lo[r], hi[r])) & (v <= np.maximum(lo[r], hi[r]))), f"row {r}"


@pytest.mark.parametrize("heads,dim", [(4, 128), (1, 128), (20, 64), (48, 64), (32, 128)])
@pytest.mark.parametrize("n_tokens,grid", [(3, 1), (4 * 77 + 1, 2), (4 * 1000, 8)])
def test_scores_any_heads_exact(heads, dim, n_tokens, grid):
    rng = np.random.default_rng()
    mod = _module(H=heads, D=dim)
    geo = dsa.IndexerGeometry(head_dim=dim, heads=heads, pool=4, topk_tokens=64)
    cap = n_tokens // 4 + 3
    pk = rng.normal(size=(cap, dim)).astype(F32)
    q = rng.normal(size=(heads, dim)).astype(F32)
    raw = rng.normal(size=heads).astype(F32)
    tau = n_tokens - 1
    n = dsa.valid_pools(geo, n_tokens, tau)
    out = poisoned((cap,), np.float32)
    mod.get_function("t_scores")(to_gpu(q), to_gpu(raw), to_gpu(pk), _i32(n_tokens), _i32(tau), out.gpudata,
                                 block=(128, 1, 1), grid=(grid, 1))
    got = fetch(out, allow_nan=True)
    ref = dsa.index_scores(geo, q, raw, pk, n_tokens, tau)
    np.testing.assert_array_equal(got[:n].view(np.uint32), ref[:n].view(np.uint32))
    assert np.all(np.isnan(got[n:])), "scores past the valid pools are not written"
