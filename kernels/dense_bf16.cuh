// dense_bf16.cuh: one-row BF16 GEMV y = W x on CUDA cores (family dense_bf16, entry dense_gemv_bf16).
//
// Launch contract (dense_gemv_bf16<K, OutT>):
//   W    (N, K) BF16 row-major, 16-byte aligned;  x  (K,) BF16, 16-byte aligned;  y (N,) OutT.
//   OutT = __nv_bfloat16 (rounded once, RNE) or float (the FP32 sum, no rounding).
//   K % 8 == 0 (template); any N >= 1.  grid = (ceil(N / 4)), block = 256, no dynamic smem.
//   dense_gemv_bf16_opc<K, OutT, OPC>: OPC in {1, 2, 4} outputs per CTA, grid = ceil(N / OPC),
//   block = 64 * OPC (small N: more CTAs on more SMs), the same bits.
// PDL: each thread's first batch of weight loads is issued before pdl_wait(). The kernels below
//   release their dependents right after it (TRIGGER; as the FP8 and W4A16 GEMVs do, see wxay.cuh);
//   the fused router, which calls dense_gemv_bf16_block for its logits, places its own trigger.
// Math (explain.families.dense_bf16, GEMV): output n gets 64 threads (two warps); thread l
//   (0..63) walks the 8-element vectors v = l, l+64, ... in increasing order, accumulating
//   acc = acc + x[8v+i] * W[n, 8v+i] for i = 0..7 (separate FP32 mul and add; --fmad=false);
//   each warp reduces with the shuffle tree (offsets 16..1) and y = rn(P0 + P1).
// Speed: the whole row slice a thread needs is issued as 16-byte loads before any arithmetic
//   (up to DENSE_BF16_BATCH vectors in flight per thread); 4 outputs per CTA give N/4 CTAs.
// dense_gemv_bf16_block<K, OutT>(W, x, y, N, block) is one CTA's share for any block index (the
// fused MoE router claims blocks dynamically).
// dense_gemv_bf16_scores_only<K, OutT, OPC, KP, TOPK_POOLS>(W, x, y, N, seq_len, tau): the _opc
//   kernel for a projection whose only reader is an unranked select (dsa_index_select's ORDER_FREE,
//   numerics `fast`: the DSA index queries and head weights). While the select lists every valid
//   pool (dsa_every_pool_selected: contexts up to TOPK_POOLS pools) it reads no score, so no input
//   of one: the kernel loads nothing and leaves y as it was; past that context it is the _opc
//   kernel, bit for bit. Idle, CTA 0 still waits for the kernel before it, so the grid completes
//   after it as a computing grid would (PDL orders a kernel after its predecessor's completion only,
//   so kernels after this one still see everything before it); the other CTAs return at once,
//   leaving their SMs to the other streams (a computing grid launched early under PDL would hold
//   them in pdl_wait: H200, 128-expert seed shrink, the index query's 1024 CTAs of 256 threads).
// Entry points: the __global__ template, or its body <name>_dev<...>(same arguments) for a TU's own
// extern "C" __global__ wrapper (what the GPU tests do).
// Phase stamps of a profiling build (kbp_stamps.cuh): begin, the wait (dense_row_partial), end.
#pragma once

#include "kbp_common.cuh"
#include "dsa_indexer_common.cuh"

namespace kbp {

constexpr int DENSE_BF16_BATCH = 8;  // 16-byte weight loads a thread keeps in flight

__device__ __forceinline__ void dense_store(__nv_bfloat16* y, float v) { *y = f32_to_bf16(v); }
__device__ __forceinline__ void dense_store(float* y, float v) { *y = v; }

// acc += x[i] * w[i] for the 8 BF16 pairs of one 16-byte vector, in element order.
__device__ __forceinline__ float dense_dot8(uint4 w, uint4 x, float acc) {
    const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
    const uint32_t xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        float wl = __uint_as_float(wv[j] << 16), wh = __uint_as_float(wv[j] & 0xffff0000u);
        float xl = __uint_as_float(xv[j] << 16), xh = __uint_as_float(xv[j] & 0xffff0000u);
        acc = __fadd_rn(acc, __fmul_rn(xl, wl));
        acc = __fadd_rn(acc, __fmul_rn(xh, wh));
    }
    return acc;
}

// Thread l's partial for one output row: vectors v = l, l+64, ... < K/8, batched loads.
template <int K, bool TRIGGER = false>
__device__ __forceinline__ float dense_row_partial(const uint4* wrow,
                                                   const uint4* xv, int l) {
    constexpr int NV = K / 8;
    constexpr int PER = (NV + 63) / 64;  // vectors per thread (the last may be partial)
    float acc = 0.0f;
#pragma unroll
    for (int b0 = 0; b0 < PER; b0 += DENSE_BF16_BATCH) {
        uint4 w[DENSE_BF16_BATCH];
#pragma unroll
        for (int j = 0; j < DENSE_BF16_BATCH; ++j) {
            int v = l + 64 * (b0 + j);
            if (b0 + j < PER && v < NV) w[j] = ld_weight(wrow + v);  // streamed: read once
        }
        if (b0 == 0) {
            KBP_STAMP(kStampWaitIn);   // phase stamps of a kernel that began them (kbp_stamps.cuh)
            pdl_wait();  // the first weight batch is in flight; x comes from the kernel before
            KBP_STAMP(kStampWaitOut);
            if (TRIGGER) pdl_launch_dependents();
        }
#pragma unroll
        for (int j = 0; j < DENSE_BF16_BATCH; ++j) {
            int v = l + 64 * (b0 + j);
            if (b0 + j < PER && v < NV) acc = dense_dot8(w[j], ld_step(xv + v), acc);
        }
    }
    return acc;
}

// Outputs OPC*block .. OPC*block+OPC-1 (those below N) with 64*OPC threads; every thread must call it.
template <int K, typename OutT, int OPC = 4, bool TRIGGER = false>
__device__ __forceinline__ void dense_gemv_bf16_block(const __nv_bfloat16* W,
                                                      const __nv_bfloat16* x,
                                                      OutT* y, int N, int block) {
    static_assert(K % 8 == 0, "dense_gemv_bf16 walks K in 8-element vectors");
    static_assert(OPC == 1 || OPC == 2 || OPC == 4, "outputs per CTA");
    __shared__ float part[OPC];
    const int slot = threadIdx.x >> 6, l = threadIdx.x & 63;
    const int n = block * OPC + slot;
    float acc = 0.0f;
    if (n < N)
        acc = dense_row_partial<K, TRIGGER>(reinterpret_cast<const uint4*>(W + (size_t)n * K),
                                   reinterpret_cast<const uint4*>(x), l);
    acc = warp_sum_down(acc);
    if (l == 32) part[slot] = acc;  // lane 0 of the second warp holds P1
    __syncthreads();
    if (l == 0 && n < N) dense_store(y + n, __fadd_rn(acc, part[slot]));
}

template <int K, typename OutT, int OPC = 4>
__device__ __forceinline__ void dense_gemv_bf16_dev(const __nv_bfloat16* W,
                                                       const __nv_bfloat16* x,
                                                       OutT* y, int N) {
    dense_gemv_bf16_block<K, OutT, OPC, true>(W, x, y, N, blockIdx.x);
}

template <int K, typename OutT>
__global__ void __launch_bounds__(256) dense_gemv_bf16(const __nv_bfloat16* W,
                                                       const __nv_bfloat16* x,
                                                       OutT* y, int N) {
    // PDL: dense_row_partial waits once its first weight batch is in flight
    KBP_STAMP_BEGIN();   // phase stamps of a profiling build (kbp_stamps.cuh): the wait, in dense_row_partial
    dense_gemv_bf16_dev<K, OutT>(W, x, y, N);
    KBP_STAMP_END();
}

// The same kernel with OPC outputs (64 * OPC threads) per CTA: N / OPC CTAs spread a small N over
// more SMs; every output's 64 threads and operation order are unchanged, so are the bits.
template <int K, typename OutT, int OPC>
__global__ void __launch_bounds__(64 * OPC) dense_gemv_bf16_opc(const __nv_bfloat16* W,
                                                                const __nv_bfloat16* x,
                                                                OutT* y, int N) {
    KBP_STAMP_BEGIN();
    dense_gemv_bf16_dev<K, OutT, OPC>(W, x, y, N);
    KBP_STAMP_END();
}

template <int K, typename OutT, int OPC, int KP, int TOPK_POOLS>
__global__ void __launch_bounds__(64 * OPC) dense_gemv_bf16_scores_only(const __nv_bfloat16* W,
                                                                        const __nv_bfloat16* x,
                                                                        OutT* y, int N,
                                                                        const int32_t* seq_len,
                                                                        const int32_t* tau) {
    // SEQ and POS are uploaded before the step's first kernel: safe to read before the wait.
    KBP_STAMP_BEGIN();
    if (dsa_every_pool_selected(seq_len[0], tau[0], KP, TOPK_POOLS)) {
        if (blockIdx.x == 0) pdl_wait();
        KBP_STAMP_END();
        return;
    }
    dense_gemv_bf16_dev<K, OutT, OPC>(W, x, y, N);
    KBP_STAMP_END();
}

}  // namespace kbp
