"""Number formats of `explain.formats`: BF16, FP8 E4M3, E2M1 and the two block-scaled forms.

Conversions are written from the bit layouts (no ml_dtypes at run time; the tests cross-check every
one against ml_dtypes). All roundings are to nearest, ties to even (RNE):

- BF16 (`explain.formats.bf16`): rn_bf16 of the top 16 bits of the FP32 value. A BF16 value is held
  as a float32 array whose elements are BF16-representable.
- E4M3 (`fp8/channel`, `fp8/token`): finite only, bias 7, 3 mantissa bits, largest magnitude 448.
  `e4m3_encode` is sat_e4m3 (what `cvt.rn.satfinite.e4m3x2.f32` does): magnitudes beyond 448 and
  infinities saturate to +-448, NaN maps to the NaN code 0x7F.
- E2M1 (`nvfp4/g16`): {0, .5, 1, 1.5, 2, 3, 4, 6} and sign (bit 3), saturating at 6. E2M1 has no
  NaN; a NaN input (a caller bug: the families never divide by a zero scale) maps to code 7 (+6).

Block-scaled encoders take float32 inputs and evaluate every FP32 operation op by op in float32, in
the order each docstring states (the order the families' numerics text gives).
"""
from __future__ import annotations

import numpy as np

F32 = np.float32
E4M3_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_GROUP = 16
FP8_SCALE_FLOOR = F32(1e-12)
E4M3_NAN_CODE = 0x7F


# ---------------------------------------------------------------- BF16

def bf16_bits(x) -> np.ndarray:
    """rn_bf16(x) as raw uint16 bits (NaN stays NaN, made quiet)."""
    u = np.asarray(x, F32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(x, F32))
    out = np.where(nan, (u >> 16) | 0x40, rounded)
    return out.astype(np.uint16)


def bf16_from_bits(bits) -> np.ndarray:
    """Widen raw BF16 bits (uint16) exactly to float32."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(F32)


def to_bf16(x) -> np.ndarray:
    """rn_bf16(x) as a float32 array of BF16-representable values."""
    return bf16_from_bits(bf16_bits(x))


# ---------------------------------------------------------------- minifloats

def _encode_minifloat(x, mbits: int, bias: int, maxval: float) -> np.ndarray:
    """RNE code of |x| (saturated to maxval, NaN to maxval) with the sign bit above the exponent.

    float32 input: the normal range rounds the FP32 bits to `mbits` mantissa bits (a mantissa
    carry lands on the next binade's code) and rebiases; the subnormal range is
    rint(|x| * 2^(bias-1+mbits)), an exact scaling. Other dtypes take the float64 path: e = max(floor(log2|x|), 1 - bias),
    m = rint(|x| / 2^(e - mbits)), code = (e + bias) * 2^mbits + m - 2^mbits."""
    xa = np.asarray(x)
    if xa.dtype != np.float32:
        return _encode_minifloat_f64(xa, mbits, bias, maxval)
    shape, xa = xa.shape, xa.reshape(-1)
    nan = np.isnan(xa)
    a = np.minimum(np.abs(xa), F32(maxval))
    a[nan] = maxval
    u = a.view(np.uint32)
    shift = 23 - mbits
    code = (u + np.uint32((1 << (shift - 1)) - 1) + ((u >> shift) & 1)) >> shift
    code -= np.uint32((127 - bias) << mbits)     # wraps below the normal range; replaced there
    sub = a < F32(2.0 ** (1 - bias))
    code[sub] = np.rint(a[sub] * F32(2.0 ** (bias - 1 + mbits))).astype(np.uint32)
    sign = (xa.view(np.uint32) >> 31) & ~nan
    return (code | (sign << np.uint32(mbits + _ebits(bias)))).reshape(shape)


def _encode_minifloat_f64(xa: np.ndarray, mbits: int, bias: int, maxval: float) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # widening a signalling NaN warns
        x64 = np.asarray(xa, np.float64)
    a = np.abs(x64)
    a = np.where(np.isnan(a), maxval, np.minimum(a, maxval))
    _, ex = np.frexp(a)
    e = np.maximum(ex.astype(np.int64) - 1, 1 - bias)
    m = np.rint(np.ldexp(a, (mbits - e).astype(np.int32))).astype(np.int64)
    code = np.where(a == 0, 0, (e + bias) * (1 << mbits) + m - (1 << mbits))
    sign = np.signbit(x64) & ~np.isnan(x64)
    return code + np.where(sign, 1 << (mbits + _ebits(bias)), 0)


def _ebits(bias: int) -> int:
    return {7: 4, 1: 2}[bias]


def _e4m3_table() -> np.ndarray:
    c = np.arange(256)
    e, m = (c >> 3) & 15, c & 7
    mag = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * 2.0 ** (e - 7.0))
    val = np.where(c >> 7, -mag, mag)
    val[(c & 0x7F) == 0x7F] = np.nan
    return val.astype(F32)


def _e2m1_table() -> np.ndarray:
    mag = np.array([0, .5, 1, 1.5, 2, 3, 4, 6], F32)
    return np.concatenate([mag, -mag]).astype(F32)


E4M3_VALUES = _e4m3_table()
E2M1_VALUES = _e2m1_table()


def e4m3_encode(x) -> np.ndarray:
    """sat_e4m3(x): RNE to E4M3, saturating at +-448 (infinities too); NaN -> 0x7F."""
    xa = np.asarray(x)
    code = _encode_minifloat(xa, 3, 7, E4M3_MAX)
    code = np.where(np.isnan(xa), E4M3_NAN_CODE, code)
    return code.astype(np.uint8)


def e4m3_decode(codes) -> np.ndarray:
    """E4M3 codes (uint8) to float32 (0x7F / 0xFF decode to NaN)."""
    return E4M3_VALUES[np.asarray(codes, np.uint8)]


def e2m1_encode(x) -> np.ndarray:
    """rn_e2m1(x): codes 0..15 (bit 3 = sign), RNE on the E2M1 grid, saturating at +-6."""
    return _encode_minifloat(x, 1, 1, E2M1_MAX).astype(np.uint8)


def e2m1_decode(codes) -> np.ndarray:
    """E2M1 codes (0..15, uint8) to float32."""
    return E2M1_VALUES[np.asarray(codes, np.uint8) & 15]


def pack_e2m1(codes) -> np.ndarray:
    """Pack E2M1 codes (..., K) two per byte (..., K/2); the even element is the low nibble."""
    c = np.asarray(codes, np.uint8)
    if c.shape[-1] % 2:
        raise ValueError(f"pack_e2m1 needs an even last axis, got {c.shape[-1]}")
    return (c[..., 0::2] & 15) | ((c[..., 1::2] & 15) << 4)


def unpack_e2m1(packed) -> np.ndarray:
    """Inverse of `pack_e2m1`: bytes (..., K/2) to codes (..., K)."""
    p = np.asarray(packed, np.uint8)
    out = np.empty(p.shape[:-1] + (2 * p.shape[-1],), np.uint8)
    out[..., 0::2] = p & 15
    out[..., 1::2] = p >> 4
    return out


# ---------------------------------------------------------------- NVFP4 (nvfp4/g16)

def _groups(x: np.ndarray) -> np.ndarray:
    if x.shape[-1] % NVFP4_GROUP:
        raise ValueError(f"NVFP4 needs K a multiple of {NVFP4_GROUP}, got {x.shape[-1]}")
    return x.reshape(x.shape[:-1] + (x.shape[-1] // NVFP4_GROUP, NVFP4_GROUP))


def _encode_values(xg: np.ndarray, s_codes: np.ndarray, g: np.ndarray):
    """q = rn_e2m1(x / f32(s * g)), zero where the group scale s is zero."""
    s = e4m3_decode(s_codes)[..., None]
    denom = (s * g[..., None, None]).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (xg / denom).astype(F32)
    codes = np.where(s == 0, 0, e2m1_encode(ratio)).astype(np.uint8)
    return pack_e2m1(codes.reshape(codes.shape[:-2] + (-1,)))


def quantize_nvfp4(x, global_scale=None):
    """NVFP4 encode of `explain.formats["nvfp4/g16"].encode`, in FP32, op by op:

        alpha = max|x| / (6*448)              (None: per tensor; 1 for an all-zero tensor)
        s_b   = sat_e4m3(max_b|x| / (6*alpha))   (6*alpha rounded first)
        q_j   = rn_e2m1(x_j / (alpha*s_b))       (alpha*s_b rounded first; 0 when s_b = 0)

    global_scale may be a scalar (static) or an array of shape x.shape[:-1] (per row).
    Returns (packed codes uint8 (..., K/2), scale codes uint8 (..., K/16), alpha float32)."""
    x = np.asarray(x, F32)
    xg = _groups(x)
    if global_scale is None:
        amax = np.max(np.abs(x)) if x.size else F32(0)
        alpha = F32(amax / F32(6 * E4M3_MAX)) if amax > 0 else F32(1)
    else:
        alpha = np.asarray(global_scale, F32)
    g = np.broadcast_to(alpha, x.shape[:-1]).astype(F32)
    six_g = (F32(6) * g).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        s_codes = e4m3_encode((np.max(np.abs(xg), axis=-1) / six_g[..., None]).astype(F32))
    return _encode_values(xg, s_codes, g), s_codes, np.asarray(alpha, F32)


def _quantize_rows_scaled(x: np.ndarray, g: np.ndarray):
    """w4a4_mx order with row global scale g (shape x.shape[:-1]):
    s = sat_e4m3(f32(max_b|x| / 6) * f32(1/g)); a = rn_e2m1(x / f32(s*g)), 0 when s = 0."""
    xg = _groups(x)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv_g = (F32(1) / g).astype(F32)
        gmax6 = (np.max(np.abs(xg), axis=-1) / F32(6)).astype(F32)
        s_codes = e4m3_encode((gmax6 * inv_g[..., None]).astype(F32))
    return _encode_values(xg, s_codes, g), s_codes


def quantize_nvfp4_rows(x):
    """w4a4_mx dynamic per-row activation quantization (the family's numerics, in its order):

        g_t = f32(max_k|x_tk| / 2688), or 1 for an all-zero row
        s   = sat_e4m3(f32(max_{i<16}|x| / 6) * f32(1 / g_t))
        a   = rn_e2m1(x / f32(s * g_t)), zero when s is zero

    x: (..., K) float32 (BF16 values). Returns (packed uint8 (..., K/2), scales uint8 (..., K/16),
    g float32 (...))."""
    x = np.asarray(x, F32)
    amax = np.max(np.abs(x), axis=-1)
    g = np.where(amax > 0, (amax / F32(6 * E4M3_MAX)).astype(F32), F32(1)).astype(F32)
    packed, s_codes = _quantize_rows_scaled(x, g)
    return packed, s_codes, g


def quantize_nvfp4_static(x, input_scale):
    """w4a4_mx_static row quantization: as `quantize_nvfp4_rows` with g fixed to gamma =
    input_scale (a scalar, or one per row). Returns (packed, scales, g float32 per row)."""
    x = np.asarray(x, F32)
    g = np.broadcast_to(np.asarray(input_scale, F32), x.shape[:-1]).astype(F32)
    packed, s_codes = _quantize_rows_scaled(x, g)
    return packed, s_codes, g


def nvfp4_group_values(packed, scales_e4m3) -> tuple[np.ndarray, np.ndarray]:
    """(E2M1 values (..., K), decoded group scales (..., K/16)) as float32."""
    return e2m1_decode(unpack_e2m1(packed)), e4m3_decode(scales_e4m3)


def dequantize_nvfp4(packed, scales_e4m3, global_scale, shape=None) -> np.ndarray:
    """x = f32(f32(alpha * s_b) * q_j): the scale product is formed first, as the GEMVs do."""
    q, s = nvfp4_group_values(packed, scales_e4m3)
    alpha = np.asarray(global_scale, F32)
    if alpha.ndim:
        alpha = alpha[..., None]
    scale = (alpha * s).astype(F32)
    out = (_groups(q) * scale[..., None]).astype(F32).reshape(q.shape)
    return out if shape is None else out.reshape(shape)


# ---------------------------------------------------------------- FP8 with a scale per slice

def quantize_fp8(x, axis: int = -1):
    """E4M3 with one FP32 scale per slice along `axis` (fp8/token, fp8/channel, w8a8_act_quant):

        s = max(f32(max|x| over axis / 448), 1e-12)
        q = sat_e4m3(min(max(f32(x / s), -448), 448))

    axis=-1 is per token for activations (m, K) and per output channel for weights (N, K).
    Returns (codes uint8 shaped like x, scales float32 with `axis` removed)."""
    x = np.asarray(x, F32)
    amax = np.max(np.abs(x), axis=axis, keepdims=True)
    s = np.maximum((amax / F32(E4M3_MAX)).astype(F32), FP8_SCALE_FLOOR).astype(F32)
    v = np.clip((x / s).astype(F32), -E4M3_MAX, E4M3_MAX).astype(F32)
    return e4m3_encode(v), np.squeeze(s, axis=axis)


def dequantize_fp8(codes, scales, axis: int = -1) -> np.ndarray:
    """x = f32(s * q) with s broadcast along `axis`."""
    s = np.expand_dims(np.asarray(scales, F32), axis)
    return (e4m3_decode(codes) * s).astype(F32)
