"""GPU tests of kernels/glm_mhc_boundary.cuh (the fused hyper-connection boundary, with or without the
MoE combine in front, and the head + final norm) against the unfused reference chain
(kbpc.reference.glm_moe_combine.moe_combine, then kbpc.reference.glm_mhc.hc_boundary /
hc_expand_pre_norm / hc_pre_norm / hc_head_norm), through the product's launchers with the
lowering's own instances.

Every output must be bit-identical to the reference (the default build: correctly rounded exp/rsqrt;
fusion never changes the math). Fresh random inputs every run (the seed is in every failure message);
outputs are poisoned (NaN), so an unwritten output fails. The hand-off slots and counters start at
zero, as the runtime leaves state after a reset, and must be zero again after every batch of
launches. Three launches go back to back with PDL and no host synchronisation, each on its own
inputs and outputs but sharing the slots and the counters as graph replays do, then 40 more replays
of one of them: a slot or counter left non-zero, or a tail that took another launch's partials,
shows as wrong bits (or a trap). The cluster form (one cluster of 8 or 16 CTAs a token) runs the
same checks on shapes with D % 256 == 0. Shapes: the seed's boundary (4 streams x 4096) at the lowering's CTA
shape, with the seed's combine (top 8) in front, and with seven chains a CTA; the tiny example's
(4 x 256); odd-but-legal ones (D not a multiple of 256, N = 2, 3, 5, 2 and 3 ranks, 2 tokens,
combines of 4 and 6 slots). The last-CTA form the kernel replaced (glm_mhc_boundary_lastcta.cuh,
kept for the benchmark) is held to the same bits at the seed's shape.
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import glm_mhc as lower
from kbpc.codegen.records import KernelInstance
from kbpc.reference import glm_mhc as ref
from kbpc.reference.formats import bf16_bits, bf16_from_bits
from kbpc.reference.glm_moe_combine import moe_combine
from kbpc.reference.rms_norm import block_threads
from kbpc.testing.compare import assert_bf16_within, assert_f32_exact
from kbpc.testing.structs import pack_struct

F32 = np.float32
EPS_N, EPS_HC, EPS = 1e-6, 1e-6, 1e-5
SOURCES = {"streams": 0, "post": 1, "expand": 2}
# (n_hc, d, ranks, chains per CTA, tokens, stream sources, combine slots K (0: rank partials))
BOUNDARY = [(4, 4096, 1, lower.CHAINS_PER_CTA, 1, ("post", "expand", "streams"), 0),
            (4, 4096, 1, lower.CHAINS_PER_CTA, 1, ("post",), 8),
            (4, 4096, 2, 7, 2, ("post",), 0),
            (4, 256, 1, lower.CHAINS_PER_CTA, 1, ("post", "expand"), 0),
            (3, 100, 2, 1, 2, ("post", "expand", "streams"), 0),
            (3, 100, 1, 2, 2, ("post",), 4),
            (5, 200, 1, 3, 2, ("post", "expand"), 0),
            (2, 1280, 3, 2, 2, ("post", "streams"), 0),
            (2, 1280, 1, 5, 2, ("post",), 6)]
# The cluster form (kernels/glm_mhc_boundary_cluster.cuh; D % 256 == 0): (n_hc, d, ranks, cluster
# width, tokens, stream sources, combine slots K)
CLUSTERED = [(4, 4096, 1, lower.CLUSTER_WIDTH, 1, ("post", "expand", "streams"), 0),
             (4, 4096, 1, lower.CLUSTER_WIDTH, 1, ("post",), 8),
             (4, 4096, 2, 16, 2, ("post",), 0),
             (4, 4096, 1, 8, 2, ("post", "expand"), 8),
             (4, 256, 1, 16, 1, ("post", "expand"), 0),
             (3, 512, 1, 16, 2, ("post", "streams"), 4),
             (5, 256, 2, 16, 2, ("post", "expand"), 0),
             (2, 1280, 3, 16, 2, ("post", "streams"), 0),
             (2, 1280, 1, 8, 2, ("post",), 6)]
# (n_hc, d, ranks, tokens, one_plus, post, combine slots K)
HEAD = [(4, 4096, 1, 1, True, True, 0), (4, 4096, 1, 2, True, False, 0), (3, 100, 2, 2, False, True, 0),
        (5, 200, 1, 2, False, False, 0), (2, 1280, 3, 2, True, True, 0), (4, 4096, 1, 1, True, True, 8),
        (3, 100, 1, 2, False, True, 4)]
REPLAYS = 40


def _gpu():
    from kbpc.testing import gpu  # noqa: PLC0415
    return gpu


def _launcher(inst: KernelInstance):
    from kbpc.testing.launchers import launcher  # noqa: PLC0415
    return launcher(inst)


def _seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**63)


def _slots(n: int) -> int:
    """Hand-off slot rows per token: kbp::mhc::boundary_slots(N)."""
    return (2 + n) * n + 2


class Inputs:
    """One boundary's random inputs for m tokens (BF16 tensors as bits); with k > 0 the sublayer
    output is the MoE combine of k routed slots and the shared expert (one rank)."""

    def __init__(self, n, d, r, m, rng, k=0):
        rows = (2 + n) * n
        self.k = k
        self.x = (rng.standard_normal((m, n, d)) * rng.uniform(0.5, 4)).astype(F32)
        self.h_bits = bf16_bits(rng.standard_normal((m, d)).astype(F32))
        self.parts_bits = bf16_bits(rng.standard_normal((r, m, d)).astype(F32))
        if k:
            self.weights = (rng.uniform(0.0, 1.0, (m, k)) * 2.5 / k).astype(F32)
            self.experts_bits = bf16_bits(rng.standard_normal((m * k, d)).astype(F32))
            self.shared_bits = bf16_bits(rng.standard_normal((m, d)).astype(F32))
        self.post_in = (2.0 / (1.0 + np.exp(-rng.standard_normal((m, n))))).astype(F32)
        self.comb_in = rng.uniform(0.0, 1.0, (m, n, n)).astype(F32)
        self.phi_bits = bf16_bits((rng.standard_normal((rows, n * d)) * 0.02).astype(F32))
        self.alpha = rng.uniform(0.5, 2.0, 3).astype(F32)
        self.beta = (rng.standard_normal(rows) * 0.5).astype(F32)
        self.gamma_bits = bf16_bits((1.0 + 0.1 * rng.standard_normal(d)).astype(F32))

    def partials(self):
        """The post-mix's BF16 partials: the ranks' outputs, or the one combined row."""
        if not self.k:
            return bf16_from_bits(self.parts_bits)
        m, d = self.shared_bits.shape
        e = bf16_from_bits(self.experts_bits).reshape(m, self.k, d)
        return moe_combine(self.weights, e, bf16_from_bits(self.shared_bits))[None]

    def post_streams(self):
        return ref.hc_post(self.x, ref.hc_rank_sum(self.partials()), self.post_in, self.comb_in)

    def expected(self, src: str, iters: int):
        """(streams the kernel writes or None, mu, PreMix) from the reference chain."""
        kw = dict(eps_n=EPS_N, eps_hc=EPS_HC, eps=EPS, iters=iters)
        phi, gamma = bf16_from_bits(self.phi_bits), bf16_from_bits(self.gamma_bits)
        if src == "post":
            streams, pm = ref.hc_boundary(self.x, self.partials(), self.post_in, self.comb_in, phi, self.alpha,
                                          self.beta, gamma, **kw)
        elif src == "expand":
            streams, pm = ref.hc_expand_pre_norm(bf16_from_bits(self.h_bits), self.x.shape[1], phi, self.alpha,
                                                 self.beta, gamma, **kw)
        else:
            streams, pm = None, ref.hc_pre_norm(self.x, phi, self.alpha, self.beta, gamma, **kw)
        mu = ref.hc_mix(self.x if streams is None else streams, phi, EPS_N)
        return streams, mu, pm


def _branch_fields(gpu_inp) -> list[tuple[str, object]]:
    """The params' `parts`: RankParts<R> (one pointer a rank) or MoeCombineIn<K> (weights, ids,
    slot_rows, expert rows, shared row)."""
    if gpu_inp.combine is None:
        return [("ptr", p) for p in gpu_inp.parts]
    w, e, sh = gpu_inp.combine
    return [("ptr", w), ("ptr", None), ("ptr", None), ("ptr", e), ("ptr", sh)]


class Boundary:
    """Device buffers of one boundary launch: its inputs and poisoned outputs (state is shared)."""

    def __init__(self, gpu, inp: Inputs, n, d, m):
        rows = (2 + n) * n
        up = gpu.to_gpu
        self.x, self.h = up(inp.x), up(inp.h_bits)
        self.parts = [up(p) for p in inp.parts_bits]
        self.combine = (up(inp.weights), up(inp.experts_bits), up(inp.shared_bits)) if inp.k else None
        self.post_in, self.comb_in = up(inp.post_in), up(inp.comb_in)
        self.phi, self.alpha, self.beta, self.gamma = (up(a) for a in (inp.phi_bits, inp.alpha, inp.beta,
                                                                       inp.gamma_bits))
        self.out = {"x_out": gpu.poisoned((m, n, d), F32), "mix": gpu.poisoned((m, rows), F32),
                    "collapsed": gpu.poisoned((m, d), np.uint16), "normed": gpu.poisoned((m, d), np.uint16),
                    "post": gpu.poisoned((m, n), F32), "comb": gpu.poisoned((m, n, n), F32)}

    def params(self, iters: int, counters, work, gates: bool = True, src: str = "post") -> bytes:
        """PreParams<N, R, K> in field order (kernels/glm_mhc.cuh)."""
        o = self.out
        return pack_struct([("ptr", self.x), *_branch_fields(self), ("ptr", self.post_in),
                            ("ptr", self.comb_in), ("ptr", o["x_out"] if src != "streams" else None),
                            ("ptr", self.phi), ("ptr", self.alpha), ("ptr", self.beta), ("ptr", self.gamma),
                            ("f32", EPS_N), ("f32", EPS_HC), ("f32", EPS), ("i32", iters), ("ptr", o["mix"]),
                            ("ptr", counters), ("ptr", o["collapsed"]), ("ptr", o["normed"]), ("ptr", o["post"]),
                            ("ptr", o["comb"] if gates else None), ("ptr", self.h), ("ptr", work)])

    def check(self, gpu, inp: Inputs, src: str, iters: int, what: str):
        streams, mu, pm = inp.expected(src, iters)
        got = {k: gpu.fetch(v, f"{what} {k}", allow_nan=k == "x_out" and streams is None)
               for k, v in self.out.items()}
        if streams is not None:
            assert_f32_exact(got["x_out"], streams, f"{what} streams")
        assert_f32_exact(got["mix"], mu, f"{what} mu")
        assert_f32_exact(got["post"], pm.post, f"{what} post")
        assert_f32_exact(got["comb"], pm.comb, f"{what} comb")
        assert_bf16_within(got["collapsed"], pm.collapsed, 0, f"{what} collapsed")
        assert_bf16_within(got["normed"], pm.normed, 0, f"{what} normed")


def _side_gates(b: Boundary, n: int, m: int, iters: int):
    """hc_gates (glm_mhc.cuh) from the mix the boundary wrote with comb == nullptr."""
    inst = KernelInstance("glm_mhc", "glm_mhc.cuh", f"kbp::mhc::hc_gates<{n}>",
                          ("const float*", "const float*", "const float*", "float", "int", "float*", "float*"))
    _launcher(inst)((m, 1, 1), (32, 1, 1), b.out["mix"], b.alpha, b.beta, EPS_HC, iters, b.out["post"],
                    b.out["comb"])


def _state(gpu, n: int, m: int):
    """The boundary's state as the runtime leaves it after a reset: counters and slots at zero."""
    return gpu.to_gpu(np.zeros(m, np.uint32)), gpu.to_gpu(np.zeros((m, _slots(n), 128), np.uint32))


def _assert_rearmed(counters, work, what: str):
    assert not counters.get().any(), f"{what}: counters not re-armed: {counters.get()}"
    left = np.flatnonzero(work.get())
    assert left.size == 0, f"{what}: {left.size} hand-off slots not re-armed, first at {left[:8]}"


@pytest.mark.gpu
@pytest.mark.parametrize("n,d,r,rpc,m,srcs,k", BOUNDARY,
                         ids=[f"{c[0]}x{c[1]}r{c[2]}c{c[3]}k{c[6]}" for c in BOUNDARY])
def test_boundary_exact(n, d, r, rpc, m, srcs, k):
    _exercise(n, d, r, m, srcs, k, rpc=rpc)


@pytest.mark.gpu
@pytest.mark.parametrize("n,d,r,cl,m,srcs,k", CLUSTERED,
                         ids=[f"{c[0]}x{c[1]}r{c[2]}cl{c[3]}k{c[6]}" for c in CLUSTERED])
def test_cluster_boundary_exact(n, d, r, cl, m, srcs, k):
    _exercise(n, d, r, m, srcs, k, cluster=cl)


def _exercise(n, d, r, m, srcs, k, rpc=lower.CHAINS_PER_CTA, cluster=0):
    """Three launches back to back on shared state, 40 replays, then the gates on the side; every
    output bit-exact and the state re-armed."""
    gpu = _gpu()
    for src in srcs:
        seed = _seed()
        rng = np.random.default_rng(seed)
        run = _launcher(lower.boundary_instance(n, d, SOURCES[src], r, rpc, slots=k, cluster=cluster))
        grid, block = lower.boundary_grid(n, m, rpc, cluster), lower.boundary_block(n, cluster)
        counters, work = _state(gpu, n, m)
        iters = (20, 1, 3)
        sets = [Inputs(n, d, r, m, rng, k) for _ in iters]
        bufs = [Boundary(gpu, s, n, d, m) for s in sets]
        for it, b in zip(iters, bufs):  # back to back: the counters and slots are reused
            run(grid, block, b.params(it, counters, work, src=src), pdl=True, sync=False)
        gpu.synchronize()
        what = f"{src} seed {seed}"
        for j, (it, b, s) in enumerate(zip(iters, bufs, sets)):
            b.check(gpu, s, src, it, f"{what}, launch {j} (iters {it})")
        _assert_rearmed(counters, work, what)
        again = Boundary(gpu, sets[0], n, d, m)
        for i in range(REPLAYS):
            run(grid, block, again.params(20, counters, work, src=src), pdl=bool(i % 2), sync=False)
        gpu.synchronize()
        again.check(gpu, sets[0], src, 20, f"{what}, after {REPLAYS} replays")
        side = Boundary(gpu, sets[1], n, d, m)  # gates + Sinkhorn left to hc_gates
        run(grid, block, side.params(20, counters, work, gates=False, src=src))
        _side_gates(side, n, m, 20)
        gpu.synchronize()
        side.check(gpu, sets[1], src, 20, f"{what}, gates on the side")
        _assert_rearmed(counters, work, what)


@pytest.mark.gpu
def test_lastcta_boundary_exact():
    """The last-CTA form (benchmark baseline) still computes the same bits at the seed's shape."""
    gpu = _gpu()
    n, d, m, rpc = 4, 4096, 1, lower.CHAINS_PER_CTA
    seed = _seed()
    inp = Inputs(n, d, 1, m, np.random.default_rng(seed))
    inst = KernelInstance("glm_mhc", "glm_mhc_boundary_lastcta.cuh",
                          f"kbp::mhc::hc_boundary_lastcta<{n}, {d}, 1, 1, {rpc}>", (f"kbp::mhc::PreParams<{n}, 1, 0>",))
    counters, work = gpu.to_gpu(np.zeros(m, np.uint32)), gpu.poisoned((m, (2 + n) * n + 1, 128), F32)
    b = Boundary(gpu, inp, n, d, m)
    for _ in range(3):
        _launcher(inst)((8 * -(-((2 + n) * n + 1) // rpc), m, 1), (lower.PRE_THREADS, 1, 1),
                        b.params(20, counters, work), pdl=True, sync=False)
    gpu.synchronize()
    b.check(gpu, inp, "post", 20, f"last-CTA form, seed {seed}")
    assert not counters.get().any()


@pytest.mark.gpu
@pytest.mark.parametrize("n,d,r,m,one_plus,post,k", HEAD)
def test_head_norm_exact(n, d, r, m, one_plus, post, k):
    gpu = _gpu()
    seed = _seed()
    inp = Inputs(n, d, r, m, np.random.default_rng(seed), k)
    streams = inp.post_streams() if post else inp.x
    run = _launcher(lower.head_norm_instance(n, d, one_plus, post, r, slots=k))
    dev = Boundary(gpu, inp, n, d, m)
    want_head, want = ref.hc_head_norm(streams, bf16_from_bits(inp.gamma_bits), EPS,
                                       "one_plus" if one_plus else "plain")
    for keep in (True, False):  # with and without the streams and the mean written out
        x_out = gpu.poisoned((m, n, d), F32) if post and keep else None
        head = gpu.poisoned((m, d), np.uint16) if keep else None
        normed = gpu.poisoned((m, d), np.uint16)
        params = pack_struct([("ptr", dev.x), *_branch_fields(dev), ("ptr", dev.post_in), ("ptr", dev.comb_in),
                              ("ptr", x_out), ("ptr", dev.gamma), ("f32", EPS), ("ptr", head), ("ptr", normed)])
        run((m, 1, 1), (block_threads(d), 1, 1), params, pdl=True)
        what = f"seed {seed}, keep={keep}"
        if x_out is not None:
            assert_f32_exact(gpu.fetch(x_out, "x_out"), streams, f"{what} streams")
        if head is not None:
            assert_bf16_within(gpu.fetch(head, "head"), want_head, 0, f"{what} head")
        assert_bf16_within(gpu.fetch(normed, "normed"), want, 0, f"{what} normed")


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm_90", "sm_121"])
def test_boundary_instances_compile(tmp_path, target):
    """Every instance the GPU tests launch compiles for both targets (no GPU needed)."""
    from kbpc.toolchain.nvcc import compile_cuda  # noqa: PLC0415
    from kbpc.targets import get_target  # noqa: PLC0415

    kernels = [lower.boundary_instance(n, d, SOURCES[s], r, rpc, slots=k) for n, d, r, rpc, _, srcs, k in BOUNDARY
               for s in srcs]
    kernels += [lower.boundary_instance(n, d, SOURCES[s], r, slots=k, cluster=cl)
                for n, d, r, cl, _, srcs, k in CLUSTERED for s in srcs]
    kernels += [lower.head_norm_instance(n, d, one_plus, post, r, slots=k) for n, d, r, _, one_plus, post, k in HEAD]
    src = tmp_path / "boundary.cu"
    src.write_text('#include "glm_mhc_boundary_cluster.cuh"\n#include "glm_mhc_boundary_lastcta.cuh"\n' + "".join(
        f"template __global__ void {k.kernel}({k.params[0]});\n" for k in kernels)
        + "template __global__ void kbp::mhc::hc_boundary_lastcta<4, 4096, 1, 1, 4>(kbp::mhc::PreParams<4, 1, 0>);\n")
    compile_cuda(src, tmp_path / "boundary.cubin", get_target(target))
