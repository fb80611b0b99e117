"""GPU tests of the paged latent write the code generation launches (slot looked up from the device
position through the block table), through the product's launcher with the lowering's instance.

Tolerance: the paged write stores the same codes as glm_mla_latent_write_fp8 at the slot the
block table gives (the codes between those of r(1 -+ 2^-21), a bound that also holds for CUDA's
rsqrtf, within 2 ulp); every other cache byte keeps its poison."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.reference.formats import bf16_bits, e4m3_decode, e4m3_encode, to_bf16
from kbpc.reference.glm_mla_latent_write import LatentCacheLayout, latent_values
from kbpc.testing.gpu import fetch, poisoned, to_gpu
from kbpc.testing.instances import latent_write_paged
from kbpc.testing.launchers import launcher

pytestmark = pytest.mark.gpu
F32 = np.float32
EPS = 1e-5
E = 512   # latent width: the seed's


def instances():
    """Every kernel instance this module launches (tests/nvcc/test_gpu_test_instances.py builds them)."""
    return [latent_write_paged(E)]


def _i32(*v):
    return to_gpu(np.array(v, np.int32))


@pytest.mark.parametrize("rows,pos", [(1, 0), (1, 63), (1, 64 * 3 + 5), (3, 126)])
def test_paged_latent_write(rows, pos):
    rng = np.random.default_rng()
    page, e = 64, E
    layout = LatentCacheLayout(num_pages=6, page_size=page, latent_dim=e)
    table = rng.permutation(layout.num_pages).astype(np.int32)   # not the identity
    c = to_bf16(rng.normal(0, rng.uniform(0.1, 30), (rows, e)).astype(F32))
    gamma = to_bf16(rng.uniform(-2, 2, e).astype(F32))
    s_k = F32(rng.choice([1.0, 0.37, 4.0]))
    cache = poisoned(layout.shape, np.uint8)
    launcher(latent_write_paged(e))((rows, 1, 1), (e, 1, 1), to_gpu(bf16_bits(c)), to_gpu(bf16_bits(gamma)),
                                    to_gpu(table), np.int32(page), _i32(pos), s_k, F32(EPS), cache)
    got = fetch(cache, allow_nan=True).reshape(-1, e)
    slots = [layout.slot(table, pos + r) for r in range(rows)]
    untouched = np.ones(got.shape[0], bool)
    untouched[slots] = False
    assert np.all(got[untouched] == 0xFF), "rows other than the token slots were touched"
    y = latent_values(c, gamma, EPS, s_k)
    lo = e4m3_decode(e4m3_encode(y * F32(1 - 2 ** -21))).astype(np.float64)
    hi = e4m3_decode(e4m3_encode(y * F32(1 + 2 ** -21))).astype(np.float64)
    for r, slot in enumerate(slots):
        v = e4m3_decode(got[slot]).astype(np.float64)
        assert np.all((v >= np.minimum(lo[r], hi[r])) & (v <= np.maximum(lo[r], hi[r]))), f"row {r}"
