"""GPU tests of the launch layer itself: a kernel instance taken from the product's lowering of the
tiny example runs through the product's launcher (kbpc.testing.launchers) against the reference,
and a chain of dependent launches with programmatic dependent launch (PDL) gives the same bits as
the chain without it: every kernel waits for its predecessor in kbp::pdl_wait()."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import layer_norm as lower_ln
from kbpc.reference import layer_norm as ref_ln
from kbpc.reference.formats import bf16_bits, bf16_from_bits, to_bf16
from kbpc.testing.compare import assert_bf16_within
from kbpc.testing.lowering import family_groups, planned

pytestmark = pytest.mark.gpu


def _instance(tiny_path):
    plan, ctx = planned(str(tiny_path))
    group = family_groups(plan, "layer_norm")[0]
    (launch,) = lower_ln.lower(ctx, group)
    return launch


def _inputs(rng, d):
    x = to_bf16(rng.standard_normal(d).astype(np.float32) * rng.uniform(0.5, 4.0))
    gamma = to_bf16((1.0 + 0.2 * rng.standard_normal(d)).astype(np.float32))
    beta = to_bf16((0.2 * rng.standard_normal(d)).astype(np.float32))
    return x, gamma, beta


def test_lowered_instance_through_the_product_launcher(tiny_path):
    from kbpc.testing import gpu
    from kbpc.testing.launchers import launcher

    launch = _instance(tiny_path)
    d = launch.args[1].value
    eps = np.float32(launch.args[4].value)
    rng = np.random.default_rng()
    x, gamma, beta = _inputs(rng, d)
    run = launcher(launch.instance)
    y = gpu.poisoned((d,), np.uint16)
    run(launch.grid, launch.block, gpu.to_gpu(bf16_bits(x)), d, gpu.to_gpu(bf16_bits(gamma)),
        gpu.to_gpu(bf16_bits(beta)), eps, y, d, smem=launch.smem)
    assert_bf16_within(gpu.fetch(y, "y")[None], ref_ln.layer_norm(x[None], gamma, beta, eps), 1, "y")


@pytest.mark.parametrize("length", [64])
def test_pdl_chain_equals_the_serial_chain(tiny_path, length):
    """y_{i+1} = LN(y_i) for `length` launches back to back on one stream, without synchronizing:
    with PDL each launch may start while its predecessor runs and must wait for it."""
    from kbpc.testing import gpu
    from kbpc.testing.launchers import launcher

    launch = _instance(tiny_path)
    d = launch.args[1].value
    eps = np.float32(launch.args[4].value)
    rng = np.random.default_rng()
    x, gamma, beta = _inputs(rng, d)
    run = launcher(launch.instance)
    g_gpu, b_gpu = gpu.to_gpu(bf16_bits(gamma)), gpu.to_gpu(bf16_bits(beta))
    results = {}
    for pdl in (False, True):
        bufs = [gpu.to_gpu(bf16_bits(x))] + [gpu.poisoned((d,), np.uint16) for _ in range(length)]
        for i in range(length):
            run(launch.grid, launch.block, bufs[i], d, g_gpu, b_gpu, eps, bufs[i + 1], d,
                smem=launch.smem, pdl=pdl, sync=False)
        gpu.synchronize()
        results[pdl] = [gpu.fetch(b, f"step {i}") for i, b in enumerate(bufs[1:])]
    first = ref_ln.layer_norm(x[None], gamma, beta, eps)
    assert_bf16_within(results[False][0][None], first, 1, "serial step 0")
    for i in range(length):
        np.testing.assert_array_equal(results[True][i], results[False][i], f"PDL step {i}")
