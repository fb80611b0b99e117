"""w4a16_gemv: NVFP4-weight x BF16-activation one-row GEMVs (kernels/w4a16_gemv.cuh).

Group forms, told apart by the group's nodes (not by rule names):
- one linear (glm_w4a16_gemv_1row): w4a16_gemv<K>.
- several linears over one input (glm_w4a16_pipe_kda_six_1row): w4a16_gemv_seg_list<K, NSEG>, the
  segment table passed by value as a __grid_constant__ kernel parameter (it lives in the launch's
  parameter space in device memory and is captured into the CUDA graph node), up to
  W4A16_MAX_SEGS segments per launch.
- linear -> swiglu_clamp -> silu_mul -> linear (glm_w4a16_pipe_shared_1row, a shared expert):
  one instance launched twice (phase 0, phase 1) with a device scratch private to the instance's TU
  carrying the inner row between them (the group's inner edges have no arena buffer). Exact:
  w4a16_shared_pair<K, I>: phase 0 is w4a16_gemv<K> of x into the [g | u] row (BF16); phase 1 is
  the silu-input down GEMV on the clamped g^, u^ in FP32 (the reference's clamp_gate_up then
  w4a16_gemv_silu_input).

Under PDL the fast one-linear and segment forms can prefetch the first PF bytes of every weight row
into L2 before their dependency wait (`prefetch_row_bytes`: the target's budget spread over the
launch's rows; none on sm_90, where it measured slower: kbpc/targets).

Numerics `fast` (Options.numerics): the forms run on FP16 tensor cores (kernels/w4a16_mma.cuh,
bounds in kbpc.reference.gemv_bounds) where K % 32 == 0 and K <= MMA_MAX_K, with KS warps
splitting K and T tiles per CTA from `mma_shape`; other shapes keep the exact kernels. A one-linear
launch then halves KS where that fits it in one guaranteed wave (`one_wave`; H200, 128-expert seed
shrink, replay timelines: the KDA output projection, 256 tiles of depth 8192, at KS 8 ends 6.5 us
after the gated norm instead of 10.6 us at KS 16, the KDA layer's attention half 45.3 us against
47.1, the hc boundary after it +0.9 us). KS sets which warp sums which chunks, so it changes the
fast form's accumulation order, within the per-KS bound of gemv_bounds (the GPU tests cover that
shape at KS 8). The shared
pair's fast form, w4a16_mma_shared_pair<K, I, KS0, T0, KS1, T1> (`pair_shapes`), needs both its
depths, K and I (the down projection's), within those limits: phase 0's tiles hold 8 gate rows and
their 8 up rows, so each CTA finishes g_i and u_i together and writes act_i = silu(clamp g_i) *
clamp u_i (glm_swiglu_clamp's exact element expression on the BF16-rounded g, u) once, in FP32,
to the scratch; phase 1 stages that row (per-CTA power-of-two scale, as x is staged) as two FP16
parts, hi and lo, for the down MMA GEMV. Where K or I misses them (not a multiple of 32: a lane
loads 32 codes of a row; above MMA_MAX_K, or I above MMA_SPLIT_MAX_K: the staged rows must fit
static shared memory), the whole pair keeps the exact form, since its two phases share one TU and one scratch row. Two launches, not one: every down
output needs the whole act row, so phase 1 waits on all of phase 0 (a grid-wide dependency that
one launch could only meet with a grid barrier, which needs every CTA resident); with PDL, phase 1
issues its first weight loads before that wait.

The fast pair is fast mode's default (SHARED_PAIR_FAST). With the act row staged as FP16 alone it
put the tiny example's teacher-forced logits at a relative L2 of 0.040 (the fast-mode criterion is
1e-2; 3.0e-3 with the exact pair; H200, twenty-sixth session): 11 of FP32's 24 bits, amplified by
the 4-bit activation quantization downstream. Staged as hi + lo FP16 parts it is back at 2.997e-3
with the same greedy token at 64 / 64. In the step it pays together with the cluster router
(glm_router_topk.ROUTER_CLUSTER), whose logits no longer cross L2 beside its faster weight stream:
H200, 128-expert seed shrink, interleaved, `kbpc bench` 4.739 / 4.744 ms a step at 1k against
4.772 / 4.805 with neither, 16k 4.946 / 4.969 against 4.969 / 4.985; the fast pair with the last-CTA
router was slower (4.861 / 4.856 against 4.799 / 4.778; bench/NOTES.md, thirty-first session)."""
from __future__ import annotations

from kbpc.codegen.args import Aggregate, lit
from kbpc.codegen.context import LowerCtx, flt
from kbpc.codegen.families._projection import BF16, BLOCK, linears, nvfp4_weight, one_row, prefetch_row_bytes, require
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node
from kbpc.targets import get_target

MAX_SEGS = 6             # W4A16_MAX_SEGS
SILU_MAX_K = 10240       # the silu-input form stages K FP32 values in 40 KB of static shared memory
HEADER = "w4a16_gemv.cuh"
SHARED_PAIR_FAST = True    # fast mode: the tensor-core pair (see the module docstring)
MMA_HEADER = "w4a16_mma.cuh"
MMA_MAX_K = 20480        # W4A16F_MAX_K: x staged as FP16 pairs in static shared memory
MMA_SPLIT_MAX_K = 10240  # W4A16F_SPLIT_MAX_K: the pair's FP32 act row staged as hi and lo FP16 pairs
# Warps a launch aims at: about four waves of 16 warps on 132 SMs, so more K-split warps keep more
# weight loads in flight (H200, 128-expert seed shrink, 1k context, three runs each: 6.47-6.69 ms a
# step against 6.57-6.75 with 2048, one wave; the KDA six-segment projection KS 1 -> 4 ends 21 us
# after the hc boundary instead of 26 us in the replayed step).
MMA_WARPS = 8192
PAIR_WARPS = 2048         # the fast shared pair's target, as measured and GPU-tested (not the default)
W4 = ("const uint8_t*", "const uint8_t*", "float")


def ctas(n: int) -> int:
    """w4a16_ctas(n): 16 output rows per CTA."""
    return -(-n // 16)


def _pow2_floor(v: int) -> int:
    return 1 << max(0, v.bit_length() - 1)


def mma_shape(tiles: int, k: int, warps: int = MMA_WARPS) -> tuple[int, int]:
    """(KS, T) of w4a16_mma for `tiles` 16-row tiles of depth K: KS warps per tile (a power of two
    <= 16 and <= the 128-wide chunks) so that tiles * KS is about `warps`, then T tiles per CTA
    for about 8 warps per CTA (the activation is staged once per CTA)."""
    ks = max(1, min(16, _pow2_floor(max(1, -(-k // 128))), _pow2_floor(max(1, warps // max(1, tiles)))))
    return ks, max(1, 8 // ks)


def min_ctas(warps: int) -> int:
    """W4A16F_MIN_CTAS(warps): the CTAs per SM the kernel's register bound guarantees."""
    return 1 if warps >= 16 else 16 // warps


def one_wave(tiles: int, ks: int, t: int, sms: int) -> tuple[int, int]:
    """(KS, T) with KS halved while that makes a launch of more than one guaranteed wave fit in one:
    a CTA that is not resident when the kernel before it finishes neither streams its weights early
    nor prefetches them, so a second wave starts its loads only after the first one's."""
    grid = -(-tiles // t)
    while ks > 1 and grid > sms * min_ctas(ks * t) and grid <= sms * min_ctas(ks // 2 * t):
        ks //= 2
    return ks, t


def _fast(ctx: LowerCtx, k: int) -> bool:
    return ctx.plan.options.numerics == "fast" and k % 32 == 0 and k <= MMA_MAX_K


def pair_instance(k: int, i: int, shapes: tuple[int, int, int, int] | None = None) -> KernelInstance:
    """The shared pair's instance: the exact form (shapes None) or the fast form with (KS0, T0) of
    phase 0 and (KS1, T1) of phase 1 (`pair_shapes`). Both take the same parameters."""
    params = ("int", *W4, f"const {BF16}*", *W4, "float", f"{BF16}*", "int")
    if shapes is None:
        return KernelInstance("w4a16_gemv", HEADER, f"kbp::w4a16_shared_pair<{k}, {i}>", params)
    return KernelInstance("w4a16_gemv", MMA_HEADER,
                          f"kbp::w4a16_mma_shared_pair<{k}, {i}, {', '.join(map(str, shapes))}>", params)


def pair_shapes(k: int, i: int, n: int) -> tuple[int, int, int, int]:
    """(KS0, T0, KS1, T1) of the fast pair: phase 0 has I/8 tiles of depth K (8 gate + 8 up rows
    each), phase 1 ctas(N) tiles of depth I; each from `mma_shape`."""
    return (*mma_shape(-(-i // 8), k, PAIR_WARPS), *mma_shape(ctas(n), i, PAIR_WARPS))


def pair_launch_shapes(i: int, n: int, shapes: tuple[int, int, int, int]) -> tuple[tuple, tuple, tuple, tuple]:
    """(grid0, block0, grid1, block1) of the fast pair's two launches."""
    ks0, t0, ks1, t1 = shapes
    return ((-(-i // (8 * t0)), 1, 1), (32 * ks0 * t0, 1, 1), (-(-n // (16 * t1)), 1, 1), (32 * ks1 * t1, 1, 1))


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
        ks, t = one_wave(ctas(n), *mma_shape(ctas(n), k), get_target(ctx.plan.options.target).sms)
        pf = prefetch_row_bytes(ctx, n, k // 2, 1 / 8)
        inst = KernelInstance("w4a16_gemv", MMA_HEADER, f"kbp::w4a16_mma<{k}, {ks}, {t}, {pf}>",
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
            pf = prefetch_row_bytes(ctx, sum(ns), k // 2, 1 / 8)
            kernel, grid, block = (f"kbp::w4a16_mma_seg_list<{k}, {ks}, {t}, {len(part)}, {pf}>",
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
    one_row(ctx, x, gate_up)
    args = (*nvfp4_weight(ctx, gate_up), ctx.buf(x), *nvfp4_weight(ctx, down),
            flt(ctx.c.swiglu_limit), ctx.buf(y), lit(n))
    nodes = tuple(nd.id for nd in ctx.nodes(group))
    if SHARED_PAIR_FAST and _fast(ctx, k) and _fast(ctx, i) and i <= MMA_SPLIT_MAX_K:
        shapes = pair_shapes(k, i, n)
        inst = pair_instance(k, i, shapes)
        grid0, block0, grid1, block1 = pair_launch_shapes(i, n, shapes)
        notes = ("phase 0: gate_up MMA GEMV, SwiGLU of each (g_i, u_i) into the TU's FP32 row",
                 "phase 1: the row staged as FP16, down MMA GEMV")
    else:
        require(i <= SILU_MAX_K, f"down K = {i} exceeds the silu-input form's {SILU_MAX_K}", group)
        inst = pair_instance(k, i)
        grid0, block0, grid1, block1 = (ctas(2 * i), 1, 1), BLOCK, (ctas(n), 1, 1), BLOCK
        notes = ("phase 0: gate_up GEMV into the TU's [g | u] scratch",
                 "phase 1: clamp, silu(g^) * u^ in FP32, down GEMV")
    return [Launch(inst, grid=grid0, block=block0, smem=0, args=(lit(0), *args), group=group.id, nodes=nodes,
                   note=notes[0]),
            Launch(inst, grid=grid1, block=block1, smem=0, args=(lit(1), *args), group=group.id, nodes=nodes,
                   note=notes[1])]
