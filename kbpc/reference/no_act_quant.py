"""The reference without activation quantization: a debugging aid, never a default.

`kbpc run --backend reference --no-act-quant` keeps every activation the blueprint quantizes in
BF16/FP32: an act_quant node passes its BF16 row through unchanged, a projection fed such a row
multiplies it by its dequantized weight (E2M1 x E4M3 block scale x tensor scale, or E4M3 x channel
scale, exact in FP32) in FP32 and rounds its output as the node's format says, and the MLA latent
cache keeps the normalised FP32 row instead of E4M3 codes (attention over it is a plain FP32
softmax). Weights are exactly those of the normal run. It exists to compare kbpc with an
implementation that does not quantize activations (transformers on the dequantized checkpoint):
4-bit activation quantization makes a tiny random model's logits chaotic, and without it the two
agree to rounding level. The handlers below override the op table of kbpc/reference/ops.py."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kbpc.reference import glm_mla_latent_write, ops
from kbpc.reference.formats import dequantize_fp8, dequantize_nvfp4, to_bf16
from kbpc.reference.interpreter import Handler, Inputs, Step
from kbpc.ir.records import Node

F32 = np.float32


@dataclass(frozen=True)
class Unquantized:
    """A row an act_quant node would have quantized, kept as its FP32 (BF16-valued) values."""
    x: np.ndarray


@dataclass
class FloatLatent:
    """The MLA latent cache without FP8: one normalised FP32 row per position."""
    rows: np.ndarray


def _weight(s: Step, node: Node) -> np.ndarray:
    """The node's weight as FP32 values, (N, K) or (E, N, K) for routed experts."""
    fmt = node.precision.weight
    if fmt == "nvfp4/g16":
        packed, scales, scale2 = s.nvfp4(node)
        scale2 = np.asarray(scale2, F32)
        if packed.ndim == 3:
            return np.stack([dequantize_nvfp4(packed[e], scales[e], scale2[e]) for e in range(packed.shape[0])])
        return dequantize_nvfp4(packed, scales, scale2)
    if fmt == "fp8/channel":
        return dequantize_fp8(*s.fp8(node))
    return s.bf16(node)


def _finish(node: Node, y: np.ndarray) -> np.ndarray:
    return y.astype(F32) if node.precision.output[:1] == ("f32",) else to_bf16(y.astype(F32))


def act_quant(s: Step, node: Node, ins: Inputs):
    return Unquantized(np.asarray(ins.activation(), F32))


def linear(s: Step, node: Node, ins: Inputs):
    x = ins.activation()
    if not isinstance(x, Unquantized):
        return ops.linear(s, node, ins)
    return _finish(node, x.x.reshape(-1, x.x.shape[-1]) @ _weight(s, node).T)


def experts(s: Step, node: Node, ins: Inputs):
    ids = np.asarray(next(v for t, _, v in ins.items if t.format == "i32"), np.int64)
    act = next(v for t, _, v in ins.items if t.format != "i32")
    if not isinstance(act, Unquantized):
        return ops.experts(s, node, ins)
    w = _weight(s, node)
    x = act.x if act.x.ndim == ids.ndim + 1 else np.broadcast_to(act.x[..., None, :], ids.shape + act.x.shape[-1:])
    y = np.zeros(ids.shape + (w.shape[1],), F32)
    for slot in np.ndindex(ids.shape):
        if ids[slot] >= 0:
            y[slot] = _finish(node, x[slot] @ w[ids[slot]].T)
    return y


def kv_write(s: Step, node: Node, ins: Inputs):
    c = np.asarray(ins.activation(), F32).reshape(1, -1)
    norm = s.producer(node, "rms_norm")
    cache = s.state.latent.get(node.id)
    if cache is None:
        cache = s.state.latent[node.id] = FloatLatent(np.zeros((s.state.max_context, c.shape[-1]), F32))
    cache.rows[s.position] = glm_mla_latent_write.latent_values(c, s.bf16(norm), s.c.rms_eps, 1.0)[0]
    return {}


def mla_attention(s: Step, node: Node, ins: Inputs):
    sel = np.asarray(ins.from_op("index_select"), np.int64).reshape(-1)
    q = next(v for t, n, v in ins.items if n.op_base == "linear")
    writer = next(n for n in s.bp.nodes() if n.op == "kv_write" and n.block == node.block)
    rows = s.state.latent[writer.id].rows
    q = np.asarray(q, F32).reshape(-1, rows.shape[-1])
    sel = sel[(sel >= 0) & (sel <= s.position)]
    if sel.size == 0:
        return np.zeros((1, q.size), F32)
    v = rows[sel]
    z = (q @ v.T) / np.sqrt(F32(rows.shape[-1]))
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    return to_bf16(((p @ v) / p.sum(axis=-1, keepdims=True)).astype(F32)).reshape(1, -1)


HANDLERS: dict[str, Handler] = {
    **ops.HANDLERS, "act_quant": act_quant, "linear": linear, "lm_head": linear, "router": linear,
    "expert_gate_up": experts, "expert_down": experts, "kv_write": kv_write, "mla_attention": mla_attention,
}
