// w4a16_mma_walk.cuh: the `fast` W4A16 GEMV (kernels/w4a16_mma.cuh's math) with a schedule sized to
// the GPU: a fixed grid of CTAs walks all 16-row tiles of one or several projections, each warp
// streaming its chunks through a ring of D chunk loads in registers that runs across tile
// boundaries, and x staged once per CTA.
//
// Why: w4a16_mma gives each CTA T tiles and exits, so its loads are issued in at most two batches
// and stall between tiles, each CTA restages x, and a grid that is not a whole number of waves
// leaves a tail. Here every warp keeps D chunks (D KB) of loads in flight from its first load to
// its last, over all of its tiles.
//
// Entries (KS warps per tile splitting K, T tile slots per CTA, block = 32*KS*T, no dynamic smem):
//   w4a16_mma_walk<K, KS, T, D>(codes, scales, s_g, x, y, N)           any grid >= 1
//   w4a16_mma_walk_seg_list<K, KS, T, D, NSEG>(segs, x)                any grid >= 1
//       several projections of one input (W4A16SegList<NSEG> by value): their tiles are numbered
//       segment by segment, w4a16f_ctas(n_s, 1) each.
// Requirements: as w4a16_mma (K % 32 == 0, K <= W4A16F_MAX_K, KS in {1,2,4,8,16}, T*KS <= 16),
// plus 1 <= D <= W4A16W_MAX_D and T <= 15 when KS > 1 (one named barrier per slot).
// Schedule: slot j of CTA b is global slot s = b T + j of S = gridDim.x T; it takes tiles
//   s, s + S, s + 2S, ... (so any two slots differ by at most one tile), and its KS warps take the
//   chunks c = ks (mod KS) of each. A warp's work is the flat list of (tile, chunk) jobs; job q's
//   loads are issued when job q - D has been computed (the first D before pdl_wait()).
// Math: per tile exactly w4a16_mma<K, KS, *>'s: the same chunk MMAs in the same order into one
//   FP32 accumulator per warp, the KS partials added in warp order, the same x staging and output
//   rounding. So for equal KS the outputs are bit-identical to w4a16_mma's for any grid, T and D,
//   and the bound is w4a16_mma's (kbpc.reference.gemv_bounds.w4a16_mma_bound with this KS).
// PDL: the first D jobs' weight loads are issued before pdl_wait(); x is read after it and y written
//   after it. pdl_launch_dependents() once x is staged: the next kernel can launch onto SMs whose
//   CTAs have finished while the rest still stream (it waits for this grid in its own pdl_wait()).
// Entry points: the __global__ templates, or their bodies *_dev<...> for a TU's own wrapper.
#pragma once

#include "w4a16_mma.cuh"

namespace kbp {

constexpr int W4A16W_MAX_D = 8;  // ring depth: 10 registers per chunk, 128 per thread at 16 warps/SM

// One projection as a walk source: tile i is rows 16i .. 16i+15.
struct W4A16FOne {
    W4A16Seg seg;
    __device__ __forceinline__ int tiles() const { return w4a16f_ctas(seg.n, 1); }
    __device__ __forceinline__ W4A16Seg locate(int tile, int& row0) const {
        row0 = 16 * tile;
        return seg;
    }
};

// A segment table as a walk source: the tiles of segment 0, then segment 1's, ...
struct W4A16FSegs {
    const W4A16Seg* __restrict__ table;
    int nseg;
    __device__ __forceinline__ int tiles() const {
        int n = 0;
        for (int s = 0; s < nseg; ++s) n += w4a16f_ctas(table[s].n, 1);
        return n;
    }
    __device__ __forceinline__ W4A16Seg locate(int tile, int& row0) const {
        int s = 0;
        while (s < nseg - 1 && tile >= w4a16f_ctas(table[s].n, 1)) { tile -= w4a16f_ctas(table[s].n, 1); ++s; }
        row0 = 16 * tile;
        return table[s];
    }
};

// A warp's load cursor: the tile it is loading, the warp's chunk ordinal m in it, and the rows
// g, g+8 of that tile (clamped to N-1: read, never stored).
struct W4A16FCursor {
    const uint8_t *cg, *c8, *sg, *s8;
    int tile, m;
};

template <int K, class Src>
__device__ __forceinline__ void w4a16f_point(W4A16FCursor& cur, const Src& src, int g) {
    int row0;
    const W4A16Seg s = src.locate(cur.tile, row0);
    const size_t rg = (size_t)min(row0 + g, s.n - 1), r8 = (size_t)min(row0 + g + 8, s.n - 1);
    cur.cg = s.codes + rg * (K / 2);
    cur.c8 = s.codes + r8 * (K / 2);
    cur.sg = s.scales + rg * (K / 16);
    cur.s8 = s.scales + r8 * (K / 16);
}

// Issue the loads of the cursor's job into (cw, sc) and step the cursor to the warp's next job.
template <int K, int KS, class Src>
__device__ __forceinline__ void w4a16f_load_next(uint4 (&cw)[2], uint16_t (&sc)[2], W4A16FCursor& cur,
                                                 const Src& src, int ntiles, int stride, int ks, int g, int t) {
    constexpr int NCH = (K + 127) / 128, PER = (NCH + KS - 1) / KS;
    // a job's chunk is < NCH when KS divides the chunks; else the last ones of some warps are not
    w4a16f_load1<K, NCH % KS != 0>(cw, sc, cur.cg, cur.c8, cur.sg, cur.s8, ks + KS * cur.m, t);
    if (++cur.m == PER) {
        cur.m = 0;
        cur.tile += stride;
        if (cur.tile < ntiles) w4a16f_point<K>(cur, src, g);
    }
}

// A tile's end: the slot's KS partials (d[0], d[2] of lanes (g, 0): rows g, g+8) meet in `part`
// (this tile's parity half: a warp that runs a tile ahead writes the other half), the slot's first
// warp adds them in warp order and writes the 16 outputs.
template <int KS, class Src>
__device__ __forceinline__ void w4a16f_flush(const float (&d)[4], const Src& src, int tile, float (*part)[16],
                                             int warp, int slot, int ks, int lane, float unscale) {
    int row0;
    const W4A16Seg s = src.locate(tile, row0);
    const int g = lane >> 2, t = lane & 3;
    if constexpr (KS == 1) {
        if (t == 0) {
            if (row0 + g < s.n) s.y[row0 + g] = w4a16f_out(d[0], unscale, s.gscale);
            if (row0 + g + 8 < s.n) s.y[row0 + g + 8] = w4a16f_out(d[2], unscale, s.gscale);
        }
        return;
    }
    if (t == 0) { part[warp][g] = d[0]; part[warp][g + 8] = d[2]; }
    bar_sync_named(1 + slot, 32 * KS);
    if (ks == 0 && lane < 16 && row0 + lane < s.n) {
        float p = part[slot * KS][lane];
#pragma unroll
        for (int w = 1; w < KS; ++w) p = __fadd_rn(p, part[slot * KS + w][lane]);
        s.y[row0 + lane] = w4a16f_out(p, unscale, s.gscale);
    }
}

template <int K, int KS, int T, int D, class Src>
__device__ __forceinline__ void w4a16f_walk(const Src& src, const __nv_bfloat16* __restrict__ x) {
    static_assert(K % 32 == 0 && K <= W4A16F_MAX_K, "w4a16_mma_walk: K % 32 == 0 and K <= W4A16F_MAX_K");
    static_assert(KS == 1 || KS == 2 || KS == 4 || KS == 8 || KS == 16, "w4a16_mma_walk: KS warps per tile");
    static_assert(T >= 1 && T * KS <= 16 && (KS == 1 || T <= 15), "w4a16_mma_walk: T slots, <= 16 warps");
    static_assert(D >= 1 && D <= W4A16W_MAX_D, "w4a16_mma_walk: ring depth");
    constexpr int NCH = (K + 127) / 128, PER = (NCH + KS - 1) / KS, NT = 32 * KS * T;
    __shared__ uint4 xs[w4a16f_slot(NCH * 16)];
    __shared__ float red[T * KS], part[2][T * KS][16];
    const int warp = threadIdx.x >> 5, ks = warp % KS, slot = warp / KS, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int ntiles = src.tiles(), stride = gridDim.x * T, first = blockIdx.x * T + slot;
    const int njobs = first < ntiles ? ((ntiles - 1 - first) / stride + 1) * PER : 0;  // warp-uniform

    W4A16FCursor cur;
    cur.tile = first;
    cur.m = 0;
    if (first < ntiles) w4a16f_point<K>(cur, src, g);
    uint4 cw[D][2];
    uint16_t sc[D][2];
#pragma unroll
    for (int i = 0; i < D; ++i)
        if (i < njobs) w4a16f_load_next<K, KS>(cw[i], sc[i], cur, src, ntiles, stride, ks, g, t);
    pdl_wait();
    const float unscale = w4a16f_stage_x<K, NT>(x, xs, red);
    pdl_launch_dependents();

    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int m = 0, tile = first, par = 0;
    for (int q0 = 0; q0 < njobs; q0 += D) {
#pragma unroll
        for (int i = 0; i < D; ++i) {
            const int q = q0 + i;
            if (q < njobs) {  // warp-uniform, as every branch below
                const int c = ks + KS * m;
                if (c < NCH) w4a16f_chunk(cw[i], sc[i], xs, c, t, d);
                if (q + D < njobs) w4a16f_load_next<K, KS>(cw[i], sc[i], cur, src, ntiles, stride, ks, g, t);
                if (++m == PER) {
                    w4a16f_flush<KS>(d, src, tile, part[par], warp, slot, ks, lane, unscale);
                    d[0] = d[1] = d[2] = d[3] = 0.0f;
                    m = 0;
                    tile += stride;
                    par ^= 1;
                }
            }
        }
    }
}

template <int K, int KS, int T, int D>
__device__ __forceinline__ void w4a16_mma_walk_dev(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                                                   float gscale, const __nv_bfloat16* __restrict__ x,
                                                   __nv_bfloat16* __restrict__ y, int N) {
    const W4A16FOne src{{codes, scales, y, gscale, N}};
    w4a16f_walk<K, KS, T, D>(src, x);
}

template <int K, int KS, int T, int D>
__global__ void __launch_bounds__(32 * KS * T, W4A16F_MIN_CTAS(KS * T))
    w4a16_mma_walk(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, float gscale,
                   const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y, int N) {
    w4a16_mma_walk_dev<K, KS, T, D>(codes, scales, gscale, x, y, N);
}

template <int K, int KS, int T, int D>
__device__ __forceinline__ void w4a16_mma_walk_seg_dev(const W4A16Seg* __restrict__ table, int nseg,
                                                       const __nv_bfloat16* __restrict__ x) {
    const W4A16FSegs src{table, nseg};
    w4a16f_walk<K, KS, T, D>(src, x);
}

template <int K, int KS, int T, int D, int NSEG>
__global__ void __launch_bounds__(32 * KS * T, W4A16F_MIN_CTAS(KS * T))
    w4a16_mma_walk_seg_list(const __grid_constant__ W4A16SegList<NSEG> segs, const __nv_bfloat16* __restrict__ x) {
    static_assert(NSEG >= 1 && NSEG <= W4A16_MAX_SEGS, "segments per launch");
    w4a16_mma_walk_seg_dev<K, KS, T, D>(segs.seg, NSEG, x);
}

}  // namespace kbp
