"""kda_conv_gates: a KDA layer's pack + short conv + L2 norm and its FP8 gate chain side by side in one
launch (kernels/kda_conv_gates.cuh), for the group the fusion pass merged under rule kda_conv_gates.
The two halves are the unfused kernels' device code (causal_conv1d_l2norm, kda_gates_w8a8) with
the same arguments, except that the conv reads the projection's q, k and v rows directly: the
packed [q | k | v] row is an edge inside the group. A plan that still keeps it as a buffer (a
later reader) gets the pack's own copy launch first."""
from __future__ import annotations

import dataclasses

from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.families import kda_pack
from kbpc.codegen.families._projection import materialized
from kbpc.codegen.families.causal_conv1d_l2norm import block_threads, qk_channels
from kbpc.codegen.families.kda_gates_w8a8 import PARAMS as GATE_PARAMS, fp8_gates_fit, gate_args, gate_blocks, gate_parts
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.graph import Blueprint
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node

BF = "__nv_bfloat16"
TARGET_THREADS = 128   # the gate kernel's block (four 16-row tiles); the conv takes whole heads of it
CONV_PARAMS = (f"const {BF}*", f"const {BF}*", f"const {BF}*", "float*", "long", f"const {BF}*", f"const {BF}*",
               "float", f"{BF}*", "int")


def fits(bp: Blueprint, nodes: list[Node]) -> str | None:
    """Why the side-by-side kernel cannot serve these nodes (None: it can): the gate chain's FP8
    formats and widths, the conv's head width, and a q|k|v pack of three rows with q and k alike."""
    refusal = fp8_gates_fit(bp, nodes)
    if refusal:
        return refusal
    d_k = bp.symbols["lin_k_dim"]
    if d_k % 32 or d_k > 1024:
        return f"the conv's head width {d_k} is not a multiple of 32 within a 1024-thread block"
    pack = next(n for n in nodes if n.op == "concat")
    parts = bp.inputs(pack.order)
    if len(parts) != 3 or parts[0].dim_value != parts[1].dim_value:
        return "the pack does not read q, k and v with q and k of one width"
    return None


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    pack, conv, l2 = (ctx.node(group, op) for op in ("concat", "conv1d_update", "l2_norm"))
    q, k, v = ctx.inputs(pack)
    packed, y = ctx.output(pack), ctx.output(l2)
    c, w, d_k = packed.dim_value, ctx.c.conv_width, ctx.sym["lin_k_dim"]
    c_qk = qk_channels(ctx, conv)
    if (y.dim_value != c or c_qk != q.dim_value + k.dim_value or q.dim_value != k.dim_value or c_qk % d_k
            or c != c_qk + v.dim_value):
        raise LoweringError(f"conv widths: C={c}, q {q.dim_value}, k {k.dim_value}, v {v.dim_value}, d_k={d_k}, "
                            f"out={y.dim_value}", f"group {group.id}")
    g = gate_parts(ctx, group)
    if ctx.rows(packed) != 1 or g.m != 1:
        raise LoweringError("one decode token of one sequence: the conv keeps one window", f"group {group.id}")
    if g.n % 16 or g.k % 128:
        raise LoweringError(f"the gates need N % 16 == 0 and K % 128 == 0; N={g.n}, K={g.k}", f"group {group.id}")
    threads = block_threads(d_k, TARGET_THREADS)
    warps = threads // 32
    launches = []
    if materialized(ctx, packed):   # a later group reads the packed row: the pack's own copy writes it
        launches += kda_pack.lower(ctx, dataclasses.replace(group, nodes=(pack.id,)))
    inst = KernelInstance(
        "kda_conv_gates", "kda_conv_gates.cuh",
        f"kbp::kda_conv_gates<{c}, {c_qk}, {d_k}, {w}, {g.n}, {g.k}, {g.n // g.h}, {warps}>",
        GATE_PARAMS + CONV_PARAMS)
    conv_args = (ctx.buf(q), ctx.buf(k), ctx.buf(v), ctx.state(f"{conv.id}.window", "float"), lit(c * w),
                 ctx.weight(conv, "conv_weight", BF), ctx.weight(conv, "conv_bias", BF), flt(ctx.c.l2_norm_eps),
                 ctx.buf(y), lit(c))
    blocks = 2 * gate_blocks(g.n, warps) + -(-c // threads)
    launches.append(Launch(inst, grid=(blocks, 1, 1), block=(threads, 1, 1), smem=0, args=gate_args(ctx, g) + conv_args,
                           group=group.id, nodes=tuple(group.nodes)))
    return launches
