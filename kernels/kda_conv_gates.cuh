// kda_conv_gates.cuh: a KDA decode layer's short conv + L2 norm (causal_conv1d_l2norm.cuh) and its
// FP8 gate chain (kda_gates_w8a8.cuh) side by side in one launch: the two read different outputs of
// the same projection and neither reads the other, so their CTAs simply share a grid. The recurrence
// after them then follows one kernel on one stream (programmatic dependent launch, its state loaded
// while these run) instead of joining two streams (fusion rule kda_conv_gates).
//
// Launch contract
//   kbp::kda_conv_gates<C, C_QK, DK, W, N, K, GDK, WARPS>(
//       xf, xg, x_stride, m, wf, swf, wg, swg, a_log, dt_bias, lower_bound, b, b_stride, decay,
//       decay_stride, og, og_stride, beta, beta_stride, f_out, f_stride,          <- the gates'
//       q, k, v, window, window_stride, taps, bias, eps, out, out_stride)         <- the conv's
//     Each group of arguments is its kernel's contract (kda_gates_w8a8_k128_rows<N, K, GDK, WARPS>
//     and causal_conv1d_update_l2norm<C, C_QK, DK, W, 32 * WARPS, BF16> with one row), except that
//     the conv reads its input from the projection's rows q, k (C_QK / 2 channels each) and v
//     (C - C_QK) instead of the packed [q | k | v] row, which this form never needs.
//     grid = (kda_conv_gates_blocks<C, N, WARPS>()): blocks [0, G) are the gates' grid (G =
//     2 * kda_gates_blocks<N, WARPS>()), blocks [G, G + ceil(C / (32 * WARPS))) the conv's;
//     block = (32 * WARPS). Requires (32 * WARPS) % DK == 0 (a conv head inside one block).
// Math: exactly the two kernels' (the same device functions on the same values): the same bits.
// PDL: dependents are released first thing (both halves are latency-bound); the gate CTAs load their
// weight tiles before pdl_wait, the conv CTAs prefetch their window and taps into L2 before it.
// Phase stamps (kbp_stamps.cuh): begin, the wait (the gate CTAs' inside kda_gates_w8a8.cuh), end.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "causal_conv1d_l2norm.cuh"
#include "kbp_common.cuh"
#include "kda_gates_w8a8.cuh"

namespace kbp {

// The conv's input channel c read from the projection's q, k and v rows (one token): [q | k | v] with
// q and k NQK channels each, so the packed row need not exist.
struct ConvQkvRows {
    const __nv_bfloat16* q;
    const __nv_bfloat16* k;
    const __nv_bfloat16* v;
    int nqk;
    __device__ __forceinline__ __nv_bfloat16 operator()(long, int c) const {
        return c < nqk ? q[c] : c < 2 * nqk ? k[c - nqk] : v[c - 2 * nqk];
    }
};

template <int C, int N, int WARPS>
__host__ __device__ constexpr int kda_conv_gates_blocks() {
    return 2 * kda_gates_blocks<N, WARPS>() + causal_conv1d_blocks<C, 32 * WARPS>();
}

template <int C, int C_QK, int DK, int W, int N, int K, int GDK, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
kda_conv_gates(const __nv_bfloat16* xf, const __nv_bfloat16* xg, int x_stride, int m,
               const uint8_t* wf, const float* swf, const uint8_t* wg, const float* swg,
               const float* a_log, const float* dt_bias, float lower_bound,
               const __nv_bfloat16* b, int b_stride, float* decay, int decay_stride,
               __nv_bfloat16* og, int og_stride, float* beta, int beta_stride,
               __nv_bfloat16* f_out, int f_stride,
               const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
               float* window, long window_stride,
               const __nv_bfloat16* taps, const __nv_bfloat16* bias, float eps,
               __nv_bfloat16* out, int out_stride) {
    constexpr int THREADS = 32 * WARPS, GATE_BLOCKS = 2 * kda_gates_blocks<N, WARPS>();
    static_assert(THREADS % DK == 0, "a conv head never straddles two blocks");
    static_assert(C_QK % 2 == 0, "q and k have the same width");
    KBP_STAMP_BEGIN();
    ::kbp::pdl_launch_dependents();  // early: the recurrence may take free SMs now (it waits in pdl_wait)
    if (blockIdx.x < GATE_BLOCKS) {
        kda_gates_w8a8_k128_rows_dev<N, K, GDK, WARPS>(xf, xg, x_stride, m, wf, swf, wg, swg, a_log,  // pdl_wait inside
            dt_bias, lower_bound, b, b_stride, decay, decay_stride, og, og_stride, beta, beta_stride,
            f_out, f_stride, blockIdx.x);
        KBP_STAMP_END();
        return;
    }
    const int block = blockIdx.x - GATE_BLOCKS;
    // The window rows and taps of this block's channels (16 and 2 * W bytes a channel): nothing in the
    // step writes them before this kernel, so they are fetched into L2 while the projection finishes.
    const int c0 = block * THREADS, channels = (C - c0 < THREADS ? C - c0 : THREADS);
    prefetch_l2(window + (long)c0 * W, (size_t)channels * W * sizeof(float), threadIdx.x, THREADS);
    prefetch_l2(taps + (long)c0 * W, (size_t)channels * W * sizeof(__nv_bfloat16), threadIdx.x, THREADS);
    KBP_STAMP(kStampWaitIn);   // conv CTAs
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    causal_conv1d_update_l2norm_dev<C, C_QK, DK, W, THREADS, __nv_bfloat16>(ConvQkvRows{q, k, v, C_QK / 2}, window,
        window_stride, taps, bias, eps, out, out_stride, block);
    KBP_STAMP_END();
}

}  // namespace kbp
