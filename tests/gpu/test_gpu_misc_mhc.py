"""GPU tests of kernels/glm_mhc.cuh (hyper-connections) against kbpc.reference.glm_mhc, through the
product's launchers: expand, post-mix and head with the lowerings' instances and row geometry, and
the header's standalone pre-mix (hc_pre_norm, PreParams by value) and gates (hc_gates), which the
product replaced by the boundary kernel (tests/gpu/test_gpu_mhc_boundary.py).

Fresh random inputs every run (the seed is in every failure message); outputs are poisoned and
checked fully written. Shapes: the seed's (n_hc=4, hidden=4096) and small odd-but-legal ones
(n_hc=3, d=100: the uncached pre-mix path; n_hc=2, d=512; two tokens).

Tolerances:
- expand, post-mix (standalone and fused into the pre-mix), head: exact bits (correctly rounded
  FP32 ops in the reference's order, no transcendental).
- pre-mix as shipped (the default build: exp and rsqrt evaluated in double and rounded
  once, as the reference does): exact bits for mu, post, comb, the collapsed and the normed row.
  This is the check of every summation order and rounding point.
- pre-mix with -DKBP_FAST_MATH (expf, rsqrtf: within 2 ulp of the correctly rounded values): mu within 1e-6
  relative (rsqrtf's 2 ulp in r, one rounding of dot * r); post and comb within 2e-5 relative
  (expf's 2 ulp enter the gates and the softmax; 20 Sinkhorn passes of true divisions keep them at
  a few ulp, a 100x margin); collapsed row within 1 BF16 ulp (a few-ulp FP32 difference in the pre
  gates can flip one rounding), normed row within 2 BF16 ulp (such a flip plus rsqrtf's own), and
  at least 99% of both rows bit-identical.
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import glm_mhc as lower_mhc
from kbpc.codegen.families._rows import row_grid
from kbpc.reference import glm_mhc as ref
from kbpc.reference.formats import bf16_bits, bf16_from_bits
from kbpc.testing import instances as ki
from kbpc.testing.launchers import launcher
from kbpc.testing.structs import pack_struct

F32 = np.float32
EXACT_FLAGS = ()                      # the default build: correctly rounded exp/rsqrt
FAST_FLAGS = ("-DKBP_FAST_MATH",)      # CUDA expf / rsqrtf (within 2 ulp)
PRE_THREADS = lower_mhc.PRE_THREADS   # kbp::mhc::kPreThreads
GATE_THREADS = 32                     # hc_gates: one warp a token
EPS_N, EPS_HC, EPS = 1e-6, 1e-6, 1e-5

# (n_hc, d, ranks, vec): the seed's boundary, then small odd-but-legal shapes.
SHAPES = [(4, 4096, 3, 4), (3, 100, 2, 2), (2, 512, 1, 4)]


def _gpu():
    from kbpc.testing import gpu  # noqa: PLC0415
    return gpu


def instances():
    """Every kernel instance this module launches (tests/nvcc/test_gpu_test_instances.py builds them)."""
    out = []
    for n, d, r, vec in SHAPES:
        out += [ki.hc_pre_norm(n, d, False, 1), ki.hc_pre_norm(n, d, True, r), ki.hc_gates(n),
                ki.hc_post(n, d, r, vec), ki.hc_head(n, d, vec), ki.hc_expand(n, d, vec)]
    return out


def bf16_ulp_distance(a_bits: np.ndarray, b_bits: np.ndarray) -> np.ndarray:
    """Steps between BF16 bit patterns along the number line (+0 and -0 are 0 apart)."""
    def ordered(bits):
        b = np.asarray(bits, np.uint16).astype(np.int32)
        return np.where(b & 0x8000, -(b & 0x7FFF), b)
    return np.abs(ordered(a_bits) - ordered(b_bits))


def assert_bits_equal(got, want, what, seed):
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype == np.uint16:
        want = bf16_bits(want)
    else:
        got, want = got.view(np.uint32), np.asarray(want, F32).view(np.uint32)
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    assert bad.size == 0, f"{what} (seed {seed}): {bad.size} of {got.size} differ, first at {bad[:6]}"


def assert_bf16_near(got_bits, want, what, seed, max_ulp):
    dist = bf16_ulp_distance(got_bits.reshape(-1), bf16_bits(want).reshape(-1))
    assert dist.max() <= max_ulp, f"{what} (seed {seed}): {dist.max()} BF16 ulp apart"
    assert np.mean(dist == 0) >= 0.99, f"{what} (seed {seed}): only {np.mean(dist == 0):.4f} identical"


class Case:
    """Random inputs of one pre/post-mix boundary for m tokens."""

    def __init__(self, n, d, r, m, seed):
        rng = np.random.default_rng(seed)
        rows = (2 + n) * n
        self.n, self.d, self.r, self.m = n, d, r, m
        self.x = rng.standard_normal((m, n, d)).astype(F32)
        self.phi_bits = bf16_bits(rng.standard_normal((rows, n * d)).astype(F32) * F32(0.01))
        self.alpha = rng.uniform(0.5, 2.0, 3).astype(F32)
        self.beta = (rng.standard_normal(rows) * 0.5).astype(F32)
        self.gamma_bits = bf16_bits((1.0 + 0.1 * rng.standard_normal(d)).astype(F32))
        self.parts_bits = bf16_bits(rng.standard_normal((r, m, d)).astype(F32))
        self.post_in = (2.0 / (1.0 + np.exp(-rng.standard_normal((m, n))))).astype(F32)
        self.comb_in = rng.uniform(0.0, 1.0, (m, n, n)).astype(F32)

    def streams_after_post(self):
        u = ref.hc_rank_sum(bf16_from_bits(self.parts_bits))
        return ref.hc_post(self.x, u, self.post_in, self.comb_in)


def _launch_pre(case, iters, fused, exact, with_collapsed=True, side_gates=False):
    """hc_pre_norm (PreParams by value; FUSE_POST: the post-mix of the rank parts first), then
    hc_gates where the pre-mix was told to leave the gates alone (comb = nullptr)."""
    gpu = _gpu()
    n, d, m = case.n, case.d, case.m
    rows = (2 + n) * n
    flags = EXACT_FLAGS if exact else FAST_FLAGS
    x = gpu.to_gpu(case.x)
    outs = {"mix": gpu.poisoned((m, rows), F32), "normed": gpu.poisoned((m, d), np.uint16),
            "post": gpu.poisoned((m, n), F32), "comb": gpu.poisoned((m, n, n), F32)}
    outs["collapsed"] = gpu.poisoned((m, d), np.uint16) if with_collapsed else None
    counters = gpu.to_gpu(np.zeros(m, np.uint32))
    phi, alpha, beta, gamma = (gpu.to_gpu(a) for a in (case.phi_bits, case.alpha, case.beta, case.gamma_bits))
    if fused:
        parts = [gpu.to_gpu(p) for p in case.parts_bits]
        pin, cin = gpu.to_gpu(case.post_in), gpu.to_gpu(case.comb_in)
        outs["x_out"] = gpu.poisoned((m, n, d), F32)
        head = [x, *parts, pin, cin, outs["x_out"]]
    else:
        head = [x, None, None, None, None]   # RankParts<1>{nullptr}, no post-mix inputs or output
    # Field order of PreParams: x, parts, post_in, comb_in, x_out, phi, alpha, beta, gamma, eps_n,
    # eps_hc, eps, iters, mix, counters, collapsed, normed, post, comb, h, work (h, work: the
    # boundary form's only).
    params = pack_struct([*(("ptr", a) for a in (*head, phi, alpha, beta, gamma)), ("f32", EPS_N), ("f32", EPS_HC),
                          ("f32", EPS), ("i32", iters),
                          *(("ptr", a) for a in (outs["mix"], counters, outs["collapsed"], outs["normed"],
                                                 outs["post"], None if side_gates else outs["comb"], None, None))])
    launcher(ki.hc_pre_norm(n, d, fused, case.r if fused else 1), flags=flags)(
        (rows, m, 1), (PRE_THREADS, 1, 1), params)
    if side_gates:  # the pre-mix left post/comb alone; hc_gates computes them from mix
        launcher(ki.hc_gates(n), flags=flags)((m, 1, 1), (GATE_THREADS, 1, 1), outs["mix"], alpha, beta, F32(EPS_HC),
                                              np.int32(iters), outs["post"], outs["comb"])
    got = {k: gpu.fetch(v, k) for k, v in outs.items() if v is not None}
    got["counters"] = counters.get()
    return got


def _check_pre(got, case, iters, exact, seed, fused):
    x = case.streams_after_post() if fused else case.x
    phi = bf16_from_bits(case.phi_bits)
    gamma = bf16_from_bits(case.gamma_bits)
    want = ref.hc_pre_norm(x, phi, case.alpha, case.beta, gamma, eps_n=EPS_N, eps_hc=EPS_HC, eps=EPS,
                           iters=iters)
    mu = ref.hc_mix(x, phi, EPS_N)
    assert not got["counters"].any(), f"counters not re-armed: {got['counters']}"
    if fused:
        assert_bits_equal(got["x_out"], x, "fused post-mix streams", seed)
    if exact:
        assert_bits_equal(got["mix"], mu, "mu", seed)
        assert_bits_equal(got["post"], want.post, "post", seed)
        assert_bits_equal(got["comb"], want.comb, "comb", seed)
        assert_bits_equal(got["normed"], want.normed, "normed", seed)
        if "collapsed" in got:
            assert_bits_equal(got["collapsed"], want.collapsed, "collapsed", seed)
        return
    np.testing.assert_allclose(got["mix"], mu, rtol=1e-6, atol=0, err_msg=f"mu (seed {seed})")
    np.testing.assert_allclose(got["post"], want.post, rtol=2e-5, atol=0, err_msg=f"post (seed {seed})")
    np.testing.assert_allclose(got["comb"], want.comb, rtol=2e-5, atol=1e-9, err_msg=f"comb (seed {seed})")
    if "collapsed" in got:
        assert_bf16_near(got["collapsed"], want.collapsed, "collapsed", seed, 1)
    assert_bf16_near(got["normed"], want.normed, "normed", seed, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("exact", [True, False], ids=["cr-math", "expf"])
@pytest.mark.parametrize("fused", [False, True], ids=["pre", "post+pre"])
@pytest.mark.parametrize("n,d,r,vec", SHAPES)
def test_pre_norm(n, d, r, vec, fused, exact):
    seed = int(np.random.SeedSequence().entropy % 2**63)
    m = 2 if d < 4096 else 1
    case = Case(n, d, r, m, seed)
    for iters in (20, 1, 3):
        got = _launch_pre(case, iters, fused, exact, with_collapsed=iters != 3)
        _check_pre(got, case, iters, exact, seed, fused)
    again = _launch_pre(case, 20, fused, exact)  # the counters were re-armed: a replay agrees
    _check_pre(again, case, 20, exact, seed, fused)
    side = _launch_pre(case, 20, fused, exact, side_gates=True)  # gates + Sinkhorn as their own kernel
    _check_pre(side, case, 20, exact, seed, fused)


@pytest.mark.gpu
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("n,d,r,vec", SHAPES)
def test_post_mix(n, d, r, vec, in_place):
    gpu = _gpu()
    seed = int(np.random.SeedSequence().entropy % 2**63)
    m = 3
    case = Case(n, d, r, m, seed)
    x = gpu.to_gpu(case.x)
    out = x if in_place else gpu.poisoned((m, n, d), F32)
    parts = [gpu.to_gpu(p) for p in case.parts_bits]
    post, comb = gpu.to_gpu(case.post_in), gpu.to_gpu(case.comb_in)
    threads = lower_mhc.ROW_THREADS
    launcher(ki.hc_post(n, d, r, vec))(row_grid(d, threads, vec, m), (threads, 1, 1), x,
                                       pack_struct([("ptr", p) for p in parts]), post, comb, out)
    assert_bits_equal(gpu.fetch(out, "post-mix"), case.streams_after_post(), "post-mix", seed)


@pytest.mark.gpu
@pytest.mark.parametrize("n,d,r,vec", SHAPES)
def test_expand_and_head(n, d, r, vec):
    gpu = _gpu()
    seed = int(np.random.SeedSequence().entropy % 2**63)
    rng = np.random.default_rng(seed)
    m, threads = 2, lower_mhc.ROW_THREADS
    grid = row_grid(d, threads, vec, m)
    h_bits = bf16_bits(rng.standard_normal((m, d)).astype(F32))
    x = gpu.poisoned((m, n, d), F32)
    launcher(ki.hc_expand(n, d, vec))(grid, (threads, 1, 1), gpu.to_gpu(h_bits), x)
    assert_bits_equal(gpu.fetch(x, "expand"), ref.hc_expand(bf16_from_bits(h_bits), n), "expand", seed)
    streams = rng.standard_normal((m, n, d)).astype(F32)
    y = gpu.poisoned((m, d), np.uint16)
    launcher(ki.hc_head(n, d, vec))(grid, (threads, 1, 1), gpu.to_gpu(streams), y)
    assert_bits_equal(gpu.fetch(y, "head"), ref.hc_head(streams), "head", seed)
