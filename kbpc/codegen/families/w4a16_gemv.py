"""w4a16_gemv: NVFP4-weight x BF16-activation one-row GEMVs (kernels/w4a16_gemv.cuh).

Group forms, told apart by the group's nodes (not by rule names):
- one linear (glm_w4a16_gemv_1row): w4a16_gemv<K>.
- several linears over one input (glm_w4a16_pipe_kda_six_1row): w4a16_gemv_seg_list<K, NSEG>, the
  segment table passed by value as a __grid_constant__ kernel parameter (it lives in the launch's
  parameter space in device memory and is captured into the CUDA graph node), up to
  W4A16_MAX_SEGS segments per launch.
- linear -> swiglu_clamp -> silu_mul -> linear (glm_w4a16_pipe_shared_1row, a shared expert):
  w4a16_shared_pair<K, I> launched twice. Phase 0 is w4a16_gemv<K> of x into the [g | u] row in a
  device scratch private to the instance's TU (the group's inner edges have no arena buffer);
  phase 1 is the silu-input down GEMV on the clamped g^, u^ in FP32 (the reference's
  clamp_gate_up then w4a16_gemv_silu_input).

Numerics `fast` (Options.numerics): the one-linear and segmented forms run on FP16 tensor cores
(kernels/w4a16_mma.cuh, bound in kbpc.reference.gemv_bounds) where K % 32 == 0 and
K <= MMA_MAX_K, with KS warps splitting K and T tiles per CTA from `mma_shape`; other shapes, and
the shared-expert pair, keep the exact kernels."""
from __future__ import annotations

from kbpc.codegen.args import Aggregate, lit
from kbpc.codegen.context import LowerCtx, flt
from kbpc.codegen.families._projection import BF16, BLOCK, linears, nvfp4_weight, one_row, require
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node

MAX_SEGS = 6             # W4A16_MAX_SEGS
SILU_MAX_K = 10240       # the silu-input form stages K FP32 values in 40 KB of static shared memory
HEADER = "w4a16_gemv.cuh"
MMA_HEADER = "w4a16_mma.cuh"
MMA_MAX_K = 20480        # W4A16F_MAX_K: x staged as FP16 pairs in static shared memory
MMA_WARPS = 2048         # warps a launch aims at: 132 SMs x 16 resident, about one wave
W4 = ("const uint8_t*", "const uint8_t*", "float")


def ctas(n: int) -> int:
    """w4a16_ctas(n): 16 output rows per CTA."""
    return -(-n // 16)


def _pow2_floor(v: int) -> int:
    return 1 << max(0, v.bit_length() - 1)


def mma_shape(tiles: int, k: int) -> tuple[int, int]:
    """(KS, T) of w4a16_mma for `tiles` 16-row tiles of depth K: KS warps per tile (a power of two
    <= 16 and <= the 128-wide chunks) so that tiles * KS is about MMA_WARPS, then T tiles per CTA
    for about 8 warps per CTA (the activation is staged once per CTA)."""
    ks = max(1, min(16, _pow2_floor(max(1, -(-k // 128))), _pow2_floor(max(1, MMA_WARPS // max(1, tiles)))))
    return ks, max(1, 8 // ks)


def _fast(ctx: LowerCtx, k: int) -> bool:
    return ctx.plan.options.numerics == "fast" and k % 32 == 0 and k <= MMA_MAX_K


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    ops = {n.op_base for n in ctx.nodes(group)}
    gemms = linears(ctx, group)
    require(bool(gemms), "a w4a16_gemv group needs a linear node", group)
    if "silu_mul" in ops or "swiglu_clamp" in ops:
        return _shared_pair(ctx, group, gemms)
    if len(gemms) == 1:
        return [_gemv(ctx, group, gemms[0])]
    return _segments(ctx, group, gemms)


def _gemv(ctx: LowerCtx, group: LoweredGroup, node: Node) -> Launch:
    x, y = ctx.input(node), ctx.output(node)
    k, n = x.dim_value, y.dim_value
    require(k % 16 == 0, f"K = {k} is not a multiple of 16", node)
    one_row(ctx, x, node)
    if _fast(ctx, k):
        ks, t = mma_shape(ctas(n), k)
        inst = KernelInstance("w4a16_gemv", MMA_HEADER, f"kbp::w4a16_mma<{k}, {ks}, {t}>",
                              (*W4, f"const {BF16}*", f"{BF16}*", "int"))
        return Launch(inst, grid=(-(-n // (16 * t)), 1, 1), block=(32 * ks * t, 1, 1), smem=0,
                      args=(*nvfp4_weight(ctx, node), ctx.buf(x), ctx.buf(y), lit(n)),
                      group=group.id, nodes=(node.id,))
    inst = KernelInstance("w4a16_gemv", HEADER, f"kbp::w4a16_gemv<{k}>", (*W4, f"const {BF16}*", f"{BF16}*", "int"))
    return Launch(inst, grid=(ctas(n), 1, 1), block=BLOCK, smem=0,
                  args=(*nvfp4_weight(ctx, node), ctx.buf(x), ctx.buf(y), lit(n)),
                  group=group.id, nodes=(node.id,))


def _segments(ctx: LowerCtx, group: LoweredGroup, gemms: list[Node]) -> list[Launch]:
    x = ctx.input(gemms[0])
    k = x.dim_value
    require(all(ctx.input(n).id == x.id for n in gemms), "segmented GEMVs must share one input", group)
    require(k % 16 == 0, f"K = {k} is not a multiple of 16", group)
    one_row(ctx, x, gemms[0])
    launches = []
    for i in range(0, len(gemms), MAX_SEGS):
        part = gemms[i:i + MAX_SEGS]
        segs = []
        for node in part:
            codes, scales, sg = nvfp4_weight(ctx, node)
            y = ctx.output(node)
            segs.append(Aggregate("kbp::W4A16Seg", (codes, scales, ctx.buf(y), sg, lit(y.dim_value))))
        table = f"kbp::W4A16SegList<{len(part)}>"
        ns = [ctx.output(n).dim_value for n in part]
        if _fast(ctx, k):
            ks, t = mma_shape(sum(ctas(n) for n in ns), k)
            kernel, grid, block = (f"kbp::w4a16_mma_seg_list<{k}, {ks}, {t}, {len(part)}>",
                                   sum(-(-n // (16 * t)) for n in ns), (32 * ks * t, 1, 1))
            header = MMA_HEADER
        else:
            kernel, grid, block = f"kbp::w4a16_gemv_seg_list<{k}, {len(part)}>", sum(ctas(n) for n in ns), BLOCK
            header = HEADER
        inst = KernelInstance("w4a16_gemv", header, kernel, (table, f"const {BF16}*"))
        launches.append(Launch(inst, grid=(grid, 1, 1), block=block, smem=0,
                               args=(Aggregate(table, (Aggregate(None, tuple(segs)),)), ctx.buf(x)),
                               group=group.id, nodes=tuple(n.id for n in part)))
    return launches


def _shared_pair(ctx: LowerCtx, group: LoweredGroup, gemms: list[Node]) -> list[Launch]:
    require(len(gemms) == 2, f"a shared-expert group has 2 linears, found {len(gemms)}", group)
    gate_up, down = gemms
    x, gu = ctx.input(gate_up), ctx.output(gate_up)
    act, y = ctx.input(down), ctx.output(down)
    k, i, n = x.dim_value, act.dim_value, y.dim_value
    require(ctx.bp.node(act.src).op_base == "silu_mul", f"{down.id} does not read the silu_mul output", group)
    require(gu.dim_value == 2 * i, f"gate_up width {gu.dim_value} is not 2 x down's K {i}", group)
    require(k % 16 == 0 and i % 16 == 0, f"K = {k} and I = {i} must be multiples of 16", group)
    require(i <= SILU_MAX_K, f"down K = {i} exceeds the silu-input form's {SILU_MAX_K}", group)
    one_row(ctx, x, gate_up)
    inst = KernelInstance("w4a16_gemv", HEADER, f"kbp::w4a16_shared_pair<{k}, {i}>",
                          ("int", *W4, f"const {BF16}*", *W4, "float", f"{BF16}*", "int"))
    args = (*nvfp4_weight(ctx, gate_up), ctx.buf(x), *nvfp4_weight(ctx, down),
            flt(ctx.c.swiglu_limit), ctx.buf(y), lit(n))
    nodes = tuple(nd.id for nd in ctx.nodes(group))
    return [Launch(inst, grid=(ctas(2 * i), 1, 1), block=BLOCK, smem=0, args=(lit(0), *args), group=group.id,
                   nodes=nodes, note="phase 0: gate_up GEMV into the TU's [g | u] scratch"),
            Launch(inst, grid=(ctas(n), 1, 1), block=BLOCK, smem=0, args=(lit(1), *args), group=group.id,
                   nodes=nodes, note="phase 1: clamp, silu(g^) * u^ in FP32, down GEMV")]
