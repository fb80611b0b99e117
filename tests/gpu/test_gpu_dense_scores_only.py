"""GPU tests of dense_gemv_bf16_scores_only (kernels/dense_bf16.cuh): the index-query and head-weight
projections of numerics `fast`, whose only reader is an unranked select, through the product's
launcher, on fresh random inputs each run.

While that select lists every valid pool (kbpc.reference.dsa_indexer.every_pool_selected at the
launch's SEQ and POS) the kernel must leave its output exactly as it was: a poisoned row stays
poisoned. Past that context it must be the plain kernel: the reference's bits. The positions span
the switch: the first position, the last one with every pool selected, the first one past it, and a
long context. The select's own side of the same predicate is tests/gpu/test_gpu_dsa_order_free.py."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import dense_bf16 as lower_dense
from kbpc.reference import dense_bf16 as ref_dense
from kbpc.reference import dsa_indexer as dsa
from kbpc.reference.formats import bf16_bits, to_bf16

pytestmark = pytest.mark.gpu
KP = 4
# (N, K, out, outputs per CTA, top-k pools): the seed's index queries and head weights, and odd ones.
SHAPES = [(4096, 1536, "float", 4, 512), (32, 4096, "float", 1, 512), (37, 264, "float", 2, 3),
          (37, 264, "__nv_bfloat16", 1, 3)]


def instances():
    """The instances this module launches (tests/nvcc/test_gpu_test_instances.py builds them)."""
    return [lower_dense.scores_only_instance(k, out, opc, KP, topk) for _, k, out, opc, topk in SHAPES]


def _positions(topk: int) -> list[int]:
    """Positions around the switch: the last with every pool selected is (topk + 1) KP - 2."""
    last = (topk + 1) * KP - 2
    return [0, last, last + 1, 40 * topk * KP + 5]


@pytest.mark.parametrize("n,k,out,opc,topk", SHAPES)
def test_idle_while_every_pool_is_selected_else_the_plain_bits(n, k, out, opc, topk):
    from kbpc.testing import gpu
    from kbpc.testing.launchers import launcher
    rng = np.random.default_rng()
    geo = dsa.IndexerGeometry(head_dim=32, heads=1, pool=KP, topk_tokens=topk * KP)
    w = to_bf16(rng.standard_normal((n, k)).astype(np.float32) * np.float32(0.05))
    x = to_bf16(rng.standard_normal(k).astype(np.float32))
    run = launcher(lower_dense.scores_only_instance(k, out, opc, KP, topk))
    dtype = np.float32 if out == "float" else np.uint16
    want = ref_dense.dense_gemv_bf16(x, w, out_dtype="f32" if out == "float" else "bf16")[0]
    switched = []
    for pos in _positions(topk):
        y = gpu.poisoned((n,), dtype)
        run((-(-n // opc), 1, 1), (64 * opc, 1, 1), gpu.to_gpu(bf16_bits(w)), gpu.to_gpu(bf16_bits(x)), y,
            np.int32(n), gpu.to_gpu(np.array([pos + 1], np.int32)), gpu.to_gpu(np.array([pos], np.int32)))
        idle = dsa.every_pool_selected(geo, pos + 1, pos)
        switched.append(idle)
        if idle:
            got = y.get()
            assert np.array_equal(got.view(np.uint8), gpu.poisoned((n,), dtype).get().view(np.uint8)), \
                f"position {pos}: an idle launch wrote its output"
        else:
            got = gpu.fetch(y)
            want_bits = want.view(np.uint32) if out == "float" else bf16_bits(want)
            assert np.array_equal(got.view(want_bits.dtype), want_bits), f"position {pos}: not the plain bits"
    assert switched == [True, True, False, False], "the positions must span the switch"
