"""embed_copy: the embed node (embed_row_copy) as one embed_copy launch (kernels/embed_copy.cuh):
row TOKEN of the `<embed>.weight` table, byte for byte, into the node's BF16 output buffer. The
token id is read on the device, so the copy lives inside the step's CUDA graph.

An id outside [0, vocab) writes a zero row; the kernel then sets the `<embed>.error_flag` state
(one int32) when the plan has it, else the error goes unflagged (nullptr)."""
from __future__ import annotations

from kbpc.codegen.args import NULL, StepInput, lit
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families._projection import require
from kbpc.codegen.families._rows import row_grid, vec_width
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup

HEADER = "embed_copy.cuh"
THREADS = 64
VEC = 8                 # 16-byte copies
PARAMS = ("const int*", "const uint16_t*", "int", "uint16_t*", "int*")


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    node = ctx.node(group, "embed")
    h = ctx.output(node)
    d = h.dim_value
    table = next((w for w in ctx.plan.weights if w.name == f"{node.id}.weight"), None)
    require(table is not None and table.storage == "bf16" and len(table.shape) == 2 and table.shape[1] == d,
            f"embedding table {table} does not hold BF16 rows of {d}", node)
    require(h.format == "bf16", f"embedding output {h.id} is {h.format}", node)
    rows = ctx.rows(h)
    flag = f"{node.id}.error_flag"
    error = ctx.state(flag, "int") if any(s.name == flag for s in ctx.plan.state) else NULL
    vec = vec_width(d, VEC)
    inst = KernelInstance("embed_copy", HEADER, f"kbp::embed_copy<{d}, {vec}>", PARAMS)
    args = (StepInput("TOKEN"), ctx.weight(node, ctype="uint16_t"), lit(table.shape[0]), ctx.buf(h, "uint16_t"), error)
    return [Launch(inst, grid=row_grid(d, THREADS, vec, rows), block=(THREADS, 1, 1), smem=0, args=args,
                   group=group.id, nodes=(node.id,))]
