"""GPU tests of the projection entries added for code generation, against kbpc.reference:
w4a16_gemv_seg_list / wxay_rowscale_split_list (segment tables passed by value), the clamped
silu-input GEMV, the shared-expert pair (two phases over a TU-private scratch), and the W4A4 slot
GEMV with the static activation quantization fused in, all launched through the product's launchers
with the lowerings' instances (kbpc.testing.instances; the clamped silu-input GEMV on its own is the
header's __global__ entry, the pair's phase 1 in the product).

Tolerances: the seg lists and the fused slot GEMV are bit-exact (same device functions as the
tested two-step forms); the silu-input forms use CUDA's expf (<= 2 ulp from the correctly
rounded exp), so >= 99% of outputs identical and all within 1 BF16 ulp of the row's largest
output; wxay's MMA accumulation is unspecified: >= 99.9% identical, within 1 BF16 ulp.
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families._projection import BLOCK
from kbpc.reference import glm_swiglu_clamp as ref_clamp
from kbpc.reference import w4a4_mx_static as ref_w4a4s
from kbpc.reference import w4a16_gemv as ref_w4a16
from kbpc.reference import wxay as ref_wxay
from kbpc.reference.formats import bf16_bits, quantize_fp8
from kbpc.testing import instances as ki
from kbpc.testing.launchers import launcher

# The projection tests' inputs, weights and checks (tests/gpu is on sys.path).
from test_gpu_projections import (RNG, W4A16_SEG, WXAY_SEG, _gpu, assert_bf16_close, assert_bf16_equal,
                                  bf16_input, fp8_weight, nvfp4_weight, seg_table)

pytestmark = pytest.mark.gpu

SEG_LISTS = [(4096, (8192, 8192, 8192, 128, 64, 128)), (2176, (48, 4, 17))]   # (k, widths)
SILU_CLAMP = [(4096, 2048), (48, 2176)]                                       # (n, i)
PAIRS = [(4096, 2048, 4096), (256, 128, 256), (2176, 48, 37)]                 # (k, i, n)
MOE_BF16 = [(4096, 4096, 16, 8, True), (4096, 2048, 16, 8, False),           # (n, k, experts, top_k, shared)
            (48, 2176, 5, 4, True), (32, 128, 3, 2, False)]
WXAY_LISTS = [(4096, (1536, 512)), (2176, (48, 16, 32, 16))]                  # (k, widths)


def instances():
    """Every kernel instance this module launches (tests/nvcc/test_gpu_test_instances.py builds them)."""
    out = [ki.w4a16_seg_list(k, len(ns)) for k, ns in SEG_LISTS]
    out += [ki.w4a16_silu_clamp_input(i) for _, i in SILU_CLAMP] + [ki.w4a16_shared_pair(k, i) for k, i, _ in PAIRS]
    out += [ki.w4a4_moe_slots_bf16(k) for _, k, *_ in MOE_BF16]
    return out + [ki.wxay_split_list(k, len(ns)) for k, ns in WXAY_LISTS]


@pytest.mark.parametrize("k,ns", SEG_LISTS)
def test_w4a16_seg_list(k, ns):
    g = _gpu()
    x = bf16_input((k,))
    weights = [nvfp4_weight(n, k) for n in ns]
    dev = [(g.to_gpu(p), g.to_gpu(s)) for p, s, _ in weights]
    ys = [g.poisoned((n,), np.uint16) for n in ns]
    table = seg_table([(int(p.gpudata), int(s.gpudata), int(y.gpudata), float(sg), n)
                       for (p, s), y, (_, _, sg), n in zip(dev, ys, weights, ns)], W4A16_SEG)
    launcher(ki.w4a16_seg_list(k, len(ns)))((sum((n + 15) // 16 for n in ns), 1, 1), BLOCK, table,
                                            g.to_gpu(bf16_bits(x)))
    for i, (y, want) in enumerate(zip(ys, ref_w4a16.w4a16_gemv_segments(x, weights))):
        assert_bf16_equal(g.fetch(y, f"segment {i}"), want[0], f"segment {i}")


def _clamped_reference(gu, limit, packed, scales, sg):
    gh, uh = ref_clamp.split_gate_up(ref_clamp.clamp_gate_up(gu, limit))
    return ref_w4a16.w4a16_gemv_silu_input(gh, uh, packed, scales, sg)


@pytest.mark.parametrize("n,i", SILU_CLAMP)
def test_w4a16_silu_clamp_input(n, i):
    g = _gpu()
    packed, scales, sg = nvfp4_weight(n, i)
    gu = bf16_input((2 * i,), 8.0)   # many values beyond the limit on both sides
    limit = np.float32(7.0)
    y = g.poisoned((n,), np.uint16)
    launcher(ki.w4a16_silu_clamp_input(i))(((n + 15) // 16, 1, 1), BLOCK, g.to_gpu(packed), g.to_gpu(scales),
                                           np.float32(sg), g.to_gpu(bf16_bits(gu[:i])), g.to_gpu(bf16_bits(gu[i:])),
                                           limit, y, np.int32(n))
    assert_bf16_close(g.fetch(y)[None], _clamped_reference(gu, limit, packed, scales, sg), "silu clamp", 0.99)


@pytest.mark.parametrize("k,i,n", PAIRS)
def test_w4a16_shared_pair(k, i, n):
    g = _gpu()
    gate_up, down = nvfp4_weight(2 * i, k), nvfp4_weight(n, i)
    x = bf16_input((k,), 4.0)
    limit = np.float32(1.0)   # small, so the clamp bites on the gate/up outputs
    y = g.poisoned((n,), np.uint16)
    args = [g.to_gpu(gate_up[0]), g.to_gpu(gate_up[1]), np.float32(gate_up[2]), g.to_gpu(bf16_bits(x)),
            g.to_gpu(down[0]), g.to_gpu(down[1]), np.float32(down[2]), limit, y, np.int32(n)]
    run = launcher(ki.w4a16_shared_pair(k, i))   # both phases: one instance, one TU-private [g | u] scratch
    run(((2 * i + 15) // 16, 1, 1), BLOCK, np.int32(0), *args)
    run(((n + 15) // 16, 1, 1), BLOCK, np.int32(1), *args)
    gu = ref_w4a16.w4a16_gemv(x, *gate_up)[0]
    assert_bf16_close(g.fetch(y)[None], _clamped_reference(gu, limit, *down), "shared pair", 0.99)


@pytest.mark.parametrize("n,k,experts,top_k,shared", MOE_BF16)
def test_w4a4_moe_slots_bf16(n, k, experts, top_k, shared):
    g = _gpu()
    stack = [nvfp4_weight(n, k) for _ in range(experts)]
    wp, ws = np.stack([p for p, _, _ in stack]), np.stack([s for _, s, _ in stack])
    wg = np.array([x for _, _, x in stack], np.float32)
    ids = RNG.choice(experts, top_k, replace=False).astype(np.int32)
    ids[RNG.integers(top_k)] = -1
    x = bf16_input((1 if shared else top_k, k))
    gamma = np.float32(np.abs(x).max() / 2688 * 0.5)   # some values saturate
    y = g.poisoned((top_k, n), np.uint16)
    launcher(ki.w4a4_moe_slots_bf16(k))((n // 16, top_k, 1), BLOCK, g.to_gpu(ids), np.int32(top_k if shared else 1),
                                        g.to_gpu(bf16_bits(x)), gamma, g.to_gpu(wp), g.to_gpu(ws), g.to_gpu(wg), y,
                                        np.int32(n))
    want = ref_w4a4s.w4a4_static_moe_slots(x[0] if shared else x, gamma, wp, ws, wg, ids)
    assert_bf16_equal(g.fetch(y), want, "w4a4 moe slots (fused static quant)")


@pytest.mark.parametrize("k,ns", WXAY_LISTS)
def test_wxay_split_list(k, ns):
    g = _gpu()
    weights = [fp8_weight(n, k) for n in ns]
    ac, asc = quantize_fp8(bf16_input((1, k)), axis=-1)
    dev = [(g.to_gpu(c), g.to_gpu(s)) for c, s in weights]
    ys = [g.poisoned((n,), np.uint16) for n in ns]
    table = seg_table([(int(c.gpudata), int(s.gpudata), int(y.gpudata), n, 0)
                       for (c, s), y, n in zip(dev, ys, ns)], WXAY_SEG)
    launcher(ki.wxay_split_list(k, len(ns)))((sum(n // 16 for n in ns), 1, 1), BLOCK, table, g.to_gpu(ac),
                                             g.to_gpu(asc))
    for i, (y, want) in enumerate(zip(ys, ref_wxay.wxay_split(ac, asc, weights))):
        assert_bf16_close(g.fetch(y, f"split {i}")[None], want, f"split {i}", 0.999)


def _e4m3_codes(shape) -> np.ndarray:
    """Random E4M3 codes over the whole format (every exponent, subnormals, both signs; no NaN), so
    128-wide chunk sums span far more than FP32's 24 bits: where an FP32 chunk sum rounds."""
    codes = RNG.integers(0, 256, shape, dtype=np.uint8)
    return np.where((codes & 0x7F) == 0x7F, codes ^ 0x01, codes).astype(np.uint8)


@pytest.mark.parametrize("n,k", [(1536, 4096), (4096, 16384), (48, 2176), (16, 128)])
def test_wxay_rowscale_exact_is_the_reference(n, k):
    """The exact form (numerics `exact`, wxay_rowscale<K, true>): bit for bit the reference, on codes
    spread over the whole E4M3 range, where the tensor-core form's chunk sums round."""
    g = _gpu()
    ac, wc = _e4m3_codes((1, k)), _e4m3_codes((n, k))
    asc = np.array([0.5], np.float32)
    wsc = (RNG.random(n).astype(np.float32) + np.float32(0.5)) * np.float32(2.0 ** -12)
    y = g.poisoned((n,), np.uint16)
    launcher(ki.wxay_rowscale(k, exact=True))((n // 16, 1, 1), BLOCK, g.to_gpu(ac), g.to_gpu(asc), g.to_gpu(wc),
                                              g.to_gpu(wsc), y, np.int32(n))
    assert_bf16_equal(g.fetch(y)[None], ref_wxay.wxay_rowscale(ac, asc, wc, wsc), f"wxay exact n={n} k={k}")


@pytest.mark.parametrize("k,ns", WXAY_LISTS)
def test_wxay_split_list_exact_is_the_reference(k, ns):
    g = _gpu()
    weights = [(_e4m3_codes((n, k)), np.full(n, 2.0 ** -12, np.float32)) for n in ns]
    ac, asc = _e4m3_codes((1, k)), np.array([0.25], np.float32)
    dev = [(g.to_gpu(c), g.to_gpu(s)) for c, s in weights]
    ys = [g.poisoned((n,), np.uint16) for n in ns]
    table = seg_table([(int(c.gpudata), int(s.gpudata), int(y.gpudata), n, 0)
                       for (c, s), y, n in zip(dev, ys, ns)], WXAY_SEG)
    launcher(ki.wxay_split_list(k, len(ns), exact=True))((sum(n // 16 for n in ns), 1, 1), BLOCK, table,
                                                         g.to_gpu(ac), g.to_gpu(asc))
    for i, (y, want) in enumerate(zip(ys, ref_wxay.wxay_split(ac, asc, weights))):
        assert_bf16_equal(g.fetch(y, f"split {i}")[None], want, f"exact split {i}")

