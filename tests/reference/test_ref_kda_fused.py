"""kda_fused: the fused chain's reference equals the interpreter running the five families node by
node, bit for bit, on the tiny example's KDA layers over consecutive tokens (window and state
carried), and rejects inputs that are not whole heads."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.frontend.load import load_blueprint
from kbpc.reference.formats import bf16_from_bits
from kbpc.reference.interpreter import Interpreter
from kbpc.reference.kda_fused import KdaLayerWeights, kda_decode_step
from kbpc.runtime.reference_backend import load_weights

F32 = np.float32
STEPS = 6
PROJECTIONS = (("q", "q"), ("k", "k"), ("v", "v"), ("f_a", "fa"), ("b", "b"), ("g_a", "ga"))  # node, edge


def layer_weights(bp, weights, block: str) -> KdaLayerWeights:
    """The chain's parameters of KDA block `block` (e.g. "l0.kda") from kbpc's weight names."""
    c, sym = bp.config.constants, bp.symbols
    return KdaLayerWeights(
        conv_weight=bf16_from_bits(weights[f"{block}.short_conv.conv_weight"]),
        conv_bias=bf16_from_bits(weights[f"{block}.short_conv.conv_bias"]),
        wf_codes=weights[f"{block}.f_b.weight"], wf_scales=weights[f"{block}.f_b.weight_scale"],
        wg_codes=weights[f"{block}.g_b.weight"], wg_scales=weights[f"{block}.g_b.weight_scale"],
        a_log=weights[f"{block}.gates.A_log"], dt_bias=weights[f"{block}.gates.dt_bias"],
        gamma=bf16_from_bits(weights[f"{block}.out_norm.weight"]), d_k=sym["lin_k_dim"],
        l2_eps=c.l2_norm_eps, lower_bound=c.kda_gate_lower_bound, norm_eps=c.kda_norm_eps)


@pytest.fixture(scope="module")
def tiny(tiny_path):
    bp = load_blueprint(tiny_path)
    return bp, load_weights(bp, "synthetic:7")


def _value(bp, values, node_id: str, name: str):
    return np.asarray(values[(bp.node_by_id[node_id].order, name)], F32)


def test_fused_reference_equals_the_node_by_node_interpreter(tiny):
    bp, weights = tiny
    blocks = sorted({n.block for n in bp.nodes() if n.op == "gdn_recurrence"})
    assert blocks, "the tiny example has KDA layers"
    interp = Interpreter(bp, weights, max_context=STEPS)
    interp.keep_values = True
    carried = {}
    for step in range(STEPS):
        interp.step(step + 3)
        v = interp.last_values
        for block in blocks:
            w = layer_weights(bp, weights, block)
            window, state = carried.get(block, (None, None))
            ins = [_value(bp, v, f"{block}.{n}", e) for n, e in PROJECTIONS]
            if window is None:
                window = np.zeros((sum(a.size for a in ins[:3]), bp.config.constants.conv_width), F32)
                state = np.zeros((ins[4].size, w.d_k, ins[2].size // ins[4].size), F32)
            got = kda_decode_step(*ins, window, state, w)
            np.testing.assert_array_equal(got.y, _value(bp, v, f"{block}.out_norm", "gated").reshape(-1))
            np.testing.assert_array_equal(got.conv, _value(bp, v, f"{block}.l2", "qkvn").reshape(-1))
            np.testing.assert_array_equal(got.core, _value(bp, v, f"{block}.recur", "core").reshape(-1))
            np.testing.assert_array_equal(got.window, interp.state.conv[f"{block}.short_conv"])
            np.testing.assert_array_equal(got.state, interp.state.recurrent[f"{block}.recur"])
            carried[block] = (got.window, got.state)


def test_rejects_partial_heads(tiny):
    bp, weights = tiny
    w = layer_weights(bp, weights, "l0.kda")
    z = np.zeros
    with pytest.raises(ValueError, match="whole heads"):
        kda_decode_step(z(100), z(100), z(256), z(128), z(2), z(128), z((456, 4)), z((2, 128, 128)), w)
    with pytest.raises(ValueError, match="value heads"):
        kda_decode_step(z(256), z(256), z(255), z(128), z(2), z(128), z((767, 4)), z((2, 128, 128)), w)
