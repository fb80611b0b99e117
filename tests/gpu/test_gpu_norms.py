"""GPU tests of rms_norm (plain / one_plus, residual copy, residual add, exact residual add,
strided per-head) and layer_norm against the numpy reference, fresh random inputs each run.

Tolerances: the reciprocal root is rsqrtf (<= 2 ulp) where the reference rounds 1/sqrt correctly,
so the FP32 value before the BF16 store is a few ulp away and each normalised output is within
1 BF16 ulp. Everything that involves no rsqrtf (the in-place residual add h <- rn(h + s), the
residual copy) is bit-exact. The block sizes are the reference's rules (rms_norm.block_threads,
layer_norm.block_threads), so the reduction orders are the same. Every kernel runs through the
product's launchers with the lowerings' instances (kbpc.testing.instances; the residual modes are
the same rms_norm template with another RmsMode).
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families.rms_norm import norm_quant_instance
from kbpc.reference import layer_norm as ref_ln
from kbpc.reference import rms_norm as ref_rms
from kbpc.reference.formats import bf16_bits, to_bf16
from kbpc.testing import instances as ki
from kbpc.testing.compare import assert_bf16_within
from kbpc.testing.launchers import launcher

F32 = np.float32
MODES = {"norm": 0, "residual_copy": 1, "residual_add": 2, "residual_add_exact": 3}   # kbp::RmsMode


def rms_instance(d: int, one_plus: bool, mode: str):
    return ki.rms_norm(d, ref_rms.block_threads(d), one_plus, MODES[mode])


def ln_instance(d: int):
    return ki.layer_norm(d, ref_ln.block_threads(d))


def bf16_rand(rng, shape, std=1.0, mean=0.0):
    return to_bf16((rng.standard_normal(shape) * std + mean).astype(F32))


def test_instances_use_the_reference_block_sizes():
    assert rms_instance(4096, True, "norm").kernel == "kbp::rms_norm<4096, 1024, true, 0>"
    assert rms_instance(1536, False, "norm").kernel == "kbp::rms_norm<1536, 768, false, 0>"
    assert ln_instance(100).kernel == "kbp::layer_norm_bf16<100, 128>"


def _gpu():
    from kbpc.testing import gpu  # noqa: PLC0415
    return gpu


NULL = np.uintp(0)

RMS_SHAPES = [  # (d, rows, groups, one_plus)
    (4096, 1, 1, True),    # the seed's final norm
    (1536, 2, 1, False),   # the seed's q_a norm (rms_norm_vanilla)
    (1000, 3, 1, True),    # idle threads in the last warp
    (2050, 2, 1, False),   # 1025 pairs on 1024 threads: two rounds for thread 0
    (128, 3, 4, True),     # strided per-head form: 4 heads per row, padded rows
]
LN_SHAPES = [(128, 1), (128, 7), (100, 3), (1500, 2), (5000, 2)]   # (d, rows)
QUANT_SHAPES = [(1536, 1, False, True), (128, 3, True, True), (1000, 2, False, False),
                (2050, 1, True, True)]                               # (d, rows, one_plus, write_y)


def instances():
    """Every kernel instance this module launches (tests/nvcc/test_gpu_test_instances.py builds them)."""
    out = [rms_instance(d, one_plus, mode) for d, _, groups, one_plus in RMS_SHAPES for mode in MODES
           if groups == 1 or mode == "norm"]
    out += [norm_quant_instance(d, one_plus) for d, _, one_plus, _ in QUANT_SHAPES]
    return out + [ln_instance(d) for d, _ in LN_SHAPES]


@pytest.mark.gpu
@pytest.mark.parametrize("d,rows,groups,one_plus", RMS_SHAPES)
@pytest.mark.parametrize("mode", list(MODES))
def test_rms_norm(d, rows, groups, one_plus, mode):
    if groups > 1 and mode != "norm":
        pytest.skip("the strided form is norm-only")
    g = _gpu()
    rng = np.random.default_rng()
    eps, weight = 1e-6, "one_plus" if one_plus else "plain"
    row_stride = groups * d + (16 if groups > 1 else 0)  # padded rows in the strided case
    x = bf16_rand(rng, (rows, row_stride), rng.uniform(0.1, 10.0))
    s = bf16_rand(rng, (rows, groups * d))
    gamma = bf16_rand(rng, (d,), 0.1, 0.0 if one_plus else 1.0)
    x_gpu = g.to_gpu(bf16_bits(x))
    y = g.poisoned((rows, groups * d), np.uint16)
    res = g.poisoned((rows, d), np.uint16)
    launcher(rms_instance(d, one_plus, mode))((rows, groups, 1), (ref_rms.block_threads(d), 1, 1), x_gpu,
                                              np.int64(row_stride), np.int64(d), g.to_gpu(bf16_bits(s)), np.int64(d),
                                              res, np.int64(d), g.to_gpu(bf16_bits(gamma)), np.float32(eps), y,
                                              np.int64(groups * d), np.int64(d))
    xr = x[:, :groups * d].reshape(rows, groups, d)
    if mode in ("norm", "residual_copy"):
        y_ref = ref_rms.rms_norm(xr, gamma, eps, weight)
        h_ref, res_ref = x, xr[:, 0]
    else:
        y_ref, h_new, res_ref = ref_rms.residual_add_rms_norm(xr[:, 0], s, gamma, eps,
                                                              exact=mode.endswith("exact"), weight=weight)
        h_ref = h_new
    assert_bf16_within(g.fetch(y, "y").reshape(rows, groups, d), y_ref.reshape(rows, groups, d), 1, "y")
    np.testing.assert_array_equal(g.fetch(x_gpu, "x"), bf16_bits(h_ref), "the input row (h)")
    if mode != "norm":
        np.testing.assert_array_equal(g.fetch(res, "residual"), bf16_bits(res_ref), "residual")


@pytest.mark.gpu
@pytest.mark.parametrize("d,rows", LN_SHAPES)
@pytest.mark.parametrize("in_place", [True, False])
def test_layer_norm(d, rows, in_place):
    g = _gpu()
    rng = np.random.default_rng()
    eps = 1e-6
    x = bf16_rand(rng, (rows, d), rng.uniform(0.1, 10.0), rng.uniform(-3.0, 3.0))
    gamma, beta = bf16_rand(rng, (d,), 0.2, 1.0), bf16_rand(rng, (d,), 0.2)
    x_gpu = g.to_gpu(bf16_bits(x))
    y = x_gpu if in_place else g.poisoned((rows, d), np.uint16)
    launcher(ln_instance(d))((rows, 1, 1), (ref_ln.block_threads(d), 1, 1), x_gpu, np.int64(d),
                             g.to_gpu(bf16_bits(gamma)), g.to_gpu(bf16_bits(beta)), np.float32(eps), y, np.int64(d))
    assert_bf16_within(g.fetch(y, "y"), ref_ln.layer_norm(x, gamma, beta, eps), 1, "y")


@pytest.mark.gpu
@pytest.mark.parametrize("d,rows,one_plus,write_y", QUANT_SHAPES)
def test_rms_norm_quant_fp8(d, rows, one_plus, write_y):
    """The norm with its per-token FP8 quantizer fused (through the product's launcher): the BF16
    row as rms_norm, codes and scales bit-exact as w8a8_act_quant_row on that row."""
    from kbpc.reference import w8a8_act_quant as ref_q

    g = _gpu()
    rng = np.random.default_rng()
    x = bf16_rand(rng, (rows, d), rng.uniform(0.1, 10.0))
    gamma = bf16_rand(rng, (d,), 0.1, 0.0 if one_plus else 1.0)
    eps = np.float32(1e-6)
    y = g.poisoned((rows, d), np.uint16) if write_y else None
    q, s = g.poisoned((rows, d), np.uint8), g.poisoned((rows,), np.float32)
    launcher(norm_quant_instance(d, one_plus))((rows, 1, 1), (ref_rms.block_threads(d), 1, 1),
                                               g.to_gpu(bf16_bits(x)), d, g.to_gpu(bf16_bits(gamma)), eps,
                                               y, d, q, s)
    y_ref = ref_rms.rms_norm(x, gamma, eps, "one_plus" if one_plus else "plain")
    q_ref, s_ref = ref_q.quant_row(y_ref)
    if write_y:
        assert_bf16_within(g.fetch(y, "y"), y_ref, 0, "y")
    np.testing.assert_array_equal(g.fetch(q, "codes"), q_ref)
    np.testing.assert_array_equal(g.fetch(s, "scales"), s_ref.reshape(rows))
