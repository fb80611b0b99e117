"""kbpc.reference.glm_moe_layer (the fused MoE kernels' reference) against the reference
interpreter's op-by-op chain on the tiny example: for every MoE block, the composed gate_up and
down launches reproduce every intermediate the interpreter computes (logits, top-k, the quantized
expert input, gate_up rows, the quantized down input, expert and shared outputs, the combine)
byte for byte, over several positions. Also: a blueprint without a shared expert composes (the
combine then adds nothing), and random layers with empty (-1) slots."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kbpc.frontend.load import load_blueprint
from kbpc.reference import glm_moe_layer as ML
from kbpc.reference import glm_moe_combine, w4a16_gemv
from kbpc.reference.formats import quantize_nvfp4, to_bf16
from kbpc.reference.interpreter import Interpreter
from kbpc.weights.synthetic import synthetic_weights

F32 = np.float32


def _value(interp: Interpreter, bp, node_id: str, name: str):
    order = bp.node_by_id[node_id].order
    return interp.last_values[(order, name)]


def _assert_same(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.tobytes() == want.astype(got.dtype).tobytes(), f"{what} differs"


@pytest.mark.parametrize("seed", [7, 11])
def test_moe_layer_matches_interpreter(tiny_path, seed):
    bp = load_blueprint(tiny_path)
    weights = synthetic_weights(bp, seed)
    interp = Interpreter(bp, weights, max_context=8)
    interp.keep_values = True
    blocks = sorted({n.block for n in bp.nodes() if n.block_type == "moe"})
    assert blocks, "the tiny example has MoE layers"
    for token in (3, 17, 5):
        interp.step(token)
        for block in blocks:
            nodes = ML.block_nodes(bp, block)
            p = ML.layer_params(bp, weights, block)
            router = nodes["router"]
            xn = _value(interp, bp, bp.node(bp.inputs(router.order)[0].src).id, "xn")
            g, d = ML.moe_layer(xn, p)
            _assert_same(g.logits, _value(interp, bp, router.id, "logits"), f"{block} logits")
            _assert_same(g.weights, _value(interp, bp, nodes["top_k"].id, "topk_w"), f"{block} weights")
            _assert_same(g.ids, _value(interp, bp, nodes["top_k"].id, "topk_id"), f"{block} ids")
            _assert_same(g.gate_up, _value(interp, bp, nodes["expert_gate_up"].id, "egu"), f"{block} gate_up")
            eq = _value(interp, bp, f"{block}.eact_quant", "eact_quant")
            for got, want, part in zip(g.down_in, eq, ("codes", "scales", "g")):
                _assert_same(got, want, f"{block} down input {part}")
            _assert_same(d.edown, _value(interp, bp, nodes["expert_down"].id, "edown"), f"{block} edown")
            _assert_same(d.sdown, _value(interp, bp, nodes["shared_down"].id, "sdown"), f"{block} sdown")
            _assert_same(d.y, _value(interp, bp, f"{block}.blend", "f"), f"{block} combine")


def _random_params(rng, h, i, ish, e, k):
    def stack(n, kk, count):
        parts = [quantize_nvfp4(rng.standard_normal((n, kk)).astype(F32) * F32(0.05)) for _ in range(count)]
        return ML.Nvfp4(np.stack([q[0] for q in parts]), np.stack([q[1] for q in parts]),
                        np.array([q[2] for q in parts], F32))

    def one(n, kk):
        return ML.Nvfp4(*quantize_nvfp4(rng.standard_normal((n, kk)).astype(F32) * F32(0.05)))

    return ML.MoeLayerParams(
        w_router=to_bf16(rng.standard_normal((e, h)) * 0.05), bias=(rng.standard_normal(e) * 0.1).astype(F32),
        top_k=k, routed_scale=2.5, gamma_gate_up=0.002, gamma_down=0.0005, limit=7.0,
        gate_up=stack(2 * i, h, e), down=stack(h, i, e),
        shared_gate_up=one(2 * ish, h) if ish else None, shared_down=one(h, ish) if ish else None)


def test_empty_slots_and_no_shared_expert():
    rng = np.random.default_rng(5)
    p = _random_params(rng, 256, 128, 0, 6, 4)
    bias = p.bias.copy()
    bias[[1, 3, 4]] = -np.inf           # 3 candidates for 4 slots: the last slot is -1
    p = dataclasses.replace(p, bias=bias)
    xn = to_bf16(rng.standard_normal((2, 256)))
    g, d = ML.moe_layer(xn, p)
    assert (g.ids[:, -1] == -1).all() and (g.weights[:, -1] == 0).all()
    assert not g.gate_up[:, -1].any() and not d.edown[:, -1].any()
    assert g.shared_x is None and d.sdown is None
    _assert_same(d.y, glm_moe_combine.moe_combine(g.weights, d.edown, np.zeros((2, 256), F32), g.ids),
                 "combine without a shared expert")


def test_shared_expert_input_is_the_clamped_silu():
    rng = np.random.default_rng(9)
    p = _random_params(rng, 128, 128, 32, 4, 2)
    xn = to_bf16(rng.standard_normal((1, 128)) * 4.0)
    g, d = ML.moe_layer(xn, dataclasses.replace(p, limit=0.5))
    gu = g.shared_gate_up
    gh, uh = np.fmin(gu[:, :32], F32(0.5)), np.clip(gu[:, 32:], F32(-0.5), F32(0.5))
    _assert_same(g.shared_x, w4a16_gemv.silu_input(gh, uh), "shared down input")
