"""kda_gates_w8a8: the KDA decode gate chain in one launch (kernels/kda_gates_w8a8.cuh). The group's
fa_quant -> f_b -> gates (decay, beta) and ga_quant -> g_b nodes are one kernel: the FP8 token
rows and f stay on chip; decay (FP32), beta (FP32) and the output gate g (BF16) are written."""
from __future__ import annotations

from kbpc.codegen.args import NULL, lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node, Tensor

BF = "__nv_bfloat16"
WARPS = 4        # 16-row output tiles per block
MAX_ROWS = 8     # the MMA's token columns


def gate_blocks(n: int, warps: int = WARPS) -> int:
    """kbp::kda_gates_blocks<N, WARPS>(): blocks per segment (f, then o_g)."""
    return -(-(n // 16) // warps)


def _projection(ctx: LowerCtx, linear: Node) -> tuple[Node, Tensor]:
    """(the W8A8 linear, its BF16 token row before the act_quant it reads)."""
    quant = ctx.bp.node(ctx.input(linear).src)
    if quant.op_base != "act_quant" or quant.precision.output[0] != "fp8/token":
        raise LoweringError("the gate projection does not read an fp8/token act_quant", f"node {linear.id}")
    if linear.precision.weight != "fp8/channel":
        raise LoweringError(f"gate weight {linear.precision.weight} is not fp8/channel", f"node {linear.id}")
    return linear, ctx.input(quant)


def _optional_buf(ctx: LowerCtx, t: Tensor, ctype: str) -> str:
    """f is normally fused (no buffer): the kernel writes it only when a later group reads it."""
    try:
        return ctx.buf(t, ctype)
    except LoweringError:
        return NULL


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    gates = ctx.node(group, "gdn_gates")
    f_edge, b = ctx.input(gates, "f"), ctx.input(gates, "b")
    decay, beta = ctx.output(gates, "decay"), ctx.output(gates, "beta")
    f_b, xf = _projection(ctx, ctx.bp.node(f_edge.src))
    others = [n for n in ctx.nodes(group) if n.op_base == "linear" and n.id != f_b.id]
    if len(others) != 1:
        raise LoweringError(f"expected one output-gate projection, found {len(others)}", f"group {group.id}")
    g_b, xg = _projection(ctx, others[0])
    og = ctx.output(g_b)
    n, k, h = f_edge.dim_value, xf.dim_value, b.dim_value
    m = ctx.rows(xf)
    if og.dim_value != n or xg.dim_value != k or decay.dim_value != n or beta.dim_value != h:
        raise LoweringError(f"gate widths: f {n}, o_g {og.dim_value}, K {k}/{xg.dim_value}, heads {h}",
                            f"group {group.id}")
    if n % 16 or k % 128 or n % h or not 1 <= m <= MAX_ROWS or ctx.rows(xg) != m:
        raise LoweringError(f"kda_gates_w8a8 needs N % 16 == 0, K % 128 == 0, N % H == 0, 1..8 rows; "
                            f"N={n}, K={k}, H={h}, rows={m}", f"group {group.id}")
    if not ctx.c.kda_gate_lower_bound < 0:
        raise LoweringError(f"the gate lower bound must be negative, got {ctx.c.kda_gate_lower_bound}")
    d_k = n // h   # the reference's decay_gate: f channels split into len(A_log) heads
    inst = KernelInstance(
        "kda_gates_w8a8", "kda_gates_w8a8.cuh", f"kbp::kda_gates_w8a8_k128_rows<{n}, {k}, {d_k}, {WARPS}>",
        (f"const {BF}*", f"const {BF}*", "int", "int", "const uint8_t*", "const float*", "const uint8_t*",
         "const float*", "const float*", "const float*", "float", f"const {BF}*", "int", "float*", "int",
         f"{BF}*", "int", "float*", "int", f"{BF}*", "int"))
    args = (ctx.buf(xf), ctx.buf(xg), lit(k), lit(m),
            ctx.weight(f_b), ctx.weight(f_b, "weight_scale", "float"),
            ctx.weight(g_b), ctx.weight(g_b, "weight_scale", "float"),
            ctx.weight(gates, "A_log", "float"), ctx.weight(gates, "dt_bias", "float"),
            flt(ctx.c.kda_gate_lower_bound), ctx.buf(b), lit(h),
            ctx.buf(decay, "float"), lit(n), ctx.buf(og), lit(n), ctx.buf(beta, "float"), lit(h),
            _optional_buf(ctx, f_edge, BF), lit(n))
    return [Launch(inst, grid=(2 * gate_blocks(n), 1, 1), block=(32 * WARPS, 1, 1), smem=0, args=args,
                   group=group.id, nodes=tuple(group.nodes))]
