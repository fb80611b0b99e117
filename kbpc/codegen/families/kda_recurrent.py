"""kda_recurrent: the KDA gated delta rule, one decode token (kernels/kda_recurrent.cuh, the
register-resident _seq_reg form with T = 1). Reads q|k|v as views of the conv's packed BF16 row,
the FP32 log decay and beta from the gate group, and advances the FP32 state [h][k][v] in place."""
from __future__ import annotations

import numpy as np

from kbpc.codegen.args import NULL, lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup

BF = "__nv_bfloat16"
COLS = 32   # one warp of value columns per block: HV * DV / 32 blocks for one token


def query_scale(d: int) -> float:
    """1/sqrt(D) in FP32 as the reference forms it (kbpc.reference.kda_recurrent.query_scale)."""
    from kbpc.reference.kda_recurrent import query_scale as rule
    return float(np.float32(rule(d)))


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    launches = []
    for node in ctx.nodes(group):
        qkv, decay, beta = ctx.input(node, "qkvn"), ctx.input(node, "decay"), ctx.input(node, "beta")
        out = ctx.output(node)
        # The reference's split: d_k from the symbols, value heads from beta, d_v from what is left.
        hk, dk, hv = ctx.sym["lin_k_heads"], ctx.sym["lin_k_dim"], beta.dim_value
        n_qk = hk * dk
        dv = (qkv.dim_value - 2 * n_qk) // hv
        if (qkv.dim_value - 2 * n_qk != hv * dv or decay.dim_value != hv * dk or out.dim_value != hv * dv
                or hv % hk or dv % COLS or dk % 4):
            raise LoweringError(f"recurrence widths: qkv {qkv.dim_value}, HK={hk}, HV={hv}, DK={dk}, DV={dv}, "
                                f"decay {decay.dim_value}, out {out.dim_value}", f"node {node.id}")
        if ctx.rows(qkv) != 1:
            raise LoweringError("one state per sequence: the decode recurrence runs one row", f"node {node.id}")
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
