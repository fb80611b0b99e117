// moe_experts.cuh: a MoE layer's router and expert GEMVs in launches that carry the shared expert's
// tiles beside the routed ones, or whose tiles end in the next GEMV's input (rules moe_experts and
// moe_gate_up_pair), or whose units wait for each other inside one grid (rules moe_expert_flow and
// moe_gate_up_flow; kbpc/codegen/families/moe_experts.py). Every byte equals the unfused chain's
// (kbpc.reference: w4a4_static_moe_slots, swiglu_clamp_rows, quantize_nvfp4_static, w4a16_gemv and
// its silu-clamp input form).
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
//   kbp::moe_expert_flow<K, I, N, FAST, DT> and kbp::moe_gate_up_flow<K, I, FAST>: the routed gate/up
//     tiles, the SwiGLU quantizer and (moe_expert_flow) the down's tiles as units of one grid, each
//     waiting only for the units it reads (contracts at their definitions below; rules
//     moe_expert_flow and moe_gate_up_flow, both opt-in: measured slower in the step).
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

// ------------------------------------------------------------------ the routed experts as one flow
// moe_expert_flow<K, I, N, FAST, DT>: the routed gate/up GEMV, the SwiGLU + NVFP4 quantizer of the
// down input and the routed down GEMV as the units of one grid, each unit waiting only for the
// units it reads (rule moe_expert_flow): the down's weights stream while the gate/up's last tiles
// run, and neither the quantizer's launch nor its two full dependencies are left.
//   units, in ticket order, each slot-major:
//     gate/up tile (s, t), S * 2I/16 of them: w4a4_gemv_moe_slot_tile<K, FAST>'s tile t of slot s
//       (the same code and bits); each of its 16 BF16 values goes to words[s][16t + r] as its bits
//       + 1 with one relaxed 32-bit store: a word is its own arrival flag (0: not written), so no
//       fence and no counter.
//     quantizer (s, c), S * ceil(I / 256): one value a thread, i = 256c + tid < I: waits for words
//       [s][i] and [s][I + i], re-arms them (0), then w4a4_quant_swiglu_rows_static<I>'s value (the
//       same device functions: the same bytes) into h_codes / h_scales / h_g of row s; the CTA's
//       arrival is one release add on q_count[s].
//     down tiles (s, c), S * N / (16 DT): its expert id read and its weights in flight first, then
//       thread 0 waits for q_count[s] == ceil(I / 256) (acquire), counts the CTA in consumed[s] (the
//       slot's last resets both for the next launch), and the tiles run as
//       w4a4_gemv_moe_slots_after_quant's (the quantized row read through L2).
//   sync: [ticket, q_count[S], consumed[S]] unsigned, words (S, 2I) unsigned: zero before the
//   first launch, left zero by every launch. grid = S * (2I/16 + ceil(I/256) + N/(16 DT)) (1-D,
//   S from gridDim.x), block 256.
// Progress: each CTA takes its unit from a ticket counter (atomicInc, which wraps back to 0 at the
//   grid size: a launch leaves it zero), not from blockIdx: a unit waits only for units of lower
//   tickets, which CTAs already running hold and finish without waiting on later ones, whatever
//   order the hardware starts CTAs in. Waits are bounded (kFlowSpinLimit polls, then a trap).
// PDL: the ticket before pdl_wait (the sync state is this launch's own); everything else after.
namespace flow {
constexpr unsigned kFlowSpinLimit = 1u << 25;   // ~3 s of polling is a lost hand-off: trap, never hang

// Polls load() until done(value); returns that value.
template <typename Load, typename Done>
__device__ __forceinline__ unsigned spin(Load load, Done done) {
    unsigned v, n = 0;
    while (!done(v = load())) {
        __nanosleep(64);
        if (++n > kFlowSpinLimit) __trap();
    }
    return v;
}
// A self-flagging word once it is written (non-zero).
__device__ __forceinline__ unsigned wait_word(const unsigned* p) {
    return spin([p] { return ld_relaxed_gpu(p); }, [](unsigned v) { return v != 0u; });
}
}  // namespace flow

template <int K, bool FAST>
__device__ __forceinline__ void moe_flow_gate_up(int t, int s, const int* ids, int act_div, const uint8_t* a_codes,
                                                 const uint8_t* a_scales, const float* a_g,
                                                 const uint8_t* w_codes, const uint8_t* w_scales,
                                                 const float* w_gscale, unsigned* words, int n2) {
    __shared__ W4A4Smem<K> sm;
    const int e = ld_step(ids + s);
    const size_t n0 = (size_t)t * 16;
    __nv_bfloat16 y = f32_to_bf16(0.0f);   // an empty slot: +0 rows, as the slot GEMV writes them
    if (e >= 0) {  // uniform over the CTA
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        const size_t ew = (size_t)e * n2;
        W4A4Rows<K> w;
        w4a4_load_rows<K>(w, w_codes + (ew + n0) * (K / 2), w_scales + (ew + n0) * (K / 16), warp, lane);
        const size_t row = (unsigned)s / (unsigned)act_div;
        w4a4_stage_act<K>(a_codes + row * (K / 2), a_scales + row * (K / 16), sm);
        __syncthreads();
        const float p = w4a4_row_sum(w4a4_rows_dot<K, FAST>(w, sm, warp, lane), sm.part, warp, lane);
        if (threadIdx.x < 16) y = f32_to_bf16(__fmul_rn(p, __fmul_rn(ld_step(a_g + row), __ldg(w_gscale + e))));
    }
    if (threadIdx.x < 16)
        st_relaxed_gpu(words + (size_t)s * n2 + n0 + threadIdx.x, (unsigned)__bfloat16_as_ushort(y) + 1u);
}

template <int I>
__device__ __forceinline__ void moe_flow_quant(int s, int c, unsigned* words, float limit, float gamma,
                                               uint8_t* h_codes, uint8_t* h_scales, float* h_g, unsigned* q_count) {
    const int i = c * 256 + threadIdx.x;   // I % 16 == 0: a group's 16 lanes are all in or all out
    if (i < I) {
        unsigned* row = words + (size_t)s * (2 * I);
        const unsigned g = flow::wait_word(row + i), u = flow::wait_word(row + I + i);
        st_relaxed_gpu(row + i, 0u);   // re-armed for the next launch
        st_relaxed_gpu(row + I + i, 0u);
        const float v = round_bf16(swiglu_clamp_element(bf16_to_f32(__ushort_as_bfloat16((unsigned short)(g - 1u))),
                                                        bf16_to_f32(__ushort_as_bfloat16((unsigned short)(u - 1u))),
                                                        limit));
        const int j = i / 16;
        nvfp4_quant_group_lanes(v, threadIdx.x & 15, gamma, __fdiv_rn(1.0f, gamma),
                                h_codes + (size_t)s * (I / 2) + 8 * j, h_scales + (size_t)s * (I / 16) + j);
        if (i == 0) h_g[s] = gamma;
    }
    if (q_count == nullptr) return;   // moe_gate_up_flow: the down waits for the whole grid instead
    __syncthreads();   // the CTA's stores before thread 0's fence (cumulative) and arrival
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(q_count + s, 1u);
    }
}

template <int K, bool FAST, int DT>
__device__ __forceinline__ void moe_flow_down(int c, int s, const int* ids, const uint8_t* h_codes,
                                              const uint8_t* h_scales, const float* h_g, const uint8_t* w_codes,
                                              const uint8_t* w_scales, const float* w_gscale, __nv_bfloat16* y,
                                              int N, unsigned* q_count, unsigned* consumed, unsigned quant_units,
                                              unsigned down_units) {
    __shared__ W4A4Smem<K> sm;
    const int e = ld_step(ids + s);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t n0 = (size_t)c * 16 * DT;
    W4A4Rows<K> w[DT];   // the weights in flight while the slot's quantizer units finish
    if (e >= 0) {
        const size_t ew = (size_t)e * N;
#pragma unroll
        for (int i = 0; i < DT; ++i)
            w4a4_load_rows<K>(w[i], w_codes + (ew + n0 + 16 * i) * (K / 2), w_scales + (ew + n0 + 16 * i) * (K / 16),
                              warp, lane);
    }
    // Every down CTA of the slot counts itself in once it has seen the count, so the last one can
    // re-arm both counters; the count's result is needed only at the end (re_arm), so its latency
    // hides behind the tiles.
    unsigned seen = 0;
    if (threadIdx.x == 0) {
        flow::spin([=] { return ld_acquire_gpu(q_count + s); }, [=](unsigned v) { return v == quant_units; });
        seen = atomicAdd(consumed + s, 1u);
    }
    const auto re_arm = [&] {
        if (threadIdx.x == 0 && seen == down_units - 1u) {   // every reader has seen the count
            atomicExch(q_count + s, 0u);
            atomicExch(consumed + s, 0u);
        }
    };
    __syncthreads();
    __nv_bfloat16* yo = y + (size_t)s * N + n0;
    if (e < 0) {   // uniform over the CTA: defined zeros
        if (threadIdx.x < 16 * DT) yo[threadIdx.x] = f32_to_bf16(0.0f);
        re_arm();
        return;
    }
    const uint2* hc = reinterpret_cast<const uint2*>(h_codes + (size_t)s * (K / 2));
    for (int j = threadIdx.x; j < K / 16; j += 256)   // through L2: written by this grid's quantizer units
        w4a4_stage_group(sm, j, __ldcg(hc + j), __ldcg(h_scales + (size_t)s * (K / 16) + j));
    __syncthreads();
    float acc[DT];
#pragma unroll
    for (int i = 0; i < DT; ++i) acc[i] = w4a4_rows_dot<K, FAST>(w[i], sm, warp, lane);
    const float scale = __fmul_rn(__ldcg(h_g + s), __ldg(w_gscale + e));
#pragma unroll
    for (int i = 0; i < DT; ++i) {
        if (i) __syncthreads();   // the previous tile's partials are read before they are overwritten
        w4a4_finish(acc[i], sm.part, scale, yo + 16 * i, warp, lane);
    }
    re_arm();
}

__host__ __device__ constexpr int moe_flow_quant_units(int i) { return (i + 255) / 256; }

template <int K, int I, int N, bool FAST = false, int DT = 1>
__global__ void __launch_bounds__(256, 4) moe_expert_flow(
    const int* ids, int act_div, const uint8_t* a_codes, const uint8_t* a_scales, const float* a_g,
    const uint8_t* gu_codes, const uint8_t* gu_scales, const float* gu_gscale, float limit, float gamma_dn,
    uint8_t* h_codes, uint8_t* h_scales, float* h_g, const uint8_t* dn_codes, const uint8_t* dn_scales,
    const float* dn_gscale, __nv_bfloat16* y, unsigned int* words, unsigned int* sync) {
    static_assert(K % 128 == 0 && I % 128 == 0 && N % (16 * DT) == 0, "moe_expert_flow: K, I % 128 == 0, N % 16 DT");
    static_assert(K <= W4A4_MAX_K && I <= W4A4_MAX_K, "the activation staging must fit static shared memory");
    constexpr int GU = 2 * I / 16, QU = moe_flow_quant_units(I), DU = N / (16 * DT);
    __shared__ unsigned ticket;
    if (threadIdx.x == 0) ticket = atomicInc(sync, gridDim.x - 1u);   // wraps to 0 after the last CTA
    __syncthreads();
    const int slots = (int)gridDim.x / (GU + QU + DU);
    unsigned* q_count = sync + 1;
    unsigned* consumed = sync + 1 + slots;
    int u = (int)ticket;
    ::kbp::pdl_wait();   // PDL: the ids and the quantized row come from the router
    if (u < slots * GU) {
        moe_flow_gate_up<K, FAST>(u % GU, u / GU, ids, act_div, a_codes, a_scales, a_g, gu_codes, gu_scales,
                                  gu_gscale, words, 2 * I);
        return;
    }
    u -= slots * GU;
    if (u < slots * QU) {
        moe_flow_quant<I>(u / QU, u % QU, words, limit, gamma_dn, h_codes, h_scales, h_g, q_count);
        return;
    }
    u -= slots * QU;
    moe_flow_down<I, FAST, DT>(u % DU, u / DU, ids, h_codes, h_scales, h_g, dn_codes, dn_scales, dn_gscale, y, N,
                               q_count, consumed, QU, DU);
}

// moe_gate_up_flow<K, I, FAST>: moe_expert_flow without the down's units (rule moe_gate_up_flow):
// the gate/up tiles and the SwiGLU quantizer's CTAs of every slot in one grid (the same units,
// tickets and words; grid = S * (2I/16 + ceil(I/256)), sync = [ticket]), then the down's own launch
// (w4a4_gemv_moe_slots_after_quant: this grid releases its dependents only as its CTAs exit, after
// their pdl_wait, so the down may read the router's ids before its own wait).
template <int K, int I, bool FAST = false>
__global__ void __launch_bounds__(256, 4) moe_gate_up_flow(
    const int* ids, int act_div, const uint8_t* a_codes, const uint8_t* a_scales, const float* a_g,
    const uint8_t* gu_codes, const uint8_t* gu_scales, const float* gu_gscale, float limit, float gamma_dn,
    uint8_t* h_codes, uint8_t* h_scales, float* h_g, unsigned int* words, unsigned int* sync) {
    static_assert(K % 128 == 0 && I % 16 == 0, "moe_gate_up_flow: K % 128 == 0, I % 16 == 0");
    static_assert(K <= W4A4_MAX_K, "the activation staging must fit static shared memory");
    constexpr int GU = 2 * I / 16, QU = moe_flow_quant_units(I);
    __shared__ unsigned ticket;
    if (threadIdx.x == 0) ticket = atomicInc(sync, gridDim.x - 1u);   // wraps to 0 after the last CTA
    __syncthreads();
    const int slots = (int)gridDim.x / (GU + QU);
    const int u = (int)ticket;
    // PDL: the ids and the quantized row come from the router. No early release of the dependents:
    // the down's CTAs would take the SMs of this grid's last tiles ahead of the shared expert's down
    // on its side stream (H200, 128-expert seed shrink: the routed down ended 0.35 us sooner, the
    // shared down 14 us later, the combine 3 us later a MoE layer).
    ::kbp::pdl_wait();
    if (u < slots * GU)
        moe_flow_gate_up<K, FAST>(u % GU, u / GU, ids, act_div, a_codes, a_scales, a_g, gu_codes, gu_scales,
                                  gu_gscale, words, 2 * I);
    else
        moe_flow_quant<I>((u - slots * GU) / QU, (u - slots * GU) % QU, words, limit, gamma_dn, h_codes, h_scales,
                          h_g, nullptr);
}

}  // namespace kbp
