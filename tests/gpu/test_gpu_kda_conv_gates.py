"""GPU tests of the default fused KDA forms through the product's launchers: kda_conv_gates
(kernels/kda_conv_gates.cuh: the short conv + L2 norm beside the FP8 gates in one grid) and
kda_recurrent_norm_decode_bf16 (kernels/kda_recurrent.cuh: the recurrence with the gated output
norm as its epilogue), as the default fusion rules lower the first KDA layer of the tiny example and
of the seed, against the five unfused product kernels on the same random inputs: the same bits in
every output, intermediate, window and state over STEPS tokens (both forms run the unfused kernels'
device code; random gate values, not only exact integers). A second test launches the fused pair
back to back with programmatic dependent launch and no host sync, as the step does, and checks the
outputs of every token and the final state against the unfused kernels run one by one."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.testing.kda_chain import DTYPE, assert_sides_equal, bind, chain_sides, product_chain

pytestmark = pytest.mark.gpu

STEPS = 64


def _chain(which, tiny_path, seed_path):
    chain = product_chain(str(tiny_path if which == "tiny" else seed_path), form="default")
    kinds = [launch.instance.kernel.split("<")[0] for launch in chain.fused]
    assert kinds[-2:] == ["kbp::kda_conv_gates", "kbp::kda_recurrent_norm_decode_bf16"], kinds
    return chain


@pytest.mark.parametrize("which", ["tiny", "seed"])
def test_default_forms_equal_unfused(which, tiny_path, seed_path):
    from kbpc.testing import gpu as g  # noqa: PLC0415
    from kbpc.testing.launchers import launcher  # noqa: PLC0415
    assert_sides_equal(g, _chain(which, tiny_path, seed_path), np.random.default_rng(), STEPS, launcher)


@pytest.mark.parametrize("which", ["tiny", "seed"])
def test_default_forms_under_pdl(which, tiny_path, seed_path):
    """Every token's fused launches go out back to back with the PDL attribute and no sync: the
    recurrence's early state loads and the conv's early window prefetch must not see a stale token."""
    from kbpc.testing import gpu as g  # noqa: PLC0415
    from kbpc.testing.launchers import launcher  # noqa: PLC0415
    rng = np.random.default_rng()
    chain = _chain(which, tiny_path, seed_path)
    data, outputs, sides = chain_sides(g, chain, rng)
    steps = [{chain.inputs[n]: v for n, v in data.step_inputs(rng).items()} for _ in range(16)]
    gated = next(b for b in outputs if b.name == chain.gated)
    results = {}
    for side, (launches, p, arrays) in sides.items():
        pdl = side == "fused"
        ys = []
        for ins in steps:
            arrays.update({n: g.to_gpu(v) for n, v in ins.items()})   # fresh arrays: earlier launches keep theirs
            arrays.update({b.name: g.poisoned((b.elements,), DTYPE[b.format]) for b in outputs})
            for launch in launches:
                launcher(launch.instance)(launch.grid, launch.block, *bind(launch, p, arrays), smem=launch.smem,
                                          pdl=pdl, sync=not pdl)
            ys.append(arrays[gated.name])
        g.synchronize()
        window, state = chain.state_names
        results[side] = ([g.fetch(y, f"{side} y") for y in ys],
                         g.fetch(arrays[window], f"{side} window"), g.fetch(arrays[state], f"{side} state"))
    for step, (a, b) in enumerate(zip(results["fused"][0], results["unfused"][0])):
        np.testing.assert_array_equal(a, b, f"y at step {step}")
    np.testing.assert_array_equal(results["fused"][1], results["unfused"][1], "window")
    np.testing.assert_array_equal(results["fused"][2], results["unfused"][2], "state")
