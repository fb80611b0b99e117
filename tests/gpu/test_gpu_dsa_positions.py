"""The DSA kernels chained as a step runs them, position after position, through the product's
launchers: paged latent write, indexer store (+ pool key), select (scores + top-k + expansion) and
the split MLA decode reading the GPU's own selection and caches. Every stage is compared bit for bit
with the reference carrying its own caches, so the latent cache and the pool keys build up over
the positions: pools complete, pages fill, the top-k starts dropping pools. Runs from position 0,
and near 128k context over a prefilled history (keys repeated from 1000 distinct rows so the
reference scores stay cheap), with the FP32 and the FP8 index cache."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import dsa_indexer as lower_dsa
from kbpc.codegen.families import glm_mla_decode as lower_mla
from kbpc.codegen.families import glm_mla_latent_write as lower_lw
from kbpc.codegen.records import KernelInstance
from kbpc.ir.state import INDEX_SELECT_BIN_BITS, INDEX_SELECT_FILTER_CAP
from kbpc.reference import dsa_indexer as dsa
from kbpc.reference.dsa_index_cache import dequantize_pool_keys, quantize_pool_keys
from kbpc.reference.formats import bf16_bits, bf16_from_bits, to_bf16
from kbpc.reference.glm_mla_decode import ORDER_WARPS, mla_decode
from kbpc.reference.glm_mla_latent_write import LatentCacheLayout, latent_write

pytestmark = pytest.mark.gpu
F32 = np.float32
E, D, KP, H, HEADS, PAGE, EPS = 512, 128, 4, 32, 4, 16, 1e-5


class Chain:
    """Device state and launchers of one DSA layer, and the reference's caches beside them."""

    def __init__(self, rng, context: int, topk: int, fp8: bool, history: int):
        from kbpc.testing import gpu
        from kbpc.testing.launchers import launcher

        self.gpu, self.rng, self.fp8, self.topk = gpu, rng, fp8, topk
        self.geo = dsa.IndexerGeometry(head_dim=D, heads=H, pool=KP, topk_tokens=topk * KP)
        cap = -(-context // KP)
        self.layout = LatentCacheLayout(num_pages=-(-context // PAGE), page_size=PAGE, latent_dim=E)
        self.table = rng.permutation(self.layout.num_pages).astype(np.int32)
        self.codes = rng.integers(0, 0x7E, self.layout.shape, dtype=np.uint8)   # finite E4M3, history
        self.ref = dsa.IndexerCache.empty(self.geo, rows=KP, pool_capacity=cap, kind="fp8" if fp8 else "f32")
        self.rows = rng.normal(size=(1000, D)).astype(F32)
        self.index = rng.integers(0, 1000, cap)
        hist_pools = history // KP
        if fp8:
            c, s = quantize_pool_keys(self.rows)
            self.ref.pool_keys[:hist_pools] = c[self.index[:hist_pools]]
            self.ref.pool_scales[:hist_pools] = s[self.index[:hist_pools]]
            self.row_values = dequantize_pool_keys(c, s)
        else:
            self.ref.pool_keys[:hist_pools] = self.rows[self.index[:hist_pools]]
            self.row_values = self.rows
        self.hist_pools = hist_pools
        self.gamma = to_bf16(rng.uniform(0.5, 1.5, E).astype(F32))
        self.a = rng.normal(0, 0.5, (KP, D)).astype(F32)
        g = gpu.to_gpu
        self.d = dict(cache=g(self.codes), table=g(self.table), gamma=g(bf16_bits(self.gamma)), a=g(self.a),
                      keys=g(np.zeros((KP, D), np.uint16)), gates=g(np.zeros((KP, D), np.uint16)),
                      pk=None if fp8 else g(np.ascontiguousarray(self.ref.pool_keys)),
                      codes=g(np.ascontiguousarray(self.ref.pool_keys)) if fp8 else None,
                      scales=g(self.ref.pool_scales) if fp8 else None,
                      scores=gpu.poisoned((cap,), np.float32),
                      hist=g(np.zeros(1 << INDEX_SELECT_BIN_BITS, np.uint32)), arrive=g(np.zeros(2, np.uint32)),
                      cand=g(np.zeros(INDEX_SELECT_FILTER_CAP, np.uint64)),
                      merge=gpu.poisoned((1, ORDER_WARPS, HEADS, E + 2), np.float32),
                      counters=g(np.zeros((1, ORDER_WARPS, HEADS), np.uint32)))
        self.write = launcher(KernelInstance("glm_mla_latent_write", "glm_mla_latent_write.cuh",
                                             f"kbp::glm_mla_latent_write_fp8_paged<{E}>", lower_lw.PARAMS))
        self.store = launcher(lower_dsa.store_instance(D, KP, fp8))
        self.select = launcher(lower_dsa.select_instance(H, D, KP, topk, fp8))
        self.decode = launcher(lower_mla.decode_instance(E, lower_mla.heads_per_cta(HEADS)))
        self.blocks = lower_dsa.select_blocks("sm_90", cap)

    def _ref_scores(self, q, raw, t) -> np.ndarray:
        n = dsa.valid_pools(self.geo, t + 1, t)
        hist = min(n, self.hist_pools)
        rows = dsa.index_scores(self.geo, q, raw, self.row_values, 10 ** 9, 10 ** 9 - 1)[self.index[:hist]]
        if self.fp8:
            fresh = dequantize_pool_keys(self.ref.pool_keys[hist:n], self.ref.pool_scales[hist:n])
        else:
            fresh = self.ref.pool_keys[hist:n]
        new = dsa.index_scores(self.geo, q, raw, fresh, 10 ** 9, 10 ** 9 - 1)
        return np.concatenate([rows, new]).astype(F32)

    def step(self, t: int) -> None:
        gpu, rng, d = self.gpu, self.rng, self.d
        pos, seq = gpu.to_gpu(np.array([t], np.int32)), gpu.to_gpu(np.array([t + 1], np.int32))
        c = to_bf16(rng.normal(size=(1, E)).astype(F32))
        self.write((1, 1, 1), (E, 1, 1), gpu.to_gpu(bf16_bits(c)), d["gamma"], d["table"], PAGE, pos, F32(1),
                   F32(EPS), d["cache"])
        self.codes = latent_write(self.codes, c, self.gamma, [self.layout.slot(self.table, t)], EPS, 1.0)
        np.testing.assert_array_equal(d["cache"].get(), self.codes, f"latent cache at {t}")
        k, g = to_bf16(rng.normal(size=D).astype(F32)), to_bf16(rng.normal(0, 2, D).astype(F32))
        self.store((1, 1, 1), (D, 1, 1), gpu.to_gpu(bf16_bits(k)), gpu.to_gpu(bf16_bits(g)), d["a"], d["keys"],
                   d["gates"], KP, d["pk"], d["codes"], d["scales"], pos)
        dsa.store_token(self.ref, self.geo, t, k, g, self.a)
        n = dsa.valid_pools(self.geo, t + 1, t)
        if self.fp8:
            np.testing.assert_array_equal(d["codes"].get()[:n], self.ref.pool_keys[:n], f"pool codes at {t}")
            np.testing.assert_array_equal(d["scales"].get()[:n], self.ref.pool_scales[:n])
        else:
            np.testing.assert_array_equal(d["pk"].get()[:n], self.ref.pool_keys[:n], f"pool keys at {t}")
        q, raw = rng.normal(size=(H, D)).astype(F32), rng.normal(size=H).astype(F32)
        toks = gpu.poisoned((self.geo.selection_width,), np.int32)
        self.select((self.blocks, 1, 1), (lower_dsa.SELECT_THREADS, 1, 1), gpu.to_gpu(q), gpu.to_gpu(raw), d["pk"],
                    d["codes"], d["scales"], seq, pos, d["scores"], d["hist"], d["arrive"], d["cand"], toks)
        ref_scores = self._ref_scores(q, raw, t)
        got = gpu.fetch(d["scores"], allow_nan=True)[:n]
        np.testing.assert_array_equal(got.view(np.uint32), ref_scores.view(np.uint32), f"scores at {t}")
        sel = gpu.fetch(toks, "tokens")
        pools = dsa.top_pools(ref_scores, dsa.topk_count(self.geo, t + 1, t))
        np.testing.assert_array_equal(sel, dsa.expand_selection(self.geo, pools, t + 1, t), f"selection at {t}")
        qa = to_bf16(rng.normal(0, 0.1, (HEADS, E)).astype(F32))
        out = gpu.poisoned((HEADS, E), np.uint16)
        hpc = lower_mla.heads_per_cta(HEADS)
        self.decode((ORDER_WARPS, HEADS // hpc, 1), (lower_mla.THREADS, 1, 1), gpu.to_gpu(bf16_bits(qa)), d["cache"],
                    d["table"], PAGE, toks, self.geo.selection_width, seq, F32(1), out, d["merge"], d["counters"])
        ref = mla_decode(qa, lambda ids: self.layout.rows(self.codes, self.table, ids), sel, t + 1, 1.0)
        np.testing.assert_array_equal(bf16_from_bits(gpu.fetch(out)).view(np.uint32), ref.view(np.uint32),
                                      f"attention at {t}")


@pytest.mark.parametrize("fp8", [False, True])
def test_positions_from_zero(fp8):
    """Positions 0..149 with top-16 pools: past several pools, pages and the top-k."""
    chain = Chain(np.random.default_rng(), context=160, topk=16, fp8=fp8, history=0)
    for t in range(150):
        chain.step(t)


@pytest.mark.parametrize("fp8", [False, True])
def test_positions_near_128k(fp8):
    """37 positions from 131072 - 37 over a prefilled history: seed-size top-k (512 pools) over
    32768 pools, the newest pools written and read by the kernels."""
    start = 131072 - 37
    chain = Chain(np.random.default_rng(), context=131072, topk=512, fp8=fp8, history=start - start % KP)
    for t in range(start - start % KP, start + 37):
        chain.step(t)
