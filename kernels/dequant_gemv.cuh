// dequant_gemv.cuh: one-row GEMVs of quantized weights against BF16 activations, dequantized
// weight by weight in FP32: the `unquantized` variant that serves the projection families when a
// bundle is compiled without activation quantization (kbpc compile --no-act-quant, a debugging
// aid: the activations the blueprint would quantize to NVFP4 or FP8 stay BF16).
//
// Launch contract
//   dq_gemv_nvfp4<OUT><<<(ceil(N / 8), S), 256>>>(x, ids, act_div, codes, scales, scale2s, scale2, y, N, K)
//   x        const __nv_bfloat16 [rows, K]   activation rows
//   ids      const int [S] or nullptr        routed slots: slot s multiplies expert ids[s] (< 0: the
//                                            slot's output row is zeros) with row s / act_div;
//                                            nullptr: a dense weight, slot s reads row s
//   codes    const uint8_t [E, N, K/2]       E2M1 codes, the even element in the low nibble
//   scales   const uint8_t [E, N, K/16]      E4M3 block scales
//   scale2s  const float [E] or nullptr      per-expert tensor scales (routed slots)
//   scale2   float                           the tensor scale of a dense weight
//   y        OUT [S, N]                      BF16 (rounded once) or FP32
//   N, K     K % 16 == 0; any N
//   dq_gemv_fp8<OUT><<<(ceil(N / 8), rows), 256>>>(x, codes, scales, y, N, K)
//   codes    const uint8_t [N, K]            E4M3 codes; scales const float [N] per channel
//   dq_row_copy<T><<<ceil(n / 256), 256>>>(x, y, n)   the BF16 row an act_quant passes through
//
// Math (kbpc/reference/no_act_quant.py): y_n = sum_k x_k w_nk in FP32, with w_nk the reference's
// dequantized weight: E2M1 value x fl(scale2 x E4M3 block scale), or fl(E4M3 value x channel
// scale), each product exact or correctly rounded as there. The sum's order is this kernel's
// (lane-strided, fused multiply-adds, a warp butterfly), not numpy's: GPU and reference agree to
// FP32 rounding of the sum, not bit for bit. Each CTA holds 8 warps, one output value per warp.
#pragma once

#include "kbp_common.cuh"

namespace kbp {

constexpr int DQ_WARPS = 8;

template <typename OUT>
__device__ __forceinline__ void dq_store(OUT* y, float v);
template <>
__device__ __forceinline__ void dq_store<float>(float* y, float v) { *y = v; }
template <>
__device__ __forceinline__ void dq_store<__nv_bfloat16>(__nv_bfloat16* y, float v) { *y = f32_to_bf16(v); }

template <typename OUT>
__global__ void __launch_bounds__(DQ_WARPS * 32) dq_gemv_nvfp4(
    const __nv_bfloat16* x, const int* ids, int act_div,
    const uint8_t* codes, const uint8_t* scales,
    const float* scale2s, float scale2, OUT* y, int n_out, int k) {
    ::kbp::pdl_wait();   // PDL: x and the slot ids come from earlier kernels
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * DQ_WARPS + (threadIdx.x >> 5), slot = blockIdx.y;
    if (n >= n_out) return;   // warp-uniform
    OUT* dst = y + (size_t)slot * n_out + n;
    int expert = 0, row = slot;
    if (ids != nullptr) {
        expert = ids[slot];
        row = slot / act_div;
        if (expert < 0) {
            if (lane == 0) dq_store<OUT>(dst, 0.0f);
            return;
        }
        scale2 = scale2s[expert];
    }
    const size_t wrow = (size_t)expert * n_out + n;
    const uint8_t* wc = codes + wrow * (k / 2);
    const uint8_t* ws = scales + wrow * (k / 16);
    const __nv_bfloat16* xr = x + (size_t)row * k;
    float acc = 0.0f;
    for (int i = lane; i < k; i += 32) {
        const uint32_t code = (wc[i / 2] >> (4 * (i & 1))) & 15u;
        const float block = __fmul_rn(scale2, e4m3_to_f32(ws[i / 16]));
        acc = __fmaf_rn(bf16_to_f32(xr[i]), __fmul_rn(e2m1_to_f32(code), block), acc);
    }
    acc = warp_sum_xor(acc);
    if (lane == 0) dq_store<OUT>(dst, acc);
}

template <typename OUT>
__global__ void __launch_bounds__(DQ_WARPS * 32) dq_gemv_fp8(
    const __nv_bfloat16* x, const uint8_t* codes,
    const float* scales, OUT* y, int n_out, int k) {
    ::kbp::pdl_wait();   // PDL: x comes from an earlier kernel
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * DQ_WARPS + (threadIdx.x >> 5), row = blockIdx.y;
    if (n >= n_out) return;   // warp-uniform
    const uint8_t* wc = codes + (size_t)n * k;
    const float s = scales[n];
    const __nv_bfloat16* xr = x + (size_t)row * k;
    float acc = 0.0f;
    for (int i = lane; i < k; i += 32)
        acc = __fmaf_rn(bf16_to_f32(xr[i]), __fmul_rn(e4m3_to_f32(wc[i]), s), acc);
    acc = warp_sum_xor(acc);
    if (lane == 0) dq_store<OUT>(y + (size_t)row * n_out + n, acc);
}

template <typename T>
__global__ void __launch_bounds__(256) dq_row_copy(const T* x, T* y, int count) {
    ::kbp::pdl_wait();   // PDL: x comes from an earlier kernel
    const int i = blockIdx.x * 256 + threadIdx.x;
    if (i < count) y[i] = x[i];
}

}  // namespace kbp
