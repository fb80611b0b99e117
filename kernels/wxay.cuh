// wxay.cuh: FP8 E4M3 W8A8 rowscale GEMV, one row, on m16n8k32 E4M3 tensor cores (family wxay).
//
// Entries (256-thread CTAs of 16 weight rows, no dynamic smem; sm_89+: sm_90a and sm_121a):
//   (wxay_rowscale* and the w4a4 GEMVs declare __launch_bounds__(256, 2): two CTAs per SM, <= 128 regs)
//   wxay_rowscale<K>(a_codes, a_scale, w_codes, w_scales, y, N)     grid = N/16
//       a_codes (K,) E4M3, a_scale -> FP32 per-token scale (device), w_codes (N, K) E4M3 row-major,
//       w_scales (N,) FP32 per channel, y (N,) BF16. N % 16 == 0, K % 128 == 0, rows 16B-aligned.
//   wxay_rowscale_split<K>(table, nseg, a_codes, a_scale)           grid = sum_s n_s/16
//       up to WXAY_MAX_SEGS projections of one input in one launch (split4), separate outputs;
//       `table` is a device array of WxaySeg (32 bytes each); every output has wxay_rowscale's bytes.
//   wxay_rowscale_split_list<K, NSEG>(segs, a_codes, a_scale)      grid = sum_s n_s/16
//       wxay_rowscale_split with the table passed by value (a __grid_constant__ WxaySegList<NSEG>,
//       in the launch's parameter space), so generated code needs no host packing or table buffer.
//   wxay_rowscale<K, true>, wxay_rowscale_split_list<K, NSEG, true>: the exact form (numerics
//       `exact`): the same grid and bytes out as the reference, chunk sums in FP64 on the CUDA cores
//       instead of the tensor cores (wxay_warp_chain_exact).
//   wxay_rowscale_ks<K, W>(a_codes, a_scale, w_codes, w_scales, y, N, part, counters)
//   wxay_rowscale_split_ks<K, W, NSEG>(segs, a_codes, a_scale, part, counters)
//       the same bits with W in {1,2,4,8} warps per CTA, grid = tiles * (8/W): for small N, a tile's
//       eight warp chains spread over up to eight SMs; the partials meet in a global scratch (see
//       wxay_tile_ks). PDL: weight lines prefetched to L2 before pdl_wait().
//   PDL in wxay_rowscale and wxay_rowscale_split_list: each warp issues its first WXAY_BATCH
//   chunks' weight loads (all of them when K <= 4096; the exact form its first chunk's) before
//   pdl_wait(), the activation after it, and releases the dependents right after its wait
//   (without a trigger they launched only as the last CTA left; with the same trigger in w4a16_mma
//   and the routed slot GEMVs, kbpc bench 4.90 -> 4.81 ms a step at 1k on an H200, the replay
//   timelines showing the gain in the MoE sublayers only: bench/NOTES.md, twenty-fifth session).
// Math (explain.families.wxay, rowscale): warp w takes the 128-wide chunks c = w (mod 8) in
//   increasing order; a chunk is 4 chained m16n8k32 MMAs from zero (weights on the 16-row side,
//   the token in column 0 of the 8-wide side), S_c is added to the warp's FP32 accumulator
//   (acc = acc + S_c), the 8 warp partials are added in warp order, and y = rn_bf16(P *
//   f32(w_n * a_t)). The reference takes S_c exactly; the MMA's internal accumulation order and
//   width are unspecified, so the GPU test holds this family to a tolerance (see the test).
// Layout: lane (g = lane/4, t = lane%4) loads 32 bytes of rows g and g+8 per chunk as 16-byte
//   loads; the k order inside a chunk is permuted identically for A and B (a dot product does not
//   care), which makes every fragment register one aligned word of those loads.
// Entry points: the __global__ template, or its body <name>_dev<...>(same arguments) for a TU's own
// extern "C" __global__ wrapper (what the GPU tests do).
// Phase stamps (kbp_stamps.cuh; wxay_rowscale, _split, _split_list): the wait, and 3 when the chains are done.
#pragma once

#include "kbp_common.cuh"

namespace kbp {

constexpr int WXAY_MAX_SEGS = 4;
constexpr int WXAY_BATCH = 4;  // chunks per warp whose loads are in flight together

struct WxaySeg {  // device layout: three uint64 pointers, int32 n, int32 padding
    const uint8_t* w_codes;
    const float* w_scales;
    __nv_bfloat16* y;
    int n;
    int pad_;
};
static_assert(sizeof(WxaySeg) == 32, "WxaySeg is packed by the host as 32 bytes");

__device__ __forceinline__ void mma_e4m3_m16n8k32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                  uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One chunk: 4 MMAs over the 32 bytes per lane of rows g, g+8 and of the token.
__device__ __forceinline__ void wxay_chunk(const uint4 (&w)[4], const uint4 (&x)[2], float (&d)[4]) {
    const uint32_t wg[8] = {w[0].x, w[0].y, w[0].z, w[0].w, w[1].x, w[1].y, w[1].z, w[1].w};
    const uint32_t w8[8] = {w[2].x, w[2].y, w[2].z, w[2].w, w[3].x, w[3].y, w[3].z, w[3].w};
    const uint32_t xv[8] = {x[0].x, x[0].y, x[0].z, x[0].w, x[1].x, x[1].y, x[1].z, x[1].w};
    d[0] = d[1] = d[2] = d[3] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) mma_e4m3_m16n8k32(d, wg[2 * j], w8[2 * j], wg[2 * j + 1], w8[2 * j + 1], xv[2 * j], xv[2 * j + 1]);
}

// Warp `warp`'s chain over the 128-wide chunks c = warp (mod 8) of the 16-row tile at w_rows:
// acc0 / acc8 = rows g / g+8 (valid in lanes t == 0). The same bits whichever CTA runs it.
// PREWAIT: the chain calls pdl_wait() itself, after issuing its first batch's weight loads (up to
// WXAY_BATCH chunks, 64 bytes a lane each) and before its first activation load: under PDL the
// weights stream while the kernel before it finishes.
template <int K, bool PREWAIT = false>
__device__ __forceinline__ void wxay_warp_chain(const uint8_t* w_rows, const uint8_t* a_codes,
                                                int warp, float& acc0, float& acc8) {
    static_assert(K % 128 == 0, "wxay walks K in 128-wide chunks");
    constexpr int NCH = K / 128, PER = (NCH + 7) / 8;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint4* rg = reinterpret_cast<const uint4*>(w_rows + (size_t)g * K) + 2 * t;
    const uint4* r8 = reinterpret_cast<const uint4*>(w_rows + (size_t)(g + 8) * K) + 2 * t;
    const uint4* xa = reinterpret_cast<const uint4*>(a_codes) + 2 * t;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    acc0 = 0.0f, acc8 = 0.0f;
#pragma unroll
    for (int b0 = 0; b0 < PER; b0 += WXAY_BATCH) {
        uint4 w[WXAY_BATCH][4], x[WXAY_BATCH][2];
#pragma unroll
        for (int i = 0; i < WXAY_BATCH; ++i) {
            int c = warp + 8 * (b0 + i);
            if (b0 + i < PER && c < NCH) {
                w[i][0] = ld_weight(rg + 8 * c); w[i][1] = ld_weight(rg + 8 * c + 1);
                w[i][2] = ld_weight(r8 + 8 * c); w[i][3] = ld_weight(r8 + 8 * c + 1);
            }
        }
        if (PREWAIT && b0 == 0) {
            KBP_STAMP(kStampWaitIn);
            pdl_wait();   // PDL: the activation comes from the previous kernel
            KBP_STAMP(kStampWaitOut);
            pdl_launch_dependents();   // see the header
        }
#pragma unroll
        for (int i = 0; i < WXAY_BATCH; ++i) {
            int c = warp + 8 * (b0 + i);
            if (b0 + i < PER && c < NCH) {
                x[i][0] = g == 0 ? ld_step(xa + 8 * c) : zero;  // the token is column 0 of B
                x[i][1] = g == 0 ? ld_step(xa + 8 * c + 1) : zero;
            }
        }
#pragma unroll
        for (int i = 0; i < WXAY_BATCH; ++i) {
            int c = warp + 8 * (b0 + i);
            if (b0 + i < PER && c < NCH) {
                float d[4];
                wxay_chunk(w[i], x[i], d);
                acc0 = __fadd_rn(acc0, d[0]);
                acc8 = __fadd_rn(acc8, d[2]);
            }
        }
    }
}

// E4M3 codes (4 in a word) -> exact doubles.
__device__ __forceinline__ void wxay_e4m3x4_f64(uint32_t w, double (&v)[4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)((w >> (16 * h)) & 0xffffu), __NV_E4M3);
        const float2 f = __half22float2(__half2(hr));
        v[2 * h] = (double)f.x;
        v[2 * h + 1] = (double)f.y;
    }
}

// The exact form of the chain (numerics `exact`): lane (g, t) sums its 32 products of rows g and g+8
// in a chunk in FP64 (E4M3 products are multiples of 2^-18 below 2^18 and any partial sum of a
// 128-wide chunk stays below 2^25: exact in any order), the four lanes t of a row add theirs with
// xor shuffles (still exact), and the chunk sum S_c is folded into the FP32 accumulator with one
// correct rounding, acc = f32(acc + S_c): the reference's order, so the bits are the reference's.
// The MMA form rounds the chunk sum to FP32 inside the tensor core first (its internal
// accumulation is unspecified), which differs from the reference in rare chunks.
// PREWAIT as in wxay_warp_chain: the first chunk's weight loads are issued before pdl_wait().
template <int K, bool PREWAIT = false>
__device__ __forceinline__ void wxay_warp_chain_exact(const uint8_t* w_rows, const uint8_t* a_codes,
                                                      int warp, float& acc0, float& acc8) {
    static_assert(K % 128 == 0, "wxay walks K in 128-wide chunks");
    constexpr int NCH = K / 128, PER = (NCH + 7) / 8;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint4* rg = reinterpret_cast<const uint4*>(w_rows + (size_t)g * K) + 2 * t;
    const uint4* r8 = reinterpret_cast<const uint4*>(w_rows + (size_t)(g + 8) * K) + 2 * t;
    const uint4* xa = reinterpret_cast<const uint4*>(a_codes) + 2 * t;
    acc0 = 0.0f, acc8 = 0.0f;
    uint4 wv[4];
    if (warp < NCH) {
        wv[0] = ld_weight(rg + 8 * warp); wv[1] = ld_weight(rg + 8 * warp + 1);
        wv[2] = ld_weight(r8 + 8 * warp); wv[3] = ld_weight(r8 + 8 * warp + 1);
    }
    if (PREWAIT) {
        KBP_STAMP(kStampWaitIn);
        pdl_wait();   // PDL: the activation comes from the previous kernel
        KBP_STAMP(kStampWaitOut);
        pdl_launch_dependents();   // as wxay_warp_chain (see the header)
    }
#pragma unroll 1   // one chunk's loads at a time: the FP64 sums, not the loads, bound this form
    for (int i = 0; i < PER; ++i) {
        const int c = warp + 8 * i;
        if (c >= NCH) break;   // warp-uniform
        if (i > 0) {
            wv[0] = ld_weight(rg + 8 * c); wv[1] = ld_weight(rg + 8 * c + 1);
            wv[2] = ld_weight(r8 + 8 * c); wv[3] = ld_weight(r8 + 8 * c + 1);
        }
        const uint4 xv[2] = {ld_step(xa + 8 * c), ld_step(xa + 8 * c + 1)};
        const uint32_t wg[8] = {wv[0].x, wv[0].y, wv[0].z, wv[0].w, wv[1].x, wv[1].y, wv[1].z, wv[1].w};
        const uint32_t w8[8] = {wv[2].x, wv[2].y, wv[2].z, wv[2].w, wv[3].x, wv[3].y, wv[3].z, wv[3].w};
        const uint32_t xw[8] = {xv[0].x, xv[0].y, xv[0].z, xv[0].w, xv[1].x, xv[1].y, xv[1].z, xv[1].w};
        double s0 = 0.0, s8 = 0.0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            double x[4], a[4], b[4];
            wxay_e4m3x4_f64(xw[j], x);
            wxay_e4m3x4_f64(wg[j], a);
            wxay_e4m3x4_f64(w8[j], b);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                s0 = __fma_rn(a[q], x[q], s0);
                s8 = __fma_rn(b[q], x[q], s8);
            }
        }
#pragma unroll
        for (int m = 1; m <= 2; m <<= 1) {   // the row's four lanes t (exact: any order)
            s0 = __dadd_rn(s0, __shfl_xor_sync(0xffffffffu, s0, m));
            s8 = __dadd_rn(s8, __shfl_xor_sync(0xffffffffu, s8, m));
        }
        acc0 = add_f32_exact(acc0, s0);
        acc8 = add_f32_exact(acc8, s8);
    }
}

// y_r = rn_bf16(f32(sum_w v_w in warp order) * f32(w_r * a)) for one row r of a tile.
__device__ __forceinline__ __nv_bfloat16 wxay_finish(const float (&v)[8], float w_scale, float a_scale) {
    float p = v[0];
#pragma unroll
    for (int w = 1; w < 8; ++w) p = __fadd_rn(p, v[w]);
    return f32_to_bf16(__fmul_rn(p, __fmul_rn(w_scale, a_scale)));
}

// The 16-row tile starting at w_rows: returns nothing, writes y[0..15]. PREWAIT: the chains call
// pdl_wait() after their first weight loads (the caller has not waited and has read no step data).
template <int K, bool EXACT = false, bool PREWAIT = false>
__device__ __forceinline__ void wxay_tile(const uint8_t* w_rows, const float* w_scales,
                                          const uint8_t* a_codes, const float* a_scale,
                                          __nv_bfloat16* y) {
    __shared__ float part[8][16];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float acc0, acc8;
    if constexpr (EXACT)
        wxay_warp_chain_exact<K, PREWAIT>(w_rows, a_codes, warp, acc0, acc8);
    else
        wxay_warp_chain<K, PREWAIT>(w_rows, a_codes, warp, acc0, acc8);
    if (t == 0) { part[warp][g] = acc0; part[warp][g + 8] = acc8; }
    __syncthreads();
    KBP_STAMP(3);   // every warp's chain done, the tile's partials in shared memory
    if (threadIdx.x < 16) {
        float v[8];
#pragma unroll
        for (int w = 0; w < 8; ++w) v[w] = part[w][threadIdx.x];
        y[threadIdx.x] = wxay_finish(v, __ldg(w_scales + threadIdx.x), ld_step(a_scale));
    }
}

template <int K, bool EXACT = false, bool PREWAIT = false>
__device__ __forceinline__ void wxay_rowscale_dev(const uint8_t* a_codes,
                                                     const float* a_scale,
                                                     const uint8_t* w_codes,
                                                     const float* w_scales,
                                                     __nv_bfloat16* y, int N) {
    const size_t n0 = (size_t)blockIdx.x * 16;
    wxay_tile<K, EXACT, PREWAIT>(w_codes + n0 * K, w_scales + n0, a_codes, a_scale, y + n0);
}

template <int K, bool EXACT = false>
__global__ void __launch_bounds__(256, 2) wxay_rowscale(const uint8_t* a_codes,
                                                     const float* a_scale,
                                                     const uint8_t* w_codes,
                                                     const float* w_scales,
                                                     __nv_bfloat16* y, int N) {
    KBP_STAMP_BEGIN();
    // PDL: pdl_wait() inside the warp chains, after each warp's first weight loads
    wxay_rowscale_dev<K, EXACT, true>(a_codes, a_scale, w_codes, w_scales, y, N);
    KBP_STAMP_END();
}

template <int K, bool EXACT = false, bool PREWAIT = false>
__device__ __forceinline__ void wxay_rowscale_split_dev(const WxaySeg* table, int nseg,
                                                           const uint8_t* a_codes,
                                                           const float* a_scale) {
    int b = blockIdx.x, s = 0;
    while (s < nseg - 1 && b >= table[s].n / 16) { b -= table[s].n / 16; ++s; }
    const WxaySeg seg = table[s];
    const size_t n0 = (size_t)b * 16;
    wxay_tile<K, EXACT, PREWAIT>(seg.w_codes + n0 * K, seg.w_scales + n0, a_codes, a_scale, seg.y + n0);
}

template <int K>
__global__ void __launch_bounds__(256, 2) wxay_rowscale_split(const WxaySeg* table, int nseg,
                                                           const uint8_t* a_codes,
                                                           const float* a_scale) {
    KBP_STAMP_BEGIN();
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    wxay_rowscale_split_dev<K>(table, nseg, a_codes, a_scale);
    KBP_STAMP_END();
}

template <int NSEG>
struct WxaySegList {
    WxaySeg seg[NSEG];
};

template <int K, int NSEG, bool EXACT = false>
__global__ void __launch_bounds__(256, 2) wxay_rowscale_split_list(const __grid_constant__ WxaySegList<NSEG> segs,
                                                                const uint8_t* a_codes,
                                                                const float* a_scale) {
    static_assert(NSEG >= 1 && NSEG <= WXAY_MAX_SEGS, "segments per launch");
    KBP_STAMP_BEGIN();
    // PDL: the table is a launch parameter; pdl_wait() inside the warp chains, after each warp's
    // first weight loads
    wxay_rowscale_split_dev<K, EXACT, true>(segs.seg, NSEG, a_codes, a_scale);
    KBP_STAMP_END();
}

// ------------------------------------------------------------------ split over CTAs (small N)
// W warps per CTA and 8/W CTAs per 16-row tile, so a tile's eight warp chains run on up to eight
// SMs. Each CTA stores its warps' partials in part[tile][8][16] (global scratch), and the last CTA
// of a tile (counters[tile], zero before the first launch and reset by that CTA) adds the eight in
// warp order: bit-identical to wxay_rowscale. Launches sharing a scratch must not overlap (on one
// stream, and with PDL, they cannot: every access follows pdl_wait()).

template <int K, int W>
__device__ __forceinline__ void wxay_tile_ks(const uint8_t* w_rows, const float* w_scales,
                                             const uint8_t* a_codes, const float* a_scale,
                                             __nv_bfloat16* y, int slice, float* part,
                                             unsigned* counter) {
    static_assert(W == 1 || W == 2 || W == 4 || W == 8, "wxay split: W warps per CTA divides 8");
    constexpr int NCH = K / 128, PER = (NCH + 7) / 8;
    __shared__ bool last;
    const int warp = slice * W + (threadIdx.x >> 5), lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int i = lane; i < 16 * PER; i += 32) {  // this warp's weight lines (row, chunk), before the wait
        const int c = warp + 8 * (i >> 4);
        if (c < NCH) prefetch_l2(w_rows + (size_t)(i & 15) * K + 128 * c, 128, 0, 1);
    }
    pdl_wait();
    float acc0, acc8;
    wxay_warp_chain<K>(w_rows, a_codes, warp, acc0, acc8);
    if (t == 0) { part[warp * 16 + g] = acc0; part[warp * 16 + g + 8] = acc8; }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == 8 / W - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x < 16) {
        float v[8];
#pragma unroll
        for (int w = 0; w < 8; ++w) v[w] = __ldcg(part + w * 16 + threadIdx.x);
        y[threadIdx.x] = wxay_finish(v, __ldg(w_scales + threadIdx.x), ld_step(a_scale));
    }
    if (threadIdx.x == 0) *counter = 0u;
}

// wxay_rowscale over (N/16) * (8/W) CTAs of 32 W threads; part: (N/16) * 128 floats, counters:
// N/16 unsigned, zeroed once before the first launch.
template <int K, int W>
__device__ __forceinline__ void wxay_rowscale_ks_dev(const uint8_t* a_codes, const float* a_scale,
                                                     const uint8_t* w_codes,
                                                     const float* w_scales, __nv_bfloat16* y,
                                                     int N, float* part, unsigned* counters) {
    const int tile = blockIdx.x / (8 / W), slice = blockIdx.x % (8 / W);
    const size_t n0 = (size_t)tile * 16;
    wxay_tile_ks<K, W>(w_codes + n0 * K, w_scales + n0, a_codes, a_scale, y + n0, slice, part + tile * 128,
                       counters + tile);
}

template <int K, int W>
__global__ void __launch_bounds__(32 * W, 16 / W) wxay_rowscale_ks(const uint8_t* a_codes,
                                                                   const float* a_scale,
                                                                   const uint8_t* w_codes,
                                                                   const float* w_scales,
                                                                   __nv_bfloat16* y, int N,
                                                                   float* part,
                                                                   unsigned* counters) {
    wxay_rowscale_ks_dev<K, W>(a_codes, a_scale, w_codes, w_scales, y, N, part, counters);
}

// The split-list form: tiles numbered across segments (sum_s n_s/16), scratch indexed the same way.
template <int K, int W>
__device__ __forceinline__ void wxay_rowscale_split_ks_dev(const WxaySeg* table, int nseg,
                                                           const uint8_t* a_codes,
                                                           const float* a_scale, float* part,
                                                           unsigned* counters) {
    const int tile = blockIdx.x / (8 / W), slice = blockIdx.x % (8 / W);
    int b = tile, s = 0;
    while (s < nseg - 1 && b >= table[s].n / 16) { b -= table[s].n / 16; ++s; }
    const WxaySeg seg = table[s];
    const size_t n0 = (size_t)b * 16;
    wxay_tile_ks<K, W>(seg.w_codes + n0 * K, seg.w_scales + n0, a_codes, a_scale, seg.y + n0, slice,
                       part + tile * 128, counters + tile);
}

template <int K, int W, int NSEG>
__global__ void __launch_bounds__(32 * W, 16 / W) wxay_rowscale_split_ks(const __grid_constant__ WxaySegList<NSEG> segs,
                                                                         const uint8_t* a_codes,
                                                                         const float* a_scale,
                                                                         float* part,
                                                                         unsigned* counters) {
    static_assert(NSEG >= 1 && NSEG <= WXAY_MAX_SEGS, "segments per launch");
    wxay_rowscale_split_ks_dev<K, W>(segs.seg, NSEG, a_codes, a_scale, part, counters);
}

}  // namespace kbp
