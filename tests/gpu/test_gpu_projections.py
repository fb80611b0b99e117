"""GPU tests of the projection kernels (dense_bf16, w4a16_gemv, w4a4_mx, w4a4_mx_static, wxay,
w8a8_act_quant) against kbpc.reference, at the seed's shapes and at small odd-but-legal shapes,
launched through the product's launchers with the lowerings' instances (kbpc.testing.instances;
the pointer-table segment GEMVs and the SiLU / group-128 quantizers are the headers' own
__global__ forms, which no lowering launches).

Fresh random inputs every run; outputs are poisoned and checked fully written (`fetch`).
Tolerances (only where the math does not fix every rounding):
- exact (bit-identical BF16/E4M3/FP32 bytes): dense_bf16, w4a16 chunk walk and segments, w4a4
  quantizers and GEMVs (the sm_90 path takes every chunk sum exactly, as the reference does),
  w8a8 plain quantizers.
- w4a4 fast forms (numerics fast: FP32 accumulation): within gemv_bounds.w4a4_fast_bound of the
  reference before the BF16 rounding (a bound in units of sum |w x|).
- wxay: the m16n8k32 MMA's internal accumulation is unspecified (the reference takes each chunk
  sum exactly), so each chunk sum may differ by a few FP32 ulps before the single BF16 rounding:
  >= 99.9% of outputs identical, all within 1 BF16 ulp of the reference's magnitude scale.
- silu forms (w4a16 silu-input, w8a8 silu quantizers): CUDA's expf / __expf differ from the
  correctly rounded exp by a few FP32 ulps, which can flip a BF16 / E4M3 rounding: >= 99% identical,
  differences at most 1 BF16 ulp (GEMV, relative to the row's largest output) or 1 E4M3 step.
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import w4a4_mx as lower_w4a4
from kbpc.codegen.families import w8a8_act_quant
from kbpc.codegen.families._projection import BF16, BLOCK
from kbpc.reference import dense_bf16 as ref_dense
from kbpc.reference import w4a4_mx as ref_w4a4
from kbpc.reference import w4a4_mx_static as ref_w4a4s
from kbpc.reference import w4a16_gemv as ref_w4a16
from kbpc.reference import w8a8_act_quant as ref_w8a8
from kbpc.reference import wxay as ref_wxay
from kbpc.reference.formats import bf16_bits, bf16_from_bits, quantize_fp8, quantize_nvfp4, to_bf16
from kbpc.reference.gemv_bounds import w4a4_fast_bound, within
from kbpc.testing import instances as ki
from kbpc.testing.launchers import launcher

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng()  # fresh inputs every run; failures print the shapes


def _gpu():
    from kbpc.testing import gpu  # noqa: PLC0415
    return gpu


def bf16_input(shape, scale=1.0):
    return to_bf16(RNG.standard_normal(shape).astype(np.float32) * np.float32(scale))


def nvfp4_weight(n, k):
    """(packed, scales, s_g) of a random NVFP4 weight with realistic group-scale spread."""
    w = RNG.standard_normal((n, k)).astype(np.float32) * np.exp(RNG.standard_normal((n, 1))).astype(np.float32)
    return quantize_nvfp4(w * np.float32(0.02))


def assert_bf16_equal(got_bits, want, what):
    want_bits = bf16_bits(want)
    bad = np.flatnonzero(got_bits.reshape(-1) != want_bits.reshape(-1))
    assert bad.size == 0, (f"{what}: {bad.size} of {want_bits.size} differ, first {bad[:5]}: got "
                           f"{bf16_from_bits(got_bits.reshape(-1)[bad[:5]])} want {want.reshape(-1)[bad[:5]]}")


def assert_bf16_close(got_bits, want, what, frac_equal):
    got = bf16_from_bits(got_bits).reshape(want.shape)
    assert not np.isnan(got).any(), f"{what}: NaN"
    ulp = np.abs(want).max(axis=-1, keepdims=True) * 2.0 ** -8  # 1 BF16 ulp of the row's scale
    assert (np.abs(got - want) <= ulp).all(), f"{what}: max diff {np.abs(got - want).max()}"
    differ = int(np.sum(bf16_bits(want).reshape(-1) != got_bits.reshape(-1)))
    # frac_equal is a rate (each output's FP32 sum may land near a BF16 rounding boundary, where the
    # MMA's own order can flip it), so a small output gets the rate's count plus three standard
    # deviations of it and one more: 512 outputs at 0.999 may hold 3 differing ones (a 512-row
    # segment with one, 0.998 identical, failed the plain rate on an H200).
    n = want.size
    allowed = int((1 - frac_equal) * n + 3 * np.sqrt(n * (1 - frac_equal)) + 1)
    assert differ <= allowed, f"{what}: {differ} of {n} outputs differ (at most {allowed} for {frac_equal} identical)"


def seg_table(segs, record) -> np.ndarray:
    """Pack device segment tables (W4A16Seg / WxaySeg: 32 bytes each) from tuples of fields."""
    dt = np.dtype(record)
    assert dt.itemsize == 32
    return np.array([tuple(s) for s in segs], dt).view(np.uint8)


W4A16_SEG = [("codes", "<u8"), ("scales", "<u8"), ("y", "<u8"), ("g", "<f4"), ("n", "<i4")]
WXAY_SEG = [("w", "<u8"), ("s", "<u8"), ("y", "<u8"), ("n", "<i4"), ("pad", "<i4")]

# (n, k) and (k, segment widths) of each test: the seed's shapes, then small odd-but-legal ones.
DENSE_SHAPES = [(154880, 4096), (4096, 4096), (48, 2176), (5, 8), (7, 520)]
W4A16_SHAPES = [(8192, 4096), (4096, 8192), (48, 2176), (3, 16), (37, 1040)]
W4A16_SEGMENTS = [(4096, (4096, 4096, 4096, 32, 32, 32)), (2176, (48, 4, 17))]
W4A16_SILU_SHAPES = [(4096, 2048), (48, 2176)]
W4A4_QUANT_KS = [4096, 2176, 2048, 12288]
W4A4_SHAPES = [(4096, 4096), (4096, 2048), (48, 2176), (16, 128)]
W4A4_MOE_SHAPES = [(4096, 4096, 16, 8, True), (4096, 2048, 16, 8, False), (48, 2176, 5, 4, True)]
WXAY_SHAPES = [(1536, 4096), (16384, 1536), (4096, 16384), (48, 2176)]
WXAY_SPLITS = [(4096, (1536, 512, 128, 32)), (2176, (48, 16))]
W8A8_KS = [4096, 12288, 18432, 2176, 520]
W8A8_SILU_KS = [2048, 6144, 2176]


def instances():
    """Every kernel instance this module launches (tests/nvcc/test_gpu_test_instances.py builds them)."""
    out = [ki.dense(k, o) for _, k in DENSE_SHAPES for o in (BF16, "float")]
    out += [ki.w4a16(k) for _, k in W4A16_SHAPES] + [ki.w4a16_seg(k) for k, _ in W4A16_SEGMENTS]
    out += [ki.w4a16_silu_input(k) for _, k in W4A16_SILU_SHAPES]
    out += [ki.w4a4_quant_rows(k) for k in {*W4A4_QUANT_KS, *(k for _, k in W4A4_SHAPES)}]
    out += [ki.w4a4_quant_rows_static(k) for k in {*W4A4_QUANT_KS, *(k for _, k, *_ in W4A4_MOE_SHAPES)}]
    out += [ki.w4a4_gemv(k, f) for _, k in W4A4_SHAPES for f in (False, True)]
    out += [ki.w4a4_moe_slots(k, f, t) for _, k, *_ in W4A4_MOE_SHAPES for f in (False, True) for t in (1, 2)]
    out += [ki.wxay_rowscale(k) for _, k in WXAY_SHAPES] + [ki.wxay_split(k) for k, _ in WXAY_SPLITS]
    out += [ki.w8a8_quant(k, f) for k in W8A8_KS for f in ("row", "g128") if f == "row" or k % 128 == 0]
    out += [ki.w8a8_quant(k, "row", s) for k in W8A8_KS for s in _w8a8_splits(k) if s > 1]
    out += [ki.w8a8_quant_cluster(k, cl) for k in W8A8_KS for cl in _w8a8_clusters(k)]
    out += [ki.w8a8_quant(k, f) for k in W8A8_SILU_KS for f in ("silu_row", "silu_g128")]
    return out


# ------------------------------------------------------------------ dense_bf16

@pytest.mark.parametrize("n,k", DENSE_SHAPES)
def test_dense_bf16(n, k):
    g = _gpu()
    w, x = bf16_input((n, k), 0.05), bf16_input((k,))
    wd, xd = g.to_gpu(bf16_bits(w)), g.to_gpu(bf16_bits(x))
    y16, y32 = g.poisoned((n,), np.uint16), g.poisoned((n,), np.float32)
    grid = ((n + 3) // 4, 1, 1)   # the 256-thread form: 4 outputs per CTA
    launcher(ki.dense(k, BF16))(grid, BLOCK, wd, xd, y16, np.int32(n))
    launcher(ki.dense(k, "float"))(grid, BLOCK, wd, xd, y32, np.int32(n))
    assert_bf16_equal(g.fetch(y16), ref_dense.dense_gemv_bf16(x, w)[0], "dense bf16")
    want32 = ref_dense.dense_gemv_bf16(x, w, out_dtype="f32")[0]
    assert np.array_equal(g.fetch(y32).view(np.uint32), want32.view(np.uint32)), "dense f32 out"


# ------------------------------------------------------------------ w4a16

@pytest.mark.parametrize("n,k", W4A16_SHAPES)
def test_w4a16_gemv(n, k):
    g = _gpu()
    packed, scales, sg = nvfp4_weight(n, k)
    x = bf16_input((k,))
    y = g.poisoned((n,), np.uint16)
    launcher(ki.w4a16(k))(((n + 15) // 16, 1, 1), BLOCK, g.to_gpu(packed), g.to_gpu(scales), np.float32(sg),
                          g.to_gpu(bf16_bits(x)), y, np.int32(n))
    assert_bf16_equal(g.fetch(y), ref_w4a16.w4a16_gemv(x, packed, scales, sg)[0], "w4a16_gemv")


def run_w4a16_segments(inst, ns, k, block, grid):
    """Fresh x and weights of widths ns, launched once through `inst`: a pointer-table form (table,
    nseg, x) or a by-value W4A16SegList form (list, x); returns (x, weights, outputs)."""
    g = _gpu()
    x = bf16_input((k,))
    weights = [nvfp4_weight(n, k) for n in ns]
    dev = [(g.to_gpu(p), g.to_gpu(s)) for p, s, _ in weights]
    ys = [g.poisoned((n,), np.uint16) for n in ns]
    table = seg_table([(int(p.gpudata), int(s.gpudata), int(y.gpudata), float(sg), n)
                       for (p, s), y, (_, _, sg), n in zip(dev, ys, weights, ns)], W4A16_SEG)
    by_value = inst.params[0].startswith("kbp::W4A16SegList")
    head = (table,) if by_value else (g.to_gpu(table), np.int32(len(ns)))
    launcher(inst)(grid, block, *head, g.to_gpu(bf16_bits(x)))
    return x, weights, ys


@pytest.mark.parametrize("k,ns", W4A16_SEGMENTS)
def test_w4a16_segments(k, ns):
    g = _gpu()
    x, weights, ys = run_w4a16_segments(ki.w4a16_seg(k), ns, k, BLOCK, (sum((n + 15) // 16 for n in ns), 1, 1))
    want = ref_w4a16.w4a16_gemv_segments(x, weights)
    for i, (y, wv) in enumerate(zip(ys, want)):
        assert_bf16_equal(g.fetch(y, f"segment {i}"), wv[0], f"segment {i}")


@pytest.mark.parametrize("n,k", W4A16_SILU_SHAPES)
def test_w4a16_silu_input(n, k):
    g = _gpu()
    packed, scales, sg = nvfp4_weight(n, k)
    gate, up = bf16_input((k,), 2.0), bf16_input((k,))
    y = g.poisoned((n,), np.uint16)
    launcher(ki.w4a16_silu_input(k))(((n + 15) // 16, 1, 1), BLOCK, g.to_gpu(packed), g.to_gpu(scales), np.float32(sg),
                                     g.to_gpu(bf16_bits(gate)), g.to_gpu(bf16_bits(up)), y, np.int32(n))
    want = ref_w4a16.w4a16_gemv_silu_input(gate, up, packed, scales, sg)
    assert_bf16_close(g.fetch(y)[None], want, "w4a16 silu input", 0.99)


# ------------------------------------------------------------------ w4a4 (dynamic and static)

def _quant_rows(g, x, gamma=None, split=None):
    """The planar nvfp4/g16 rows of x: dynamic (w4a4_quant_rows) or with the static scale gamma
    (w4a4_quant_rows_static), `split` CTAs a row (the product's w4a4_mx.quant_split by default)."""
    m, k = x.shape
    c, s, a = g.poisoned((m, k // 2), np.uint8), g.poisoned((m, k // 16), np.uint8), g.poisoned((m,), np.float32)
    xd = g.to_gpu(bf16_bits(x))
    split = lower_w4a4.quant_split(k) if split is None else split
    if gamma is None:
        launcher(ki.w4a4_quant_rows(k))((m, split, 1), BLOCK, xd, c, s, a)
    else:
        launcher(ki.w4a4_quant_rows_static(k))((m, split, 1), BLOCK, xd, np.float32(gamma), c, s, a)
    return c, s, a


def _check_quant(g, got, want, what):
    """Exact byte comparison. Code bytes may legitimately be 0xFF (codes -6, -6), the poison byte, so
    they skip the poison check: the exact comparison against the reference covers them."""
    for arr, w, name in zip(got, want, ("codes", "scales", "g")):
        host = g.fetch(arr, name, allow_nan=name == "codes")
        assert np.array_equal(host.view(np.uint8), np.asarray(w).view(np.uint8)), f"{what} {name}"


@pytest.mark.parametrize("k", W4A4_QUANT_KS)
def test_w4a4_quant_rows(k):
    g = _gpu()
    x = bf16_input((3, k))
    x[1] = 0.0  # an all-zero row: g = 1
    x[2, :16] = 0.0  # a zero group
    want = ref_w4a4.quantize_rows(x)
    for split in sorted({lower_w4a4.quant_split(k), 1, 3}):   # any number of CTAs a row: the same bytes
        c, s, a = _quant_rows(g, x, split=split)
        _check_quant(g, (c, s, a), want, f"dynamic, {split} CTAs a row")
    gamma = np.float32(np.abs(x).max() / 2688 * 0.5)  # some values saturate
    want = ref_w4a4s.quantize_rows_static(x, gamma)
    for split in sorted({lower_w4a4.quant_split(k), 1, 3}):
        c, s, a = _quant_rows(g, x, gamma, split=split)
        _check_quant(g, (c, s, a), want, f"static, {split} CTAs a row")


def _check_w4a4(got_bits, want, bounds, fast, what):
    """Exact: the reference's bytes. Fast: within its bound (kbpc.reference.gemv_bounds.w4a4_fast_bound)
    of the reference before the BF16 roundings."""
    if not fast:
        assert_bf16_equal(got_bits, want, what)
        return
    got = bf16_from_bits(got_bits).reshape(want.shape).astype(np.float64)
    ok = within(got, want, np.asarray(bounds).reshape(want.shape))
    assert ok.all(), f"{what} (fast): {np.size(ok) - int(ok.sum())} outside the bound, max diff {np.abs(got - want).max()}"


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("n,k", W4A4_SHAPES)
def test_w4a4_gemv(n, k, fast):
    g = _gpu()
    packed, scales, sg = nvfp4_weight(n, k)
    x = bf16_input((1, k))
    c, s, a = _quant_rows(g, x)
    y = g.poisoned((n,), np.uint16)
    launcher(ki.w4a4_gemv(k, fast))((n // 16, 1, 1), BLOCK, c, s, a, g.to_gpu(packed), g.to_gpu(scales), np.float32(sg),
                                    y, np.int32(n))
    q = ref_w4a4.quantize_rows(x)
    bound = w4a4_fast_bound(q[0][0], q[1][0], q[2][0], packed, scales, sg)
    _check_w4a4(g.fetch(y), ref_w4a4.w4a4_mx(x, packed, scales, sg)[0], bound, fast, "w4a4_gemv")


@pytest.mark.parametrize("tiles", [1, 2])
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("n,k,experts,top_k,shared", W4A4_MOE_SHAPES)
def test_w4a4_moe_slots(n, k, experts, top_k, shared, fast, tiles):
    """Each slot's row through its expert; tiles 16-row tiles a CTA (two: the lowering's form for
    K <= 2048) compute the same bytes: exact the reference's, fast within its bound."""
    if n % (16 * tiles):
        pytest.skip(f"N = {n} is not a whole number of {tiles}-tile CTAs")
    g = _gpu()
    stack = [nvfp4_weight(n, k) for _ in range(experts)]
    wp = np.stack([p for p, _, _ in stack]); ws = np.stack([s for _, s, _ in stack])
    wg = np.array([x for _, _, x in stack], np.float32)
    ids = RNG.choice(experts, top_k, replace=False).astype(np.int32)
    ids[RNG.integers(top_k)] = -1  # an empty slot
    rows = 1 if shared else top_k
    x = bf16_input((rows, k))
    gamma = np.float32(np.abs(x).max() / 2688)
    c, s, a = _quant_rows(g, x, gamma)
    y = g.poisoned((top_k, n), np.uint16)
    launcher(ki.w4a4_moe_slots(k, fast, tiles))((n // (16 * tiles), top_k, 1), BLOCK, g.to_gpu(ids),
                                                np.int32(top_k if shared else 1), c, s, a, g.to_gpu(wp),
                                                g.to_gpu(ws), g.to_gpu(wg), y, np.int32(n))
    xin = x[0] if shared else x
    want = ref_w4a4s.w4a4_static_moe_slots(xin, gamma, wp, ws, wg, ids)
    q = ref_w4a4s.quantize_rows_static(x, gamma)
    bounds = np.zeros((top_k, n))
    for slot, e in enumerate(ids):   # an empty slot (-1) writes +0 in both forms: bound 0
        r = 0 if shared else slot
        if e >= 0:
            bounds[slot] = w4a4_fast_bound(q[0][r], q[1][r], q[2][r], wp[e], ws[e], wg[e])
    _check_w4a4(g.fetch(y), want, bounds, fast, "w4a4 moe slots")


# ------------------------------------------------------------------ wxay

def fp8_weight(n, k):
    return quantize_fp8(RNG.standard_normal((n, k)).astype(np.float32) * np.float32(0.02), axis=-1)


@pytest.mark.parametrize("n,k", WXAY_SHAPES)
def test_wxay_rowscale(n, k):
    g = _gpu()
    wc, wsc = fp8_weight(n, k)
    ac, asc = quantize_fp8(bf16_input((1, k)), axis=-1)
    y = g.poisoned((n,), np.uint16)
    launcher(ki.wxay_rowscale(k))((n // 16, 1, 1), BLOCK, g.to_gpu(ac), g.to_gpu(asc), g.to_gpu(wc), g.to_gpu(wsc), y,
                                  np.int32(n))
    assert_bf16_close(g.fetch(y)[None], ref_wxay.wxay_rowscale(ac, asc, wc, wsc), "wxay", 0.999)


@pytest.mark.parametrize("k,ns", WXAY_SPLITS)
def test_wxay_split(k, ns):
    g = _gpu()
    weights = [fp8_weight(n, k) for n in ns]
    ac, asc = quantize_fp8(bf16_input((1, k)), axis=-1)
    dev = [(g.to_gpu(c), g.to_gpu(s)) for c, s in weights]
    ys = [g.poisoned((n,), np.uint16) for n in ns]
    table = seg_table([(int(c.gpudata), int(s.gpudata), int(y.gpudata), n, 0) for (c, s), y, n in zip(dev, ys, ns)],
                      WXAY_SEG)
    launcher(ki.wxay_split(k))((sum(n // 16 for n in ns), 1, 1), BLOCK, g.to_gpu(table), np.int32(len(ns)),
                               g.to_gpu(ac), g.to_gpu(asc))
    for i, (y, want) in enumerate(zip(ys, ref_wxay.wxay_split(ac, asc, weights))):
        assert_bf16_close(g.fetch(y, f"split {i}")[None], want, f"split {i}", 0.999)


# ------------------------------------------------------------------ w8a8_act_quant

def _w8a8_splits(k):
    """The lowering's CTAs per row for k, and every other split the row's 256-vector slices allow
    up to 3 (the split form must give the same bytes whatever the split)."""
    slices = -(-(k // 8) // BLOCK[0])
    return sorted({w8a8_act_quant.row_split(k), *range(1, min(slices, 3) + 1)})


@pytest.mark.parametrize("k", W8A8_KS)
def test_w8a8_act_quant_split_rows(k):
    g = _gpu()
    m = 3
    x = bf16_input((m, k), 3.0)
    x[2, k // 3] = -97.0  # the max sits in one CTA's slice only
    xd = g.to_gpu(bf16_bits(x))
    wq, ws = ref_w8a8.quant_row(x)
    for split in _w8a8_splits(k):
        q, s = g.poisoned((m, k), np.uint8), g.poisoned((m,), np.float32)
        launcher(ki.w8a8_quant(k, "row", split))((m, split, 1), BLOCK, xd, q, s)
        assert np.array_equal(g.fetch(q), wq) and np.array_equal(g.fetch(s), ws), f"split {split}"


def _w8a8_clusters(k):
    """The lowering's cluster width for k on Hopper, and 1, 3 and 16 (any width gives the same bytes)."""
    return sorted({w8a8_act_quant.row_cluster(k, 16) or 1, 1, 3, 16})


@pytest.mark.parametrize("k", W8A8_KS)
def test_w8a8_act_quant_cluster_rows(k):
    """One thread-block cluster a row: the reference's bytes (those of every split form) at every
    cluster width, with the row's max in one CTA's share, an all-zero row and huge values."""
    g = _gpu()
    m = 4
    x = bf16_input((m, k), 3.0)
    x[2, k // 3] = -97.0
    x[1] = 0.0
    x[3] *= np.float32(2e4)
    x = to_bf16(x)
    xd = g.to_gpu(bf16_bits(x))
    wq, ws = ref_w8a8.quant_row(x)
    for cl in _w8a8_clusters(k):
        q, s = g.poisoned((m, k), np.uint8), g.poisoned((m,), np.float32)
        for _ in range(2):   # launch after launch: nothing carries over
            launcher(ki.w8a8_quant_cluster(k, cl))((cl, m, 1), BLOCK, xd, q, s)
        assert np.array_equal(g.fetch(q), wq) and np.array_equal(g.fetch(s), ws), f"cluster {cl}"


@pytest.mark.parametrize("k", W8A8_KS)
def test_w8a8_act_quant(k):
    g = _gpu()
    m = 3
    x = bf16_input((m, k), 3.0)
    x[1] = 0.0
    xd = g.to_gpu(bf16_bits(x))
    q, s = g.poisoned((m, k), np.uint8), g.poisoned((m,), np.float32)
    launcher(ki.w8a8_quant(k, "row"))((m, 1, 1), BLOCK, xd, q, s)
    wq, ws = ref_w8a8.quant_row(x)
    assert np.array_equal(g.fetch(q), wq) and np.array_equal(g.fetch(s), ws), "per-token"
    if k % 128 == 0:
        q, s = g.poisoned((m, k), np.uint8), g.poisoned((m, k // 128), np.float32)
        launcher(ki.w8a8_quant(k, "g128"))((m, 1, 1), BLOCK, xd, q, s)
        wq, ws = ref_w8a8.quant_g128(x)
        assert np.array_equal(g.fetch(q), wq) and np.array_equal(g.fetch(s), ws), "g128"


def _e4m3_close(got, want, what):
    """Codes within one E4M3 step (same sign; adjacent codes are adjacent values), >= 99% equal."""
    d = np.abs(got.astype(np.int16) - want.astype(np.int16))
    assert (d <= 1).all(), f"{what}: code differs by {d.max()}"
    assert np.mean(d == 0) >= 0.99, f"{what}: only {np.mean(d == 0):.4f} identical"


@pytest.mark.parametrize("k", W8A8_SILU_KS)
def test_w8a8_act_quant_silu(k):
    g = _gpu()
    m = 2
    gate, up = bf16_input((m, k), 3.0), bf16_input((m, k))
    gd, ud = g.to_gpu(bf16_bits(gate)), g.to_gpu(bf16_bits(up))
    q, s = g.poisoned((m, k), np.uint8), g.poisoned((m,), np.float32)
    launcher(ki.w8a8_quant(k, "silu_row"))((m, 1, 1), BLOCK, gd, ud, q, s)
    wq, ws = ref_w8a8.quant_silu_row(gate, up)
    _e4m3_close(g.fetch(q), wq, "silu row")
    assert np.allclose(g.fetch(s), ws, rtol=2 ** -7, atol=0), "silu row scale"  # max moves <= 1 bf16 ulp
    q, s = g.poisoned((m, k), np.uint8), g.poisoned((m, k // 128), np.float32)
    launcher(ki.w8a8_quant(k, "silu_g128"))((m, 1, 1), BLOCK, gd, ud, q, s)
    wq, ws = ref_w8a8.quant_silu_g128(gate, up)
    _e4m3_close(g.fetch(q), wq, "silu g128")
    assert np.allclose(g.fetch(s), ws, rtol=2 ** -7, atol=0), "silu g128 scale"
