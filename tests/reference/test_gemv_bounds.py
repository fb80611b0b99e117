"""The fast-form error bounds (kbpc.reference.gemv_bounds): the reference's own constant covers its
distance to the exact dot product, the bound grows with the chain lengths, and `within` is the
stated test (bound + one BF16 ulp of the larger magnitude)."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.reference import gemv_bounds as gb
from kbpc.reference import w4a16_gemv as ref
from kbpc.reference.formats import dequantize_nvfp4, quantize_nvfp4, to_bf16

RNG = np.random.default_rng()


@pytest.mark.parametrize("n,k", [(64, 4096), (33, 1056), (8, 32)])
def test_reference_within_its_constant(n, k):
    """|y_ref - exact| <= c_ref u S + half a BF16 ulp, on fresh inputs (the FP32 sum before the
    rounding is what c_ref bounds; the rounding adds at most half an ulp)."""
    w = RNG.standard_normal((n, k)).astype(np.float32) * np.exp(RNG.standard_normal((n, 1))).astype(np.float32)
    packed, scales, sg = quantize_nvfp4(w * np.float32(0.02))
    x = to_bf16(RNG.standard_normal(k).astype(np.float32))
    wd = dequantize_nvfp4(packed, scales, sg, (n, k)).astype(np.float64)
    exact = wd @ x.astype(np.float64)
    s = np.abs(wd) @ np.abs(x.astype(np.float64))
    y = ref.w4a16_gemv(x, packed, scales, sg)[0].astype(np.float64)
    assert (np.abs(y - exact) <= gb.w4a16_ref_c(k) * gb.U * s + gb.bf16_ulp(exact) / 2 + 1e-300).all()


def test_constants_grow_with_the_chains():
    assert gb.w4a16_mma_c(8192, 4) > gb.w4a16_mma_c(4096, 4) > gb.w4a16_mma_c(4096, 8)
    assert gb.w4a16_mma_c(4096, 4) == gb.MMA_STEP * 64 + 4 + gb.w4a16_ref_c(4096)


def test_bf16_ulp_and_within():
    assert gb.bf16_ulp(1.0) == 2.0 ** -7 and gb.bf16_ulp(-3.0) == 2.0 ** -6 and gb.bf16_ulp(0.0) == 2.0 ** -133
    assert gb.within([1.0 + 2 ** -7], [1.0], [0.0]).all()
    assert not gb.within([1.0 + 2 ** -6], [1.0], [0.0]).any()
    assert gb.within([1.0 + 2 ** -6], [1.0], [2 ** -7]).all()
    assert not gb.within([np.nan], [1.0], [1e30]).any()
