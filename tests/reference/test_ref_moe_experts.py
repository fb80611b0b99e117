"""moe_experts: the fused launches' reference (the router, the routed experts with the down input
quantized from the [gate | up] rows, the shared expert through its FP32 silu-clamp row) equals the
interpreter running the MoE families node by node, bit for bit, on the tiny example's MoE layers over
several tokens."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.frontend.load import load_blueprint
from kbpc.reference.formats import bf16_from_bits
from kbpc.reference.glm_swiglu_clamp import split_gate_up
from kbpc.reference.interpreter import Interpreter
from kbpc.reference.moe_experts import moe_experts
from kbpc.reference.w4a16_gemv import silu_input
from kbpc.runtime.reference_backend import load_weights

F32 = np.float32
STEPS = 3


@pytest.fixture(scope="module")
def tiny(tiny_path):
    bp = load_blueprint(tiny_path)
    return bp, load_weights(bp, "synthetic:11")


def _stack(weights, node: str) -> tuple:
    return (weights[f"{node}.weight"], weights[f"{node}.weight_scale"],
            np.asarray(weights[f"{node}.weight_scale_2"], F32))


def _dense(weights, node: str) -> tuple:
    packed, scales, sg = _stack(weights, node)
    return packed, scales, F32(np.asarray(sg).reshape(-1)[0])


def test_reference_equals_the_node_by_node_interpreter(tiny):
    bp, weights = tiny
    c, top_k = bp.config.constants, bp.symbols["top_k"]
    blocks = sorted({n.block for n in bp.nodes() if n.op == "expert_gate_up"})
    assert blocks, "the tiny example has MoE layers"
    interp = Interpreter(bp, weights, max_context=STEPS)
    interp.keep_values = True
    for step in range(STEPS):
        interp.step(step + 3)
        values = interp.last_values

        def value(node_id: str, name: str):
            return values[(bp.node_by_id[node_id].order, name)]

        for b in blocks:
            got = moe_experts(
                value(f"{b}.post_norm", "xn"), bf16_from_bits(weights[f"{b}.gate.weight"]),
                np.asarray(weights[f"{b}.top_k.e_score_correction_bias"], F32), top_k=top_k,
                routed_scale=c.routed_scale, gamma_in=F32(weights[f"{b}.experts_gate_up.input_scale"]),
                gate_up=_stack(weights, f"{b}.experts_gate_up"),
                gamma_dn=F32(weights[f"{b}.experts_down.input_scale"]), down=_stack(weights, f"{b}.experts_down"),
                shared_gate_up=_dense(weights, f"{b}.shared_gate_up"),
                shared_down=_dense(weights, f"{b}.shared_down"), limit=c.swiglu_limit)
            np.testing.assert_array_equal(got.weights, value(f"{b}.top_k", "topk_w").reshape(-1))
            np.testing.assert_array_equal(got.ids, value(f"{b}.top_k", "topk_id").reshape(-1))
            for mine, theirs in zip(got.expert_input, value(f"{b}.xn_quant", "xn_quant")):
                np.testing.assert_array_equal(np.asarray(mine).reshape(-1), np.asarray(theirs).reshape(-1))
            for mine, theirs in zip(got.down_input, value(f"{b}.eact_quant", "eact_quant")):
                np.testing.assert_array_equal(np.asarray(mine).reshape(-1), np.asarray(theirs).reshape(-1))
            np.testing.assert_array_equal(got.routed.reshape(-1), value(f"{b}.experts_down", "edown").reshape(-1))
            sact = value(f"{b}.shared_act", "sact")   # the interpreter keeps the silu input as [g^ | u^]
            np.testing.assert_array_equal(got.shared_input, silu_input(*split_gate_up(sact.clamped)).reshape(-1))
            np.testing.assert_array_equal(got.shared, value(f"{b}.shared_down", "sdown").reshape(-1))
