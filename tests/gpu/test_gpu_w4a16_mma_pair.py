"""GPU tests of the fast shared-expert pair (kernels/w4a16_mma.cuh: w4a16_mma_shared_pair, and its
phase 1 on its own, w4a16_mma_f32_input), on fresh random inputs, launched through the product's
launchers with the lowering's instance, grids and blocks (kbpc.codegen.families.w4a16_gemv).

Bounds (derived in kbpc/reference/gemv_bounds.py, checked per output with `within`: the bound plus
one BF16 ulp of the larger magnitude):
- w4a16_mma_f32_input on an FP32 row act: w4a16_mma_act_bound(act, 0, W, KS): the down MMA chain
  (c = 36 n + 1 + KS + c_ref8, n counting the hi and lo MMAs, c_ref8 the reference's 8-value walk)
  plus the row's split FP16 staging (2^-22 |act_k| + 2^-25 2^-e per element).
- the pair: shared_pair_fast_bound(x, gate_up, down, L, KS0, KS1): phase 0's w4a16_mma bound and
  the BF16 rounding pair give each g_i, u_i an error d_i; the act row moves by at most
  1.1 dg^ min(|u^| + du^, L) + |silu(g^)| du^ (plus its FP32 evaluation error); phase 1 as above.
Both bounds are worst cases over all elements at once (for the pair about 0.4 |y| at the seed's
shapes, dominated by phase 0's possible one-ulp differences). So each test also checks what random
inputs give: the fast phase 0 equals the reference's BF16 bits almost everywhere. With the act row
staged as FP16 alone (before the split), a float64 emulation of the kernels (exact products, their
rounding points) gave 0.89-0.95 of outputs equal to the reference's bits, >= 0.97 within one BF16
ulp and a relative L2 distance of 1e-4..3e-3 (a few outputs flipping by one ulp dominate it); the
split only moves the outputs closer. Asserted with margin, on >= 96 outputs per test so the
fractions are stable: >= 0.75 identical, >= 0.9 within one ulp, relative L2 <= 2^-7.
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import w4a16_gemv as lower_w4a16
from kbpc.codegen.families._projection import linears
from kbpc.reference import gemv_bounds
from kbpc.reference import glm_swiglu_clamp as ref_clamp
from kbpc.reference import w4a16_gemv as ref_w4a16
from kbpc.reference.formats import bf16_bits, bf16_from_bits
from kbpc.testing import instances as ki
from kbpc.testing.launchers import launcher

from test_gpu_projections import _gpu, bf16_input, nvfp4_weight

pytestmark = pytest.mark.gpu

# (k, i, n): the seed's shared expert, the tiny example's, odd sizes: K % 128 tails, I % 128 = 96,
# 512-thread phases (KS0 = 16), phase 0's last CTA past I (I/8 tiles not a multiple of T0), N not a
# multiple of 16 T1.
PAIRS = [(4096, 2048, 4096), (256, 128, 256), (2176, 96, 197), (1056, 160, 200), (128, 96, 120), (8192, 1024, 520)]
CLAMPED = (4096, 2048, 1024)          # (k, i, n) of the test with the clamps biting on both sides
F32_INPUT = [(4096, 2048, 8, 1), (256, 128, 1, 8), (137, 1056, 4, 1), (200, 96, 2, 4), (100, 10240, 16, 1)]
RANGE_SHAPE = (96, 1024, 4, 1)        # (n, k, ks, t) of the act-range test
MIN_NEAR, MIN_SAME, MAX_REL_L2 = 0.9, 0.75, 2.0 ** -7   # every test has >= 96 outputs: fractions are stable


def instances():
    """Every kernel instance this module launches with fixed sizes (tests/nvcc/test_gpu_test_instances.py
    builds them; the product-launcher test takes the tiny example's own)."""
    out = [ki.w4a16_mma_shared_pair(k, i, *lower_w4a16.pair_shapes(k, i, n)) for k, i, n in (*PAIRS, CLAMPED)]
    return out + [ki.w4a16_mma_f32_input(k, ks, t) for _, k, ks, t in (*F32_INPUT, RANGE_SHAPE)]


def assert_fast(got_bits, want, bound, what):
    """Within the stated bound per output; and, on random inputs, close to the reference in
    relative L2 with most outputs identical (skipped for an all-zero reference, where the bound is 0)."""
    got = bf16_from_bits(got_bits.reshape(-1)).astype(np.float64)
    want = np.asarray(want, np.float64).reshape(-1)
    assert not np.isnan(got).any(), f"{what}: NaN"
    ok = gemv_bounds.within(got, want, bound)
    bad = np.flatnonzero(~ok)
    assert ok.all(), (f"{what}: {bad.size} outputs outside the bound, first {bad[:5]}: got {got[bad[:5]]} "
                      f"want {want[bad[:5]]} bound {np.asarray(bound)[bad[:5]]}")
    norm = np.linalg.norm(want)
    if norm == 0:
        assert (got == 0).all(), f"{what}: nonzero outputs of a zero reference"
        return
    rel = np.linalg.norm(got - want) / norm
    near = np.mean(gemv_bounds.within(got, want, 0.0))
    same = np.mean(got_bits.reshape(-1) == bf16_bits(want.astype(np.float32)))
    assert rel <= MAX_REL_L2 and near >= MIN_NEAR and same >= MIN_SAME, (
        f"{what}: relative L2 {rel:.3g}, {near:.3f} within one BF16 ulp, {same:.3f} identical")


# ------------------------------------------------------------------ phase 1 on its own

def act_row(k, scale=1.0, limit=10.0):
    """A reference SwiGLU row: silu(min(g, L)) * clamp(u) in FP32 from BF16 gate and up rows."""
    gu = bf16_input((2 * k,), 3.0)
    return (ref_w4a16.silu_input(*ref_clamp.split_gate_up(ref_clamp.clamp_gate_up(gu, limit))) *
            np.float32(scale)).astype(np.float32)


def _run_f32_input(n, k, ks, t, act, weight):
    g = _gpu()
    packed, scales, sg = weight
    y = g.poisoned((n,), np.uint16)
    launcher(ki.w4a16_mma_f32_input(k, ks, t))((-(-n // (16 * t)), 1, 1), (32 * ks * t, 1, 1), g.to_gpu(packed),
                                               g.to_gpu(scales), np.float32(sg), g.to_gpu(act), y, np.int32(n))
    return g.fetch(y)


def _check_f32_input(n, k, ks, t, act, what):
    weight = nvfp4_weight(n, k)
    want = ref_w4a16.w4a16_gemv(act, *weight, walk="vec8")[0]
    bound = gemv_bounds.w4a16_mma_act_bound(act, 0.0, *weight, ks)
    assert_fast(_run_f32_input(n, k, ks, t, act, weight), want, bound, what)


@pytest.mark.parametrize("n,k,ks,t", F32_INPUT)
def test_w4a16_mma_f32_input(n, k, ks, t):
    _check_f32_input(n, k, ks, t, act_row(k), f"w4a16_mma_f32_input {n}x{k} KS{ks} T{t}")


@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e30, 0.0])
def test_w4a16_mma_f32_input_range(scale):
    """The per-CTA power-of-two scaling of the FP32 row: tiny, huge (beyond FP16 and BF16 range
    after the weights) and zero rows, plus one element far below the rest (FP16-subnormal after
    scaling: the bound's 2^-25 2^-e term)."""
    n, k, ks, t = RANGE_SHAPE
    act = act_row(k, scale)
    act[5] = np.float32(scale * 1e-9)
    _check_f32_input(n, k, ks, t, act, f"w4a16_mma_f32_input act*{scale}")


# ------------------------------------------------------------------ the pair

def _pair_args(g, x, gate_up, down, limit, y, n):
    return [g.to_gpu(gate_up[0]), g.to_gpu(gate_up[1]), np.float32(gate_up[2]), g.to_gpu(bf16_bits(x)),
            g.to_gpu(down[0]), g.to_gpu(down[1]), np.float32(down[2]), np.float32(limit), y, np.int32(n)]


def _pair_reference(x, gate_up, down, limit):
    gu = ref_w4a16.w4a16_gemv(x, *gate_up)[0]
    return ref_w4a16.w4a16_gemv_silu_input(*ref_clamp.split_gate_up(ref_clamp.clamp_gate_up(gu, limit)), *down)[0]


def _check_pair(k, i, n, limit, xscale, repeats=1, pdl=False):
    """`repeats` pairs on fresh inputs, launched back to back without synchronizing (the TU's one
    act row reused by each), then each output checked."""
    g = _gpu()
    shapes = lower_w4a16.pair_shapes(k, i, n)
    grid0, block0, grid1, block1 = lower_w4a16.pair_launch_shapes(i, n, shapes)
    run = launcher(ki.w4a16_mma_shared_pair(k, i, *shapes))   # both phases: one instance, one act row
    gate_up, down = nvfp4_weight(2 * i, k), nvfp4_weight(n, i)
    xs = [bf16_input((k,), xscale) for _ in range(repeats)]
    ys = [g.poisoned((n,), np.uint16) for _ in range(repeats)]
    args = [_pair_args(g, x, gate_up, down, limit, y, n) for x, y in zip(xs, ys)]
    for a in args:
        run(grid0, block0, np.int32(0), *a, pdl=pdl, sync=False)
        run(grid1, block1, np.int32(1), *a, pdl=pdl, sync=False)
    g.synchronize()
    for r, (x, y) in enumerate(zip(xs, ys)):
        bound = gemv_bounds.shared_pair_fast_bound(x, gate_up, down, limit, shapes[0], shapes[2])
        assert_fast(g.fetch(y, f"pair {r}"), _pair_reference(x, gate_up, down, limit), bound,
                    f"fast pair {r} K{k} I{i} N{n} {shapes} L{limit} x*{xscale}")


@pytest.mark.parametrize("k,i,n", PAIRS)
def test_w4a16_mma_shared_pair(k, i, n):
    _check_pair(k, i, n, 10.0, 1.0)


def test_w4a16_mma_shared_pair_clamps():
    """A small limit on large gate/up outputs: many g above L, u beyond +-L."""
    _check_pair(*CLAMPED, 1.0, 4.0)


def test_w4a16_mma_shared_pair_repeated_with_pdl():
    """Three pairs back to back with PDL on and no synchronization: each phase 1 reads the act row
    only after its phase 0 completed, each phase 0 overwrites it only after the previous phase 1
    completed (pdl_wait before the first write; the TU has one row)."""
    _check_pair(*PAIRS[0], 10.0, 1.0, repeats=3, pdl=True)


@pytest.mark.parametrize("pdl", [False, True])
def test_w4a16_mma_shared_pair_through_the_product_launcher(tiny_path, pdl, monkeypatch):
    """The instance, grids, blocks and arguments order the fast lowering emits for the tiny
    example's shared experts (SHARED_PAIR_FAST, fast mode's default, set here whatever it is), run through
    the product's launcher, with and without PDL."""
    from kbpc.testing.lowering import family_groups, planned  # noqa: PLC0415
    monkeypatch.setattr(lower_w4a16, "SHARED_PAIR_FAST", True)
    g = _gpu()
    plan, ctx = planned(str(tiny_path), numerics="fast")
    groups = [grp for grp in family_groups(plan, "w4a16_gemv") if grp.rule == "glm_w4a16_pipe_shared_1row"]
    assert groups
    for grp in groups:
        phase0, phase1 = lower_w4a16.lower(ctx, grp)
        assert phase0.instance == phase1.instance and phase0.instance.header == "w4a16_mma.cuh"
        gate_up_node, down_node = linears(ctx, grp)
        k, i = ctx.input(gate_up_node).dim_value, ctx.input(down_node).dim_value
        n = ctx.output(down_node).dim_value
        ks0, _, ks1, _ = lower_w4a16.pair_shapes(k, i, n)
        limit = float(plan.blueprint.config.constants.swiglu_limit)
        gate_up, down = nvfp4_weight(2 * i, k), nvfp4_weight(n, i)
        x = bf16_input((k,))
        y = g.poisoned((n,), np.uint16)
        args = _pair_args(g, x, gate_up, down, limit, y, n)
        run = launcher(phase0.instance)
        run(phase0.grid, phase0.block, np.int32(0), *args, smem=phase0.smem, pdl=pdl)
        run(phase1.grid, phase1.block, np.int32(1), *args, smem=phase1.smem, pdl=pdl)
        bound = gemv_bounds.shared_pair_fast_bound(x, gate_up, down, limit, ks0, ks1)
        assert_fast(g.fetch(y), _pair_reference(x, gate_up, down, limit), bound, f"{grp.id} through the launcher")
