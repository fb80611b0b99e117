"""GPU tests of the fused MoE router (fusion rule router_gemv_topk: kbp::router_gemv_topk in
kernels/glm_router_topk.cuh, family glm_router_topk) through the product's launchers
(kbpc.testing.launchers, the instance kbpc/codegen/families/glm_router_topk.py builds) against the
numpy reference: the logits against kbpc.reference.dense_bf16 (FP32 output), the weights and ids
against kbpc.reference.glm_router_topk on those logits.

No tolerances: the fused kernel runs the dense_bf16 GEMV's device code in its order and the top-k's
row body on the same FP32 values, so logits, weights and ids are bit-exact (the product builds the
correctly rounded sigmoid). Fresh random inputs every run (the seed is in every failure message),
poisoned outputs. Shapes: the seed's router (4096 x 288, top 8) and its 128-expert shrink, the tiny
example's (256 x 8, top 2), a row longer than the GEMV's first load batch (6144: the L2 prefetch and a
second batch), 1024 experts top 32, odd sizes (33, 700 experts; a 104-wide row), one and three rows.
Inputs: random, exact ties (router rows drawn from a few distinct rows, bias from two values),
-inf bias masks (fewer candidates than slots). Several launches in a row on one arrival counter,
with and without PDL and without synchronizing between them: each must find the counter zeroed by
the last CTA of the one before, and it must be zero at the end. The fused logits also equal the
unfused path's (the dense_bf16 instance the lowering emits today) bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import dense_bf16 as lower_dense
from kbpc.codegen.families import glm_router_topk as lower_router
from kbpc.codegen.records import KernelInstance
from kbpc.reference import dense_bf16 as ref_dense
from kbpc.reference import glm_router_topk as ref_router
from kbpc.reference.formats import bf16_bits, to_bf16

pytestmark = pytest.mark.gpu
F32 = np.float32
SCALE = 2.5
SHAPES = [(4096, 128, 8), (4096, 288, 8), (256, 8, 2), (6144, 256, 8), (1024, 1024, 32), (104, 33, 4),
          (512, 700, 8)]


def _gpu():
    from kbpc.testing import gpu
    return gpu


def _launcher(inst: KernelInstance):
    from kbpc.testing.launchers import launcher
    return launcher(inst)


def _seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**63)


def _inputs(rng, h: int, e: int, m: int, mode: str):
    """(x (m, h) BF16 values, w (e, h) BF16 values, bias (e,)) as float32."""
    x = to_bf16(rng.standard_normal((m, h)).astype(F32))
    if mode == "ties":
        # Few distinct (router row, bias) pairs, each held by at least two experts: whichever pair
        # ranks first, the top k starts with an exact tie (equal rows give equal logits).
        n_rows = 3 if e >= 12 else 2
        rows = to_bf16((rng.standard_normal((n_rows, h)) * 0.05).astype(F32))
        pair = np.concatenate([np.tile(np.arange(2 * n_rows), 2), rng.integers(0, 2 * n_rows, e - 4 * n_rows)])
        pair = rng.permutation(pair)
        w = rows[pair // 2]
        bias = np.array([0.0, 0.25], F32)[pair % 2]
    else:
        w = to_bf16((rng.standard_normal((e, h)) * 0.05).astype(F32))
        bias = (rng.standard_normal(e) * 0.1).astype(F32)
    if mode == "masked":  # -inf bias masks all but a few experts: unfilled trailing slots
        bias[rng.permutation(e)[: max(0, e - 3)]] = -np.inf
    return x, w, bias


class _Fused:
    """One fused instance with its weights on the GPU and one arrival counter for every launch."""

    def __init__(self, h: int, e: int, k: int, w, bias):
        gpu = _gpu()
        self.h, self.e, self.k = h, e, k
        self.inst = lower_router.fused_instance(h, e, k)
        self.opc = lower_router.fused_outputs_per_cta(e)
        self.run = _launcher(self.inst)
        self.w, self.bias = gpu.to_gpu(bf16_bits(w)), gpu.to_gpu(bias)
        self.arrive = gpu.to_gpu(np.zeros(1, np.uint32))
        self.inputs = []   # the rows of every launch, alive until the test ends (launches may not have run)

    def launch(self, x_bits, pdl: bool = False, sync: bool = True):
        """Enqueue one launch over the rows of x; returns its (logits, weights, ids) device arrays."""
        gpu = _gpu()
        m = x_bits.shape[0]
        logits = gpu.poisoned((m, self.e), F32)
        wts, ids = gpu.poisoned((m, self.k), F32), gpu.poisoned((m, self.k), np.int32)
        self.inputs.append(gpu.to_gpu(x_bits))
        self.run((-(-self.e // self.opc), m, 1), (64 * self.opc, 1, 1), self.w, self.inputs[-1], self.bias,
                 SCALE, logits, self.arrive, wts, ids, pdl=pdl, sync=sync)
        return logits, wts, ids

    def counter(self) -> int:
        return int(self.arrive.get()[0])


def _check(got, x, w, bias, k, seed, what=""):
    gpu = _gpu()
    logits, wts, ids = (gpu.fetch(a, n) for a, n in zip(got, ("logits", "weights", "ids")))
    want_z = ref_dense.dense_gemv_bf16(x, w, "f32")
    bad = np.flatnonzero(logits.view(np.uint32) != want_z.view(np.uint32))
    assert bad.size == 0, f"logits{what} (seed {seed}): {bad.size} differ, first at {bad[:6]}"
    want_w, want_ids = ref_router.router_topk(want_z, bias, k, SCALE)
    np.testing.assert_array_equal(ids, want_ids, err_msg=f"ids{what} (seed {seed})")
    bad = np.flatnonzero(wts.view(np.uint32) != want_w.view(np.uint32))
    assert bad.size == 0, f"weights{what} (seed {seed}): {bad.size} differ, first at {bad[:6]}"
    return want_ids


@pytest.mark.parametrize("mode", ["random", "ties", "masked"])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("h,e,k", SHAPES)
def test_router_gemv_topk_exact(h, e, k, m, mode):
    seed = _seed()
    rng = np.random.default_rng(seed)
    x, w, bias = _inputs(rng, h, e, m, mode)
    fused = _Fused(h, e, k, w, bias)
    ids = _check(fused.launch(bf16_bits(x)), x, w, bias, k, seed)
    assert fused.counter() == 0, f"the arrival counter was left at {fused.counter()} (seed {seed})"
    if mode == "masked":
        assert (ids[:, min(3, k):] == -1).all()
    if mode == "ties":   # the case is worth its name: tied choice values inside the top k
        chi = ref_router.router_scores(ref_dense.dense_gemv_bf16(x, w, "f32")) + bias
        top = np.take_along_axis(chi, np.maximum(ids, 0), axis=-1)
        assert (np.diff(top, axis=-1) == 0).any(), f"no tie in the top {k} (seed {seed})"


@pytest.mark.parametrize("pdl", [False, True], ids=["serial", "pdl"])
@pytest.mark.parametrize("h,e,k", [(4096, 128, 8), (256, 8, 2), (1024, 1024, 32)])
def test_launches_in_a_row_reuse_the_counter(h, e, k, pdl):
    """8 launches back to back on one counter without synchronizing (graph replays and the layers of a
    step do the same): every launch's results exact, the counter zero after them."""
    gpu = _gpu()
    seed = _seed()
    rng = np.random.default_rng(seed)
    _, w, bias = _inputs(rng, h, e, 1, "ties")
    fused = _Fused(h, e, k, w, bias)
    xs = [_inputs(rng, h, e, int(rng.integers(1, 3)), "random")[0] for _ in range(8)]
    outs = [fused.launch(bf16_bits(x), pdl=pdl, sync=False) for x in xs]
    gpu.synchronize()
    for i, (x, got) in enumerate(zip(xs, outs)):
        _check(got, x, w, bias, k, seed, f" of launch {i}")
    assert fused.counter() == 0, f"the arrival counter was left at {fused.counter()} (seed {seed})"


@pytest.mark.parametrize("h,e,k", [(4096, 128, 8), (4096, 288, 8), (104, 33, 4)])
def test_fused_equals_the_two_launches(h, e, k):
    """The unfused path as the lowering emits it (dense_bf16's instance for the router, then
    router_topk): the same logits, weights and ids, bit for bit."""
    gpu = _gpu()
    seed = _seed()
    rng = np.random.default_rng(seed)
    x, w, bias = _inputs(rng, h, e, 1, "ties")
    fused = _Fused(h, e, k, w, bias)
    f_logits, f_w, f_ids = (gpu.fetch(a) for a in fused.launch(bf16_bits(x)))
    opc = lower_dense.outputs_per_cta(e)
    kernel = (f"kbp::dense_gemv_bf16<{h}, float>" if opc == 4 else f"kbp::dense_gemv_bf16_opc<{h}, float, {opc}>")
    dense = _launcher(KernelInstance("dense_bf16", "dense_bf16.cuh", kernel,
                                     ("const __nv_bfloat16*", "const __nv_bfloat16*", "float*", "int")))
    topk = _launcher(KernelInstance("glm_router_topk", "glm_router_topk.cuh", f"kbp::router_topk<{e}, {k}>",
                                    ("const float*", "const float*", "float", "float*", "int*")))
    logits = gpu.poisoned((1, e), F32)
    wts, ids = gpu.poisoned((1, k), F32), gpu.poisoned((1, k), np.int32)
    dense((-(-e // opc), 1, 1), (64 * opc, 1, 1), fused.w, gpu.to_gpu(bf16_bits(x)), logits, e)
    topk((1, 1, 1), (lower_router.router_threads(e), 1, 1), logits, fused.bias, SCALE, wts, ids)
    np.testing.assert_array_equal(gpu.fetch(logits).view(np.uint32), f_logits.view(np.uint32), f"logits (seed {seed})")
    np.testing.assert_array_equal(gpu.fetch(ids), f_ids, f"ids (seed {seed})")
    np.testing.assert_array_equal(gpu.fetch(wts).view(np.uint32), f_w.view(np.uint32), f"weights (seed {seed})")
