// glm_router_topk.cuh: sigmoid + correction-bias top-k routing over FP32 logits
// (explain.families.glm_router_topk; the rank form, same ids and weights as k argmax rounds).
//
// Launch contract
//   kbp::router_topk<E, K>(logits, bias, routed_scale, weights, ids)
//     logits [m][E] FP32, bias [E] FP32, weights [m][K] FP32, ids [m][K] int32.
//     grid (m), block router_threads(E) = 32 * ceil(E / 32) (E <= 1024), static shared memory
//     about (E/32 * K) * 8 + K * 8 bytes. K <= 32.
//   kbp::router_topk_row<E, K, THREADS>(...) one token's body for a block of any THREADS (a
//     multiple of 32, >= K): the fused MoE router (glm_moe_layer.cuh) runs it in 256-thread CTAs.
//   kbp::router_gemv_topk<H, E, K, OPC>(w, x, bias, routed_scale, logits, arrive, weights, ids)
//     the router GEMV and the top-k in one launch (fusion rule router_gemv_topk): w [E][H] BF16,
//     x [m][H] BF16, logits [m][E] FP32 (written: a buffer or the step's scratch), arrive one
//     uint32 that is zero at launch and left zero. grid (ceil(E / OPC), m), block 64 * OPC
//     (OPC in {1, 2, 4}, 64 * OPC >= K), no dynamic smem. Launches that share `arrive` must not
//     overlap (stream order, or PDL: nothing is touched before pdl_wait).
//   kbp::router_gemv_topk_quant<H, E, K, OPC>(w, x, bias, routed_scale, logits, arrive, weights, ids,
//                                             gamma, a_codes, a_scales, a_g)
//     router_gemv_topk that also quantizes x to NVFP4 with the static global scale gamma, as
//     w4a4_quant_rows_static<H> would (fusion rule router_expert_quant: the routed experts' input):
//     a_codes [m][H/2], a_scales [m][H/16] E4M3, a_g [m] = gamma. H % 16 == 0; same grid and block.
//   kbp::router_cluster_topk_quant<H, E, K, CL>(same parameters; `arrive` unused)
//     router_gemv_topk_quant as one thread-block cluster of CL CTAs a token: grid (CL, m),
//     compile-time cluster (CL, 1, 1), block router_cluster_threads(E, CL) (at most 512), no dynamic
//     smem; the same bytes out. CL > 8 is a non-portable cluster width (the launcher opts in).
// Math (kbpc.reference.glm_router_topk; FP32, no FMA contraction)
//   s_e = 1 / (1 + expf(-z_e)), chi_e = fl(s_e + b_e) (selection only). Candidates: chi not NaN and
//   chi > -inf. Expert a beats b if chi_a > chi_b, or chi_a == chi_b and a < b; slot r holds the
//   candidate that exactly r candidates beat (descending, exact ties to the lower id). Slots no
//   candidate fills (fewer than K) are trailing: id -1, weight 0.
//   sum = s_0 + s_1 + ... in slot order (unfilled slots add +0); w_r = fl(fl(s_r / fl(sum + 1e-20))
//   * routed_scale).
// Method: each warp ranks its 32 experts with shuffles and keeps at most K (an expert beaten by K
// others of its own warp cannot be in the top K); each kept expert then counts the kept experts
// of all warps that beat it, which is its slot when below K (a non-kept beater of a candidate
// implies K kept beaters, so counts below K are exact).
// Fused form: every CTA computes OPC logits of one token with dense_gemv_bf16_block (the dense_bf16
// family's device code and order, so the logits are the router GEMV's bits), then arrives at
// `arrive` (kbp::last_to_arrive: CTA barrier, fence, atomic add); the last CTA to arrive resets it,
// stages every token's logits from L2 in shared memory and runs router_topk_row on them. No CTA
// ever waits for another, so it cannot hang.
// With the quantizer, each CTA of token t quantizes, after its GEMV (after pdl_wait), values
// i = blockIdx.x * THREADS + threadIdx.x (+ gridDim.x * THREADS ...) of row t, a 16-value group to 16
// lanes (nvfp4_quant_group_lanes: the group scale and codes w4a4_quant_rows_static writes).
// Phase stamps of a profiling build (kbp_stamps.cuh): router_cluster_topk_quant only, 3-5 inline
// (its pdl_wait is dense_row_partial's, in dense_bf16.cuh, which stamps 1/2).
#pragma once

#include <cooperative_groups.h>
#include <math.h>
#include <stdint.h>

#include "dense_bf16.cuh"
#include "kbp_common.cuh"
#include "kbp_transcendental.cuh"
#include "w4a4_mx.cuh"

namespace kbp {

__host__ __device__ constexpr int router_threads(int experts) { return 32 * ((experts + 31) / 32); }

__device__ __forceinline__ bool router_beats(float chi_a, int id_a, float chi_b, int id_b) {
    return chi_a > chi_b || (chi_a == chi_b && id_a < id_b);
}

// One token's routing with THREADS threads (a multiple of 32, any count: each thread plays the
// experts e = tid, tid + THREADS, ...; "warp" below is a run of 32 consecutive experts). logits may
// point to shared memory (a fused kernel stages them there). Every thread of the block must call it.
template <int E, int K, int THREADS = router_threads(E)>
__device__ __forceinline__ void router_topk_row(const float* logits, const float* bias,
                                                float routed_scale, float* weights,
                                                int* ids) {
    constexpr int EWARPS = router_threads(E) / 32, KEPT = EWARPS * K;
    constexpr int PER = (router_threads(E) + THREADS - 1) / THREADS;  // experts per thread
    static_assert(E >= 1 && E <= 1024, "at most 1024 experts");
    static_assert(K >= 1 && K <= 32 && K <= THREADS, "one thread per slot");
    static_assert(THREADS % 32 == 0, "whole warps");
    __shared__ float2 kept_list[KEPT];  // (chi, id as bits): one 8-byte load per comparison
    __shared__ float slot_score[K];
    __shared__ int slot_id[K];
    const int tid = threadIdx.x;
    float s[PER], chi[PER];
    bool kept[PER];
    for (int i = tid; i < KEPT; i += THREADS) kept_list[i] = make_float2(0.0f, __int_as_float(-1));
    if (tid < K) slot_id[tid] = -1;
    __syncthreads();  // kept_list / slot_id initialised
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int e = tid + j * THREADS, warp = e / 32;
        s[j] = 0.0f;
        chi[j] = -INFINITY;
        if (e < E) {
            s[j] = sigmoid_f32(logits[e]);
            chi[j] = s[j] + bias[e];
        }
        const bool cand = e < E && !isnan(chi[j]) && chi[j] > -INFINITY;
        // Rank within the run of 32: the candidates of this run that beat me.
        int rank = 0;
#pragma unroll 8
        for (int c = 0; c < 32; ++c) {
            const float chi_c = __shfl_sync(0xffffffffu, chi[j], c);
            const bool cand_c = __shfl_sync(0xffffffffu, cand ? 1 : 0, c) != 0;
            rank += (cand_c && router_beats(chi_c, warp * 32 + c, chi[j], e)) ? 1 : 0;
        }
        kept[j] = cand && rank < K;
        if (kept[j]) kept_list[warp * K + rank] = make_float2(chi[j], __int_as_float(e));
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int e = tid + j * THREADS;
        if (kept[j]) {
            int slot = 0;
#pragma unroll 8
            for (int i = 0; i < KEPT; ++i) {
                const float2 c = kept_list[i];
                const int id = __float_as_int(c.y);
                slot += (id >= 0 && router_beats(c.x, id, chi[j], e)) ? 1 : 0;
            }
            if (slot < K) {
                slot_id[slot] = e;
                slot_score[slot] = s[j];
            }
        }
    }
    __syncthreads();
    if (tid < K) {
        float sum = 0.0f;
        for (int r = 0; r < K; ++r) {
            const float v = slot_id[r] >= 0 ? slot_score[r] : 0.0f;
            sum = r ? sum + v : v;
        }
        const int id = slot_id[tid];
        ids[tid] = id;
        weights[tid] = id >= 0 ? __fdiv_rn(slot_score[tid], sum + 1e-20f) * routed_scale : 0.0f;
    }
    __syncthreads();  // the shared lists may be reused by the caller's next token
}

template <int E, int K>
__device__ __forceinline__ void router_topk_body(const float* logits,
                                                 const float* bias, float routed_scale,
                                                 float* weights, int* ids) {
    const size_t t = blockIdx.x;
    router_topk_row<E, K>(logits + t * E, bias, routed_scale, weights + t * K, ids + t * K);
}

template <int E, int K>
__global__ void __launch_bounds__(router_threads(E))
router_topk(const float* logits, const float* bias, float routed_scale,
            float* weights, int* ids) {
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    router_topk_body<E, K>(logits, bias, routed_scale, weights, ids);
}

// The router GEMV of token t, outputs OPC * cta .. + OPC - 1 (pdl_wait inside). A merged grid
// (kernels/moe_experts.cuh) passes its own router CTA index.
template <int H, int E, int OPC>
__device__ __forceinline__ void router_gemv_part(const __nv_bfloat16* w, const __nv_bfloat16* x, float* logits,
                                                 int cta = blockIdx.x, int t = blockIdx.y) {
    constexpr int THREADS = 64 * OPC;
    // The weight bytes dense_row_partial loads only after pdl_wait (beyond its first batch of
    // vectors) go to L2 first; x and everything else come after the dependency.
    constexpr size_t ROW_BYTES = (size_t)H * 2, FIRST_BYTES = (size_t)64 * DENSE_BF16_BATCH * 16;
    if (ROW_BYTES > FIRST_BYTES && t == 0) {
        for (int s = 0; s < OPC; ++s) {
            const int n = cta * OPC + s;
            if (n < E)
                prefetch_l2(reinterpret_cast<const char*>(w + (size_t)n * H) + FIRST_BYTES,
                            ROW_BYTES - FIRST_BYTES, threadIdx.x, THREADS);
        }
    }
    dense_gemv_bf16_block<H, float, OPC>(w, x + (size_t)t * H, logits + (size_t)t * E, E, cta);  // pdl_wait inside
}

// After a CTA's router outputs: arrive, and in the last of the `ctas` router CTAs the top-k of
// every token (`tokens` of them) over the logits read back from L2.
template <int E, int K, int OPC>
__device__ __forceinline__ void router_topk_tail(const float* bias, float routed_scale, const float* logits,
                                                 unsigned* arrive, float* weights, int* ids,
                                                 unsigned ctas = gridDim.x * gridDim.y, unsigned tokens = gridDim.y) {
    constexpr int THREADS = 64 * OPC;
    pdl_launch_dependents();  // the next kernel may start; it waits for this grid in its pdl_wait
    if (!last_to_arrive(arrive, ctas)) return;
    __shared__ float z[E];
    for (unsigned r = 0; r < tokens; ++r) {
        for (int e = threadIdx.x; e < E; e += THREADS) z[e] = __ldcg(logits + (size_t)r * E + e);
        __syncthreads();
        router_topk_row<E, K, THREADS>(z, bias, routed_scale, weights + (size_t)r * K, ids + (size_t)r * K);
    }
}

template <int H, int E, int K, int OPC>
__global__ void __launch_bounds__(64 * OPC)
router_gemv_topk(const __nv_bfloat16* w, const __nv_bfloat16* x,
                 const float* bias, float routed_scale, float* logits, unsigned* arrive,
                 float* weights, int* ids) {
    // PDL: weights only before dense_row_partial's pdl_wait
    router_gemv_part<H, E, OPC>(w, x, logits);
    router_topk_tail<E, K, OPC>(bias, routed_scale, logits, arrive, weights, ids);
}

// This CTA's share of token blockIdx.y's NVFP4 quantization with the static scale gamma: value i
// of row t goes to thread i - cta * THREADS (+ ctas * THREADS ...), each group of 16 values to 16
// consecutive lanes (nvfp4_quant_group_lanes: nvfp4_quant_group's scale and codes, spread so a
// lane pays one value's division, not sixteen), so codes, scales and a_g[t] = gamma are
// w4a4_quant_rows_static's bytes. Only the CTAs that hold values take part (the first H / THREADS),
// one value a thread: their arrival, which the top-k waits for, is then about as early as the
// others'. With 16 values a thread in two CTAs the router ended 2.6 us later in the step (H200,
// 128-expert seed shrink, replay timeline). Running the quantizer in extra warps beside the GEMV
// ended the router another 1.1 us sooner, but not the gate/up GEMV after it (0.5 us later).
template <int H, int THREADS>
__device__ __forceinline__ void router_quant_share(const __nv_bfloat16* x, float gamma, uint8_t* a_codes,
                                                   uint8_t* a_scales, float* a_g, int cta = blockIdx.x,
                                                   int ctas = gridDim.x, int tok = blockIdx.y) {
    static_assert(H % 16 == 0 && THREADS % 16 == 0, "NVFP4 groups are 16 values, whole in one half-warp");
    // Every thread waits itself: dense_gemv_bf16_block waits only in the threads that own a row.
    pdl_wait();
    const size_t t = tok;
    const float inv_g = __fdiv_rn(1.0f, gamma);
    // i and the bound are the same for the 16 lanes of a group, so a group enters (and leaves) whole.
    for (int i = cta * THREADS + threadIdx.x; i < H; i += ctas * THREADS) {
        const float v = bf16_to_f32(ld_step(x + t * H + i));
        nvfp4_quant_group_lanes(v, threadIdx.x & 15, gamma, inv_g, a_codes + t * (H / 2) + 8 * (i / 16),
                                a_scales + t * (H / 16) + i / 16);
    }
    if (cta == 0 && threadIdx.x == 0) a_g[t] = gamma;
}

template <int H, int E, int K, int OPC>
__global__ void __launch_bounds__(64 * OPC)
router_gemv_topk_quant(const __nv_bfloat16* w, const __nv_bfloat16* x,
                       const float* bias, float routed_scale, float* logits, unsigned* arrive,
                       float* weights, int* ids, float gamma, uint8_t* a_codes, uint8_t* a_scales,
                       float* a_g) {
    // PDL: weights only before dense_row_partial's pdl_wait; x is read after it
    router_gemv_part<H, E, OPC>(w, x, logits);
    router_quant_share<H, 64 * OPC>(x, gamma, a_codes, a_scales, a_g);
    router_topk_tail<E, K, OPC>(bias, routed_scale, logits, arrive, weights, ids);
}

// ------------------------------------------------------------------ the cluster form
// Logits a CTA of the cluster form computes, over at most 8 64-thread groups (a group takes logits
// s, s + 8, ...: more than one where E > 8 CL).
__host__ __device__ constexpr int router_cluster_lpc(int experts, int cl) { return (experts + cl - 1) / cl; }
__host__ __device__ constexpr int router_cluster_threads(int experts, int cl) {
    return 64 * (router_cluster_lpc(experts, cl) < 8 ? router_cluster_lpc(experts, cl) : 8);
}

// router_gemv_topk_quant's work with the logits meeting in distributed shared memory instead of
// L2: CTA c of token t's cluster computes logits c * LPC + s + G r (64-thread group s of G, its
// rows r in order; dense_row_partial's order and dense_gemv_bf16_block's final add: the same bits;
// only the first row's weights are in flight before the wait, the others prefetched into L2 and
// loaded after it) and stores each into CTA 0's shared row; one cluster barrier (release /
// acquire) later CTA 0 ranks them (router_topk_row, whose result does not depend on its thread
// count). The last-CTA form instead stores them to L2, fences,
// counts arrivals on a global counter and reads them back in the last CTA. The logits' global copy
// (for readers outside) and the quantizer share run between the barrier's halves: nothing in the
// cluster reads them. Every CTA arrives once at its start, so the wait before the distributed
// stores (they need their owner running) is already satisfied when it is reached. At 512 threads
// the CTA is held to 64 registers (two a SM, no spills at the seed's shape), so it fits beside the
// kernels it overlaps under PDL. H200, 128-expert seed shrink (16-CTA clusters): the router ends
// 4.85 us after the hc boundary instead of 7.11; what that buys depends on the shared expert beside
// the routed gate/up (kbpc/codegen/families/glm_router_topk.py, ROUTER_CLUSTER).
template <int H, int E, int K, int CL>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(router_cluster_threads(E, CL), 2)
router_cluster_topk_quant(const __nv_bfloat16* w, const __nv_bfloat16* x,
                          const float* bias, float routed_scale, float* logits, unsigned* /*arrive*/,
                          float* weights, int* ids, float gamma, uint8_t* a_codes, uint8_t* a_scales,
                          float* a_g) {
    KBP_STAMP_BEGIN();   // stamps of a profiling build (kbp_stamps.cuh): 3-5 below
    constexpr int LPC = router_cluster_lpc(E, CL), THREADS = router_cluster_threads(E, CL), G = THREADS / 64;
    constexpr int R = (LPC + G - 1) / G;   // rows a group
    static_assert(H % 16 == 0, "router input rows of whole NVFP4 groups");
    static_assert(CL >= 1 && CL <= 16 && THREADS >= K, "at most 16 CTAs a cluster, a thread a slot");
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster_arrive_relaxed();   // this CTA runs: the others may store into its shared memory
    __shared__ float z[E];      // CTA 0's copy holds every logit of the token
    __shared__ float part[G];
    const int c = (int)cluster.block_rank(), t = blockIdx.y;
    const int slot = threadIdx.x >> 6, l = threadIdx.x & 63;
    constexpr size_t ROW_BYTES = (size_t)H * 2, FIRST_BYTES = (size_t)64 * DENSE_BF16_BATCH * 16;
    if (t == 0)   // to L2 before the wait: all but what the first row's first batch loads
#pragma unroll 1
        for (int r = 0; r < R; ++r) {
            const int n = c * LPC + slot + G * r;
            const size_t skip = r == 0 ? FIRST_BYTES : 0;
            if (slot + G * r < LPC && n < E && ROW_BYTES > skip)
                prefetch_l2(reinterpret_cast<const char*>(w + (size_t)n * H) + skip, ROW_BYTES - skip, l, 64);
        }
    float y[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {   // uniform over the block (the barrier)
        const int n = c * LPC + slot + G * r;
        const bool mine = slot + G * r < LPC && n < E;
        float acc = 0.0f;
        if (mine)   // pdl_wait inside (the first row: after its first weight batch is in flight)
            acc = dense_row_partial<H>(reinterpret_cast<const uint4*>(w + (size_t)n * H),
                                       reinterpret_cast<const uint4*>(x + (size_t)t * H), l);
        acc = warp_sum_down(acc);
        if (l == 32) part[slot] = acc;   // lane 0 of the group's second warp holds P1
        __syncthreads();
        if (r == 0) pdl_launch_dependents();   // as the last-CTA form: the next kernel may start, it waits for this grid
        y[r] = l == 0 && mine ? __fadd_rn(acc, part[slot]) : 0.0f;
        if (R > 1) __syncthreads();   // part is reused by the next row
    }
    KBP_STAMP(3);   // the CTA's GEMV rows done (logits in registers)
    cluster_wait();   // every CTA of the cluster runs
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int n = c * LPC + slot + G * r;
        if (l == 0 && slot + G * r < LPC && n < E) *cluster.map_shared_rank(z + n, 0) = y[r];
    }
    cluster_arrive_release();
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int n = c * LPC + slot + G * r;
        if (l == 0 && slot + G * r < LPC && n < E) logits[(size_t)t * E + n] = y[r];
    }
    router_quant_share<H, THREADS>(x, gamma, a_codes, a_scales, a_g, c, CL, t);   // waits itself
    KBP_STAMP(4);   // logits stored (global copy) and the CTA's NVFP4 share of x stored
    cluster_wait_acquire();
    KBP_STAMP(5);   // cluster barrier passed: every logit in CTA 0's shared row
    if (c != 0) { KBP_STAMP_END(); return; }
    router_topk_row<E, K, THREADS>(z, bias, routed_scale, weights + (size_t)t * K, ids + (size_t)t * K);
    KBP_STAMP_END();   // CTA 0: top-k ranked, weights and ids stored
}

}  // namespace kbp
