// kda_o_norm.cuh: KDA output norm, per-head RMSNorm times weight times sigmoid(gate)
// (explain.families.kda_o_norm).
//
// Launch contract
//   kbp::kda_o_norm_gated_bf16<H, D>(o, o_stride, gate, gate_stride, weight, weight_head_stride,
//                                    eps, y, y_stride)
//     o:      (rows, H*D) FP32 recurrence output, row stride o_stride (elements).
//     gate:   (rows, H*D) BF16 output gate z, row stride gate_stride.
//     weight: BF16 norm weight gamma: (D) shared by every head (weight_head_stride = 0) or (H, D)
//             per head (weight_head_stride = D).
//     y:      (rows, H*D) BF16, row stride y_stride.
//     grid = (H, rows), block = (D): one block per (head, row), one thread per channel;
//     static shared memory D/32 floats. D % 32 == 0, D <= 1024.
// Math (FP32, no FMA contraction)
//   ss = sum_j o_j^2: a shuffle-down tree within each warp (offsets 16..1), then the D/32 warp sums
//        (zero-padded to 32 lanes) by a second shuffle-down tree in warp 0.
//   r  = rsqrtf(ss / D + eps)
//   y_i = rn_bf16(((o_i * r) * gamma_i) * sigmoid(z_i)),  sigmoid(z) = 1 / (1 + __expf(-z))
// Entry points: the __global__ template, or its body <name>_dev<...>(same arguments) for a TU's own
// extern "C" __global__ wrapper, which must carry the same __launch_bounds__.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "kbp_common.cuh"

namespace kbp {

// r = rsqrt(ss / D + eps) from the head's sum of squares, and y_i = rn_bf16(((o_i r) gamma_i) sigmoid(z_i)).
template <int D>
__device__ __forceinline__ float o_norm_scale(float ss, float eps) { return kbp::rsqrt_f32(ss / (float)D + eps); }
__device__ __forceinline__ __nv_bfloat16 o_norm_gated(float oi, float r, __nv_bfloat16 gamma, __nv_bfloat16 gate) {
    const float z = bf16_to_f32(gate);
    const float sig = 1.0f / (1.0f + kbp::exp_f32(-z));
    return f32_to_bf16(oi * r * bf16_to_f32(gamma) * sig);
}

// One head's gated norm, called by all D threads of a block (thread i holds channel i's o_i): the
// sum of squares by the two shuffle-down trees, then y_i. Also the epilogue of the fused
// recurrence (kda_recurrent.cuh, kda_recurrent_norm_decode_bf16): the same bits.
template <int D>
__device__ __forceinline__ __nv_bfloat16 kda_o_norm_head(float oi, __nv_bfloat16 gamma_i, __nv_bfloat16 gate_i,
                                                         float eps) {
    static_assert(D % 32 == 0 && D <= 1024, "whole warps, one block per head");
    constexpr int WARPS = D / 32;
    __shared__ float partial[WARPS];
    __shared__ float total;
    const int i = threadIdx.x;
    const float sq = warp_sum_down(oi * oi);
    if (i % 32 == 0) partial[i / 32] = sq;
    __syncthreads();
    if (i < 32) {
        const float t = warp_sum_down(i < WARPS ? partial[i] : 0.0f);
        if (i == 0) total = t;
    }
    __syncthreads();
    return o_norm_gated(oi, o_norm_scale<D>(total, eps), gamma_i, gate_i);
}

template <int H, int D>
__device__ __forceinline__ void
kda_o_norm_gated_bf16_dev(const float* o, int o_stride,
                          const __nv_bfloat16* gate, int gate_stride,
                          const __nv_bfloat16* weight, int weight_head_stride, float eps,
                          __nv_bfloat16* y, int y_stride) {
    const int h = blockIdx.x, i = threadIdx.x;
    const long row = blockIdx.y;
    const float oi = o[row * o_stride + (long)h * D + i];
    y[row * y_stride + (long)h * D + i] = kda_o_norm_head<D>(oi, weight[h * weight_head_stride + i],
                                                             gate[row * gate_stride + (long)h * D + i], eps);
}

template <int H, int D>
__global__ void __launch_bounds__(D)
kda_o_norm_gated_bf16(const float* o, int o_stride,
                      const __nv_bfloat16* gate, int gate_stride,
                      const __nv_bfloat16* weight, int weight_head_stride, float eps,
                      __nv_bfloat16* y, int y_stride) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    kda_o_norm_gated_bf16_dev<H, D>(o, o_stride, gate, gate_stride, weight, weight_head_stride, eps,
        y, y_stride);
}

}  // namespace kbp
