"""kda_recurrent: the KDA gated delta rule, one decode token (kernels/kda_recurrent.cuh, the
register-resident _seq_reg form with T = 1). Reads q|k|v as views of the conv's packed BF16 row,
the FP32 log decay and beta from the gate group, and advances the FP32 state [h][k][v] in place.
A group the fusion pass merged with the gated output norm (rule kda_recurrence_norm) lowers to
kda_recurrent_norm_decode_bf16: one block per value head, the norm as its epilogue."""
from __future__ import annotations

import numpy as np

from kbpc.codegen.args import NULL, lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.families._projection import materialized
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.graph import Blueprint
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node

BF = "__nv_bfloat16"
COLS = 32   # one warp of value columns per block: HV * DV / 32 blocks for one token


def query_scale(d: int) -> float:
    """1/sqrt(D) in FP32 as the reference forms it (kbpc.reference.kda_recurrent.query_scale)."""
    from kbpc.reference.kda_recurrent import query_scale as rule
    return float(np.float32(rule(d)))


def norm_fits(bp: Blueprint, nodes: list[Node]) -> str | None:
    """Why the recurrence + gated norm form cannot serve these nodes (None: it can): the norm reads
    the recurrence's output, one head of d_v channels per block of at most 1024 threads."""
    recur = next(n for n in nodes if n.op == "gdn_recurrence")
    norm = next(n for n in nodes if n.op == "gated_rms_norm")
    if not any(t.src == recur.order for t in bp.inputs(norm.order)):
        return "the norm does not read the recurrence's output"
    dv = bp.symbols["lin_v_dim"]
    if dv % 32 or dv > 1024:
        return f"the value head width {dv} is not a multiple of 32 up to 1024 (one block per head)"
    return None


def _widths(ctx: LowerCtx, node: Node) -> tuple[int, int, int, int]:
    """(HK, HV, DK, DV): d_k from the symbols, value heads from beta, d_v from what is left (the
    reference's split)."""
    qkv, decay, beta, out = (ctx.input(node, "qkvn"), ctx.input(node, "decay"), ctx.input(node, "beta"),
                             ctx.output(node))
    hk, dk, hv = ctx.sym["lin_k_heads"], ctx.sym["lin_k_dim"], beta.dim_value
    n_qk = hk * dk
    dv = (qkv.dim_value - 2 * n_qk) // hv
    if (qkv.dim_value - 2 * n_qk != hv * dv or decay.dim_value != hv * dk or out.dim_value != hv * dv
            or hv % hk or dv % 32 or dk % 4):
        raise LoweringError(f"recurrence widths: qkv {qkv.dim_value}, HK={hk}, HV={hv}, DK={dk}, DV={dv}, "
                            f"decay {decay.dim_value}, out {out.dim_value}", f"node {node.id}")
    if ctx.rows(qkv) != 1:
        raise LoweringError("one state per sequence: the decode recurrence runs one row", f"node {node.id}")
    return hk, hv, dk, dv


def _lower_with_norm(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    node, norm = ctx.node(group, "gdn_recurrence"), ctx.node(group, "gated_rms_norm")
    hk, hv, dk, dv = _widths(ctx, node)
    qkv, out = ctx.input(node, "qkvn"), ctx.output(node)
    gate, y = ctx.input(norm, "g"), ctx.output(norm)
    if ctx.input(norm, "core").src != node.order or ctx.sym["lin_v_dim"] != dv or dv > 1024:
        raise LoweringError(f"the gated norm's head width {ctx.sym['lin_v_dim']} is not the recurrence's "
                            f"d_v {dv} (at most 1024)", f"group {group.id}")
    if gate.dim_value != hv * dv or y.dim_value != hv * dv:
        raise LoweringError(f"o_norm widths: gate {gate.dim_value}, y {y.dim_value}, HV*DV={hv * dv}", f"group {group.id}")
    inst = KernelInstance(
        "kda_recurrent", "kda_recurrent.cuh", f"kbp::kda_recurrent_norm_decode_bf16<{hk}, {hv}, {dk}, {dv}>",
        (f"const {BF}*", f"const {BF}*", f"const {BF}*", "const float*", "const float*", "float", "float*",
         "float*", f"const {BF}*", f"const {BF}*", "int", "float", f"{BF}*"))
    row, n_qk = ctx.buf(qkv), hk * dk
    args = (row, row.plus(n_qk), row.plus(2 * n_qk), ctx.buf(ctx.input(node, "decay"), "float"),
            ctx.buf(ctx.input(node, "beta"), "float"), flt(query_scale(dk)), ctx.state(f"{node.id}.state", "float"),
            ctx.buf(out, "float") if materialized(ctx, out) else NULL, ctx.buf(gate), ctx.weight(norm, ctype=BF),
            lit(0), flt(ctx.c.kda_norm_eps), ctx.buf(y))
    return [Launch(inst, grid=(hv, 1, 1), block=(dv, 1, 1), smem=0, args=args, group=group.id,
                   nodes=tuple(group.nodes))]


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    if any(n.op == "gated_rms_norm" for n in ctx.nodes(group)):
        return _lower_with_norm(ctx, group)
    launches = []
    for node in ctx.nodes(group):
        qkv, decay, beta = ctx.input(node, "qkvn"), ctx.input(node, "decay"), ctx.input(node, "beta")
        out = ctx.output(node)
        hk, hv, dk, dv = _widths(ctx, node)
        n_qk = hk * dk
        inst = KernelInstance(
            "kda_recurrent", "kda_recurrent.cuh",
            f"kbp::kda_recurrent_decode_bf16_seq_reg<{hk}, {hv}, {dk}, {dv}, {COLS}, 1>",
            (f"const {BF}*", f"const {BF}*", f"const {BF}*", "int", "const float*", "int", "const float*", "int",
             "float", "float*", "long", "float*", "float*", "int"))
        row = ctx.buf(qkv)
        args = (row, row.plus(n_qk), row.plus(2 * n_qk), lit(qkv.dim_value),
                ctx.buf(decay, "float"), lit(hv * dk), ctx.buf(beta, "float"), lit(hv), flt(query_scale(dk)),
                ctx.state(f"{node.id}.state", "float"), lit(hv * dk * dv), NULL,
                ctx.buf(out, "float"), lit(hv * dv))
        launches.append(Launch(inst, grid=(hv, dv // COLS, 1), block=(COLS, 1, 1), smem=0, args=args,
                               group=group.id, nodes=(node.id,)))
    return launches
