// rms_norm.cuh: RMSNorm, with the fused residual copy / residual add forms and the strided per-head
// form (explain.families.rms_norm).
//
// Launch contract
//   kbp::rms_norm<D, THREADS, ONE_PLUS, MODE>(x, x_stride, x_group_stride, s, s_stride, residual,
//                                            residual_stride, weight, eps, y, y_stride, y_group_stride)
//     Row r of group g is x + r*x_stride + g*x_group_stride (BF16, D elements) and likewise for y;
//     grid = (rows, groups), block = (THREADS); static shared memory THREADS/32 + 1 floats.
//     rms_norm / rms_norm_vanilla: groups = 1; rms_norm_strided: groups = heads per row.
//     MODE (RmsMode):
//       kNormOnly      y = norm(x)                                    (s, residual unused: nullptr)
//       kResidualCopy  residual <- x; y = norm(x)                      (rms_norm_residual)
//       kResidualAdd   x <- rn(x + s) in place; residual <- x; y = norm; sum of squares of the
//                      FP32 sums x + s (residual_add_rms_norm)
//       kResidualAddExact  same, sum of squares of the rounded sums (residual_add_rms_norm_exact)
//     ONE_PLUS: weight applied as (1 + gamma) (every kernel but rms_norm_vanilla, which is false).
//     y may alias x (all reads of x precede the barrier, all stores of y follow it).
//     D even; rows 4-byte aligned (strides even). THREADS % 32 == 0, THREADS <= 1024.
// Math (FP32, no FMA contraction)
//   Thread t owns BF16 pairs p = t, t + THREADS, ... (32-bit loads); its partial is
//   ((0 + x_{2p}^2) + x_{2p+1}^2) + ... over its pairs in order. The partials are reduced by a
//   butterfly warp shuffle (offsets 16..1), then the per-warp sums (zero-padded to 32 lanes) by a
//   second butterfly (kbpc.reference.f32ops.warp_block_sum).
//   r = rsqrtf(ss / D + eps);  y_i = rn_bf16((x_i * r) * w_i),  w_i = 1 + gamma_i or gamma_i.
//   kbp::rms_norm_quant_fp8<D, THREADS, ONE_PLUS>(x, x_stride, weight, eps, y, y_stride, q, s)
//     The norm-only form followed by the per-token FP8 quantization of its output
//     (explain.families.w8a8_act_quant, as w8a8_act_quant_row computes it): grid = (rows), block =
//     (THREADS); y (the BF16 normed row) may be nullptr when nothing else reads it; q is the
//     [rows][D] E4M3 codes, s the [rows] FP32 scales. The normed values stay in registers: the
//     quantizer sees exactly the BF16 values y holds. max|v| is order-free, so the scale and the
//     codes equal the standalone quantizer's whatever the block size.
// Entry points: the __global__ template, or its body <name>_dev<...>(same arguments) for a TU's own
// extern "C" __global__ wrapper, which must carry the same __launch_bounds__.
// Phase stamps of a profiling build (kbp_stamps.cuh): rms_norm_quant_fp8 only (1/2 around its
// pdl_wait, 3 after the block's sum of squares; the end: codes and scale stored).
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "kbp_common.cuh"
#include "w8a8_act_quant.cuh"

namespace kbp {

enum RmsMode : int { kNormOnly = 0, kResidualCopy = 1, kResidualAdd = 2, kResidualAddExact = 3 };

__device__ __forceinline__ float2 bf16x2_load(const __nv_bfloat16* p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ void bf16x2_store(__nv_bfloat16* p, float a, float b) {
    __nv_bfloat162 v;
    v.x = f32_to_bf16(a);
    v.y = f32_to_bf16(b);
    *reinterpret_cast<__nv_bfloat162*>(p) = v;
}

// Butterfly over the warp, then over the per-warp sums; every thread returns the total.
template <int THREADS>
__device__ __forceinline__ float rms_block_sum(float partial, float* warp_sums) {
    constexpr int WARPS = THREADS / 32;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float w = warp_sum_xor(partial);
    if (lane == 0) warp_sums[warp] = w;
    __syncthreads();
    return warp_sum_xor(lane < WARPS ? warp_sums[lane] : 0.0f);
}

template <int D, int THREADS, bool ONE_PLUS, int MODE>
__device__ __forceinline__ void
rms_norm_dev(__nv_bfloat16* x, long x_stride, long x_group_stride,
             const __nv_bfloat16* s, long s_stride,
             __nv_bfloat16* residual, long residual_stride,
             const __nv_bfloat16* weight, float eps,
             __nv_bfloat16* y, long y_stride, long y_group_stride) {
    static_assert(D % 2 == 0 && D > 0, "rows are read as BF16 pairs");
    static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps, at most 1024 threads");
    constexpr int PAIRS = D / 2;
    constexpr int PER_THREAD = (PAIRS + THREADS - 1) / THREADS;
    __shared__ float warp_sums[THREADS / 32];

    const long r = blockIdx.x, g = blockIdx.y;
    __nv_bfloat16* xr = x + r * x_stride + g * x_group_stride;
    __nv_bfloat16* yr = y + r * y_stride + g * y_group_stride;
    float2 v[PER_THREAD];
    float partial = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int p = threadIdx.x + k * THREADS;
        if (p >= PAIRS) break;
        float2 a = bf16x2_load(xr + 2 * p);
        float2 u = a;  // the values squared
        if constexpr (MODE == kResidualAdd || MODE == kResidualAddExact) {
            const float2 b = bf16x2_load(s + r * s_stride + 2 * p);
            u = make_float2(a.x + b.x, a.y + b.y);
            a = make_float2(round_bf16(u.x), round_bf16(u.y));
            if constexpr (MODE == kResidualAddExact) u = a;
            bf16x2_store(xr + 2 * p, a.x, a.y);
        }
        if constexpr (MODE != kNormOnly) bf16x2_store(residual + r * residual_stride + 2 * p, a.x, a.y);
        v[k] = a;
        partial = partial + u.x * u.x;
        partial = partial + u.y * u.y;
    }
    const float ss = rms_block_sum<THREADS>(partial, warp_sums);
    const float rr = kbp::rsqrt_f32(ss / (float)D + eps);
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int p = threadIdx.x + k * THREADS;
        if (p >= PAIRS) break;
        const float2 gm = bf16x2_load(weight + 2 * p);
        const float w0 = ONE_PLUS ? 1.0f + gm.x : gm.x;
        const float w1 = ONE_PLUS ? 1.0f + gm.y : gm.y;
        bf16x2_store(yr + 2 * p, v[k].x * rr * w0, v[k].y * rr * w1);
    }
}

template <int D, int THREADS, bool ONE_PLUS, int MODE>
__global__ void __launch_bounds__(THREADS)
rms_norm(__nv_bfloat16* x, long x_stride, long x_group_stride,
         const __nv_bfloat16* s, long s_stride,
         __nv_bfloat16* residual, long residual_stride,
         const __nv_bfloat16* weight, float eps,
         __nv_bfloat16* y, long y_stride, long y_group_stride) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    rms_norm_dev<D, THREADS, ONE_PLUS, MODE>(x, x_stride, x_group_stride, s, s_stride, residual,
        residual_stride, weight, eps, y, y_stride, y_group_stride);
}

// Norm-only RMSNorm of row blockIdx.x, then its per-token FP8 quantization (values in registers).
template <int D, int THREADS, bool ONE_PLUS>
__device__ __forceinline__ void
rms_norm_quant_fp8_dev(const __nv_bfloat16* x, long x_stride, const __nv_bfloat16* weight,
                       float eps, __nv_bfloat16* y, long y_stride, uint8_t* q,
                       float* s) {
    static_assert(D % 2 == 0 && D > 0, "rows are read as BF16 pairs");
    static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps, at most 1024 threads");
    constexpr int PAIRS = D / 2;
    constexpr int PER_THREAD = (PAIRS + THREADS - 1) / THREADS;
    constexpr int WARPS = THREADS / 32;
    __shared__ float warp_sums[WARPS];
    __shared__ float warp_max[WARPS];
    const long r = blockIdx.x;
    const __nv_bfloat16* xr = x + r * x_stride;
    float2 v[PER_THREAD];
    float partial = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int p = threadIdx.x + k * THREADS;
        if (p >= PAIRS) break;
        v[k] = bf16x2_load(xr + 2 * p);
        partial = partial + v[k].x * v[k].x;
        partial = partial + v[k].y * v[k].y;
    }
    const float ss = rms_block_sum<THREADS>(partial, warp_sums);
    KBP_STAMP(3);   // row loaded and the block's sum of squares met (then norm, max, encoding)
    const float rr = kbp::rsqrt_f32(ss / (float)D + eps);
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int p = threadIdx.x + k * THREADS;
        if (p >= PAIRS) break;
        const float2 gm = bf16x2_load(weight + 2 * p);
        const float w0 = ONE_PLUS ? 1.0f + gm.x : gm.x;
        const float w1 = ONE_PLUS ? 1.0f + gm.y : gm.y;
        v[k] = make_float2(round_bf16(v[k].x * rr * w0), round_bf16(v[k].y * rr * w1));
        if (y != nullptr) bf16x2_store(y + r * y_stride + 2 * p, v[k].x, v[k].y);
        m = fmaxf(m, fmaxf(fabsf(v[k].x), fabsf(v[k].y)));
    }
    m = warp_max_xor(m);
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    m = warp_max[0];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) m = fmaxf(m, warp_max[w]);
    const float sc = fp8_scale(m);
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        const int p = threadIdx.x + k * THREADS;
        if (p >= PAIRS) break;
        const float a = fminf(fmaxf(__fdiv_rn(v[k].x, sc), -448.0f), 448.0f);
        const float b = fminf(fmaxf(__fdiv_rn(v[k].y, sc), -448.0f), 448.0f);
        reinterpret_cast<uint16_t*>(q + r * D)[p] = (uint16_t)(f32_to_e4m3(a) | (f32_to_e4m3(b) << 8));
    }
    if (threadIdx.x == 0) s[r] = sc;
}

template <int D, int THREADS, bool ONE_PLUS>
__global__ void __launch_bounds__(THREADS)
rms_norm_quant_fp8(const __nv_bfloat16* x, long x_stride, const __nv_bfloat16* weight,
                   float eps, __nv_bfloat16* y, long y_stride, uint8_t* q,
                   float* s) {
    KBP_STAMP_BEGIN();   // stamps of a profiling build (kbp_stamps.cuh): 3 in the body
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    rms_norm_quant_fp8_dev<D, THREADS, ONE_PLUS>(x, x_stride, weight, eps, y, y_stride, q, s);
    KBP_STAMP_END();
}

}  // namespace kbp
