"""GPU tests of the `fast` W4A16 form (kernels/w4a16_mma.cuh: FP16 tensor cores) and of the exact
chunk walk's two decode paths (kernels/w4a16_gemv.cuh), on fresh random inputs.

Bound of the fast form (derived in kbpc/reference/gemv_bounds.py, checked per output):

    |y_mma - y_ref| <= c u S_n + 2^-25 2^-e s_g sum_k |q_nk s_nk| + ulp_bf16(max(|y_mma|, |y_ref|))

with u = 2^-24, S_n = sum_k |W_nk x_k| (W the dequantized weight) and c = 36 n + 1 + KS + c_ref: n =
8 ceil(ceil(K/128) / KS) m16n8k16 MMAs per warp in two chains, each erring by at most 36 u times the
sum of its addends' magnitudes (17 addends aligned to the largest and truncated to >= 24 bits, the
worst behaviour measured on tensor cores; the PTX ISA specifies none), the chains' add, KS - 1
ordered FP32 adds of the warp partials and one rounding by s_g; c_ref = 18 + ceil(K/1024) + 6 is the
reference's own chain (16 FMAs per chunk, the scale product, the lane accumulator, the shuffle
tree). The middle term is the activation's rounding to FP16 after the power-of-two scaling (zero
unless |x_k| is below max|x| 2^-31). Beyond the bound, >= 90% of outputs must equal the reference's
BF16 bits (the fast path is FP32-accurate, so only near-ties may round differently): a check that
the kernel is not merely within a loose bound but computes the same dot product.
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families._projection import BLOCK
from kbpc.reference import gemv_bounds
from kbpc.reference import w4a16_gemv as ref_w4a16
from kbpc.reference.formats import bf16_bits, bf16_from_bits, to_bf16
from kbpc.testing import instances as ki
from kbpc.testing.launchers import launcher

from test_gpu_projections import RNG, _gpu, assert_bf16_equal, bf16_input, nvfp4_weight, run_w4a16_segments

pytestmark = pytest.mark.gpu


# K % 128 in {0, 32, 64, 96} (tail chunks), N not a multiple of 16 * T, every KS and several T.
MMA_SHAPES = [(8192, 4096, 4, 2), (4096, 8192, 8, 1), (48, 2176, 2, 2), (3, 32, 1, 1), (37, 1056, 4, 1),
              (129, 4160, 16, 1), (200, 96, 2, 4), (64, 20480, 8, 2)]
RANGE_SHAPE = (96, 1024, 4, 1)   # (n, k, ks, t) of the activation-range test
MMA_SEGMENTS = [(4096, (8192, 8192, 8192, 128, 64, 128), 4, 2), (2176, (48, 4, 17), 2, 1)]
BIG_SHAPE = (40, 2048)           # (n, k) of the exact chunk walk's big-activation test


def instances():
    """Every kernel instance this module launches with fixed sizes (tests/nvcc/test_gpu_test_instances.py
    builds them; the product-launcher test takes the tiny example's own)."""
    out = [ki.w4a16_mma(k, ks, t) for _, k, ks, t in (*MMA_SHAPES, RANGE_SHAPE)]
    out += [ki.w4a16_mma_seg_list(k, ks, t, len(ns)) for k, ns, ks, t in MMA_SEGMENTS]
    return out + [ki.w4a16(BIG_SHAPE[1])]


def ctas(n, t):
    return -(-n // (16 * t))


def assert_fast_bound(got_bits, x, weight, ks, what):
    """The stated bound, per output, and, over 64 outputs or more, >= 90% identical to the
    reference bits (a sanity check on the accumulation, not the contract: with fresh random inputs
    a few outputs round the other way, so at 3 outputs one such flip is a third of them: seen on
    an H200 at 3 x 32)."""
    packed, scales, sg = weight
    want = ref_w4a16.w4a16_gemv(x, packed, scales, sg)[0]
    got = bf16_from_bits(got_bits.reshape(-1))
    assert not np.isnan(got).any(), f"{what}: NaN"
    bound = gemv_bounds.w4a16_mma_bound(x, packed, scales, sg, ks)
    ok = gemv_bounds.within(got, want, bound)
    bad = np.flatnonzero(~ok)
    assert ok.all(), (f"{what}: {bad.size} outputs outside the bound, first {bad[:5]}: got {got[bad[:5]]} "
                      f"want {want[bad[:5]]} bound {bound[bad[:5]]}")
    same = np.mean(got_bits.reshape(-1) == bf16_bits(want))
    assert got.size < 64 or same >= 0.9, f"{what}: only {same:.3f} of outputs equal the reference bits"


def _run_mma(n, k, ks, t, x, weight):
    g = _gpu()
    packed, scales, sg = weight
    y = g.poisoned((n,), np.uint16)
    launcher(ki.w4a16_mma(k, ks, t))((ctas(n, t), 1, 1), (32 * ks * t, 1, 1), g.to_gpu(packed), g.to_gpu(scales),
                                     np.float32(sg), g.to_gpu(bf16_bits(x)), y, np.int32(n))
    return g.fetch(y)


@pytest.mark.parametrize("n,k,ks,t", MMA_SHAPES)
def test_w4a16_mma(n, k, ks, t):
    weight = nvfp4_weight(n, k)
    x = bf16_input((k,))
    assert_fast_bound(_run_mma(n, k, ks, t, x, weight), x, weight, ks, f"w4a16_mma {n}x{k} KS{ks} T{t}")


@pytest.mark.parametrize("scale", [1e-30, 3e4, 1e12, 0.0])
def test_w4a16_mma_activation_range(scale):
    """The per-CTA power-of-two scaling: tiny, FP16-overflowing and huge activations, and all zeros;
    plus one element far below the rest (rounded in FP16: the middle term of the bound)."""
    n, k, ks, t = RANGE_SHAPE
    weight = nvfp4_weight(n, k)
    x = bf16_input((k,), scale) if scale else np.zeros(k, np.float32)
    x[7] = to_bf16(np.float32(scale * 1e-12))
    assert_fast_bound(_run_mma(n, k, ks, t, x, weight), x, weight, ks, f"w4a16_mma x*{scale}")


@pytest.mark.parametrize("k,ns,ks,t", MMA_SEGMENTS)
def test_w4a16_mma_segments(k, ns, ks, t):
    """The segment table by value (W4A16SegList, as the fast lowering launches it)."""
    g = _gpu()
    x, weights, ys = run_w4a16_segments(ki.w4a16_mma_seg_list(k, ks, t, len(ns)), ns, k, (32 * ks * t, 1, 1),
                                        (sum(ctas(n, t) for n in ns), 1, 1))
    for i, (y, w) in enumerate(zip(ys, weights)):
        assert_fast_bound(g.fetch(y, f"segment {i}"), x, w, ks, f"segment {i}")


def test_w4a16_exact_big_activations():
    """The exact chunk walk's slow decode (taken when some |x_k| >= 2^113, where x * 2^14 would
    overflow) and its fast decode on the same weight: both bit-exact."""
    g = _gpu()
    n, k = BIG_SHAPE
    packed, scales, sg = nvfp4_weight(n, k)
    for big in (False, True):
        x = bf16_input((k,), 1e-3)
        if big:
            x[RNG.integers(k)] = to_bf16(np.float32(2.0 ** 114))
        y = g.poisoned((n,), np.uint16)
        launcher(ki.w4a16(k))(((n + 15) // 16, 1, 1), BLOCK, g.to_gpu(packed), g.to_gpu(scales), np.float32(sg),
                              g.to_gpu(bf16_bits(x)), y, np.int32(n))
        assert_bf16_equal(g.fetch(y), ref_w4a16.w4a16_gemv(x, packed, scales, sg)[0],
                          f"w4a16_gemv big={big}")


@pytest.mark.parametrize("pdl", [False, True])
def test_w4a16_mma_through_the_product_launcher(tiny_path, pdl):
    """The instance, grid and block the fast lowering picks for the tiny example's one-linear
    groups, run through the product's launcher (kbpc.testing.launchers), with and without PDL."""
    from kbpc.codegen.families import w4a16_gemv as lower_w4a16  # noqa: PLC0415
    from kbpc.testing.lowering import family_groups, planned  # noqa: PLC0415
    g = _gpu()
    plan, ctx = planned(str(tiny_path), numerics="fast")
    groups = [grp for grp in family_groups(plan, "w4a16_gemv") if len(grp.nodes) == 1]
    assert groups
    for grp in groups:
        (launch,) = lower_w4a16.lower(ctx, grp)
        assert launch.instance.header == "w4a16_mma.cuh"
        node = plan.blueprint.node_by_id[grp.nodes[0]]
        k, n = ctx.input(node).dim_value, ctx.output(node).dim_value
        ks = int(launch.instance.kernel.split(",")[1])
        weight = nvfp4_weight(n, k)
        x = bf16_input((k,))
        y = g.poisoned((n,), np.uint16)
        launcher(launch.instance)(launch.grid, launch.block, g.to_gpu(weight[0]), g.to_gpu(weight[1]),
                                  np.float32(weight[2]), g.to_gpu(bf16_bits(x)), y, n, smem=launch.smem, pdl=pdl)
        assert_fast_bound(g.fetch(y), x, weight, ks, f"{node.id} through the launcher")
