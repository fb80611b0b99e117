"""GPU tests of the small-N forms of the FP8 and BF16 GEMVs: the same bits on more SMs.

- wxay_rowscale_ks / wxay_rowscale_split_ks (W warps per CTA, the eight warp partials of a tile
  handed over through a global scratch, added by the tile's last CTA): byte-identical to
  wxay_rowscale / wxay_rowscale_split_list on the same inputs (which the reference checks within the
  MMA tolerance of test_gpu_projections), launched twice in a row with fresh inputs (the last CTA
  resets its counter: a stale counter would skip or double the combine).
- dense_gemv_bf16_opc (1 or 2 outputs per CTA): bit-exact against the reference, BF16 and FP32 out.

Every kernel runs through the product's launchers (kbpc.testing.instances); the split-K forms are
the header's own __global__ entries, which no lowering launches yet.
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families._projection import BF16, BLOCK
from kbpc.reference import dense_bf16 as ref_dense
from kbpc.reference import wxay as ref_wxay
from kbpc.reference.formats import bf16_bits, quantize_fp8
from kbpc.testing import instances as ki
from kbpc.testing.launchers import launcher

from test_gpu_projections import (WXAY_SEG, _gpu, assert_bf16_close, assert_bf16_equal, bf16_input, fp8_weight,
                                  seg_table)

pytestmark = pytest.mark.gpu

KS_SHAPES = [(128, 4096, 1), (512, 4096, 2), (48, 2176, 4), (16, 128, 1), (4096, 16384, 8)]   # (n, k, warps)
SPLIT_KS = [(4096, (1536, 512), 2), (2176, (48, 16, 32), 1)]                                  # (k, ns, warps)
OPC_SHAPES = [(128, 4096, 1), (288, 4096, 2), (32, 4096, 1), (7, 520, 2), (4096, 1536, 2)]    # (n, k, opc)


def instances():
    """Every kernel instance this module launches (tests/nvcc/test_gpu_test_instances.py builds them)."""
    out = [f for n, k, w in KS_SHAPES for f in (ki.wxay_rowscale(k), ki.wxay_rowscale_ks(k, w))]
    out += [f for k, ns, w in SPLIT_KS for f in (ki.wxay_split_list(k, len(ns)), ki.wxay_split_ks(k, w, len(ns)))]
    return out + [ki.dense(k, o, opc) for _, k, opc in OPC_SHAPES for o in (BF16, "float")]


def _scratch(g, tiles):
    return g.poisoned((tiles * 128,), np.float32), g.to_gpu(np.zeros(tiles, np.uint32))


@pytest.mark.parametrize("n,k,w", KS_SHAPES)
def test_wxay_rowscale_ks(n, k, w):
    g = _gpu()
    wc, wsc = fp8_weight(n, k)
    wcd, wsd = g.to_gpu(wc), g.to_gpu(wsc)
    part, cnt = _scratch(g, n // 16)
    for rep in range(2):
        ac, asc = quantize_fp8(bf16_input((1, k)), axis=-1)
        acd, asd = g.to_gpu(ac), g.to_gpu(asc)
        y0, y1 = g.poisoned((n,), np.uint16), g.poisoned((n,), np.uint16)
        launcher(ki.wxay_rowscale(k))((n // 16, 1, 1), BLOCK, acd, asd, wcd, wsd, y0, np.int32(n))
        launcher(ki.wxay_rowscale_ks(k, w))((n // 16 * (8 // w), 1, 1), (32 * w, 1, 1), acd, asd, wcd, wsd, y1,
                                            np.int32(n), part, cnt)
        plain = g.fetch(y0)
        assert np.array_equal(g.fetch(y1, f"ks rep {rep}"), plain), f"wxay ks != wxay_rowscale (rep {rep})"
        assert_bf16_close(plain[None], ref_wxay.wxay_rowscale(ac, asc, wc, wsc), "wxay", 0.999)
    assert not cnt.get().any(), "tile counters not reset"


@pytest.mark.parametrize("k,ns,w", SPLIT_KS)
def test_wxay_split_ks(k, ns, w):
    """Both forms take the segment table by value (WxaySegList): the split-list form the lowering
    launches, and the split-K form."""
    g = _gpu()
    weights = [fp8_weight(n, k) for n in ns]
    dev = [(g.to_gpu(c), g.to_gpu(s)) for c, s in weights]
    tiles = sum(n // 16 for n in ns)
    part, cnt = _scratch(g, tiles)
    for rep in range(2):
        ac, asc = quantize_fp8(bf16_input((1, k)), axis=-1)
        acd, asd = g.to_gpu(ac), g.to_gpu(asc)
        outs = []
        for fn in ("split_list", "split_ks"):
            ys = [g.poisoned((n,), np.uint16) for n in ns]
            table = seg_table([(int(c.gpudata), int(s.gpudata), int(y.gpudata), n, 0)
                               for (c, s), y, n in zip(dev, ys, ns)], WXAY_SEG)
            if fn == "split_list":
                launcher(ki.wxay_split_list(k, len(ns)))((tiles, 1, 1), BLOCK, table, acd, asd)
            else:
                launcher(ki.wxay_split_ks(k, w, len(ns)))((tiles * (8 // w), 1, 1), (32 * w, 1, 1), table, acd, asd,
                                                          part, cnt)
            outs.append([g.fetch(y, f"{fn} {i}") for i, y in enumerate(ys)])
        for i, (a, b) in enumerate(zip(*outs)):
            assert np.array_equal(a, b), f"split ks segment {i} != wxay_rowscale_split (rep {rep})"
        for i, want in enumerate(ref_wxay.wxay_split(ac, asc, weights)):
            assert_bf16_close(outs[0][i][None], want, f"split {i}", 0.999)
    assert not cnt.get().any(), "tile counters not reset"


@pytest.mark.parametrize("n,k,opc", OPC_SHAPES)
def test_dense_bf16_opc(n, k, opc):
    g = _gpu()
    w, x = bf16_input((n, k), 0.05), bf16_input((k,))
    wd, xd = g.to_gpu(bf16_bits(w)), g.to_gpu(bf16_bits(x))
    y16, y32 = g.poisoned((n,), np.uint16), g.poisoned((n,), np.float32)
    grid, block = (-(-n // opc), 1, 1), (64 * opc, 1, 1)
    launcher(ki.dense(k, BF16, opc))(grid, block, wd, xd, y16, np.int32(n))
    launcher(ki.dense(k, "float", opc))(grid, block, wd, xd, y32, np.int32(n))
    assert_bf16_equal(g.fetch(y16), ref_dense.dense_gemv_bf16(x, w)[0], "dense opc bf16")
    want32 = ref_dense.dense_gemv_bf16(x, w, out_dtype="f32")[0]
    assert np.array_equal(g.fetch(y32).view(np.uint32), want32.view(np.uint32)), "dense opc f32 out"
