// glm_moe_combine.cuh: weighted routed sum plus the ungated shared expert
// (explain.families.glm_moe_combine).
//
// Launch contract
//   kbp::moe_combine<D, K, VEC>(weights, ids, slot_rows, expert_out, shared, y)
//     weights [m][K] FP32 (router weights, routed scale included); ids [m][K] int32 or nullptr
//     (a slot with id < 0 is skipped: its expert row may be garbage); slot_rows [m][K] int32 or
//     nullptr: the expert_out row of slot k of token t (the indexed, expert-sorted variant), else
//     row t*K + k (slot order); expert_out [rows][D] BF16; shared [m][D] BF16; y [m][D] BF16.
//     grid (ceil(D / (block*VEC)), m), any block size; D % VEC == 0, rows 2*VEC-byte aligned.
// Math (kbpc.reference.glm_moe_combine; FP32, no FMA contraction)
//   acc = +0; for each live slot in slot order: acc = fl(acc + fl(w * e)); y = rn_bf16(acc + sh).
//   VEC (8 = 16-byte loads) changes only the access width, never the bytes. moe_combine_sums is
//   that math for VEC elements; the fused hyper-connection boundary calls it too.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "kbp_common.cuh"

namespace kbp {

template <int VEC>
struct alignas(2 * VEC) CombineBF16Vec { __nv_bfloat16 v[VEC]; };

// The combine's operands for one launch or one fused consumer (kernels/glm_mhc_boundary.cuh runs the
// combine of the elements it needs as its prologue).
template <int K>
struct MoeCombineIn {
    const float* weights;                 // [m][K] router weights (routed scale included)
    const int* ids;                       // [m][K] expert ids or nullptr (id < 0: slot skipped)
    const int* slot_rows;                 // [m][K] expert_out row of each slot, or nullptr (row t*K + k)
    const __nv_bfloat16* expert_out;      // [rows][D]
    const __nv_bfloat16* shared;          // [m][D] the shared expert's output
};

// The FP32 value the combine rounds, at elements i0 .. i0+VEC-1 of token t (row width d):
// acc = +0; acc = fl(acc + fl(w * e)) over the live slots in slot order; acc + sh. y = rn_bf16 of it.
// EAGER (the default): every load is issued before the first add. With a load and its add per slot,
// slot k + 1's row waited for slot k's sum (K dependent L2 round trips); on an H200 the MoE combine
// boundary then ended 0.5 us later. In slot order each slot's row is a row of this launch, so it is
// read live or not (a dead slot's bytes are never used); an indexed slot's row is read only when the
// slot is live (its index may be anything). !EAGER keeps one slot's row at a time: for a caller
// capped at 64 registers a thread (1024-thread CTAs), where K rows in flight spill.
template <int K, int VEC, bool EAGER = true>
__device__ __forceinline__ void moe_combine_sums(const MoeCombineIn<K>& in, int d, size_t t, int i0,
                                                 float (&out)[VEC]) {
    using Row = CombineBF16Vec<VEC>;
#pragma unroll
    for (int v = 0; v < VEC; ++v) out[v] = 0.0f;
    if constexpr (EAGER) {
        bool live[K];
        float w[K];
        Row e[K];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            live[k] = in.ids == nullptr || in.ids[t * K + k] >= 0;
            w[k] = in.weights[t * K + k];
        }
#pragma unroll
        for (int k = 0; k < K; ++k) {
            if (in.slot_rows == nullptr)
                e[k] = *reinterpret_cast<const Row*>(in.expert_out + (t * K + k) * d + i0);
            else if (live[k])
                e[k] = *reinterpret_cast<const Row*>(in.expert_out + (size_t)in.slot_rows[t * K + k] * d + i0);
        }
#pragma unroll
        for (int k = 0; k < K; ++k) {
            if (!live[k]) continue;
#pragma unroll
            for (int v = 0; v < VEC; ++v) out[v] = out[v] + w[k] * bf16_to_f32(e[k].v[v]);
        }
    } else {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            if (in.ids != nullptr && in.ids[t * K + k] < 0) continue;
            const float w = in.weights[t * K + k];
            const size_t row = in.slot_rows != nullptr ? (size_t)in.slot_rows[t * K + k] : t * K + k;
            const auto e = *reinterpret_cast<const Row*>(in.expert_out + row * d + i0);
#pragma unroll
            for (int v = 0; v < VEC; ++v) out[v] = out[v] + w * bf16_to_f32(e.v[v]);
        }
    }
    const auto sh = *reinterpret_cast<const Row*>(in.shared + t * d + i0);
#pragma unroll
    for (int v = 0; v < VEC; ++v) out[v] = out[v] + bf16_to_f32(sh.v[v]);
}

template <int D, int K, int VEC>
__device__ __forceinline__ void moe_combine_body(const float* weights, const int* ids,
                                                 const int* slot_rows,
                                                 const __nv_bfloat16* expert_out,
                                                 const __nv_bfloat16* shared,
                                                 __nv_bfloat16* y) {
    static_assert(D % VEC == 0 && (VEC == 1 || VEC == 2 || VEC == 4 || VEC == 8), "VEC");
    const int i0 = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i0 >= D) return;
    const size_t t = blockIdx.y;
    float acc[VEC];
    moe_combine_sums<K, VEC>(MoeCombineIn<K>{weights, ids, slot_rows, expert_out, shared}, D, t, i0, acc);
    CombineBF16Vec<VEC> o;
#pragma unroll
    for (int v = 0; v < VEC; ++v) o.v[v] = f32_to_bf16(acc[v]);
    *reinterpret_cast<CombineBF16Vec<VEC>*>(y + t * D + i0) = o;
}

template <int D, int K, int VEC>
__global__ void moe_combine(const float* weights, const int* ids,
                            const int* slot_rows, const __nv_bfloat16* expert_out,
                            const __nv_bfloat16* shared, __nv_bfloat16* y) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    moe_combine_body<D, K, VEC>(weights, ids, slot_rows, expert_out, shared, y);
}

}  // namespace kbp
