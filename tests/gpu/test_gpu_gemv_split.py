"""GPU tests of the small-N forms of the FP8 and BF16 GEMVs: the same bits on more SMs.

- wxay_rowscale_ks / wxay_rowscale_split_ks (W warps per CTA, the eight warp partials of a tile
  handed over through a global scratch, added by the tile's last CTA): byte-identical to
  wxay_rowscale / wxay_rowscale_split on the same inputs (which the reference checks within the
  MMA tolerance of test_gpu_projections), launched twice in a row with fresh inputs (the last CTA
  resets its counter: a stale counter would skip or double the combine).
- dense_gemv_bf16_opc (1 or 2 outputs per CTA): bit-exact against the reference, BF16 and FP32 out.
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.reference import dense_bf16 as ref_dense
from kbpc.reference import wxay as ref_wxay
from kbpc.reference.formats import bf16_bits, quantize_fp8

from test_gpu_projections import (WXAY_SEG, _gpu, _module, assert_bf16_close, assert_bf16_equal, bf16_input,
                                  fp8_weight, seg_table)

pytestmark = pytest.mark.gpu


def wxay_ks_src(k, w):
    return f"""#include "wxay.cuh"
extern "C" __global__ void __launch_bounds__(256, 2) wx(const uint8_t* a, const float* sa, const uint8_t* w, const float* sw, __nv_bfloat16* y, int N) {{ kbp::wxay_rowscale_dev<{k}>(a, sa, w, sw, y, N); }}
extern "C" __global__ void __launch_bounds__(256, 2) wxsplit(const kbp::WxaySeg* t, int n, const uint8_t* a, const float* sa) {{ kbp::wxay_rowscale_split_dev<{k}>(t, n, a, sa); }}
extern "C" __global__ void __launch_bounds__({32 * w}) ks(const uint8_t* a, const float* sa, const uint8_t* w, const float* sw, __nv_bfloat16* y, int N, float* part, unsigned* cnt) {{ kbp::wxay_rowscale_ks_dev<{k}, {w}>(a, sa, w, sw, y, N, part, cnt); }}
extern "C" __global__ void __launch_bounds__({32 * w}) splitks(const kbp::WxaySeg* t, int n, const uint8_t* a, const float* sa, float* part, unsigned* cnt) {{ kbp::wxay_rowscale_split_ks_dev<{k}, {w}>(t, n, a, sa, part, cnt); }}
"""


def _scratch(g, tiles):
    return g.poisoned((tiles * 128,), np.float32), g.to_gpu(np.zeros(tiles, np.uint32))


@pytest.mark.parametrize("n,k,w", [(128, 4096, 1), (512, 4096, 2), (48, 2176, 4), (16, 128, 1), (4096, 16384, 8)])
def test_wxay_rowscale_ks(n, k, w):
    g = _gpu()
    mod = _module(wxay_ks_src(k, w), f"wxay_ks_{k}_{w}")
    wc, wsc = fp8_weight(n, k)
    wcd, wsd = g.to_gpu(wc), g.to_gpu(wsc)
    part, cnt = _scratch(g, n // 16)
    for rep in range(2):
        ac, asc = quantize_fp8(bf16_input((1, k)), axis=-1)
        acd, asd = g.to_gpu(ac), g.to_gpu(asc)
        y0, y1 = g.poisoned((n,), np.uint16), g.poisoned((n,), np.uint16)
        mod.get_function("wx")(acd.gpudata, asd.gpudata, wcd.gpudata, wsd.gpudata, y0.gpudata, np.int32(n),
                               block=(256, 1, 1), grid=(n // 16, 1))
        mod.get_function("ks")(acd.gpudata, asd.gpudata, wcd.gpudata, wsd.gpudata, y1.gpudata, np.int32(n),
                               part.gpudata, cnt.gpudata, block=(32 * w, 1, 1), grid=(n // 16 * (8 // w), 1))
        plain = g.fetch(y0)
        assert np.array_equal(g.fetch(y1, f"ks rep {rep}"), plain), f"wxay ks != wxay_rowscale (rep {rep})"
        assert_bf16_close(plain[None], ref_wxay.wxay_rowscale(ac, asc, wc, wsc), "wxay", 0.999)
    assert not cnt.get().any(), "tile counters not reset"


@pytest.mark.parametrize("k,ns,w", [(4096, (1536, 512), 2), (2176, (48, 16, 32), 1)])
def test_wxay_split_ks(k, ns, w):
    g = _gpu()
    mod = _module(wxay_ks_src(k, w), f"wxay_ks_{k}_{w}")
    weights = [fp8_weight(n, k) for n in ns]
    dev = [(g.to_gpu(c), g.to_gpu(s)) for c, s in weights]
    tiles = sum(n // 16 for n in ns)
    part, cnt = _scratch(g, tiles)
    for rep in range(2):
        ac, asc = quantize_fp8(bf16_input((1, k)), axis=-1)
        acd, asd = g.to_gpu(ac), g.to_gpu(asc)
        outs = []
        for fn in ("wxsplit", "splitks"):
            ys = [g.poisoned((n,), np.uint16) for n in ns]
            table = g.to_gpu(seg_table([(int(c.gpudata), int(s.gpudata), int(y.gpudata), n, 0)
                                        for (c, s), y, n in zip(dev, ys, ns)], WXAY_SEG))
            if fn == "wxsplit":
                mod.get_function(fn)(table.gpudata, np.int32(len(ns)), acd.gpudata, asd.gpudata,
                                     block=(256, 1, 1), grid=(tiles, 1))
            else:
                mod.get_function(fn)(table.gpudata, np.int32(len(ns)), acd.gpudata, asd.gpudata, part.gpudata,
                                     cnt.gpudata, block=(32 * w, 1, 1), grid=(tiles * (8 // w), 1))
            outs.append([g.fetch(y, f"{fn} {i}") for i, y in enumerate(ys)])
        for i, (a, b) in enumerate(zip(*outs)):
            assert np.array_equal(a, b), f"split ks segment {i} != wxay_rowscale_split (rep {rep})"
        for i, want in enumerate(ref_wxay.wxay_split(ac, asc, weights)):
            assert_bf16_close(outs[0][i][None], want, f"split {i}", 0.999)
    assert not cnt.get().any(), "tile counters not reset"


def dense_opc_src(k, opc):
    return f"""#include "dense_bf16.cuh"
extern "C" __global__ void __launch_bounds__({64 * opc}) d_bf16(const __nv_bfloat16* W, const __nv_bfloat16* x, __nv_bfloat16* y, int N) {{ kbp::dense_gemv_bf16_dev<{k}, __nv_bfloat16, {opc}>(W, x, y, N); }}
extern "C" __global__ void __launch_bounds__({64 * opc}) d_f32(const __nv_bfloat16* W, const __nv_bfloat16* x, float* y, int N) {{ kbp::dense_gemv_bf16_dev<{k}, float, {opc}>(W, x, y, N); }}
"""


@pytest.mark.parametrize("n,k,opc", [(128, 4096, 1), (288, 4096, 2), (32, 4096, 1), (7, 520, 2), (4096, 1536, 2)])
def test_dense_bf16_opc(n, k, opc):
    g = _gpu()
    w, x = bf16_input((n, k), 0.05), bf16_input((k,))
    mod = _module(dense_opc_src(k, opc), f"dense_opc_{k}_{opc}")
    wd, xd = g.to_gpu(bf16_bits(w)), g.to_gpu(bf16_bits(x))
    y16, y32 = g.poisoned((n,), np.uint16), g.poisoned((n,), np.float32)
    grid = (-(-n // opc), 1)
    mod.get_function("d_bf16")(wd.gpudata, xd.gpudata, y16.gpudata, np.int32(n), block=(64 * opc, 1, 1), grid=grid)
    mod.get_function("d_f32")(wd.gpudata, xd.gpudata, y32.gpudata, np.int32(n), block=(64 * opc, 1, 1), grid=grid)
    assert_bf16_equal(g.fetch(y16), ref_dense.dense_gemv_bf16(x, w)[0], "dense opc bf16")
    want32 = ref_dense.dense_gemv_bf16(x, w, out_dtype="f32")[0]
    assert np.array_equal(g.fetch(y32).view(np.uint32), want32.view(np.uint32)), "dense opc f32 out"
