// dsa_indexer.cuh: the DSA lightning indexer for one decode row: key store + pool compression
// (this file), and scores over the persisted pool keys for all index heads fused with a
// deterministic top-k and the expansion to token ids (dsa_index_select.cuh, included below).
//
// Geometry lives on the device (graph-replay safe): seq_len[0] = S (tokens cached, this step's
// token included), tau[0] = the query position; the runner uploads both before the step's first
// kernel. Pools p < n_valid = min(S/KP, (tau+1)/KP) are scored; k = min((tau+1)/KP,
// min(S, TOPK_POOLS*KP)/KP) of them are selected.
//
// Device state (owned by the runner; reference: kbpc/reference/dsa_indexer.py, sizes in
// kbpc/ir/state.py):
//   kg_keys, kg_gates  __nv_bfloat16 [rows][D]  token t in row t % rows (rows a multiple of KP;
//                                              rows = KP keeps only the incomplete pool)
//   pool keys (written when pool p completes), one of
//     f32 cache:  pool_keys   float [capacity][D]          kbar_p
//     fp8 cache:  pool_codes  uint8 [capacity][D]          E4M3 codes of FWHT_D(kbar_p) / sigma_p
//                 pool_scales float [capacity]             sigma_p, a power of two
//   scores      float [capacity]   scratch of the selection; entries [0, n_valid) are written
//   hist        uint32 [2^BITS]    first-digit histogram, zero between launches (the last CTA
//                                  reads and clears it)
//   arrive      uint32 [1]         arrival counter, zero between launches (the last CTA resets it)
//   sel_tokens  int32 [(TOPK_POOLS + 1) * KP]  the selected pools' tokens in rank order, the
//                                  visible tokens of the tail pool, then -1
//
// Kernels and launch contracts
//   dsa_indexer_store<D, KP, FP8><<<1, D>>>(key, gate, slot_term, kg_keys, kg_gates, rows,
//                                           pool_keys, pool_codes, pool_scales, tau)
//     key, gate: bf16 [D] (normalised index key, gate); slot_term: float [KP][D] (the learned a).
//     Stores token tau; if tau + 1 is a multiple of KP also writes pool tau / KP: kbar into
//     pool_keys (FP8 = false; the code pointers are unused and may be null) or its rotated codes
//     and scale (FP8 = true; pool_keys unused). D a multiple of 32 (a power of two for FP8).
//   dsa_indexer_store_norm<D, KP, FP8><<<1, D>>>(x, norm_w, norm_b, eps, gate, slot_term, kg_keys,
//                                                kg_gates, rows, pool_keys, pool_codes, pool_scales, tau)
//     (rule dsa_key_store) the same store of key = layer_norm_bf16<D, D>(x, norm_w, norm_b, eps)
//     (layer_norm.cuh's arithmetic, bit for bit), computed in the block: x bf16 [D] is the raw
//     index key; D a power of two in [32, 1024] (the norm's block rule gives D threads).
//   dsa_index_select<H, D, KP, TOPK_POOLS, FP8, BITS, QROT, MMA, ORDER_FREE><<<G, 512>>>(q, raw_w, pool_keys,
//       pool_codes, pool_scales, seq_len, tau, scores, hist, arrive, sel_tokens)
//     (dsa_index_select.cuh) any G >= 1; the lowering uses one CTA per SM. QROT (numerics
//     `fast`, FP8 cache): scores against the rotated query instead of reading keys back (bounded).
//     MMA (numerics `fast`, FP32 cache): scores on BF16 tensor cores (dsa_index_score_mma.cuh;
//     bounded). ORDER_FREE (numerics `fast`): the list holds the top k pools in index order (the
//     fast decode takes the list as a set); while the top k is every valid pool nothing is scored.
//
// Math and order (explain.families.dsa_indexer; every choice matches the reference):
//   pool softmax per channel: x_s = g_s + a_s, m = max_s x_s, e_s = exp(x_s - m),
//     den = e_0 + e_1 + ..., kbar = sum_s fl(e_s / den) k_s in slot order;
//   fp8 cache (kbpc/reference/dsa_index_cache.py): y = FWHT_D(kbar) (stages h = 1, 2, ..., D/2),
//     sigma = 2^e with e the smallest integer such that max|y| <= 448 * 2^e (clamped to
//     [-126, 127]), codes = sat_e4m3(y / sigma); read back ktilde = FWHT_D(sigma * e4m3(code)) / D;
//   score: lane l sums q[c] k[c] for c = l, l+32, ... sequentially, the 32-lane xor-butterfly
//     tree, relu(fl(dot * fl(1/sqrtf(D)))) (+0 for x <= 0), times w_h = fl(raw_h * fl(1/sqrtf(H))),
//     summed in head order from +0;
//   top-k: score descending, ties to the lower pool index, -0 == +0; the selected pools in that
//     rank order, expanded to their tokens, then the tail pool's visible tokens, then -1.
// Each kernel NAME is a thin __global__ over NAME_body (a __device__ function), so a translation
// unit may wrap the body in an extern "C" kernel with the same launch bounds.
// The store kernels carry phase stamps (kbp_stamps.cuh): 3 key normalised (norm form), 4 pool key formed.
#pragma once

#include "dsa_indexer_common.cuh"
#include "layer_norm.cuh"

namespace kbp {

// y = FWHT_D over the block (thread c holds y_c), then the E4M3 codes and the scale of pool p.
template <int D>
__device__ __forceinline__ void dsa_store_pool_fp8(float y, int p, uint8_t* pool_codes,
                                                   float* pool_scales) {
    static_assert(D >= 32 && (D & (D - 1)) == 0, "the rotation needs a power-of-two width");
    __shared__ float xchg[D];
    __shared__ float wmax[D / 32];
    const int c = threadIdx.x, lane = c & 31;
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {
        const float o = __shfl_xor_sync(0xffffffffu, y, h);
        y = (lane & h) ? o - y : y + o;
    }
#pragma unroll
    for (int h = 32; h < D; h <<= 1) {
        xchg[c] = y;
        __syncthreads();
        const float o = xchg[c ^ h];
        __syncthreads();
        y = (c & h) ? o - y : y + o;
    }
    const float m = warp_max_xor(fabsf(y));
    if (lane == 0) wmax[c >> 5] = m;
    __syncthreads();
    float max_abs = wmax[0];
#pragma unroll
    for (int w = 1; w < D / 32; ++w) max_abs = fmaxf(max_abs, wmax[w]);
    const float sigma = dsa_pool_scale(max_abs);
    pool_codes[(size_t)p * D + c] = f32_to_e4m3(__fdiv_rn(y, sigma));
    if (c == 0) pool_scales[p] = sigma;
}

// Thread c stores channel c of token t (its key k_new and gate g_new) and, when t completes a pool,
// the pool key's channel c. Called by the whole block of D threads.
template <int D, int KP, bool FP8>
__device__ __forceinline__ void dsa_indexer_store_token(
    __nv_bfloat16 k_new, __nv_bfloat16 g_new,
    const float* slot_term, __nv_bfloat16* kg_keys,
    __nv_bfloat16* kg_gates, int rows, float* pool_keys,
    uint8_t* pool_codes, float* pool_scales, int t) {
    static_assert(D <= 1024 && D % 32 == 0 && KP >= 1, "one thread per channel, whole warps");
    const int c = threadIdx.x;
    kg_keys[(size_t)(t % rows) * D + c] = k_new;
    kg_gates[(size_t)(t % rows) * D + c] = g_new;
    if ((t + 1) % KP != 0) return;   // uniform over the block
    // Each thread re-reads only its own channel (earlier launches wrote it): no block sync.
    const int p = t / KP;
    float k[KP], x[KP];
#pragma unroll
    for (int s = 0; s < KP; ++s) {
        const size_t r = (size_t)((p * KP + s) % rows) * D + c;
        const bool last = s == KP - 1;
        k[s] = bf16_to_f32(last ? k_new : kg_keys[r]);
        x[s] = bf16_to_f32(last ? g_new : kg_gates[r]) + slot_term[s * D + c];
    }
    float m = x[0];
#pragma unroll
    for (int s = 1; s < KP; ++s) m = fmaxf(m, x[s]);
    float e[KP], den = 0.0f;
#pragma unroll
    for (int s = 0; s < KP; ++s) {
        e[s] = kbp::exp_f32(x[s] - m);
        den = s == 0 ? e[0] : den + e[s];
    }
    float acc = 0.0f;
#pragma unroll
    for (int s = 0; s < KP; ++s) {
        const float term = (e[s] / den) * k[s];
        acc = s == 0 ? term : acc + term;
    }
    KBP_STAMP(4);   // a pool-completing step only: the pool key's softmax sum formed (before its store)
    if constexpr (FP8) {
        dsa_store_pool_fp8<D>(acc, p, pool_codes, pool_scales);
    } else {
        pool_keys[(size_t)p * D + c] = acc;
    }
}

template <int D, int KP, bool FP8>
__device__ __forceinline__ void dsa_indexer_store_body(
    const __nv_bfloat16* key, const __nv_bfloat16* gate,
    const float* slot_term, __nv_bfloat16* kg_keys,
    __nv_bfloat16* kg_gates, int rows, float* pool_keys,
    uint8_t* pool_codes, float* pool_scales, const int32_t* tau_ptr) {
    const int c = threadIdx.x;
    dsa_indexer_store_token<D, KP, FP8>(key[c], gate[c], slot_term, kg_keys, kg_gates, rows, pool_keys, pool_codes,
                                        pool_scales, tau_ptr[0]);
}

// The key's LayerNorm (layer_norm.cuh's arithmetic, one channel a thread) and the store in one
// block: the normalised key never leaves the chip, and the store does not wait for a norm launch.
template <int D, int KP, bool FP8>
__device__ __forceinline__ void dsa_indexer_store_norm_body(
    const __nv_bfloat16* x, const __nv_bfloat16* norm_w, const __nv_bfloat16* norm_b, float eps,
    const __nv_bfloat16* gate, const float* slot_term, __nv_bfloat16* kg_keys,
    __nv_bfloat16* kg_gates, int rows, float* pool_keys,
    uint8_t* pool_codes, float* pool_scales, const int32_t* tau_ptr) {
    static_assert(D >= 32 && D <= 1024 && (D & (D - 1)) == 0, "the norm's block rule: D threads, a power of two");
    float y[1];
    layer_norm_row_f32<D, D>(x, norm_w, norm_b, eps, y);
    KBP_STAMP(3);   // the key normalised (LayerNorm done)
    dsa_indexer_store_token<D, KP, FP8>(f32_to_bf16(y[0]), gate[threadIdx.x], slot_term, kg_keys, kg_gates, rows,
                                        pool_keys, pool_codes, pool_scales, tau_ptr[0]);
}

template <int D, int KP, bool FP8>
__global__ void __launch_bounds__(D) dsa_indexer_store(
    const __nv_bfloat16* key, const __nv_bfloat16* gate,
    const float* slot_term, __nv_bfloat16* kg_keys,
    __nv_bfloat16* kg_gates, int rows, float* pool_keys,
    uint8_t* pool_codes, float* pool_scales, const int32_t* tau_ptr) {
    KBP_STAMP_BEGIN();
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    dsa_indexer_store_body<D, KP, FP8>(key, gate, slot_term, kg_keys, kg_gates, rows, pool_keys, pool_codes,
                                       pool_scales, tau_ptr);
    KBP_STAMP_END();
}

template <int D, int KP, bool FP8>
__global__ void __launch_bounds__(D) dsa_indexer_store_norm(
    const __nv_bfloat16* x, const __nv_bfloat16* norm_w, const __nv_bfloat16* norm_b, float eps,
    const __nv_bfloat16* gate, const float* slot_term, __nv_bfloat16* kg_keys,
    __nv_bfloat16* kg_gates, int rows, float* pool_keys,
    uint8_t* pool_codes, float* pool_scales, const int32_t* tau_ptr) {
    KBP_STAMP_BEGIN();
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    dsa_indexer_store_norm_body<D, KP, FP8>(x, norm_w, norm_b, eps, gate, slot_term, kg_keys, kg_gates, rows,
                                            pool_keys, pool_codes, pool_scales, tau_ptr);
    KBP_STAMP_END();
}

}  // namespace kbp

#include "dsa_index_select.cuh"
