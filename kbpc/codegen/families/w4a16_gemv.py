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
(bound in kbpc.reference.gemv_bounds) where K % 32 == 0 and K <= MMA_MAX_K, as the walk of
kernels/w4a16_mma_walk.cuh: a grid sized to the target's SMs whose warps stream all tiles through a
ring of loads; `walk_shape` picks KS (warps per tile), T (tile slots per CTA), the ring depth and
the grid from the sizes and the SM count. Other shapes, and the shared-expert pair, keep the exact
kernels. (`mma_shape` sizes the earlier one-wave form w4a16_mma, kept for benchmarks.)"""
from __future__ import annotations

from dataclasses import dataclass

from kbpc.codegen.args import Aggregate, lit
from kbpc.codegen.context import LowerCtx, flt
from kbpc.codegen.families._projection import BF16, BLOCK, linears, nvfp4_weight, one_row, require
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node
from kbpc.targets import get_target

MAX_SEGS = 6             # W4A16_MAX_SEGS
SILU_MAX_K = 10240       # the silu-input form stages K FP32 values in 40 KB of static shared memory
HEADER = "w4a16_gemv.cuh"
MMA_HEADER = "w4a16_mma.cuh"
WALK_HEADER = "w4a16_mma_walk.cuh"
MMA_MAX_K = 20480        # W4A16F_MAX_K: x staged as FP16 pairs in static shared memory
MMA_WARPS = 2048         # warps a launch aims at: 132 SMs x 16 resident, about one wave
W4 = ("const uint8_t*", "const uint8_t*", "float")
WALK_WARPS_PER_SM = 16   # resident warps per SM at <= 128 registers (W4A16F_MIN_CTAS)
WALK_CTA_WARPS = 8       # warps per CTA (two CTAs per SM) where KS allows; KS = 16 takes 16
WALK_DEPTH = 8           # W4A16W_MAX_D: chunk loads (1.1 KB per warp each) in flight per warp
KS_CHOICES = (1, 2, 4, 8, 16)


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


@dataclass(frozen=True)
class WalkShape:
    """w4a16_mma_walk's template arguments and grid for one launch."""
    ks: int       # warps per tile, splitting K
    t: int        # tile slots per CTA
    depth: int    # chunk loads in flight per warp
    grid: int     # CTAs

    @property
    def block(self) -> tuple[int, int, int]:
        return (32 * self.ks * self.t, 1, 1)

    def jobs(self, tiles: int, k: int) -> int:
        """Chunks the busiest warp computes: its slot's tiles times its share of a tile's chunks."""
        return -(-tiles // (self.grid * self.t)) * -(-_chunks(k) // self.ks)


def _chunks(k: int) -> int:
    return -(-k // 128)


def walk_shape(tiles: int, k: int, sms: int, cta_warps: int = WALK_CTA_WARPS, depth: int = WALK_DEPTH,
               ks: int | None = None) -> WalkShape:
    """The walk over `tiles` 16-row tiles of depth K on a GPU of `sms` SMs: KS minimizes the chunks
    of the busiest warp when the SMs hold WALK_WARPS_PER_SM warps each (ceil(tiles / slots) tiles
    per slot, ceil(chunks / KS) chunks of each), the smallest KS among equals (fewest partials);
    T = cta_warps / KS slots per CTA, the grid every SM's share of CTAs (fewer when there are
    fewer tiles than slots), the ring no deeper than the busiest warp's chunks. `ks` forces KS."""
    chunks = _chunks(k)

    def cost(c: int) -> int:
        return -(-tiles // (sms * WALK_WARPS_PER_SM // c)) * -(-chunks // c)

    if ks is None:
        ks = min((c for c in KS_CHOICES if c == 1 or c <= chunks), key=lambda c: (cost(c), c))
    t = max(1, cta_warps // ks)
    if ks not in KS_CHOICES or ks * t > WALK_WARPS_PER_SM or not 1 <= depth <= WALK_DEPTH:
        raise ValueError(f"w4a16_mma_walk: KS {ks}, T {t}, depth {depth} out of range")
    grid = max(1, min(sms * (WALK_WARPS_PER_SM // (ks * t)), -(-tiles // t)))
    shape = WalkShape(ks, t, depth, grid)
    return WalkShape(ks, t, min(depth, shape.jobs(tiles, k)), grid)


def _walk(ctx: LowerCtx, tiles: int, k: int) -> WalkShape:
    return walk_shape(tiles, k, get_target(ctx.plan.options.target).sms)


def _fast_params(nseg: int) -> tuple[str, ...]:
    if nseg == 0:
        return (*W4, f"const {BF16}*", f"{BF16}*", "int")
    return (f"kbp::W4A16SegList<{nseg}>", f"const {BF16}*")


def walk_instance(k: int, w: WalkShape, nseg: int = 0) -> KernelInstance:
    """The walk's instance: the one-projection entry (nseg = 0) or the list of nseg segments."""
    targs = f"{k}, {w.ks}, {w.t}, {w.depth}"
    kernel = f"kbp::w4a16_mma_walk<{targs}>" if nseg == 0 else f"kbp::w4a16_mma_walk_seg_list<{targs}, {nseg}>"
    return KernelInstance("w4a16_gemv", WALK_HEADER, kernel, _fast_params(nseg))


def mma_instance(k: int, ks: int, t: int, nseg: int = 0) -> KernelInstance:
    """The one-wave form w4a16_mma (grid = tiles / T), which benchmarks and tests compare with."""
    kernel = f"kbp::w4a16_mma<{k}, {ks}, {t}>" if nseg == 0 else f"kbp::w4a16_mma_seg_list<{k}, {ks}, {t}, {nseg}>"
    return KernelInstance("w4a16_gemv", MMA_HEADER, kernel, _fast_params(nseg))


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
        w = _walk(ctx, ctas(n), k)
        return Launch(walk_instance(k, w), grid=(w.grid, 1, 1), block=w.block, smem=0,
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
            w = _walk(ctx, sum(ctas(n) for n in ns), k)
            inst, grid, block = walk_instance(k, w, len(part)), w.grid, w.block
        else:
            inst = KernelInstance("w4a16_gemv", HEADER, f"kbp::w4a16_gemv_seg_list<{k}, {len(part)}>",
                                  (table, f"const {BF16}*"))
            grid, block = sum(ctas(n) for n in ns), BLOCK
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
