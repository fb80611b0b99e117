"""GPU tests of the fused KDA decode kernel (kernels/kda_fused.cuh) through the product's launcher:

- against the reference chain (kbpc.reference.kda_fused) over 64 consecutive tokens, the conv
  window and the recurrent state carried on the GPU, at the seed's sizes (the lowering's split and
  a second one), the tiny example's, and odd small ones (grouped heads, d_k != d_v, conv widths 3
  and 2, two gate ranks): bit-exact, every output and every intermediate. The gate weights and rows
  are small integers in E4M3 here, so the tensor core's FP32 sums are exact in any order (with
  random values the gates are within 1 BF16 ulp of the reference, as tests/gpu/test_gpu_kda.py
  states for kda_gates_w8a8, and a differing ulp then propagates through the state);
- the same 64 tokens launched back to back with programmatic dependent launch and no host sync;
- against the five unfused product kernels (the lowerings of the tiny example's and the seed's
  first KDA layer, and the fused lowering of the merged group) on random values: the same bits,
  since the fused kernel runs the same instructions (the gates' MMA tiles included).
Outputs are poisoned before every launch, inputs are fresh random values every step."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families.kda_fused import KdaDims, KdaShape, instance, value_head_split
from kbpc.reference.formats import bf16_bits, bf16_from_bits
from kbpc.reference.kda_fused import kda_decode_step
from kbpc.testing.compare import assert_f32_exact
from kbpc.testing.kda_chain import (
    INTERMEDIATES, KdaLayerData, assert_sides_equal, fused_args, product_chain, upload, widths,
)

pytestmark = pytest.mark.gpu

STEPS = 64
EPS = (1e-6, -5.0, 1e-5)   # l2 eps, gate lower bound, o-norm eps
SHAPES = {                 # name: (dims, CTAs per value head; None: the lowering's choice)
    "seed": (KdaDims(64, 64, 128, 128, 128, 128, 4), None),
    "seed-cph4": (KdaDims(64, 64, 128, 128, 128, 128, 4), 4),
    "tiny": (KdaDims(2, 2, 128, 128, 128, 128, 4), None),
    "grouped": (KdaDims(1, 3, 32, 64, 128, 256, 3), None),
    "dv96": (KdaDims(2, 2, 64, 96, 256, 128, 2), 1),
}
DTYPES = {"packed": np.uint16, "conv": np.uint16, "f": np.uint16, "decay": np.float32,
          "beta": np.float32, "og": np.uint16, "core": np.float32, "y": np.uint16}


def _gpu():
    from kbpc.testing import gpu  # noqa: PLC0415
    return gpu


def _shape(name: str) -> KdaShape:
    d, cph = SHAPES[name]
    return KdaShape(d, cph or value_head_split(d.hk, d.hv, d.dk, d.dv, d.width))


def _outputs(g, dims: KdaDims, names) -> dict:
    w = widths(dims)
    return {n: g.poisoned((w[n],), DTYPES[n]) for n in names}


def _reference_step(data, ins, window, state):
    rows = {n: bf16_from_bits(v) for n, v in ins.items()}
    w = data.reference_weights(*EPS)
    return kda_decode_step(rows["q"], rows["k"], rows["v"], rows["f_a"], rows["b"], rows["g_a"], window, state, w)


def _check_intermediates(g, out, ref, step):
    want = {"packed": bf16_bits(ref.packed), "conv": bf16_bits(ref.conv), "f": bf16_bits(ref.gates.f.reshape(-1)),
            "decay": ref.gates.decay.reshape(-1), "beta": ref.gates.beta.reshape(-1),
            "og": bf16_bits(ref.gates.o_g.reshape(-1)), "core": ref.core}
    for name in INTERMEDIATES:
        got = g.fetch(out[name], name)
        if DTYPES[name] == np.float32:
            assert_f32_exact(got, want[name], f"{name} at step {step}")
        else:
            np.testing.assert_array_equal(got, want[name], f"{name} at step {step}")


@pytest.mark.parametrize("intermediates", [False, True])
@pytest.mark.parametrize("name", list(SHAPES))
def test_fused_matches_reference(name, intermediates):
    from kbpc.testing.launchers import launcher  # noqa: PLC0415
    g = _gpu()
    rng = np.random.default_rng()
    shape = _shape(name)
    dims = SHAPES[name][0]
    data = KdaLayerData.random(rng, dims, integer_gates=True)
    run = launcher(instance(shape))
    dev = upload(data, {}, g.to_gpu)
    window, state = data.window, data.state
    for step in range(STEPS):
        ins = data.step_inputs(rng)
        dev.update({n: g.to_gpu(v) for n, v in ins.items()})
        out = _outputs(g, dims, ("y",) + (INTERMEDIATES if intermediates else ()))
        run(shape.grid, shape.block, *fused_args(dims, dev, EPS, out))
        ref = _reference_step(data, ins, window, state)
        np.testing.assert_array_equal(g.fetch(out["y"], "y"), bf16_bits(ref.y), f"y at step {step}")
        if intermediates:
            _check_intermediates(g, out, ref, step)
        window, state = ref.window, ref.state
        if step % 16 == 15 or dims.hv < 8:
            assert_f32_exact(g.fetch(dev["window"], "window"), window, f"window at step {step}")
            assert_f32_exact(g.fetch(dev["state"], "state"), state, f"state at step {step}")


@pytest.mark.parametrize("name", ["seed", "grouped"])
def test_fused_pdl_chain(name):
    """STEPS launches back to back with the PDL attribute and no sync: each must wait (pdl_wait) for
    the previous step's window and state before reading them."""
    from kbpc.testing.launchers import launcher  # noqa: PLC0415
    g = _gpu()
    rng = np.random.default_rng()
    shape, dims = _shape(name), SHAPES[name][0]
    data = KdaLayerData.random(rng, dims, integer_gates=True)
    run = launcher(instance(shape))
    dev = upload(data, {}, g.to_gpu)
    steps = [data.step_inputs(rng) for _ in range(STEPS)]
    outs = [_outputs(g, dims, ("y",)) for _ in range(STEPS)]
    for ins, out in zip(steps, outs):
        dev.update({n: g.to_gpu(v) for n, v in ins.items()})   # fresh arrays: earlier launches keep theirs
        run(shape.grid, shape.block, *fused_args(dims, dev, EPS, out), pdl=True, sync=False)
    g.synchronize()
    window, state = data.window, data.state
    for step, (ins, out) in enumerate(zip(steps, outs)):
        ref = _reference_step(data, ins, window, state)
        np.testing.assert_array_equal(g.fetch(out["y"], "y"), bf16_bits(ref.y), f"y at step {step}")
        window, state = ref.window, ref.state
    assert_f32_exact(g.fetch(dev["window"], "window"), window, "window")
    assert_f32_exact(g.fetch(dev["state"], "state"), state, "state")


@pytest.mark.parametrize("which", ["tiny", "seed"])
def test_fused_equals_unfused(which, tiny_path, seed_path):
    """The product's launches for one KDA layer: the five unfused kernels (their own buffers and
    state) and the fused kernel of the merged group (separate copies), fed the same inputs: the
    same bits in every output, intermediate, window and state, over STEPS tokens."""
    from kbpc.testing.launchers import launcher  # noqa: PLC0415
    g = _gpu()
    rng = np.random.default_rng()
    chain = product_chain(str(tiny_path if which == "tiny" else seed_path))
    assert_sides_equal(g, chain, rng, STEPS, launcher)
