"""Sanity of the fast MLA decode's bound (kbpc.reference.glm_mla_decode_fast.fast_bound) on the CPU,
without the kernel (tests/gpu/test_gpu_mla_decode_fast.py checks the kernel itself): the reference
lies within it of the float64 softmax, so does a float32 evaluation in another order (per slice,
numpy's own summation order, a flat merge), it is zero where nothing is attended, and it is far
below a BF16 ulp at the seed's sizes, so it still asks for agreement to BF16 rounding."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.reference.formats import e4m3_decode, e4m3_encode, to_bf16
from kbpc.reference.gemv_bounds import bf16_ulp, within
from kbpc.reference.glm_mla_decode import mla_decode
from kbpc.reference.glm_mla_decode_fast import fast_bound, fast_k, fast_split, reference_k

F32 = np.float32


def _inputs(rng, heads, width, seq_len, spread):
    cache = e4m3_encode(rng.normal(0, 2, (seq_len, 512)).astype(F32))
    q = to_bf16(rng.normal(0, spread, (heads, 512)).astype(F32))
    sel = rng.integers(-1, seq_len, width).astype(np.int32)
    sel[1::7] = sel[0]                                   # duplicates
    return cache, q, sel, F32(rng.choice([1.0, 0.5, 1.3]))


def _exact(q, cache, sel, seq_len, s_k):
    """float64 softmax over v* = s_k c^ with the f32 constant 1/sqrtf(E)."""
    ok = (sel >= 0) & (sel < seq_len)
    v = e4m3_decode(cache[sel[ok]]).astype(np.float64) * float(s_k)
    z = (q.astype(np.float64) @ v.T) * float(F32(1) / np.sqrt(F32(512)))
    w = np.exp(z - z.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)) @ v


def _fast_model(q, cache, sel, seq_len, s_k, slices):
    """The fast form's math in float32, numpy's summation order: per slice m, l, o; a flat merge."""
    scale = (F32(1) / np.sqrt(F32(512))).astype(F32)
    parts = []
    for s in range(slices):
        ids = sel[s::slices]
        ids = ids[(ids >= 0) & (ids < seq_len)]
        if ids.size == 0:
            continue
        c = e4m3_decode(cache[ids]).astype(F32)
        z = (((q @ c.T).astype(F32) * s_k).astype(F32) * scale).astype(F32)
        m = z.max(axis=1, keepdims=True)
        p = np.exp((z - m).astype(np.float64)).astype(F32)
        parts.append((m, p.sum(axis=1, keepdims=True, dtype=F32), (p @ c).astype(F32)))
    if not parts:
        return np.zeros(q.shape, F32)
    top = np.max([m for m, _, _ in parts], axis=0)
    f = [np.exp((m - top).astype(np.float64)).astype(F32) for m, _, _ in parts]
    lsum = np.sum([(l * g).astype(F32) for (_, l, _), g in zip(parts, f)], axis=0, dtype=F32)
    osum = np.sum([(o * g).astype(F32) for (_, _, o), g in zip(parts, f)], axis=0, dtype=F32)
    return to_bf16(((osum * s_k).astype(F32) / lsum).astype(F32))


@pytest.mark.parametrize("heads,width,seq_len,spread", [(32, 2052, 16384, 0.3), (16, 1024, 1024, 0.05),
                                                         (4, 37, 100, 2.0), (2, 8, 10, 0.5)])
def test_reference_and_a_float32_order_within_the_bound(heads, width, seq_len, spread):
    rng = np.random.default_rng()
    cache, q, sel, s_k = _inputs(rng, heads, width, seq_len, spread)
    split = fast_split(heads, width, 1, 132, 512)
    rows = lambda ids: cache[ids]   # noqa: E731
    ref = mla_decode(q, rows, sel, seq_len, s_k)
    bound = fast_bound(q, rows, sel, seq_len, s_k, split.slices, split.chunk)
    exact = _exact(q, cache, sel, seq_len, s_k)
    # the reference is one side of the bound: within it (and half a BF16 ulp) of the exact value
    assert np.all(np.abs(ref - exact) <= bound + 0.5 * bf16_ulp(np.maximum(np.abs(ref), np.abs(exact))))
    fast = _fast_model(q, cache, sel, seq_len, s_k, split.slices)
    assert within(fast, ref, bound).all()
    assert np.mean(fast == ref) > 0.9, "a float32 order should mostly round to the reference's bits"


def test_zero_when_nothing_is_attended():
    q = np.ones((4, 512), F32)
    sel = np.array([-1, 12, 50, -1], np.int32)
    assert not fast_bound(q, lambda ids: np.zeros((ids.size, 512), np.uint8), sel, 10, 1.0, 2, 2).any()


def test_bound_is_far_below_bf16_rounding_at_the_seed_sizes():
    rng = np.random.default_rng(1)
    cache, q, sel, s_k = _inputs(rng, 32, 2052, 16384, 0.3)
    split = fast_split(32, 2052, 1, 132, 512)
    bound = fast_bound(q, lambda ids: cache[ids], sel, 16384, s_k, split.slices, split.chunk)
    a = np.abs(_exact(q, cache, sel, 16384, s_k)).max()
    assert 0 < bound.max() < 2.0 ** -12 * max(a, 1.0)


def test_chain_counts_grow_with_the_chains():
    assert reference_k(2052) > reference_k(64) > 0
    assert fast_k(2052, 16, 129) < fast_k(2052, 1, 192) and fast_k(2052, 16, 64) < fast_k(2052, 16, 129)
