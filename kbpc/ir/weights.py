"""Weight specs: every tensor a node reads from the checkpoint, derived from the IR.

Names follow the node ids with ModelOpt-style suffixes: `l3.moe.experts_gate_up.weight` (E2M1
codes, two per byte), `.weight_scale` (E4M3 per 16 values, or FP32 per channel for FP8),
`.weight_scale_2` (FP32 per tensor), `.input_scale` (static NVFP4 activation scale), plus the
non-GEMM parameters each op needs (norm weights, hyper-connection alpha/beta, conv taps and bias,
decay terms, router correction bias, indexer slot terms, cache scales). A GEMM weight is N x K with
N the node's output dim and K its activation input dim; routed experts stack E of them.

`mla_attention` nodes carry a `bf16` weight field but the absorbed NoPE decode math applies no
weight inside attention (the key/value up-projections live in q_b and o), so they get no tensor:
the field is read as the format of the absorbed query.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from kbpc.errors import BlueprintError
from kbpc.ir.graph import Blueprint
from kbpc.ir.records import Node, Tensor

STORAGE_BYTES = {"bf16": 2, "f32": 4, "e4m3": 1, "e2m1x2": 1, "i32": 4}

GEMM_OPS = ("linear", "lm_head", "router", "expert_gate_up", "expert_down")


@dataclass(frozen=True)
class WeightSpec:
    name: str
    node: str
    storage: str               # bf16 | f32 | e4m3 | e2m1x2 (two E2M1 codes per byte)
    shape: tuple[int, ...]
    role: str                  # weight, weight_scale, weight_scale_2, input_scale, norm, ...
    experts: int = 0           # > 0: leading dim is the expert index
    touched_per_token: float = 1.0   # fraction read per decode token at batch 1

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * STORAGE_BYTES[self.storage]

    @property
    def bytes_per_token(self) -> float:
        return self.nbytes * self.touched_per_token


def _activation_input(bp: Blueprint, node: Node) -> Tensor:
    ins = [t for t in bp.inputs(node.order) if t.format != "i32"]
    if len(ins) != 1:
        raise BlueprintError(f"a {node.op} node needs exactly one activation input, has {len(ins)}",
                             f"node {node.id}")
    return ins[0]


def _output_dim(bp: Blueprint, node: Node) -> int:
    outs = bp.outputs(node.order)
    if not outs:
        raise BlueprintError(f"a {node.op} node needs an output edge to size its weight", f"node {node.id}")
    return outs[0].dim_value


def _symbol(bp: Blueprint, name: str, node: Node) -> int:
    if name not in bp.symbols:
        raise BlueprintError(f"needs symbol {name!r} to size its parameters", f"node {node.id}")
    return bp.symbols[name]


def gemm_specs(bp: Blueprint, node: Node) -> list[WeightSpec]:
    n, k = _output_dim(bp, node), _activation_input(bp, node).dim_value
    fmt = node.precision.weight
    experts = _symbol(bp, "experts", node) if node.op.startswith("expert_") else 0
    lead = (experts,) if experts else ()
    touched = _symbol(bp, "top_k", node) / experts if experts else 1.0
    base = dict(node=node.id, experts=experts, touched_per_token=touched)
    name = node.id
    if fmt == "bf16":
        return [WeightSpec(f"{name}.weight", storage="bf16", shape=(*lead, n, k), role="weight", **base)]
    if fmt == "fp8/channel":
        return [WeightSpec(f"{name}.weight", storage="e4m3", shape=(*lead, n, k), role="weight", **base),
                WeightSpec(f"{name}.weight_scale", storage="f32", shape=(*lead, n), role="weight_scale", **base)]
    if fmt == "nvfp4/g16":
        if k % 16:
            raise BlueprintError(f"NVFP4 weight needs K divisible by 16, K is {k}", f"node {node.id}")
        specs = [WeightSpec(f"{name}.weight", storage="e2m1x2", shape=(*lead, n, k // 2), role="weight", **base),
                 WeightSpec(f"{name}.weight_scale", storage="e4m3", shape=(*lead, n, k // 16),
                            role="weight_scale", **base),
                 WeightSpec(f"{name}.weight_scale_2", storage="f32", shape=lead, role="weight_scale_2", **base)]
        if node.precision.activation == "nvfp4/g16" and node.family == "w4a4_mx_static":
            specs.append(WeightSpec(f"{name}.input_scale", storage="f32", shape=(), role="input_scale",
                                    node=node.id))
        return specs
    raise BlueprintError(f"no weight layout for format {fmt!r}", f"node {node.id}")


def param_specs(bp: Blueprint, node: Node) -> list[WeightSpec]:
    """The non-GEMM parameters of one node."""
    op, name = node.op, node.id

    def spec(suffix: str, storage: str, shape: tuple[int, ...], role: str = "param") -> WeightSpec:
        return WeightSpec(f"{name}.{suffix}", storage=storage, shape=shape, role=role, node=name)

    if op == "embed":
        rows = _symbol(bp, "vocab", node)
        return [WeightSpec(f"{name}.weight", storage="bf16", shape=(rows, _output_dim(bp, node)),
                           role="weight", node=name, touched_per_token=1.0 / rows)]
    if op == "hc_pre":
        mix = [t for t in bp.inputs(node.order) if bp.node(t.src).op == "linear:hc_mix"]
        width = mix[0].dim_value if mix else _symbol(bp, "hc", node) * (_symbol(bp, "hc", node) + 2)
        return [spec("alpha", "f32", (3,)), spec("beta", "f32", (width,))]
    if op in ("rms_norm", "final_norm"):
        return [spec("weight", "bf16", (_activation_input(bp, node).dim_value,), "norm")]
    if op == "gated_rms_norm":
        return [spec("weight", "bf16", (_symbol(bp, "lin_v_dim", node),), "norm")]
    if op == "layer_norm":
        d = _activation_input(bp, node).dim_value
        return [spec("weight", "bf16", (d,), "norm"), spec("bias", "bf16", (d,), "norm")]
    if op == "conv1d_update":
        c = _activation_input(bp, node).dim_value
        return [spec("conv_weight", "bf16", (c, bp.config.constants.conv_width)),
                spec("conv_bias", "bf16", (c,))]
    if op == "gdn_gates":
        outs = {t.id.rsplit(".", 1)[-1]: t.dim_value for t in bp.outputs(node.order)}
        heads = outs.get("beta", _symbol(bp, "lin_v_heads", node))
        channels = outs.get("decay", heads * _symbol(bp, "lin_k_dim", node))
        return [spec("A_log", "f32", (heads,)), spec("dt_bias", "f32", (channels,))]
    if op == "kpool_compress":
        return [spec("slot_bias", "f32", (_symbol(bp, "index_kpool", node), _symbol(bp, "index_head_dim", node)))]
    if op == "kv_write":
        return [spec("k_scale", "f32", (), "cache_scale")]
    if op == "top_k":
        return [spec("e_score_correction_bias", "f32", (_symbol(bp, "experts", node),))]
    return []


def node_weight_specs(bp: Blueprint, node: Node) -> list[WeightSpec]:
    if node.op_base in GEMM_OPS and node.precision.weight is not None:
        return gemm_specs(bp, node)
    return param_specs(bp, node)


def weight_specs(bp: Blueprint) -> list[WeightSpec]:
    """Every tensor of the blueprint's checkpoint, in node order."""
    return [s for node in bp.nodes() for s in node_weight_specs(bp, node)]
