"""causal_conv1d_l2norm: the KDA short conv update + SiLU + q/k head L2 norm in one kernel
(kernels/causal_conv1d_l2norm.cuh). The group's conv1d_update, state_snapshot (a no-op in decode)
and l2_norm nodes are that one launch; the conv's FP32 output stays on chip and the BF16 l2_norm
output is the group's only activation buffer. The window state advances in place."""
from __future__ import annotations

from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup

BF = "__nv_bfloat16"
TARGET_THREADS = 256   # two 128-channel heads per block, as the family describes


def block_threads(d_k: int, target: int = TARGET_THREADS) -> int:
    """Whole heads per block (THREADS % DK == 0), about `target` threads, at most 1024."""
    if d_k % 32 or d_k > 1024:
        raise LoweringError(f"the conv's head width {d_k} must be a multiple of 32, at most 1024")
    return d_k * max(1, target // d_k)


def qk_channels(ctx: LowerCtx, conv) -> int:
    """q+k channels: the first two inputs of the concat feeding the conv (the reference's c_qk)."""
    pack = ctx.bp.node(ctx.input(conv).src)
    if pack.op_base != "concat":
        raise LoweringError("the short conv does not read the q|k|v pack", f"node {conv.id}")
    return sum(t.dim_value for t in ctx.inputs(pack)[:2])


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    conv, l2 = ctx.node(group, "conv1d_update"), ctx.node(group, "l2_norm")
    x, y = ctx.input(conv), ctx.output(l2)
    c, w, d_k = x.dim_value, ctx.c.conv_width, ctx.sym["lin_k_dim"]
    c_qk = qk_channels(ctx, conv)
    if y.dim_value != c or c_qk % d_k or c_qk > c:
        raise LoweringError(f"conv widths: C={c}, C_QK={c_qk}, d_k={d_k}, out={y.dim_value}", f"group {group.id}")
    if ctx.rows(x) != 1:
        raise LoweringError("one window per sequence: the decode conv runs one row", f"node {conv.id}")
    threads = block_threads(d_k)
    inst = KernelInstance(
        "causal_conv1d_l2norm", "causal_conv1d_l2norm.cuh",
        f"kbp::causal_conv1d_update_l2norm<{c}, {c_qk}, {d_k}, {w}, {threads}, {BF}>",
        (f"const {BF}*", "int", "float*", "long", f"const {BF}*", f"const {BF}*", "float", f"{BF}*", "int"))
    args = (ctx.buf(x), lit(c), ctx.state(f"{conv.id}.window", "float"), lit(c * w),
            ctx.weight(conv, "conv_weight", BF), ctx.weight(conv, "conv_bias", BF),
            flt(ctx.c.l2_norm_eps), ctx.buf(y), lit(c))
    return [Launch(inst, grid=(-(-c // threads), 1, 1), block=(threads, 1, 1), smem=0, args=args,
                   group=group.id, nodes=tuple(group.nodes))]
