// layer_norm.cuh: BF16 LayerNorm with weight and bias, two-pass (explain.families.layer_norm).
//
// Launch contract
//   kbp::layer_norm_bf16<D, THREADS>(x, x_stride, weight, bias, eps, y, y_stride)
//     x: (rows, D) BF16, row stride x_stride (elements); y: (rows, D) BF16, row stride y_stride;
//     y may be x (the family writes in place: every read of x precedes the first barrier).
//     weight, bias: (D) BF16.
//     grid = (rows), block = (THREADS), THREADS a power of two in [32, 1024];
//     static shared memory THREADS floats.
// Math (FP32, no FMA contraction)
//   Both sums: thread t adds elements t, t + THREADS, ... in order (from its first element), then a shared-memory
//   halving tree over the THREADS partials (offsets THREADS/2 .. 1)
//   (kbpc.reference.f32ops.strided_tree_sum).
//   mu = sum(x) / D;  var = sum((x - mu)^2) / D (biased, two-pass);  r = rsqrtf(var + eps)
//   y_i = rn_bf16(((x_i - mu) * r) * gamma_i + beta_i)
// Entry points: the __global__ template, or its body <name>_dev<...>(same arguments) for a TU's own
// extern "C" __global__ wrapper, which must carry the same __launch_bounds__; layer_norm_row_f32
// (one row, before the BF16 rounding) for a kernel that uses the normalised row itself (the DSA
// index store's fused form, dsa_indexer.cuh).
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "kbp_common.cuh"

namespace kbp {

// Halving tree over one partial per thread; every thread returns the total. The leading barrier
// lets the buffer be reused by consecutive calls.
template <int THREADS>
__device__ __forceinline__ float ln_tree_sum(float partial, float* buf) {
    __syncthreads();
    buf[threadIdx.x] = partial;
    __syncthreads();
#pragma unroll
    for (int off = THREADS / 2; off > 0; off >>= 1) {
        if (threadIdx.x < off) buf[threadIdx.x] = buf[threadIdx.x] + buf[threadIdx.x + off];
        __syncthreads();
    }
    return buf[0];
}

// The normalised row before its BF16 rounding: thread t's elements t, t + THREADS, ... into
// out[k] (FP32: ((x_i - mu) * r) * gamma_i + beta_i), zero past D. Called by the whole block; every
// read of x precedes its first barrier. The one home of the family's arithmetic: the plain kernel
// and the fused DSA index key store (dsa_indexer.cuh) round the same values.
template <int D, int THREADS>
__device__ __forceinline__ void
layer_norm_row_f32(const __nv_bfloat16* x, const __nv_bfloat16* weight, const __nv_bfloat16* bias, float eps,
                   float (&out)[(D + THREADS - 1) / THREADS]) {
    static_assert(THREADS >= 32 && THREADS <= 1024 && (THREADS & (THREADS - 1)) == 0,
                  "the halving tree needs a power-of-two thread count");
    static_assert(D > 0, "non-empty rows");
    constexpr int PER_THREAD = (D + THREADS - 1) / THREADS;
    __shared__ float buf[THREADS];

    float v[PER_THREAD];
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int i = threadIdx.x + k * THREADS;
        v[k] = i < D ? bf16_to_f32(x[i]) : 0.0f;
    }
    float sum = v[0];  // from the first element (padding adds +0.0, exactly)
#pragma unroll
    for (int k = 1; k < PER_THREAD; ++k) sum = sum + v[k];
    const float mu = ln_tree_sum<THREADS>(sum, buf) / (float)D;
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int i = threadIdx.x + k * THREADS;
        if (i < D) {
            const float d = v[k] - mu;
            sq = sq + d * d;
        }
    }
    const float var = ln_tree_sum<THREADS>(sq, buf) / (float)D;
    const float rr = kbp::rsqrt_f32(var + eps);
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int i = threadIdx.x + k * THREADS;
        out[k] = i < D ? (v[k] - mu) * rr * bf16_to_f32(weight[i]) + bf16_to_f32(bias[i]) : 0.0f;
    }
}

template <int D, int THREADS>
__device__ __forceinline__ void
layer_norm_bf16_dev(const __nv_bfloat16* x, long x_stride, const __nv_bfloat16* weight,
                    const __nv_bfloat16* bias, float eps, __nv_bfloat16* y, long y_stride) {
    constexpr int PER_THREAD = (D + THREADS - 1) / THREADS;
    const long r = blockIdx.x;
    float out[PER_THREAD];
    layer_norm_row_f32<D, THREADS>(x + r * x_stride, weight, bias, eps, out);
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int i = threadIdx.x + k * THREADS;
        if (i < D) y[r * y_stride + i] = f32_to_bf16(out[k]);
    }
}

template <int D, int THREADS>
__global__ void __launch_bounds__(THREADS)
layer_norm_bf16(const __nv_bfloat16* x, long x_stride, const __nv_bfloat16* weight,
                const __nv_bfloat16* bias, float eps, __nv_bfloat16* y, long y_stride) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    layer_norm_bf16_dev<D, THREADS>(x, x_stride, weight, bias, eps, y, y_stride);
}

}  // namespace kbp
