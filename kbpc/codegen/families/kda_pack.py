"""kda_pack: the KDA q|k|v pack (kernels/kda_pack.cuh), a bit-exact copy of three BF16 rows into
one [q | k | v] row (the layout the conv reads). When memory planning placed q, k and v inside the
packed row (kbpc.passes.plan_memory.in_place_concats: their producer writes the row directly),
the copy is the identity and no kernel is launched."""
from __future__ import annotations

from kbpc.codegen.args import lit
from kbpc.codegen.context import LowerCtx, LoweringError
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup

THREADS = 256
BF = "__nv_bfloat16"


def pack_vec(nq: int, nk: int, nv: int) -> int:
    """kbp::kda_pack_vec<NQ, NK, NV>(): the widest copy unit dividing all three widths."""
    if nq % 8 == 0 and nk % 8 == 0 and nv % 8 == 0:
        return 8
    return 2 if nq % 2 == 0 and nk % 2 == 0 and nv % 2 == 0 else 1


def pack_blocks(nq: int, nk: int, nv: int, threads: int = THREADS) -> int:
    """kbp::kda_pack_blocks<NQ, NK, NV, THREADS>()."""
    return -(-((nq + nk + nv) // pack_vec(nq, nk, nv)) // threads)


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    launches = []
    for node in ctx.nodes(group):
        ins = ctx.inputs(node)   # q, k, v in edge order, as the reference's concat reads them
        out = ctx.output(node)
        if len(ins) != 3:
            raise LoweringError(f"the q|k|v pack needs three inputs, found {len(ins)}", f"node {node.id}")
        nq, nk, nv = (t.dim_value for t in ins)
        if out.dim_value != nq + nk + nv:
            raise LoweringError(f"packed width {out.dim_value} != {nq}+{nk}+{nv}", f"node {node.id}")
        if ctx.in_place(ins, out):
            continue
        rows = ctx.rows(out)
        inst = KernelInstance("kda_pack", "kda_pack.cuh", f"kbp::kda_pack_qkv_bf16<{nq}, {nk}, {nv}, {THREADS}>",
                              (f"const {BF}*", f"const {BF}*", f"const {BF}*", "int", "int", "int", f"{BF}*", "int"))
        launches.append(Launch(inst, grid=(pack_blocks(nq, nk, nv), rows, 1), block=(THREADS, 1, 1), smem=0,
                               args=(*(ctx.buf(t) for t in ins), lit(nq), lit(nk), lit(nv),
                                     ctx.buf(out), lit(nq + nk + nv)),
                               group=group.id, nodes=(node.id,)))
    return launches
