"""kda_conv_gates: the side-by-side reference (pack + conv + L2 norm beside the FP8 gates) equals the
interpreter running those families node by node, bit for bit, on the tiny example's KDA layers over
consecutive tokens (the window carried), and rejects q/k rows that are not whole heads."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.frontend.load import load_blueprint
from kbpc.reference.formats import bf16_from_bits
from kbpc.reference.interpreter import Interpreter
from kbpc.reference.kda_conv_gates import kda_conv_gates
from kbpc.runtime.reference_backend import load_weights

F32 = np.float32
STEPS = 5
PROJECTIONS = (("q", "q"), ("k", "k"), ("v", "v"), ("f_a", "fa"), ("b", "b"), ("g_a", "ga"))  # node, edge


@pytest.fixture(scope="module")
def tiny(tiny_path):
    bp = load_blueprint(tiny_path)
    return bp, load_weights(bp, "synthetic:11")


def _params(bp, weights, block: str) -> tuple:
    return (bf16_from_bits(weights[f"{block}.short_conv.conv_weight"]),
            bf16_from_bits(weights[f"{block}.short_conv.conv_bias"]),
            weights[f"{block}.f_b.weight"], weights[f"{block}.f_b.weight_scale"],
            weights[f"{block}.g_b.weight"], weights[f"{block}.g_b.weight_scale"],
            weights[f"{block}.gates.A_log"], weights[f"{block}.gates.dt_bias"])


def test_reference_equals_the_node_by_node_interpreter(tiny):
    bp, weights = tiny
    c = bp.config.constants
    blocks = sorted({n.block for n in bp.nodes() if n.op == "gdn_recurrence"})
    assert blocks, "the tiny example has KDA layers"
    interp = Interpreter(bp, weights, max_context=STEPS)
    interp.keep_values = True
    windows: dict[str, np.ndarray] = {}
    for step in range(STEPS):
        interp.step(step + 5)
        values = interp.last_values

        def value(node_id: str, name: str) -> np.ndarray:
            return np.asarray(values[(bp.node_by_id[node_id].order, name)], F32).reshape(-1)

        for block in blocks:
            ins = [value(f"{block}.{n}", e) for n, e in PROJECTIONS]
            window = windows.get(block)
            if window is None:
                window = np.zeros((sum(a.size for a in ins[:3]), c.conv_width), F32)
            got = kda_conv_gates(*ins, window, *_params(bp, weights, block), d_k=bp.symbols["lin_k_dim"],
                                 l2_eps=c.l2_norm_eps, lower_bound=c.kda_gate_lower_bound)
            np.testing.assert_array_equal(got.conv, value(f"{block}.l2", "qkvn"))
            np.testing.assert_array_equal(got.gates.decay.reshape(-1), value(f"{block}.gates", "decay"))
            np.testing.assert_array_equal(got.gates.beta.reshape(-1), value(f"{block}.gates", "beta"))
            np.testing.assert_array_equal(got.gates.o_g.reshape(-1), value(f"{block}.g_b", "g"))
            np.testing.assert_array_equal(got.window, interp.state.conv[f"{block}.short_conv"])
            windows[block] = got.window


def test_rejects_partial_heads(tiny):
    bp, weights = tiny
    z = np.zeros
    with pytest.raises(ValueError, match="whole heads"):
        kda_conv_gates(z(100), z(100), z(256), z(128), z(2), z(128), z((456, 4)), *_params(bp, weights, "l0.kda"),
                       d_k=128, l2_eps=1e-6, lower_bound=-5.0)
