"""glm_moe_combine: the blend node (kernels/glm_moe_combine.cuh), glm_moe_combine_kda / _dsa:
y = rn_bf16(sum over slots fl(w * e) + shared) with the routed rows in slot order (row t*K + k of
the expert-down buffer) and the ungated shared expert's row.

The ids pointer is null, so every slot is summed, as the reference's blend does (it reads the
weights, not the ids): an unfilled slot has weight 0 and a +0 expert row, which adds +0. The ids
are not an input edge of the blend either, so their buffer may already be reused here."""
from __future__ import annotations

from kbpc.codegen.args import NULL, Aggregate
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families._projection import require
from kbpc.codegen.families._rows import BF16, row_grid, split_inputs, vec_width
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node, Tensor

HEADER = "glm_moe_combine.cuh"
THREADS = 64
VEC = 8                 # 16-byte BF16 loads
PARAMS = ("const float*", "const int*", "const int*", f"const {BF16}*", f"const {BF16}*", f"{BF16}*")


def operands(ctx: LowerCtx, node: Node) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(router weights, routed expert rows, shared expert row, output) of a blend node, checked;
    the fused hyper-connection boundary (glm_mhc) reads the same operands."""
    weights, _ = split_inputs(ctx, node, "top_k")
    routed, _ = split_inputs(ctx, node, "expert_down")
    shared, _ = split_inputs(ctx, node, "linear")
    require(len(weights) == 1 and len(routed) == 1 and len(shared) == 1,
            "blend needs the top_k weights, the routed expert rows and the shared expert row", node)
    w, e, sh, y = weights[0], routed[0], shared[0], ctx.output(node)
    d, k = y.dim_value, w.dim_value
    require(w.format == "f32" and e.dim_value == d and sh.dim_value == d,
            f"weights {w.format}, expert rows {e.dim_value}, shared {sh.dim_value}, out {d}", node)
    rows = ctx.rows(y)
    require(ctx.rows(w) == rows and ctx.rows(sh) == rows and ctx.rows(e) == rows * k,
            f"{ctx.rows(e)} routed rows for {rows} tokens x {k} slots", node)
    return w, e, sh, y


def combine_in(ctx: LowerCtx, node: Node) -> tuple[int, Aggregate]:
    """(K, kbp::MoeCombineIn<K>{weights, ids, slot_rows, expert_out, shared}) of a blend node: slot
    order, no ids (see the module docstring)."""
    w, e, sh, _ = operands(ctx, node)
    return w.dim_value, Aggregate(None, (ctx.buf(w, "const float"), NULL, NULL, ctx.buf(e, f"const {BF16}"),
                                         ctx.buf(sh, f"const {BF16}")))


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    node = ctx.node(group, "blend")
    w, e, sh, y = operands(ctx, node)
    d, k, rows = y.dim_value, w.dim_value, ctx.rows(y)
    vec = vec_width(d, VEC)
    inst = KernelInstance("glm_moe_combine", HEADER, f"kbp::moe_combine<{d}, {k}, {vec}>", PARAMS)
    args = (ctx.buf(w, "const float"), NULL, NULL, ctx.buf(e, f"const {BF16}"),
            ctx.buf(sh, f"const {BF16}"), ctx.buf(y))
    return [Launch(inst, grid=row_grid(d, THREADS, vec, rows), block=(THREADS, 1, 1), smem=0, args=args,
                   group=group.id, nodes=(node.id,))]
