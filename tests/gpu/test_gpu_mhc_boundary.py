"""GPU tests of kernels/glm_mhc_boundary.cuh (the fused hyper-connection boundary and head + final norm)
against the unfused reference chain (kbpc.reference.glm_mhc.hc_boundary / hc_expand_pre_norm /
hc_pre_norm / hc_head_norm).

Every output must be bit-identical to the reference (the default build: correctly rounded exp/rsqrt;
fusion never changes the math). Fresh random inputs every run (the seed is in every failure message);
outputs and the partial-sum workspace are poisoned (NaN), so an unwritten output or a partial read
before it was written fails. Several launches go back to back without a host synchronisation, each
on its own inputs and outputs but sharing the workspace and the arrival counters as graph replays
do, then many replays of one of them: a counter left non-zero or a tail that reads another launch's
partials shows as wrong bits. Shapes: the seed's boundary (4 streams x 4096) at two CTA shapes, and
small odd-but-legal ones (D not a multiple of 256, N = 2, 3, 5, 2 and 3 ranks, 2 tokens).
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.reference import glm_mhc as ref
from kbpc.reference.formats import bf16_bits, bf16_from_bits
from kbpc.reference.rms_norm import block_threads
from kbpc.testing.compare import assert_bf16_within, assert_f32_exact

F32 = np.float32
PRE_THREADS, COL_GROUPS, LEVEL1 = 288, 8, 128
EPS_N, EPS_HC, EPS = 1e-6, 1e-6, 1e-5
SOURCES = {"streams": 0, "post": 1, "expand": 2}
# (n_hc, d, ranks, chains per CTA, tokens)
SHAPES = [(4, 4096, 1, 4, 2), (4, 4096, 2, 9, 1), (3, 100, 2, 1, 2), (5, 200, 1, 3, 2), (2, 1280, 3, 2, 2)]
REPLAYS = 40


def _gpu():
    from kbpc.testing import gpu  # noqa: PLC0415
    return gpu


def chains(n: int) -> int:
    return (2 + n) * n + 1


def boundary_grid(n: int, rpc: int, m: int) -> tuple[int, int]:
    """kbp::mhc::boundary_ctas(n, rpc) CTAs per token."""
    return COL_GROUPS * -(-chains(n) // rpc), m


def boundary_source(n: int, d: int, r: int, rpc: int, suffix: str = "") -> str:
    """extern "C" wrappers: boundary_<src> for every stream source, gates, head_norm_<post><one_plus>."""
    parts = ", ".join(f"const __nv_bfloat16* p{i}" for i in range(r))
    plist = ", ".join(f"p{i}" for i in range(r))
    out = [f'#include "glm_mhc_boundary.cuh"\nusing namespace kbp::mhc;']
    for name, src in SOURCES.items():
        out.append(f"""extern "C" __global__ void __launch_bounds__({PRE_THREADS}, 1) boundary_{name}{suffix}(
    const float* x, const __nv_bfloat16* h, {parts}, const float* post_in, const float* comb_in, float* x_out,
    const __nv_bfloat16* phi, const float* alpha, const float* beta, const __nv_bfloat16* gamma, float eps_n,
    float eps_hc, float eps, int iters, float* mix, unsigned int* counters, __nv_bfloat16* collapsed,
    __nv_bfloat16* normed, float* post, float* comb, float* work) {{
  const PreParams<{n}, {r}> p{{x, {{{{{plist}}}}}, post_in, comb_in, x_out, phi, alpha, beta, gamma, eps_n, eps_hc,
      eps, iters, mix, counters, collapsed, normed, post, comb, h, work}};
  hc_boundary_body<{n}, {d}, {src}, {r}, {rpc}>(p);
}}""")
    threads = block_threads(d)
    for post in (False, True):
        for one_plus in (False, True):
            out.append(f"""extern "C" __global__ void __launch_bounds__({threads}) head_norm_{int(post)}{int(one_plus)}{suffix}(
    const float* x, {parts}, const float* post_in, const float* comb_in, float* x_out, const __nv_bfloat16* gamma,
    float eps, __nv_bfloat16* head, __nv_bfloat16* normed) {{
  const HeadParams<{n}, {r}> p{{x, {{{{{plist}}}}}, post_in, comb_in, x_out, gamma, eps, head, normed}};
  hc_head_norm_body<{n}, {d}, {threads}, {str(one_plus).lower()}, {str(post).lower()}, {r}>(p);
}}""")
    out.append(f"""extern "C" __global__ void __launch_bounds__(32) gates{suffix}(const float* mix, const float* alpha,
    const float* beta, float eps_hc, int iters, float* post, float* comb) {{
  hc_gates_body<{n}>(mix, alpha, beta, eps_hc, iters, post, comb);
}}""")
    return "\n".join(out) + "\n"


class Inputs:
    """One boundary's random inputs for m tokens (BF16 tensors as bits)."""

    def __init__(self, n, d, r, m, rng):
        rows = (2 + n) * n
        self.x = (rng.standard_normal((m, n, d)) * rng.uniform(0.5, 4)).astype(F32)
        self.h_bits = bf16_bits(rng.standard_normal((m, d)).astype(F32))
        self.parts_bits = bf16_bits(rng.standard_normal((r, m, d)).astype(F32))
        self.post_in = (2.0 / (1.0 + np.exp(-rng.standard_normal((m, n))))).astype(F32)
        self.comb_in = rng.uniform(0.0, 1.0, (m, n, n)).astype(F32)
        self.phi_bits = bf16_bits((rng.standard_normal((rows, n * d)) * 0.02).astype(F32))
        self.alpha = rng.uniform(0.5, 2.0, 3).astype(F32)
        self.beta = (rng.standard_normal(rows) * 0.5).astype(F32)
        self.gamma_bits = bf16_bits((1.0 + 0.1 * rng.standard_normal(d)).astype(F32))

    def expected(self, src: str, iters: int):
        """(streams the kernel writes or None, mu, PreMix) from the reference chain."""
        kw = dict(eps_n=EPS_N, eps_hc=EPS_HC, eps=EPS, iters=iters)
        phi, gamma = bf16_from_bits(self.phi_bits), bf16_from_bits(self.gamma_bits)
        if src == "post":
            streams, pm = ref.hc_boundary(self.x, bf16_from_bits(self.parts_bits), self.post_in, self.comb_in,
                                          phi, self.alpha, self.beta, gamma, **kw)
        elif src == "expand":
            streams, pm = ref.hc_expand_pre_norm(bf16_from_bits(self.h_bits), self.x.shape[1], phi, self.alpha,
                                                 self.beta, gamma, **kw)
        else:
            streams, pm = None, ref.hc_pre_norm(self.x, phi, self.alpha, self.beta, gamma, **kw)
        mu = ref.hc_mix(self.x if streams is None else streams, phi, EPS_N)
        return streams, mu, pm


class Launch:
    """Device buffers of one boundary launch: its inputs and poisoned outputs (shared state apart)."""

    def __init__(self, gpu, inp: Inputs, n, d, m, gates: bool):
        rows = (2 + n) * n
        self.keep = [gpu.to_gpu(a) for a in (inp.x, inp.h_bits, *inp.parts_bits, inp.post_in, inp.comb_in,
                                             inp.phi_bits, inp.alpha, inp.beta, inp.gamma_bits)]
        self.out = {"x_out": gpu.poisoned((m, n, d), F32), "mix": gpu.poisoned((m, rows), F32),
                    "collapsed": gpu.poisoned((m, d), np.uint16), "normed": gpu.poisoned((m, d), np.uint16),
                    "post": gpu.poisoned((m, n), F32), "comb": gpu.poisoned((m, n, n), F32)}
        self.gates = gates

    def args(self, iters: int, counters, work):
        k, o = self.keep, self.out
        x, h, *rest = k
        r = len(rest) - 6
        parts, (post_in, comb_in, phi, alpha, beta, gamma) = rest[:r], rest[r:]
        return [x.gpudata, h.gpudata, *(p.gpudata for p in parts), post_in.gpudata, comb_in.gpudata,
                o["x_out"].gpudata, phi.gpudata, alpha.gpudata, beta.gpudata, gamma.gpudata, F32(EPS_N), F32(EPS_HC),
                F32(EPS), np.int32(iters), o["mix"].gpudata, counters.gpudata, o["collapsed"].gpudata,
                o["normed"].gpudata, o["post"].gpudata, o["comb"].gpudata if self.gates else np.uintp(0),
                work.gpudata]

    def side_gates(self, mod, iters: int, suffix: str):
        """hc_gates from the written mix (the pre-mix ran with comb == nullptr)."""
        alpha, beta = self.keep[-3], self.keep[-2]
        m = self.out["mix"].shape[0]
        mod.get_function(f"gates{suffix}")(self.out["mix"].gpudata, alpha.gpudata, beta.gpudata, F32(EPS_HC),
                                          np.int32(iters), self.out["post"].gpudata, self.out["comb"].gpudata,
                                          block=(32, 1, 1), grid=(m, 1))


def check(gpu, launch: Launch, inp: Inputs, src: str, iters: int, what: str):
    streams, mu, pm = inp.expected(src, iters)
    got = {k: gpu.fetch(v, f"{what} {k}", allow_nan=k == "x_out" and streams is None)
           for k, v in launch.out.items()}
    if streams is not None:
        assert_f32_exact(got["x_out"], streams, f"{what} streams")
    assert_f32_exact(got["mix"], mu, f"{what} mu")
    assert_f32_exact(got["post"], pm.post, f"{what} post")
    assert_f32_exact(got["comb"], pm.comb, f"{what} comb")
    assert_bf16_within(got["collapsed"], pm.collapsed, 0, f"{what} collapsed")
    assert_bf16_within(got["normed"], pm.normed, 0, f"{what} normed")


@pytest.mark.gpu
@pytest.mark.parametrize("src", list(SOURCES))
@pytest.mark.parametrize("n,d,r,rpc,m", SHAPES)
def test_boundary_exact(n, d, r, rpc, m, src):
    gpu = _gpu()
    seed = int(np.random.SeedSequence().entropy % 2**63)
    rng = np.random.default_rng(seed)
    mod = gpu.load_module(boundary_source(n, d, r, rpc), f"mhc_boundary_{n}_{d}_{r}_{rpc}")
    fn = mod.get_function(f"boundary_{src}")
    grid = boundary_grid(n, rpc, m)
    counters = gpu.to_gpu(np.zeros(m, np.uint32))
    work = gpu.poisoned((m, chains(n), LEVEL1), F32)
    iters = (20, 1, 3)
    sets = [Inputs(n, d, r, m, rng) for _ in iters]
    launches = [Launch(gpu, s, n, d, m, gates=True) for s in sets]
    for it, ln in zip(iters, launches):  # back to back: the counters and workspace are reused
        fn(*ln.args(it, counters, work), block=(PRE_THREADS, 1, 1), grid=grid)
    gpu.synchronize()
    for k, (it, ln, s) in enumerate(zip(iters, launches, sets)):
        check(gpu, ln, s, src, it, f"seed {seed}, launch {k} (iters {it})")
    again = Launch(gpu, sets[0], n, d, m, gates=True)
    for _ in range(REPLAYS):
        fn(*again.args(20, counters, work), block=(PRE_THREADS, 1, 1), grid=grid)
    check(gpu, again, sets[0], src, 20, f"seed {seed}, after {REPLAYS} replays")
    side = Launch(gpu, sets[1], n, d, m, gates=False)  # gates + Sinkhorn left to hc_gates
    fn(*side.args(20, counters, work), block=(PRE_THREADS, 1, 1), grid=grid)
    side.side_gates(mod, 20, "")
    check(gpu, side, sets[1], src, 20, f"seed {seed}, gates on the side")
    assert not counters.get().any(), f"seed {seed}: counters not re-armed: {counters.get()}"


@pytest.mark.gpu
@pytest.mark.parametrize("post", [False, True], ids=["head", "post+head"])
@pytest.mark.parametrize("n,d,r,rpc,m", SHAPES)
def test_head_norm_exact(n, d, r, rpc, m, post):
    gpu = _gpu()
    seed = int(np.random.SeedSequence().entropy % 2**63)
    rng = np.random.default_rng(seed)
    mod = gpu.load_module(boundary_source(n, d, r, rpc), f"mhc_boundary_{n}_{d}_{r}_{rpc}")
    inp = Inputs(n, d, r, m, rng)
    streams = ref.hc_post(inp.x, ref.hc_rank_sum(bf16_from_bits(inp.parts_bits)), inp.post_in,
                          inp.comb_in) if post else inp.x
    for one_plus in (False, True):
        keep = [gpu.to_gpu(a) for a in (inp.x, *inp.parts_bits, inp.post_in, inp.comb_in, inp.gamma_bits)]
        x_out = gpu.poisoned((m, n, d), F32)
        head, normed = gpu.poisoned((m, d), np.uint16), gpu.poisoned((m, d), np.uint16)
        mod.get_function(f"head_norm_{int(post)}{int(one_plus)}")(
            *(k.gpudata for k in keep[:-1]), x_out.gpudata, keep[-1].gpudata, F32(EPS), head.gpudata,
            normed.gpudata, block=(block_threads(d), 1, 1), grid=(m, 1))
        want_head, want = ref.hc_head_norm(streams, bf16_from_bits(inp.gamma_bits), EPS,
                                           "one_plus" if one_plus else "plain")
        what = f"seed {seed}, one_plus={one_plus}"
        if post:
            assert_f32_exact(gpu.fetch(x_out, "x_out"), streams, f"{what} streams")
        assert_bf16_within(gpu.fetch(head, "head"), want_head, 0, f"{what} head")
        assert_bf16_within(gpu.fetch(normed, "normed"), want, 0, f"{what} normed")


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm_90", "sm_121"])
def test_boundary_sources_compile(tmp_path, target):
    """Every wrapper the GPU tests load compiles for both targets (no GPU needed)."""
    from kbpc.build.nvcc import compile_cuda  # noqa: PLC0415
    from kbpc.targets import get_target  # noqa: PLC0415

    src = tmp_path / "boundary.cu"
    src.write_text("\n".join(boundary_source(n, d, r, rpc, suffix=f"_{i}")
                             for i, (n, d, r, rpc, _) in enumerate(SHAPES)))
    compile_cuda(src, tmp_path / "boundary.cubin", get_target(target))
