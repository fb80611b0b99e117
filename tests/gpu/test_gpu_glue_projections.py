"""GPU tests of the projection entries added for code generation, against kbpc.reference:
w4a16_gemv_seg_list / wxay_rowscale_split_list (segment tables passed by value), the clamped
silu-input GEMV, the shared-expert pair (two phases over a TU-private scratch), and the W4A4 slot
GEMV with the static activation quantization fused in.

Tolerances: the seg lists and the fused slot GEMV are bit-exact (same device functions as the
tested two-step forms); the silu-input forms use CUDA's expf (<= 2 ulp from the correctly
rounded exp), so >= 99% of outputs identical and all within 1 BF16 ulp of the row's largest
output; wxay's MMA accumulation is unspecified: >= 99.9% identical, within 1 BF16 ulp.
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.reference import glm_swiglu_clamp as ref_clamp
from kbpc.reference import w4a4_mx_static as ref_w4a4s
from kbpc.reference import w4a16_gemv as ref_w4a16
from kbpc.reference import wxay as ref_wxay
from kbpc.reference.formats import bf16_bits, quantize_fp8
# The projection tests' inputs, weights, checks and module loader (tests/gpu is on sys.path).
from test_gpu_projections import (RNG, W4A16_SEG, WXAY_SEG, _gpu, _module, assert_bf16_close,
                                  assert_bf16_equal, bf16_input, fp8_weight, nvfp4_weight)

pytestmark = pytest.mark.gpu


def table_words(segs, record) -> list[np.uint64]:
    """A by-value segment list as kernel arguments: its 32-byte records are 8-byte aligned words,
    laid out in the parameter buffer exactly as that many uint64 arguments."""
    table = np.array([tuple(s) for s in segs], np.dtype(record))
    return [np.uint64(w) for w in table.view("<u8")]


def w4a16_src(k, nseg, i):
    """Wrappers around the added w4a16 entries (K = k; the pair's gate_up K = k, I = i)."""
    return f"""#include "w4a16_gemv.cuh"
extern "C" __global__ void __launch_bounds__(256) seglist(const __grid_constant__ kbp::W4A16SegList<{nseg}> t, const __nv_bfloat16* x) {{ kbp::w4a16_gemv_seg_dev<{k}>(t.seg, {nseg}, x); }}
extern "C" __global__ void __launch_bounds__(256) siluclamp(const uint8_t* c, const uint8_t* s, float g, const __nv_bfloat16* a, const __nv_bfloat16* b, float L, __nv_bfloat16* y, int N) {{ kbp::w4a16_gemv_silu_clamp_input_dev<{i}>(c, s, g, a, b, L, y, N); }}
extern "C" __global__ void __launch_bounds__(256) pair(int ph, const uint8_t* c0, const uint8_t* s0, float g0, const __nv_bfloat16* x, const uint8_t* c1, const uint8_t* s1, float g1, float L, __nv_bfloat16* y, int N) {{ kbp::w4a16_shared_pair_dev<{k}, {i}>(ph, c0, s0, g0, x, c1, s1, g1, L, y, N); }}
"""


@pytest.mark.parametrize("k,ns", [(4096, (8192, 8192, 8192, 128, 64, 128)), (2176, (48, 4, 17))])
def test_w4a16_seg_list(k, ns):
    g = _gpu()
    x = bf16_input((k,))
    weights = [nvfp4_weight(n, k) for n in ns]
    dev = [(g.to_gpu(p), g.to_gpu(s)) for p, s, _ in weights]
    ys = [g.poisoned((n,), np.uint16) for n in ns]
    words = table_words([(int(p.gpudata), int(s.gpudata), int(y.gpudata), float(sg), n)
                         for (p, s), y, (_, _, sg), n in zip(dev, ys, weights, ns)], W4A16_SEG)
    mod = _module(w4a16_src(k, len(ns), 128), f"glue_w4a16_{k}_{len(ns)}")
    mod.get_function("seglist")(*words, g.to_gpu(bf16_bits(x)).gpudata, block=(256, 1, 1),
                                grid=(sum((n + 15) // 16 for n in ns), 1))
    for i, (y, want) in enumerate(zip(ys, ref_w4a16.w4a16_gemv_segments(x, weights))):
        assert_bf16_equal(g.fetch(y, f"segment {i}"), want[0], f"segment {i}")


def _clamped_reference(gu, limit, packed, scales, sg):
    gh, uh = ref_clamp.split_gate_up(ref_clamp.clamp_gate_up(gu, limit))
    return ref_w4a16.w4a16_gemv_silu_input(gh, uh, packed, scales, sg)


@pytest.mark.parametrize("n,i", [(4096, 2048), (48, 2176)])
def test_w4a16_silu_clamp_input(n, i):
    g = _gpu()
    packed, scales, sg = nvfp4_weight(n, i)
    gu = bf16_input((2 * i,), 8.0)   # many values beyond the limit on both sides
    limit = np.float32(7.0)
    mod = _module(w4a16_src(128, 1, i), f"glue_w4a16_clamp_{i}")
    y = g.poisoned((n,), np.uint16)
    mod.get_function("siluclamp")(g.to_gpu(packed).gpudata, g.to_gpu(scales).gpudata, np.float32(sg),
                                  g.to_gpu(bf16_bits(gu[:i])).gpudata, g.to_gpu(bf16_bits(gu[i:])).gpudata,
                                  limit, y.gpudata, np.int32(n), block=(256, 1, 1), grid=((n + 15) // 16, 1))
    assert_bf16_close(g.fetch(y)[None], _clamped_reference(gu, limit, packed, scales, sg), "silu clamp", 0.99)


@pytest.mark.parametrize("k,i,n", [(4096, 2048, 4096), (256, 128, 256), (2176, 48, 37)])
def test_w4a16_shared_pair(k, i, n):
    g = _gpu()
    gate_up, down = nvfp4_weight(2 * i, k), nvfp4_weight(n, i)
    x = bf16_input((k,), 4.0)
    limit = np.float32(1.0)   # small, so the clamp bites on the gate/up outputs
    mod = _module(w4a16_src(k, 1, i), f"glue_w4a16_pair_{k}_{i}")
    y = g.poisoned((n,), np.uint16)
    args = [g.to_gpu(gate_up[0]).gpudata, g.to_gpu(gate_up[1]).gpudata, np.float32(gate_up[2]),
            g.to_gpu(bf16_bits(x)).gpudata, g.to_gpu(down[0]).gpudata, g.to_gpu(down[1]).gpudata,
            np.float32(down[2]), limit, y.gpudata, np.int32(n)]
    fn = mod.get_function("pair")
    fn(np.int32(0), *args, block=(256, 1, 1), grid=((2 * i + 15) // 16, 1))
    fn(np.int32(1), *args, block=(256, 1, 1), grid=((n + 15) // 16, 1))
    gu = ref_w4a16.w4a16_gemv(x, *gate_up)[0]
    assert_bf16_close(g.fetch(y)[None], _clamped_reference(gu, limit, *down), "shared pair", 0.99)


@pytest.mark.parametrize("n,k,experts,top_k,shared", [(4096, 4096, 16, 8, True), (4096, 2048, 16, 8, False),
                                                      (48, 2176, 5, 4, True), (32, 128, 3, 2, False)])
def test_w4a4_moe_slots_bf16(n, k, experts, top_k, shared):
    g = _gpu()
    stack = [nvfp4_weight(n, k) for _ in range(experts)]
    wp, ws = np.stack([p for p, _, _ in stack]), np.stack([s for _, s, _ in stack])
    wg = np.array([x for _, _, x in stack], np.float32)
    ids = RNG.choice(experts, top_k, replace=False).astype(np.int32)
    ids[RNG.integers(top_k)] = -1
    x = bf16_input((1 if shared else top_k, k))
    gamma = np.float32(np.abs(x).max() / 2688 * 0.5)   # some values saturate
    src = f"""#include "w4a4_mx_static.cuh"
extern "C" __global__ void __launch_bounds__(256, 2) moebf16(const int* ids, int div, const __nv_bfloat16* x, float gm, const uint8_t* wc, const uint8_t* ws, const float* sg, __nv_bfloat16* y, int N) {{ kbp::w4a4_gemv_moe_slots_bf16_dev<{k}>(ids, div, x, gm, wc, ws, sg, y, N); }}
"""
    mod = _module(src, f"glue_w4a4s_{k}")
    y = g.poisoned((top_k, n), np.uint16)
    mod.get_function("moebf16")(g.to_gpu(ids).gpudata, np.int32(top_k if shared else 1),
                                g.to_gpu(bf16_bits(x)).gpudata, gamma, g.to_gpu(wp).gpudata, g.to_gpu(ws).gpudata,
                                g.to_gpu(wg).gpudata, y.gpudata, np.int32(n), block=(256, 1, 1), grid=(n // 16, top_k))
    want = ref_w4a4s.w4a4_static_moe_slots(x[0] if shared else x, gamma, wp, ws, wg, ids)
    assert_bf16_equal(g.fetch(y), want, "w4a4 moe slots (fused static quant)")


@pytest.mark.parametrize("k,ns", [(4096, (1536, 512)), (2176, (48, 16, 32, 16))])
def test_wxay_split_list(k, ns):
    g = _gpu()
    weights = [fp8_weight(n, k) for n in ns]
    ac, asc = quantize_fp8(bf16_input((1, k)), axis=-1)
    dev = [(g.to_gpu(c), g.to_gpu(s)) for c, s in weights]
    ys = [g.poisoned((n,), np.uint16) for n in ns]
    words = table_words([(int(c.gpudata), int(s.gpudata), int(y.gpudata), n, 0)
                         for (c, s), y, n in zip(dev, ys, ns)], WXAY_SEG)
    src = f"""#include "wxay.cuh"
extern "C" __global__ void __launch_bounds__(256, 2) splitlist(const __grid_constant__ kbp::WxaySegList<{len(ns)}> t, const uint8_t* a, const float* sa) {{ kbp::wxay_rowscale_split_dev<{k}>(t.seg, {len(ns)}, a, sa); }}
"""
    mod = _module(src, f"glue_wxay_{k}_{len(ns)}")
    mod.get_function("splitlist")(*words, g.to_gpu(ac).gpudata, g.to_gpu(asc).gpudata, block=(256, 1, 1),
                                  grid=(sum(n // 16 for n in ns), 1))
    for i, (y, want) in enumerate(zip(ys, ref_wxay.wxay_split(ac, asc, weights))):
        assert_bf16_close(g.fetch(y, f"split {i}")[None], want, f"split {i}", 0.999)
