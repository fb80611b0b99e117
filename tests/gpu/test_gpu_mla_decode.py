"""GPU tests of the split MLA decode (glm_mla_decode_split) through the product's launcher, bit for
bit against kbpc.reference.glm_mla_decode (the order of one CTA of 16 warps, which the split
reproduces across CTAs): fresh random caches, queries and selections with skipped (-1 and out of
range) and duplicated entries, head counts that give 4, 2 and 1 heads per CTA, selections from a
few entries to more than one lookup batch per CTA, an all-skipped selection (zeros), and repeated
launches on the same merge scratch (the arrival counters must come back zeroed)."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import glm_mla_decode as lower_mla
from kbpc.reference.formats import bf16_bits, bf16_from_bits, e4m3_encode, to_bf16
from kbpc.reference.glm_mla_decode import ORDER_WARPS, mla_decode
from kbpc.reference.glm_mla_latent_write import LatentCacheLayout

pytestmark = pytest.mark.gpu
F32 = np.float32


def _decode(heads, width, seq_len, page=64, launches=2, rows=1, e=512):
    from kbpc.testing import gpu
    from kbpc.testing.launchers import launcher

    rng = np.random.default_rng()
    hpc = lower_mla.heads_per_cta(heads)
    run = launcher(lower_mla.decode_instance(e, hpc))
    layout = LatentCacheLayout(num_pages=seq_len // page + 2, page_size=page, latent_dim=e)
    table = rng.permutation(layout.num_pages).astype(np.int32)
    cache = e4m3_encode(rng.normal(0, 2, layout.shape).astype(F32))
    d_cache, d_table = gpu.to_gpu(cache), gpu.to_gpu(table)
    merge = gpu.poisoned((rows, ORDER_WARPS, heads, e + 2), np.float32)
    counters = gpu.to_gpu(np.zeros((rows, ORDER_WARPS, heads), np.uint32))
    for i in range(launches):
        q = to_bf16(rng.normal(0, rng.uniform(0.02, 0.5), (rows, heads, e)).astype(F32))
        sel = rng.integers(-1, seq_len, (rows, width)).astype(np.int32)
        sel[rng.random((rows, width)) < 0.05] = seq_len + 3          # out of range: skipped
        sel[:, 1::7] = sel[:, :1]                                    # duplicates attended twice
        if i == launches - 1:
            sel[-1] = -1                                             # a row with nothing to attend
        s_k = F32(rng.choice([1.0, 0.5, 1.3]))
        out = gpu.poisoned((rows, heads, e), np.uint16)
        run((ORDER_WARPS, heads // hpc, rows), (lower_mla.THREADS, 1, 1), gpu.to_gpu(bf16_bits(q)), d_cache, d_table,
            page, gpu.to_gpu(sel), width, gpu.to_gpu(np.array([seq_len], np.int32)), s_k, out, merge, counters)
        got = bf16_from_bits(gpu.fetch(out))
        for r in range(rows):
            ref = mla_decode(q[r], lambda ids: layout.rows(cache, table, ids), sel[r], seq_len, s_k)
            np.testing.assert_array_equal(got[r].view(np.uint32), ref.view(np.uint32), f"launch {i}, row {r}")
        assert not counters.get().any(), "merge counters not returned to zero"


@pytest.mark.parametrize("heads,width,seq_len", [(32, 2052, 5000), (2, 2052, 300), (6, 37, 100),
                                                 (1, 8, 10), (32, 5000, 70000)])
def test_decode_split_exact(heads, width, seq_len):
    _decode(heads, width, seq_len)


def test_decode_split_rows_and_wide_latent():
    _decode(4, 300, 1000, rows=2)
    _decode(4, 130, 1000, e=1024)
