"""kbpc.reference.formats against ml_dtypes: every code, ties, subnormals, saturation, -0, NaN, and
the block-scaled encoders against independent formulations built on ml_dtypes casts."""
from __future__ import annotations

import ml_dtypes as md
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kbpc.reference import formats as F

F32 = np.float32
SETTINGS = settings(max_examples=40, deadline=None)
f32_any = hnp.arrays(np.float32, st.integers(1, 64), elements=st.floats(width=32, allow_nan=False))


def _ref_e4m3(x):
    """ml_dtypes' cast does not saturate (overflow -> NaN): clamp to +-448 first."""
    return np.clip(np.asarray(x, F32), -448, 448).astype(md.float8_e4m3fn).view(np.uint8)


def _ref_e2m1(x):
    return np.asarray(x, F32).astype(md.float4_e2m1fn).view(np.uint8)


def _random_f32_bits(n, seed=0):
    u = np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    x = u.view(F32)
    return x[~np.isnan(x)]


# ---------------------------------------------------------------- BF16

def test_bf16_all_codes_roundtrip():
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    x = F.bf16_from_bits(bits)
    assert np.array_equal(x, bits.view(md.bfloat16).astype(F32), equal_nan=True)
    finite = ~np.isnan(x)
    assert np.array_equal(F.bf16_bits(x)[finite], bits[finite])
    assert np.isnan(F.to_bf16(x[~finite])).all()


def test_bf16_random_bits_and_ties():
    x = _random_f32_bits(1 << 18)
    assert np.array_equal(F.bf16_bits(x), x.astype(md.bfloat16).view(np.uint16))
    # exact ties: low 16 bits 0x8000 round to the even neighbour
    u = (np.arange(0, 2**16, 7, dtype=np.uint32) << 16) | 0x8000
    t = u.view(F32)
    t = t[np.isfinite(t)]
    assert np.array_equal(F.bf16_bits(t), t.astype(md.bfloat16).view(np.uint16))
    assert F.bf16_bits(F32(-0.0)) == 0x8000


@SETTINGS
@given(f32_any)
def test_bf16_hypothesis(x):
    assert np.array_equal(F.bf16_bits(x), x.astype(md.bfloat16).view(np.uint16))


# ---------------------------------------------------------------- E4M3

def test_e4m3_all_codes():
    codes = np.arange(256, dtype=np.uint8)
    ref = codes.view(md.float8_e4m3fn).astype(F32)
    dec = F.e4m3_decode(codes)
    assert np.array_equal(dec, ref, equal_nan=True)
    finite = ~np.isnan(dec)
    assert np.array_equal(F.e4m3_encode(dec[finite]), codes[finite])  # includes 0x80 (-0)


def test_e4m3_ties_subnormals_saturation():
    mags = F.e4m3_decode(np.arange(0, 0x7F, dtype=np.uint8)).astype(np.float64)
    mids = ((mags[:-1] + mags[1:]) / 2).astype(F32)          # every tie, subnormal ones too
    for v in (mids, -mids, np.nextafter(mids, F32(0)), np.nextafter(mids, F32(np.inf))):
        assert np.array_equal(F.e4m3_encode(v), _ref_e4m3(v))
    big = np.array([448, 449, 463.9, 464, 480, 1e6, np.inf, 3.4e38], F32)
    assert (F.e4m3_encode(big) == 0x7E).all() and (F.e4m3_encode(-big) == 0xFE).all()
    assert F.e4m3_encode(F32(np.nan)) == F.E4M3_NAN_CODE
    assert F.e4m3_encode(F32(-0.0)) == 0x80 and F.e4m3_encode(F32(2.0**-10)) == 0
    assert F.e4m3_encode(F32(2.0**-10 * 1.01)) == 1


def test_e4m3_random_bits_f32_and_f64():
    x = _random_f32_bits(1 << 18, seed=1)
    assert np.array_equal(F.e4m3_encode(x), _ref_e4m3(x))
    assert np.array_equal(F.e4m3_encode(x.astype(np.float64)), _ref_e4m3(x))


@SETTINGS
@given(hnp.arrays(np.float32, st.integers(1, 64),
                  elements=st.floats(-600, 600, width=32)))
def test_e4m3_hypothesis(x):
    assert np.array_equal(F.e4m3_encode(x), _ref_e4m3(x))


# ---------------------------------------------------------------- E2M1

def test_e2m1_all_codes_and_ties():
    codes = np.arange(16, dtype=np.uint8)
    dec = F.e2m1_decode(codes)
    assert np.array_equal(dec, codes.view(md.float4_e2m1fn).astype(F32))
    assert np.array_equal(F.e2m1_encode(dec), codes)
    mags = dec[:8].astype(np.float64)
    mids = ((mags[:-1] + mags[1:]) / 2).astype(F32)
    for v in (mids, -mids, np.nextafter(mids, F32(0)), np.nextafter(mids, F32(9))):
        assert np.array_equal(F.e2m1_encode(v), _ref_e2m1(v))
    assert np.array_equal(F.e2m1_encode(np.array([6, 7, 1e30, np.inf], F32)), [7] * 4)
    assert np.array_equal(F.e2m1_encode(np.array([-7, -np.inf], F32)), [15, 15])
    assert F.e2m1_encode(F32(-0.0)) == 8 and F.e2m1_encode(F32(np.nan)) == 7


def test_e2m1_random_bits():
    x = _random_f32_bits(1 << 18, seed=2)
    assert np.array_equal(F.e2m1_encode(x), _ref_e2m1(x))


@SETTINGS
@given(hnp.arrays(np.float32, st.integers(1, 64), elements=st.floats(-8, 8, width=32)))
def test_e2m1_hypothesis(x):
    assert np.array_equal(F.e2m1_encode(x), _ref_e2m1(x))


@SETTINGS
@given(hnp.arrays(np.uint8, st.tuples(st.integers(1, 3), st.integers(1, 16).map(lambda k: 2 * k)),
                  elements=st.integers(0, 15)))
def test_pack_unpack(codes):
    packed = F.pack_e2m1(codes)
    assert packed.shape == codes.shape[:-1] + (codes.shape[-1] // 2,)
    assert np.array_equal(packed & 15, codes[..., 0::2])      # low nibble = even element
    assert np.array_equal(F.unpack_e2m1(packed), codes)
    with pytest.raises(ValueError):
        F.pack_e2m1(np.zeros(3, np.uint8))


# ---------------------------------------------------------------- NVFP4

def _rows_reference(x, g):
    """Independent w4a4_mx row quantizer from ml_dtypes casts (numerics text order)."""
    xg = x.reshape(x.shape[0], -1, 16)
    gmax6 = (np.abs(xg).max(-1) / F32(6)).astype(F32)
    s_codes = _ref_e4m3((gmax6 * (F32(1) / g)[:, None]).astype(F32))
    s = s_codes.view(md.float8_e4m3fn).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = (xg / (s * g[:, None])[..., None]).astype(F32)
    codes = np.where(s[..., None] == 0, 0, _ref_e2m1(np.nan_to_num(v)))
    return F.pack_e2m1(codes.reshape(x.shape)), s_codes


def _rows(seed, m, k, zero_groups=True):
    r = np.random.default_rng(seed)
    x = F.to_bf16(r.standard_normal((m, k)) * 10.0 ** r.uniform(-3, 3, (m, 1)))
    if zero_groups:
        x[:, 16:32] = 0
        x[r.random((m, k)) < 0.05] = 0
    if m > 1:
        x[-1] = 0                                              # an all-zero row
    return x


@SETTINGS
@given(st.integers(0, 2**31), st.integers(1, 4), st.integers(2, 12).map(lambda g: 16 * g))
def test_nvfp4_rows_matches_independent(seed, m, k):
    x = _rows(seed, m, k)
    packed, scales, g = F.quantize_nvfp4_rows(x)
    amax = np.abs(x).max(-1)
    assert np.array_equal(g, np.where(amax > 0, (amax / F32(2688)).astype(F32), F32(1)))
    ref_p, ref_s = _rows_reference(x, g)
    assert np.array_equal(packed, ref_p) and np.array_equal(scales, ref_s)
    assert (scales[:, 1] == 0).all() and (packed[:, 8:16] == 0).all()     # zero group
    if m > 1:
        assert g[-1] == 1 and not packed[-1].any() and not scales[-1].any()
    xd = F.dequantize_nvfp4(packed, scales, g)
    # each group: |error| <= half an E2M1 step at the group's scale (<= 1 at 6), relative bound
    gmax = np.abs(x.reshape(m, -1, 16)).max(-1, keepdims=True)
    err = np.abs(xd - x).reshape(m, -1, 16)
    assert (err <= gmax / 6 * 1.0 * 1.07 + 1e-30).all()


@SETTINGS
@given(st.integers(0, 2**31), st.integers(1, 3), st.floats(1e-4, 10))
def test_nvfp4_static_saturates(seed, m, gamma):
    x = _rows(seed, m, 64, zero_groups=False)
    packed, scales, g = F.quantize_nvfp4_static(x, gamma)
    assert (g == F32(gamma)).all()
    ref_p, ref_s = _rows_reference(x, g)
    assert np.array_equal(packed, ref_p) and np.array_equal(scales, ref_s)
    huge = np.full((1, 32), 6 * 448 * F32(gamma) * 4, F32)
    p, s, _ = F.quantize_nvfp4_static(huge, gamma)
    assert (s == 0x7E).all() and (F.unpack_e2m1(p) == 7).all()


def test_nvfp4_tensor_and_row_global_scales():
    x = _rows(3, 4, 64, zero_groups=False)
    p, s, a = F.quantize_nvfp4(x)
    assert a == F32(np.abs(x).max() / F32(2688))
    assert s.max() <= 0x7E and np.abs(F.dequantize_nvfp4(p, s, a) - x).max() <= np.abs(x).max() / 6
    row_alpha = np.array([0.01, 0.02, 0.03, 1.0], F32)
    p2, s2, a2 = F.quantize_nvfp4(x, row_alpha)
    for t in range(4):  # per-row scales behave as one static scale per row
        pt, st_, _ = F.quantize_nvfp4(x[t], row_alpha[t])
        assert np.array_equal(p2[t], pt) and np.array_equal(s2[t], st_)
    zp, zs, za = F.quantize_nvfp4(np.zeros((2, 32), F32))
    assert za == 1 and not zp.any() and not zs.any()
    with pytest.raises(ValueError):
        F.quantize_nvfp4(np.ones((1, 24), F32))


# ---------------------------------------------------------------- FP8 with scales

@SETTINGS
@given(st.integers(0, 2**31), st.integers(1, 5), st.integers(1, 300), st.sampled_from([-1, 0]))
def test_fp8_scaled_matches_ml_dtypes(seed, m, k, axis):
    r = np.random.default_rng(seed)
    x = F.to_bf16(r.standard_normal((m, k)) * 10.0 ** r.uniform(-20, 5))
    x[0] = 0                                                   # a zero slice along axis=-1
    codes, s = F.quantize_fp8(x, axis)
    amax = np.abs(x).max(axis)
    assert np.array_equal(s, np.maximum((amax / F32(448)).astype(F32), F32(1e-12)))
    v = np.clip((x / np.expand_dims(s, axis)).astype(F32), -448, 448)
    assert np.array_equal(codes, _ref_e4m3(v))
    back = F.dequantize_fp8(codes, s, axis)
    assert (np.abs(back - x) <= np.expand_dims(s, axis) * 16 + np.abs(x) / 16).all()
    if axis == -1:
        assert not codes[0].any() and s[0] == F32(1e-12)
