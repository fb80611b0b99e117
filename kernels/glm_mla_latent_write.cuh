// glm_mla_latent_write.cuh: RMSNorm + E4M3 quantisation + paged store of MLA latent rows.
//
// Launch contract
//   glm_mla_latent_write_fp8<E><<<rows, E>>>(c, gamma, slots, s_k, eps, cache)
//   c      const __nv_bfloat16 [rows, E]   the kv_a projection rows (BF16)
//   gamma  const __nv_bfloat16 [E]         plain RMSNorm weight (no 1 + gamma offset)
//   slots  const int32_t [rows]            flat physical cache row per input row; -1 skips it
//   s_k    float                            static per-layer cache scale (host value)
//   eps    float                            RMSNorm epsilon (1e-5 for GLM-5)
//   cache  uint8_t [num_pages * P, E]       paged FP8 latent cache, see below
//   grid (rows), block (E): one thread per latent channel; E = 32 * 2^k, 64 <= E <= 1024;
//   static shared memory E/32 floats; no alignment needs beyond the natural ones.
//
//   glm_mla_latent_write_fp8_paged<E><<<rows, E>>>(c, gamma, block_table, page_size, pos, s_k, eps,
//                                                  cache)
//   the same store for rows at consecutive positions pos[0] + row (pos: const int32_t [1] on the
//   device, graph-replay safe): the slot is looked up in block_table (see below) on the device.
//
// Paged FP8 latent cache (owned by the runner, read by glm_mla_decode.cuh):
//   codes [num_pages][P][E] uint8 E4M3, one row of E bytes per token; block_table[j] (int32) is
//   the physical page of logical page j; token t of the sequence lives at flat row
//   block_table[t / P] * P + t % P (the `slot` the runner passes here). A cached value is
//   s_k * e4m3(code).
//
// Math (explain.families.glm_mla_latent_write; reference kbpc/reference/glm_mla_latent_write.py):
//   r = rsqrtf(fl(fl(sum_k c_k^2) / E) + eps)   sum: warp xor butterfly, then a halving tree over
//   the E/32 warp sums; c^_i = sat_e4m3(fl(fl(fl(c_i r) gamma_i) * fl(1 / s_k))).
// Each kernel NAME is a thin __global__ over NAME_body (a __device__ function), so a translation
// unit may wrap the body in an extern "C" kernel with the same launch bounds.
// The kernels carry phase stamps (kbp_stamps.cuh): the wait, and 3 when the row's sum of squares is reduced.
#pragma once

#include "kbp_common.cuh"

namespace kbp {

// One block stores row c_row (E values) at flat cache row `slot` (uniform over the block): E4M3
// codes into a uint8_t cache, or the FP32 value y itself into a float cache (the unquantized form).
template <int E, typename T = uint8_t>
__device__ __forceinline__ void glm_mla_latent_write_row(
    const __nv_bfloat16* c_row, const __nv_bfloat16* gamma, int32_t slot,
    float s_k, float eps, T* cache) {
    static_assert(E % 32 == 0 && E >= 64 && E <= 1024, "latent width: 64..1024, whole warps");
    constexpr int WARPS = E / 32;
    static_assert((WARPS & (WARPS - 1)) == 0, "the warp-sum tree needs a power-of-two warp count");
    __shared__ float warp_sums[WARPS];

    const int i = threadIdx.x;
    if (slot < 0) return;  // uniform over the block: the whole row is skipped

    const float x = bf16_to_f32(c_row[i]);
    const float s = warp_sum_xor(x * x);
    if ((i & 31) == 0) warp_sums[i >> 5] = s;
    __syncthreads();
    KBP_STAMP(3);   // the row loaded and its warp sums of squares in shared memory
    // Halving tree over the warp sums, done by every thread on its own copy (tiny, no syncs).
    float v[WARPS];
#pragma unroll
    for (int w = 0; w < WARPS; ++w) v[w] = warp_sums[w];
#pragma unroll
    for (int off = WARPS / 2; off >= 1; off >>= 1) {
#pragma unroll
        for (int w = 0; w < off; ++w) v[w] = v[w] + v[w + off];
    }
    const float mean = v[0] / (float)E;
    const float r = kbp::rsqrt_f32(mean + eps);
    const float inv_s = 1.0f / s_k;
    const float y = ((x * r) * bf16_to_f32(gamma[i])) * inv_s;
    if constexpr (sizeof(T) == 1) {
        cache[(size_t)slot * E + i] = f32_to_e4m3(y);
    } else {
        cache[(size_t)slot * E + i] = y;
    }
}

template <int E>
__device__ __forceinline__ void glm_mla_latent_write_fp8_body(
    const __nv_bfloat16* c, const __nv_bfloat16* gamma,
    const int32_t* slots, float s_k, float eps, uint8_t* cache) {
    const int row = blockIdx.x;
    glm_mla_latent_write_row<E>(c + (size_t)row * E, gamma, slots[row], s_k, eps, cache);
}

template <int E>
__global__ void __launch_bounds__(E) glm_mla_latent_write_fp8(
    const __nv_bfloat16* c, const __nv_bfloat16* gamma,
    const int32_t* slots, float s_k, float eps, uint8_t* cache) {
    KBP_STAMP_BEGIN();
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    glm_mla_latent_write_fp8_body<E>(c, gamma, slots, s_k, eps, cache);
    KBP_STAMP_END();
}

// Slot of token t: block_table[t / P] * P + t % P (the decode reads through the same table).
template <int E>
__device__ __forceinline__ void glm_mla_latent_write_fp8_paged_body(
    const __nv_bfloat16* c, const __nv_bfloat16* gamma,
    const int32_t* block_table, int page_size, const int32_t* pos,
    float s_k, float eps, uint8_t* cache) {
    const int row = blockIdx.x;
    const int t = pos[0] + row;
    const int32_t slot = block_table[t / page_size] * page_size + t % page_size;
    glm_mla_latent_write_row<E>(c + (size_t)row * E, gamma, slot, s_k, eps, cache);
}

template <int E>
__global__ void __launch_bounds__(E) glm_mla_latent_write_fp8_paged(
    const __nv_bfloat16* c, const __nv_bfloat16* gamma,
    const int32_t* block_table, int page_size, const int32_t* pos,
    float s_k, float eps, uint8_t* cache) {
    KBP_STAMP_BEGIN();
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    glm_mla_latent_write_fp8_paged_body<E>(c, gamma, block_table, page_size, pos, s_k, eps, cache);
    KBP_STAMP_END();
}

// The unquantized form (kbpc compile --no-act-quant, a debugging aid; kbpc/reference/no_act_quant.py
// kv_write): the same paged store of y = fl(fl(c_i r) gamma_i) as FP32, one row of 4E bytes a token.
template <int E>
__global__ void __launch_bounds__(E) glm_mla_latent_write_f32_paged(
    const __nv_bfloat16* c, const __nv_bfloat16* gamma,
    const int32_t* block_table, int page_size, const int32_t* pos,
    float eps, float* cache) {
    KBP_STAMP_BEGIN();
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    const int row = blockIdx.x;
    const int t = pos[0] + row;
    const int32_t slot = block_table[t / page_size] * page_size + t % page_size;
    glm_mla_latent_write_row<E, float>(c + (size_t)row * E, gamma, slot, 1.0f, eps, cache);
    KBP_STAMP_END();
}

}  // namespace kbp
