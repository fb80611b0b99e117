// glm_router_topk.cuh: sigmoid + correction-bias top-k routing over FP32 logits
// (explain.families.glm_router_topk; the rank form, same ids and weights as k argmax rounds).
//
// Launch contract
//   kbp::router_topk<E, K>(logits, bias, routed_scale, weights, ids)
//     logits [m][E] FP32, bias [E] FP32, weights [m][K] FP32, ids [m][K] int32.
//     grid (m), block router_threads(E) = 32 * ceil(E / 32) (E <= 1024), static shared memory
//     about (E/32 * K) * 8 + K * 8 bytes. K <= 32.
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
#pragma once

#include <math.h>
#include <stdint.h>

#include "kbp_common.cuh"
#include "kbp_transcendental.cuh"

namespace kbp {

__host__ __device__ constexpr int router_threads(int experts) { return 32 * ((experts + 31) / 32); }

__device__ __forceinline__ bool router_beats(float chi_a, int id_a, float chi_b, int id_b) {
    return chi_a > chi_b || (chi_a == chi_b && id_a < id_b);
}

template <int E, int K>
__device__ __forceinline__ void router_topk_body(const float* __restrict__ logits,
                                                 const float* __restrict__ bias, float routed_scale,
                                                 float* __restrict__ weights, int* __restrict__ ids) {
    constexpr int THREADS = router_threads(E), WARPS = THREADS / 32, KEPT = WARPS * K;
    static_assert(E >= 1 && E <= 1024, "one thread per expert, at most 1024");
    static_assert(K >= 1 && K <= 32, "one lane of warp 0 per slot");
    __shared__ float2 kept_list[KEPT];  // (chi, id as bits): one 8-byte load per comparison
    __shared__ float slot_score[K];
    __shared__ int slot_id[K];
    const int e = threadIdx.x, warp = e / 32;
    const size_t t = blockIdx.x;
    float s = 0.0f, chi = -INFINITY;
    if (e < E) {
        s = sigmoid_f32(logits[t * E + e]);
        chi = s + bias[e];
    }
    const bool cand = e < E && !isnan(chi) && chi > -INFINITY;
    for (int i = e; i < KEPT; i += THREADS) kept_list[i] = make_float2(0.0f, __int_as_float(-1));
    if (e < K) slot_id[e] = -1;
    // Rank within the warp: the candidates of this warp that beat me.
    int rank = 0;
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
        const float chi_c = __shfl_sync(0xffffffffu, chi, c);
        const bool cand_c = __shfl_sync(0xffffffffu, cand ? 1 : 0, c) != 0;
        rank += (cand_c && router_beats(chi_c, warp * 32 + c, chi, e)) ? 1 : 0;
    }
    const bool kept = cand && rank < K;
    __syncthreads();  // kept_list / slot_id initialised
    if (kept) kept_list[warp * K + rank] = make_float2(chi, __int_as_float(e));
    __syncthreads();
    if (kept) {
        int slot = 0;
#pragma unroll 8
        for (int i = 0; i < KEPT; ++i) {
            const float2 c = kept_list[i];
            const int id = __float_as_int(c.y);
            slot += (id >= 0 && router_beats(c.x, id, chi, e)) ? 1 : 0;
        }
        if (slot < K) {
            slot_id[slot] = e;
            slot_score[slot] = s;
        }
    }
    __syncthreads();
    if (e < K) {
        float sum = 0.0f;
        for (int r = 0; r < K; ++r) {
            const float v = slot_id[r] >= 0 ? slot_score[r] : 0.0f;
            sum = r ? sum + v : v;
        }
        const int id = slot_id[e];
        ids[t * K + e] = id;
        weights[t * K + e] = id >= 0 ? __fdiv_rn(slot_score[e], sum + 1e-20f) * routed_scale : 0.0f;
    }
}

template <int E, int K>
__global__ void __launch_bounds__(router_threads(E))
router_topk(const float* __restrict__ logits, const float* __restrict__ bias, float routed_scale,
            float* __restrict__ weights, int* __restrict__ ids) {
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    router_topk_body<E, K>(logits, bias, routed_scale, weights, ids);
}

}  // namespace kbp
