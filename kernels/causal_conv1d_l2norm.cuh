// causal_conv1d_l2norm.cuh: causal depthwise conv1d decode update + SiLU + per-head L2 norm of the
// q/k channels (explain.families.causal_conv1d_l2norm), for KDA / Gated DeltaNet.
//
// Launch contract
//   kbp::causal_conv1d_update_l2norm<C, C_QK, DK, W, THREADS, OutT>(
//       x, x_stride, window, window_stride, taps, bias, eps, out, out_stride)
//     x:      (rows, >= C) BF16, the packed q|k|v channels of one token per row (row stride x_stride).
//     window: (rows, C, W) FP32 sequence state, row stride window_stride (elements); slot 0 is the
//             oldest input, slot W-1 the newest. Advanced in place: (s_1..s_W) <- (s_2..s_W, x_t).
//     taps:   (C, W) BF16 conv weights, tap i multiplies window slot i (oldest first).
//     bias:   (C) BF16 or nullptr (no bias: the sum starts from +0.0).
//     out:    (rows, >= C) OutT (BF16: the verify-path kernel; float: the _f32 twin), row stride
//             out_stride. Rows are independent sequences, each with its own window row.
//     grid = (ceil(C / THREADS), rows), block = (THREADS); static shared memory THREADS/32 floats.
//     Requires DK % 32 == 0, THREADS % DK == 0 (a head never straddles two blocks), C_QK % DK == 0.
// Math (FP32, no FMA contraction)
//   a_c = b_c + W_c1 s_c1 + ... + W_cW s_cW   (bias first, then taps oldest to newest)
//   u_c = silu(a_c) = a_c * sigmoid(a_c), sigmoid(a) = 1 / (1 + __expf(-a))
//   y_c = u_c * rsqrtf(sum_{j in head(c)} u_j^2 + eps)   for c < C_QK (q and k heads of DK channels)
//   y_c = u_c                                             for c >= C_QK (value channels)
//   The head's sum of squares: a shuffle-down tree within each warp (offsets 16..1), then the DK/32
//   warp partials added in order. BF16 output is one RNE rounding at the store.
// Entry points: the __global__ template, or its body <name>_dev<...>(a source of x (ConvPackedRow: x,
// x_stride), the other arguments, then the block index along x) for a kernel of its own
// (kernels/kda_conv_gates.cuh), which must carry the same __launch_bounds__.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "kbp_common.cuh"

namespace kbp {

__device__ __forceinline__ float conv_sigmoid(float a) { return 1.0f / (1.0f + kbp::exp_f32(-a)); }
__device__ __forceinline__ float conv_silu(float a) { return a * conv_sigmoid(a); }

// A q/k head's L2 scale from its WARPS_PER_HEAD warp partials (each a shuffle-down tree over 32
// channels), added in order: rsqrt(sum + eps).
template <int WARPS_PER_HEAD>
__device__ __forceinline__ float l2_head_scale(const float* partial, float eps) {
    float ss = partial[0];
#pragma unroll
    for (int j = 1; j < WARPS_PER_HEAD; ++j) ss = ss + partial[j];
    return kbp::rsqrt_f32(ss + eps);
}

__device__ __forceinline__ void conv_store(__nv_bfloat16* p, float v) { *p = f32_to_bf16(v); }
__device__ __forceinline__ void conv_store(float* p, float v) { *p = v; }

// A channel's stored window s_1..s_W (oldest first), read into registers.
template <int W>
__device__ __forceinline__ void conv_window_load(const float* s, float (&old)[W]) {
    if constexpr (W == 4) {
        const float4 w4 = *reinterpret_cast<const float4*>(s);
        old[0] = w4.x; old[1] = w4.y; old[2] = w4.z; old[3] = w4.w;
    } else {
#pragma unroll
        for (int i = 0; i < W; ++i) old[i] = s[i];
    }
}

// The window after appending x_new: (s_2, ..., s_W, x_new).
template <int W>
__device__ __forceinline__ void conv_window_shift(const float (&old)[W], float x_new, float (&win)[W]) {
#pragma unroll
    for (int i = 0; i < W - 1; ++i) win[i] = old[i + 1];
    win[W - 1] = x_new;
}

template <int W>
__device__ __forceinline__ void conv_window_store(float* s, const float (&win)[W]) {
    if constexpr (W == 4) {
        *reinterpret_cast<float4*>(s) = make_float4(win[0], win[1], win[2], win[3]);
    } else {
#pragma unroll
        for (int i = 0; i < W; ++i) s[i] = win[i];
    }
}

// acc0 + taps . window in FP32, taps oldest to newest; acc0 is the bias (+0.0 without one).
template <int W>
__device__ __forceinline__ float conv_window_dot(float acc0, const float (&win)[W],
                                                 const __nv_bfloat16 (&tap)[W]) {
    float acc = acc0;
#pragma unroll
    for (int i = 0; i < W; ++i) acc = acc + bf16_to_f32(tap[i]) * win[i];
    return acc;
}

template <int W>
__device__ __forceinline__ void conv_taps_load(const __nv_bfloat16* tap, __nv_bfloat16 (&t)[W]) {
#pragma unroll
    for (int i = 0; i < W; ++i) t[i] = tap[i];
}

__device__ __forceinline__ float conv_bias_value(const __nv_bfloat16* bias, int c) {
    return bias != nullptr ? bf16_to_f32(bias[c]) : 0.0f;
}

// Shift channel c's window by one token (appending x), return bias + taps . window in FP32.
template <int W>
__device__ __forceinline__ float conv_window_step(float* s, float x_new,
                                                  const __nv_bfloat16* tap,
                                                  const __nv_bfloat16* bias, int c) {
    float old[W], win[W];
    __nv_bfloat16 t[W];
    conv_window_load<W>(s, old);
    conv_taps_load<W>(tap, t);
    conv_window_shift<W>(old, x_new, win);
    conv_window_store<W>(s, win);
    return conv_window_dot<W>(conv_bias_value(bias, c), win, t);
}

// Where the conv reads channel c of row `row`: one packed [q | k | v] row (this kernel's contract) or,
// in kda_conv_gates.cuh, the three projection rows themselves (ConvQkvRows).
struct ConvPackedRow {
    const __nv_bfloat16* x;
    int x_stride;
    __device__ __forceinline__ __nv_bfloat16 operator()(long row, int c) const { return x[row * x_stride + c]; }
};

template <int C, int C_QK, int DK, int W, int THREADS, typename OutT, typename Src>
__device__ __forceinline__ void
causal_conv1d_update_l2norm_dev(Src src,
                                float* window, long window_stride,
                                const __nv_bfloat16* taps,
                                const __nv_bfloat16* bias, float eps,
                                OutT* out, int out_stride, int block) {
    static_assert(DK % 32 == 0 && THREADS % DK == 0, "heads must be whole warps inside one block");
    static_assert(C_QK % DK == 0 && C_QK <= C && W >= 1, "q/k channels are whole heads");
    constexpr int WARPS_PER_HEAD = DK / 32;
    __shared__ float partial[THREADS / 32];

    const int c = block * THREADS + threadIdx.x;
    const long row = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float u = 0.0f;
    if (c < C) {
        const float xn = bf16_to_f32(src(row, c));
        const float a = conv_window_step<W>(window + row * window_stride + (long)c * W, xn,
                                            taps + (long)c * W, bias, c);
        u = conv_silu(a);
    }
    float y = u;
    // Block-uniform: does this block hold any q/k head? (C_QK is a multiple of 32, so each warp is
    // wholly q/k or wholly value; all threads reach the barrier.)
    if (block * THREADS < C_QK) {
        const float sq = warp_sum_down(u * u);
        if (lane == 0) partial[warp] = sq;
        __syncthreads();
        if (block * THREADS + warp * 32 < C_QK) {
            const int first = (warp / WARPS_PER_HEAD) * WARPS_PER_HEAD;
            y = u * l2_head_scale<WARPS_PER_HEAD>(partial + first, eps);
        }
    }
    if (c < C) conv_store(out + row * out_stride + c, y);
}

template <int C, int C_QK, int DK, int W, int THREADS, typename OutT>
__global__ void __launch_bounds__(THREADS)
causal_conv1d_update_l2norm(const __nv_bfloat16* x, int x_stride,
                            float* window, long window_stride,
                            const __nv_bfloat16* taps,
                            const __nv_bfloat16* bias, float eps,
                            OutT* out, int out_stride) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    causal_conv1d_update_l2norm_dev<C, C_QK, DK, W, THREADS, OutT>(ConvPackedRow{x, x_stride}, window,
        window_stride, taps, bias, eps, out, out_stride, blockIdx.x);
}

// Grid size along x for a C-channel row.
template <int C, int THREADS>
__host__ __device__ constexpr int causal_conv1d_blocks() { return (C + THREADS - 1) / THREADS; }

}  // namespace kbp
