"""kda_gates_w8a8: the KDA decode gate chain in one launch (kernels/kda_gates_w8a8.cuh). The group's
fa_quant -> f_b -> gates (decay, beta) and ga_quant -> g_b nodes are one kernel: the FP8 token
rows and f stay on chip; decay (FP32), beta (FP32) and the output gate g (BF16) are written."""
from __future__ import annotations

from dataclasses import dataclass

from kbpc.codegen.args import NULL, lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.graph import Blueprint
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node, Tensor

BF = "__nv_bfloat16"
WARPS = 4        # 16-row output tiles per block
MAX_ROWS = 8     # the MMA's token columns


def gate_blocks(n: int, warps: int = WARPS) -> int:
    """kbp::kda_gates_blocks<N, WARPS>(): blocks per segment (f, then o_g)."""
    return -(-(n // 16) // warps)


def gate_projection(ctx: LowerCtx, linear: Node) -> tuple[Node, Tensor]:
    """(the W8A8 linear, its BF16 token row before the act_quant it reads)."""
    quant = ctx.bp.node(ctx.input(linear).src)
    if quant.op_base != "act_quant" or quant.precision.output[0] != "fp8/token":
        raise LoweringError("the gate projection does not read an fp8/token act_quant", f"node {linear.id}")
    if linear.precision.weight != "fp8/channel":
        raise LoweringError(f"gate weight {linear.precision.weight} is not fp8/channel", f"node {linear.id}")
    return linear, ctx.input(quant)


def fp8_gates_fit(bp: Blueprint, nodes: list[Node]) -> str | None:
    """Why a fused form cannot run these nodes' gate chain with this family's device code (None:
    it can): every gate quantizer writes fp8/token rows of width a multiple of 128, every gate
    projection has an fp8/channel weight."""
    for quant in (n for n in nodes if n.op == "act_quant"):
        if any(t.format != "fp8/token" for t in bp.outputs(quant.order)):
            return "a gate quantizer does not write fp8/token"
        if bp.inputs(quant.order)[0].dim_value % 128:
            return f"gate rank {bp.inputs(quant.order)[0].dim_value} is not a multiple of 128"
    if any(n.precision.weight != "fp8/channel" for n in nodes if n.op_base == "linear"):
        return "a gate projection's weight is not fp8/channel"
    return None


def _optional_buf(ctx: LowerCtx, t: Tensor, ctype: str) -> str:
    """f is normally fused (no buffer): the kernel writes it only when a later group reads it."""
    try:
        return ctx.buf(t, ctype)
    except LoweringError:
        return NULL


@dataclass(frozen=True)
class GateParts:
    """The group's parts: the two gate projections, their BF16 token rows and the edges written."""
    gates: Node
    f_b: Node
    g_b: Node
    xf: Tensor
    xg: Tensor
    f_edge: Tensor
    b: Tensor
    decay: Tensor
    beta: Tensor
    og: Tensor
    n: int
    k: int
    h: int
    m: int


def gate_parts(ctx: LowerCtx, group: LoweredGroup) -> GateParts:
    gates = ctx.node(group, "gdn_gates")
    f_edge, b = ctx.input(gates, "f"), ctx.input(gates, "b")
    decay, beta = ctx.output(gates, "decay"), ctx.output(gates, "beta")
    f_b, xf = gate_projection(ctx, ctx.bp.node(f_edge.src))
    others = [n for n in ctx.nodes(group) if n.op_base == "linear" and n.id != f_b.id]
    if len(others) != 1:
        raise LoweringError(f"expected one output-gate projection, found {len(others)}", f"group {group.id}")
    g_b, xg = gate_projection(ctx, others[0])
    og = ctx.output(g_b)
    n, k, h = f_edge.dim_value, xf.dim_value, b.dim_value
    m = ctx.rows(xf)
    if og.dim_value != n or xg.dim_value != k or decay.dim_value != n or beta.dim_value != h:
        raise LoweringError(f"gate widths: f {n}, o_g {og.dim_value}, K {k}/{xg.dim_value}, heads {h}",
                            f"group {group.id}")
    if n % h or ctx.rows(xg) != m:
        raise LoweringError(f"the gates need N % H == 0 and as many g rows as f rows; N={n}, H={h}, rows={m}",
                            f"group {group.id}")
    if not ctx.c.kda_gate_lower_bound < 0:
        raise LoweringError(f"the gate lower bound must be negative, got {ctx.c.kda_gate_lower_bound}")
    return GateParts(gates, f_b, g_b, xf, xg, f_edge, b, decay, beta, og, n, k, h, m)


def gate_args(ctx: LowerCtx, p: GateParts) -> tuple:
    """The launch arguments both variants share (kernels/kda_gates_w8a8.cuh's contract)."""
    return (ctx.buf(p.xf), ctx.buf(p.xg), lit(p.k), lit(p.m),
            ctx.weight(p.f_b), ctx.weight(p.f_b, "weight_scale", "float"),
            ctx.weight(p.g_b), ctx.weight(p.g_b, "weight_scale", "float"),
            ctx.weight(p.gates, "A_log", "float"), ctx.weight(p.gates, "dt_bias", "float"),
            flt(ctx.c.kda_gate_lower_bound), ctx.buf(p.b), lit(p.h),
            ctx.buf(p.decay, "float"), lit(p.n), ctx.buf(p.og), lit(p.n), ctx.buf(p.beta, "float"), lit(p.h),
            _optional_buf(ctx, p.f_edge, BF), lit(p.n))


PARAMS = (f"const {BF}*", f"const {BF}*", "int", "int", "const uint8_t*", "const float*", "const uint8_t*",
          "const float*", "const float*", "const float*", "float", f"const {BF}*", "int", "float*", "int",
          f"{BF}*", "int", "float*", "int", f"{BF}*", "int")


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    p = gate_parts(ctx, group)
    if p.n % 16 or p.k % 128 or not 1 <= p.m <= MAX_ROWS:
        raise LoweringError(f"kda_gates_w8a8 needs N % 16 == 0, K % 128 == 0, 1..8 rows; "
                            f"N={p.n}, K={p.k}, rows={p.m}", f"group {group.id}")
    d_k = p.n // p.h   # the reference's decay_gate: f channels split into len(A_log) heads
    inst = KernelInstance("kda_gates_w8a8", "kda_gates_w8a8.cuh",
                          f"kbp::kda_gates_w8a8_k128_rows<{p.n}, {p.k}, {d_k}, {WARPS}>", PARAMS)
    return [Launch(inst, grid=(2 * gate_blocks(p.n), 1, 1), block=(32 * WARPS, 1, 1), smem=0, args=gate_args(ctx, p),
                   group=group.id, nodes=tuple(group.nodes))]


def lower_unquantized(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    """Without activation quantization (Options.act_quant off): the gate projections multiply the
    BF16 rows by the dequantized FP8 weights in FP32 (kda_gates_dq_rows), the same epilogues."""
    p = gate_parts(ctx, group)
    warps = 8
    inst = KernelInstance("kda_gates_w8a8", "kda_gates_w8a8.cuh", f"kbp::kda_gates_dq_rows<{warps}>",
                          (*PARAMS, "int", "int", "int"))
    return [Launch(inst, grid=(-(-p.n // warps), 2, p.m), block=(32 * warps, 1, 1), smem=0,
                   args=(*gate_args(ctx, p), lit(p.n), lit(p.k), lit(p.n // p.h)),
                   group=group.id, nodes=tuple(group.nodes))]
