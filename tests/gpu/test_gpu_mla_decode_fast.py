"""GPU tests of the `fast` sparse MLA decode (glm_mla_decode_fast, kernels/glm_mla_decode_fast.cuh)
through the product's launcher, on fresh random caches, queries and selections each run.

Tolerance (derived in kbpc/reference/glm_mla_decode_fast.py, fast_bound): per output,

    |out_fast - out_ref| <= B_hc + ulp_bf16(max(|out_fast|, |out_ref|))

with B_hc = (2 (e^{2D} - 1) + e^{2D} 1.01 u (K + 2d)) A_hc + 2 e^{2D} 1.01 u sum_j w_j d_j |v*_jc|: A the
softmax average of |s_k c^| (exact weights), D the score error of either side ((E/32 + 8) u sigma
sum_c |q_c v*_c|), K the two forms' chain lengths, d_j = max z - z_j (+ 2D) the exponentials'
arguments; the ulp term is the two BF16 roundings. The form is FP32 throughout, so beyond the bound
>= 90% of outputs must equal the reference's bits. The merge order is fixed (slice order), so two
launches on the same inputs must give the same bits, and the arrival counters must come back zero.
Sizes: 1k tokens all valid, the seed's 2052-entry list at 1k (a -1 tail) and at 16k context (with -1,
out-of-range ids and duplicates), few tokens, heads 32 and 16 (4 heads per CTA) and 2 (2 per CTA),
rows 1 and 2, a split with several chunks and staging rounds per CTA, a 1024-wide latent, and a
selection with nothing to attend (zeros).

The fused form (glm_mla_decode_fast_quant, rule mla_attend_quant) runs on the same inputs: its BF16
output must be the unfused form's bits, its codes and scales exactly the reference per-token FP8
quantizer of that output (kbpc.reference.w8a8_act_quant.quant_row: w8a8_act_quant_row's bytes),
over two launches (its arrival counts must come back zero), and with the BF16 output not written
(nullptr), as the step passes it."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import glm_mla_decode as lower_mla
from kbpc.reference.formats import bf16_bits, bf16_from_bits, e4m3_encode, to_bf16
from kbpc.reference.gemv_bounds import within
from kbpc.reference.glm_mla_decode import mla_decode
from kbpc.reference.glm_mla_decode_fast import FAST_THREADS, PARTIAL_PAD, FastSplit, fast_bound, fast_split
from kbpc.reference.glm_mla_latent_write import LatentCacheLayout
from kbpc.reference.w8a8_act_quant import quant_row
from kbpc.targets import get_target

pytestmark = pytest.mark.gpu
F32 = np.float32
SMS = get_target("sm_90").sms
FORCED = FastSplit(hpc=4, slices=2, chunk=192)   # 200 entries a slice: 2 chunks, up to 3 staging rounds
SHAPES = [(512, 4), (512, 2), (512, 1), (1024, 4)]


def instances():
    """The instances this module launches (tests/nvcc/test_gpu_test_instances.py builds them)."""
    return [lower_mla.fast_instance(e, hpc, quant) for e, hpc in SHAPES for quant in (False, True)]


def _selection(rng, kind, rows, width, seq_len):
    if kind == "all_valid":          # every token once, shuffled
        return np.stack([rng.permutation(seq_len)[:width] for _ in range(rows)]).astype(np.int32)
    if kind == "short_context":      # the indexer's list below top-k: the visible tokens, then -1
        sel = np.full((rows, width), -1, np.int32)
        sel[:, :seq_len] = np.stack([rng.permutation(seq_len) for _ in range(rows)])
        return sel
    sel = rng.integers(-1, seq_len, (rows, width)).astype(np.int32)   # "mixed": -1, out of range, duplicates
    sel[rng.random((rows, width)) < 0.05] = seq_len + 3
    sel[:, 1::7] = sel[:, :1]
    return sel


def _decode_fast(heads, width, seq_len, kind="mixed", rows=1, e=512, split=None, page=64, nothing_row=False):
    from kbpc.testing import gpu
    from kbpc.testing.launchers import launcher

    rng = np.random.default_rng()
    split = split or fast_split(heads, width, rows, SMS, e)
    assert (e, split.hpc) in SHAPES
    run = launcher(lower_mla.fast_instance(e, split.hpc))
    layout = LatentCacheLayout(num_pages=seq_len // page + 2, page_size=page, latent_dim=e)
    table = rng.permutation(layout.num_pages).astype(np.int32)
    cache = e4m3_encode(rng.normal(0, 2, layout.shape).astype(F32))
    q = to_bf16(rng.normal(0, rng.uniform(0.02, 0.5), (rows, heads, e)).astype(F32))
    sel = _selection(rng, kind, rows, width, seq_len)
    if nothing_row:
        sel[-1] = -1
    s_k = F32(rng.choice([1.0, 0.5, 1.3]))
    partials = gpu.poisoned((rows, split.slices, heads, e + PARTIAL_PAD), np.float32)
    counters = gpu.to_gpu(np.zeros((rows, heads // split.hpc, 2), np.uint32))
    args = (gpu.to_gpu(bf16_bits(q)), gpu.to_gpu(cache), gpu.to_gpu(table), page, gpu.to_gpu(sel), width,
            gpu.to_gpu(np.array([seq_len], np.int32)), s_k, split.chunk)
    bits = []
    for _ in range(2):
        out = gpu.poisoned((rows, heads, e), np.uint16)
        run(split.grid(heads, rows), (FAST_THREADS, 1, 1), *args, out, partials, counters,
            smem=split.smem_bytes(e))
        bits.append(gpu.fetch(out))
        assert not counters.get().any(), "arrival counters not returned to zero"
    np.testing.assert_array_equal(bits[0], bits[1], "two launches on the same inputs differ")
    _check_fused(split, e, heads, rows, args, bits[0])
    got = bf16_from_bits(bits[0])
    for r in range(rows):
        rows_of = lambda ids: layout.rows(cache, table, ids)   # noqa: E731
        want = mla_decode(q[r], rows_of, sel[r], seq_len, s_k)
        bound = fast_bound(q[r], rows_of, sel[r], seq_len, s_k, split.slices, split.chunk)
        ok = within(got[r], want, bound)
        bad = np.argwhere(~ok)
        assert ok.all(), (f"row {r}: {bad.shape[0]} outputs outside the bound, first {bad[:3].tolist()}: "
                          f"got {got[r][~ok][:3]} want {want[~ok][:3]} bound {bound[~ok][:3]}")
        same = np.mean(bf16_bits(got[r]) == bf16_bits(want))
        assert same >= 0.9, f"row {r}: only {same:.3f} of outputs equal the reference bits"
        if nothing_row and r == rows - 1:
            assert not got[r].any(), "a row with nothing to attend must be zeros"


def _check_fused(split, e, heads, rows, args, want_bits):
    """The fused quantizing form on the unfused launch's inputs (see the module docstring)."""
    from kbpc.testing import gpu
    from kbpc.testing.launchers import launcher

    run = launcher(lower_mla.fast_instance(e, split.hpc, True))
    groups = heads // split.hpc
    partials = gpu.poisoned((rows, split.slices, heads, e + PARTIAL_PAD), np.float32)
    ctas = split.slices * groups
    counters = gpu.to_gpu(np.zeros((rows, groups, 2), np.uint32))
    sync = gpu.to_gpu(np.zeros((rows, ctas + 2), np.uint32))
    want_codes, want_scales = quant_row(bf16_from_bits(want_bits).reshape(rows, heads * e))
    for keep_bf16 in (True, False):
        out = gpu.poisoned((rows, heads, e), np.uint16) if keep_bf16 else None
        codes, scales = gpu.poisoned((rows, heads * e), np.uint8), gpu.poisoned((rows,), np.float32)
        run(split.grid(heads, rows), (FAST_THREADS, 1, 1), *args, out, partials, counters, codes, scales, sync,
            smem=split.smem_bytes(e))
        if keep_bf16:
            np.testing.assert_array_equal(gpu.fetch(out), want_bits, "the fused form's BF16 output differs")
        np.testing.assert_array_equal(gpu.fetch(codes), want_codes, "codes differ from w8a8_act_quant_row's")
        np.testing.assert_array_equal(gpu.fetch(scales), want_scales, "scales differ from w8a8_act_quant_row's")
        assert not counters.get().any() and not sync.get()[:, ctas:].any(), "arrival counts not back at zero"


@pytest.mark.parametrize("heads,width,seq_len,kind", [
    (32, 1024, 1024, "all_valid"),        # 1k tokens, all valid
    (32, 2052, 1024, "short_context"),    # the seed's list at 1k context: 1024 tokens, then -1
    (32, 2052, 16384, "mixed"),           # 2048 selected of 16k, with -1, out-of-range ids and duplicates
    (16, 2052, 16384, "mixed"),
    (32, 8, 10, "mixed"),                 # few tokens
    (16, 37, 100, "mixed"),
    (2, 20, 100, "mixed")])
def test_decode_fast_within_bound_and_reproducible(heads, width, seq_len, kind):
    _decode_fast(heads, width, seq_len, kind)


def test_decode_fast_rows_chunks_and_wide_latent():
    _decode_fast(32, 2052, 16384, rows=2, nothing_row=True)                       # two rows; one attends nothing
    _decode_fast(32, 400, 5000, split=FORCED)                                     # several chunks and rounds
    _decode_fast(4, 130, 1000, e=1024)
    _decode_fast(3, 300, 1000, split=FastSplit(hpc=1, slices=5, chunk=17))        # HPC 1, ragged chunks
