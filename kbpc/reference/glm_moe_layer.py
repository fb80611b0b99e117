"""The fused MoE layer (kernels/glm_moe_layer.cuh), composed from the families' reference functions.

A GLM MoE layer is, unfused: the router GEMV (dense_bf16, FP32 out) and top-k (glm_router_topk);
the expert input's static NVFP4 quantization and the routed gate_up slot GEMV (w4a4_mx_static);
the clamped SwiGLU (glm_swiglu_clamp) and the down input's static quantization; the routed down
slot GEMV; the shared expert (w4a16_gemv: gate_up in the 16-value chunk walk, then the down GEMV
on silu(clamp(g)) * clamp(u) kept in FP32, the 8-value walk); and the combine (glm_moe_combine).
The fused kernels do exactly that math in exactly those orders, split in two launches:

    moe_gate_up:  router, top-k, quantize xn, routed gate_up -> SwiGLU -> quantized down input,
                  shared gate_up -> the shared down's FP32 input
    moe_down:     routed down, shared down, combine

so these functions are plain compositions (no new numerics), returning every intermediate the
kernels can write, for the GPU tests to compare byte for byte.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kbpc.ir.graph import Blueprint
from kbpc.ir.records import Node
from kbpc.reference import dense_bf16, glm_moe_combine, glm_router_topk, glm_swiglu_clamp, w4a16_gemv
from kbpc.reference.formats import bf16_from_bits, quantize_nvfp4_static
from kbpc.reference.w4a4_mx import w4a4_moe_slots

F32 = np.float32


@dataclass(frozen=True)
class Nvfp4:
    """An NVFP4 weight: packed codes (..., N, K/2), E4M3 scale codes (..., N, K/16) and FP32
    tensor scale(s): one per expert for a stack (E,), a scalar for one matrix. A stack may hold a
    subset of the experts: `experts` names the expert id of each stacked matrix (None: 0..E-1)."""
    packed: np.ndarray
    scales: np.ndarray
    global_scale: np.ndarray | float
    experts: tuple[int, ...] | None = None

    def parts(self) -> tuple:
        return self.packed, self.scales, self.global_scale

    def stack_ids(self, ids: np.ndarray) -> np.ndarray:
        """Expert ids (-1 kept) -> indices into this stack."""
        ids = np.asarray(ids)
        if self.experts is None:
            return ids
        where = {e: i for i, e in enumerate(self.experts)}
        missing = sorted({int(e) for e in ids.reshape(-1) if e >= 0 and int(e) not in where})
        if missing:
            raise ValueError(f"experts {missing} are not in this weight stack")
        return np.vectorize(lambda e: where.get(int(e), -1), otypes=[np.int64])(ids)


@dataclass(frozen=True)
class MoeLayerParams:
    """Everything of one MoE layer but its input row(s)."""
    w_router: np.ndarray          # (E, H) BF16 values
    bias: np.ndarray              # (E,) FP32 correction bias (selection only)
    top_k: int
    routed_scale: float
    gamma_gate_up: float          # static activation scale of the routed gate_up
    gamma_down: float             # static activation scale of the routed down
    limit: float                  # swiglu_limit
    gate_up: Nvfp4                # (E, 2I, H/2) ... [gate | up] rows
    down: Nvfp4                   # (E, H, I/2) ...
    shared_gate_up: Nvfp4 | None  # (2ISH, H/2) ... [g | u] rows; None: no shared expert
    shared_down: Nvfp4 | None     # (H, ISH/2) ...


@dataclass(frozen=True)
class GateUpOut:
    """What moe_gate_up writes (and its optional debug outputs)."""
    logits: np.ndarray            # (M, E) FP32
    weights: np.ndarray           # (M, K) FP32
    ids: np.ndarray               # (M, K) int32
    x_quant: tuple                # the expert input, NVFP4 under gamma_gate_up
    gate_up: np.ndarray           # (M, K, 2I) BF16 values (egu)
    down_in: tuple                # (packed (M, K, I/2), scales (M, K, I/16), g) under gamma_down
    shared_gate_up: np.ndarray | None  # (M, 2ISH) BF16 values (sgu)
    shared_x: np.ndarray | None   # (M, ISH) FP32: the shared down's input


@dataclass(frozen=True)
class DownOut:
    edown: np.ndarray             # (M, K, H) BF16 values
    sdown: np.ndarray | None      # (M, H) BF16 values
    y: np.ndarray                 # (M, H) BF16 values


def moe_gate_up(xn, p: MoeLayerParams) -> GateUpOut:
    """The first launch's math. xn (M, H) BF16 values."""
    xn = np.atleast_2d(np.asarray(xn, F32))
    logits = dense_bf16.dense_gemv_bf16(xn, p.w_router, "f32")
    weights, ids = glm_router_topk.router_topk(logits, p.bias, p.top_k, p.routed_scale)
    xq = quantize_nvfp4_static(xn, p.gamma_gate_up)
    egu = w4a4_moe_slots(*xq, *p.gate_up.parts(), p.gate_up.stack_ids(ids))
    h = glm_swiglu_clamp.swiglu_clamp_rows(egu, p.limit)
    down_in = quantize_nvfp4_static(h, p.gamma_down)
    sgu = shared_x = None
    if p.shared_gate_up is not None:
        sgu = w4a16_gemv.w4a16_gemv(xn, *p.shared_gate_up.parts(), walk="chunk16")
        shared_x = w4a16_gemv.silu_input(*glm_swiglu_clamp.split_gate_up(glm_swiglu_clamp.clamp_gate_up(sgu, p.limit)))
    return GateUpOut(logits, weights, ids, xq, egu, down_in, sgu, shared_x)


def moe_down(g: GateUpOut, p: MoeLayerParams) -> DownOut:
    """The second launch's math, from the first's outputs."""
    edown = w4a4_moe_slots(*g.down_in, *p.down.parts(), p.down.stack_ids(g.ids))
    if p.shared_down is not None:
        sdown = w4a16_gemv.w4a16_gemv(g.shared_x, *p.shared_down.parts(), walk="vec8")
        shared = sdown
    else:
        sdown, shared = None, np.zeros((edown.shape[0], edown.shape[2]), F32)
    # The blueprint's blend reads the weights, not the ids (an unfilled slot adds +0): the kernel
    # skips id -1 slots, which gives the same bytes.
    y = glm_moe_combine.moe_combine(g.weights, edown, shared)
    return DownOut(edown, sdown, y)


def moe_layer(xn, p: MoeLayerParams) -> tuple[GateUpOut, DownOut]:
    g = moe_gate_up(xn, p)
    return g, moe_down(g, p)


# ------------------------------------------------------------------ from a blueprint

MOE_OPS = ("router", "top_k", "expert_gate_up", "expert_down")


def block_nodes(bp: Blueprint, block: str) -> dict[str, Node]:
    """A MoE block's nodes by role: the four MOE_OPS, plus shared_gate_up / shared_down."""
    found: dict[str, Node] = {}
    for node in bp.nodes():
        if node.block != block:
            continue
        if node.op_base in MOE_OPS:
            found[node.op_base] = node
        elif node.op_base == "linear" and node.op.split(":", 1)[1] in ("shared_gate_up", "shared_down"):
            found[node.op.split(":", 1)[1]] = node
    missing = [op for op in MOE_OPS if op not in found]
    if missing:
        raise ValueError(f"block {block} has no {', '.join(missing)} node")
    return found


def layer_params(bp: Blueprint, weights: dict[str, np.ndarray], block: str) -> MoeLayerParams:
    """The MoeLayerParams of block `block` (e.g. "l3.moe") from a blueprint's weights."""
    n = block_nodes(bp, block)

    def nvfp4(node: Node | None) -> Nvfp4 | None:
        if node is None:
            return None
        return Nvfp4(weights[f"{node.id}.weight"], weights[f"{node.id}.weight_scale"],
                     np.asarray(weights[f"{node.id}.weight_scale_2"], F32))

    def gamma(node: Node) -> float:
        return float(np.asarray(weights[f"{node.id}.input_scale"], F32).reshape(-1)[0])

    c = bp.config.constants
    return MoeLayerParams(
        w_router=bf16_from_bits(weights[f"{n['router'].id}.weight"]),
        bias=np.asarray(weights[f"{n['top_k'].id}.e_score_correction_bias"], F32),
        top_k=int(bp.symbols["top_k"]), routed_scale=float(c.routed_scale),
        gamma_gate_up=gamma(n["expert_gate_up"]), gamma_down=gamma(n["expert_down"]),
        limit=float(c.swiglu_limit), gate_up=nvfp4(n["expert_gate_up"]), down=nvfp4(n["expert_down"]),
        shared_gate_up=nvfp4(n.get("shared_gate_up")), shared_down=nvfp4(n.get("shared_down")))
