"""GPU tests of the step's fused routed SwiGLU forms through the product's launchers, bit for bit
against the reference (kbpc.reference): rule moe_swiglu_down (the slots' SwiGLU + quantization in
one launch, w4a4_quant_swiglu_rows_static, then the slot GEMV over the quantized rows in the form
that reads its expert ids before its wait, w4a4_gemv_moe_slots_after_quant, and in the plain form)
and rule moe_gate_up_swiglu (the gate/up slot GEMV with the SwiGLU + quantization in its
epilogue)."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from kbpc.reference import w4a4_mx_static as ref_w4a4s
from kbpc.reference.formats import bf16_bits, bf16_from_bits, quantize_nvfp4, quantize_nvfp4_static, to_bf16
from kbpc.reference.glm_swiglu_clamp import swiglu_clamp_rows
from kbpc.codegen.families import w4a4_mx_static
from kbpc.codegen.families.w4a4_mx_static import quant_swiglu_grid, slots_after_quant_instance
from kbpc.testing.instances import w4a4_moe_slots, w4a4_quant_swiglu_rows_static

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng()   # fresh inputs every run; failures print the sizes
LIMIT = 7.0


@lru_cache(maxsize=2)
def _experts(count: int, n: int, k: int):
    """A stack of random NVFP4 experts (cached per size: quantizing them is the slow part)."""
    stack = []
    for _ in range(count):
        w = RNG.standard_normal((n, k)).astype(np.float32) * np.exp(RNG.standard_normal((n, 1))).astype(np.float32)
        stack.append(quantize_nvfp4(w * np.float32(0.02)))
    return (np.stack([p for p, _, _ in stack]), np.stack([s for _, s, _ in stack]),
            np.array([g for _, _, g in stack], np.float32))


def _ids(experts: int, top_k: int) -> np.ndarray:
    ids = RNG.choice(experts, top_k, replace=False).astype(np.int32)
    ids[RNG.integers(top_k)] = -1   # an empty slot writes zeros
    return ids


def _assert_equal(got_bits, want, what):
    want_bits = bf16_bits(want).reshape(got_bits.shape)
    bad = np.flatnonzero(got_bits != want_bits)
    assert bad.size == 0, (f"{what}: {bad.size} of {want_bits.size} differ, first {bad[:5]}: got "
                           f"{bf16_from_bits(got_bits.reshape(-1)[bad[:5]])} want {np.asarray(want).reshape(-1)[bad[:5]]}")


SIZES = [(4096, 4096, 10, 8), (4096, 2048, 10, 8), (48, 2176, 5, 4), (7168, 1024, 6, 6), (272, 7168, 4, 3)]


def instances():
    """The instances this module launches (tests/nvcc/test_gpu_test_instances.py builds them)."""
    out = []
    for n, k, _, _ in SIZES:
        tiles = w4a4_mx_static.slot_tiles(k, n)
        out += [w4a4_quant_swiglu_rows_static(k), w4a4_moe_slots(k, False, tiles)]
        out += [slots_after_quant_instance(k, fast, tiles) for fast in (False, True)]
    out += [w4a4_quant_swiglu_rows_static(k) for k in (16, 48, 1040, 2064)]
    out += [w4a4_mx_static.gate_up_swiglu_instance(k, i) for k, i, _, _ in GATE_UP_SIZES]
    return out


@pytest.mark.parametrize("n,k,experts,top_k", SIZES)
def test_step_pair_swiglu_quant_then_slots(n, k, experts, top_k):
    """The step's down projection (rule moe_swiglu_down): w4a4_quant_swiglu_rows_static writes the
    slots' quantized SwiGLU rows, w4a4_gemv_moe_slots reads them; the instances as the lowering
    builds them (kbpc/codegen/families/w4a4_mx_static.py)."""
    from kbpc.testing import gpu
    from kbpc.testing.launchers import launcher

    weights, ids = _experts(experts, n, k), _ids(experts, top_k)
    gu = to_bf16(RNG.standard_normal((top_k, 2 * k)).astype(np.float32) * np.float32(4.0))
    h = swiglu_clamp_rows(gu, LIMIT)
    gamma = np.float32(np.abs(h).max() / 2688)
    tiles = w4a4_mx_static.slot_tiles(k, n)
    quant, slots = w4a4_quant_swiglu_rows_static(k), w4a4_moe_slots(k, False, tiles)
    c, s, a = (gpu.poisoned((top_k, k // 2), np.uint8), gpu.poisoned((top_k, k // 16), np.uint8),
               gpu.poisoned((top_k,), np.float32))
    launcher(quant)(quant_swiglu_grid(k, top_k), (256, 1, 1), gpu.to_gpu(bf16_bits(gu)), LIMIT, gamma, c, s, a,
                    pdl=True)
    packed, scales, g = quantize_nvfp4_static(h, gamma)
    # codes and scales are raw bytes (any value, the poison byte included): compared, not poison-checked
    assert np.array_equal(c.get(), packed) and np.array_equal(s.get(), scales)
    assert np.array_equal(gpu.fetch(a, "g"), np.full(top_k, gamma, np.float32))
    wp, ws, wg = weights
    y = gpu.poisoned((top_k, n), np.uint16)
    launcher(slots)((n // (16 * tiles), top_k, 1), (256, 1, 1), gpu.to_gpu(ids), 1, c, s, a, gpu.to_gpu(wp), gpu.to_gpu(ws),
                    gpu.to_gpu(wg), y, n, pdl=True)
    want = ref_w4a4s.w4a4_static_moe_slots(h, gamma, *weights, ids)
    _assert_equal(gpu.fetch(y, "y"), want, f"pair n={n} k={k}")
    # the step's form: the ids and weights before the wait, the same bytes (and the fast form's
    # bytes equal to the plain fast slot GEMV's)
    after = gpu.poisoned((top_k, n), np.uint16)
    launcher(slots_after_quant_instance(k, False, tiles))((n // (16 * tiles), top_k, 1), (256, 1, 1), gpu.to_gpu(ids),
                                                          c, s, a, gpu.to_gpu(wp), gpu.to_gpu(ws), gpu.to_gpu(wg),
                                                          after, n, pdl=True)
    _assert_equal(gpu.fetch(after, "y after the quantizer"), want, f"after-quant form n={n} k={k}")
    fast_plain, fast_after = gpu.poisoned((top_k, n), np.uint16), gpu.poisoned((top_k, n), np.uint16)
    launcher(w4a4_moe_slots(k, True, tiles))((n // (16 * tiles), top_k, 1), (256, 1, 1), gpu.to_gpu(ids), 1, c, s, a,
                                             gpu.to_gpu(wp), gpu.to_gpu(ws), gpu.to_gpu(wg), fast_plain, n, pdl=True)
    launcher(slots_after_quant_instance(k, True, tiles))((n // (16 * tiles), top_k, 1), (256, 1, 1), gpu.to_gpu(ids),
                                                         c, s, a, gpu.to_gpu(wp), gpu.to_gpu(ws), gpu.to_gpu(wg),
                                                         fast_after, n, pdl=True)
    assert np.array_equal(gpu.fetch(fast_after, "fast after"), gpu.fetch(fast_plain, "fast plain"))


@pytest.mark.parametrize("k", [16, 48, 1040, 2064])
def test_swiglu_quant_rows_at_widths_of_half_warps(k):
    """w4a4_quant_swiglu_rows_static where a row ends inside a warp (K % 32 == 16) or inside a CTA:
    the bytes of the reference's clamped SwiGLU and static quantization, a zero row included."""
    from kbpc.testing import gpu
    from kbpc.testing.launchers import launcher

    rows = 3
    gu = to_bf16(RNG.standard_normal((rows, 2 * k)).astype(np.float32) * np.float32(4.0))
    gu[1] = 0.0
    h = swiglu_clamp_rows(gu, LIMIT)
    gamma = np.float32(max(np.abs(h).max(), 1.0) / 2688)
    c, s, a = (gpu.poisoned((rows, k // 2), np.uint8), gpu.poisoned((rows, k // 16), np.uint8),
               gpu.poisoned((rows,), np.float32))
    launcher(w4a4_quant_swiglu_rows_static(k))(quant_swiglu_grid(k, rows), (256, 1, 1), gpu.to_gpu(bf16_bits(gu)),
                                               LIMIT, gamma, c, s, a, pdl=True)
    packed, scales, _ = quantize_nvfp4_static(h, gamma)
    assert np.array_equal(c.get(), packed) and np.array_equal(s.get(), scales)
    assert np.array_equal(gpu.fetch(a, "g"), np.full(rows, gamma, np.float32))


GATE_UP_SIZES = [(4096, 2048, 10, 8), (2176, 48, 5, 4), (1024, 3584, 6, 6), (7168, 272, 4, 3)]


@pytest.mark.parametrize("k,i,experts,top_k", GATE_UP_SIZES)
def test_gate_up_swiglu_epilogue(k, i, experts, top_k):
    """Rule moe_gate_up_swiglu: w4a4_gemv_moe_gate_up_swiglu writes the slots' [gate | up] rows and,
    in each slot's last CTA, their quantized SwiGLU: bit for bit the reference's slot GEMV, clamped
    SwiGLU and static quantization (what the separate launches write), twice in a row (the arrival
    counters return to zero), an empty slot included."""
    from kbpc.testing import gpu
    from kbpc.testing.launchers import launcher

    weights, ids = _experts(experts, 2 * i, k), _ids(experts, top_k)
    x = to_bf16(RNG.standard_normal((1, k)).astype(np.float32))
    gamma_in = np.float32(np.abs(x).max() / 2688)
    xc, xs, xg = quantize_nvfp4_static(x, gamma_in)
    gu_want = ref_w4a4s.w4a4_static_moe_slots(np.repeat(x, top_k, 0), gamma_in, *weights, ids)   # (top_k, 2i)
    h = swiglu_clamp_rows(gu_want, LIMIT)
    gamma = np.float32(max(np.abs(h).max(), 1e-3) / 2688)
    packed, scales, _ = quantize_nvfp4_static(h, gamma)
    wp, ws, wg = weights
    args = [gpu.to_gpu(ids), top_k, gpu.to_gpu(xc), gpu.to_gpu(xs), gpu.to_gpu(np.asarray(xg, np.float32).reshape(-1)),
            gpu.to_gpu(wp), gpu.to_gpu(ws), gpu.to_gpu(wg)]
    counters = gpu.to_gpu(np.zeros(top_k, np.uint32))
    for run in range(2):
        gu = gpu.poisoned((top_k, 2 * i), np.uint16)
        c, s, a = (gpu.poisoned((top_k, i // 2), np.uint8), gpu.poisoned((top_k, i // 16), np.uint8),
                   gpu.poisoned((top_k,), np.float32))
        launcher(w4a4_mx_static.gate_up_swiglu_instance(k, i))(
            (2 * i // 16, top_k, 1), (256, 1, 1), *args, gu, LIMIT, gamma, c, s, a, counters, pdl=True)
        _assert_equal(gpu.fetch(gu, "gu"), gu_want, f"gate/up rows k={k} i={i} run {run}")
        assert np.array_equal(c.get(), packed) and np.array_equal(s.get(), scales), f"codes/scales run {run}"
        assert np.array_equal(gpu.fetch(a, "g"), np.full(top_k, gamma, np.float32))
        assert not counters.get().any(), "arrival counters left non-zero"
