"""GPU tests of the fused router that also quantizes the routed experts' input (fusion rule
router_expert_quant: kbp::router_gemv_topk_quant in kernels/glm_router_topk.cuh) through the
product's launchers (kbpc.testing.launchers, the instances kbpc/codegen/families/glm_router_topk.py
and w4a4_mx_static.py build).

What the rule replaces: router_gemv_topk, then w4a4_quant_rows_static<H> on the same row with the
experts' static scale gamma. Both run here on the same fresh random inputs (the seed is in every
failure message) into poisoned outputs, and the fused kernel's logits, weights, ids, NVFP4 codes,
E4M3 scales and global scales must equal the two kernels' bit for bit (and the numpy reference's:
kbpc.reference.dense_bf16, glm_router_topk, w4a4_mx_static.quantize_rows_static). Shapes: the seed's
128-expert shrink (4096 x 128, top 8) and the seed (288 experts), the tiny example (256 x 8, top 2),
a row past the GEMV's first load batch (6144), the top-k's limits (1024 experts, top 32), odd sizes
(33 and 700 experts, a 208-wide row), and grids with fewer threads per row than NVFP4 groups (1
expert: 64 threads for 256 groups; 3 experts: 192 threads for 512 groups, the last pass partial).
One and three rows, with a zero row and a zero
group (scale 0), and a gamma small enough that some values saturate. Launches in a row on one
arrival counter, with and without PDL, unsynchronized: every launch's bytes still equal.
The cluster form (kbp::router_cluster_topk_quant: one thread-block cluster of min(ceil(E / 8), 16)
CTAs a row, the logits meeting in distributed shared memory; past 128 experts a 64-thread group
takes several) is held to the same bytes at every shape, Hopper's 16-wide clusters included."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import glm_router_topk as lower_router
from kbpc.codegen.records import KernelInstance
from kbpc.reference import dense_bf16 as ref_dense
from kbpc.reference import glm_router_topk as ref_router
from kbpc.reference import w4a4_mx_static as ref_w4a4s
from kbpc.reference.formats import bf16_bits, to_bf16
from kbpc.testing import gpu
from kbpc.testing import instances as ki
from kbpc.testing.launchers import launcher

pytestmark = pytest.mark.gpu
F32 = np.float32
SCALE = 2.5
QUANT_BLOCK = (256, 1, 1)   # w4a4_quant_rows_static's block
# (hidden, experts, top k)
SHAPES = [(4096, 128, 8), (4096, 288, 8), (256, 8, 2), (6144, 256, 8), (1024, 1024, 32), (208, 33, 4),
          (512, 700, 8), (4096, 1, 1), (8192, 3, 2)]
MAX_CLUSTER = 16   # Hopper's non-portable cluster width (kbpc.targets: sm_90a)
# Shapes the cluster form alone adds: a row past the first weight batch (6144: the L2 prefetch) with
# an 8-CTA cluster, and 121 experts (16 CTAs of 8 logits, the last short).
CLUSTER_SHAPES = [(6144, 64, 8), (1024, 121, 32)]


def _cluster(e: int) -> int:
    """The cluster width the lowering picks where the form is on (router_cluster)."""
    return min(-(-e // lower_router.CLUSTER_LOGITS), MAX_CLUSTER)


def instances() -> list[KernelInstance]:
    """Every kernel instance this module launches (tests/nvcc/test_gpu_test_instances.py builds them)."""
    out = []
    for h, e, k in SHAPES:
        out += [lower_router.fused_quant_instance(h, e, k), lower_router.fused_instance(h, e, k),
                ki.w4a4_quant_rows_static(h)]
    out += [lower_router.cluster_quant_instance(h, e, k, _cluster(e)) for h, e, k in SHAPES + CLUSTER_SHAPES]
    return out


def _fresh_seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**63)


def _rows(rng, h: int, m: int) -> np.ndarray:
    """m BF16 rows (as float32): random, the second all zero, a zero group in the third."""
    x = to_bf16((rng.standard_normal((m, h)) * rng.uniform(0.1, 4.0)).astype(F32))
    if m > 1:
        x[1] = 0.0
    if m > 2:
        x[2, 16:32] = 0.0
    return x


class _Router:
    """The router's weights on the GPU, the fused-with-quant launch and the two-launch chain it
    replaces, each with its own arrival counter."""

    def __init__(self, h: int, e: int, k: int, w, bias):
        self.h, self.e, self.k = h, e, k
        self.opc = lower_router.fused_outputs_per_cta(e)
        self.fused = launcher(lower_router.fused_quant_instance(h, e, k))
        self.route = launcher(lower_router.fused_instance(h, e, k))
        self.quant = launcher(ki.w4a4_quant_rows_static(h))
        self.w, self.bias = gpu.to_gpu(bf16_bits(w)), gpu.to_gpu(bias)
        self.cl = _cluster(e)
        self.cluster = launcher(lower_router.cluster_quant_instance(h, e, k, self.cl))
        self.arrive = {f: gpu.to_gpu(np.zeros(1, np.uint32)) for f in ("fused", "apart", "cluster")}
        self.keep = []   # inputs alive until the test ends (unsynchronized launches may not have run)

    def _outputs(self, m: int):
        return (gpu.poisoned((m, self.e), F32), gpu.poisoned((m, self.k), F32), gpu.poisoned((m, self.k), np.int32),
                gpu.poisoned((m, self.h // 2), np.uint8), gpu.poisoned((m, self.h // 16), np.uint8),
                gpu.poisoned((m,), F32))

    def launch(self, x, gamma, form: str, pdl: bool = False, sync: bool = True):
        """Enqueue one form over the rows of x; returns its (logits, weights, ids, codes, scales, g)."""
        m = x.shape[0]
        xd = gpu.to_gpu(bf16_bits(x))
        self.keep.append(xd)
        out = self._outputs(m)
        logits, wts, ids, codes, scales, g = out
        grid, block = (-(-self.e // self.opc), m, 1), (64 * self.opc, 1, 1)
        route = (self.w, xd, self.bias, SCALE, logits, self.arrive[form], wts, ids)
        if form == "fused":
            self.fused(grid, block, *route, np.float32(gamma), codes, scales, g, pdl=pdl, sync=sync)
        elif form == "cluster":
            block = (lower_router.cluster_threads(self.e, self.cl), 1, 1)
            self.cluster((self.cl, m, 1), block, *route, np.float32(gamma), codes, scales, g, pdl=pdl, sync=sync)
        else:
            self.route(grid, block, *route, pdl=pdl, sync=sync)
            self.quant((m, 1, 1), QUANT_BLOCK, xd, np.float32(gamma), codes, scales, g, pdl=pdl, sync=sync)
        return out

    def counters(self) -> dict[str, int]:
        return {f: int(a.get()[0]) for f, a in self.arrive.items()}


NAMES = ("logits", "weights", "ids", "codes", "scales", "g")


def _fetch(out, what: str):
    # E2M1 code bytes may legitimately be 0xFF (two -6 codes), the poison byte: their exact
    # comparison covers them.
    return [gpu.fetch(a, f"{what} {n}", allow_nan=n == "codes") for a, n in zip(out, NAMES)]


def _assert_same(fused, apart, seed: int, what: str = ""):
    for f, a, n in zip(fused, apart, NAMES):
        bad = np.flatnonzero(f.view(np.uint8) != a.view(np.uint8))
        assert bad.size == 0, f"{n}{what} (seed {seed}): {bad.size} bytes differ from the two launches, first {bad[:6]}"


def _assert_reference(got, x, w, bias, gamma, k: int, seed: int):
    logits, wts, ids, codes, scales, g = got
    want_z = ref_dense.dense_gemv_bf16(x, w, "f32")
    want_w, want_ids = ref_router.router_topk(want_z, bias, k, SCALE)
    want_c, want_s, want_g = ref_w4a4s.quantize_rows_static(x, F32(gamma))
    for got_a, want, n in ((logits, want_z, "logits"), (wts, want_w, "weights"), (ids, want_ids, "ids"),
                           (codes, want_c, "codes"), (scales, want_s, "scales"), (g, want_g, "g")):
        assert np.array_equal(got_a.view(np.uint8), np.ascontiguousarray(want, got_a.dtype).view(np.uint8)), \
            f"{n} differ from the reference (seed {seed})"


def _case(rng, h: int, e: int, m: int):
    x = _rows(rng, h, m)
    w = to_bf16((rng.standard_normal((e, h)) * 0.05).astype(F32))
    bias = (rng.standard_normal(e) * 0.1).astype(F32)
    return x, w, bias


@pytest.mark.parametrize("saturate", [False, True], ids=["gamma", "saturating"])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("h,e,k", SHAPES)
def test_fused_quant_equals_router_then_quant(h, e, k, m, saturate):
    seed = _fresh_seed()
    rng = np.random.default_rng(seed)
    x, w, bias = _case(rng, h, e, m)
    amax = float(np.abs(x).max()) or 1.0
    gamma = F32(amax / 2688 * (0.5 if saturate else 1.0))   # 2688 = 6 * 448: the largest value fits
    router = _Router(h, e, k, w, bias)
    fused = _fetch(router.launch(x, gamma, "fused"), "fused")
    apart = _fetch(router.launch(x, gamma, "apart"), "two launches")
    _assert_same(fused, apart, seed)
    _assert_reference(fused, x, w, bias, gamma, k, seed)
    _assert_same(_fetch(router.launch(x, gamma, "cluster"), "cluster"), apart, seed, " (cluster form)")
    assert router.counters() == {"fused": 0, "apart": 0, "cluster": 0}, \
        f"arrival counters left at {router.counters()} (seed {seed})"


@pytest.mark.parametrize("h,e,k", CLUSTER_SHAPES)
def test_cluster_form_alone(h, e, k):
    """The cluster-only shapes against the two-launch chain and the reference."""
    seed = _fresh_seed()
    rng = np.random.default_rng(seed)
    x, w, bias = _case(rng, h, e, 3)
    gamma = F32(float(np.abs(x).max() or 1.0) / 2688)
    router = _Router(h, e, k, w, bias)
    got = _fetch(router.launch(x, gamma, "cluster"), "cluster")
    _assert_same(got, _fetch(router.launch(x, gamma, "apart"), "two launches"), seed, " (cluster form)")
    _assert_reference(got, x, w, bias, gamma, k, seed)


@pytest.mark.parametrize("pdl", [False, True], ids=["serial", "pdl"])
@pytest.mark.parametrize("h,e,k", [(4096, 128, 8), (208, 33, 4), (4096, 1, 1), (4096, 288, 8)])
def test_launches_in_a_row(h, e, k, pdl):
    """6 launches of each form back to back without synchronizing (a replayed step does the same):
    every fused launch's bytes equal its two-launch twin's, the counters end at zero."""
    seed = _fresh_seed()
    rng = np.random.default_rng(seed)
    _, w, bias = _case(rng, h, e, 1)
    router = _Router(h, e, k, w, bias)
    cases = []
    for _ in range(6):
        x = _rows(rng, h, int(rng.integers(1, 4)))
        gamma = F32(float(np.abs(x).max() or 1.0) / 2688)
        cases.append([router.launch(x, gamma, f, pdl=pdl, sync=False) for f in ("fused", "apart", "cluster")])
    gpu.synchronize()
    for i, (fused, apart, *cluster) in enumerate(cases):
        want = _fetch(apart, f"two launches {i}")
        _assert_same(_fetch(fused, f"fused {i}"), want, seed, f" of launch {i}")
        for c in cluster:
            _assert_same(_fetch(c, f"cluster {i}"), want, seed, f" of cluster launch {i}")
    assert router.counters() == {"fused": 0, "apart": 0, "cluster": 0}, \
        f"arrival counters left at {router.counters()} (seed {seed})"
