// w8a8_act_quant.cuh: dynamic FP8 E4M3 activation quantizers (family w8a8_act_quant).
//
// Entries (256-thread CTAs, grid = m rows, no dynamic smem; rows 16-byte aligned):
//   w8a8_act_quant_row<K, SPLIT = 1>(x, q, s) per token: q (m, K) E4M3 codes, s (m,) FP32.  K % 8 == 0
//                                             grid (m, SPLIT): SPLIT CTAs per row (quant_row_impl)
//   w8a8_act_quant_row_cluster<K, CL>(x, q, s) the same bytes, grid (CL, m): one CL-CTA cluster a row,
//                                             each CTA reads and encodes only its share (four values
//                                             a thread), the row's max met in distributed shared memory
//   w8a8_act_quant_g128<K>(x, q, s)           per 128 group: s (m, K/128).                K % 128 == 0
//   w8a8_act_quant_silu_row<K>(g, u, q, s)    input v = rn_bf16((g * sigma(g)) * u)
//   w8a8_act_quant_silu_g128<K>(g, u, q, s)
// Math (explain.families.w8a8_act_quant): s = max(f32(max|v| / 448), 1e-12) (exact max, correctly
//   rounded division), q = sat_e4m3(clamp(f32(v / s), -448, 448)). sigma(g) = 1 / (1 + __expf(-g))
//   (the fast exponential the family names; the reference uses a correctly rounded exp, so the
//   silu forms agree within the GPU test's tolerance and the plain forms bit-exactly).
// Layout: thread t owns the 8-element vectors t, t+256, ...; the per-token form keeps the whole
//   row in registers (read once); the g128 form gives each 128-group 16 threads (one vector each),
//   reduced with xor shuffles over the 16 lanes.
// Entry points: the __global__ template, or its body <name>_dev<...>(same arguments) for a TU's own
// extern "C" __global__ wrapper (what the GPU tests do).
// Phase stamps of a profiling build (kbp_stamps.cuh): w8a8_act_quant_row and _row_cluster (1/2 around
// pdl_wait, 3 thread 0's values loaded, 4 the CTA's max, 5 the cluster's max; the end: codes stored).
#pragma once

#include <cooperative_groups.h>

#include "kbp_common.cuh"

namespace kbp {

__device__ __forceinline__ void bf16x4_unpack(uint2 u, float (&v)[4]) {
    v[0] = __uint_as_float(u.x << 16); v[1] = __uint_as_float(u.x & 0xffff0000u);
    v[2] = __uint_as_float(u.y << 16); v[3] = __uint_as_float(u.y & 0xffff0000u);
}

__device__ __forceinline__ void bf16x8_unpack(uint4 u, float (&v)[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) { v[2 * i] = __uint_as_float(w[i] << 16); v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u); }
}

// v = rn_bf16((g * sigma(g)) * u), left to right, no FMA.
__device__ __forceinline__ float silu_mul_bf16(float g, float u) {
    float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, kbp::exp_f32(-g)));
    return round_bf16(__fmul_rn(__fmul_rn(g, sig), u));
}

// Eight activations of vector j: plain BF16 or the SiLU-times-up product.
template <bool SILU>
__device__ __forceinline__ void act8_load(const __nv_bfloat16* x, const __nv_bfloat16* u, int j, float (&v)[8]) {
    bf16x8_unpack(ld_step(reinterpret_cast<const uint4*>(x) + j), v);
    if (SILU) {
        float uv[8];
        bf16x8_unpack(ld_step(reinterpret_cast<const uint4*>(u) + j), uv);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = silu_mul_bf16(v[i], uv[i]);
    }
}

__device__ __forceinline__ float fp8_scale(float amax) { return fmaxf(__fdiv_rn(amax, 448.0f), 1e-12f); }

// The E4M3 code of v at scale s: sat_e4m3(clamp(f32(v / s), -448, 448)).
__device__ __forceinline__ uint32_t fp8_code(float v, float s) {
    return (uint32_t)f32_to_e4m3(fminf(fmaxf(__fdiv_rn(v, s), -448.0f), 448.0f));
}

__device__ __forceinline__ uint2 fp8_encode8(const float (&v)[8], float s) {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i >> 2] |= fp8_code(v[i], s) << (8 * (i & 3));
    return make_uint2(w[0], w[1]);
}

// SPLIT CTAs share a row (blockIdx.y): each reads the whole row for the exact max (the same value
// in every CTA) and encodes the vectors of its own PER-slices j with j % SPLIT == blockIdx.y. The
// encoding (a correctly rounded division per value) is the latency; the row's re-reads hit L2.
template <int K, bool SILU, int SPLIT = 1>
__device__ __forceinline__ void quant_row_impl(const __nv_bfloat16* x, const __nv_bfloat16* u,
                                               uint8_t* q, float* s_out) {
    static_assert(K % 8 == 0, "rows are read as 8-element vectors");
    constexpr int NV = K / 8, PER = (NV + 255) / 256;
    static_assert(SPLIT >= 1 && SPLIT <= PER, "at most one CTA per 256-vector slice");
    __shared__ float red[8];
    float v[PER][8], m = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        int vi = threadIdx.x + 256 * j;
        if (vi < NV) {
            act8_load<SILU>(x, u, vi, v[j]);
#pragma unroll
            for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[j][i]));
        }
    }
    KBP_STAMP(3);   // thread 0's vectors loaded, its max formed
    m = warp_max_xor(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    KBP_STAMP(4);   // every warp's max in shared memory (then the scale and the encoding)
    m = red[0];
#pragma unroll
    for (int i = 1; i < 8; ++i) m = fmaxf(m, red[i]);
    const float s = fp8_scale(m);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        int vi = threadIdx.x + 256 * j;
        if (vi < NV && (SPLIT == 1 || j % SPLIT == (int)blockIdx.y)) reinterpret_cast<uint2*>(q)[vi] = fp8_encode8(v[j], s);
    }
    if (threadIdx.x == 0 && (SPLIT == 1 || blockIdx.y == 0)) *s_out = s;
}

template <int K, bool SILU>
__device__ __forceinline__ void quant_g128_impl(const __nv_bfloat16* x, const __nv_bfloat16* u,
                                                uint8_t* q, float* s_out) {
    static_assert(K % 128 == 0, "groups are 128 wide");
    constexpr int NV = K / 8;
    // 16 consecutive threads = one group; NV % 16 == 0, so a half-warp is always all in or all out.
    const unsigned half = 0xffffu << (threadIdx.x & 16);
    for (int vi = threadIdx.x; vi < NV; vi += 256) {
        float v[8], m = 0.0f;
        act8_load<SILU>(x, u, vi, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[i]));
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(half, m, off));
        const float s = fp8_scale(m);
        reinterpret_cast<uint2*>(q)[vi] = fp8_encode8(v, s);
        if ((vi & 15) == 0) s_out[vi >> 4] = s;
    }
}

template <int K, int SPLIT = 1>
__device__ __forceinline__ void w8a8_act_quant_row_dev(const __nv_bfloat16* x,
                                                          uint8_t* q, float* s) {
    const size_t r = blockIdx.x;
    quant_row_impl<K, false, SPLIT>(x + r * K, nullptr, q + r * K, s + r);
}

template <int K, int SPLIT = 1>
__global__ void __launch_bounds__(256) w8a8_act_quant_row(const __nv_bfloat16* x,
                                                          uint8_t* q, float* s) {
    KBP_STAMP_BEGIN();   // stamps of a profiling build (kbp_stamps.cuh): 3, 4 in quant_row_impl
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    w8a8_act_quant_row_dev<K, SPLIT>(x, q, s);
    KBP_STAMP_END();
}

// One row as a cluster of CL CTAs (blockIdx.x = the CTA's rank, blockIdx.y = the row). The row is cut
// into runs of four values; run u belongs to thread u % 256 of CTA (u / 256) % CL. Each CTA reads
// only its runs (an 8-byte load a run), forms their max, and writes it into every CTA's slot c
// through distributed shared memory; after one cluster barrier each CTA takes the max of the CL
// slots (the row's max: order-free, so the same value as quant_row_impl's) and encodes its runs
// with the same scale and encoder: w8a8_act_quant_row's bytes. Against SPLIT CTAs that each read
// the whole row for the max and encode eight values a thread, a thread here reads 8 bytes and
// encodes four values (one run for K <= 1024 CL).
template <int K, int CL>
__device__ __forceinline__ void quant_row_cluster(const __nv_bfloat16* x, uint8_t* q, float* s_out) {
    static_assert(K % 4 == 0 && CL >= 1 && CL <= 16, "runs of four values, at most 16 CTAs a cluster");
    constexpr int RUNS = K / 4, STRIDE = 256 * CL, PER = (RUNS + STRIDE - 1) / STRIDE;
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    __shared__ float red[8];
    __shared__ float slot[CL];
    const int c = (int)cluster.block_rank(), u0 = c * 256 + (int)threadIdx.x;   // runs u0 + STRIDE j
    uint2 raw[PER];
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int u = u0 + STRIDE * j;
        if (u < RUNS) raw[j] = ld_step(reinterpret_cast<const uint2*>(x) + u);
    }
    auto each_run = [&](auto fn) {   // fn(run index, its four values) for this thread's runs
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int u = u0 + STRIDE * j;
            if (u < RUNS) {
                float v[4];
                bf16x4_unpack(raw[j], v);
                fn(u, v);
            }
        }
    };
    each_run([&](int, const float (&v)[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i) m = fmaxf(m, fabsf(v[i]));
    });
    KBP_STAMP(3);   // thread 0's runs loaded, its max formed
    m = warp_max_xor(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    KBP_STAMP(4);   // every warp's max in shared memory
    cluster_wait();   // every CTA of the cluster runs (each arrived at its start)
    if (threadIdx.x < CL) {
        float b = red[0];
#pragma unroll
        for (int i = 1; i < 8; ++i) b = fmaxf(b, red[i]);
        *cluster.map_shared_rank(slot + c, (int)threadIdx.x) = b;
    }
    cluster_arrive_release();
    cluster_wait_acquire();
    KBP_STAMP(5);   // cluster barrier passed: every CTA's max in slot (then the scale and the encoding)
    m = slot[0];
#pragma unroll
    for (int i = 1; i < CL; ++i) m = fmaxf(m, slot[i]);
    const float s = fp8_scale(m);
    each_run([&](int u, const float (&v)[4]) {
        uint32_t out = 0u;
#pragma unroll
        for (int i = 0; i < 4; ++i) out |= fp8_code(v[i], s) << (8 * i);
        reinterpret_cast<uint32_t*>(q)[u] = out;
    });
    if (c == 0 && threadIdx.x == 0) *s_out = s;
}

template <int K, int CL>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(256) w8a8_act_quant_row_cluster(const __nv_bfloat16* x,
                                                                                             uint8_t* q, float* s) {
    KBP_STAMP_BEGIN();   // stamps of a profiling build (kbp_stamps.cuh): 3-5 in quant_row_cluster
    ::kbp::cluster_arrive_relaxed();   // this CTA runs: the others may store into its shared memory
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    const size_t r = blockIdx.y;
    quant_row_cluster<K, CL>(x + r * K, q + r * K, s + r);
    KBP_STAMP_END();
}

template <int K>
__device__ __forceinline__ void w8a8_act_quant_g128_dev(const __nv_bfloat16* x,
                                                           uint8_t* q, float* s) {
    const size_t r = blockIdx.x;
    quant_g128_impl<K, false>(x + r * K, nullptr, q + r * K, s + r * (K / 128));
}

template <int K>
__global__ void __launch_bounds__(256) w8a8_act_quant_g128(const __nv_bfloat16* x,
                                                           uint8_t* q, float* s) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    w8a8_act_quant_g128_dev<K>(x, q, s);
}

template <int K>
__device__ __forceinline__ void w8a8_act_quant_silu_row_dev(const __nv_bfloat16* g,
                                                               const __nv_bfloat16* u,
                                                               uint8_t* q, float* s) {
    const size_t r = blockIdx.x;
    quant_row_impl<K, true>(g + r * K, u + r * K, q + r * K, s + r);
}

template <int K>
__global__ void __launch_bounds__(256) w8a8_act_quant_silu_row(const __nv_bfloat16* g,
                                                               const __nv_bfloat16* u,
                                                               uint8_t* q, float* s) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    w8a8_act_quant_silu_row_dev<K>(g, u, q, s);
}

template <int K>
__device__ __forceinline__ void w8a8_act_quant_silu_g128_dev(const __nv_bfloat16* g,
                                                                const __nv_bfloat16* u,
                                                                uint8_t* q, float* s) {
    const size_t r = blockIdx.x;
    quant_g128_impl<K, true>(g + r * K, u + r * K, q + r * K, s + r * (K / 128));
}

template <int K>
__global__ void __launch_bounds__(256) w8a8_act_quant_silu_g128(const __nv_bfloat16* g,
                                                                const __nv_bfloat16* u,
                                                                uint8_t* q, float* s) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    w8a8_act_quant_silu_g128_dev<K>(g, u, q, s);
}

}  // namespace kbp
