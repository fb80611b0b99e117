// moe_experts.cuh: a MoE layer's router and expert GEMVs in launches that carry the shared expert's
// tiles beside the routed ones, or whose tiles end in the next GEMV's input (rules moe_experts and
// moe_gate_up_pair, kbpc/codegen/families/moe_experts.py). Every byte equals the unfused chain's (kbpc.reference: w4a4_static_moe_slots,
// swiglu_clamp_rows, quantize_nvfp4_static, w4a16_gemv and its silu-clamp input form).
//
// Launch contract
//   kbp::moe_gate_up_pair<K, I, FAST>(ids, act_div, a_codes, a_scales, a_g, w_codes, w_scales,
//                                     w_gscale, limit, gamma_dn, h_codes, h_scales, h_g)
//     grid (I / 16, S) for S routed slots, block 512. Tile (t, s): the 16 gate rows 16t.. and their
//     16 up rows I + 16t.. of slot s's expert (w_codes (E, 2I, K/2), w_scales (E, 2I, K/16), w_gscale
//     (E,)), each row in w4a4_gemv_moe_slots's code and order (the same BF16 [gate | up] bits), then
//     h = rn_bf16(swiglu_clamp_element(g, u, limit)) for the 16 positions quantized as NVFP4 group t
//     of row s with the static scale gamma_dn: the bytes w4a4_quant_swiglu_rows_static<I> writes
//     from the stored rows (h_codes (S, I/2), h_scales (S, I/16), h_g[s] = gamma_dn). Slot s reads
//     activation row s / act_div (a_codes (rows, K/2), a_scales (rows, K/16), a_g (rows,)); a slot
//     with id -1 is a +0 [gate | up] row, as in the unfused chain. K % 128 == 0, I % 16 == 0.
//   kbp::moe_router_shared<H, E, K, OPC, ISH>(router_gemv_topk_quant's 12 arguments, sh_codes,
//                                             sh_scales, sh_gscale, limit, sh_x)
//     1-D grid ceil(E / OPC) + ISH / (2 OPC), block 64 OPC (OPC >= 2): first the fused router of one
//     token (glm_router_topk.cuh, the same CTAs and bytes: logits, ids, weights, the routed
//     experts' NVFP4 input row), then the shared expert's gate/up tiles: tile t takes rows P t..
//     of the shared gate and of the shared up (P = 2 OPC; W4A16, sh_codes (2 ISH, K/2), sh_scales
//     (2 ISH, K/16), the BF16 row x) in w4a16_gemv's chunk walk (the same BF16 bits) and writes
//     sh_x[P t + r] = silu(min(g, L)) * min(max(u, -L), L) in FP32: the row
//     w4a16_gemv_silu_clamp_input stages. ISH % (2 OPC) == 0.
//   kbp::moe_gate_up_shared_down<K, ISH, NS, FAST>(w4a4_gemv_moe_slots's 10 arguments, sh_x,
//                                                  sh_codes, sh_scales, sh_gscale, sh_y)
//     1-D grid NS / 16 + S * N / 16, block 256: first the shared down's tiles (rows 16t.. of sh_y
//     (NS) BF16 from sh_x (ISH FP32), w4a16_gemv_silu_clamp_input's order and bits), then the
//     routed gate/up slot GEMV's tiles (b - NS/16 = s * N/16 + t: w4a4_gemv_moe_slots' tile (t, s)).
// PDL: every tile waits (pdl_wait) before its first read of an activation; the router CTAs load
//   their weights first, as router_gemv_topk_quant does.
#pragma once

#include "glm_router_topk.cuh"
#include "glm_swiglu_clamp.cuh"
#include "w4a16_gemv.cuh"
#include "w4a4_mx_static.cuh"

namespace kbp {

// Routed tile (t, s) of the gate/up pair in a 512-thread CTA: warps 0-7 the gate rows, 8-15 the up
// rows, each half w4a4_gemv_moe_slots's 256-thread tile over one staged activation row; warp 0
// then finishes both halves and writes NVFP4 group t of the slot's down input.
template <int K, int I, bool FAST>
__device__ __forceinline__ void moe_gate_up_pair_tile(int t, int s, const int* ids, int act_div,
                                                      const uint8_t* a_codes, const uint8_t* a_scales,
                                                      const float* a_g, const uint8_t* w_codes,
                                                      const uint8_t* w_scales, const float* w_gscale, float limit,
                                                      float gamma_dn, uint8_t* h_codes, uint8_t* h_scales,
                                                      float* h_g) {
    static_assert(K % 128 == 0 && I % 16 == 0, "moe_gate_up_pair: K % 128 == 0, I % 16 == 0");
    static_assert(K <= W4A4_MAX_K, "the activation staging must fit static shared memory");
    __shared__ W4A4Smem<K> sm;
    __shared__ float part[16][16];
    const int e = ld_step(ids + s);
    const int half = threadIdx.x >> 8, warp = (threadIdx.x >> 5) & 7, lane = threadIdx.x & 31;
    float sum = 0.0f, scale = 0.0f;   // an empty slot: +0 rows, as the slot GEMV writes them
    if (e >= 0) {  // uniform over the CTA
        const size_t n0 = (size_t)e * (2 * I) + (size_t)half * I + 16 * (size_t)t;
        W4A4Rows<K> w;  // the expert's weights in flight before the activation staging
        w4a4_load_rows<K>(w, w_codes + n0 * (K / 2), w_scales + n0 * (K / 16), warp, lane);
        const size_t row = (unsigned)s / (unsigned)act_div;
        const uint2* c = reinterpret_cast<const uint2*>(a_codes + row * (K / 2));
        for (int j = threadIdx.x; j < K / 16; j += 512)
            w4a4_stage_group(sm, j, ld_step(c + j), ld_step(a_scales + row * (K / 16) + j));
        __syncthreads();
        const float acc = w4a4_rows_dot<K, FAST>(w, sm, warp, lane);
        if ((lane & 1) == 0) part[8 * half + warp][lane >> 1] = acc;
        __syncthreads();
        if (threadIdx.x < 32) {   // w4a4_finish's sum over the half's warps, in warp order
            const int h = threadIdx.x >> 4, r = threadIdx.x & 15;
            sum = part[8 * h][r];
#pragma unroll
            for (int v = 1; v < 8; ++v) sum = __fadd_rn(sum, part[8 * h + v][r]);
            scale = __fmul_rn(ld_step(a_g + row), __ldg(w_gscale + e));
        }
    }
    if (threadIdx.x < 32) {   // lane r < 16: gate row r; lane 16 + r: up row r
        const float gu = bf16_to_f32(f32_to_bf16(__fmul_rn(sum, scale)));
        const float u = __shfl_down_sync(0xffffffffu, gu, 16);
        if (threadIdx.x < 16) {
            const float h = round_bf16(swiglu_clamp_element(gu, u, limit));
            nvfp4_quant_group_lanes(h, threadIdx.x, gamma_dn, __fdiv_rn(1.0f, gamma_dn),
                                    h_codes + (size_t)s * (I / 2) + 8 * t, h_scales + (size_t)s * (I / 16) + t);
            if (t == 0 && threadIdx.x == 0) h_g[s] = gamma_dn;
        }
    }
}

template <int K, int I, bool FAST = false>
__global__ void __launch_bounds__(512, 2) moe_gate_up_pair(const int* ids, int act_div, const uint8_t* a_codes,
                                                           const uint8_t* a_scales, const float* a_g,
                                                           const uint8_t* w_codes, const uint8_t* w_scales,
                                                           const float* w_gscale, float limit, float gamma_dn,
                                                           uint8_t* h_codes, uint8_t* h_scales, float* h_g) {
    ::kbp::pdl_wait();   // PDL: the ids and the quantized rows come from the router
    moe_gate_up_pair_tile<K, I, FAST>(blockIdx.x, blockIdx.y, ids, act_div, a_codes, a_scales, a_g, w_codes,
                                      w_scales, w_gscale, limit, gamma_dn, h_codes, h_scales, h_g);
}

// Shared gate/up tile t in a CTA of THREADS (a multiple of 128): the first half of its 64-thread
// groups takes gate rows P t + 4g.., the second half the up rows ISH + P t + 4(g - G/2).. (P = 4 G/2
// positions a tile; w4a16_cta's per-row walk, so the same BF16 bits), then the FP32 silu-clamp
// input of those P positions.
template <int K, int ISH, int THREADS>
__device__ __forceinline__ void moe_shared_gate_up_tile(int t, const __nv_bfloat16* x, const uint8_t* codes,
                                                        const uint8_t* scales, float sg, float limit, float* sh_x) {
    constexpr int G = THREADS / 64, P = 4 * (G / 2);
    static_assert(THREADS % 128 == 0 && K % 16 == 0 && ISH % P == 0, "whole gate/up group pairs");
    __shared__ float wpart[G][W4A16_ROWS];
    __shared__ __nv_bfloat16 ybuf[2 * P];   // [g P t.. | u P t..]
    const int grp = threadIdx.x >> 6, l = threadIdx.x & 63;
    const size_t row0 = (grp < G / 2 ? 0 : ISH) + (size_t)P * t + 4 * (grp % (G / 2));
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    float acc[W4A16_ROWS];
    if (w4a16_x_big<K>(x4))  // uniform over the CTA: the exact decode's wide-range fallback
        w4a16_rows_partial<K, true>(codes + row0 * (K / 2), scales + row0 * (K / 16), sg, x4, l, W4A16_ROWS, acc);
    else
        w4a16_rows_partial<K, false>(codes + row0 * (K / 2), scales + row0 * (K / 16), sg, x4, l, W4A16_ROWS, acc);
    w4a16_finish(acc, grp, l, W4A16_ROWS, ybuf + 4 * grp, wpart);
    __syncthreads();
    if (threadIdx.x < P) {   // w4a16_silu_input_impl<ISH, true>'s staged value, once
        const float g = fminf(bf16_to_f32(ybuf[threadIdx.x]), limit);
        const float u = fminf(fmaxf(bf16_to_f32(ybuf[P + threadIdx.x]), -limit), limit);
        sh_x[P * t + threadIdx.x] = __fmul_rn(silu_f32(g), u);
    }
}

// The fused router (router_gemv_topk_quant's CTAs and code, one token) and, as further CTAs of the
// same grid, the shared expert's gate/up tiles: the compute-bound shared tiles fill the router's
// latency, as they did from a second stream, without the join that stream needed.
template <int H, int E, int K, int OPC, int ISH>
__global__ void __launch_bounds__(64 * OPC) moe_router_shared(
    const __nv_bfloat16* w, const __nv_bfloat16* x, const float* bias, float routed_scale, float* logits,
    unsigned* arrive, float* weights, int* ids, float gamma, uint8_t* a_codes, uint8_t* a_scales, float* a_g,
    const uint8_t* sh_codes, const uint8_t* sh_scales, float sh_gscale, float limit, float* sh_x) {
    constexpr int RB = (E + OPC - 1) / OPC;   // router CTAs
    const int b = blockIdx.x;                 // uniform: a CTA is a router CTA or a shared tile
    if (b >= RB) {
        ::kbp::pdl_wait();   // PDL: x comes from the previous kernel
        moe_shared_gate_up_tile<H, ISH, 64 * OPC>(b - RB, x, sh_codes, sh_scales, sh_gscale, limit, sh_x);
        return;
    }
    // PDL: weights only before dense_row_partial's pdl_wait; x is read after it
    router_gemv_part<H, E, OPC>(w, x, logits, b, 0);
    router_quant_share<H, 64 * OPC>(x, gamma, a_codes, a_scales, a_g, b, RB, 0);
    router_topk_tail<E, K, OPC>(bias, routed_scale, logits, arrive, weights, ids, RB, 1);
}

// Shared down tile t (256 threads): rows 16t.. of sh_y from the staged FP32 row sh_x, as
// w4a16_silu_input_impl computes them after staging its own silu-clamp values (the same values).
template <int ISH>
__device__ __forceinline__ void moe_shared_down_tile(int t, const float* sh_x, const uint8_t* codes,
                                                     const uint8_t* scales, float sg, __nv_bfloat16* y, int N) {
    static_assert(ISH % 16 == 0 && ISH * 4 <= 40960, "the FP32 input is staged in static shared memory");
    __shared__ __align__(16) float xs[ISH];
    __shared__ float part[4][W4A16_ROWS];
    for (int k = threadIdx.x; k < ISH; k += 256) xs[k] = ld_step(sh_x + k);
    const int grp = threadIdx.x >> 6, l = threadIdx.x & 63;
    const int n0 = (t * 4 + grp) * W4A16_ROWS;
    const int valid = max(0, min(W4A16_ROWS, N - n0));
    float acc[W4A16_ROWS];
    w4a16_silu_rows<ISH>(codes + (size_t)n0 * (ISH / 2), scales + (size_t)n0 * (ISH / 16), sg, xs, l, valid, acc);
    w4a16_finish(acc, grp, l, valid, y + n0, part);
}

// The routed gate/up slot GEMV (w4a4_gemv_moe_slots over the router's quantized row) and, first in
// the grid, the shared down's tiles over the FP32 row the router launch's shared tiles wrote.
template <int K, int ISH, int NS, bool FAST = false, int MIN_CTAS = w4a4_min_ctas<K>()>
__global__ void __launch_bounds__(256, MIN_CTAS) moe_gate_up_shared_down(
    const int* ids, int act_div, const uint8_t* a_codes, const uint8_t* a_scales, const float* a_g,
    const uint8_t* w_codes, const uint8_t* w_scales, const float* w_gscale, __nv_bfloat16* y, int N,
    const float* sh_x, const uint8_t* sh_codes, const uint8_t* sh_scales, float sh_gscale, __nv_bfloat16* sh_y) {
    static_assert(NS % 16 == 0, "16-row tiles");
    ::kbp::pdl_wait();   // PDL: the ids, the quantized row and sh_x come from the router launch
    constexpr int T = NS / 16;
    const int b = blockIdx.x;   // uniform: a CTA is one tile
    if (b < T) {
        moe_shared_down_tile<ISH>(b, sh_x, sh_codes, sh_scales, sh_gscale, sh_y, NS);
        return;
    }
    const int r = b - T, tiles = N / 16;
    w4a4_gemv_moe_slot_tile<K, FAST>(r % tiles, r / tiles, ids, act_div, a_codes, a_scales, a_g, w_codes, w_scales,
                                     w_gscale, y, N);
}

}  // namespace kbp
